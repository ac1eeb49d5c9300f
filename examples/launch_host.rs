//! A development aid: the host time of one call — what the CPU spends before the call
//! returns, with the GPU work only queued — of `kfuse::ops::gemm`, of kfuse's GEMM
//! kernel into a preallocated output, of cuBLAS, and of the pieces a kfuse call is made
//! of (a stream-ordered allocation and its free, a TMA tensor-map encode, a CUDA event
//! record). When a call's host time exceeds its kernel's GPU time, back-to-back calls
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

fn main() -> kfuse::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("M N K")).collect();
    let (m, n, k) = if args.len() >= 3 { (args[0], args[1], args[2]) } else { (127, 4096, 4096) };
    let Some(common::gemm::Study { dev, blas, a, b, mut c_blas, mut c_kf }) = common::gemm::Study::bf16(m, n, k)? else { return Ok(()) };
    // compile and load first
    kfuse::ops::gemm(&a, &b)?;
    dev.synchronize()?;
    let stream = dev.cuda_stream().expect("a GPU").clone();
    let event = dev.cuda_context().expect("a GPU").new_event(None).map_err(|e| kfuse::Error::Driver(format!("{e:?}")))?;
    let rows: Vec<(&str, f64)> = vec![
        ("cuBLAS gemm_into (preallocated output)", host_us(&dev, || blas.gemm_into(&a, &b, &mut c_blas, Library::Cublas, Math::Fp32))?),
        ("kfuse::ops::gemm (new output)", host_us(&dev, || kfuse::ops::gemm(&a, &b).map(drop))?),
        ("kfuse kernels::gemm (preallocated output)", host_us(&dev, || kfuse::ops::kernels::gemm(&a, &b, &mut c_kf).map(drop))?),
        ("Tensor::empty [M, N] + drop", host_us(&dev, || Tensor::empty(&[m, n], DType::BF16, &dev).map(drop))?),
        ("tma::encode_tiled of A (64x64 box)", host_us(&dev, || kfuse::runtime::tma::encode_tiled(&a, &[64, 64], 128).map(drop))?),
        ("CUDA event record", host_us(&dev, || event.record(&stream).map_err(|e| kfuse::Error::Driver(format!("{e:?}"))))?),
    ];
    println!("host time a call, M{m} N{n} K{k} bf16, on {}:", dev.describe());
    for (what, us) in rows {
        println!("  {what:<44} {us:6.2} µs");
    }
    Ok(())
}
