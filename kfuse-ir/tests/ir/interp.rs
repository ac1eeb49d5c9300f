//! The interpreter against plain-Rust references.

use half::{bf16, f16};
use kfuse_ir::interp::Arg;
use kfuse_ir::*;

use crate::common::*;

const SIZES_1D: [usize; 4] = [1, 7, 1000, 1_000_003];
const SHAPES_2D: [(usize, usize); 5] = [(1, 53), (37, 1), (37, 53), (1, 1), (16, 32)];

/// Runs `out = a + b` and checks every element and that the output was fully written.
fn check_add(k: &Kernel, dt: DType, n: usize, default_tile: u32, seed: u64) {
    let a = Host::random(dt, &[n], -4.0, 4.0, seed);
    let b = Host::random(dt, &[n], -4.0, 4.0, seed + 1);
    let mut out = Host::filled(dt, &[n], f64::NAN);
    run_with(k, &mut [a.arg(), b.arg(), out.arg_mut()], default_tile).unwrap();
    let want: Vec<f64> =
        a.to_vec().iter().zip(b.to_vec()).map(|(&x, y)| dt.round((x as f32 + y as f32) as f64)).collect();
    assert_exact(&out.to_vec(), &want, &format!("add {dt} n={n} tile={default_tile}"));
}

#[test]
fn add_1d_f32_odd_sizes_default_tile() {
    let k = add_1d(DType::F32);
    for (s, &n) in SIZES_1D.iter().enumerate() {
        check_add(&k, DType::F32, n, 16, s as u64);
    }
}

#[test]
fn add_1d_scheduled_tiles_64_and_128() {
    for tile in [64, 128] {
        let mut k = add_1d(DType::F32);
        set_tile(&mut k, "BN", tile);
        for (s, &n) in SIZES_1D.iter().enumerate() {
            // The schedule wins over the default tile.
            check_add(&k, DType::F32, n, 3, 10 + s as u64);
        }
    }
}

#[test]
fn add_1d_non_power_of_two_default_tile() {
    let k = add_1d(DType::F32);
    for &n in &[1, 7, 1000] {
        check_add(&k, DType::F32, n, 3, 20);
    }
}

#[test]
fn add_1d_bf16_and_f16_round_each_result() {
    for dt in [DType::BF16, DType::F16] {
        let k = add_1d(dt);
        check_add(&k, dt, 1000, 16, 30);
    }
    // A case where rounding matters: in bf16, 1 + 2^-9 is 1, and 256 + 1 is 256.
    let k = add_1d(DType::BF16);
    let a = Host::from_f64(DType::BF16, &[2], &[1.0, 256.0]);
    let b = Host::from_f64(DType::BF16, &[2], &[1.0 / 512.0, 1.0]);
    let mut out = Host::filled(DType::BF16, &[2], 0.0);
    run_with(&k, &mut [a.arg(), b.arg(), out.arg_mut()], 16).unwrap();
    assert_eq!(out.to_vec(), vec![1.0, 256.0]);
}

