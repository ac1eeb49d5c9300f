//! Adversarial launches of kernels a user writes (`#[kfuse]` functions of this file,
//! not `kfuse::ops`): wrong dtypes for a generic, wrong ranks, shape symbols that
//! disagree, empty and huge-but-empty shapes, strided views as inputs and outputs,
//! aliasing, integer tensors where floats are needed, NaN and extreme scalars, and
//! extents the tile sizes do not divide. Every case asserts one outcome — an `Err` of
//! the right kind whose message names the problem, or `Ok` with values checked against
//! a float64 reference — and runs under `catch_unwind` (`common::audit`, shared
//! with `tests/api_edges.rs`). CPU device (the interpreter) only, small shapes.

mod common;

use common::audit::{close_values as close, cpu, err, ok, rt, t, zeros, Audit, E, R};

use kfuse::prelude::*;
use kfuse::runtime::{launch, Arg, Scalar};
use kfuse::DType;

/// `out = a·x + y`, one `[BM, BN]` tile per program (a 2-D grid).
#[kfuse]
pub fn axpy2d<T: Float>(x: Tensor<T, (M, N)>, y: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>, a: f32) {
    let (i, j) = (program_id(0), program_id(1));
    let v = x.block([i * BM, j * BN], [BM, BN]).load().to_f32() * a + y.block([i * BM, j * BN], [BM, BN]).load().to_f32();
    out.block([i * BM, j * BN], [BM, BN]).store(v.cast::<T>());
}

/// Row sums into an f32 vector, `BM` full rows per program.
#[kfuse]
pub fn row_sums<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<f32, (M,)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    out.block([i * BM], [BM]).store(t.sum_axis(1));
}

/// Each row minus its maximum, times `s` (a keep-dim reduction and a scalar).
#[kfuse]
pub fn scaled_from_max<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>, s: f32) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    out.block([i * BM, 0], [BM, N]).store(((t - t.max_keepdim(1)) * s).cast::<T>());
}

/// `out[j] = x[j + k]` where `j + k` is in range; other lanes of `out` are not written.
#[kfuse]
pub fn shifted<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, k: i64) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(x.block([i * BN + k], [BN]).load());
}

/// Concrete dtypes: `out = x + w` with `x: f32`, `w: bf16` broadcast along rows.
#[kfuse]
pub fn add_bias(x: Tensor<f32, (M, N)>, w: Tensor<bf16, (N,)>, out: &mut Tensor<f32, (M, N)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load();
    out.block([i * BM, 0], [BM, N]).store(t + w.load().to_f32());
}

/// Two generics: `out: U = exp(x: T)`.
#[kfuse]
pub fn exp_to<T: Float, U: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<U, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(exp(x.block([i * BN], [BN]).load().to_f32()).cast::<U>());
}

/// Row sums and row maxima: two outputs.
#[kfuse]
pub fn sums_and_maxes<T: Float>(x: Tensor<T, (M, N)>, sums: &mut Tensor<f32, (M,)>, maxes: &mut Tensor<T, (M,)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load();
    sums.block([i * BM], [BM]).store(t.to_f32().sum_axis(1));
    maxes.block([i * BM], [BM]).store(t.max_axis(1));
}

/// A launch that ran (not skipped) on the interpreter.
fn ran(r: kfuse::Result<kfuse::Launched>) -> R {
    let l = ok(r)?;
    if l.skipped_empty {
        return Err("the launch was skipped as empty".into());
    }
    Ok(())
}

/// A launch that was skipped as empty.
fn skipped(r: kfuse::Result<kfuse::Launched>) -> R {
    let l = ok(r)?;
    if !l.skipped_empty {
        return Err("the launch ran; expected it skipped as empty".into());
    }
    Ok(())
}

fn full(shape: &[usize], v: f64, dt: DType) -> Tensor {
    Tensor::full(shape, v, dt, &cpu()).unwrap()
}

/// Row-major values of the `[rows, cols]` transpose of row-major `v` (`[cols, rows]`).
fn transposed(v: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows * cols).map(|k| v[(k % cols) * rows + k / cols]).collect()
}

fn axpy_ref(a: f64, x: &[f64], y: &[f64], dt: DType) -> Vec<f64> {
    x.iter().zip(y).map(|(x, y)| dt.round(a * x + y)).collect()
}

