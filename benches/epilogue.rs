//! Where a fused GEMM epilogue's time goes: the same bf16 product (4096³ by default;
//! `KFUSE_BENCH_SHAPES=8192` for 8192³) timed plain, with a bias add, with bias + GELU
//! (erf and tanh forms) fused, and the separate elementwise kernels alone, next to cuBLAS
//! in the same run. The difference between two rows is what one more piece of epilogue
//! costs; the separate kernels' rows show whether they run at the copy floor or are
//! compute-bound. `KFUSE_TILES` overrides apply to every kfuse kernel here. The fused
//! erf kernel's output is checked against cuBLAS followed by the separate kernel first
//! (a wrong answer ends the run with an error instead of a table).
//!
//!     cargo bench --bench epilogue

mod common;

use common::epilogue::{bias_gelu, gemm_bias_gelu};
use common::{median, random};
use kfuse::prelude::*;
use kfuse::runtime::vendor::{Blas, Library, Math};
use kfuse::{DType, Tensor};

/// The product plus a bias broadcast along M.
#[kfuse]
pub fn gemm_bias<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, bias: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    let x = acc + bias.block([j * BN], [BN]).load().to_f32();
    out.block([i * BM, j * BN], [BM, BN]).store(x.cast::<T>());
}

/// Bias and GELU, tanh form.
#[kfuse]
pub fn gemm_bias_gelu_tanh<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, bias: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    let x = acc + bias.block([j * BN], [BN]).load().to_f32();
    let inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    out.block([i * BM, j * BN], [BM, BN]).store((0.5 * x * (1.0 + tanh(inner))).cast::<T>());
}

/// Bias + GELU (tanh) as a separate elementwise kernel.
#[kfuse]
pub fn bias_gelu_tanh<T: Float>(x: Tensor<T, (M, N)>, bias: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let v = x.block([i * BM, j * BN], [BM, BN]).load().to_f32() + bias.block([j * BN], [BN]).load().to_f32();
    let inner = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    out.block([i * BM, j * BN], [BM, BN]).store((0.5 * v * (1.0 + tanh(inner))).cast::<T>());
}

/// Bias add alone as a separate kernel: the copy floor of the elementwise pass.
#[kfuse]
pub fn bias_add<T: Float>(x: Tensor<T, (M, N)>, bias: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let v = x.block([i * BM, j * BN], [BM, BN]).load().to_f32() + bias.block([j * BN], [BN]).load().to_f32();
    out.block([i * BM, j * BN], [BM, BN]).store(v.cast::<T>());
}

fn main() -> kfuse::Result<()> {
    let Some(dev) = common::gpu() else { return Ok(()) };
    let blas = Blas::new(&dev)?;
    let n3: usize = std::env::var("KFUSE_BENCH_SHAPES").ok().and_then(|v| v.parse().ok()).unwrap_or(4096);
    let (m, n, k) = (n3, n3, n3);
    let (a, _) = random(&[m, k], DType::BF16, 7, &dev);
    let (b, _) = random(&[k, n], DType::BF16, 8, &dev);
    let (bias, _) = random(&[n], DType::BF16, 9, &dev);
    let (x, _) = random(&[m, n], DType::BF16, 10, &dev);
    let mut out = Tensor::empty(&[m, n], DType::BF16, &dev)?;
    let (warm, iters) = (10, 50);
    let time = |f: &mut dyn FnMut() -> kfuse::Result<()>| -> kfuse::Result<f64> {
        f()?;
        Ok(median(dev.time_ms(warm, iters, f)?) * 1e3)
    };
    let fl = 2.0 * (m * n * k) as f64;
    // one after another, each 10 warm-ups then 50 timed calls (the figures in
    // BENCHMARKS.md were taken this way)
    let rows: Vec<(&str, f64)> = vec![
        ("cuBLAS GEMM", time(&mut || blas.gemm_into(&a, &b, &mut out, Library::Cublas, Math::Fp32))?),
        ("kfuse GEMM (plain)", time(&mut || kfuse::ops::kernels::gemm(&a, &b, &mut out).map(drop))?),
        ("kfuse GEMM + bias", time(&mut || gemm_bias(&a, &b, &bias, &mut out).map(drop))?),
        ("kfuse GEMM + bias + GELU (erf)", time(&mut || gemm_bias_gelu(&a, &b, &bias, &mut out).map(drop))?),
        ("kfuse GEMM + bias + GELU (tanh)", time(&mut || gemm_bias_gelu_tanh(&a, &b, &bias, &mut out).map(drop))?),
        ("separate bias add", time(&mut || bias_add(&x, &bias, &mut out).map(drop))?),
        ("separate bias + GELU (erf)", time(&mut || bias_gelu(&x, &bias, &mut out).map(drop))?),
        ("separate bias + GELU (tanh)", time(&mut || bias_gelu_tanh(&x, &bias, &mut out).map(drop))?),
    ];
    // the fused erf kernel against cuBLAS followed by the separate kernel (a wrong answer
    // would make its time meaningless)
    let mut fused = Tensor::empty(&[m, n], DType::BF16, &dev)?;
    let mut tmp = Tensor::empty(&[m, n], DType::BF16, &dev)?;
    gemm_bias_gelu(&a, &b, &bias, &mut fused)?;
    blas.gemm_into(&a, &b, &mut tmp, Library::Cublas, Math::Fp32)?;
    bias_gelu(&tmp, &bias, &mut out)?;
    let err = common::gemm::rel_err(&fused, &out)?;
    let bytes = 2.0 * 2.0 * (m * n) as f64;
    println!(
        "device: {}\nM{m} N{n} K{k} bf16, median of {iters}; fused (erf) vs cuBLAS + separate kernel: rel. err {err:.1e}\n\n| kernel | µs | TFLOP/s or GB/s |\n|---|---|---|",
        dev.name()
    );
    if err.is_nan() || err > 1e-2 {
        return Err(kfuse::Error::InvalidArgument(format!("WRONG RESULT: the fused kernel differs from cuBLAS + bias + GELU by {err:.2e}")));
    }
    for (name, us) in rows {
        let rate = if name.starts_with("separate") { format!("{:.0} GB/s", bytes / us / 1e3) } else { format!("{:.0} TFLOP/s", fl / us / 1e6) };
        println!("| {name} | {us:.1} | {rate} |");
    }
    Ok(())
}
