//! f32 products that allow TF32 on the CPU interpreter against float64: a user kernel
//! with `dot_tf32`, `kfuse::ops::gemm_ex` and `gemm_batched_ex` with
//! `GemmOptions::tf32`. The interpreter reads the operands as TF32 (the low 13 mantissa
//! bits cleared, as the tensor cores read f32 data), so its result matches a float64
//! product of the truncated operands to f32 accuracy, and the float64 product of the
//! operands themselves to TF32 accuracy (~1e-3); without `tf32` the product stays
//! exact. Inputs are random and never zero; raw outputs are poisoned with NaN first.

mod common;

use kfuse::ops::{gemm_batched_ex, gemm_ex, GemmOptions};
use kfuse::prelude::*;
use kfuse::{Backend, DType};

/// The bound on ‖out − ref‖/‖ref‖ of a TF32 product against the exact one: each operand
/// loses up to 2^-10 of itself (truncation), so a product up to ~2^-9.
const TF32_TOL: f64 = 5e-3;

/// A user kernel: the f32 product read as TF32, plus a bias.
#[kfuse]
pub fn gemm_tf32_bias(a: Tensor<f32, (M, K)>, b: Tensor<f32, (K, N)>, bias: Tensor<f32, (N,)>, out: &mut Tensor<f32, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot_tf32(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    out.block([i * BM, j * BN], [BM, BN]).store(acc + bias.block([j * BN], [BN]).load());
}

/// `x` read as TF32 (the low 13 bits of its f32 mantissa cleared).
fn tf32(x: f64) -> f64 {
    f32::from_bits((x as f32).to_bits() & !0x1fff) as f64
}

/// `alpha · a·b + beta · c` in f64 (row-major values), operands mapped by `f` first.
#[allow(clippy::too_many_arguments)]
fn reference(a: &[f64], b: &[f64], c: Option<&[f64]>, m: usize, k: usize, n: usize, alpha: f64, beta: f64, f: fn(f64) -> f64) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k).map(|q| f(a[i * k + q]) * f(b[q * n + j])).sum();
            out[i * n + j] = alpha * s + c.map_or(0.0, |c| beta * c[i * n + j]);
        }
    }
    out
}

fn exact(x: f64) -> f64 {
    x
}

#[test]
fn tf32_truncation_is_what_the_ir_says() {
    assert_eq!(tf32(1.0), 1.0);
    // 1 + 2^-10 survives, 1 + 2^-11 does not (10 mantissa bits)
    assert_eq!(tf32(1.0 + 2f64.powi(-10)), 1.0 + 2f64.powi(-10));
    assert_eq!(tf32(1.0 + 2f64.powi(-11)), 1.0);
    assert_eq!(tf32(-3.999), -3.998046875);
    for x in [0.1, -7.3, 1e-30, 3e38] {
        assert_eq!(kfuse::ir::DotPrecision::Tf32.operand(x), tf32(x));
        assert_eq!(kfuse::ir::DotPrecision::Exact.operand(x), x);
    }
    assert!(kfuse::ir::DotPrecision::Tf32.operand(f64::NAN).is_nan());
    assert_eq!(kfuse::ir::DotPrecision::Tf32.operand(f64::INFINITY), f64::INFINITY);
}

#[test]
fn user_dot_tf32_kernel_on_the_interpreter() {
    let dev = Device::cpu();
    for (s, &(m, n, k)) in [(1, 1, 1), (17, 33, 65), (40, 24, 300)].iter().enumerate() {
        let seed = 10 * s as u64;
        let (a, av) = common::random_tensor(&[m, k], DType::F32, seed, 0.05, &dev);
        let (b, bv) = common::random_tensor(&[k, n], DType::F32, seed + 1, 0.05, &dev);
        let (bias, biasv) = common::random_tensor(&[n], DType::F32, seed + 2, 0.05, &dev);
        let mut out = common::poisoned(&[m, n], DType::F32, &dev);
        let l = gemm_tf32_bias(&a, &b, &bias, &mut out).unwrap();
        assert!(matches!(l.backend, Backend::Interpreter), "{:?}", l.backend);
        let got = out.to_vec_f64().unwrap();
        let add_bias = |mut v: Vec<f64>| {
            for (x, i) in v.iter_mut().zip(0..) {
                *x += biasv[i % n];
            }
            v
        };
        let truncated = add_bias(reference(&av, &bv, None, m, k, n, 1.0, 0.0, tf32));
        let exact_ref = add_bias(reference(&av, &bv, None, m, k, n, 1.0, 0.0, exact));
        let e_trunc = common::rel_err(&got, &truncated);
        let e_exact = common::rel_err(&got, &exact_ref);
        assert!(e_trunc < 1e-6, "{m}x{n}x{k}: {e_trunc:.3e} against the TF32 operands' product");
        assert!(e_exact < TF32_TOL, "{m}x{n}x{k}: {e_exact:.3e} against the exact product");
        if k > 1 {
            // the rounding is real: the exact product is farther away than f32 accuracy
            assert!(e_exact > 1e-5, "{m}x{n}x{k}: {e_exact:.3e}: no TF32 rounding seen");
        }
    }
}

