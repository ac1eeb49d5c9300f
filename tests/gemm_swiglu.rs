//! The SwiGLU projection pair `silu(x · wg) ⊙ (x · wu)` on the CPU interpreter against
//! float64: `kfuse::ops::swiglu_gemm` (one kernel, two accumulators in one loop) for
//! f32, f16 and bf16 at odd sizes, transposed and sliced operands, the raw kernel
//! launched into a NaN-poisoned output, empty and `K = 0` inputs, and its errors; and a
//! user kernel of three products in one loop (`common::gemm::three_products`).
//! Inputs are random and never zero.

mod common;

use kfuse::prelude::*;
use kfuse::{DType, Error};

fn cpu() -> Device {
    Device::cpu()
}

use common::gemm::product_tol as tol;

/// `silu(x·wg) ⊙ (x·wu)` in f64 (row-major `[m, k]`, `[k, n]` values).
fn reference(x: &[f64], wg: &[f64], wu: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut g, mut u) = (0.0, 0.0);
            for q in 0..k {
                g += x[i * k + q] * wg[q * n + j];
                u += x[i * k + q] * wu[q * n + j];
            }
            out[i * n + j] = g / (1.0 + (-g).exp()) * u;
        }
    }
    out
}

#[test]
fn swiglu_gemm_against_float64() {
    for dt in common::DTYPES {
        for (s, &(m, n, k)) in [(1, 1, 1), (17, 33, 65), (40, 24, 130), (7, 130, 5)].iter().enumerate() {
            let seed = 500 + 10 * s as u64;
            let (x, xv) = common::random_tensor(&[m, k], dt, seed, 0.05, &cpu());
            let (wg, gv) = common::random_tensor(&[k, n], dt, seed + 1, 0.05, &cpu());
            let (wu, uv) = common::random_tensor(&[k, n], dt, seed + 2, 0.05, &cpu());
            let want = reference(&xv, &gv, &uv, m, k, n);
            let got = kfuse::ops::swiglu_gemm(&x, &wg, &wu).unwrap();
            assert_eq!((got.shape(), got.dtype()), (&[m, n][..], dt));
            let e = common::rel_err(&got.to_vec_f64().unwrap(), &want);
            assert!(e <= tol(dt), "swiglu_gemm {m}x{n}x{k} {dt}: relative error {e:.3e}");
            // the kernel itself, into a poisoned output: the same bits
            let mut out = common::poisoned(&[m, n], dt, &cpu());
            let l = kfuse::ops::kernels::swiglu_gemm(&x, &wg, &wu, &mut out).unwrap();
            assert_eq!(l.backend, kfuse::Backend::Interpreter);
            assert_eq!(out.to_vec_f64().unwrap(), got.to_vec_f64().unwrap(), "{m}x{n}x{k} {dt}");
        }
    }
}

#[test]
fn swiglu_gemm_reads_strided_operands() {
    // x a column slice; wg the transpose of an [N, K] tensor; wu a row-major [K, N]
    let (m, n, k) = (21, 19, 45);
    let dt = DType::BF16;
    let (wide, wv) = common::random_tensor(&[m, k + 3], dt, 61, 0.05, &cpu());
    let x = wide.narrow(1, 3, k).unwrap();
    let xv: Vec<f64> = (0..m * k).map(|p| wv[(p / k) * (k + 3) + 3 + p % k]).collect();
    let (wgt, wgtv) = common::random_tensor(&[n, k], dt, 62, 0.05, &cpu());
    let wg = wgt.t();
    let gv: Vec<f64> = (0..k * n).map(|p| wgtv[(p % n) * k + p / n]).collect();
    let (wu, uv) = common::random_tensor(&[k, n], dt, 63, 0.05, &cpu());
    let got = kfuse::ops::swiglu_gemm(&x, &wg, &wu).unwrap();
    let e = common::rel_err(&got.to_vec_f64().unwrap(), &reference(&xv, &gv, &uv, m, k, n));
    assert!(e <= tol(dt), "relative error {e:.3e}");
}

#[test]
fn swiglu_gemm_edge_sizes_and_errors() {
    let t = |shape: &[usize], dt| Tensor::full(shape, 0.5, dt, &cpu()).unwrap();
    let f = DType::F32;
    assert_eq!(kfuse::ops::swiglu_gemm(&t(&[0, 4], f), &t(&[4, 3], f), &t(&[4, 3], f)).unwrap().shape(), &[0, 3]);
    assert_eq!(kfuse::ops::swiglu_gemm(&t(&[2, 4], f), &t(&[4, 0], f), &t(&[4, 0], f)).unwrap().shape(), &[2, 0]);
    // K = 0: silu(0) · 0
    let z = kfuse::ops::swiglu_gemm(&t(&[2, 0], DType::BF16), &t(&[0, 3], DType::BF16), &t(&[0, 3], DType::BF16)).unwrap();
    assert_eq!((z.shape(), z.dtype()), (&[2, 3][..], DType::BF16));
    assert_eq!(z.to_vec_f64().unwrap(), vec![0.0; 6]);
    // mismatches
    let e = kfuse::ops::swiglu_gemm(&t(&[2, 4], f), &t(&[5, 3], f), &t(&[5, 3], f)).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)), "{e}");
    let e = kfuse::ops::swiglu_gemm(&t(&[2, 4], f), &t(&[4, 3], f), &t(&[4, 2], f)).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)) && e.to_string().contains("`wu`"), "{e}");
    let e = kfuse::ops::swiglu_gemm(&t(&[2, 4], f), &t(&[4, 3], f), &t(&[4, 3], DType::F16)).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)) && e.to_string().contains("`wu`"), "{e}");
    let e = kfuse::ops::swiglu_gemm(&t(&[2, 4, 1], f), &t(&[4, 3], f), &t(&[4, 3], f)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("rank 2"), "{e}");
    let i = Tensor::zeros(&[2, 4], DType::I64, &cpu()).unwrap();
    let e = kfuse::ops::swiglu_gemm(&i, &t(&[4, 3], f), &t(&[4, 3], f)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

#[test]
fn three_products_in_one_loop() {
    let (m, n, k) = (19, 27, 70);
    let dt = DType::F32;
    let r = |shape: &[usize], seed| common::random_tensor(shape, dt, seed, 0.05, &cpu());
    let ((a1, a1v), (b1, b1v), (a2, a2v), (b2, b2v), (b3, b3v)) = (r(&[m, k], 1), r(&[k, n], 2), r(&[m, k], 3), r(&[k, n], 4), r(&[k, n], 5));
    let mut out = common::poisoned(&[m, n], dt, &cpu());
    common::gemm::three_products(&a1, &b1, &a2, &b2, &b3, &mut out).unwrap();
    let mm = |a: &[f64], b: &[f64]| -> Vec<f64> { (0..m * n).map(|x| (0..k).map(|q| a[(x / n) * k + q] * b[q * n + x % n]).sum()).collect() };
    let (p, q, s) = (mm(&a1v, &b1v), mm(&a2v, &b2v), mm(&a2v, &b3v));
    let want: Vec<f64> = (0..m * n).map(|x| p[x] + q[x] * s[x]).collect();
    let e = common::rel_err(&out.to_vec_f64().unwrap(), &want);
    assert!(e <= 1e-5, "relative error {e:.3e}");
}
