//! Matrix products on the CPU interpreter against float64: `kfuse::ops::gemm`, and user
//! kernels with loops (an epilogue after the loop, two accumulators in one loop, a
//! reduction carried across column blocks). The interpreter picks the tile sizes
//! (`Options::default_tile`, 16), so the shapes below cover partial tiles of M, N and K.

mod common;

#[path = "kernels/user_gemms.rs"]
mod kernels_user_gemms;
use kernels_user_gemms::*;

use kfuse::prelude::*;
use kfuse::{DType, Error};

fn cpu() -> Device {
    Device::cpu()
}

use common::gemm::product_tol as tol;

/// `a[m×k] · b[k×n]` in f64 (row-major).
fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|q| a[i * k + q] * b[q * n + j]).sum();
        }
    }
    c
}

fn check(what: &str, dt: DType, got: &[f64], want: &[f64], bound: f64) {
    let e = common::rel_err(got, want);
    assert!(e <= bound, "{what} {dt}: relative error {e:.3e} > {bound:.1e}");
}

/// (M, N, K): odd sizes, partial tiles everywhere, and K over several tiles.
const SHAPES: [(usize, usize, usize); 6] = [(1, 1, 1), (17, 33, 65), (7, 5, 130), (17, 65, 33), (7, 130, 5), (40, 3, 17)];

#[test]
fn gemm_against_float64() {
    for dt in common::DTYPES {
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let seed = 100 * s as u64;
            let (a, av) = common::random_tensor(&[m, k], dt, seed, 0.05, &cpu());
            let (b, bv) = common::random_tensor(&[k, n], dt, seed + 1, 0.05, &cpu());
            let want = matmul(&av, &bv, m, k, n);
            // the friendly API allocates the output
            let c = kfuse::ops::gemm(&a, &b).unwrap();
            assert_eq!((c.shape(), c.dtype()), (&[m, n][..], dt));
            check(&format!("gemm {m}x{n}x{k}"), dt, &c.to_vec_f64().unwrap(), &want, tol(dt));
            // the kernel itself, into a poisoned output
            let mut out = common::poisoned(&[m, n], dt, &cpu());
            let l = kfuse::ops::kernels::gemm(&a, &b, &mut out).unwrap();
            assert_eq!(l.backend, kfuse::Backend::Interpreter);
            assert_eq!(out.to_vec_f64().unwrap(), c.to_vec_f64().unwrap(), "gemm {m}x{n}x{k} {dt}: same bits");
        }
    }
}

#[test]
fn gemm_reads_strided_inputs() {
    // aᵀ stored as [K, M] and viewed transposed; b a column slice of a wider matrix
    let (m, n, k) = (19, 23, 37);
    let (at, atv) = common::random_tensor(&[k, m], DType::F32, 7, 0.05, &cpu());
    let (wide, wv) = common::random_tensor(&[k, n + 5], DType::F32, 8, 0.05, &cpu());
    let a = at.t();
    let b = wide.narrow(1, 2, n).unwrap();
    assert!(!a.is_contiguous() && !b.is_contiguous());
    let av: Vec<f64> = (0..m * k).map(|x| atv[(x % k) * m + x / k]).collect();
    let bv: Vec<f64> = (0..k * n).map(|x| wv[(x / n) * (n + 5) + 2 + x % n]).collect();
    let c = kfuse::ops::gemm(&a, &b).unwrap();
    check("strided gemm", DType::F32, &c.to_vec_f64().unwrap(), &matmul(&av, &bv, m, k, n), 1e-5);
}