#[test]
fn gemm_ex_tf32_on_the_interpreter() {
    let dev = Device::cpu();
    let (m, n, k) = (37, 29, 130);
    let (a, av) = common::random_tensor(&[m, k], DType::F32, 1, 0.05, &dev);
    // `b` a transposed view: any strides on the interpreter
    let (bt, btv) = common::random_tensor(&[n, k], DType::F32, 2, 0.05, &dev);
    let b = bt.t();
    let bv: Vec<f64> = (0..k * n).map(|x| btv[(x % n) * k + x / n]).collect();
    let (c, cv) = common::random_tensor(&[m, n], DType::F32, 3, 0.05, &dev);
    // plain, and alpha/beta/c, and a bf16 output
    // (options, c's values, alpha, beta, output dtype)
    type Case<'a> = (GemmOptions<'a>, Option<&'a [f64]>, f64, f64, DType);
    let cases: Vec<Case> = vec![
        (GemmOptions { tf32: true, ..Default::default() }, None, 1.0, 0.0, DType::F32),
        (GemmOptions { tf32: true, alpha: 0.5, beta: -1.5, c: Some(&c), ..Default::default() }, Some(&cv), 0.5, -1.5, DType::F32),
        (GemmOptions { tf32: true, out_dtype: Some(DType::BF16), ..Default::default() }, None, 1.0, 0.0, DType::BF16),
    ];
    for (opts, cref, alpha, beta, od) in cases {
        let got = gemm_ex(&a, &b, &opts).unwrap();
        assert_eq!(got.dtype(), od);
        let got = got.to_vec_f64().unwrap();
        let trunc: Vec<f64> = reference(&av, &bv, cref, m, k, n, alpha, beta, tf32).into_iter().map(|x| od.round(x)).collect();
        let e = common::rel_err(&got, &trunc);
        let bound = if od == DType::F32 { 1e-6 } else { 8e-3 };
        assert!(e < bound, "{od} alpha {alpha}: {e:.3e} against the TF32 operands' product");
        let e = common::rel_err(&got, &reference(&av, &bv, cref, m, k, n, alpha, beta, exact));
        assert!(e < TF32_TOL, "{od} alpha {alpha}: {e:.3e} against the exact product");
    }
    // without the option: exact
    let got = gemm_ex(&a, &b, &GemmOptions::default()).unwrap().to_vec_f64().unwrap();
    let e = common::rel_err(&got, &reference(&av, &bv, None, m, k, n, 1.0, 0.0, exact));
    assert!(e < 1e-6, "exact: {e:.3e}");
}

#[test]
fn gemm_batched_ex_tf32_on_the_interpreter() {
    let dev = Device::cpu();
    let (nb, m, n, k) = (3, 9, 21, 70);
    let (x, xv) = common::random_tensor(&[nb, m, k], DType::F32, 4, 0.05, &dev);
    let (w, wv) = common::random_tensor(&[nb, k, n], DType::F32, 5, 0.05, &dev);
    let got = gemm_batched_ex(&x, &w, &GemmOptions { tf32: true, alpha: 2.0, ..Default::default() }).unwrap().to_vec_f64().unwrap();
    let mut want = Vec::new();
    for z in 0..nb {
        want.extend(reference(&xv[z * m * k..(z + 1) * m * k], &wv[z * k * n..(z + 1) * k * n], None, m, k, n, 2.0, 0.0, tf32));
    }
    let e = common::rel_err(&got, &want);
    assert!(e < 1e-6, "batched: {e:.3e} against the TF32 operands' product");
    // a shared `b` (one tall product)
    let (w2, w2v) = common::random_tensor(&[k, n], DType::F32, 6, 0.05, &dev);
    let got = gemm_batched_ex(&x, &w2, &GemmOptions { tf32: true, ..Default::default() }).unwrap().to_vec_f64().unwrap();
    let want = reference(&xv, &w2v, None, nb * m, k, n, 1.0, 0.0, tf32);
    let e = common::rel_err(&got, &want);
    assert!(e < 1e-6, "shared b: {e:.3e}");
}

#[test]
fn tf32_leaves_16_bit_operands_alone() {
    let dev = Device::cpu();
    let (m, n, k) = (12, 10, 40);
    let (a, av) = common::random_tensor(&[m, k], DType::BF16, 7, 0.05, &dev);
    let (b, bv) = common::random_tensor(&[k, n], DType::BF16, 8, 0.05, &dev);
    let with = gemm_ex(&a, &b, &GemmOptions { tf32: true, out_dtype: Some(DType::F32), ..Default::default() }).unwrap().to_vec_f64().unwrap();
    let e = common::rel_err(&with, &reference(&av, &bv, None, m, k, n, 1.0, 0.0, exact));
    assert!(e < 1e-6, "bf16 operands are exact in f32: {e:.3e}");
}