fn row_sums_ref(x: &[f64], n: usize) -> Vec<f64> {
    if n == 0 {
        return Vec::new();
    }
    x.chunks(n).map(|r| r.iter().sum()).collect()
}

fn from_max_ref(x: &[f64], n: usize, s: f64) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|r| {
            let mx = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            r.iter().map(move |v| (v - mx) * s).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn dtypes_and_ranks() {
    let mut a = Audit::new("dtypes_and_ranks");
    let f = DType::F32;
    // the generic T is bound by the first tensor and checked against the rest
    a.case("axpy2d f32 x, bf16 y", || err(axpy2d(&t(&[3, 4], f), &t(&[3, 4], DType::BF16), &mut zeros(&[3, 4], f), 1.0), E::DType, &["`y`", "bf16", "T = f32"]));
    a.case("axpy2d f16 out for f32 inputs", || err(axpy2d(&t(&[3, 4], f), &t(&[3, 4], f), &mut zeros(&[3, 4], DType::F16), 1.0), E::DType, &["`out`", "f16", "T = f32"]));
    // a concrete f32 output of a generic kernel
    a.case("row_sums bf16 out (declared f32)", || err(row_sums(&t(&[3, 4], DType::BF16), &mut zeros(&[3], DType::BF16)), E::DType, &["`out`", "bf16", "f32"]));
    a.case("add_bias f16 w (declared bf16)", || err(add_bias(&t(&[2, 3], f), &t(&[3], DType::F16), &mut zeros(&[2, 3], f)), E::DType, &["`w`", "f16", "bf16"]));
    a.case("add_bias i64 x (declared f32)", || err(add_bias(&zeros(&[2, 3], DType::I64), &t(&[3], DType::BF16), &mut zeros(&[2, 3], f)), E::DType, &["`x`", "i64", "f32"]));
    // integer tensors for a `T: Float`
    a.case("axpy2d i64 everywhere", || {
        let (x, y) = (zeros(&[2, 3], DType::I64), zeros(&[2, 3], DType::I64));
        err(axpy2d(&x, &y, &mut zeros(&[2, 3], DType::I64), 1.0), E::Ir, &["axpy2d", "float dtype", "`T`", "i64"])
    });
    a.case("row_sums i64 x", || err(row_sums(&zeros(&[2, 3], DType::I64), &mut zeros(&[2], f)), E::Ir, &["row_sums", "float dtype", "`T`", "i64"]));
    a.case("scaled_from_max empty i64", || err(scaled_from_max(&zeros(&[0, 3], DType::I64), &mut zeros(&[0, 3], DType::I64), 1.0), E::Ir, &["float dtype", "`T`", "i64"]));
    a.case("exp_to f32 -> i64 (second generic)", || err(exp_to(&t(&[5], f), &mut zeros(&[5], DType::I64)), E::Ir, &["float dtype", "`U`", "i64"]));
    a.case("exp_to bf16 -> f16: two generics bound apart", || {
        let (x, xv) = rt(&[37], DType::BF16, 5);
        let mut out = full(&[37], 9.0, DType::F16);
        ran(exp_to(&x, &mut out))?;
        close(&out, &xv.iter().map(|v| DType::F16.round(v.exp())).collect::<Vec<_>>(), 1e-6)
    });
    // fp8 tensors are floats: they bind `T` and compute through f32
    for dt in [DType::F8E4M3, DType::F8E5M2] {
        a.case(&format!("axpy2d {dt} [5, 19]"), || {
            let ((x, xv), (y, yv)) = (rt(&[5, 19], dt, 11), rt(&[5, 19], dt, 12));
            let mut out = common::poisoned(&[5, 19], dt, &cpu());
            ran(axpy2d(&x, &y, &mut out, 0.5))?;
            close(&out, &axpy_ref(0.5, &xv, &yv, dt), 1e-6)
        });
    }
    // ranks
    a.case("axpy2d rank-1 x", || err(axpy2d(&t(&[12], f), &t(&[3, 4], f), &mut zeros(&[3, 4], f), 1.0), E::Shape, &["`x`", "2 dimension", "[12]"]));
    a.case("axpy2d rank-3 out", || err(axpy2d(&t(&[3, 4], f), &t(&[3, 4], f), &mut zeros(&[1, 3, 4], f), 1.0), E::Shape, &["`out`", "[1, 3, 4]"]));
    a.case("row_sums rank-0 x", || err(row_sums(&t(&[], f), &mut zeros(&[1], f)), E::Shape, &["`x`", "[]"]));
    a.case("row_sums rank-2 out [3, 1]", || err(row_sums(&t(&[3, 4], f), &mut zeros(&[3, 1], f)), E::Shape, &["`out`", "[3, 1]"]));
    a.case("shifted rank-2 x", || err(shifted(&t(&[2, 2], f), &mut zeros(&[4], f), 0), E::Shape, &["`x`", "[2, 2]"]));
    // the raw launcher: count and kinds of arguments, scalar dtypes
    a.case("launch with too few arguments", || {
        let x = t(&[4], f);
        err(launch(&shifted::DEF, &mut [Arg::In(&x)]), E::Invalid, &["takes 3 argument", "1 were given"])
    });
    a.case("launch with a tensor for the scalar", || {
        let (x, y) = (t(&[4], f), t(&[4], f));
        let mut out = zeros(&[4], f);
        err(launch(&shifted::DEF, &mut [Arg::In(&x), Arg::Out(&mut out), Arg::In(&y)]), E::Invalid, &["`k`", "i64 scalar"])
    });
    a.case("launch with an input for the output", || {
        let x = t(&[4], f);
        let out = zeros(&[4], f);
        err(launch(&shifted::DEF, &mut [Arg::In(&x), Arg::In(&out), Arg::Scalar(Scalar::I64(0))]), E::Invalid, &["`out`", "Arg::Out"])
    });
    a.case("launch with an f32 scalar for i64 `k`", || {
        let x = t(&[4], f);
        let mut out = zeros(&[4], f);
        err(launch(&shifted::DEF, &mut [Arg::In(&x), Arg::Out(&mut out), Arg::Scalar(Scalar::F32(1.0))]), E::DType, &["`k`", "i64", "F32"])
    });
    a.case("launch with an i64 scalar for f32 `a`", || {
        let (x, y) = (t(&[2, 2], f), t(&[2, 2], f));
        let mut out = zeros(&[2, 2], f);
        err(launch(&axpy2d::DEF, &mut [Arg::In(&x), Arg::In(&y), Arg::Out(&mut out), Arg::Scalar(Scalar::I64(1))]), E::DType, &["`a`", "f32", "I64"])
    });
    a.finish();
}

#[test]
fn shapes() {
    let mut a = Audit::new("shapes");
    let f = DType::F32;
    // shape symbols shared between parameters must agree
    a.case("axpy2d x [3, 4], y [4, 3]", || err(axpy2d(&t(&[3, 4], f), &t(&[4, 3], f), &mut zeros(&[3, 4], f), 1.0), E::Shape, &["`y`", "(M)", "4", "3"]));
    a.case("axpy2d out [3, 5]", || err(axpy2d(&t(&[3, 4], f), &t(&[3, 4], f), &mut zeros(&[3, 5], f), 1.0), E::Shape, &["`out`", "(N)", "5"]));
    a.case("axpy2d out [0, 4] for [3, 4] inputs", || err(axpy2d(&t(&[3, 4], f), &t(&[3, 4], f), &mut zeros(&[0, 4], f), 1.0), E::Shape, &["`out`", "(M)"]));
    a.case("axpy2d x [0, 4], y [3, 4]", || err(axpy2d(&zeros(&[0, 4], f), &t(&[3, 4], f), &mut zeros(&[3, 4], f), 1.0), E::Shape, &["`y`", "(M)"]));
    a.case("row_sums out [4] for x [3, 4]", || err(row_sums(&t(&[3, 4], f), &mut zeros(&[4], f)), E::Shape, &["`out`", "(M)", "4", "3"]));
    a.case("row_sums out [0] for x [3, 4]", || err(row_sums(&t(&[3, 4], f), &mut zeros(&[0], f)), E::Shape, &["`out`", "(M)"]));
    a.case("add_bias w [4] for x [2, 3]", || err(add_bias(&t(&[2, 3], f), &t(&[4], DType::BF16), &mut zeros(&[2, 3], f)), E::Shape, &["`w`", "(N)"]));
    a.case("axpy2d huge empty x against a small y", || {
        err(axpy2d(&zeros(&[usize::MAX, 0], f), &zeros(&[3, 0], f), &mut zeros(&[3, 0], f), 1.0), E::Shape, &["`y`", "(M)"])
    });
    // empty and huge-but-empty shapes: nothing to do, no allocation, no overflow
    for shape in [[0, 0], [0, 5], [5, 0], [0, usize::MAX], [usize::MAX, 0], [1 << 40, 0]] {
        a.case(&format!("axpy2d {shape:?}"), || skipped(axpy2d(&zeros(&shape, f), &zeros(&shape, f), &mut zeros(&shape, f), 2.0)));
        a.case(&format!("scaled_from_max {shape:?}"), || skipped(scaled_from_max(&zeros(&shape, f), &mut zeros(&shape, f), f32::NAN)));
    }
    a.case("row_sums [0, MAX] -> [0]", || skipped(row_sums(&zeros(&[0, usize::MAX], f), &mut zeros(&[0], f))));
    a.case("row_sums [MAX, 0] -> [MAX] cannot be allocated", || err(Tensor::zeros(&[usize::MAX], f, &cpu()), E::Invalid, &["too large"]));
    // rows of no elements: the sum over nothing is 0 (written, not skipped)
    a.case("row_sums [5, 0] -> [5] zeros", || {
        let mut out = full(&[5], 7.0, f);
        ok(row_sums(&zeros(&[5, 0], f), &mut out))?;
        close(&out, &[0.0; 5], 0.0)
    });
    a.case("shifted [0]", || skipped(shifted(&zeros(&[0], f), &mut zeros(&[0], f), 3)));
    a.case("exp_to [0] bf16 -> f32", || skipped(exp_to(&zeros(&[0], DType::BF16), &mut zeros(&[0], f))));
    a.finish();
}

#[test]
fn values_and_masking() {
    let mut a = Audit::new("values_and_masking");
    // extents the default tile sizes (16) do not divide: edges are masked
    for dt in common::DTYPES {
        for &(m, n) in &[(1, 1), (1, 17), (17, 1), (15, 33), (33, 15), (16, 16), (47, 5)] {
            a.case(&format!("axpy2d {dt} [{m}, {n}]"), || {
                let ((x, xv), (y, yv)) = (rt(&[m, n], dt, 1 + m as u64), rt(&[m, n], dt, 2 + n as u64));
                let mut out = common::poisoned(&[m, n], dt, &cpu());
                ran(axpy2d(&x, &y, &mut out, -1.5))?;
                close(&out, &axpy_ref(-1.5, &xv, &yv, dt), 1e-6)
            });
            a.case(&format!("row_sums {dt} [{m}, {n}]"), || {
                let (x, xv) = rt(&[m, n], dt, 3 + m as u64);
                let mut out = common::poisoned(&[m], DType::F32, &cpu());
                ran(row_sums(&x, &mut out))?;
                close(&out, &row_sums_ref(&xv, n), 1e-6)
            });
            a.case(&format!("scaled_from_max {dt} [{m}, {n}]"), || {
                let (x, xv) = rt(&[m, n], dt, 4 + n as u64);
                let mut out = common::poisoned(&[m, n], dt, &cpu());
                ran(scaled_from_max(&x, &mut out, 0.25))?;
                let want: Vec<f64> = from_max_ref(&xv, n, 0.25).into_iter().map(|v| dt.round(v)).collect();
                close(&out, &want, 1e-6)
            });
        }
    }
    let f = DType::F32;
    // scalars: NaN and ±inf propagate; they are data, not errors
    a.case("axpy2d a = NaN", || {
        let mut out = zeros(&[3, 5], f);
        ran(axpy2d(&t(&[3, 5], f), &t(&[3, 5], f), &mut out, f32::NAN))?;
        close(&out, &[f64::NAN; 15], 0.0)
    });
    a.case("axpy2d a = inf, x = 1", || {
        let mut out = zeros(&[2, 3], f);
        ran(axpy2d(&full(&[2, 3], 1.0, f), &full(&[2, 3], -5.0, f), &mut out, f32::INFINITY))?;
        close(&out, &[f64::INFINITY; 6], 0.0)
    });
    a.case("axpy2d a = inf, x = 0 gives NaN", || {
        let mut out = zeros(&[2, 3], f);
        ran(axpy2d(&zeros(&[2, 3], f), &full(&[2, 3], -5.0, f), &mut out, f32::INFINITY))?;
        close(&out, &[f64::NAN; 6], 0.0)
    });
    a.case("axpy2d a = 1e30 overflows bf16 to inf", || {
        let mut out = zeros(&[1, 2], DType::BF16);
        ran(axpy2d(&full(&[1, 2], 1e10, DType::BF16), &zeros(&[1, 2], DType::BF16), &mut out, 1e30))?;
        close(&out, &[f64::INFINITY; 2], 0.0)
    });
    a.case("scaled_from_max s = NaN", || {
        let mut out = zeros(&[4, 3], f);
        ran(scaled_from_max(&t(&[4, 3], f), &mut out, f32::NAN))?;
        close(&out, &[f64::NAN; 12], 0.0)
    });
    a.case("scaled_from_max of a row with NaN and -inf", || {
        let x = ok(Tensor::from_f64(&[1.0, f64::NAN, 2.0, f64::NEG_INFINITY, 0.0, 3.0], &[2, 3], f, &cpu()))?;
        let mut out = zeros(&[2, 3], f);
        ran(scaled_from_max(&x, &mut out, 1.0))?;
        let got = ok(out.to_vec_f64())?;
        // row 1: max 3, finite lanes exact, -inf stays -inf
        if got[3] != f64::NEG_INFINITY || got[4] != -3.0 || got[5] != 0.0 {
            return Err(format!("row 1: {:?}", &got[3..]));
        }
        // row 0 holds a NaN: at least that lane is NaN
        if !got[1].is_nan() {
            return Err(format!("row 0: {:?}", &got[..3]));
        }
        Ok(())
    });
    // an i64 offset: out-of-range lanes are masked on the load and left unwritten
    for k in [0i64, 1, 5, -3, 16, 17, -17, 40, -40, i64::MAX, i64::MIN, i64::MAX - 7, i64::MIN + 1] {
        a.case(&format!("shifted k = {k}"), || {
            let n = 37usize;
            let (x, xv) = rt(&[n], f, 9);
            let mut out = full(&[n], 1234.0, f);
            ran(shifted(&x, &mut out, k))?;
            let want: Vec<f64> = (0..n as i64).map(|j| match j.checked_add(k) { Some(s) if (0..n as i64).contains(&s) => xv[s as usize], _ => 1234.0 }).collect();
            close(&out, &want, 0.0)
        });
    }
    a.finish();
}

#[test]
fn views_and_aliasing() {
    let mut a = Audit::new("views_and_aliasing");
    let f = DType::F32;
    // strided inputs are read through their strides
    a.case("axpy2d transposed x, narrowed y", || {
        let (xb, xbv) = rt(&[5, 3], f, 21); // x = xb^T: [3, 5]
        let (yb, ybv) = rt(&[3, 9], f, 22); // y = yb[:, 2..7]
        let x = xb.t();
        let y = ok(yb.narrow(1, 2, 5))?;
        let xv = transposed(&xbv, 3, 5);
        let yv: Vec<f64> = (0..15).map(|k| ybv[(k / 5) * 9 + 2 + k % 5]).collect();
        let mut out = zeros(&[3, 5], f);
        ran(axpy2d(&x, &y, &mut out, 2.0))?;
        close(&out, &axpy_ref(2.0, &xv, &yv, f), 1e-6)
    });
    a.case("row_sums of a transposed [17, 19] view", || {
        let (xb, xbv) = rt(&[19, 17], DType::BF16, 23);
        let mut out = zeros(&[17], f);
        ran(row_sums(&xb.t(), &mut out))?;
        close(&out, &row_sums_ref(&transposed(&xbv, 17, 19), 19), 1e-6)
    });
    a.case("row_sums of a narrowed transposed view (strides [1, 6])", || {
        // [4, 6] viewed as rows 1..3 of its transpose: [2, 4] with strides [1, 6]
        let (xb, xbv) = rt(&[4, 6], f, 24);
        let x = ok(xb.t().narrow(0, 1, 2))?;
        let mut out = zeros(&[2], f);
        ran(row_sums(&x, &mut out))?;
        let want: Vec<f64> = (1..3).map(|c| (0..4).map(|r| xbv[r * 6 + c]).sum()).collect();
        close(&out, &want, 1e-6)
    });
    a.case("add_bias with w a row of a matrix (an offset view)", || {
        let (wb, wbv) = rt(&[2, 6], DType::BF16, 25);
        let w = ok(ok(wb.narrow(0, 1, 1))?.reshape(&[6]))?;
        let (x, xv) = rt(&[3, 6], f, 26);
        let mut out = zeros(&[3, 6], f);
        ran(add_bias(&x, &w, &mut out))?;
        close(&out, &(0..18).map(|k| xv[k] + wbv[6 + k % 6]).collect::<Vec<_>>(), 1e-6)
    });
    // strided outputs are written through their strides, and only there
    a.case("axpy2d into a transposed output", || {
        let ((x, xv), (y, yv)) = (rt(&[4, 7], f, 27), rt(&[4, 7], f, 28));
        let base = full(&[7, 4], 99.0, f);
        let mut out = base.t();
        ran(axpy2d(&x, &y, &mut out, 0.5))?;
        close(&out, &axpy_ref(0.5, &xv, &yv, f), 1e-6)?;
        close(&base, &transposed(&axpy_ref(0.5, &xv, &yv, f), 7, 4), 1e-6)
    });
    a.case("row_sums into a narrowed output: the rest is untouched", || {
        let (x, xv) = rt(&[3, 5], f, 29);
        let base = full(&[8], -1.0, f);
        let mut out = ok(base.narrow(0, 2, 3))?;
        ran(row_sums(&x, &mut out))?;
        let mut want = vec![-1.0; 8];
        want[2..5].copy_from_slice(&row_sums_ref(&xv, 5));
        close(&base, &want, 1e-6)
    });
    a.case("scaled_from_max into a column slice [4, 2] of [4, 5]", || {
        let (x, xv) = rt(&[4, 2], f, 30);
        let base = full(&[4, 5], 7.0, f);
        let mut out = ok(base.narrow(1, 3, 2))?;
        ran(scaled_from_max(&x, &mut out, 2.0))?;
        let r = from_max_ref(&xv, 2, 2.0);
        let want: Vec<f64> = (0..20).map(|k| if k % 5 >= 3 { r[(k / 5) * 2 + k % 5 - 3] } else { 7.0 }).collect();
        close(&base, &want, 1e-6)
    });
    a.case("axpy2d into an unsqueezed [1, 6] output", || {
        let ((x, xv), (y, yv)) = (rt(&[1, 6], f, 31), rt(&[1, 6], f, 32));
        let base = zeros(&[6], f);
        let mut out = ok(base.unsqueeze(0))?;
        ran(axpy2d(&x, &y, &mut out, 3.0))?;
        close(&base, &axpy_ref(3.0, &xv, &yv, f), 1e-6)
    });
    // aliasing: an output may share storage with no other argument
    a.case("axpy2d out is x", || {
        let x = t(&[3, 4], f);
        let mut out = x.clone();
        err(axpy2d(&x, &t(&[3, 4], f), &mut out, 1.0), E::Alias, &["`out`", "`x`", "deep_clone"])
    });
    a.case("axpy2d out is x's transpose (square)", || {
        let x = t(&[4, 4], f);
        let mut out = x.t();
        err(axpy2d(&x, &t(&[4, 4], f), &mut out, 1.0), E::Alias, &["`out`", "`x`"])
    });
    a.case("axpy2d out and y: disjoint halves of one buffer", || {
        let base = t(&[2, 6], f);
        let y = ok(base.narrow(1, 0, 3))?;
        let mut out = ok(base.narrow(1, 3, 3))?;
        err(axpy2d(&t(&[2, 3], f), &y, &mut out, 1.0), E::Alias, &["`out`", "`y`"])
    });
    a.case("shifted out is x (an in-place shift)", || {
        let x = t(&[20], f);
        let mut out = x.clone();
        err(shifted(&x, &mut out, 1), E::Alias, &["`out`", "`x`"])
    });
    a.case("row_sums out is a reshape of x's storage", || {
        let x = t(&[2, 2], f);
        let mut out = ok(ok(x.reshape(&[4]))?.narrow(0, 0, 2))?;
        err(row_sums(&x, &mut out), E::Alias, &["`out`", "`x`"])
    });
    a.case("empty output sharing x's storage", || {
        let x = t(&[4], f);
        let mut out = ok(x.narrow(0, 4, 0))?;
        err(shifted(&ok(x.narrow(0, 0, 0))?, &mut out, 0), E::Alias, &["`out`", "`x`"])
    });
    a.case("two outputs sharing one buffer", || {
        let base = zeros(&[6], DType::F32);
        let mut sums = ok(base.narrow(0, 0, 3))?;
        let mut maxes = ok(base.narrow(0, 3, 3))?;
        err(sums_and_maxes(&t(&[3, 4], f), &mut sums, &mut maxes), E::Alias, &["output `sums`", "output `maxes`"])
    });
    a.case("two outputs, one transposed input, ragged rows", || {
        let (xb, xbv) = rt(&[21, 18], f, 34);
        let x = xb.t(); // [18, 21]
        let xv = transposed(&xbv, 18, 21);
        let (mut sums, mut maxes) = (common::poisoned(&[18], f, &cpu()), common::poisoned(&[18], f, &cpu()));
        ran(sums_and_maxes(&x, &mut sums, &mut maxes))?;
        close(&sums, &row_sums_ref(&xv, 21), 1e-6)?;
        close(&maxes, &xv.chunks(21).map(|r| r.iter().cloned().fold(f64::NEG_INFINITY, f64::max)).collect::<Vec<_>>(), 0.0)
    });
    a.case("two outputs over rows of no elements: sum 0, max -inf", || {
        let (mut sums, mut maxes) = (full(&[3], 5.0, f), full(&[3], 5.0, f));
        ran(sums_and_maxes(&zeros(&[3, 0], f), &mut sums, &mut maxes))?;
        close(&sums, &[0.0; 3], 0.0)?;
        close(&maxes, &[f64::NEG_INFINITY; 3], 0.0)
    });
    // an input may appear twice
    a.case("axpy2d x == y (same tensor twice as input)", || {
        let (x, xv) = rt(&[3, 3], f, 33);
        let mut out = zeros(&[3, 3], f);
        ran(axpy2d(&x, &x, &mut out, 2.0))?;
        close(&out, &axpy_ref(2.0, &xv, &xv, f), 1e-6)
    });
    a.finish();
}

/// The whole of a small tensor, scaled: no `program_id`, so one program (the grid has
/// no axis).
#[kfuse]
pub fn scale_all<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>, s: f32) {
    out.store((x.load().to_f32() * s).cast::<T>());
}

/// A kernel without `program_id` compiles for the GPU (one program, an empty grid of
/// axes) and runs on the interpreter; code generation once panicked on its grid.
#[test]
fn a_kernel_without_program_ids_compiles_and_runs() {
    use kfuse::codegen::Target;
    use kfuse::runtime::{emit, ArgDesc};
    let desc = |shape: &[usize]| ArgDesc::tensor(DType::F32, shape);
    for target in [Target::sm80(), Target::sm90a()] {
        let emitted = emit(&scale_all::DEF, &[desc(&[3, 5]), desc(&[3, 5]), ArgDesc::Scalar(DType::F32)], &target);
        let emitted = emitted.unwrap_or_else(|e| panic!("{}: {e}", target.arch()));
        assert!(emitted.source.contains("__global__"), "{}", target.arch());
    }
    let (x, v) = rt(&[3, 5], DType::F32, 29);
    let mut out = kfuse::Tensor::empty(&[3, 5], DType::F32, &cpu()).expect("alloc");
    out.fill(f64::NAN).expect("poison");
    scale_all(&x, &mut out, 1.5).expect("launch");
    let want: Vec<f64> = v.iter().map(|a| a * 1.5).collect();
    close(&out, &want, 1e-6).expect("values");
}
