//! f32 matrix products on the GPU (the writer's exact FMA rule) against a
//! float64 reference: `kfuse::ops::gemm` and its kernel launched into a NaN-poisoned
//! output, every transpose combination (a transposed operand is a strided view, read
//! as it lies: no copy), odd shapes, operands with unaligned row strides, a fused
//! bias + GELU epilogue and the configurable products. The bound is 1e-5 on
//! ‖out − ref‖/‖ref‖: f32 accumulation with one rounding per FMA, no TF32 (whose
//! 10-bit mantissa would give ~1e-3). Large shapes are checked on a sample of rows.
//! GPU-only: ignored (counted as skipped) unless built with `--cfg kfuse_gpu`
//! (`scripts/gpu-build.sh`), then failed where no GPU is found.
//! `KFUSE_TARGET=sm_80` runs the same kernels as compiled for the A100.

mod common;

use common::gemm::{bias_gelu_error, operand, reference_rows, reference_rows_ex, rows_of, sample_rows, Outcomes};

use kfuse::ops::{gemm_batched_ex, gemm_ex, GemmOptions};
use kfuse::{Backend, DType, Device};

const TOL: f64 = 1e-5;

/// `a·b` for `[m, k]` · `[k, n]` f32 operands (each transposed when asked), through
/// `kfuse::ops::gemm` and through the kernel into a poisoned output; the larger error.
fn check(m: usize, n: usize, k: usize, ta: bool, tb: bool, dev: &Device, seed: u64) -> Result<f64, String> {
    let what = format!("f32 gemm {m}x{n}x{k} ta={ta} tb={tb}");
    let (a, av) = operand(m, k, DType::F32, seed, ta, dev);
    let (b, bv) = operand(k, n, DType::F32, seed + 1, tb, dev);
    let rows = sample_rows(m);
    let want = reference_rows(&av, &bv, k, n, &rows);
    let api = kfuse::ops::gemm(&a, &b).map_err(|e| format!("{what}: {e}"))?;
    let mut raw = common::poisoned(&[m, n], DType::F32, dev);
    let l = kfuse::ops::kernels::gemm(&a, &b, &mut raw).map_err(|e| format!("{what} (kernel): {e}"))?;
    if !matches!(l.backend, Backend::Gpu { .. }) {
        return Err(format!("{what}: ran on {:?}", l.backend));
    }
    let mut worst: f64 = 0.0;
    for (which, t) in [("api", api), ("kernel", raw)] {
        let got = rows_of(&t.to_vec_f64().map_err(|e| e.to_string())?, n, &rows);
        let e = common::rel_err(&got, &want);
        if e.is_nan() || e > TOL {
            return Err(format!("{what} ({which}): relative error {e:.3e} > {TOL:.0e}"));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn f32_gemm_on_the_gpu_against_float64() {
    let dev = common::gpu();
    let mut out = Outcomes::default();
    let shapes = [(1, 1, 1), (17, 33, 65), (1, 4096, 4096), (300, 200, 1000), (4095, 4097, 255), (129, 4096, 4096), (64, 64, 64)];
    for (s, &(m, n, k)) in shapes.iter().enumerate() {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            out.add(format!("{m}x{n}x{k} ta={ta} tb={tb}"), check(m, n, k, ta, tb, &dev, 100 + 10 * s as u64));
        }
    }
    out.finish();
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn f32_gemm_reads_unaligned_strided_operands() {
    let dev = common::gpu();
    // `a` a column slice with rows 4·131 bytes apart and its data 4 bytes off 16; `b` a
    // column slice of a wider matrix — no copies, the kernel reads them as they lie
    let (m, n, k) = (77, 301, 129);
    let (wa, wav) = common::random_tensor(&[m, k + 2], DType::F32, 31, 0.05, &dev);
    let (wb, wbv) = common::random_tensor(&[k, n + 7], DType::F32, 32, 0.05, &dev);
    let a = wa.narrow(1, 1, k).unwrap();
    let b = wb.narrow(1, 3, n).unwrap();
    let av: Vec<f64> = (0..m * k).map(|x| wav[(x / k) * (k + 2) + 1 + x % k]).collect();
    let bv: Vec<f64> = (0..k * n).map(|x| wbv[(x / n) * (n + 7) + 3 + x % n]).collect();
    let mut out = common::poisoned(&[m, n], DType::F32, &dev);
    kfuse::ops::kernels::gemm(&a, &b, &mut out).unwrap();
    let rows: Vec<usize> = (0..m).collect();
    let e = common::rel_err(&out.to_vec_f64().unwrap(), &reference_rows(&av, &bv, k, n, &rows));
    assert!(e <= TOL, "relative error {e:.3e}");
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn f32_user_gemm_with_bias_gelu_epilogue() {
    let dev = common::gpu();
    for &(m, n, k) in &[(129, 320, 200), (1, 77, 4096), (1000, 520, 336)] {
        let (l, e) = bias_gelu_error(m, n, k, DType::F32, &dev);
        assert!(matches!(l.backend, Backend::Gpu { .. }), "{:?}", l.backend);
        // erff adds a few ulp of its own
        assert!(e <= 2.0 * TOL, "{m}x{n}x{k}: relative error {e:.3e}");
    }
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn f32_gemm_ex_and_batched() {
    let dev = common::gpu();
    let (m, n, k) = (257, 130, 515);
    let (a, av) = operand(m, k, DType::F32, 41, true, &dev);
    let (b, bv) = operand(k, n, DType::F32, 42, false, &dev);
    let (c, cv) = common::random_tensor(&[m, n], DType::F32, 43, 0.05, &dev);
    let rows: Vec<usize> = (0..m).collect();
    let opts = GemmOptions { alpha: 0.75, beta: -1.25, c: Some(&c), ..Default::default() };
    let got = gemm_ex(&a, &b, &opts).unwrap();
    let want = reference_rows_ex(&av, &bv, Some(&cv), k, n, &rows, 0.75, -1.25);
    let e = common::rel_err(&got.to_vec_f64().unwrap(), &want);
    assert!(e <= TOL, "gemm_ex: relative error {e:.3e}");
    // a batch of 3 products, f32 in and out
    let (nb, m, n, k) = (3, 65, 33, 129);
    let (x, xv) = common::random_tensor(&[nb, m, k], DType::F32, 44, 0.05, &dev);
    let (w, wv) = common::random_tensor(&[nb, k, n], DType::F32, 45, 0.05, &dev);
    let got = gemm_batched_ex(&x, &w, &GemmOptions { alpha: 2.0, ..Default::default() }).unwrap().to_vec_f64().unwrap();
    let rows: Vec<usize> = (0..m).collect();
    let mut want = Vec::new();
    for z in 0..nb {
        want.extend(reference_rows_ex(&xv[z * m * k..(z + 1) * m * k], &wv[z * k * n..(z + 1) * k * n], None, k, n, &rows, 2.0, 0.0));
    }
    let e = common::rel_err(&got, &want);
    assert!(e <= TOL, "gemm_batched_ex: relative error {e:.3e}");
}
