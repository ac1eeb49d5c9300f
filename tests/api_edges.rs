//! Adversarial inputs to the public API: `Tensor` constructors and views, the matrix
//! products, the row ops, RoPE and the kernel launchers that take `&mut` outputs. Every
//! case asserts one outcome — an `Err` of the right kind whose message names the
//! problem, or `Ok` with values checked against a float64 reference — and runs under
//! `catch_unwind` (`common::audit`), so that one panic does not hide the others: each
//! test lists every case that panicked or came out wrong. CPU device (the interpreter) only, small shapes.

mod common;

use common::audit::{close_values, cpu, err, ok, rt, t, zeros, Audit, E, R};

use kfuse::ops::kernels as k;
use kfuse::ops::{self, Dim, Freqs, GemmOptions, Positions, RopeLayout, RopeOptions};
use kfuse::{DType, Tensor};

/// `got` has `shape` and `dtype` and its values are within `tol` (relative to the
/// largest reference magnitude, at least 1) of `want`; NaN matches NaN, ±inf itself.
fn close(got: &Tensor, shape: &[usize], dtype: DType, want: &[f64], tol: f64) -> R {
    if got.shape() != shape || got.dtype() != dtype {
        return Err(format!("expected {dtype} {shape:?}, got {} {:?}", got.dtype(), got.shape()));
    }
    close_values(got, want, tol)
}

