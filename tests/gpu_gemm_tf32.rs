//! f32 products read as TF32 on the GPU (sm_90a: `wgmma … k8 … tf32` on K-major
//! operands) against a float64 reference of the exact product: `kfuse::ops::gemm_ex`
//! with `GemmOptions::tf32` for every transpose combination (an MN-major operand is
//! copied K-major by the op, the transpose of an `[N, K]` tensor is read as it lies),
//! odd shapes, `alpha`/`beta · c`, a bf16 output, the batched product, and the raw
//! kernel launched into a NaN-poisoned output. The bound is 5e-3 on ‖out − ref‖/‖ref‖
//! (TF32 keeps 10 mantissa bits: ~1e-3); on sm_90a the error must also exceed 1e-5 for
//! K > 16, which shows the tensor cores ran (the exact FMA path gives ~1e-7). Compiled
//! for sm_80 (`KFUSE_TARGET=sm_80`) the products are exact and the bound is 1e-5. Large
//! shapes are checked on a sample of rows. GPU-only: ignored (counted as skipped) unless
//! built with `--cfg kfuse_gpu` (`scripts/gpu-build.sh`), then failed where no GPU is
//! found.

mod common;

use common::gemm::{operand, reference_rows_ex, rows_of, sample_rows, Outcomes};

use kfuse::ops::{gemm_batched_ex, gemm_ex, GemmOptions};
use kfuse::{Backend, DType, Device};

/// The bound for TF32 products; exact ones (sm_80/sm_89) must meet 1e-5.
const TOL: f64 = 5e-3;

/// Whether the device's products read TF32 (it compiles for sm_90a).
fn tensor_cores(dev: &Device) -> bool {
    dev.target().is_some_and(|t| t.sm == 90)
}

/// Checks relative error `e` of a case with reduction length `k`: within the bound of
/// the path the device takes, and (on sm_90a, K > 16) visibly TF32.
fn judge(what: &str, e: f64, k: usize, od: DType, dev: &Device) -> Result<f64, String> {
    let rounding = if od == DType::F32 { 0.0 } else { 8e-3 };
    let (lo, hi) = if tensor_cores(dev) { (if k > 16 && od == DType::F32 { 1e-5 } else { 0.0 }, TOL + rounding) } else { (0.0, 1e-5 + rounding) };
    if e.is_nan() || e > hi {
        return Err(format!("{what}: relative error {e:.3e} > {hi:.0e}"));
    }
    if e < lo {
        return Err(format!("{what}: relative error {e:.3e} < {lo:.0e}: no TF32 rounding seen (did the exact path run?)"));
    }
    Ok(e)
}

