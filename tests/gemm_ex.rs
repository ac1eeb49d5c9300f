//! The configurable matrix products on the CPU interpreter against float64:
//! `kfuse::ops::gemm_ex` (alpha, beta and `c`, every pair of operand and output dtypes),
//! `gemm_batched` / `gemm_batched_ex` (one and two leading batch dimensions, a shared
//! `b`, strided batches), their empty and `K = 0` cases and their errors; then what the
//! compiler emits for their kernels on sm_90a (no GPU needed). Inputs are random and
//! never zero; outputs of raw kernel launches are poisoned with NaN first.

mod common;

use kfuse::codegen::{compile, Target};
use kfuse::ops::{gemm_batched, gemm_batched_ex, gemm_ex, GemmOptions};
use kfuse::prelude::*;
use kfuse::{DType, Error};

fn cpu() -> Device {
    Device::cpu()
}

/// The bound on ‖out − ref‖/‖ref‖ for results rounded to `dt` (f32 accumulation).
fn tol(dt: DType) -> f64 {
    match dt {
        DType::F32 => 1e-5,
        // one rounding to 3 (e4m3) or 2 (e5m2) mantissa bits: up to 2^-4 / 2^-3 of each
        // element, about a third of that in the norm
        DType::F8E4M3 => 4e-2,
        DType::F8E5M2 => 8e-2,
        _ => 1e-2,
    }
}

fn rand(shape: &[usize], dt: DType, seed: u64) -> (Tensor, Vec<f64>) {
    common::random_tensor(shape, dt, seed, 0.05, &cpu())
}

/// `alpha · a[z]·b[z] + beta · c[z]` in f64 for `nb` products (row-major values; `b`
/// shared by every `z` when `b_shared`; `c` absent: no addend).
#[allow(clippy::too_many_arguments)]
fn reference(a: &[f64], b: &[f64], c: Option<&[f64]>, nb: usize, m: usize, k: usize, n: usize, b_shared: bool, alpha: f64, beta: f64) -> Vec<f64> {
    let mut out = vec![0.0; nb * m * n];
    for z in 0..nb {
        let (a, b) = (&a[z * m * k..], if b_shared { b } else { &b[z * k * n..] });
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|q| a[i * k + q] * b[q * n + j]).sum();
                let x = z * m * n + i * n + j;
                out[x] = alpha * s + c.map_or(0.0, |c| beta * c[x]);
            }
        }
    }
    out
}

fn check(what: &str, got: &Tensor, shape: &[usize], dt: DType, want: &[f64]) {
    assert_eq!((got.shape(), got.dtype()), (shape, dt), "{what}: shape and dtype");
    let e = common::rel_err(&got.to_vec_f64().unwrap(), want);
    assert!(e <= tol(dt), "{what}: relative error {e:.3e} > {:.1e}", tol(dt));
}

/// (M, N, K): one element, partial tiles everywhere, K over several tiles.
const SHAPES: [(usize, usize, usize); 4] = [(1, 1, 1), (17, 33, 65), (7, 130, 5), (40, 3, 17)];

#[test]
fn gemm_ex_every_dtype_pair_with_alpha_beta_and_c() {
    let (alpha, beta) = (0.75f32, -1.25f32);
    for dt in common::DTYPES {
        for od in common::DTYPES {
            for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
                let what = format!("gemm_ex {m}x{n}x{k} {dt}->{od}");
                let seed = 100 * s as u64;
                let (a, av) = rand(&[m, k], dt, seed);
                let (b, bv) = rand(&[k, n], dt, seed + 1);
                let (c, cv) = rand(&[m, n], od, seed + 2);
                // with c
                let opts = GemmOptions { alpha, beta, c: Some(&c), out_dtype: Some(od), ..Default::default() };
                let got = gemm_ex(&a, &b, &opts).unwrap();
                check(&what, &got, &[m, n], od, &reference(&av, &bv, Some(&cv), 1, m, k, n, false, alpha as f64, beta as f64));
                // the kernel itself into a poisoned output: the same bits
                let mut out = common::poisoned(&[m, n], od, &cpu());
                let l = kfuse::ops::kernels::gemm_axpby(&a, &b, &c, &mut out, alpha, beta).unwrap();
                assert_eq!(l.backend, kfuse::Backend::Interpreter);
                assert_eq!(out.to_vec_f64().unwrap(), got.to_vec_f64().unwrap(), "{what}: same bits");
                // without c: scaled only
                let opts = GemmOptions { alpha: -2.0, out_dtype: Some(od), ..Default::default() };
                let got = gemm_ex(&a, &b, &opts).unwrap();
                check(&format!("{what} alpha only"), &got, &[m, n], od, &reference(&av, &bv, None, 1, m, k, n, false, -2.0, 0.0));
                // defaults with only the output dtype: the plain product
                let got = gemm_ex(&a, &b, &GemmOptions { out_dtype: Some(od), ..Default::default() }).unwrap();
                check(&format!("{what} plain"), &got, &[m, n], od, &reference(&av, &bv, None, 1, m, k, n, false, 1.0, 0.0));
            }
        }
    }
}