/// `out = (a * b) + c` in bf16: each op rounds, unlike a fused f32 computation.
#[test]
fn bf16_chain_rounds_every_op() {
    let mut b = Builder::new("fma_bf16");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let dt = DType::BF16;
    let ps: Vec<ParamId> = ["a", "b", "c"].iter().map(|s| b.tensor_param(s, dt, &[n], false)).collect();
    let po = b.tensor_param("out", dt, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let v: Vec<ValueId> = ps.iter().map(|p| b.load(*p, &[off], &d).unwrap()).collect();
    let ab = b.binary(BinaryOp::Mul, v[0], v[1]).unwrap();
    let r = b.binary(BinaryOp::Add, ab, v[2]).unwrap();
    b.store(po, &[off], &d, r).unwrap();
    let k = b.finish().unwrap();

    let n = 1000;
    let xs: Vec<Host> = (0..3).map(|s| Host::random(dt, &[n], -3.0, 3.0, 40 + s)).collect();
    let mut out = Host::filled(dt, &[n], f64::NAN);
    run_with(&k, &mut [xs[0].arg(), xs[1].arg(), xs[2].arg(), out.arg_mut()], 16).unwrap();
    let (a, bb, c) = (xs[0].to_vec(), xs[1].to_vec(), xs[2].to_vec());
    let r = |x: f32| bf16::from_f32(x).to_f32();
    let want: Vec<f64> = (0..n).map(|i| r(r(a[i] as f32 * bb[i] as f32) + c[i] as f32) as f64).collect();
    let fused: Vec<f64> = (0..n).map(|i| r(a[i] as f32 * bb[i] as f32 + c[i] as f32) as f64).collect();
    let got = out.to_vec();
    assert_exact(&got, &want, "bf16 a*b+c");
    assert!(got.iter().zip(&fused).any(|(g, f)| g != f), "the test data must tell rounded from fused");
}

#[test]
fn f16_rounding_and_overflow() {
    let k = binary_1d("mul", DType::F16, BinaryOp::Mul, DType::F16);
    let a = Host::from_f64(DType::F16, &[3], &[300.0, 1.0 / 3.0, -2.0]);
    let b = Host::from_f64(DType::F16, &[3], &[300.0, 3.0, 0.5]);
    let mut out = Host::filled(DType::F16, &[3], 0.0);
    run_with(&k, &mut [a.arg(), b.arg(), out.arg_mut()], 16).unwrap();
    let third = f16::from_f64(1.0 / 3.0).to_f32();
    let want = [f64::INFINITY, f16::from_f32(third * 3.0).to_f64(), -1.0];
    assert_exact(&out.to_vec(), &want, "f16 mul");
}

#[test]
fn unary_ops_f32() {
    use UnaryOp::*;
    type F = fn(f32) -> f32;
    let cases: [(UnaryOp, F, f64, f64); 11] = [
        (Neg, |x| -x, -3.0, 3.0),
        (Abs, f32::abs, -3.0, 3.0),
        (Exp, f32::exp, -5.0, 5.0),
        (Log, f32::ln, 0.01, 10.0),
        (Sqrt, f32::sqrt, 0.0, 10.0),
        (Rsqrt, |x| 1.0 / x.sqrt(), 0.01, 10.0),
        (Sigmoid, |x| 1.0 / (1.0 + (-x).exp()), -8.0, 8.0),
        (Tanh, f32::tanh, -4.0, 4.0),
        (Erf, libm::erff, -3.0, 3.0),
        (Sin, f32::sin, -20.0, 20.0),
        (Cos, f32::cos, -20.0, 20.0),
    ];
    for (s, (op, f, lo, hi)) in cases.into_iter().enumerate() {
        let k = unary_1d(DType::F32, op);
        let x = Host::random(DType::F32, &[257], lo, hi, 50 + s as u64);
        let mut out = Host::filled(DType::F32, &[257], f64::NAN);
        run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
        let want: Vec<f64> = x.to_vec().iter().map(|&v| f(v as f32) as f64).collect();
        assert_exact(&out.to_vec(), &want, &format!("{op:?}"));
        // And the math is right, not only self-consistent.
        let exact: Vec<f64> = x
            .to_vec()
            .iter()
            .map(|&v| match op {
                Neg => -v,
                Abs => v.abs(),
                Exp => v.exp(),
                Log => v.ln(),
                Sqrt => v.sqrt(),
                Rsqrt => 1.0 / v.sqrt(),
                Sigmoid => 1.0 / (1.0 + (-v).exp()),
                Tanh => v.tanh(),
                Erf => libm::erf(v),
                Sin => v.sin(),
                Cos => v.cos(),
                Not => unreachable!(),
            })
            .collect();
        assert_close(&out.to_vec(), &exact, 1e-5, &format!("{op:?} vs f64"));
    }
}

#[test]
fn unary_bf16_computes_in_f32_then_rounds() {
    let k = unary_1d(DType::BF16, UnaryOp::Exp);
    let x = Host::random(DType::BF16, &[100], -3.0, 3.0, 60);
    let mut out = Host::filled(DType::BF16, &[100], f64::NAN);
    run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
    let want: Vec<f64> = x.to_vec().iter().map(|&v| bf16::from_f32((v as f32).exp()).to_f64()).collect();
    assert_exact(&out.to_vec(), &want, "bf16 exp");
}

#[test]
fn max_min_are_maxnum_minnum() {
    let nan = f64::NAN;
    let a = Host::from_f64(DType::F32, &[4], &[nan, 1.0, nan, -1.0]);
    let b = Host::from_f64(DType::F32, &[4], &[2.0, nan, nan, 3.0]);
    for (op, want) in [(BinaryOp::Max, [2.0, 1.0, nan, 3.0]), (BinaryOp::Min, [2.0, 1.0, nan, -1.0])] {
        let k = binary_1d("mm", DType::F32, op, DType::F32);
        let mut out = Host::filled(DType::F32, &[4], 0.0);
        run_with(&k, &mut [a.arg(), b.arg(), out.arg_mut()], 16).unwrap();
        assert_exact(&out.to_vec(), &want, &format!("{op:?}"));
    }
}

#[test]
fn comparisons_give_bool() {
    let a = Host::from_f64(DType::F32, &[3], &[1.0, 2.0, 3.0]);
    let b = Host::from_f64(DType::F32, &[3], &[2.0, 2.0, 2.0]);
    let cases = [
        (BinaryOp::Lt, [1.0, 0.0, 0.0]),
        (BinaryOp::Le, [1.0, 1.0, 0.0]),
        (BinaryOp::Gt, [0.0, 0.0, 1.0]),
        (BinaryOp::Ge, [0.0, 1.0, 1.0]),
        (BinaryOp::Eq, [0.0, 1.0, 0.0]),
        (BinaryOp::Ne, [1.0, 0.0, 1.0]),
    ];
    for (op, want) in cases {
        let k = binary_1d("cmp", DType::F32, op, DType::Bool);
        let mut out = Host::filled(DType::Bool, &[3], 0.0);
        run_with(&k, &mut [a.arg(), b.arg(), out.arg_mut()], 2).unwrap();
        assert_exact(&out.to_vec(), &want, &format!("{op:?}"));
    }
}

#[test]
fn i64_arithmetic_is_exact_and_truncates() {
    let big = (1i64 << 40) + 3;
    let a = Host::from_f64(DType::I64, &[4], &[7.0, -7.0, big as f64, 9.0]);
    let b = Host::from_f64(DType::I64, &[4], &[2.0, 2.0, 5.0, -4.0]);
    let cases = [
        (BinaryOp::Div, [3.0, -3.0, (big / 5) as f64, -2.0]),
        (BinaryOp::Rem, [1.0, -1.0, (big % 5) as f64, 1.0]),
        (BinaryOp::Mul, [14.0, -14.0, (big * 5) as f64, -36.0]),
        (BinaryOp::Sub, [5.0, -9.0, (big - 5) as f64, 13.0]),
        (BinaryOp::Max, [7.0, 2.0, big as f64, 9.0]),
    ];
    for (op, want) in cases {
        let k = binary_1d("int", DType::I64, op, DType::I64);
        let mut out = Host::filled(DType::I64, &[4], 0.0);
        run_with(&k, &mut [a.arg(), b.arg(), out.arg_mut()], 16).unwrap();
        assert_exact(&out.to_vec(), &want, &format!("{op:?}"));
    }
}

#[test]
fn i64_division_by_zero() {
    let k = binary_1d("div", DType::I64, BinaryOp::Div, DType::I64);
    let a = Host::from_f64(DType::I64, &[3], &[1.0, 2.0, 3.0]);
    let b = Host::from_f64(DType::I64, &[3], &[1.0, 0.0, 1.0]);
    let mut out = Host::filled(DType::I64, &[3], 0.0);
    let e = run_with(&k, &mut [a.arg(), b.arg(), out.arg_mut()], 16).unwrap_err();
    assert!(matches!(&e, IrError::Interp(m) if m.contains("division by zero")), "{e}");
    // The padded lanes of the tile (3..16) hold 0 in both operands: no error from them.
    let b = Host::from_f64(DType::I64, &[3], &[1.0, 2.0, 3.0]);
    run_with(&k, &mut [a.arg(), b.arg(), out.arg_mut()], 16).unwrap();
    assert_eq!(out.to_vec(), vec![1.0, 1.0, 1.0]);
}

/// `out = select(x > 0, x, 0.1 * x)`: comparison, literal coercion, broadcast of scalars.
#[test]
fn leaky_relu_with_select_and_literals() {
    let mut b = Builder::new("leaky");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", DType::BF16, &[n], false);
    let po = b.tensor_param("out", DType::BF16, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[off], &d).unwrap();
    let zero = b.literal(Literal::Float(0.0));
    let c = b.binary(BinaryOp::Gt, x, zero).unwrap();
    let s = b.literal(Literal::Float(0.1));
    let y = b.binary(BinaryOp::Mul, s, x).unwrap();
    let r = b.select(c, x, y).unwrap();
    b.store(po, &[off], &d, r).unwrap();
    let k = b.finish().unwrap();

    let x = Host::random(DType::BF16, &[333], -2.0, 2.0, 70);
    let mut out = Host::filled(DType::BF16, &[333], f64::NAN);
    run_with(&k, &mut [x.arg(), out.arg_mut()], 32).unwrap();
    let tenth = bf16::from_f64(0.1).to_f32();
    let want: Vec<f64> = x
        .to_vec()
        .iter()
        .map(|&v| if v > 0.0 { v } else { bf16::from_f32(tenth * v as f32).to_f64() })
        .collect();
    assert_exact(&out.to_vec(), &want, "leaky relu");
}

/// `out = alpha * x + y` with a scalar parameter; alpha is rounded to the param dtype.
#[test]
fn axpy_scalar_param() {
    for dt in [DType::F32, DType::BF16] {
        let mut b = Builder::new("axpy");
        let n = b.shape_sym("N");
        let bn = b.tile_sym("BN");
        let px = b.tensor_param("x", dt, &[n], false);
        let py = b.tensor_param("y", dt, &[n], false);
        let (_, alpha) = b.scalar_param("alpha", dt);
        let po = b.tensor_param("out", dt, &[n], true);
        let off = block_offset(&mut b, 0, bn);
        let d = [AccessDim::Tile(Extent::Tile(bn))];
        let x = b.load(px, &[off], &d).unwrap();
        let y = b.load(py, &[off], &d).unwrap();
        let ax = b.binary(BinaryOp::Mul, alpha, x).unwrap();
        let r = b.binary(BinaryOp::Add, ax, y).unwrap();
        b.store(po, &[off], &d, r).unwrap();
        let k = b.finish().unwrap();

        let alpha = 0.3;
        let x = Host::random(dt, &[1000], -1.0, 1.0, 80);
        let y = Host::random(dt, &[1000], -1.0, 1.0, 81);
        let mut out = Host::filled(dt, &[1000], f64::NAN);
        run_with(&k, &mut [x.arg(), y.arg(), Arg::Scalar(alpha), out.arg_mut()], 64).unwrap();
        let a = dt.round(alpha) as f32;
        let want: Vec<f64> = x
            .to_vec()
            .iter()
            .zip(y.to_vec())
            .map(|(&x, y)| dt.round((dt.round((a * x as f32) as f64) as f32 + y as f32) as f64))
            .collect();
        assert_exact(&out.to_vec(), &want, &format!("axpy {dt}"));
    }
}

#[test]
fn casts_between_dtypes() {
    let mut b = Builder::new("casts");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", DType::F32, &[n], false);
    let pi = b.tensor_param("as_i64", DType::I64, &[n], true);
    let pb = b.tensor_param("as_bool", DType::Bool, &[n], true);
    let ph = b.tensor_param("as_bf16", DType::BF16, &[n], true);
    let pf = b.tensor_param("back", DType::F32, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[off], &d).unwrap();
    let i = b.cast(x, DType::I64).unwrap();
    b.store(pi, &[off], &d, i).unwrap();
    let bo = b.cast(x, DType::Bool).unwrap();
    b.store(pb, &[off], &d, bo).unwrap();
    let h = b.cast(x, DType::BF16).unwrap();
    b.store(ph, &[off], &d, h).unwrap();
    let back = b.cast(bo, DType::F32).unwrap();
    let back2 = b.cast(i, DType::F32).unwrap();
    let sum = b.binary(BinaryOp::Add, back, back2).unwrap();
    b.store(pf, &[off], &d, sum).unwrap();
    let k = b.finish().unwrap();

    let vals = [-2.7, -0.5, 0.0, 0.5, 2.7, 1.00390625, 1e10];
    let x = Host::from_f64(DType::F32, &[7], &vals);
    let mut oi = Host::filled(DType::I64, &[7], 99.0);
    let mut ob = Host::filled(DType::Bool, &[7], 0.0);
    let mut oh = Host::filled(DType::BF16, &[7], 0.0);
    let mut of = Host::filled(DType::F32, &[7], 0.0);
    run_with(&k, &mut [x.arg(), oi.arg_mut(), ob.arg_mut(), oh.arg_mut(), of.arg_mut()], 4).unwrap();
    let x = x.to_vec();
    assert_eq!(oi.to_vec(), x.iter().map(|v| v.trunc()).collect::<Vec<_>>());
    assert_eq!(ob.to_vec(), vec![1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    assert_eq!(oh.to_vec(), x.iter().map(|&v| bf16::from_f64(v).to_f64()).collect::<Vec<_>>());
    // bool → f32 plus i64 → f32, added in f32 (1e10 + 1 rounds to 1e10).
    let want: Vec<f64> = x.iter().map(|&v| ((v != 0.0) as u8 as f32 + v.trunc() as f32) as f64).collect();
    assert_eq!(of.to_vec(), want);
}

// ---------------------------------------------------------------------------------
// 2-D.

fn check_transpose(k: &Kernel, m: usize, n: usize, default_tile: u32, seed: u64) {
    let x = Host::random(DType::F32, &[m, n], -1.0, 1.0, seed);
    let mut out = Host::filled(DType::F32, &[n, m], f64::NAN);
    run_with(k, &mut [x.arg(), out.arg_mut()], default_tile).unwrap();
    for j in 0..n {
        for i in 0..m {
            assert_eq!(out.get(&[j, i]), x.get(&[i, j]), "transpose {m}x{n} at out[{j}][{i}]");
        }
    }
}

#[test]
fn transpose_odd_shapes_and_tiles() {
    let k = transpose(DType::F32);
    for (s, &(m, n)) in SHAPES_2D.iter().enumerate() {
        check_transpose(&k, m, n, 16, 100 + s as u64);
    }
    for (bm, bn) in [(64, 128), (128, 64), (64, 64)] {
        let mut k = transpose(DType::F32);
        set_tile(&mut k, "BM", bm);
        set_tile(&mut k, "BN", bn);
        for (s, &(m, n)) in SHAPES_2D.iter().enumerate() {
            check_transpose(&k, m, n, 16, 110 + s as u64);
        }
        check_transpose(&k, 300, 130, 16, 120);
    }
}

/// Inputs and outputs as strided views: a transposed input, a negative-stride input, an
/// output embedded in a larger buffer whose border must stay untouched.
#[test]
fn strided_views() {
    let k = transpose(DType::F32);
    let (m, n) = (37, 53);
    // `base` is [n, m]; viewing it with swapped strides gives x[m, n] = baseᵀ.
    let base = Host::random(DType::F32, &[n, m], -1.0, 1.0, 130);
    let xt = Host { shape: vec![m, n], strides: vec![1, m as isize], ..base.clone() };
    // Rows reversed: x[i][j] = base2[m-1-i][j].
    let base2 = Host::random(DType::F32, &[m, n], -1.0, 1.0, 131);
    let xr = Host { strides: vec![-(n as isize), 1], offset: (m - 1) * n, ..base2.clone() };
    for x in [&xt, &xr] {
        // out is the [n, m] interior of an [n + 2, m + 3] buffer, at (1, 2).
        let sentinel = 12345.0;
        let mut big = Host::filled(DType::F32, &[n + 2, m + 3], sentinel);
        let mut out = Host { shape: vec![n, m], offset: (m + 3) + 2, ..big.clone() };
        run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
        big.data = out.data.clone();
        for r in 0..n + 2 {
            for c in 0..m + 3 {
                let v = big.get(&[r, c]);
                if (1..=n).contains(&r) && (2..m + 2).contains(&c) {
                    assert_eq!(v, x.get(&[c - 2, r - 1]), "interior ({r}, {c})");
                } else {
                    assert_eq!(v, sentinel, "border ({r}, {c}) was written");
                }
            }
        }
    }
    assert_eq!(xt.get(&[2, 5]), base.get(&[5, 2]));
    assert_eq!(xr.get(&[0, 5]), base2.get(&[m - 1, 5]));
}

#[test]
fn softmax_rows_match_reference() {
    for dt in [DType::F32, DType::BF16] {
        let k = softmax_row(dt);
        for (s, &(m, n)) in [(1, 53), (37, 1), (37, 53), (5, 1000)].iter().enumerate() {
            let x = Host::random(dt, &[m, n], -5.0, 5.0, 140 + s as u64);
            let mut out = Host::filled(dt, &[m, n], f64::NAN);
            run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
            let xv = x.to_vec();
            let mut want = Vec::new();
            let mut exact = Vec::new();
            for row in xv.chunks(n) {
                want.extend(softmax_ref(row).into_iter().map(|v| dt.round(v)));
                let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
                exact.extend(row.iter().map(|v| (v - mx).exp() / s));
            }
            assert_exact(&out.to_vec(), &want, &format!("softmax {dt} {m}x{n}"));
            let tol = if dt == DType::F32 { 1e-5 } else { 1e-2 };
            assert_close(&out.to_vec(), &exact, tol, "softmax vs f64");
        }
    }
}

/// Blocks of rows and a column tile wider than the row: the padded lanes must not enter
/// the max or the sum, and padded rows must not be stored.
#[test]
fn softmax_blocks_padded_rows_and_columns() {
    for (bm, bn) in [(16, 64), (64, 128), (4, 53)] {
        let mut k = softmax_block();
        set_tile(&mut k, "BM", bm);
        set_tile(&mut k, "BN", bn);
        for &(m, n) in &[(37, 53), (1, 53), (37, 1)] {
            // All values negative: a padded 0 would win the max.
            let x = Host::random(DType::F32, &[m, n], -9.0, -1.0, 150);
            let sentinel = -7.0;
            let mut big = Host::filled(DType::F32, &[m + 1, n], sentinel);
            let mut out = Host { shape: vec![m, n], ..big.clone() };
            run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
            let want: Vec<f64> = x.to_vec().chunks(n).flat_map(softmax_ref).collect();
            assert_exact(&out.to_vec(), &want, &format!("softmax block {m}x{n} tiles {bm}x{bn}"));
            big.data = out.data;
            assert!((0..n).all(|j| big.get(&[m, j]) == sentinel), "row past the end written");
        }
    }
}

/// Mean over a tile wider than the row divides by the number of valid lanes.
#[test]
fn reductions_over_padded_tiles() {
    for (bm, bn) in [(16, 64), (64, 128), (8, 16)] {
        let mut k = row_stats(false);
        set_tile(&mut k, "BM", bm);
        set_tile(&mut k, "BN", bn);
        let (m, n) = (37, 13);
        let x = Host::random(DType::F32, &[m, n], -9.0, -1.0, 160);
        let mut outs: Vec<Host> = (0..4).map(|_| Host::filled(DType::F32, &[m], f64::NAN)).collect();
        let mut args = vec![x.arg()];
        args.extend(outs.iter_mut().map(|o| o.arg_mut()));
        run_with(&k, &mut args, 16).unwrap();
        let (mut sum, mut max, mut min, mut mean) = (vec![], vec![], vec![], vec![]);
        for row in x.to_vec().chunks(n) {
            let s: f64 = row.iter().sum();
            sum.push(s as f32 as f64);
            max.push(row.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
            min.push(row.iter().cloned().fold(f64::INFINITY, f64::min));
            mean.push((s / n as f64) as f32 as f64);
        }
        assert_exact(&outs[0].to_vec(), &sum, "sum");
        assert_exact(&outs[1].to_vec(), &max, "max");
        assert_exact(&outs[2].to_vec(), &min, "min");
        assert_exact(&outs[3].to_vec(), &mean, "mean");
    }
}

/// A column offset of `N` makes every column invalid: each valid row reduces nothing.
#[test]
fn reductions_with_no_valid_lanes() {
    let k = row_stats(true);
    let (m, n) = (5, 13);
    let x = Host::random(DType::F32, &[m, n], -1.0, 1.0, 170);
    let mut outs: Vec<Host> = (0..4).map(|_| Host::filled(DType::F32, &[m], 42.0)).collect();
    let mut args = vec![x.arg()];
    args.extend(outs.iter_mut().map(|o| o.arg_mut()));
    run_with(&k, &mut args, 16).unwrap();
    assert_exact(&outs[0].to_vec(), &[0.0; 5], "sum of nothing");
    assert_exact(&outs[1].to_vec(), &[f64::NEG_INFINITY; 5], "max of nothing");
    assert_exact(&outs[2].to_vec(), &[f64::INFINITY; 5], "min of nothing");
    assert_exact(&outs[3].to_vec(), &[f64::NAN; 5], "mean of nothing");
}

/// `out[i] = sum(x.row(i + shift))` and `copy[i, :] = x.row(i + shift)`: rows past the
/// end are all-invalid loads; the sum of one is a valid 0, the copy writes nothing.
#[test]
fn all_invalid_rows() {
    let mut b = Builder::new("shifted_rows");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let px = b.tensor_param("x", DType::F32, &[m, n], false);
    let ps = b.tensor_param("sums", DType::F32, &[m], true);
    let pc = b.tensor_param("copy", DType::F32, &[m, n], true);
    let (_, shift) = b.scalar_param("shift", DType::I64);
    let i = b.program_id(0).unwrap();
    let r = b.binary(BinaryOp::Add, i, shift).unwrap();
    let zero = b.literal(Literal::Int(0));
    let row = [AccessDim::Index, AccessDim::Tile(Extent::Full(n))];
    let x = b.load(px, &[r, zero], &row).unwrap();
    let s = b.reduce(ReduceOp::Sum, x, 0, false).unwrap();
    let mx = b.reduce(ReduceOp::Max, x, 0, false).unwrap();
    let s = b.binary(BinaryOp::Max, s, mx).unwrap();
    b.store(ps, &[i], &[AccessDim::Index], s).unwrap();
    b.store(pc, &[i, zero], &row, x).unwrap();
    let k = b.finish().unwrap();

    let (m, n) = (6, 9);
    for shift in [2i64, -3] {
        let x = Host::random(DType::F32, &[m, n], 1.0, 2.0, 180);
        let mut sums = Host::filled(DType::F32, &[m], -1.0);
        let mut copy = Host::filled(DType::F32, &[m, n], -1.0);
        run_with(&k, &mut [x.arg(), sums.arg_mut(), copy.arg_mut(), Arg::Scalar(shift as f64)], 16).unwrap();
        for i in 0..m {
            let src = i as i64 + shift;
            if (0..m as i64).contains(&src) {
                let row: Vec<f64> = (0..n).map(|j| x.get(&[src as usize, j])).collect();
                let s = row.iter().sum::<f64>() as f32 as f64;
                assert_eq!(sums.get(&[i]), s, "row {i}");
                assert_eq!((0..n).map(|j| copy.get(&[i, j])).collect::<Vec<_>>(), row);
            } else {
                // max(sum of nothing, max of nothing) = max(0, -inf) = 0.
                assert_eq!(sums.get(&[i]), 0.0, "row {i} from out of range");
                assert!((0..n).all(|j| copy.get(&[i, j]) == -1.0), "row {i} must not be written");
            }
        }
    }
}

/// `out[M, N] = x[M, N] + bias[N]` with `BM × BN` tiles: broadcasting a `[BN]` tile to
/// `[BM, BN]` keeps the column mask; a `[BM, 1]` tile widened keeps the row mask.
#[test]
fn broadcast_bias_and_row_scale() {
    let mut b = Builder::new("bias");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let px = b.tensor_param("x", DType::F32, &[m, n], false);
    let pb = b.tensor_param("bias", DType::F32, &[n], false);
    let ps = b.tensor_param("scale", DType::F32, &[m, n], false);
    let po = b.tensor_param("out", DType::F32, &[m, n], true);
    let i = block_offset(&mut b, 0, bm);
    let j = block_offset(&mut b, 1, bn);
    let zero = b.literal(Literal::Int(0));
    let dims = [AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[i, j], &dims).unwrap();
    let bias = b.load(pb, &[j], &[AccessDim::Tile(Extent::Tile(bn))]).unwrap();
    // scale[:, 0] as a [BM, 1] tile.
    let sc = b.load(ps, &[i, zero], &[AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Const(1))]).unwrap();
    let y = b.binary(BinaryOp::Add, x, bias).unwrap();
    let y = b.binary(BinaryOp::Mul, y, sc).unwrap();
    b.store(po, &[i, j], &dims, y).unwrap();
    let k = b.finish().unwrap();
    assert_eq!(k.ops().filter(|o| matches!(k.op(*o), Op::Broadcast)).count(), 2);

    for &(m, n) in &[(37, 53), (1, 53), (37, 1)] {
        let x = Host::random(DType::F32, &[m, n], -1.0, 1.0, 190);
        let bias = Host::random(DType::F32, &[n], -1.0, 1.0, 191);
        let scale = Host::random(DType::F32, &[m, n], -1.0, 1.0, 192);
        let mut out = Host::filled(DType::F32, &[m, n], f64::NAN);
        run_with(&k, &mut [x.arg(), bias.arg(), scale.arg(), out.arg_mut()], 16).unwrap();
        for r in 0..m {
            for c in 0..n {
                let want = (x.get(&[r, c]) as f32 + bias.get(&[c]) as f32) * scale.get(&[r, 0]) as f32;
                assert_eq!(out.get(&[r, c]), want as f64, "({r}, {c}) of {m}x{n}");
            }
        }
    }
}

/// `out += x`: loading an output tensor reads its current contents.
#[test]
fn read_modify_write_of_an_output() {
    let mut b = Builder::new("acc");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", DType::F32, &[n], false);
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[off], &d).unwrap();
    let o = b.load(po, &[off], &d).unwrap();
    let s = b.binary(BinaryOp::Add, o, x).unwrap();
    b.store(po, &[off], &d, s).unwrap();
    let k = b.finish().unwrap();
    let x = Host::random(DType::F32, &[50], -1.0, 1.0, 200);
    let mut out = Host::random(DType::F32, &[50], -1.0, 1.0, 201);
    let before = out.to_vec();
    run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
    let want: Vec<f64> = before.iter().zip(x.to_vec()).map(|(&o, x)| (o as f32 + x as f32) as f64).collect();
    assert_exact(&out.to_vec(), &want, "out += x");
}

/// No `program_id`: one program; `out[0] = sum(x)` over a `Full(N)` tile.
#[test]
fn kernel_without_program_id_runs_once() {
    let mut b = Builder::new("total");
    let n = b.shape_sym("N");
    let one = b.shape_sym("ONE");
    let px = b.tensor_param("x", DType::F32, &[n], false);
    let po = b.tensor_param("out", DType::F32, &[one], true);
    let zero = b.literal(Literal::Int(0));
    let x = b.load(px, &[zero], &[AccessDim::Tile(Extent::Full(n))]).unwrap();
    let s = b.reduce(ReduceOp::Sum, x, 0, false).unwrap();
    // Accumulate so that a second run of the program would show.
    let o = b.load(po, &[zero], &[AccessDim::Index]).unwrap();
    let s = b.binary(BinaryOp::Add, o, s).unwrap();
    b.store(po, &[zero], &[AccessDim::Index], s).unwrap();
    let k = b.finish().unwrap();
    assert_eq!(grid::derive(&k).unwrap().axes, vec![]);
    let x = Host::random(DType::F32, &[1001], 0.0, 1.0, 210);
    let mut out = Host::filled(DType::F32, &[1], 0.5);
    run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
    let want = (0.5f32 + x.to_vec().iter().sum::<f64>() as f32) as f64;
    assert_eq!(out.to_vec(), vec![want]);
}

/// A zero-sized dimension gives an empty grid: nothing runs (no error, no write).
#[test]
fn empty_grid_runs_nothing() {
    let k = add_1d(DType::F32);
    let e = Host::filled(DType::F32, &[0], 0.0);
    let mut out = Host::filled(DType::F32, &[0], 0.0);
    run_with(&k, &mut [e.arg(), e.arg(), out.arg_mut()], 16).unwrap();
    // 2-D: M = 0, N = 5 → the output [N, M] has no elements; must not fail.
    let k = transpose(DType::F32);
    let x = Host::filled(DType::F32, &[0, 5], 0.0);
    let mut out = Host::filled(DType::F32, &[5, 0], 0.0);
    run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
}

/// Program ids and shape/tile values seen by the kernel: `out[i] = pid*1000 + N*10 + BN`.
#[test]
fn index_values() {
    let mut b = Builder::new("ids");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let po = b.tensor_param("out", DType::I64, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let pid = b.program_id(0).unwrap();
    let k1000 = b.literal(Literal::Int(1000));
    let k10 = b.literal(Literal::Int(10));
    let v = b.binary(BinaryOp::Mul, pid, k1000).unwrap();
    let nn = b.shape_dim(n);
    let t = b.binary(BinaryOp::Mul, nn, k10).unwrap();
    let v = b.binary(BinaryOp::Add, v, t).unwrap();
    let e = b.tile_extent(Extent::Tile(bn));
    let v = b.binary(BinaryOp::Add, v, e).unwrap();
    b.store(po, &[off], &[AccessDim::Tile(Extent::Tile(bn))], v).unwrap();
    let k = b.finish().unwrap();
    let mut out = Host::filled(DType::I64, &[10], -1.0);
    run_with(&k, &mut [out.arg_mut()], 4).unwrap();
    let want: Vec<f64> = (0..10).map(|i| ((i / 4) * 1000 + 100 + 4) as f64).collect();
    assert_eq!(out.to_vec(), want);
}

/// `Options::tiles` sets tile sizes by name, over the schedule's and the default; names
/// that are no tile symbol of the kernel are ignored; a size of 0 is still an error.
#[test]
fn tiles_by_name_win_over_schedule_and_default() {
    // out[i] = pid * 1000 + BN, in blocks of BN
    let mut b = Builder::new("tile_ids");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let po = b.tensor_param("out", DType::I64, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let pid = b.program_id(0).unwrap();
    let k1000 = b.literal(Literal::Int(1000));
    let v = b.binary(BinaryOp::Mul, pid, k1000).unwrap();
    let e = b.tile_extent(Extent::Tile(bn));
    let v = b.binary(BinaryOp::Add, v, e).unwrap();
    b.store(po, &[off], &[AccessDim::Tile(Extent::Tile(bn))], v).unwrap();
    let mut k = b.finish().unwrap();
    let want = |tile: usize| -> Vec<f64> { (0..40).map(|i| ((i / tile) * 1000 + tile) as f64).collect() };
    let run = |k: &Kernel, opts: &interp::Options| -> Result<Vec<f64>, IrError> {
        let mut out = Host::filled(DType::I64, &[40], -1.0);
        interp::run(k, &mut [out.arg_mut()], opts)?;
        Ok(out.to_vec())
    };
    let tiles = |e: &[(&str, u32)]| e.iter().map(|&(n, v)| (n.to_string(), v)).collect::<std::collections::BTreeMap<_, _>>();
    // the default stays 16
    assert_eq!(run(&k, &interp::Options::default()).unwrap(), want(16));
    // by name, over the default; any positive size (the GPU's are powers of two)
    assert_eq!(run(&k, &interp::Options::with_tiles(tiles(&[("BN", 8)]))).unwrap(), want(8));
    assert_eq!(run(&k, &interp::Options::with_tiles(tiles(&[("BN", 5)]))).unwrap(), want(5));
    // names of no tile symbol are ignored (a zero among them too)
    assert_eq!(run(&k, &interp::Options::with_tiles(tiles(&[("BQ", 0), ("SPLITK", 4)]))).unwrap(), want(16));
    // over the schedule's
    set_tile(&mut k, "BN", 4);
    assert_eq!(run(&k, &interp::Options::default()).unwrap(), want(4));
    assert_eq!(run(&k, &interp::Options::with_tiles(tiles(&[("BN", 32)]))).unwrap(), want(32));
    // a zero is an error, as a zero default is
    let m = interp_msg(run(&k, &interp::Options::with_tiles(tiles(&[("BN", 0)]))).map(|_| ()));
    assert!(m.contains("tile symbol `BN` has size 0"), "{m}");
}

#[test]
fn large_1d_is_fast_enough() {
    // 4M elements through a 3-tensor kernel in tiles of 128 (also runs in debug builds).
    let mut k = add_1d(DType::F32);
    set_tile(&mut k, "BN", 128);
    let n = 4 << 20;
    let a = Host::random(DType::F32, &[n], -1.0, 1.0, 220);
    let b = Host::random(DType::F32, &[n], -1.0, 1.0, 221);
    let mut out = Host::filled(DType::F32, &[n], f64::NAN);
    let t = std::time::Instant::now();
    run_with(&k, &mut [a.arg(), b.arg(), out.arg_mut()], 16).unwrap();
    let dt = t.elapsed();
    assert_eq!(out.get(&[n - 1]), (a.get(&[n - 1]) as f32 + b.get(&[n - 1]) as f32) as f64);
    assert!(dt.as_secs_f64() < 20.0, "4M-element add took {dt:?}");
    eprintln!("4M-element add: {dt:?}");
}

// ---------------------------------------------------------------------------------
// Argument errors.

fn interp_msg(r: Result<(), IrError>) -> String {
    match r {
        Err(IrError::Interp(m)) => m,
        other => panic!("expected an interpreter error, got {other:?}"),
    }
}

#[test]
fn argument_errors() {
    let k = add_1d(DType::F32);
    let a = Host::filled(DType::F32, &[8], 1.0);
    let mut out = Host::filled(DType::F32, &[8], 0.0);

    let m = interp_msg(run_with(&k, &mut [a.arg(), out.arg_mut()], 16));
    assert!(m.contains("3 parameters but 2 arguments"), "{m}");

    let m = interp_msg(run_with(&k, &mut [a.arg(), Arg::Scalar(1.0), out.arg_mut()], 16));
    assert!(m.contains("`b` takes an input tensor") && m.contains("scalar"), "{m}");

    let m = interp_msg(run_with(&k, &mut [a.arg(), a.arg(), a.arg()], 16));
    assert!(m.contains("`out` takes an output tensor"), "{m}");

    let h = Host::filled(DType::BF16, &[8], 1.0);
    let m = interp_msg(run_with(&k, &mut [a.arg(), h.arg(), out.arg_mut()], 16));
    assert!(m.contains("`b` has dtype f32") && m.contains("bf16"), "{m}");

    let two = Host::filled(DType::F32, &[2, 4], 1.0);
    let m = interp_msg(run_with(&k, &mut [two.arg(), a.arg(), out.arg_mut()], 16));
    assert!(m.contains("`a` has rank 1"), "{m}");

    let short = Host::filled(DType::F32, &[7], 1.0);
    let m = interp_msg(run_with(&k, &mut [a.arg(), short.arg(), out.arg_mut()], 16));
    assert!(m.contains("shape symbol `N` is 8 in a.shape[0] but 7 in b.shape[0]"), "{m}");

    // A view that reaches past its buffer.
    let bad = Host { shape: vec![8], strides: vec![2], ..a.clone() };
    let m = interp_msg(run_with(&k, &mut [a.arg(), bad.arg(), out.arg_mut()], 16));
    assert!(m.contains("`b`") && m.contains("buffer"), "{m}");
    let neg = Host { strides: vec![-1], ..a.clone() };
    let m = interp_msg(run_with(&k, &mut [neg.arg(), a.arg(), out.arg_mut()], 16));
    assert!(m.contains("`a`"), "{m}");

    let m = interp_msg(run_with(&k, &mut [a.arg(), a.arg(), out.arg_mut()], 0));
    assert!(m.contains("tile symbol `BN` has size 0"), "{m}");

    // The same arguments are fine.
    run_with(&k, &mut [a.arg(), a.arg(), out.arg_mut()], 16).unwrap();
    assert_eq!(out.to_vec(), vec![2.0; 8]);
}

#[test]
fn grid_errors_pass_through() {
    // program_id only offsets a load: the grid is unknown.
    let mut b = Builder::new("nogrid");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", DType::F32, &[n], false);
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let zero = b.literal(Literal::Int(0));
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[off], &d).unwrap();
    b.store(po, &[zero], &d, x).unwrap();
    let k = b.finish().unwrap();
    let x = Host::filled(DType::F32, &[4], 1.0);
    let mut out = Host::filled(DType::F32, &[4], 0.0);
    let e = run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap_err();
    assert!(matches!(&e, IrError::Grid(m) if m.contains("program_id(0)")), "{e:?}");
}

#[test]
fn corrupt_kernels_are_rejected_not_run() {
    let mut k = add_1d(DType::F32);
    k.order.reverse();
    let a = Host::filled(DType::F32, &[4], 1.0);
    let mut out = Host::filled(DType::F32, &[4], 0.0);
    let e = run_with(&k, &mut [a.arg(), a.arg(), out.arg_mut()], 16).unwrap_err();
    assert!(matches!(e, IrError::Verify { .. }), "{e:?}");
}

/// `out[N] = x[N] + y[K]` with `K <= N`: lanes past `K` are invalid in `y`, so the
/// intersection leaves them unstored.
#[test]
fn elementwise_validity_is_the_intersection() {
    let mut b = Builder::new("add_short");
    let (n, kk) = (b.shape_sym("N"), b.shape_sym("K"));
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", DType::F32, &[n], false);
    let py = b.tensor_param("y", DType::F32, &[kk], false);
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[off], &d).unwrap();
    let y = b.load(py, &[off], &d).unwrap();
    let s = b.binary(BinaryOp::Add, x, y).unwrap();
    b.store(po, &[off], &d, s).unwrap();
    let k = b.finish().unwrap();
    let (n, kk) = (50, 21);
    let x = Host::random(DType::F32, &[n], -1.0, 1.0, 230);
    let y = Host::random(DType::F32, &[kk], -1.0, 1.0, 231);
    let mut out = Host::filled(DType::F32, &[n], 99.0);
    run_with(&k, &mut [x.arg(), y.arg(), out.arg_mut()], 16).unwrap();
    let want: Vec<f64> =
        (0..n).map(|i| if i < kk { (x.get(&[i]) as f32 + y.get(&[i]) as f32) as f64 } else { 99.0 }).collect();
    assert_exact(&out.to_vec(), &want, "x + short y");
}

/// `out[M, N] = x[M, N] * col[M, K][:, c]`: the `[BM, 1]` column tile widened to
/// `[BM, BN]` is valid only if its lane 0 is, so a column `c >= K` writes nothing.
#[test]
fn widened_axis_takes_lane_zero_validity() {
    let mut b = Builder::new("scale_by_col");
    let (m, n, kk) = (b.shape_sym("M"), b.shape_sym("N"), b.shape_sym("K"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let px = b.tensor_param("x", DType::F32, &[m, n], false);
    let pc = b.tensor_param("col", DType::F32, &[m, kk], false);
    let (_, c) = b.scalar_param("c", DType::I64);
    let po = b.tensor_param("out", DType::F32, &[m, n], true);
    let i = block_offset(&mut b, 0, bm);
    let j = block_offset(&mut b, 1, bn);
    let dims = [AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[i, j], &dims).unwrap();
    let col = b.load(pc, &[i, c], &[AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Const(1))]).unwrap();
    let y = b.binary(BinaryOp::Mul, x, col).unwrap();
    b.store(po, &[i, j], &dims, y).unwrap();
    let k = b.finish().unwrap();
    let (m, n, kk) = (20, 30, 3);
    let x = Host::random(DType::F32, &[m, n], -1.0, 1.0, 240);
    let col = Host::random(DType::F32, &[m, kk], -1.0, 1.0, 241);
    for c in [0i64, 2, 3, -1] {
        let mut out = Host::filled(DType::F32, &[m, n], 99.0);
        run_with(&k, &mut [x.arg(), col.arg(), Arg::Scalar(c as f64), out.arg_mut()], 16).unwrap();
        for r in 0..m {
            for q in 0..n {
                let want = if (0..kk as i64).contains(&c) {
                    (x.get(&[r, q]) as f32 * col.get(&[r, c as usize]) as f32) as f64
                } else {
                    99.0
                };
                assert_eq!(out.get(&[r, q]), want, "c={c} ({r}, {q})");
            }
        }
    }
}

/// A unary result is rounded to its dtype before anything else sees it.
#[test]
fn unary_results_are_rounded_before_use() {
    let mut b = Builder::new("exp_bf16");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", DType::BF16, &[n], false);
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[off], &d).unwrap();
    let e = b.unary(UnaryOp::Exp, x).unwrap();
    let e = b.cast(e, DType::F32).unwrap();
    b.store(po, &[off], &d, e).unwrap();
    let k = b.finish().unwrap();
    let x = Host::random(DType::BF16, &[100], -3.0, 3.0, 250);
    let mut out = Host::filled(DType::F32, &[100], f64::NAN);
    run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
    let want: Vec<f64> = x.to_vec().iter().map(|&v| bf16::from_f32((v as f32).exp()).to_f64()).collect();
    assert_exact(&out.to_vec(), &want, "bf16 exp seen as f32");
}

/// Rank-0 loads: `out[i] = x[i + shift]`. An out-of-range scalar load gives the valid
/// scalar 0 (the masked-load default), which is stored.
#[test]
fn scalar_loads_out_of_range_read_zero() {
    let mut b = Builder::new("shift");
    let n = b.shape_sym("N");
    let px = b.tensor_param("x", DType::F32, &[n], false);
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let (_, shift) = b.scalar_param("shift", DType::I64);
    let i = b.program_id(0).unwrap();
    let src = b.binary(BinaryOp::Add, i, shift).unwrap();
    let x = b.load(px, &[src], &[AccessDim::Index]).unwrap();
    assert!(b.ty(x).is_scalar());
    b.store(po, &[i], &[AccessDim::Index], x).unwrap();
    let k = b.finish().unwrap();
    let x = Host::random(DType::F32, &[9], 1.0, 2.0, 260);
    let mut out = Host::filled(DType::F32, &[9], 99.0);
    run_with(&k, &mut [x.arg(), out.arg_mut(), Arg::Scalar(4.0)], 16).unwrap();
    let want: Vec<f64> = (0..9).map(|i| if i + 4 < 9 { x.get(&[i + 4]) } else { 0.0 }).collect();
    assert_exact(&out.to_vec(), &want, "shifted scalar loads");
}

/// Rows of width 0: the reductions see no lane; a `Full(N)` tile of extent 0 is empty.
#[test]
fn zero_width_rows() {
    let mut k2 = row_stats(false);
    set_tile(&mut k2, "BN", 4);
    let x = Host::filled(DType::F32, &[3, 0], 0.0);
    let mut outs: Vec<Host> = (0..4).map(|_| Host::filled(DType::F32, &[3], 7.0)).collect();
    let mut args = vec![x.arg()];
    args.extend(outs.iter_mut().map(|o| o.arg_mut()));
    run_with(&k2, &mut args, 16).unwrap();
    assert_exact(&outs[0].to_vec(), &[0.0; 3], "sum");
    assert_exact(&outs[3].to_vec(), &[f64::NAN; 3], "mean");

    let k = softmax_row(DType::F32);
    let x = Host::filled(DType::F32, &[3, 0], 0.0);
    let mut out = Host::filled(DType::F32, &[3, 0], 0.0);
    run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
}

/// `out[j] = iota(BN)[j - i*BN] + i*BN`: every index once, the edge tile masked by the
/// store; and `iota(N)` over a full extent in a kernel without program ids.
#[test]
fn iota_counts_every_lane() {
    let mut b = Builder::new("iota");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let po = b.tensor_param("out", DType::I64, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let j = b.iota(Extent::Tile(bn)).unwrap();
    let v = b.binary(BinaryOp::Add, j, off).unwrap();
    b.store(po, &[off], &[AccessDim::Tile(Extent::Tile(bn))], v).unwrap();
    let k = b.finish().unwrap();
    for (n, tile) in [(1, 16), (7, 4), (33, 16), (100, 3)] {
        let mut out = Host::filled(DType::I64, &[n], -1.0);
        run_with(&k, &mut [out.arg_mut()], tile).unwrap();
        assert_exact(&out.to_vec(), &(0..n).map(|i| i as f64).collect::<Vec<_>>(), &format!("iota n={n} tile={tile}"));
    }

    let mut b = Builder::new("iota_full");
    let n = b.shape_sym("N");
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let j = b.iota(Extent::Full(n)).unwrap();
    let jf = b.cast(j, DType::F32).unwrap();
    let half = b.literal(Literal::Float(0.5));
    let v = b.binary(BinaryOp::Mul, jf, half).unwrap();
    let zero = b.literal(Literal::Int(0));
    b.store(po, &[zero], &[AccessDim::Tile(Extent::Full(n))], v).unwrap();
    let k = b.finish().unwrap();
    let mut out = Host::filled(DType::F32, &[9], f64::NAN);
    run_with(&k, &mut [out.arg_mut()], 16).unwrap();
    assert_exact(&out.to_vec(), &(0..9).map(|i| i as f64 * 0.5).collect::<Vec<_>>(), "iota(N) * 0.5");
    // iota's lanes are all valid: a sum over a literal extent counts them all.
    let mut b = Builder::new("iota_sum");
    let one = b.shape_sym("ONE");
    let po = b.tensor_param("out", DType::I64, &[one], true);
    let j = b.iota(Extent::Const(10)).unwrap();
    let s = b.reduce(ReduceOp::Sum, j, 0, false).unwrap();
    let zero = b.literal(Literal::Int(0));
    b.store(po, &[zero], &[AccessDim::Index], s).unwrap();
    let k = b.finish().unwrap();
    let mut out = Host::filled(DType::I64, &[1], 0.0);
    run_with(&k, &mut [out.arg_mut()], 16).unwrap();
    assert_eq!(out.to_vec(), vec![45.0]);
}

/// Rows scaled by their mean square, `x / mean(x*x, axis 1)[:, None]`, over `BM × BN`
/// blocks with padded rows and columns; and a column vector `[1, BN]` made with axis 0.
#[test]
fn expand_dims_broadcasts_a_row_statistic() {
    let mut b = Builder::new("ms_scale");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let px = b.tensor_param("x", DType::F32, &[m, n], false);
    let pw = b.tensor_param("w", DType::F32, &[n], false);
    let po = b.tensor_param("out", DType::F32, &[m, n], true);
    let i = block_offset(&mut b, 0, bm);
    let zero = b.literal(Literal::Int(0));
    let dims = [AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[i, zero], &dims).unwrap();
    let sq = b.binary(BinaryOp::Mul, x, x).unwrap();
    let ms = b.reduce(ReduceOp::Mean, sq, 1, false).unwrap();
    let col = b.expand_dims(ms, 1).unwrap();
    let w = b.load(pw, &[zero], &[AccessDim::Tile(Extent::Tile(bn))]).unwrap();
    let row = b.expand_dims(w, 0).unwrap();
    let y = b.binary(BinaryOp::Div, x, col).unwrap();
    let y = b.binary(BinaryOp::Mul, y, row).unwrap();
    b.store(po, &[i, zero], &dims, y).unwrap();
    let mut k = b.finish().unwrap();
    set_tile(&mut k, "BM", 4);
    set_tile(&mut k, "BN", 16);
    let (mm, nn) = (7, 13);
    let x = Host::random(DType::F32, &[mm, nn], -2.0, 2.0, 300);
    let w = Host::random(DType::F32, &[nn], -2.0, 2.0, 301);
    let mut out = Host::filled(DType::F32, &[mm, nn], f64::NAN);
    run_with(&k, &mut [x.arg(), w.arg(), out.arg_mut()], 16).unwrap();
    let xv = x.to_vec();
    let mut want = Vec::new();
    for r in 0..mm {
        let row = &xv[r * nn..(r + 1) * nn];
        let ms = (row.iter().map(|&v| (v as f32 * v as f32) as f64).sum::<f64>() / nn as f64) as f32;
        want.extend(row.iter().enumerate().map(|(c, &v)| ((v as f32 / ms) * w.get(&[c]) as f32) as f64));
    }
    assert_exact(&out.to_vec(), &want, "x / ms[:, None] * w[None, :]");
}

/// The valid range of the new axis is [0, 1); the others keep theirs: a padded row
/// statistic stays invalid where its rows were, so the store skips those rows.
#[test]
fn expand_dims_keeps_validity() {
    let mut b = Builder::new("rowsum");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let px = b.tensor_param("x", DType::F32, &[m, n], false);
    let po = b.tensor_param("out", DType::F32, &[m, n], true);
    let i = block_offset(&mut b, 0, bm);
    let zero = b.literal(Literal::Int(0));
    let dims = [AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[i, zero], &dims).unwrap();
    // Rows shifted by one: the first row of each block reads the previous block's last.
    let one = b.literal(Literal::Int(1));
    let i1 = b.binary(BinaryOp::Sub, i, one).unwrap();
    let prev = b.load(px, &[i1, zero], &dims).unwrap();
    let s = b.reduce(ReduceOp::Sum, prev, 1, false).unwrap();
    let s = b.expand_dims(s, 1).unwrap();
    let y = b.binary(BinaryOp::Add, x, s).unwrap();
    b.store(po, &[i, zero], &dims, y).unwrap();
    let mut k = b.finish().unwrap();
    set_tile(&mut k, "BM", 4);
    set_tile(&mut k, "BN", 8);
    let x = Host::random(DType::F32, &[8, 8], -1.0, 1.0, 310);
    let mut out = Host::filled(DType::F32, &[8, 8], 99.0);
    run_with(&k, &mut [x.arg(), out.arg_mut()], 16).unwrap();
    // Row 0 reads row -1 (invalid): not written. Every other row is x[r] + sum(x[r-1]).
    for r in 0..8 {
        for c in 0..8 {
            let got = out.get(&[r, c]);
            if r == 0 {
                assert_eq!(got, 99.0);
            } else {
                let s: f64 = (0..8).map(|cc| x.get(&[r - 1, cc])).sum::<f64>() as f32 as f64;
                assert_eq!(got, (x.get(&[r, c]) as f32 + s as f32) as f64, "[{r}, {c}]");
            }
        }
    }
}

/// A gather through an `i64` position tensor: `out[t, :] = tab[pos[t], :]`; positions
/// outside the table load nothing, so those rows are not written.
#[test]
fn i64_tensor_positions_index_a_table() {
    let mut b = Builder::new("gather");
    let (t, p, d) = (b.shape_sym("T"), b.shape_sym("P"), b.shape_sym("D"));
    let pos = b.tensor_param("pos", DType::I64, &[t], false);
    let tab = b.tensor_param("tab", DType::F32, &[p, d], false);
    let out = b.tensor_param("out", DType::F32, &[t, d], true);
    let i = b.program_id(0).unwrap();
    let pv = b.load(pos, &[i], &[AccessDim::Index]).unwrap();
    let zero = b.literal(Literal::Int(0));
    let row = [AccessDim::Index, AccessDim::Tile(Extent::Full(d))];
    let r = b.load(tab, &[pv, zero], &row).unwrap();
    b.store(out, &[i, zero], &row, r).unwrap();
    let k = b.finish().unwrap();
    let positions = [3.0, 0.0, 3.0, -1.0, 4.0, 2.0];
    let pos = Host::from_f64(DType::I64, &[6], &positions);
    let tab = Host::random(DType::F32, &[4, 5], -1.0, 1.0, 320);
    let mut out = Host::filled(DType::F32, &[6, 5], 7.0);
    run_with(&k, &mut [pos.arg(), tab.arg(), out.arg_mut()], 16).unwrap();
    for (r, &pp) in positions.iter().enumerate() {
        for c in 0..5 {
            let want = if (0.0..4.0).contains(&pp) { tab.get(&[pp as usize, c]) } else { 7.0 };
            assert_eq!(out.get(&[r, c]), want, "[{r}, {c}]");
        }
    }
}
