//! A development aid: the host time of one call — what the CPU spends before the call
//! returns, with the GPU work only queued — of `kfuse::ops::gemm`, of kfuse's GEMM
//! kernel into a preallocated output, of cuBLAS, and of the pieces a kfuse call is made
//! of (a stream-ordered allocation and its free, a TMA tensor-map encode, a CUDA event
//! record); and the same for `kfuse::ops::add` on 1024 elements beside the driver's floor
//! (an empty kernel of four parameters launched through cudarc). When a call's host time exceeds its kernel's GPU time, back-to-back calls
//! leave the GPU waiting for the host (small problems such as M127 N4096 K4096).
//!
//!     cargo run --release --example launch_host [M N K]   (default 127 4096 4096)
//!
//! Each figure is the median over 30 bursts of 32 calls of the burst's wall time per
//! call, the stream synchronized before each burst (32 calls stay far below the
//! driver's queue depth, so no call waits for the GPU).

#[path = "../benches/common/mod.rs"]
mod common;

use kfuse::runtime::vendor::{Library, Math};
use kfuse::{DType, Device, Tensor};
use std::time::Instant;

const BURST: usize = 32;
const BURSTS: usize = 30;

/// Median host µs per call of `f` over the bursts.
fn host_us(dev: &Device, mut f: impl FnMut() -> kfuse::Result<()>) -> kfuse::Result<f64> {
    for _ in 0..BURST {
        f()?;
    }
    let mut per = Vec::with_capacity(BURSTS);
    for _ in 0..BURSTS {
        dev.synchronize()?;
        let t = Instant::now();
        for _ in 0..BURST {
            f()?;
        }
        per.push((t.elapsed().as_secs_f64() * 1e6 / BURST as f64) as f32);
    }
    dev.synchronize()?;
    Ok(common::median(per))
}

/// Loads `entry` of a compiled module on `dev`.
fn load(dev: &kfuse::Device, m: &kfuse::runtime::Module, entry: &str) -> kfuse::Result<cudarc::driver::CudaFunction> {
    dev.cuda_context()
        .expect("a GPU")
        .load_module(cudarc::nvrtc::Ptx::from_binary(m.image()))
        .and_then(|m| m.load_function(entry))
        .map_err(|e| kfuse::Error::Driver(format!("{e:?}")))
}

/// Launches `f(a, b, c, n)` through cudarc's launch builder: `blocks` of `threads`.
fn launch4(stream: &std::sync::Arc<cudarc::driver::CudaStream>, f: &cudarc::driver::CudaFunction, ptrs: [u64; 3], n: i64, blocks: u32, threads: u32) -> kfuse::Result<()> {
    use cudarc::driver::PushKernelArg;
    let mut b = stream.launch_builder(f);
    b.arg(&ptrs[0]).arg(&ptrs[1]).arg(&ptrs[2]).arg(&n);
    let cfg = cudarc::driver::LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: both kernels launched here take three pointers and an i64, and the
    // pointers are live device allocations of at least n elements
    unsafe { b.launch(cfg) }.map(drop).map_err(|e| kfuse::Error::Driver(format!("{e:?}")))
}

fn main() -> kfuse::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("M N K")).collect();
    let (m, n, k) = if args.len() >= 3 { (args[0], args[1], args[2]) } else { (127, 4096, 4096) };
    let Some(common::gemm::Study { dev, blas, a, b, mut c_blas, mut c_kf }) = common::gemm::Study::bf16(m, n, k)? else { return Ok(()) };
    // compile and load first
    kfuse::ops::gemm(&a, &b)?;
    dev.synchronize()?;
    let stream = dev.cuda_stream().expect("a GPU").clone();
    let event = dev.cuda_context().expect("a GPU").new_event(None).map_err(|e| kfuse::Error::Driver(format!("{e:?}")))?;
    // the driver's floor: an empty kernel with four parameters, launched through cudarc
    let floor_src = "extern \"C\" __global__ void kf_empty(const void* a, const void* b, void* c, long long n) {}";
    let floor_mod = kfuse::runtime::nvrtc::compile_module(floor_src, "sm_90a", &[])?;
    let floor_fn = load(&dev, &floor_mod, "kf_empty")?;
    let (small_a, small_b) = (common::random_bf16(1024, 1, &dev).0, common::random_bf16(1024, 2, &dev).0);
    let mut small_c = Tensor::empty(&[1024], DType::BF16, &dev)?;
    kfuse::ops::add(&small_a, &small_b)?;
    let ptrs = [small_a.address(), small_b.address(), small_c.address()];
    let bare = || launch4(&stream, &floor_fn, ptrs, 1024, 1, 128);
    // kfuse's own add kernel for these tensors, launched through cudarc: the driver's
    // cost for this kernel, without kfuse's launch path
    let add_def = &kfuse::ops::kernels::add::DEF;
    let add_ir = (add_def.build)(&[DType::BF16])?;
    let add_spec = {
        use kfuse::runtime::Arg;
        kfuse::runtime::spec_for(&add_ir, &[Arg::In(&small_a), Arg::In(&small_b), Arg::Out(&mut small_c)])?
    };
    let add_e = kfuse::runtime::emit_for(add_def, &[DType::BF16], &add_spec, &dev.target().expect("a GPU"))?;
    let add_fn = load(&dev, &kfuse::runtime::nvrtc::compile_module(&add_e.source, &add_e.arch, &add_e.options)?, &add_e.entry)?;
    let add_grid = add_e.grid_dims(&[1024]);
    let bare_add = || launch4(&stream, &add_fn, ptrs, 1024, add_grid[0] as u32, add_e.block_threads);
    assert_eq!(add_e.params.len(), 4, "a, b, out and N: {:?}", add_e.params);
    let rows: Vec<(&str, f64)> = vec![
        ("empty kernel, 4 params (cudarc launch)", host_us(&dev, bare)?),
        ("kfuse's add kernel, 1024 bf16, through cudarc", host_us(&dev, bare_add)?),
        ("kfuse::ops::add, 1024 bf16 (new output)", host_us(&dev, || kfuse::ops::add(&small_a, &small_b).map(drop))?),
        ("kfuse kernels::add, 1024 bf16 (preallocated)", host_us(&dev, || kfuse::ops::kernels::add(&small_a, &small_b, &mut small_c).map(drop))?),
        ("cuBLAS gemm_into (preallocated output)", host_us(&dev, || blas.gemm_into(&a, &b, &mut c_blas, Library::Cublas, Math::Fp32))?),
        ("kfuse::ops::gemm (new output)", host_us(&dev, || kfuse::ops::gemm(&a, &b).map(drop))?),
        ("kfuse kernels::gemm (preallocated output)", host_us(&dev, || kfuse::ops::kernels::gemm(&a, &b, &mut c_kf).map(drop))?),
        ("Tensor::empty [M, N] + drop", host_us(&dev, || Tensor::empty(&[m, n], DType::BF16, &dev).map(drop))?),
        ("tma::encode_tiled of A (64x64 box)", host_us(&dev, || kfuse::runtime::tma::encode_tiled(&a, &[64, 64], 128).map(drop))?),
        ("empty kernel, 4 params (again, last)", host_us(&dev, bare)?),
        ("CUDA event record", host_us(&dev, || event.record(&stream).map_err(|e| kfuse::Error::Driver(format!("{e:?}"))))?),
    ];
    println!("host time a call, M{m} N{n} K{k} bf16, on {}:", dev.describe());
    for (what, us) in rows {
        println!("  {what:<44} {us:6.2} µs");
    }
    Ok(())
}