#[test]
fn fp8_operands_with_per_tensor_scales() {
    // `out = alpha · scale_a · scale_b · a·b + beta · c`, operands of either 8-bit type
    // (the values the kernel sees are the fp8-rounded ones), outputs of every float
    // dtype, B given both ways (row-major [K, N] and as the transpose of [N, K])
    let (sa, sb, alpha) = (0.5f32, 3.0f32, 1.5f32);
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        for dt in [DType::F8E4M3, DType::F8E5M2] {
            for od in [DType::BF16, DType::F32, DType::F8E4M3] {
                let (a, av) = rand(&[m, k], dt, 60 + i as u64);
                let (b, bv) = common::gemm::operand(k, n, dt, 70 + i as u64, i % 2 == 1, &cpu());
                let (c, cv) = rand(&[m, n], od, 80 + i as u64);
                let opts = GemmOptions { alpha, beta: 0.25, c: Some(&c), out_dtype: Some(od), scale_a: sa, scale_b: sb, tf32: false };
                let got = gemm_ex(&a, &b, &opts).unwrap();
                let want = reference(&av, &bv, Some(&cv), 1, m, k, n, false, (alpha * sa * sb) as f64, 0.25);
                check(&format!("{dt}->{od} {m}x{n}x{k}"), &got, &[m, n], od, &want);
            }
        }
    }
    // scales reach the plain product too
    let (a, av) = rand(&[5, 9], DType::F8E4M3, 1);
    let (b, bv) = rand(&[9, 4], DType::F8E4M3, 2);
    let got = gemm_ex(&a, &b, &GemmOptions { out_dtype: Some(DType::F32), scale_a: 2.0, scale_b: 0.125, ..Default::default() }).unwrap();
    check("fp8 scales", &got, &[5, 4], DType::F32, &reference(&av, &bv, None, 1, 5, 9, 4, false, 0.25, 0.0));
}

#[test]
fn gemm_ex_defaults_match_gemm_bit_for_bit() {
    for dt in common::DTYPES {
        let (a, _) = rand(&[19, 37], dt, 5);
        let (b, _) = rand(&[37, 23], dt, 6);
        let x = gemm_ex(&a, &b, &GemmOptions::default()).unwrap();
        let y = kfuse::ops::gemm(&a, &b).unwrap();
        assert_eq!((x.dtype(), x.to_vec_f64().unwrap()), (dt, y.to_vec_f64().unwrap()), "{dt}");
    }
}

#[test]
fn beta_zero_does_not_read_c() {
    let (m, n, k) = (9, 20, 33);
    let (a, av) = rand(&[m, k], DType::BF16, 1);
    let (b, bv) = rand(&[k, n], DType::BF16, 2);
    for poison in [f64::NAN, f64::INFINITY] {
        let c = Tensor::full(&[m, n], poison, DType::BF16, &cpu()).unwrap();
        let got = gemm_ex(&a, &b, &GemmOptions { alpha: 1.5, beta: 0.0, c: Some(&c), out_dtype: None, ..Default::default() }).unwrap();
        check("beta = 0", &got, &[m, n], DType::BF16, &reference(&av, &bv, None, 1, m, k, n, false, 1.5, 0.0));
    }
}