#[test]
fn gemm_edge_sizes_and_errors() {
    let t = |shape: &[usize], dt| Tensor::full(shape, 1.0, dt, &cpu()).unwrap();
    // M = 0 and N = 0: empty; K = 0: zeros
    assert_eq!(kfuse::ops::gemm(&t(&[0, 4], DType::F32), &t(&[4, 3], DType::F32)).unwrap().shape(), &[0, 3]);
    assert_eq!(kfuse::ops::gemm(&t(&[2, 4], DType::F32), &t(&[4, 0], DType::F32)).unwrap().shape(), &[2, 0]);
    let z = kfuse::ops::gemm(&t(&[2, 0], DType::BF16), &t(&[0, 3], DType::BF16)).unwrap();
    assert_eq!((z.shape(), z.dtype()), (&[2, 3][..], DType::BF16));
    assert_eq!(z.to_vec_f64().unwrap(), vec![0.0; 6]);
    // mismatches
    let e = kfuse::ops::gemm(&t(&[2, 4], DType::F32), &t(&[5, 3], DType::F32)).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)), "{e}");
    let e = kfuse::ops::gemm(&t(&[2, 4], DType::F32), &t(&[4, 3], DType::F16)).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)), "{e}");
    let e = kfuse::ops::gemm(&t(&[2, 4, 1], DType::F32), &t(&[4, 3], DType::F32)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("rank 2"), "{e}");
    let e = kfuse::ops::gemm(&t(&[4], DType::F32), &t(&[4, 3], DType::F32)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

// ---------------------------------------------------------------------------------------
// User kernels with loops.

#[test]
fn gemm_with_a_bias_relu_epilogue() {
    for dt in common::DTYPES {
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let seed = 1000 + 10 * s as u64;
            let (a, av) = common::random_tensor(&[m, k], dt, seed, 0.05, &cpu());
            let (b, bv) = common::random_tensor(&[k, n], dt, seed + 1, 0.05, &cpu());
            let (bias, biasv) = common::random_tensor(&[n], dt, seed + 2, 0.05, &cpu());
            let mut out = common::poisoned(&[m, n], dt, &cpu());
            gemm_bias_relu(&a, &b, &bias, &mut out).unwrap();
            let want: Vec<f64> =
                matmul(&av, &bv, m, k, n).iter().enumerate().map(|(x, v)| (v + biasv[x % n]).max(0.0)).collect();
            assert!(want.contains(&0.0) || m * n < 4, "relu clips something");
            check(&format!("gemm_bias_relu {m}x{n}x{k}"), dt, &out.to_vec_f64().unwrap(), &want, tol(dt));
        }
    }
}

#[test]
fn swiglu_with_two_accumulators() {
    let silu = |v: f64| v / (1.0 + (-v).exp());
    for dt in common::DTYPES {
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let seed = 2000 + 10 * s as u64;
            let (x, xv) = common::random_tensor(&[m, k], dt, seed, 0.05, &cpu());
            let (wg, gv) = common::random_tensor(&[k, n], dt, seed + 1, 0.05, &cpu());
            let (wu, uv) = common::random_tensor(&[k, n], dt, seed + 2, 0.05, &cpu());
            let mut out = common::poisoned(&[m, n], dt, &cpu());
            swiglu_proj(&x, &wg, &wu, &mut out).unwrap();
            let (g, u) = (matmul(&xv, &gv, m, k, n), matmul(&xv, &uv, m, k, n));
            let want: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
            check(&format!("swiglu_proj {m}x{n}x{k}"), dt, &out.to_vec_f64().unwrap(), &want, tol(dt));
        }
    }
}

#[test]
fn a_reduction_carried_across_column_blocks() {
    for dt in common::DTYPES {
        for &(m, n) in &[(1, 1), (7, 15), (33, 100), (5, 257)] {
            let (x, xv) = common::random_tensor(&[m, n], dt, (m * n) as u64, 0.0, &cpu());
            let mut out = common::poisoned(&[m], DType::F32, &cpu());
            row_sumsq(&x, &mut out).unwrap();
            let want: Vec<f64> = xv.chunks(n).map(|r| r.iter().map(|v| v * v).sum()).collect();
            check(&format!("row_sumsq {m}x{n}"), dt, &out.to_vec_f64().unwrap(), &want, 1e-5);
        }
    }
}

#[test]
fn the_ir_of_ops_gemm_has_one_loop_with_a_dot() {
    let k = (kfuse::ops::kernels::gemm::DEF.build)(&[DType::BF16]).unwrap();
    let text = kfuse::ir::print::print(&k);
    assert_eq!(text.matches("for L0 in").count(), 1, "{text}");
    assert_eq!(text.matches("= dot ").count(), 1, "{text}");
    assert!(text.contains("loop_carried L0.0 : f32[BM, BN]  // acc"), "{text}");
    assert!(text.contains("cast %") && text.contains("to bf16 : bf16[BM, BN]"), "{text}");
}
