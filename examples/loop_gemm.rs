//! A GEMM-shaped loop that the matrix path does not take, beside `kfuse::ops::gemm`:
//! `tests/kernels/loops.rs`' `scaled_products` (`acc = acc + dot(a, b) * scale`, bf16
//! `[M, K] · [K, N]`, f32 out) runs through the general lowering — on sm_90a `wgmma`
//! with its operands in rings a producer warpgroup fills (the plan says so) — where
//! `kfuse::ops::gemm` runs the matrix path (TMA, a persistent schedule, its tuned
//! tiles). Prints the loop's plan, the numerics of sampled elements against
//! float64, and the two times (CUDA events, `benches/common`'s interleaved rounds,
//! median) in TFLOP/s (2·M·N·K a call).
//!
//!     cargo run --release --example loop_gemm [M N K]   (default 4096 4096 4096)

#[path = "../benches/common/mod.rs"]
mod common;

#[path = "../tests/kernels/loops.rs"]
#[allow(dead_code)]
mod loops;
use loops::scaled_products;

use kfuse::{DType, Tensor};

fn main() -> kfuse::Result<()> {
    let Some(dev) = common::gpu() else { return Ok(()) };
    let (m, n, k) = common::mnk_args();
    let (a, av) = common::random(&[m, k], DType::BF16, 1, &dev);
    let (b, bv) = common::random(&[k, n], DType::BF16, 2, &dev);
    let mut out = Tensor::empty(&[m, n], DType::F32, &dev)?;
    let launched = scaled_products(&a, &b, &mut out, 1.0)?;
    if let Some(plan) = &launched.plan {
        println!("{plan}");
    }
    let got = out.to_vec_f64()?;
    let mut worst: f64 = 0.0;
    for s in 0..64 {
        let (i, j) = ((s * 7919 + 13) % m, (s * 104729 + 7) % n);
        let want: f64 = (0..k).map(|kk| f64::from(av[i * k + kk]) * f64::from(bv[kk * n + j])).sum();
        worst = worst.max((got[i * n + j] - want).abs() / want.abs().max(1.0));
    }
    println!("scaled_products: largest error of 64 sampled elements against float64 (relative to max(|value|, 1)): {worst:.2e}");
    let mut t_ops = || kfuse::ops::gemm(&a, &b).map(|_| ());
    let mut t_loop = || scaled_products(&a, &b, &mut out, 1.0).map(|_| ());
    let times = common::interleaved(&dev, 10, 100, &mut [&mut t_ops, &mut t_loop]);
    let times = times.into_iter().collect::<kfuse::Result<Vec<f64>>>()?;
    let tflops = |ms: f64| 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
    println!("\n| M{m} N{n} K{k} bf16 | ms | TFLOP/s | ÷ ops::gemm |\n|---|---|---|---|");
    for (name, &ms) in ["kfuse::ops::gemm (matrix path)", "scaled_products (general lowering)"].iter().zip(&times) {
        println!("| {name} | {ms:.3} | {:.0} | {:.2}× |", tflops(ms), times[0] / ms);
    }
    Ok(())
}