#[test]
fn gemm_ex_reads_strided_operands_and_c() {
    // aᵀ stored as [K, M]; b a column slice of a wider matrix; c a transposed view
    let (m, n, k) = (19, 23, 37);
    let (at, _) = rand(&[k, m], DType::BF16, 7);
    let (wide, _) = rand(&[k, n + 5], DType::BF16, 8);
    let (ct, _) = rand(&[n, m], DType::F32, 9);
    let (a, b, c) = (at.t(), wide.narrow(1, 2, n).unwrap(), ct.t());
    assert!(!a.is_contiguous() && !b.is_contiguous() && !c.is_contiguous());
    let (av, bv, cv) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap(), c.to_vec_f64().unwrap());
    let opts = GemmOptions { alpha: 0.5, beta: 2.0, c: Some(&c), out_dtype: Some(DType::F32), ..Default::default() };
    let got = gemm_ex(&a, &b, &opts).unwrap();
    check("strided gemm_ex", &got, &[m, n], DType::F32, &reference(&av, &bv, Some(&cv), 1, m, k, n, false, 0.5, 2.0));
}

#[test]
fn empty_sizes_and_the_empty_sum() {
    let t = |shape: &[usize], dt| rand(shape, dt, 3).0;
    // M = 0, N = 0: empty results of the output dtype
    let opts = GemmOptions { out_dtype: Some(DType::F32), ..Default::default() };
    let z = gemm_ex(&t(&[0, 4], DType::BF16), &t(&[4, 3], DType::BF16), &opts).unwrap();
    assert_eq!((z.shape(), z.dtype()), (&[0, 3][..], DType::F32));
    assert_eq!(gemm_batched(&t(&[2, 3, 0], DType::F16), &t(&[0, 0], DType::F16)).unwrap().shape(), &[2, 3, 0]);
    assert_eq!(gemm_batched(&t(&[0, 3, 4], DType::F16), &t(&[0, 4, 5], DType::F16)).unwrap().shape(), &[0, 3, 5]);
    // K = 0 without c: zeros
    let z = gemm_ex(&t(&[2, 0], DType::BF16), &t(&[0, 3], DType::BF16), &GemmOptions { alpha: 3.0, ..Default::default() }).unwrap();
    assert_eq!(z.to_vec_f64().unwrap(), vec![0.0; 6]);
    // K = 0 with c: beta · c (rounded once)
    let (c, cv) = rand(&[2, 3], DType::F16, 4);
    let z = gemm_ex(&t(&[2, 0], DType::BF16), &t(&[0, 3], DType::BF16), &GemmOptions { beta: 0.5, c: Some(&c), out_dtype: Some(DType::F16), alpha: 1.0, ..Default::default() })
        .unwrap();
    assert_eq!(z.to_vec_f64().unwrap(), cv.iter().map(|v| DType::F16.round(0.5 * v)).collect::<Vec<_>>());
    let (c, cv) = rand(&[2, 2, 3], DType::F32, 5);
    let opts = GemmOptions { beta: -2.0, c: Some(&c), ..Default::default() };
    let z = gemm_batched_ex(&t(&[2, 2, 0], DType::F32), &t(&[2, 0, 3], DType::F32), &opts).unwrap();
    assert_eq!(z.to_vec_f64().unwrap(), cv.iter().map(|v| -2.0 * v).collect::<Vec<_>>());
}

/// One batched case: `a: batch ++ [m, k]`, `b: batch ++ [k, n]` or `[k, n]`.
fn batched_case(batch: &[usize], (m, n, k): (usize, usize, usize), b_shared: bool, dt: DType, od: DType, with_c: bool, seed: u64) {
    let nb: usize = batch.iter().product();
    let (a, av) = rand(&[batch, &[m, k]].concat(), dt, seed);
    let bshape = if b_shared { vec![k, n] } else { [batch, &[k, n]].concat() };
    let (b, bv) = rand(&bshape, dt, seed + 1);
    let oshape = [batch, &[m, n]].concat();
    let (c, cv) = rand(&oshape, od, seed + 2);
    let (alpha, beta) = if with_c { (1.25f32, 0.5f32) } else { (1.0, 0.0) };
    let opts = GemmOptions { alpha, beta, c: with_c.then_some(&c), out_dtype: Some(od), ..Default::default() };
    let got = gemm_batched_ex(&a, &b, &opts).unwrap();
    let want = reference(&av, &bv, with_c.then_some(&cv[..]), nb, m, k, n, b_shared, alpha as f64, beta as f64);
    check(&format!("batched {batch:?} {m}x{n}x{k} shared={b_shared} {dt}->{od} c={with_c}"), &got, &oshape, od, &want);
}

