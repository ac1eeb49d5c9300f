//! Shared helpers: host tensors, random data, and the kernels the tests build by hand.

#![allow(dead_code)]

use kfuse_ir::interp::{self, contiguous_strides, Arg, Options, TensorMut, TensorRef};
use kfuse_ir::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A tensor in host memory: a strided view into a byte buffer.
#[derive(Clone, Debug)]
pub struct Host {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub offset: usize,
    pub data: Vec<u8>,
}

impl Host {
    /// A dense row-major tensor holding `vals` (rounded to `dtype`).
    pub fn from_f64(dtype: DType, shape: &[usize], vals: &[f64]) -> Host {
        let n: usize = shape.iter().product();
        assert_eq!(n, vals.len());
        let mut data = vec![0u8; n * dtype.size_bytes()];
        for (i, &v) in vals.iter().enumerate() {
            dtype.write(&mut data, i, v);
        }
        Host { dtype, shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0, data }
    }

    pub fn filled(dtype: DType, shape: &[usize], v: f64) -> Host {
        let n: usize = shape.iter().product();
        Host::from_f64(dtype, shape, &vec![v; n])
    }

    /// Uniform values in `[lo, hi)`, rounded to `dtype`.
    pub fn random(dtype: DType, shape: &[usize], lo: f64, hi: f64, seed: u64) -> Host {
        let n: usize = shape.iter().product();
        let mut rng = StdRng::seed_from_u64(seed);
        let vals: Vec<f64> = (0..n).map(|_| dtype.round(rng.random_range(lo..hi))).collect();
        Host::from_f64(dtype, shape, &vals)
    }

    pub fn index(&self, idx: &[usize]) -> usize {
        let i = self.offset as isize + idx.iter().zip(&self.strides).map(|(&i, &s)| i as isize * s).sum::<isize>();
        i as usize
    }

    pub fn get(&self, idx: &[usize]) -> f64 {
        self.dtype.read(&self.data, self.index(idx))
    }

    pub fn set(&mut self, idx: &[usize], v: f64) {
        let i = self.index(idx);
        self.dtype.write(&mut self.data, i, v);
    }

    /// The elements in logical row-major order.
    pub fn to_vec(&self) -> Vec<f64> {
        let n: usize = self.shape.iter().product();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; self.shape.len()];
        for _ in 0..n {
            out.push(self.get(&idx));
            for a in (0..idx.len()).rev() {
                idx[a] += 1;
                if idx[a] < self.shape[a] {
                    break;
                }
                idx[a] = 0;
            }
        }
        out
    }

    pub fn arg(&self) -> Arg<'_> {
        Arg::In(TensorRef { dtype: self.dtype, shape: &self.shape, strides: &self.strides, offset: self.offset, data: &self.data })
    }

    pub fn arg_mut(&mut self) -> Arg<'_> {
        Arg::Out(TensorMut { dtype: self.dtype, shape: &self.shape, strides: &self.strides, offset: self.offset, data: &mut self.data })
    }
}

/// Runs with `default_tile` (and the kernel's own `schedule.tiles`).
pub fn run_with(k: &Kernel, args: &mut [Arg<'_>], default_tile: u32) -> Result<(), IrError> {
    interp::run(k, args, &Options { default_tile, ..Options::default() })
}

/// Sets a tile symbol by name in the kernel's schedule.
pub fn set_tile(k: &mut Kernel, name: &str, v: u32) {
    let t = k.tile_syms.iter().position(|s| s == name).unwrap_or_else(|| panic!("no tile symbol {name}"));
    k.schedule.tiles.insert(TileSym(t as u32), v);
}

/// Compares bit-exactly (NaN equals NaN); on failure names the first differing index.
pub fn assert_exact(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g == w || (g.is_nan() && w.is_nan());
        assert!(same, "{what}: element {i}: got {g}, want {w}");
    }
}

pub fn assert_close(got: &[f64], want: &[f64], rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= rtol * w.abs().max(1.0), "{what}: element {i}: got {g}, want {w}");
    }
}

// ---------------------------------------------------------------------------------
// Kernels.

/// `program_id(axis) * tile_extent(BX)`.
pub fn block_offset(b: &mut Builder, axis: u8, t: TileSym) -> ValueId {
    let pid = b.program_id(axis).unwrap();
    let e = b.tile_extent(Extent::Tile(t));
    b.binary(BinaryOp::Mul, pid, e).unwrap()
}

