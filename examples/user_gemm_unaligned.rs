//! A user's own GEMM at a shape TMA cannot read as it lies, against `kfuse::ops::gemm`
//! at the same shape: bf16 `a: [M, K]`, `b: [K, N]` with N = 4097 (rows of `b` and of
//! the output 8194 bytes apart, not a multiple of 16). The launch copies `b` to rows
//! padded to 128-byte lines and runs the loop on the tensor cores (WGMMA on sm_90a);
//! `kfuse::ops::gemm` pads `b` and its output itself. Prints each launch's plan (the
//! path, the copy it made), the numerics against float64 on sampled rows, and a table
//! of times and TFLOP/s (2·M·N·K a call) with the ratio to `kfuse::ops::gemm`; ends
//! with one `user_gemm_unaligned summary:` line and exits with status 1 when the bar
//! (the user GEMM with its bias + ReLU epilogue ≥ 0.9× `ops::gemm`) is missed or a
//! result is wrong.
//!
//!     cargo run --release --example user_gemm_unaligned [M N K]   (default 4095 4097 4096)
//!
//! Competitors, timed as `benches/gemm.rs` times (10 warm-up calls each, then 150 timed
//! calls each — `KFUSE_BENCH_ITERS=N`: N — in interleaved rounds of 10, CUDA events
//! around each call, the median): `kfuse::ops::gemm` (a new output each call, its
//! padded copies included); the user GEMM + bias + ReLU (`out = relu(a·b + bias)`, the
//! runtime's copy of `b` included); the same with no epilogue (`acc.cast()`) and with
//! bias + GELU (erf); the bias + ReLU kernel on a `b` the caller already holds in
//! padded rows (no copy: the kernel alone; the difference is what the copy costs); and
//! the plain GEMM on a `b` the kernel may write (`gemm_b_mut`: `&mut`, so no copy is
//! made; the loop writes `b`'s tiles from registers each step, still on the tensor
//! cores).
//!
//! Tensor cores in the SASS: run with a module cache of its own and count the matrix
//! instructions of the kernels it compiled (`HGMMA` on the H100; the second argument
//! lists the user kernels whatever path they took):
//!
//!     KFUSE_CACHE_DIR=/tmp/kc-unaligned cargo run --release --example user_gemm_unaligned
//!     scripts/gemm-sass.sh /tmp/kc-unaligned
//!     scripts/gemm-sass.sh /tmp/kc-unaligned kf_gemm_bias

#[path = "../benches/common/mod.rs"]
mod common;

use common::epilogue::gemm_bias_gelu;
use kfuse::prelude::*;
use kfuse::{DType, Tensor};

/// The user GEMM with its own epilogue, `out = relu(a · b + bias)`: the one the tests
/// check (`tests/kernels/user_gemms.rs`).
#[path = "../tests/kernels/user_gemms.rs"]
#[allow(dead_code)]
mod user_gemms;
use user_gemms::{gemm_b_mut, gemm_bias_relu};

/// `out = a · b` written by a user: the loop and a cast.
#[kfuse]
pub fn user_gemm<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    out.block([i * BM, j * BN], [BM, BN]).store(acc.cast::<T>());
}

/// 24 spread rows and both ends.
fn rows(m: usize) -> Vec<usize> {
    let mut r: Vec<usize> = (0..24).map(|i| (i * 7919 + 13) % m).chain([0, m - 1]).collect();
    r.sort();
    r.dedup();
    r
}

/// ‖got − want‖ / ‖want‖ over rows `rs` of `out` (`[.., n]`) against `f(row, col, a·b)`.
fn sampled(out: &Tensor, av: &[f32], bv: &[f32], k: usize, n: usize, rs: &[usize], f: impl Fn(usize, f64) -> f64) -> kfuse::Result<f64> {
    let ob = out.to_vec_f64()?;
    let (mut num, mut den) = (0f64, 0f64);
    for &i in rs {
        let mut acc = vec![0f64; n];
        for p in 0..k {
            let x = av[i * k + p] as f64;
            for (o, &y) in acc.iter_mut().zip(&bv[p * n..(p + 1) * n]) {
                *o += x * y as f64;
            }
        }
        for (j, v) in acc.into_iter().enumerate() {
            let want = f(j, v);
            num += (ob[i * n + j] - want).powi(2);
            den += want * want;
        }
    }
    Ok((num / den.max(f64::MIN_POSITIVE)).sqrt())
}

/// Whether launch `l` ran its matrix loop on the tensor cores; prints its plan.
fn on_tensor_cores(what: &str, l: &kfuse::Launched) -> bool {
    let Some(plan) = &l.plan else { return false };
    println!("--- {what}\n{plan}");
    plan.tensor_cores()
}