#[test]
fn gemm_batched_against_float64() {
    for dt in common::DTYPES {
        for (s, &mnk) in [(17, 33, 65), (7, 5, 20)].iter().enumerate() {
            let seed = 1000 + 100 * s as u64;
            for batch in [&[3][..], &[2, 3][..]] {
                for b_shared in [false, true] {
                    batched_case(batch, mnk, b_shared, dt, dt, false, seed);
                    batched_case(batch, mnk, b_shared, dt, dt, true, seed + 10);
                }
            }
        }
    }
    // other output dtypes, and a batch of one
    batched_case(&[3], (17, 33, 65), false, DType::BF16, DType::F32, true, 7);
    batched_case(&[2, 2], (9, 16, 40), true, DType::F16, DType::BF16, true, 8);
    batched_case(&[1], (5, 6, 7), false, DType::F32, DType::F16, false, 9);
    // the plain form
    let (a, av) = rand(&[3, 5, 7], DType::BF16, 11);
    let (b, bv) = rand(&[3, 7, 4], DType::BF16, 12);
    check("gemm_batched", &gemm_batched(&a, &b).unwrap(), &[3, 5, 4], DType::BF16, &reference(&av, &bv, None, 3, 5, 7, 4, false, 1.0, 0.0));
    // kernels into poisoned outputs: the same bits as the API
    let mut out = common::poisoned(&[3, 5, 4], DType::BF16, &cpu());
    kfuse::ops::kernels::gemm_batched_scaled(&a, &b, &mut out, 1.0).unwrap();
    assert_eq!(out.to_vec_f64().unwrap(), gemm_batched(&a, &b).unwrap().to_vec_f64().unwrap());
    let (c, _) = rand(&[3, 5, 4], DType::F32, 13);
    let mut out = common::poisoned(&[3, 5, 4], DType::F32, &cpu());
    kfuse::ops::kernels::gemm_batched_axpby(&a, &b, &c, &mut out, 2.0, -1.0).unwrap();
    let opts = GemmOptions { alpha: 2.0, beta: -1.0, c: Some(&c), out_dtype: Some(DType::F32), ..Default::default() };
    assert_eq!(out.to_vec_f64().unwrap(), gemm_batched_ex(&a, &b, &opts).unwrap().to_vec_f64().unwrap());
    // no batch dimensions: the 2-D product
    let (a, av) = rand(&[6, 9], DType::F32, 14);
    let (b, bv) = rand(&[9, 4], DType::F32, 15);
    check("rank-2 gemm_batched", &gemm_batched(&a, &b).unwrap(), &[6, 4], DType::F32, &reference(&av, &bv, None, 1, 6, 9, 4, false, 1.0, 0.0));
}

