//! `kfuse::ops::gemm_ex` (alpha, beta, `c`, output dtypes) and `gemm_batched(_ex)` on
//! the GPU, against a float64 reference: random inputs (never zeros), raw kernel outputs
//! poisoned with NaN first, odd shapes, transposed operands, a batch with a shared `b`
//! and one whose rows TMA cannot read as they lie (copied first). Large shapes are
//! checked on a sample of rows. GPU-only: ignored (counted as skipped) unless built with
//! `--cfg kfuse_gpu` (`scripts/gpu-build.sh`), then failed where no GPU is found.

mod common;

use common::gemm::{operand, reference_rows_ex, rows_of, sample_rows, within, Outcomes};

use kfuse::ops::{gemm_batched, gemm_batched_ex, gemm_ex, GemmOptions};
use kfuse::prelude::*;
use kfuse::{Backend, DType};

/// The bound on ‖out − ref‖/‖ref‖ for results of dtype `od` from 16-bit operands.
fn tol(od: DType) -> f64 {
    if od == DType::F32 {
        1e-4
    } else {
        1e-2
    }
}

struct Case {
    m: usize,
    n: usize,
    k: usize,
    dt: DType,
    od: DType,
    ta: bool,
    tb: bool,
    with_c: bool,
}

fn check_gemm_ex(cs: &Case, dev: &Device, seed: u64) -> Result<f64, String> {
    let &Case { m, n, k, dt, od, ta, tb, with_c } = cs;
    let what = format!("gemm_ex {m}x{n}x{k} {dt}->{od} ta={ta} tb={tb} c={with_c}");
    let (a, av) = operand(m, k, dt, seed, ta, dev);
    let (b, bv) = operand(k, n, dt, seed + 1, tb, dev);
    let (c, cv) = common::random_tensor(&[m, n], od, seed + 2, 0.05, dev);
    let (alpha, beta) = if with_c { (0.5f32, 1.25f32) } else { (-1.5f32, 0.0f32) };
    let opts = GemmOptions { alpha, beta, c: with_c.then_some(&c), out_dtype: Some(od), ..Default::default() };
    let out = gemm_ex(&a, &b, &opts).map_err(|e| format!("{what}: {e}"))?;
    if (out.shape(), out.dtype()) != (&[m, n][..], od) {
        return Err(format!("{what}: got shape {:?} dtype {}", out.shape(), out.dtype()));
    }
    let rows = sample_rows(m);
    let got = rows_of(&out.to_vec_f64().map_err(|e| e.to_string())?, n, &rows);
    let want = reference_rows_ex(&av, &bv, with_c.then_some(&cv[..]), k, n, &rows, alpha as f64, beta as f64);
    within(&what, common::rel_err(&got, &want), tol(od))
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn gemm_ex_on_the_gpu_against_float64() {
    let dev = common::gpu();
    let mut out = Outcomes::default();
    let pairs = [(DType::BF16, DType::BF16), (DType::F16, DType::F16), (DType::BF16, DType::F32), (DType::F16, DType::F32), (DType::BF16, DType::F16)];
    for (s, &(m, n, k)) in [(1, 1, 1), (17, 33, 65), (300, 200, 1000), (4095, 4097, 4095)].iter().enumerate() {
        let big = m * n * k > 1 << 30;
        for &(dt, od) in &pairs {
            for with_c in [false, true] {
                for (ta, tb) in [(false, false), (true, false), (false, true)] {
                    // the biggest shape: bf16 row-major only (the host reference is slow)
                    if big && (dt != DType::BF16 || ta || tb) {
                        continue;
                    }
                    let cs = Case { m, n, k, dt, od, ta, tb, with_c };
                    out.add(format!("{m}x{n}x{k} {dt}->{od} ta={ta} tb={tb} c={with_c}"), check_gemm_ex(&cs, &dev, 10 * s as u64));
                }
            }
        }
    }
    out.finish();
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn gemm_ex_with_beta_zero_ignores_c_and_k_zero_gives_beta_c() {
    let dev = common::gpu();
    let (m, n, k) = (130, 72, 64);
    let (a, av) = common::random_tensor(&[m, k], DType::BF16, 1, 0.05, &dev);
    let (b, bv) = common::random_tensor(&[k, n], DType::BF16, 2, 0.05, &dev);
    let c = Tensor::full(&[m, n], f64::NAN, DType::BF16, &dev).unwrap();
    let out = gemm_ex(&a, &b, &GemmOptions { alpha: 2.0, beta: 0.0, c: Some(&c), out_dtype: None, ..Default::default() }).unwrap();
    let rows: Vec<usize> = (0..m).collect();
    let e = common::rel_err(&out.to_vec_f64().unwrap(), &reference_rows_ex(&av, &bv, None, k, n, &rows, 2.0, 0.0));
    assert!(e <= 1e-2, "beta = 0: relative error {e:.3e}");
    // K = 0: beta · c
    let (c, cv) = common::random_tensor(&[m, n], DType::F32, 3, 0.05, &dev);
    let a0 = Tensor::empty(&[m, 0], DType::BF16, &dev).unwrap();
    let b0 = Tensor::empty(&[0, n], DType::BF16, &dev).unwrap();
    let out = gemm_ex(&a0, &b0, &GemmOptions { alpha: 1.0, beta: -0.5, c: Some(&c), out_dtype: Some(DType::F32), ..Default::default() }).unwrap();
    assert_eq!(out.to_vec_f64().unwrap(), cv.iter().map(|v| -0.5 * v).collect::<Vec<_>>());
}

/// `gemm_batched_ex` over `batch` of `m x n x k` products; `b` shared when `b_shared`;
/// every row checked when the batch is small, else a sample of each product's rows.
#[allow(clippy::too_many_arguments)]
fn check_batched(batch: &[usize], (m, n, k): (usize, usize, usize), b_shared: bool, ta: bool, dt: DType, od: DType, with_c: bool, dev: &Device, seed: u64) -> Result<f64, String> {
    let what = format!("gemm_batched {batch:?} x {m}x{n}x{k} shared_b={b_shared} ta={ta} {dt}->{od} c={with_c}");
    let nb: usize = batch.iter().product();
    let a = if ta {
        let (t, _) = common::random_tensor(&[batch, &[k, m]].concat(), dt, seed, 0.05, dev);
        t.t()
    } else {
        common::random_tensor(&[batch, &[m, k]].concat(), dt, seed, 0.05, dev).0
    };
    let av = a.to_vec_f64().map_err(|e| e.to_string())?;
    let bshape = if b_shared { vec![k, n] } else { [batch, &[k, n]].concat() };
    let (b, bv) = common::random_tensor(&bshape, dt, seed + 1, 0.05, dev);
    let oshape = [batch, &[m, n]].concat();
    let (c, cv) = common::random_tensor(&oshape, od, seed + 2, 0.05, dev);
    let (alpha, beta) = if with_c { (1.5f32, -0.75f32) } else { (1.0, 0.0) };
    let out = if with_c || od != dt {
        gemm_batched_ex(&a, &b, &GemmOptions { alpha, beta, c: with_c.then_some(&c), out_dtype: Some(od), ..Default::default() })
    } else {
        gemm_batched(&a, &b)
    }
    .map_err(|e| format!("{what}: {e}"))?;
    if (out.shape(), out.dtype()) != (&oshape[..], od) {
        return Err(format!("{what}: got shape {:?} dtype {}", out.shape(), out.dtype()));
    }
    let ov = out.to_vec_f64().map_err(|e| e.to_string())?;
    let rows = sample_rows(m);
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for z in 0..nb {
        let bz = if b_shared { &bv[..] } else { &bv[z * k * n..(z + 1) * k * n] };
        got.extend(rows_of(&ov[z * m * n..(z + 1) * m * n], n, &rows));
        let cz = with_c.then_some(&cv[z * m * n..(z + 1) * m * n]);
        want.extend(reference_rows_ex(&av[z * m * k..(z + 1) * m * k], bz, cz, k, n, &rows, alpha as f64, beta as f64));
    }
    within(&what, common::rel_err(&got, &want), tol(od))
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn gemm_batched_on_the_gpu_against_float64() {
    let dev = common::gpu();
    let (bf, f16, f32_) = (DType::BF16, DType::F16, DType::F32);
    let mut out = Outcomes::default();
    // (batch, mnk, shared b, transposed a, operand dtype, output dtype, with c)
    type BatchCase = (Vec<usize>, (usize, usize, usize), bool, bool, DType, DType, bool);
    let cases: Vec<BatchCase> = vec![
        (vec![3], (257, 320, 192), false, false, bf, bf, false),
        (vec![3], (257, 320, 192), false, false, f16, f16, false),
        (vec![3], (257, 320, 192), false, true, bf, bf, true),
        (vec![3], (257, 320, 192), false, false, bf, f32_, true),
        (vec![3], (257, 320, 192), true, false, bf, bf, false),
        (vec![3], (257, 320, 192), true, true, f16, f32_, true),
        (vec![1], (1, 1, 1), false, false, bf, bf, false),
        (vec![4], (17, 33, 65), false, false, bf, bf, true),
        // rows of 130 bf16 elements (260 bytes): `b` is copied for TMA first
        (vec![2, 3], (65, 130, 96), false, false, bf, bf, false),
        (vec![2, 3], (65, 130, 96), false, true, f16, f16, true),
        (vec![2, 3], (65, 130, 96), true, false, bf, f32_, true),
        (vec![8], (1000, 520, 336), false, false, bf, bf, false),
    ];
    for (s, (batch, mnk, shared, ta, dt, od, with_c)) in cases.into_iter().enumerate() {
        let what = format!("{batch:?} x {mnk:?} shared_b={shared} ta={ta} {dt}->{od} c={with_c}");
        out.add(what, check_batched(&batch, mnk, shared, ta, dt, od, with_c, &dev, 100 + 10 * s as u64));
    }
    out.finish();
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn gemm_ex_kernels_run_on_the_gpu_into_poisoned_outputs() {
    let dev = common::gpu();
    use kfuse::ops::kernels as k;
    let (m, n, kk) = (257, 320, 192);
    let (a, av) = common::random_tensor(&[m, kk], DType::BF16, 5, 0.05, &dev);
    let (b, bv) = common::random_tensor(&[kk, n], DType::BF16, 6, 0.05, &dev);
    let (c, cv) = common::random_tensor(&[m, n], DType::F32, 7, 0.05, &dev);
    let rows: Vec<usize> = (0..m).collect();
    let mut out = common::poisoned(&[m, n], DType::F32, &dev);
    let l = k::gemm_axpby(&a, &b, &c, &mut out, 0.5, 2.0).unwrap();
    assert!(matches!(l.backend, Backend::Gpu { .. }), "{:?}", l.backend);
    let e = common::rel_err(&out.to_vec_f64().unwrap(), &reference_rows_ex(&av, &bv, Some(&cv), kk, n, &rows, 0.5, 2.0));
    assert!(e <= 1e-4, "gemm_axpby: relative error {e:.3e}");
    let mut out = common::poisoned(&[m, n], DType::BF16, &dev);
    k::gemm_scaled(&a, &b, &mut out, -3.0).unwrap();
    let e = common::rel_err(&out.to_vec_f64().unwrap(), &reference_rows_ex(&av, &bv, None, kk, n, &rows, -3.0, 0.0));
    assert!(e <= 1e-2, "gemm_scaled: relative error {e:.3e}");
    // batched: three products
    let nb = 3;
    let (a3, a3v) = common::random_tensor(&[nb, m, kk], DType::F16, 8, 0.05, &dev);
    let (b3, b3v) = common::random_tensor(&[nb, kk, n], DType::F16, 9, 0.05, &dev);
    let (c3, c3v) = common::random_tensor(&[nb, m, n], DType::F16, 10, 0.05, &dev);
    let mut o1 = common::poisoned(&[nb, m, n], DType::F16, &dev);
    let l = k::gemm_batched_scaled(&a3, &b3, &mut o1, 1.0).unwrap();
    assert!(matches!(l.backend, Backend::Gpu { .. }), "{:?}", l.backend);
    let mut o2 = common::poisoned(&[nb, m, n], DType::F16, &dev);
    k::gemm_batched_axpby(&a3, &b3, &c3, &mut o2, 1.0, -1.0).unwrap();
    let (v1, v2) = (o1.to_vec_f64().unwrap(), o2.to_vec_f64().unwrap());
    for z in 0..nb {
        let (sa, sb, sc) = (z * m * kk..(z + 1) * m * kk, z * kk * n..(z + 1) * kk * n, z * m * n..(z + 1) * m * n);
        let want = reference_rows_ex(&a3v[sa.clone()], &b3v[sb.clone()], None, kk, n, &rows, 1.0, 0.0);
        let e = common::rel_err(&v1[sc.clone()], &want);
        assert!(e <= 1e-2, "gemm_batched_scaled product {z}: relative error {e:.3e}");
        let want = reference_rows_ex(&a3v[sa], &b3v[sb], Some(&c3v[sc.clone()]), kk, n, &rows, 1.0, -1.0);
        let e = common::rel_err(&v2[sc], &want);
        assert!(e <= 1e-2, "gemm_batched_axpby product {z}: relative error {e:.3e}");
    }
}
