//! What a first call does, as kfuse's `tracing` events tell it: building the IR,
//! generating CUDA, loading NVRTC, looking in the module cache (memory, then disk), the
//! NVRTC compile, and on a GPU the module load and the launch, each with its time.
//!
//!     source scripts/cuda-env.sh
//!     RUST_LOG=kfuse=debug cargo run --release --example trace_first_call
//!
//! `RUST_LOG` filters as usual (`kfuse=debug` when it is unset; `kfuse=trace` adds every
//! launch). With a GPU it times a first `kfuse::ops::gemm` of two 1024 × 1024 bf16
//! matrices. Without one it does what such a call would do before its module load and
//! launch: it generates the same GEMM kernel for sm_90a ([`kfuse::runtime::emit_for`])
//! and compiles it through the module cache ([`kfuse::runtime::compile_cached`]), which
//! needs only NVRTC. A second run finds the module in the disk cache instead of
//! compiling it.

use kfuse::codegen::Target;
use kfuse::runtime::{build_times, compile_cached, emit_for, gpu_plan_tiles, spec_for, Arg};
use kfuse::{DType, Device, Tensor};
use tracing_subscriber::EnvFilter;

fn main() -> kfuse::Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("kfuse=debug"));
    let colors = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colors).init();

    let n = 1024;
    let values: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    match Device::gpu(0) {
        Ok(dev) => {
            let before = build_times();
            let a = Tensor::from_f32(&values, &[n, n], DType::BF16, &dev)?;
            let b = Tensor::from_f32(&values, &[n, n], DType::BF16, &dev)?;
            let c = kfuse::ops::gemm(&a, &b)?;
            dev.synchronize()?;
            println!("a first kfuse::ops::gemm ({n}³, bf16) on {}: output {:?}", dev.describe(), c.shape());
            println!("build steps: {}", build_times().since(&before));
        }
        Err(e) => {
            println!("no GPU ({e}):\ngenerating the GEMM kernel of a {n}³ bf16 product for sm_90a and compiling it, without launching it");
            let cpu = Device::cpu();
            let a = Tensor::from_f32(&values, &[n, n], DType::BF16, &cpu)?;
            let b = Tensor::from_f32(&values, &[n, n], DType::BF16, &cpu)?;
            let mut c = Tensor::empty(&[n, n], DType::BF16, &cpu)?;
            let def = &kfuse::ops::kernels::gemm::DEF;
            let args = [Arg::In(&a), Arg::In(&b), Arg::Out(&mut c)];
            let target = Target::sm90a();
            // the specialization a GPU launch on such tensors would compile
            let kernel = (def.build)(&[DType::BF16])?;
            let mut spec = spec_for(&kernel, &args)?;
            spec.tiles = gpu_plan_tiles(def, &args, &target)?;
            let emitted = emit_for(def, &[DType::BF16], &spec, &target)?;
            let (module, outcome) = compile_cached(&emitted)?;
            println!("`{}` for {}: {outcome:?}, a cubin of {} bytes", emitted.entry, emitted.arch, module.cubin.len());
        }
    }
    Ok(())
}