#[test]
fn gemm_batched_reads_strided_batches() {
    let (m, n, k) = (11, 13, 21);
    let dt = DType::BF16;
    let vals = |t: &Tensor| t.to_vec_f64().unwrap();
    // rank 3, read as it lies: transposed matrices, and a column slice
    let (at, _) = rand(&[3, k, m], dt, 21);
    let (wide, _) = rand(&[3, k, n + 3], dt, 22);
    let (a, b) = (at.t(), wide.narrow(2, 1, n).unwrap());
    let got = gemm_batched(&a, &b).unwrap();
    check("rank-3 strided", &got, &[3, m, n], dt, &reference(&vals(&a), &vals(&b), None, 3, m, k, n, false, 1.0, 0.0));
    // rank 4, packed batches of transposed matrices (a reshape of the transpose)
    let (at, _) = rand(&[2, 3, k, m], dt, 23);
    let (b, bv) = rand(&[2, 3, k, n], dt, 24);
    let a = at.t();
    let got = gemm_batched(&a, &b).unwrap();
    check("rank-4 transposed", &got, &[2, 3, m, n], dt, &reference(&vals(&a), &bv, None, 6, m, k, n, false, 1.0, 0.0));
    // rank 4, batch dimensions swapped (no reshape merges them: a packed copy)
    let (ap, _) = rand(&[3, 2, m, k], dt, 25);
    let a = ap.permute(&[1, 0, 2, 3]).unwrap();
    assert!(!a.is_contiguous() && !a.t().is_contiguous());
    let (c4, _) = rand(&[2, 3, n, m], DType::F32, 26);
    let c = c4.t();
    let opts = GemmOptions { alpha: -1.0, beta: 0.25, c: Some(&c), out_dtype: Some(DType::F32), ..Default::default() };
    let got = gemm_batched_ex(&a, &b, &opts).unwrap();
    check("rank-4 permuted", &got, &[2, 3, m, n], DType::F32, &reference(&vals(&a), &bv, Some(&vals(&c)), 6, m, k, n, false, -1.0, 0.25));
    // a shared `b` with strided `a` and `c`: `a` and `c` packed, then one tall product
    let (at, _) = rand(&[4, k, m], dt, 27);
    let (bs, bsv) = rand(&[k, n], dt, 28);
    let (ct, _) = rand(&[4, n, m], dt, 29);
    let (a, c) = (at.t(), ct.t());
    let opts = GemmOptions { alpha: 0.5, beta: 1.0, c: Some(&c), out_dtype: None, ..Default::default() };
    let got = gemm_batched_ex(&a, &bs, &opts).unwrap();
    check("shared b, strided a and c", &got, &[4, m, n], dt, &reference(&vals(&a), &bsv, Some(&vals(&c)), 4, m, k, n, true, 0.5, 1.0));
    // a shared `b` with a rank-4 transposed `a`
    let (at, _) = rand(&[2, 2, k, m], dt, 30);
    let a = at.t();
    let got = gemm_batched(&a, &bs).unwrap();
    check("shared b, rank-4 transposed a", &got, &[2, 2, m, n], dt, &reference(&vals(&a), &bsv, None, 4, m, k, n, true, 1.0, 0.0));
}

#[test]
fn copy_reads_rank_three_strides() {
    let (x, _) = rand(&[3, 17, 40], DType::F16, 31);
    let v = x.t();
    let c = kfuse::ops::copy(&v).unwrap();
    assert!(c.is_contiguous());
    assert_eq!((c.shape(), c.to_vec_f64().unwrap()), (&[3, 40, 17][..], v.to_vec_f64().unwrap()));
    let mut out = common::poisoned(&[3, 40, 17], DType::F16, &cpu());
    kfuse::ops::kernels::copy3d(&v, &mut out).unwrap();
    assert_eq!(out.to_vec_f64().unwrap(), v.to_vec_f64().unwrap());
}