/// `out[N] = a[N] <op> b[N]`, tiles of `BN`.
pub fn binary_1d(name: &str, dt: DType, op: BinaryOp, out_dt: DType) -> Kernel {
    let mut b = Builder::new(name);
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let pa = b.tensor_param("a", dt, &[n], false);
    let pb = b.tensor_param("b", dt, &[n], false);
    let po = b.tensor_param("out", out_dt, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(pa, &[off], &d).unwrap();
    let y = b.load(pb, &[off], &d).unwrap();
    let s = b.binary(op, x, y).unwrap();
    b.store(po, &[off], &d, s).unwrap();
    b.finish().unwrap()
}

/// `out = a + b` over `N`.
pub fn add_1d(dt: DType) -> Kernel {
    binary_1d("add", dt, BinaryOp::Add, dt)
}

/// `out[N] = f(x[N])` for a unary op.
pub fn unary_1d(dt: DType, op: UnaryOp) -> Kernel {
    let mut b = Builder::new("unary");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", dt, &[n], false);
    let po = b.tensor_param("out", dt, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[off], &d).unwrap();
    let y = b.unary(op, x).unwrap();
    b.store(po, &[off], &d, y).unwrap();
    b.finish().unwrap()
}

/// `out[N, M] = x[M, N]ᵀ` with `BM × BN` tiles:
/// `out.block([j*BN, i*BM], [BN, BM]).store(x.block([i*BM, j*BN], [BM, BN]).load().permute([1, 0]))`.
pub fn transpose(dt: DType) -> Kernel {
    let mut b = Builder::new("transpose");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let px = b.tensor_param("x", dt, &[m, n], false);
    let po = b.tensor_param("out", dt, &[n, m], true);
    let i = block_offset(&mut b, 0, bm);
    let j = block_offset(&mut b, 1, bn);
    let (tm, tn) = (AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn)));
    let x = b.load(px, &[i, j], &[tm, tn]).unwrap();
    let t = b.permute(x, &[1, 0]).unwrap();
    b.store(po, &[j, i], &[tn, tm], t).unwrap();
    b.finish().unwrap()
}

/// Row softmax, one row per program: `x.row(i)` is a load with dims `[Index, Full(N)]`.
pub fn softmax_row(dt: DType) -> Kernel {
    let mut b = Builder::new("softmax_row");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let px = b.tensor_param("x", dt, &[m, n], false);
    let po = b.tensor_param("out", dt, &[m, n], true);
    let i = b.program_id(0).unwrap();
    let zero = b.literal(Literal::Int(0));
    let row = [AccessDim::Index, AccessDim::Tile(Extent::Full(n))];
    let x = b.load(px, &[i, zero], &row).unwrap();
    let x = b.cast(x, DType::F32).unwrap();
    let mx = b.reduce(ReduceOp::Max, x, -1, true).unwrap();
    let d = b.binary(BinaryOp::Sub, x, mx).unwrap();
    let e = b.unary(UnaryOp::Exp, d).unwrap();
    let s = b.reduce(ReduceOp::Sum, e, 0, true).unwrap();
    let y = b.binary(BinaryOp::Div, e, s).unwrap();
    let y = b.cast(y, dt).unwrap();
    b.store(po, &[i, zero], &row, y).unwrap();
    b.finish().unwrap()
}

/// Row softmax over blocks of `BM` rows, columns in tiles of `BN` (one column tile
/// must cover `N`; the test picks `BN >= N`): padded rows *and* columns.
pub fn softmax_block() -> Kernel {
    let mut b = Builder::new("softmax_block");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let px = b.tensor_param("x", DType::F32, &[m, n], false);
    let po = b.tensor_param("out", DType::F32, &[m, n], true);
    let i = block_offset(&mut b, 0, bm);
    let zero = b.literal(Literal::Int(0));
    let dims = [AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[i, zero], &dims).unwrap();
    let mx = b.reduce(ReduceOp::Max, x, 1, true).unwrap();
    let d = b.binary(BinaryOp::Sub, x, mx).unwrap();
    let e = b.unary(UnaryOp::Exp, d).unwrap();
    let s = b.reduce(ReduceOp::Sum, e, 1, true).unwrap();
    let y = b.binary(BinaryOp::Div, e, s).unwrap();
    b.store(po, &[i, zero], &dims, y).unwrap();
    b.finish().unwrap()
}