/// `a · b` in f64, `a: [m, k]`, `b: [k, n]` row-major.
fn mm(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

fn softmax_ref(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|r| {
            let mx = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = r.iter().map(|v| (v - mx).exp()).sum();
            r.iter().map(move |v| (v - mx).exp() / s).collect::<Vec<_>>()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Tensor constructors and views.

#[test]
fn tensor_constructors_and_views() {
    let mut a = Audit::new("tensor");
    let f = DType::F32;
    let c = cpu();
    // element counts that overflow usize
    for shape in [vec![usize::MAX, 2], vec![1 << 40, 1 << 40], vec![2, usize::MAX], vec![1 << 32, 1 << 32, 3]] {
        a.case(&format!("empty {shape:?}"), || err(Tensor::empty(&shape, f, &c), E::Invalid, &["more elements than fit"]));
        a.case(&format!("zeros {shape:?}"), || err(Tensor::zeros(&shape, f, &c), E::Invalid, &["more elements than fit"]));
        a.case(&format!("from_f64 [] {shape:?}"), || err(Tensor::from_f64(&[], &shape, f, &c), E::Invalid, &["more elements than fit"]));
        a.case(&format!("from_bytes [] {shape:?}"), || err(Tensor::from_bytes(&[], &shape, f, &c), E::Invalid, &["more elements than fit"]));
    }
    // element counts that fit but byte sizes that do not
    a.case("empty [2^62] f32: bytes overflow usize", || err(Tensor::empty(&[1 << 62], f, &c), E::Invalid, &["too large"]));
    a.case("empty [2^61] i64: bytes overflow usize", || err(Tensor::empty(&[1 << 61], DType::I64, &c), E::Invalid, &["too large"]));
    a.case("from_bytes [] as [2^62] f32 (bytes wrap to 0)", || err(Tensor::from_bytes(&[], &[1 << 62], f, &c), E::Invalid, &["too large"]));
    a.case("from_bytes [] as [2^61, 2] f32 (bytes wrap to 0)", || err(Tensor::from_bytes(&[], &[1 << 61, 2], f, &c), E::Invalid, &["too large"]));
    a.case("from_bytes [] as [2^61] i64 (bytes wrap to 0)", || err(Tensor::from_bytes(&[], &[1 << 61], DType::I64, &c), E::Invalid, &["too large"]));
    // byte sizes that fit usize but no allocation can hold (2^63 bytes: over isize::MAX;
    // 2^48 bytes: over any x86-64/aarch64 user address space)
    a.case("empty [2^61] f32 (2^63 bytes)", || err(Tensor::empty(&[1 << 61], f, &c), E::Invalid, &["cannot allocate"]));
    a.case("empty [2^46] f32 (256 TiB)", || err(Tensor::empty(&[1 << 46], f, &c), E::Invalid, &["cannot allocate"]));
    a.case("full [2^45] bf16 (64 TiB)", || err(Tensor::full(&[1 << 45, 1], 1.0, DType::BF16, &c), E::Invalid, &["cannot allocate"]));
    // lengths that do not match
    a.case("from_f64 wrong length", || err(Tensor::from_f64(&[1.0, 2.0, 3.0], &[2, 2], f, &c), E::Shape, &["3 values", "[2, 2]"]));
    a.case("from_bytes wrong length", || err(Tensor::from_bytes(&[0; 7], &[2], f, &c), E::Shape, &["7 bytes"]));
    // empty tensors whose other dimensions are huge: fine, and the strides stay non-negative
    // (order does not matter: a zero anywhere makes the tensor empty)
    for shape in [vec![0, usize::MAX], vec![usize::MAX, 0], vec![3, 0, usize::MAX], vec![0, 1 << 40, 1 << 40], vec![1 << 40, 1 << 40, 0], vec![usize::MAX, 2, 0]] {
        a.case(&format!("empty {shape:?}"), || {
            let x = ok(Tensor::empty(&shape, f, &c))?;
            if x.numel() != 0 || !x.is_contiguous() || !ok(x.to_vec_f64())?.is_empty() {
                return Err(format!("numel {}, contiguous {}", x.numel(), x.is_contiguous()));
            }
            if x.strides().iter().any(|&s| s < 0) {
                return Err(format!("negative strides {:?} (views have non-negative strides)", x.strides()));
            }
            Ok(())
        });
    }
    a.case("narrow of an empty [3, 0, MAX] along dim 0", || {
        let x = ok(Tensor::empty(&[3, 0, usize::MAX], f, &c))?;
        let v = ok(x.narrow(0, 2, 1))?;
        if v.shape() != [1, 0, usize::MAX] || v.offset() > 3 {
            return Err(format!("shape {:?} offset {}", v.shape(), v.offset()));
        }
        let _ = (v.byte_offset(), v.address());
        Ok(())
    });
    a.case("permuted empty [0, MAX, 2] -> [MAX, 2, 0]: numel and ops", || {
        let x = ok(Tensor::empty(&[0, usize::MAX, 2], f, &c))?;
        let p = ok(x.permute(&[1, 2, 0]))?;
        if p.numel() != 0 {
            return Err(format!("numel {}", p.numel()));
        }
        if ok(ops::copy(&p))?.numel() != 0 {
            return Err("copy not empty".into());
        }
        close(&ok(ops::sum(&p, Dim::All))?, &[], f, &[0.0], 0.0)?;
        // a [MAX, 2] result of the last-axis sum does not fit; softmax has MAX·2 rows of nothing
        err(ops::sum(&p, Dim::Last), E::Invalid, &["more elements than fit"])?;
        err(ops::softmax(&p), E::Invalid, &["last dimension"])?;
        // leading sizes with a zero among them: no rows at all
        let q = ok(Tensor::empty(&[usize::MAX, 2, 0, 5], f, &c))?;
        close(&ok(ops::softmax(&q))?, &[usize::MAX, 2, 0, 5], f, &[], 0.0)?;
        close(&ok(ops::max(&q, Dim::Last))?, &[usize::MAX, 2, 0], f, &[], 0.0)?;
        close(&ok(ops::gemm_batched(&q, &t(&[5, 3], f)))?, &[usize::MAX, 2, 0, 3], f, &[], 0.0)
    });
    // narrow
    let m = t(&[3, 4], f);
    a.case("narrow dim out of range", || err(m.narrow(2, 0, 1), E::Invalid, &["dimension 2"]));
    a.case("narrow start past the end", || err(m.narrow(1, 5, 0), E::Invalid, &["out of range"]));
    a.case("narrow start + len overflows", || err(m.narrow(1, usize::MAX, 2), E::Invalid, &["out of range"]));
    a.case("narrow of a rank-0 tensor", || err(zeros(&[], f).narrow(0, 0, 1), E::Invalid, &["rank 0"]));
    a.case("narrow to nothing at the end", || {
        let v = ok(m.narrow(1, 4, 0))?;
        close(&v, &[3, 0], f, &[], 0.0)
    });
    // reshape
    a.case("reshape to an overflowing shape", || err(m.reshape(&[usize::MAX, 2]), E::Invalid, &["more elements than fit"]));
    a.case("reshape to another count", || err(m.reshape(&[5, 2]), E::Shape, &["[3, 4]", "[5, 2]"]));
    a.case("reshape of a transposed view", || err(m.t().reshape(&[12]), E::NonContig, &["reshape", ".contiguous()"]));
    a.case("reshape of an empty view to [0, MAX]", || {
        let v = ok(zeros(&[0, 3], f).reshape(&[0, usize::MAX]))?;
        if v.strides().iter().any(|&s| s < 0) {
            return Err(format!("negative strides {:?}", v.strides()));
        }
        Ok(())
    });
    a.case("reshape of a rank-0 tensor to [1, 1, 1, 1, 1]", || {
        let s = ok(Tensor::from_f64(&[2.5], &[], f, &c))?;
        close(&ok(s.reshape(&[1, 1, 1, 1, 1]))?, &[1, 1, 1, 1, 1], f, &[2.5], 0.0)
    });
    // t() and permute
    a.case("t() of rank 0 and 1 is the identity", || {
        let s = zeros(&[], f);
        let v = zeros(&[3], f);
        if s.t().shape() != [0usize; 0] || v.t().shape() != [3] {
            return Err("changed".into());
        }
        Ok(())
    });
    a.case("unsqueeze past the rank", || err(m.unsqueeze(3), E::Invalid, &["unsqueeze", "rank 2"]));
    a.case("unsqueeze at the rank and of rank 0", || {
        let u = ok(m.unsqueeze(2))?;
        let s = ok(zeros(&[], f).unsqueeze(0))?;
        if u.shape() != [m.shape()[0], m.shape()[1], 1] || s.shape() != [1] {
            return Err(format!("{:?} {:?}", u.shape(), s.shape()));
        }
        Ok(())
    });
    a.case("unsqueeze of an empty view with a huge size", || {
        let x = ok(Tensor::empty(&[0, usize::MAX], f, &c))?;
        let u = ok(x.unsqueeze(1))?;
        if u.strides().iter().any(|&s| s < 0) {
            return Err(format!("negative strides {:?}", u.strides()));
        }
        Ok(())
    });
    a.case("permute with a repeated axis", || err(m.permute(&[1, 1]), E::Invalid, &["not a permutation"]));
    a.case("permute with an axis out of range", || err(m.permute(&[0, 2]), E::Invalid, &["not a permutation"]));
    // copies of views
    a.case("copy of a rank-5 strided view", || {
        let x = t(&[2, 2, 1, 3, 2], f).permute(&[4, 1, 2, 0, 3]).unwrap(); // [2, 2, 1, 2, 3]
        let c = ok(ops::copy(&x))?;
        if !c.is_contiguous() {
            return Err(format!("copy has strides {:?}", c.strides()));
        }
        close(&c, &[2, 2, 1, 2, 3], f, &ok(x.to_vec_f64())?, 0.0)
    });
    a.case("transpose of a rank-1 tensor", || err(ops::transpose(&t(&[4], f)), E::Invalid, &["2-D", "[4]"]));
    a.case("contiguous of a narrowed transposed view", || {
        let (x, xv) = rt(&[4, 5], f, 11);
        let v = ok(x.t().narrow(0, 1, 3))?; // [3, 4]: columns 1..4 of x
        let want: Vec<f64> = (0..3).flat_map(|i| (0..4).map(move |j| (i, j))).map(|(i, j)| xv[j * 5 + i + 1]).collect();
        close(&ok(ops::contiguous(&v))?, &[3, 4], f, &want, 0.0)
    });
    a.finish();
}

// ---------------------------------------------------------------------------------------
// Matrix products.

#[test]
fn matrix_products() {
    let mut a = Audit::new("gemm");
    let f = DType::F32;
    let d = GemmOptions::default();
    // zero-sized dimensions in every position
    for (m, kk, n) in [(0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0), (0, 0, 4), (3, 0, 0)] {
        a.case(&format!("gemm [{m}, {kk}] x [{kk}, {n}]"), || {
            let r = ok(ops::gemm(&t(&[m, kk], f), &t(&[kk, n], f)))?;
            close(&r, &[m, n], f, &vec![0.0; m * n], 0.0)
        });
        a.case(&format!("gemm_ex alpha 2, beta 3, c, bf16 out [{m}, {kk}] x [{kk}, {n}]"), || {
            let (cc, cv) = rt(&[m, n], DType::BF16, 3);
            let o = GemmOptions { alpha: 2.0, beta: 3.0, c: Some(&cc), out_dtype: Some(DType::BF16), ..d };
            let want: Vec<f64> = cv.iter().map(|v| DType::BF16.round(3.0 * v)).collect();
            close(&ok(ops::gemm_ex(&t(&[m, kk], f), &t(&[kk, n], f), &o))?, &[m, n], DType::BF16, &want, 0.0)
        });
        a.case(&format!("swiglu_gemm [{m}, {kk}] x [{kk}, {n}]"), || {
            let r = ok(ops::swiglu_gemm(&t(&[m, kk], f), &t(&[kk, n], f), &t(&[kk, n], f)))?;
            close(&r, &[m, n], f, &vec![0.0; m * n], 0.0)
        });
    }
    for (batch, b_shared) in [(vec![0usize], false), (vec![2, 0], false), (vec![0], true), (vec![3, 0, 2], true)] {
        a.case(&format!("gemm_batched batch {batch:?} shared b {b_shared}"), || {
            let x = t(&[batch.clone(), vec![2, 3]].concat(), f);
            let w = if b_shared { t(&[3, 4], f) } else { t(&[batch.clone(), vec![3, 4]].concat(), f) };
            close(&ok(ops::gemm_batched(&x, &w))?, &[batch.clone(), vec![2, 4]].concat(), f, &[], 0.0)
        });
    }
    // outputs too large to exist, from operands that do (empty ones)
    a.case("gemm [MAX, 0] x [0, 2]: output [MAX, 2]", || {
        err(ops::gemm(&zeros(&[usize::MAX, 0], f), &zeros(&[0, 2], f)), E::Invalid, &["more elements than fit"])
    });
    a.case("gemm [0, MAX] x [MAX, 0]: output [0, 0]", || close(&ok(ops::gemm(&zeros(&[0, usize::MAX], f), &zeros(&[usize::MAX, 0], f)))?, &[0, 0], f, &[], 0.0));
    a.case("gemm [2^40, 0] x [0, 2^40] f32", || err(ops::gemm(&zeros(&[1 << 40, 0], f), &zeros(&[0, 1 << 40], f)), E::Invalid, &["more elements than fit"]));
    a.case("gemm [2^31, 0] x [0, 2^31] f32 (2^64 bytes)", || err(ops::gemm(&zeros(&[1 << 31, 0], f), &zeros(&[0, 1 << 31], f)), E::Invalid, &["too large"]));
    a.case("gemm [2^23, 0] x [0, 2^23] f32 (256 TiB)", || err(ops::gemm(&zeros(&[1 << 23, 0], f), &zeros(&[0, 1 << 23], f)), E::Invalid, &["cannot allocate"]));
    a.case("gemm_batched [MAX, 0, 3] x [3, 2]", || close(&ok(ops::gemm_batched(&zeros(&[usize::MAX, 0, 3], f), &t(&[3, 2], f)))?, &[usize::MAX, 0, 2], f, &[], 0.0));
    // ranks
    for (sa, sb) in [(vec![], vec![3, 4]), (vec![3], vec![3, 4]), (vec![2, 3], vec![3]), (vec![1, 1, 2, 2, 3], vec![3, 4]), (vec![2, 3], vec![1, 1, 1, 3, 4])] {
        a.case(&format!("gemm {sa:?} x {sb:?}"), || err(ops::gemm(&t(&sa, f), &t(&sb, f)), E::Invalid, &["must be a matrix (rank 2)"]));
        a.case(&format!("swiglu_gemm {sa:?} x {sb:?}"), || err(ops::swiglu_gemm(&t(&sa, f), &t(&sb, f), &t(&sb, f)), E::Invalid, &["must be a matrix (rank 2)"]));
    }
    a.case("gemm_batched rank-0 a", || err(ops::gemm_batched(&t(&[], f), &t(&[3, 4], f)), E::Invalid, &["rank ≥ 2"]));
    a.case("gemm_batched rank-1 b", || err(ops::gemm_batched(&t(&[2, 2, 3], f), &t(&[3], f)), E::Invalid, &["[K, N]"]));
    a.case("gemm_batched rank-5 a, rank-4 b", || err(ops::gemm_batched(&t(&[1, 1, 2, 2, 3], f), &t(&[1, 2, 3, 4], f)), E::Invalid, &["[K, N]"]));
    // rank-5 batches: values (a packed, b a transposed view: copied or flattened)
    a.case("gemm_batched rank 5 with a transposed b", || {
        let (x, xv) = rt(&[1, 2, 1, 2, 3], f, 1);
        let (wt, _) = rt(&[1, 2, 1, 4, 3], f, 2);
        let w = wt.t();
        let wv = ok(w.to_vec_f64())?;
        let want: Vec<f64> = (0..2).flat_map(|z| mm(&xv[z * 6..z * 6 + 6], &wv[z * 12..z * 12 + 12], 2, 3, 4)).collect();
        close(&ok(ops::gemm_batched(&x, &w))?, &[1, 2, 1, 2, 4], f, &want, 1e-6)
    });
    // dtypes
    let i = zeros(&[2, 3], DType::I64);
    a.case("gemm i64 operands", || err(ops::gemm(&i, &zeros(&[3, 2], DType::I64)), E::Invalid, &["i64"]));
    a.case("gemm i64 a, f32 b", || err(ops::gemm(&i, &t(&[3, 2], f)), E::Invalid, &["`a`", "i64"]));
    a.case("gemm f32 a, i64 b", || err(ops::gemm(&t(&[2, 3], f), &zeros(&[3, 2], DType::I64)), E::Invalid, &["`b`", "i64"]));
    a.case("gemm empty i64 operands", || err(ops::gemm(&zeros(&[0, 3], DType::I64), &zeros(&[3, 0], DType::I64)), E::Invalid, &["i64"]));
    a.case("gemm f32 x bf16", || err(ops::gemm(&t(&[2, 3], f), &t(&[3, 2], DType::BF16)), E::DType, &["f32", "bf16"]));
    a.case("gemm_ex i64 output", || err(ops::gemm_ex(&t(&[2, 3], f), &t(&[3, 2], f), &GemmOptions { out_dtype: Some(DType::I64), ..d }), E::Invalid, &["output dtype", "i64"]));
    a.case("gemm_batched i64", || err(ops::gemm_batched(&zeros(&[2, 2, 3], DType::I64), &zeros(&[3, 2], DType::I64)), E::Invalid, &["i64"]));
    a.case("swiglu_gemm mixed dtypes", || err(ops::swiglu_gemm(&t(&[2, 3], f), &t(&[3, 2], f), &t(&[3, 2], DType::F16)), E::DType, &["`wu`"]));
    a.case("swiglu_gemm i64", || err(ops::swiglu_gemm(&zeros(&[2, 3], DType::I64), &t(&[3, 2], f), &t(&[3, 2], f)), E::Invalid, &["i64"]));
    // shapes
    a.case("gemm inner mismatch", || err(ops::gemm(&t(&[2, 3], f), &t(&[4, 2], f)), E::Shape, &["[2, 3]", "[4, 2]"]));
    a.case("gemm inner mismatch with a zero", || err(ops::gemm(&t(&[2, 0], f), &t(&[3, 2], f)), E::Shape, &["[2, 0]", "[3, 2]"]));
    a.case("gemm_ex c of the wrong shape", || {
        let cc = t(&[2, 3], f);
        err(ops::gemm_ex(&t(&[2, 3], f), &t(&[3, 2], f), &GemmOptions { beta: 1.0, c: Some(&cc), ..d }), E::Shape, &["`c`", "[2, 3]"])
    });
    a.case("gemm_ex c [0, 2] for an empty [2, 0] output", || {
        let cc = t(&[0, 2], f);
        err(ops::gemm_ex(&t(&[2, 3], f), &t(&[3, 0], f), &GemmOptions { beta: 1.0, c: Some(&cc), ..d }), E::Shape, &["`c`"])
    });
    a.case("gemm_ex c of a rank-0 tensor", || {
        let cc = t(&[], f);
        err(ops::gemm_ex(&t(&[2, 3], f), &t(&[3, 2], f), &GemmOptions { beta: 1.0, c: Some(&cc), ..d }), E::Shape, &["`c`"])
    });
    a.case("gemm_ex c i64", || {
        let cc = zeros(&[2, 2], DType::I64);
        err(ops::gemm_ex(&t(&[2, 3], f), &t(&[3, 2], f), &GemmOptions { beta: 1.0, c: Some(&cc), ..d }), E::DType, &["`c`", "i64"])
    });
    a.case("gemm_batched batch mismatch", || err(ops::gemm_batched(&t(&[2, 2, 3], f), &t(&[3, 3, 2], f)), E::Shape, &["batch dimensions"]));
    a.case("gemm_batched_ex c of the unbatched shape", || {
        let cc = t(&[2, 4], f);
        err(ops::gemm_batched_ex(&t(&[2, 2, 3], f), &t(&[3, 4], f), &GemmOptions { beta: 1.0, c: Some(&cc), ..d }), E::Shape, &["`c`"])
    });
    a.case("swiglu_gemm wu of another shape", || err(ops::swiglu_gemm(&t(&[2, 3], f), &t(&[3, 2], f), &t(&[3, 3], f)), E::Shape, &["`wu`"]));
    // strided (transposed, narrowed) operands and c
    a.case("gemm_ex transposed a, narrowed b, transposed c", || {
        let (at, _) = rt(&[5, 3], f, 21);
        let (wide, _) = rt(&[5, 9], f, 22);
        let (ct, _) = rt(&[4, 3], f, 23);
        let (x, w, cc) = (at.t(), ok(wide.narrow(1, 3, 4))?, ct.t());
        let (xv, wv, cv) = (ok(x.to_vec_f64())?, ok(w.to_vec_f64())?, ok(cc.to_vec_f64())?);
        let want: Vec<f64> = mm(&xv, &wv, 3, 5, 4).iter().zip(&cv).map(|(p, c)| 0.5 * p - 2.0 * c).collect();
        close(&ok(ops::gemm_ex(&x, &w, &GemmOptions { alpha: 0.5, beta: -2.0, c: Some(&cc), ..d }))?, &[3, 4], f, &want, 1e-6)
    });
    a.case("gemm of a row slice with an offset", || {
        let (big, bv) = rt(&[6, 3], f, 24);
        let (w, wv) = rt(&[3, 2], f, 25);
        let x = ok(big.narrow(0, 4, 2))?;
        close(&ok(ops::gemm(&x, &w))?, &[2, 2], f, &mm(&bv[12..18], &wv, 2, 3, 2), 1e-6)
    });
    a.case("gemm of a 1 x 1 transposed view (two unit strides)", || {
        let (x, xv) = rt(&[1, 1], DType::BF16, 26);
        let (w, wv) = rt(&[1, 3], DType::BF16, 27);
        let want: Vec<f64> = wv.iter().map(|v| DType::BF16.round(v * xv[0])).collect();
        close(&ok(ops::gemm(&x.t(), &w))?, &[1, 3], DType::BF16, &want, 0.0)
    });
    a.case("swiglu_gemm with transposed weights", || {
        let (x, xv) = rt(&[2, 3], f, 28);
        let (gt, _) = rt(&[4, 3], f, 29);
        let (ut, _) = rt(&[4, 3], f, 30);
        let (g, u) = (gt.t(), ut.t());
        let (gv, uv) = (mm(&xv, &ok(g.to_vec_f64())?, 2, 3, 4), mm(&xv, &ok(u.to_vec_f64())?, 2, 3, 4));
        let want: Vec<f64> = gv.iter().zip(&uv).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        close(&ok(ops::swiglu_gemm(&x, &g, &u))?, &[2, 4], f, &want, 1e-5)
    });
    // NaN and Inf scalars: IEEE arithmetic in the epilogue, as in BLAS
    let (pa, pav) = (Tensor::full(&[2, 3], 1.5, f, &cpu()).unwrap(), vec![1.5; 6]);
    let (pb, pbv) = (Tensor::full(&[3, 2], 0.5, f, &cpu()).unwrap(), vec![0.5; 6]);
    let prod = mm(&pav, &pbv, 2, 3, 2);
    let pc = Tensor::full(&[2, 2], 2.0, f, &cpu()).unwrap();
    for (alpha, beta, with_c) in [(f32::NAN, 0.0, false), (f32::INFINITY, 0.0, false), (f32::NEG_INFINITY, 1.0, true), (1.0, f32::NAN, true), (1.0, f32::INFINITY, true), (0.0, 1.0, true)] {
        a.case(&format!("gemm_ex alpha {alpha} beta {beta} c {with_c}"), || {
            let o = GemmOptions { alpha, beta, c: with_c.then_some(&pc), ..d };
            let want: Vec<f64> = prod.iter().map(|p| alpha as f64 * p + if with_c { beta as f64 * 2.0 } else { 0.0 }).collect();
            close(&ok(ops::gemm_ex(&pa, &pb, &o))?, &[2, 2], f, &want, 1e-6)
        });
    }
    a.case("gemm_ex beta 0: a NaN c is not read", || {
        let cn = Tensor::full(&[2, 2], f64::NAN, f, &cpu()).unwrap();
        close(&ok(ops::gemm_ex(&pa, &pb, &GemmOptions { beta: 0.0, c: Some(&cn), ..d }))?, &[2, 2], f, &prod, 1e-6)
    });
    a.case("gemm_ex scale_a NaN", || close(&ok(ops::gemm_ex(&pa, &pb, &GemmOptions { scale_a: f32::NAN, ..d }))?, &[2, 2], f, &[f64::NAN; 4], 0.0));
    a.case("gemm_batched_ex alpha Inf", || {
        let x = Tensor::full(&[2, 2, 3], 1.0, f, &cpu()).unwrap();
        close(&ok(ops::gemm_batched_ex(&x, &pb, &GemmOptions { alpha: f32::INFINITY, ..d }))?, &[2, 2, 2], f, &[f64::INFINITY; 8], 0.0)
    });
    a.finish();
}

#[test]
fn grouped_products() {
    let mut a = Audit::new("gemm_grouped");
    let f = DType::F32;
    let d = GemmOptions::default();
    let (x, xv) = rt(&[2, 3], f, 1);
    let (w, wv) = rt(&[3, 4], f, 2);
    a.case("empty lists", || err(ops::gemm_grouped(&[], &[]), E::Invalid, &["no problems"]));
    a.case("lists of different lengths", || err(ops::gemm_grouped(&[&x, &x], &[&w]), E::Invalid, &["2 `a`", "1 `b`"]));
    a.case("empty a, one b", || err(ops::gemm_grouped(&[], &[&w]), E::Invalid, &["0 `a`", "1 `b`"]));
    a.case("problem of rank 1", || err(ops::gemm_grouped(&[&x, &t(&[3], f)], &[&w, &w]), E::Invalid, &["problem #1", "rank 2"]));
    a.case("problem of rank 0", || err(ops::gemm_grouped(&[&t(&[], f)], &[&w]), E::Invalid, &["problem #0", "rank 2"]));
    a.case("problem with inner mismatch", || err(ops::gemm_grouped(&[&x, &x], &[&w, &t(&[4, 4], f)]), E::Shape, &["problem #1"]));
    a.case("problem of another dtype", || err(ops::gemm_grouped(&[&x, &t(&[2, 3], DType::BF16)], &[&w, &t(&[3, 4], DType::BF16)]), E::Invalid, &["problem #1", "one dtype"]));
    a.case("problem mixing dtypes", || err(ops::gemm_grouped(&[&x], &[&t(&[3, 4], DType::BF16)]), E::DType, &["problem #0"]));
    a.case("i64 problem", || err(ops::gemm_grouped(&[&zeros(&[2, 3], DType::I64)], &[&zeros(&[3, 4], DType::I64)]), E::Invalid, &["i64"]));
    a.case("i64 output dtype", || err(ops::gemm_grouped_ex(&[&x], &[&w], &GemmOptions { out_dtype: Some(DType::I64), ..d }), E::Invalid, &["output dtype"]));
    a.case("beta without c", || err(ops::gemm_grouped_ex(&[&x], &[&w], &GemmOptions { beta: 1.0, ..d }), E::Invalid, &["not taken by grouped"]));
    a.case("beta NaN", || err(ops::gemm_grouped_ex(&[&x], &[&w], &GemmOptions { beta: f32::NAN, ..d }), E::Invalid, &["not taken by grouped"]));
    a.case("fp8 problem", || {
        let x8 = t(&[2, 3], DType::F8E4M3);
        err(ops::gemm_grouped(&[&x8], &[&t(&[3, 4], DType::F8E4M3)]), E::Invalid, &["8-bit"])
    });
    a.case("empty problems and the empty sum among real ones", || {
        let e1 = t(&[0, 3], f);
        let (k0a, k0b) = (t(&[2, 0], f), t(&[0, 5], f));
        let n0 = t(&[3, 0], f);
        let r = ok(ops::gemm_grouped(&[&e1, &x, &k0a, &x], &[&w, &w, &k0b, &n0]))?;
        close(&r[0], &[0, 4], f, &[], 0.0)?;
        close(&r[1], &[2, 4], f, &mm(&xv, &wv, 2, 3, 4), 1e-6)?;
        close(&r[2], &[2, 5], f, &[0.0; 10], 0.0)?;
        close(&r[3], &[2, 0], f, &[], 0.0)
    });
    a.case("only empty problems", || {
        let r = ok(ops::gemm_grouped(&[&t(&[0, 3], f), &t(&[2, 3], f)], &[&w, &t(&[3, 0], f)]))?;
        close(&r[0], &[0, 4], f, &[], 0.0)?;
        close(&r[1], &[2, 0], f, &[], 0.0)
    });
    a.case("strided problems, one tensor in several problems, alpha and bf16 out", || {
        let (at, _) = rt(&[3, 2], f, 3);
        let xt = at.t();
        let xtv = ok(xt.to_vec_f64())?;
        let r = ok(ops::gemm_grouped_ex(&[&xt, &x, &xt], &[&w, &w, &w], &GemmOptions { alpha: -0.5, out_dtype: Some(DType::BF16), ..d }))?;
        let want = |v: &[f64]| mm(v, &wv, 2, 3, 4).iter().map(|p| DType::BF16.round(-0.5 * p)).collect::<Vec<_>>();
        close(&r[0], &[2, 4], DType::BF16, &want(&xtv), 1e-2)?;
        close(&r[1], &[2, 4], DType::BF16, &want(&xv), 1e-2)?;
        close(&r[2], &[2, 4], DType::BF16, &want(&xtv), 1e-2)
    });
    a.case("alpha NaN", || {
        let r = ok(ops::gemm_grouped_ex(&[&x], &[&w], &GemmOptions { alpha: f32::NAN, ..d }))?;
        close(&r[0], &[2, 4], f, &[f64::NAN; 8], 0.0)
    });
    a.finish();
}

// ---------------------------------------------------------------------------------------
// Row ops: reductions, softmax, norms.

#[test]
fn row_ops() {
    let mut a = Audit::new("rows");
    let f = DType::F32;
    const EPS: f32 = 1e-5;
    type RowFn = fn(&Tensor) -> kfuse::Result<Tensor>;
    let rows: [(&str, RowFn); 12] = [
        ("sum", |x| ops::sum(x, Dim::Last)),
        ("mean", |x| ops::mean(x, Dim::Last)),
        ("max", |x| ops::max(x, Dim::Last)),
        ("min", |x| ops::min(x, Dim::Last)),
        ("sum all", |x| ops::sum(x, Dim::All)),
        ("mean all", |x| ops::mean(x, Dim::All)),
        ("max all", |x| ops::max(x, Dim::All)),
        ("min all", |x| ops::min(x, Dim::All)),
        ("softmax", ops::softmax),
        ("log_softmax", ops::log_softmax),
        ("rms_norm", |x| Ok(ops::rms_norm(x, None, None, EPS)?.0)),
        ("layer_norm", |x| {
            let n = *x.shape().last().unwrap_or(&0);
            Ok(ops::layer_norm(x, &Tensor::full(&[n], 1.0, x.dtype(), &x.device())?, &Tensor::zeros(&[n], x.dtype(), &x.device())?, EPS)?.0)
        }),
    ];
    // integer inputs: refused whatever their size (the kernels take floats only)
    for (name, op) in rows {
        for shape in [vec![2, 3], vec![0, 3], vec![3, 0], vec![0]] {
            a.case(&format!("{name} i64 {shape:?}"), || err(op(&zeros(&shape, DType::I64)), E::Any, &["i64"]));
        }
    }
    // rank 0: the row ops refuse it, whole-tensor reductions take it
    for (name, op) in &rows[..4] {
        a.case(&format!("{name} rank 0"), || err(op(&t(&[], f)), E::Invalid, &["rank 0"]));
    }
    for (name, op) in [("softmax", rows[8].1), ("log_softmax", rows[9].1), ("rms_norm", rows[10].1), ("layer_norm", rows[11].1)] {
        a.case(&format!("{name} rank 0"), || err(op(&t(&[], f)), E::Any, &["rank 0"]));
    }
    let s = Tensor::from_f64(&[-2.5], &[], f, &cpu()).unwrap();
    for (name, op) in &rows[4..8] {
        a.case(&format!("{name} rank 0"), || {
            close(&ok(op(&s))?, &[], f, &[-2.5], 0.0)
        });
    }
    // rank 1 and rank 5: rows of the last dimension
    let (v, vv) = rt(&[5], f, 3);
    a.case("sum rank 1", || close(&ok(ops::sum(&v, Dim::Last))?, &[], f, &[vv.iter().sum()], 1e-6));
    a.case("softmax rank 1", || close(&ok(ops::softmax(&v))?, &[5], f, &softmax_ref(&vv, 5), 1e-6));
    let (x5, x5v) = rt(&[2, 1, 2, 1, 3], f, 4);
    a.case("max rank 5", || {
        let want: Vec<f64> = x5v.chunks(3).map(|r| r.iter().cloned().fold(f64::NEG_INFINITY, f64::max)).collect();
        close(&ok(ops::max(&x5, Dim::Last))?, &[2, 1, 2, 1], f, &want, 0.0)
    });
    a.case("log_softmax rank 5", || {
        let want: Vec<f64> = softmax_ref(&x5v, 3).iter().map(|p| p.ln()).collect();
        close(&ok(ops::log_softmax(&x5))?, &[2, 1, 2, 1, 3], f, &want, 1e-5)
    });
    a.case("mean all rank 5", || close(&ok(ops::mean(&x5, Dim::All))?, &[], f, &[x5v.iter().sum::<f64>() / 12.0], 1e-6));
    // zero-sized dimensions in every position
    for shape in [vec![0, 4], vec![2, 0, 4], vec![1, 2, 0], vec![0, 0]] {
        let n = *shape.last().unwrap();
        let lead: Vec<usize> = shape[..shape.len() - 1].to_vec();
        let m: usize = lead.iter().product();
        a.case(&format!("sum {shape:?}"), || close(&ok(ops::sum(&zeros(&shape, f), Dim::Last))?, &lead, f, &vec![0.0; m], 0.0));
        a.case(&format!("mean {shape:?}"), || close(&ok(ops::mean(&zeros(&shape, f), Dim::Last))?, &lead, f, &vec![if n == 0 { f64::NAN } else { 0.0 }; m], 0.0));
        a.case(&format!("sum all {shape:?}"), || close(&ok(ops::sum(&zeros(&shape, f), Dim::All))?, &[], f, &[0.0], 0.0));
        a.case(&format!("max all {shape:?}"), || err(ops::max(&zeros(&shape, f), Dim::All), E::Invalid, &["empty"]));
        let softmax_ok = m == 0 || n > 0;
        a.case(&format!("softmax {shape:?}"), || {
            let r = ops::softmax(&zeros(&shape, f));
            if softmax_ok { close(&ok(r)?, &shape, f, &[], 0.0) } else { err(r, E::Invalid, &["last dimension"]) }
        });
        a.case(&format!("rms_norm {shape:?}"), || {
            let r = ops::rms_norm(&zeros(&shape, f), None, None, EPS);
            if softmax_ok {
                let (y, rstd) = ok(r)?;
                close(&y, &shape, f, &[], 0.0)?;
                close(&rstd, &lead, f, &[], 0.0)
            } else {
                err(r, E::Invalid, &["last dimension"])
            }
        });
        if m > 0 && n == 0 {
            a.case(&format!("max {shape:?}"), || err(ops::max(&zeros(&shape, f), Dim::Last), E::Invalid, &["no elements"]));
            a.case(&format!("layer_norm {shape:?}"), || err(ops::layer_norm(&zeros(&shape, f), &zeros(&[0], f), &zeros(&[0], f), EPS), E::Invalid, &["last dimension"]));
        }
    }
    // strided inputs: read as they lie (or copied), the same results as on a contiguous
    // copy (whole-tensor sums in another order: 1e-6); a row slice (contiguous, with an
    // offset) is read right
    let (m34, mv) = rt(&[3, 4], f, 5);
    for (name, op) in rows {
        for (what, v) in [("a transposed view", m34.t()), ("a column slice", m34.narrow(1, 1, 2).unwrap())] {
            a.case(&format!("{name} of {what}"), || {
                let want = ok(op(&ok(v.contiguous())?))?;
                close(&ok(op(&v))?, want.shape(), f, &ok(want.to_vec_f64())?, 1e-6)
            });
        }
    }
    let slice = m34.narrow(0, 1, 2).unwrap();
    let sv = &mv[4..12];
    a.case("softmax of a row slice", || close(&ok(ops::softmax(&slice))?, &[2, 4], f, &softmax_ref(sv, 4), 1e-6));
    a.case("sum all of a row slice", || close(&ok(ops::sum(&slice, Dim::All))?, &[], f, &[sv.iter().sum()], 1e-6));
    a.case("min of a row slice", || close(&ok(ops::min(&slice, Dim::Last))?, &[2], f, &sv.chunks(4).map(|r| r.iter().cloned().fold(f64::INFINITY, f64::min)).collect::<Vec<_>>(), 0.0));
    a.case("rms_norm of a row slice with a weight slice", || {
        let (wide, wv) = rt(&[2, 4], f, 6);
        let w = ok(ok(wide.narrow(0, 1, 1))?.reshape(&[4]))?;
        let (y, rstd) = ok(ops::rms_norm(&slice, Some(&w), None, EPS))?;
        let r: Vec<f64> = sv.chunks(4).map(|r| 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / 4.0 + EPS as f64).sqrt()).collect();
        let want: Vec<f64> = (0..8).map(|i| sv[i] * r[i / 4] * wv[4 + i % 4]).collect();
        close(&y, &[2, 4], f, &want, 1e-5)?;
        close(&rstd, &[2], f, &r, 1e-5)
    });
    // eps
    let x = t(&[2, 4], f);
    let (w4, b4) = (t(&[4], f), t(&[4], f));
    for eps in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1e-5] {
        a.case(&format!("rms_norm eps {eps}"), || err(ops::rms_norm(&x, None, None, eps), E::Invalid, &["eps"]));
        a.case(&format!("add_rms_norm eps {eps}"), || err(ops::add_rms_norm(&x, &x, None, eps), E::Invalid, &["eps"]));
        a.case(&format!("layer_norm eps {eps}"), || err(ops::layer_norm(&x, &w4, &b4, eps), E::Invalid, &["eps"]));
    }
    a.case("rms_norm eps 0 on a zero row: NaN (0 · inf)", || {
        let z = zeros(&[1, 4], f);
        let (y, rstd) = ok(ops::rms_norm(&z, None, None, 0.0))?;
        close(&rstd, &[1], f, &[f64::INFINITY], 0.0)?;
        close(&y, &[1, 4], f, &[f64::NAN; 4], 0.0)
    });
    // weights, biases and residuals that do not fit
    a.case("rms_norm w of another length", || err(ops::rms_norm(&x, Some(&t(&[3], f)), None, EPS), E::Shape, &["`w`", "[3]", "[4]"]));
    a.case("rms_norm w of rank 0", || err(ops::rms_norm(&x, Some(&t(&[], f)), None, EPS), E::Shape, &["`w`"]));
    a.case("rms_norm w of rank 2", || err(ops::rms_norm(&x, Some(&t(&[1, 4], f)), None, EPS), E::Shape, &["`w`"]));
    a.case("rms_norm w of another dtype", || err(ops::rms_norm(&x, Some(&t(&[4], DType::BF16)), None, EPS), E::DType, &["`w`", "bf16"]));
    a.case("rms_norm w i64", || err(ops::rms_norm(&x, Some(&zeros(&[4], DType::I64)), None, EPS), E::DType, &["`w`", "i64"]));
    a.case("rms_norm b without w", || err(ops::rms_norm(&x, None, Some(&b4), EPS), E::Invalid, &["needs a weight"]));
    a.case("add_rms_norm r of another shape", || err(ops::add_rms_norm(&x, &t(&[4, 2], f), None, EPS), E::Shape, &["`r`"]));
    a.case("add_rms_norm r transposed", || {
        let r = t(&[4, 2], f).t();
        let (s, y, _) = ok(ops::add_rms_norm(&x, &r, None, EPS))?;
        let (s0, y0, _) = ok(ops::add_rms_norm(&x, &ok(r.contiguous())?, None, EPS))?;
        close(&s, &[2, 4], f, &ok(s0.to_vec_f64())?, 0.0)?;
        close(&y, &[2, 4], f, &ok(y0.to_vec_f64())?, 0.0)
    });
    a.case("add_rms_norm r of another dtype", || err(ops::add_rms_norm(&x, &t(&[2, 4], DType::F16), None, EPS), E::DType, &["`r`"]));
    a.case("layer_norm b of another length", || err(ops::layer_norm(&x, &w4, &t(&[5], f), EPS), E::Shape, &["`b`"]));
    a.case("layer_norm w of another dtype", || err(ops::layer_norm(&x, &t(&[4], DType::F16), &b4, EPS), E::DType, &["`w`"]));
    a.finish();
}

#[test]
fn elementwise_ops_refuse_integers() {
    // every elementwise op computes on floats: an i64 tensor is refused with the same
    // error whether it is empty or not (an empty one used to come back `Ok`)
    let mut a = Audit::new("elementwise");
    let c = cpu();
    for shape in [vec![3usize], vec![0], vec![2, 0]] {
        let x = || Tensor::zeros(&shape, DType::I64, &c).unwrap();
        let words = ["has dtype i64", "takes f32"];
        a.case(&format!("add i64 {shape:?}"), || err(ops::add(&x(), &x()), E::Invalid, &words));
        a.case(&format!("div i64 {shape:?}"), || err(ops::div(&x(), &x()), E::Invalid, &words));
        a.case(&format!("swiglu i64 {shape:?}"), || err(ops::swiglu(&x(), &x()), E::Invalid, &words));
        a.case(&format!("silu i64 {shape:?}"), || err(ops::silu(&x()), E::Invalid, &words));
        a.case(&format!("gelu_tanh i64 {shape:?}"), || err(ops::gelu_tanh(&x()), E::Invalid, &words));
        a.case(&format!("scale i64 {shape:?}"), || err(ops::scale(&x(), 2.0), E::Invalid, &words));
        a.case(&format!("copy i64 {shape:?}"), || err(ops::copy(&x()), E::Invalid, &words));
    }
    // a contiguous integer tensor is its own contiguous view; a float one still works
    a.case("contiguous of a contiguous i64", || {
        let x = ok(Tensor::from_f64(&[1.0, 2.0, 3.0], &[3], DType::I64, &c))?;
        close(&ok(ops::contiguous(&x))?, &[3], DType::I64, &[1.0, 2.0, 3.0], 0.0)
    });
    a.case("add f32 still adds", || {
        let x = ok(Tensor::from_f64(&[1.0, -2.5, 3.0], &[3], DType::F32, &c))?;
        close(&ok(ops::add(&x, &x))?, &[3], DType::F32, &[2.0, -5.0, 6.0], 0.0)
    });
    a.finish();
}


// ---------------------------------------------------------------------------------------
// Kernel launchers with `&mut` outputs: aliasing, strided and mismatched outputs.

#[test]
fn kernel_outputs() {
    let mut a = Audit::new("kernels");
    let f = DType::F32;
    let (x, xv) = rt(&[3, 4], f, 1);
    let flat = x.reshape(&[12]).unwrap();
    // an output that shares storage with an input (the same view, or a disjoint part)
    a.case("add: out is an input", || {
        let mut o = flat.clone();
        err(k::add(&flat, &flat, &mut o), E::Alias, &["`out`", "`a`"])
    });
    a.case("scale: out a disjoint part of the input's storage", || {
        let big = t(&[8], f);
        let (i, mut o) = (ok(big.narrow(0, 0, 4))?, ok(big.narrow(0, 4, 4))?);
        err(k::scale(&i, &mut o, 2.0), E::Alias, &["`out`"])
    });
    a.case("softmax: out is x", || {
        let mut o = x.clone();
        err(k::softmax(&x, &mut o), E::Alias, &["`out`", "`x`"])
    });
    a.case("gemm: c is a", || {
        let sq = t(&[4, 4], f);
        let mut c = sq.clone();
        err(k::gemm(&sq, &t(&[4, 4], f), &mut c), E::Alias, &["`c`", "`a`"])
    });
    a.case("gemm: c is b transposed", || {
        let (sa, sb) = (t(&[4, 4], f), t(&[4, 4], f));
        let mut c = sb.t();
        err(k::gemm(&sa, &sb, &mut c), E::Alias, &["`c`", "`b`"])
    });
    a.case("gemm_axpby: out is c (in-place axpby)", || {
        let (sa, sb) = (t(&[2, 3], f), t(&[3, 2], f));
        let cc = t(&[2, 2], f);
        let mut o = cc.clone();
        err(k::gemm_axpby(&sa, &sb, &cc, &mut o, 1.0, 1.0), E::Alias, &["`c`"])
    });
    a.case("rms_norm: the two outputs share storage", || {
        let s = zeros(&[12 + 3], f);
        let mut y = ok(ok(s.narrow(0, 0, 12))?.reshape(&[3, 4]))?;
        let mut r = ok(s.narrow(0, 12, 3))?;
        err(k::rms_norm(&x, &mut y, &mut r, 1e-5), E::Alias, &["output"])
    });
    a.case("add_rms_norm: s is the residual", || {
        let rr = t(&[3, 4], f);
        let (mut s, mut y, mut r) = (rr.clone(), zeros(&[3, 4], f), zeros(&[3], f));
        err(k::add_rms_norm(&x, &rr, &mut s, &mut y, &mut r, 1e-5), E::Alias, &["`r`"])
    });
    a.case("rope_offset: q and k share storage", || {
        let s = zeros(&[2, 4, 1, 2, 2], f);
        let (mut q, mut kk) = (ok(ok(s.narrow(0, 0, 1))?.reshape(&[4, 1, 2, 2]))?, ok(ok(s.narrow(0, 1, 1))?.reshape(&[4, 1, 2, 2]))?);
        err(k::rope_offset(&mut q, &mut kk, 4, 0, 10000.0), E::Alias, &["output"])
    });
    a.case("rope_pos: f32 positions", || {
        let (mut q, mut kk) = (zeros(&[4, 1, 2, 2], f), zeros(&[4, 1, 2, 2], f));
        err(k::rope_pos(&mut q, &mut kk, &zeros(&[4], f), 10000.0), E::DType, &["`pos`", "i64"])
    });
    // strided outputs: written through their strides, nothing else touched
    a.case("copy2d into a transposed output", || {
        let store = common::poisoned(&[4, 3], f, &cpu());
        let mut o = store.t();
        ok(k::copy2d(&x, &mut o))?;
        close(&o, &[3, 4], f, &xv, 0.0)
    });
    a.case("gemm into a transposed, narrowed output", || {
        let (sa, av) = rt(&[3, 2], f, 2);
        let (sb, bv) = rt(&[2, 4], f, 3);
        let store = common::poisoned(&[5, 3], f, &cpu());
        let mut o = ok(store.narrow(0, 1, 4))?.t(); // [3, 4] with strides [1, 3]
        ok(k::gemm(&sa, &sb, &mut o))?;
        close(&o, &[3, 4], f, &mm(&av, &bv, 3, 2, 4), 1e-6)?;
        // row 0 of the storage is outside the view: still NaN
        let sv = ok(store.to_vec_f64())?;
        if !sv[..3].iter().all(|v| v.is_nan()) {
            return Err(format!("wrote outside the view: {:?}", &sv[..3]));
        }
        Ok(())
    });
    a.case("softmax into a column slice", || {
        let store = common::poisoned(&[3, 6], f, &cpu());
        let mut o = ok(store.narrow(1, 1, 4))?;
        ok(k::softmax(&x, &mut o))?;
        close(&o, &[3, 4], f, &softmax_ref(&xv, 4), 1e-6)?;
        let sv = ok(store.to_vec_f64())?;
        if !(0..3).all(|r| sv[r * 6].is_nan() && sv[r * 6 + 5].is_nan()) {
            return Err("wrote outside the view".into());
        }
        Ok(())
    });
    a.case("row_sum into a slice with an offset", || {
        let store = common::poisoned(&[9], f, &cpu());
        let mut o = ok(store.narrow(0, 3, 3))?;
        ok(k::row_sum(&x, &mut o))?;
        close(&o, &[3], f, &xv.chunks(4).map(|r| r.iter().sum()).collect::<Vec<_>>(), 1e-6)?;
        let sv = ok(store.to_vec_f64())?;
        if !sv[..3].iter().chain(&sv[6..]).all(|v| v.is_nan()) {
            return Err("wrote outside the view".into());
        }
        Ok(())
    });
    // outputs of the wrong shape, rank or dtype
    a.case("add: out of another length", || err(k::add(&flat, &flat, &mut zeros(&[11], f)), E::Shape, &["`out`"]));
    a.case("add: out of rank 2", || err(k::add(&flat, &flat, &mut zeros(&[3, 4], f)), E::Shape, &["`out`"]));
    a.case("add: out of rank 0", || err(k::add(&flat, &flat, &mut zeros(&[], f)), E::Shape, &["`out`"]));
    a.case("add: out of another dtype", || err(k::add(&flat, &flat, &mut zeros(&[12], DType::BF16)), E::DType, &["`out`"]));
    a.case("add: i64 everything", || err(k::add(&zeros(&[4], DType::I64), &zeros(&[4], DType::I64), &mut zeros(&[4], DType::I64)), E::Any, &["i64"]));
    a.case("rms_norm: rstd of another dtype", || err(k::rms_norm(&x, &mut zeros(&[3, 4], f), &mut zeros(&[3], DType::BF16), 1e-5), E::DType, &["`rstd`", "f32"]));
    a.case("rms_norm: rstd of another length", || err(k::rms_norm(&x, &mut zeros(&[3, 4], f), &mut zeros(&[4], f), 1e-5), E::Shape, &["`rstd`"]));
    a.case("gemm: c of the wrong shape", || err(k::gemm(&t(&[2, 3], f), &t(&[3, 4], f), &mut zeros(&[4, 2], f)), E::Shape, &["`c`"]));
    a.case("gemm: empty c", || {
        let mut c = zeros(&[0, 4], f);
        ok(k::gemm(&t(&[0, 3], f), &t(&[3, 4], f), &mut c))?;
        close(&c, &[0, 4], f, &[], 0.0)
    });
    a.case("gemm: K = 0 stores zeros", || {
        let mut c = common::poisoned(&[2, 3], f, &cpu());
        ok(k::gemm(&zeros(&[2, 0], f), &zeros(&[0, 3], f), &mut c))?;
        close(&c, &[2, 3], f, &[0.0; 6], 0.0)
    });
    a.case("scale by NaN", || {
        let mut o = zeros(&[12], f);
        ok(k::scale(&flat, &mut o, f32::NAN))?;
        close(&o, &[12], f, &[f64::NAN; 12], 0.0)
    });
    a.finish();
}

// ---------------------------------------------------------------------------------------
// RoPE.

/// Half-split or interleaved RoPE of `x` (`[T, H, D]` row-major) at `pos`, in f64.
fn rope_ref(x: &[f64], pos: &[f64], h: usize, d: usize, layout: RopeLayout) -> Vec<f64> {
    let mut out = x.to_vec();
    for (ti, &p) in pos.iter().enumerate() {
        for hi in 0..h {
            for j in 0..d / 2 {
                let th = p * 10000f64.powf(-2.0 * j as f64 / d as f64);
                let (i1, i2) = match layout {
                    RopeLayout::HalfSplit => (j, j + d / 2),
                    RopeLayout::Interleaved => (2 * j, 2 * j + 1),
                };
                let base = (ti * h + hi) * d;
                let (x1, x2) = (x[base + i1], x[base + i2]);
                out[base + i1] = x1 * th.cos() - x2 * th.sin();
                out[base + i2] = x2 * th.cos() + x1 * th.sin();
            }
        }
    }
    out
}

#[test]
fn rope_edges() {
    let mut a = Audit::new("rope");
    let f = DType::F32;
    let def = RopeOptions::default();
    let run = |q: &mut Tensor, kk: &mut Tensor, o: &RopeOptions| ops::rope(q, kk, o);
    // head dims: odd, zero, one
    for d in [1usize, 3, 7] {
        a.case(&format!("odd head dim {d}"), || err(run(&mut t(&[4, 2, d], f), &mut t(&[4, 1, d], f), &def), E::Invalid, &["even", &d.to_string()]));
    }
    a.case("head dim 0: nothing to rotate", || {
        let (mut q, mut kk) = (t(&[4, 2, 0], f), t(&[4, 1, 0], f));
        ok(run(&mut q, &mut kk, &def))?;
        close(&q, &[4, 2, 0], f, &[], 0.0)
    });
    a.case("head dim 0 with [P, 0] tables", || {
        let c0 = zeros(&[8, 0], f);
        ok(run(&mut t(&[4, 2, 0], f), &mut t(&[4, 1, 0], f), &RopeOptions { freqs: Freqs::Table { cos: &c0, sin: &c0 }, ..def }))
    });
    // zero heads on one side, zero tokens
    a.case("no q heads: k still rotated", || {
        let (kk, kv) = rt(&[3, 2, 4], f, 1);
        let mut kk = kk;
        ok(run(&mut zeros(&[3, 0, 4], f), &mut kk, &RopeOptions { positions: Positions::Offset(2), ..def }))?;
        close(&kk, &[3, 2, 4], f, &rope_ref(&kv, &[2.0, 3.0, 4.0], 2, 4, RopeLayout::HalfSplit), 1e-5)
    });
    a.case("[2, MAX, 0, 4]: B · S overflows, no heads", || ok(run(&mut zeros(&[2, usize::MAX, 0, 4], f), &mut zeros(&[2, usize::MAX, 0, 4], f), &def)));
    a.case("no heads at all", || ok(run(&mut zeros(&[3, 0, 4], f), &mut zeros(&[3, 0, 4], f), &def)));
    a.case("no tokens, [B, 0, H, D]", || ok(run(&mut zeros(&[2, 0, 1, 4], f), &mut zeros(&[2, 0, 1, 4], f), &def)));
    a.case("no tokens with an empty positions tensor", || {
        let p = zeros(&[0], DType::I64);
        ok(run(&mut zeros(&[0, 1, 4], f), &mut zeros(&[0, 1, 4], f), &RopeOptions { positions: Positions::Tensor(&p), ..def }))
    });
    // ranks
    for (sq, sk) in [(vec![], vec![]), (vec![4], vec![4]), (vec![4, 8], vec![4, 8]), (vec![1, 2, 3, 1, 4], vec![1, 2, 3, 1, 4])] {
        a.case(&format!("q {sq:?}, k {sk:?}"), || err(run(&mut t(&sq, f), &mut t(&sk, f), &def), E::Shape, &["[B, S, H, D] or [T, H, D]"]));
    }
    a.case("q rank 3, k rank 4", || err(run(&mut t(&[4, 1, 4], f), &mut t(&[1, 4, 1, 4], f), &def), E::Shape, &["same rank"]));
    // dtypes
    a.case("q, k i64", || err(run(&mut zeros(&[2, 1, 4], DType::I64), &mut zeros(&[2, 1, 4], DType::I64), &def), E::DType, &["i64"]));
    a.case("q f32, k f16", || err(run(&mut t(&[2, 1, 4], f), &mut t(&[2, 1, 4], DType::F16), &def), E::DType, &["f32", "f16"]));
    // positions of the wrong dtype, length or rank
    let (mut q, mut kk) = (t(&[2, 3, 1, 4], f), t(&[2, 3, 1, 4], f));
    for (p, kind, words) in [
        (zeros(&[6], f), E::DType, vec!["positions must be i64", "f32"]),
        (zeros(&[6], DType::F16), E::DType, vec!["positions must be i64"]),
        (zeros(&[5], DType::I64), E::Shape, vec!["[6] or [2, 3]", "[5]"]),
        (zeros(&[7], DType::I64), E::Shape, vec!["[6] or [2, 3]"]),
        (zeros(&[0], DType::I64), E::Shape, vec!["[6] or [2, 3]"]),
        (zeros(&[], DType::I64), E::Shape, vec!["[6] or [2, 3]"]),
        (zeros(&[3, 2], DType::I64), E::Shape, vec!["[6] or [2, 3]"]),
        (zeros(&[1, 6], DType::I64), E::Shape, vec!["[6] or [2, 3]"]),
        (zeros(&[2, 3, 1], DType::I64), E::Shape, vec!["[6] or [2, 3]"]),
    ] {
        a.case(&format!("positions {} {:?}", p.dtype(), p.shape()), || err(run(&mut q, &mut kk, &RopeOptions { positions: Positions::Tensor(&p), ..def }), kind, &words));
    }
    a.case("positions [B, S] for [T, H, D] inputs", || {
        let p = zeros(&[2, 3], DType::I64);
        err(run(&mut t(&[6, 1, 4], f), &mut t(&[6, 1, 4], f), &RopeOptions { positions: Positions::Tensor(&p), ..def }), E::Shape, &["[6]"])
    });
    a.case("positions [B, S] as a transposed view: one launch per batch", || {
        let p = Tensor::from_f64(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2], DType::I64, &cpu()).unwrap().t();
        let pc = ok(p.contiguous())?;
        let (mut q1, mut k1) = (ok(q.deep_clone())?, ok(kk.deep_clone())?);
        let (mut q2, mut k2) = (ok(q.deep_clone())?, ok(kk.deep_clone())?);
        ok(run(&mut q1, &mut k1, &RopeOptions { positions: Positions::Tensor(&p), ..def }))?;
        ok(run(&mut q2, &mut k2, &RopeOptions { positions: Positions::Tensor(&pc), ..def }))?;
        close(&q1, &[2, 3, 1, 4], f, &ok(q2.to_vec_f64())?, 0.0)?;
        close(&k1, &[2, 3, 1, 4], f, &ok(k2.to_vec_f64())?, 0.0)
    });
    a.case("positions [T] as a row slice with an offset", || {
        let pv: Vec<f64> = vec![9.0, 0.0, 3.0, 1.0, 2.0, 7.0];
        let base = Tensor::from_f64(&[vec![-1.0; 6], pv.clone()].concat(), &[2, 6], DType::I64, &cpu()).unwrap();
        let p = ok(ok(base.narrow(0, 1, 1))?.reshape(&[6]))?;
        let (q0, qv) = rt(&[6, 1, 4], f, 2);
        let (mut q0, mut k0) = (q0, zeros(&[6, 1, 4], f));
        ok(run(&mut q0, &mut k0, &RopeOptions { positions: Positions::Tensor(&p), ..def }))?;
        close(&q0, &[6, 1, 4], f, &rope_ref(&qv, &pv, 1, 4, RopeLayout::HalfSplit), 1e-5)
    });
    // offsets whose positions overflow i64
    for (off, s) in [(i64::MAX, 2usize), (i64::MAX - 1, 3)] {
        a.case(&format!("offset {off} with {s} tokens a sequence (computed angles)"), || {
            err(run(&mut t(&[1, s, 1, 4], f), &mut t(&[1, s, 1, 4], f), &RopeOptions { positions: Positions::Offset(off), ..def }), E::Invalid, &["positions", "i64"])
        });
    }
    a.case("offset i64::MAX with 1 token a sequence (representable)", || {
        ok(run(&mut t(&[2, 1, 1, 4], f), &mut t(&[2, 1, 1, 4], f), &RopeOptions { positions: Positions::Offset(i64::MAX), ..def }))
    });
    a.case("offset i64::MAX with tables", || {
        let c8 = zeros(&[8, 2], f);
        err(
            run(&mut t(&[1, 2, 1, 4], f), &mut t(&[1, 2, 1, 4], f), &RopeOptions { positions: Positions::Offset(i64::MAX), freqs: Freqs::Table { cos: &c8, sin: &c8 }, ..def }),
            E::Invalid,
            &["outside"],
        )
    });
    a.case("negative offset with computed angles: rotation by negative angles", || {
        let (q0, qv) = rt(&[3, 1, 4], f, 3);
        let mut q0 = q0;
        ok(run(&mut q0, &mut zeros(&[3, 1, 4], f), &RopeOptions { positions: Positions::Offset(-2), layout: RopeLayout::Interleaved, ..def }))?;
        close(&q0, &[3, 1, 4], f, &rope_ref(&qv, &[-2.0, -1.0, 0.0], 1, 4, RopeLayout::Interleaved), 1e-5)
    });
    // bases
    for base in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        a.case(&format!("base {base}"), || err(run(&mut t(&[2, 1, 4], f), &mut t(&[2, 1, 4], f), &RopeOptions { freqs: Freqs::Computed { base }, ..def }), E::Invalid, &["base"]));
    }
    // tables
    for (cs, ss, kind) in [
        (zeros(&[8], f), zeros(&[8], f), E::Shape),
        (zeros(&[8, 4], f), zeros(&[8, 4], f), E::Shape),
        (zeros(&[8, 2], f), zeros(&[7, 2], f), E::Shape),
        (zeros(&[8, 2, 1], f), zeros(&[8, 2, 1], f), E::Shape),
        (zeros(&[8, 2], DType::I64), zeros(&[8, 2], DType::I64), E::DType),
        (zeros(&[8, 2], f), zeros(&[8, 2], DType::BF16), E::DType),
    ] {
        a.case(&format!("tables {} {:?} / {} {:?}", cs.dtype(), cs.shape(), ss.dtype(), ss.shape()), || {
            err(run(&mut t(&[2, 1, 4], f), &mut t(&[2, 1, 4], f), &RopeOptions { freqs: Freqs::Table { cos: &cs, sin: &ss }, ..def }), kind, &["cos and sin tables"])
        });
    }
    a.case("tables with no rows and an offset", || {
        let c0 = zeros(&[0, 2], f);
        err(run(&mut t(&[2, 1, 4], f), &mut t(&[2, 1, 4], f), &RopeOptions { freqs: Freqs::Table { cos: &c0, sin: &c0 }, ..def }), E::Invalid, &["outside the 0 rows"])
    });
    a.case("transposed tables and positions outside them (left unchanged)", || {
        let p = 6usize;
        let mut cv = vec![0.0; p * 2];
        let mut sv = vec![0.0; p * 2];
        for r in 0..p {
            for j in 0..2 {
                let th = r as f64 * 10000f64.powf(-2.0 * j as f64 / 4.0);
                cv[j * p + r] = th.cos() as f32 as f64;
                sv[j * p + r] = th.sin() as f32 as f64;
            }
        }
        let ct = Tensor::from_f64(&cv, &[2, p], f, &cpu()).unwrap().t();
        let st = Tensor::from_f64(&sv, &[2, p], f, &cpu()).unwrap().t();
        let pos = Tensor::from_f64(&[1.0, -1.0, 5.0, 6.0], &[4], DType::I64, &cpu()).unwrap();
        let (q0, qv) = rt(&[4, 1, 4], f, 4);
        let mut q0 = q0;
        ok(run(&mut q0, &mut zeros(&[4, 1, 4], f), &RopeOptions { positions: Positions::Tensor(&pos), freqs: Freqs::Table { cos: &ct, sin: &st }, ..def }))?;
        let mut want = rope_ref(&qv, &[1.0, 0.0, 5.0, 0.0], 1, 4, RopeLayout::HalfSplit);
        want[4..8].copy_from_slice(&qv[4..8]); // position -1: unchanged
        want[12..16].copy_from_slice(&qv[12..16]); // position 6: past the table, unchanged
        close(&q0, &[4, 1, 4], f, &want, 1e-5)
    });
    // strided q (rotated where it lies) and aliasing
    a.case("q as a transposed view", || {
        let big = t(&[4, 1, 3], f);
        let mut qs = ok(big.permute(&[2, 1, 0]))?;
        let mut qc = ok(qs.contiguous())?;
        ok(run(&mut qs, &mut t(&[3, 1, 4], f), &def))?;
        ok(run(&mut qc, &mut t(&[3, 1, 4], f), &def))?;
        close(&qs, &[3, 1, 4], f, &ok(qc.to_vec_f64())?, 0.0)
    });
    a.case("q and k the same tensor", || {
        let s = t(&[3, 1, 4], f);
        let (mut q0, mut k0) = (s.clone(), s.clone());
        err(run(&mut q0, &mut k0, &def), E::Alias, &["share storage"])
    });
    a.finish();
}