#[test]
fn errors_are_clear() {
    let t = |shape: &[usize], dt| Tensor::full(shape, 1.0, dt, &cpu()).unwrap();
    let f = DType::F32;
    let is = |e: &Error, what: &str, needle: &str| {
        let ok = match what {
            "shape" => matches!(e, Error::ShapeMismatch(_)),
            "dtype" => matches!(e, Error::DTypeMismatch(_)),
            _ => matches!(e, Error::InvalidArgument(_)),
        };
        assert!(ok && e.to_string().contains(needle), "expected a {what} error mentioning {needle:?}, got: {e}");
    };
    // batch dimensions that differ
    let e = gemm_batched(&t(&[2, 4, 5], f), &t(&[3, 5, 6], f)).unwrap_err();
    is(&e, "shape", "batch dimensions");
    let e = gemm_batched(&t(&[2, 3, 4, 5], f), &t(&[3, 2, 5, 6], f)).unwrap_err();
    is(&e, "shape", "batch dimensions");
    // `b` of another rank than `a` (other than 2), and a broadcast `a`
    let e = gemm_batched(&t(&[2, 3, 4, 5], f), &t(&[3, 5, 6], f)).unwrap_err();
    is(&e, "invalid", "[K, N]");
    let e = gemm_batched(&t(&[4, 5], f), &t(&[3, 5, 6], f)).unwrap_err();
    is(&e, "invalid", "[K, N]");
    let e = gemm_batched(&t(&[5], f), &t(&[5, 6], f)).unwrap_err();
    is(&e, "invalid", "rank ≥ 2");
    // inner dimensions
    let e = gemm_batched(&t(&[2, 4, 5], f), &t(&[2, 6, 6], f)).unwrap_err();
    is(&e, "shape", "columns of `a`");
    let e = gemm_ex(&t(&[4, 5], f), &t(&[6, 6], f), &GemmOptions::default()).unwrap_err();
    is(&e, "shape", "columns of `a`");
    // `c`: dtype (checked even when beta = 0) and shape
    let c16 = t(&[4, 6], DType::F16);
    let e = gemm_ex(&t(&[4, 5], f), &t(&[5, 6], f), &GemmOptions { beta: 1.0, c: Some(&c16), ..Default::default() }).unwrap_err();
    is(&e, "dtype", "`c`");
    let e = gemm_ex(&t(&[4, 5], f), &t(&[5, 6], f), &GemmOptions { c: Some(&c16), ..Default::default() }).unwrap_err();
    is(&e, "dtype", "`c`");
    let opts = GemmOptions { beta: 1.0, c: Some(&c16), out_dtype: Some(DType::F16), ..Default::default() };
    assert!(gemm_ex(&t(&[4, 5], f), &t(&[5, 6], f), &opts).is_ok(), "`c` of the output dtype");
    let c = t(&[6, 4], f);
    let e = gemm_ex(&t(&[4, 5], f), &t(&[5, 6], f), &GemmOptions { beta: 1.0, c: Some(&c), ..Default::default() }).unwrap_err();
    is(&e, "shape", "`c`");
    let c = t(&[4, 6], f);
    let e = gemm_batched_ex(&t(&[2, 4, 5], f), &t(&[5, 6], f), &GemmOptions { beta: 1.0, c: Some(&c), ..Default::default() }).unwrap_err();
    is(&e, "shape", "`c`");
    // dtypes of the operands and the output
    let e = gemm_ex(&t(&[4, 5], f), &t(&[5, 6], DType::BF16), &GemmOptions::default()).unwrap_err();
    is(&e, "dtype", "`b`");
    let e = gemm_batched(&t(&[2, 4, 5], DType::F16), &t(&[2, 5, 6], f)).unwrap_err();
    is(&e, "dtype", "`b`");
    let e = gemm_ex(&t(&[4, 5], f), &t(&[5, 6], f), &GemmOptions { out_dtype: Some(DType::I64), ..Default::default() }).unwrap_err();
    is(&e, "invalid", "output dtype");
    let i = Tensor::full(&[4, 5], 1.0, DType::I64, &cpu()).unwrap();
    let e = gemm_ex(&i, &t(&[5, 6], f), &GemmOptions::default()).unwrap_err();
    is(&e, "invalid", "i64");
    let e = gemm_batched(&i.unsqueeze(0).unwrap(), &t(&[5, 6], f)).unwrap_err();
    is(&e, "invalid", "i64");
    // ranks of gemm_ex
    let e = gemm_ex(&t(&[2, 4, 5], f), &t(&[5, 6], f), &GemmOptions::default()).unwrap_err();
    is(&e, "invalid", "gemm_batched_ex");
}

// ---------------------------------------------------------------------------------------
// What the compiler emits (sm_90a, no GPU needed).

/// The snapshot spec with the shape symbols (in order of first appearance) set.
fn spec_with(def: &kfuse::ir::KernelDef, shape: &[u32]) -> kfuse::codegen::Spec {
    let mut s = common::snapshot_spec(def);
    s.shape_pow2 = shape.iter().map(|v| v.next_power_of_two()).collect();
    s
}

#[test]
fn sm90a_gemm_ex_kernels_take_the_matrix_path() {
    use kfuse::ops::kernels as k;
    let (bf, f32_) = (DType::BF16, DType::F32);
    // 2-D, 16-bit output: TMA loads, wgmma, the epilogue leaves by a TMA store
    let e = compile(&(k::gemm_scaled::DEF.build)(&[bf, bf]).unwrap(), &spec_with(&k::gemm_scaled::DEF, &[4096, 4096, 4096]), &Target::sm90a()).unwrap();
    assert!(e.source.contains("wgmma.mma_async") && e.plan.to_string().contains("TMA bulk stores"), "{}", e.plan);
    assert!(e.source.contains("cp.async.bulk.tensor.2d.shared::cluster.global"), "operands arrive by 2-D TMA");
    // f32 output: stored from the accumulator registers
    let e = compile(&(k::gemm_scaled::DEF.build)(&[bf, f32_]).unwrap(), &spec_with(&k::gemm_scaled::DEF, &[4096, 4096, 4096]), &Target::sm90a()).unwrap();
    assert!(e.source.contains("wgmma.mma_async") && !e.source.contains("cp.async.bulk.tensor.2d.global.shared::cta"), "{}", e.plan);
    // batched: rank-3 TMA loads (the walk over the batch: `gemm_codegen.rs`)
    let def = &k::gemm_batched_scaled::DEF;
    let e = compile(&(def.build)(&[bf, bf]).unwrap(), &spec_with(def, &[8, 512, 512, 512]), &Target::sm90a()).unwrap();
    assert!(e.plan.to_string().contains("a matrix loop on the tensor cores") && e.source.contains("kf_tma_load_3d("), "{}", e.plan);
}