fn main() -> kfuse::Result<()> {
    let Some(dev) = common::gpu() else { return Ok(()) };
    let arg: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (m, n, k) = match arg[..] {
        [m, n, k] => (m, n, k),
        _ => (4095, 4097, 4096),
    };
    let iters = std::env::var("KFUSE_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
    let dt = DType::BF16;
    let (a, av) = common::random(&[m, k], dt, 1, &dev);
    let (b, bv) = common::random(&[k, n], dt, 2, &dev);
    let mut b_mut = b.clone();
    let (bias, biasv) = common::random(&[n], dt, 3, &dev);
    // `b` as a caller holding it in padded rows would pass it: no copy at launch
    let b_padded = {
        let mut s = Tensor::empty(&[k, n.div_ceil(64) * 64], dt, &dev)?.narrow(1, 0, n)?;
        kfuse::ops::kernels::copy2d(&b, &mut s)?;
        s
    };
    let mut out = Tensor::empty(&[m, n], dt, &dev)?;
    let mut out2 = Tensor::empty(&[m, n], dt, &dev)?;

    // plans and numerics (the first calls compile)
    let mut ok = true;
    let rs = rows(m);
    let c = kfuse::ops::gemm(&a, &b)?;
    let e_ops = sampled(&c, &av, &bv, k, n, &rs, |_, v| v)?;
    let l = gemm_bias_relu(&a, &b, &bias, &mut out)?;
    ok &= on_tensor_cores("user gemm + bias + ReLU", &l);
    let e_user = sampled(&out, &av, &bv, k, n, &rs, |j, v| (v + biasv[j] as f64).max(0.0))?;
    ok &= on_tensor_cores("user gemm, no epilogue", &user_gemm(&a, &b, &mut out2)?);
    let e_plain = sampled(&out2, &av, &bv, k, n, &rs, |_, v| v)?;
    ok &= on_tensor_cores("user gemm + bias + GELU", &gemm_bias_gelu(&a, &b, &bias, &mut out2)?);
    let gelu = |j: usize, v: f64| {
        let x = v + biasv[j] as f64;
        0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
    };
    let e_gelu = sampled(&out2, &av, &bv, k, n, &rs, gelu)?;
    ok &= on_tensor_cores("user gemm + bias + ReLU on a padded b (no copy)", &gemm_bias_relu(&a, &b_padded, &bias, &mut out2)?);
    ok &= on_tensor_cores("user gemm, b &mut (no copy: b's tiles from registers)", &gemm_b_mut(&a, &mut b_mut, &mut out2)?);
    let e_mut = sampled(&out2, &av, &bv, k, n, &rs, |_, v| v)?;
    println!("relative error against float64 on {} rows: ops::gemm {e_ops:.2e}, user +bias+ReLU {e_user:.2e}, plain {e_plain:.2e}, +bias+GELU {e_gelu:.2e}, b &mut {e_mut:.2e}", rs.len());
    ok &= [e_ops, e_user, e_plain, e_gelu, e_mut].iter().all(|&e| e <= 1e-2);

    // times
    let mut t_ops = || kfuse::ops::gemm(&a, &b).map(drop);
    let mut t_relu = || gemm_bias_relu(&a, &b, &bias, &mut out).map(drop);
    let mut o2 = Tensor::empty(&[m, n], dt, &dev)?;
    let mut t_plain = || user_gemm(&a, &b, &mut o2).map(drop);
    let mut o3 = Tensor::empty(&[m, n], dt, &dev)?;
    let mut t_gelu = || gemm_bias_gelu(&a, &b, &bias, &mut o3).map(drop);
    let mut o4 = Tensor::empty(&[m, n], dt, &dev)?;
    let mut t_nocopy = || gemm_bias_relu(&a, &b_padded, &bias, &mut o4).map(drop);
    let mut o5 = Tensor::empty(&[m, n], dt, &dev)?;
    let mut t_mut = || gemm_b_mut(&a, &mut b_mut, &mut o5).map(drop);
    let times = common::interleaved(&dev, 10, iters, &mut [&mut t_ops, &mut t_relu, &mut t_plain, &mut t_gelu, &mut t_nocopy, &mut t_mut]);
    let times = times.into_iter().collect::<kfuse::Result<Vec<f64>>>()?;
    let tflops = |ms: f64| 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
    let names = ["kfuse::ops::gemm", "user gemm + bias + ReLU", "user gemm (no epilogue)", "user gemm + bias + GELU", "user + bias + ReLU, b pre-padded (no copy)", "user gemm, b &mut (no copy; b from registers)"];
    println!("\n| M{m} N{n} K{k} bf16 | ms | TFLOP/s | ÷ ops::gemm |\n|---|---|---|---|");
    for (name, &ms) in names.iter().zip(&times) {
        println!("| {name} | {ms:.3} | {:.0} | {:.2}× |", tflops(ms), times[0] / ms);
    }
    let ratio = times[0] / times[1];
    let bar = ratio >= 0.9;
    println!(
        "user_gemm_unaligned summary: M{m} N{n} K{k} bf16: ops::gemm {:.0} TFLOP/s; user gemm+bias+ReLU {:.0} ({ratio:.2}×), plain {:.0} ({:.2}×), +bias+GELU {:.0} ({:.2}×); the copy of b costs {:.1} µs; bar (bias+ReLU ≥ 0.9× ops::gemm): {}; numerics and tensor cores: {}",
        tflops(times[0]),
        tflops(times[1]),
        tflops(times[2]),
        times[0] / times[2],
        tflops(times[3]),
        times[0] / times[3],
        (times[1] - times[4]) * 1e3,
        if bar { "PASS" } else { "FAIL" },
        if ok { "ok" } else { "FAIL" }
    );
    if !(bar && ok) {
        std::process::exit(1);
    }
    Ok(())
}