/// Plain-Rust softmax of one row with the interpreter's rounding: f32 ops, f64 sum.
pub fn softmax_ref(row: &[f64]) -> Vec<f64> {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b)) as f32;
    let e: Vec<f32> = row.iter().map(|&x| (x as f32 - m).exp()).collect();
    let s = e.iter().map(|&v| v as f64).sum::<f64>() as f32;
    e.iter().map(|&v| (v / s) as f64).collect()
}

/// Per-row reductions of `x[M, N]` over blocks `[BM, BN]` at column offset `col` (a
/// shape dim or a literal), into `sum`, `max`, `min`, `mean`, each `[M]`.
pub fn row_stats(col_at_n: bool) -> Kernel {
    let mut b = Builder::new("row_stats");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let px = b.tensor_param("x", DType::F32, &[m, n], false);
    let outs: Vec<ParamId> =
        ["sum", "max", "min", "mean"].iter().map(|name| b.tensor_param(name, DType::F32, &[m], true)).collect();
    let i = block_offset(&mut b, 0, bm);
    let col = if col_at_n { b.shape_dim(n) } else { b.literal(Literal::Int(0)) };
    let dims = [AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[i, col], &dims).unwrap();
    for (p, op) in outs.iter().zip([ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean]) {
        let r = b.reduce(op, x, 1, false).unwrap();
        b.store(*p, &[i], &[AccessDim::Tile(Extent::Tile(bm))], r).unwrap();
    }
    b.finish().unwrap()
}

/// `c[M, N] = a[M, K] · b[K, N]` in `BM × BN` tiles, stepping `K` by `BK` with an f32
/// accumulator carried through the loop:
/// `acc = zeros([BM, BN]); for k in (0..K).step_by(BK) { acc += dot(a.block(..), b.block(..)) }`.
pub fn gemm(dt: DType) -> Kernel {
    let mut b = Builder::new("gemm");
    let (m, kk, n) = (b.shape_sym("M"), b.shape_sym("K"), b.shape_sym("N"));
    let (bm, bn, bk) = (b.tile_sym("BM"), b.tile_sym("BN"), b.tile_sym("BK"));
    let pa = b.tensor_param("a", dt, &[m, kk], false);
    let pb = b.tensor_param("b", dt, &[kk, n], false);
    let pc = b.tensor_param("c", dt, &[m, n], true);
    let i = block_offset(&mut b, 0, bm);
    let j = block_offset(&mut b, 1, bn);
    let (tm, tn, tk) = (AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn)), AccessDim::Tile(Extent::Tile(bk)));
    let acc = b.zeros(DType::F32, &[Extent::Tile(bm), Extent::Tile(bn)]).unwrap();
    b.name(acc, "acc");
    let lo = b.literal(Literal::Int(0));
    let hi = b.shape_dim(kk);
    let step = b.tile_extent(Extent::Tile(bk));
    let (l, k, carried) = b.begin_for(lo, hi, step, &[acc]).unwrap();
    b.name(k, "k");
    b.name(carried[0], "acc");
    let x = b.load(pa, &[i, k], &[tm, tk]).unwrap();
    let y = b.load(pb, &[k, j], &[tk, tn]).unwrap();
    let d = b.dot(x, y).unwrap();
    let s = b.binary(BinaryOp::Add, carried[0], d).unwrap();
    b.name(s, "acc");
    let r = b.end_for(l, &[s]).unwrap();
    b.name(r[0], "acc");
    let out = b.cast(r[0], dt).unwrap();
    b.store(pc, &[i, j], &[tm, tn], out).unwrap();
    b.finish().unwrap()
}

/// What the interpreter computes for `gemm` with tiles `bk` along K: per K-tile an f64
/// sum rounded to f32, added to the f32 accumulator, the result rounded to `dt`.
pub fn gemm_ref(dt: DType, a: &[f64], b: &[f64], m: usize, k: usize, n: usize, bk: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for r in 0..m {
        for c in 0..n {
            let mut acc = 0f32;
            for k0 in (0..k).step_by(bk) {
                let s: f64 = (k0..(k0 + bk).min(k)).map(|q| a[r * k + q] * b[q * n + c]).sum();
                acc += s as f32;
            }
            out[r * n + c] = dt.round(acc as f64);
        }
    }
    out
}