/// NVRTC + ptxas for the kernels without `c`, in the shape classes of the tile
/// heuristic: they must compile without spills.
#[test]
fn gemm_ex_kernels_compile_without_spills() {
    use kfuse::ops::kernels as k;
    let mut failures = Vec::new();
    for (m, n, kk) in [(4096, 4096, 4096), (127, 4096, 4096), (1024, 2048, 1024)] {
        for (dt, od) in [(DType::BF16, DType::BF16), (DType::F16, DType::F32), (DType::BF16, DType::F16)] {
            for (name, def, shape) in
                [("gemm_scaled", &k::gemm_scaled::DEF, vec![m, kk, n]), ("gemm_batched_scaled", &k::gemm_batched_scaled::DEF, vec![4, m, kk, n])]
            {
                let e = compile(&(def.build)(&[dt, od]).unwrap(), &spec_with(def, &shape), &Target::sm90a()).unwrap();
                match common::assemble(&e.source, &e.arch, &e.options, &format!("{name}_{dt}_{od}_{m}_{n}")) {
                    Ok((_, 0)) => {}
                    Ok((regs, spill)) => failures.push(format!("{name} {dt}->{od} M{m} N{n}: {spill} bytes of spills ({regs} registers)")),
                    Err(err) => failures.push(format!("{name} {dt}->{od} M{m} N{n}: {err}")),
                }
            }
        }
    }
    let e = compile(&(k::copy3d::DEF.build)(&[DType::BF16]).unwrap(), &spec_with(&k::copy3d::DEF, &[8, 4096, 4096]), &Target::sm90a()).unwrap();
    if let Err(err) = common::assemble(&e.source, &e.arch, &e.options, "copy3d_bf16") {
        failures.push(format!("copy3d: {err}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The kernels with `c` on sm_90a. Their epilogue loads a `[BM, BN]` tile of `c` and
/// meets the accumulator: `assign_layouts` folds the conversion into the load (through
/// `* beta`), so `c` arrives in the accumulator's registers, and `choose_tiles` keeps
/// such tiles at most 128 wide (256-wide ones spilled with both tiles in registers).
#[test]
fn gemm_axpby_kernels_compile_without_spills() {
    use kfuse::ops::kernels as k;
    let mut failures = Vec::new();
    for (m, n, kk) in [(4096, 4096, 4096), (127, 4096, 4096), (1024, 2048, 1024)] {
        for (dt, od) in [(DType::BF16, DType::BF16), (DType::F16, DType::F32)] {
            for (name, def, shape) in
                [("gemm_axpby", &k::gemm_axpby::DEF, vec![m, kk, n]), ("gemm_batched_axpby", &k::gemm_batched_axpby::DEF, vec![4, m, kk, n])]
            {
                match compile(&(def.build)(&[dt, od]).unwrap(), &spec_with(def, &shape), &Target::sm90a()) {
                    Err(err) => failures.push(format!("{name} {dt}->{od} M{m} N{n}: {err}")),
                    Ok(e) => match common::assemble(&e.source, &e.arch, &e.options, &format!("{name}_{dt}_{od}_{m}_{n}")) {
                        Ok((_, 0)) => {}
                        Ok((regs, spill)) => failures.push(format!("{name} {dt}->{od} M{m} N{n}: {spill} bytes of spills ({regs} registers)")),
                        Err(err) => failures.push(format!("{name} {dt}->{od} M{m} N{n}: {err}")),
                    },
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