/// `a·b` for `[m, k]` · `[k, n]` f32 operands (each transposed when asked) through
/// `gemm_ex` with `tf32`.
fn check(m: usize, n: usize, k: usize, ta: bool, tb: bool, dev: &Device, seed: u64) -> Result<f64, String> {
    let what = format!("tf32 gemm {m}x{n}x{k} ta={ta} tb={tb}");
    let (a, av) = operand(m, k, DType::F32, seed, ta, dev);
    let (b, bv) = operand(k, n, DType::F32, seed + 1, tb, dev);
    let rows = sample_rows(m);
    let want = reference_rows_ex(&av, &bv, None, k, n, &rows, 1.0, 0.0);
    let got = gemm_ex(&a, &b, &GemmOptions { tf32: true, ..Default::default() }).map_err(|e| format!("{what}: {e}"))?;
    let got = rows_of(&got.to_vec_f64().map_err(|e| e.to_string())?, n, &rows);
    judge(&what, common::rel_err(&got, &want), k, DType::F32, dev)
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn tf32_gemm_on_the_gpu_against_float64() {
    let dev = common::gpu();
    let mut out = Outcomes::default();
    let shapes = [(1, 1, 1), (17, 33, 65), (1, 4096, 4096), (300, 200, 1000), (129, 4096, 4096), (4095, 4097, 4095)];
    for (s, &(m, n, k)) in shapes.iter().enumerate() {
        for (ta, tb) in [(false, true), (false, false), (true, false), (true, true)] {
            out.add(format!("{m}x{n}x{k} ta={ta} tb={tb}"), check(m, n, k, ta, tb, &dev, 300 + 10 * s as u64));
        }
    }
    out.finish();
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn tf32_gemm_ex_options_and_batched() {
    let dev = common::gpu();
    let mut out = Outcomes::default();
    let (m, n, k) = (257, 130, 515);
    let (a, av) = operand(m, k, DType::F32, 41, false, &dev);
    let (b, bv) = operand(k, n, DType::F32, 42, true, &dev);
    let rows: Vec<usize> = (0..m).collect();
    // alpha · a·b + beta · c, f32 out
    let (c, cv) = common::random_tensor(&[m, n], DType::F32, 43, 0.05, &dev);
    let opts = GemmOptions { alpha: 0.75, beta: -1.25, c: Some(&c), tf32: true, ..Default::default() };
    let r = gemm_ex(&a, &b, &opts).map_err(|e| e.to_string()).and_then(|got| {
        let want = reference_rows_ex(&av, &bv, Some(&cv), k, n, &rows, 0.75, -1.25);
        judge("axpby", common::rel_err(&got.to_vec_f64().map_err(|e| e.to_string())?, &want), k, DType::F32, &dev)
    });
    out.add("gemm_ex alpha beta c", r);
    // a bf16 output (TMA store epilogue)
    let opts = GemmOptions { out_dtype: Some(DType::BF16), tf32: true, ..Default::default() };
    let r = gemm_ex(&a, &b, &opts).map_err(|e| e.to_string()).and_then(|got| {
        let want = reference_rows_ex(&av, &bv, None, k, n, &rows, 1.0, 0.0);
        judge("bf16 out", common::rel_err(&got.to_vec_f64().map_err(|e| e.to_string())?, &want), k, DType::BF16, &dev)
    });
    out.add("gemm_ex bf16 out", r);
    // a batch of 3 products, and one with a shared `b`
    let (nb, m, n, k) = (3, 65, 33, 129);
    let (x, xv) = common::random_tensor(&[nb, m, k], DType::F32, 44, 0.05, &dev);
    let (w, wv) = common::random_tensor(&[nb, k, n], DType::F32, 45, 0.05, &dev);
    let rows: Vec<usize> = (0..m).collect();
    let r = gemm_batched_ex(&x, &w, &GemmOptions { alpha: 2.0, tf32: true, ..Default::default() }).map_err(|e| e.to_string()).and_then(|got| {
        let mut want = Vec::new();
        for z in 0..nb {
            want.extend(reference_rows_ex(&xv[z * m * k..(z + 1) * m * k], &wv[z * k * n..(z + 1) * k * n], None, k, n, &rows, 2.0, 0.0));
        }
        judge("batched", common::rel_err(&got.to_vec_f64().map_err(|e| e.to_string())?, &want), k, DType::F32, &dev)
    });
    out.add("gemm_batched_ex", r);
    let (w2, w2v) = common::random_tensor(&[k, n], DType::F32, 46, 0.05, &dev);
    let r = gemm_batched_ex(&x, &w2, &GemmOptions { tf32: true, ..Default::default() }).map_err(|e| e.to_string()).and_then(|got| {
        let all: Vec<usize> = (0..nb * m).collect();
        let want = reference_rows_ex(&xv, &w2v, None, k, n, &all, 1.0, 0.0);
        judge("shared b", common::rel_err(&got.to_vec_f64().map_err(|e| e.to_string())?, &want), k, DType::F32, &dev)
    });
    out.add("gemm_batched_ex shared b", r);
    out.finish();
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn tf32_kernel_writes_every_element_of_a_poisoned_output() {
    let dev = common::gpu();
    for &(m, n, k) in &[(257, 320, 192), (64, 136, 4096), (1, 1, 1)] {
        let (a, av) = operand(m, k, DType::F32, 7, false, &dev);
        // K-major `b` (the transpose of an [N, K] tensor): what the kernel reads
        let (b, bv) = operand(k, n, DType::F32, 8, true, &dev);
        let mut out = common::poisoned(&[m, n], DType::F32, &dev);
        let l = kfuse::ops::kernels::gemm_tf32_scaled(&a, &b, &mut out, 0.5).unwrap();
        assert!(matches!(l.backend, Backend::Gpu { .. }), "{:?}", l.backend);
        let rows: Vec<usize> = (0..m).collect();
        let e = common::rel_err(&out.to_vec_f64().unwrap(), &reference_rows_ex(&av, &bv, None, k, n, &rows, 0.5, 0.0));
        judge(&format!("kernel {m}x{n}x{k}"), e, k, DType::F32, &dev).unwrap();
    }
}
