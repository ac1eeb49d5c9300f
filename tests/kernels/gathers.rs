//! The gather kernels of `tests/gathers.rs`, also compiled by `tests/gpu_coverage.rs`:
//! offsets that are `i64` tiles (one coordinate per row of the tile).

use kfuse::prelude::*;

/// An embedding lookup: row `t` of `out` is row `ids[t]` of `table` (zeros where the id
/// is outside the table).
#[kfuse]
pub fn embedding<T: Float>(table: Tensor<T, (V, D)>, ids: Tensor<i64, (S,)>, out: &mut Tensor<T, (S, D)>) {
    let (i, j) = (program_id(0), program_id(1));
    let rows = ids.block([i * BS], [BS]).load();
    out.block([i * BS, j * BD], [BS, BD]).store(table.block([rows, j * BD], [_, BD]).load());
}

/// A scatter: row `t` of `x`, times two, goes to row `dest[t]` of `out` (rows outside
/// `out` are dropped; the rows no one writes keep what they held).
#[kfuse]
pub fn scatter_rows<T: Float>(x: Tensor<T, (S, D)>, dest: Tensor<i64, (S,)>, out: &mut Tensor<T, (R, D)>) {
    let (i, j) = (program_id(0), program_id(1));
    let rows = dest.block([i * BS], [BS]).load();
    out.block([rows, j * BD], [_, BD]).store(x.block([i * BS, j * BD], [BS, BD]).load() * 2.0);
}

/// A 3 × 3 box sum over an NHWC image with zero padding 1, output pixels as rows
/// (`out` is `[N·H·W, C]`): each tap gathers the input pixel of every output row over
/// three gathered dimensions (`n`, `h`, `w`); taps outside the image read zeros.
#[kfuse]
pub fn box3x3<T: Float>(x: Tensor<T, (N, H, W, C)>, out: &mut Tensor<T, (M, C)>) {
    let (i, j) = (program_id(0), program_id(1));
    let m = iota(BM) + i * BM;
    let hw = H * W;
    let n = m / hw;
    let p = (m % hw) / W;
    let q = m % W;
    let mut acc = zeros::<f32>([BM, BC]);
    for t in 0..9 {
        let h = p + t / 3 - 1;
        let w = q + t % 3 - 1;
        acc = acc + x.block([n, h, w, j * BC], [_, _, _, BC]).load().to_f32();
    }
    out.block([i * BM, j * BC], [BM, BC]).store(acc.cast::<T>());
}

/// Coordinates divided by values a launch fixes (the pixel decoding of a gathered
/// convolution): `q = m / d`, `r = m % d` by an `i64` scalar, and `qs = m / D`, `rs = m %
/// D` by a shape, for `m = off + 0, 1, …` (C's truncating division, as Rust's).
#[kfuse]
pub fn divide_rows(d: i64, off: i64, x: Tensor<f32, (D,)>, q: &mut Tensor<i64, (M,)>, r: &mut Tensor<i64, (M,)>, qs: &mut Tensor<i64, (M,)>, rs: &mut Tensor<i64, (M,)>) {
    let i = program_id(0);
    let m = iota(BM) + i * BM + off;
    q.block([i * BM], [BM]).store(m / d);
    r.block([i * BM], [BM]).store(m % d);
    qs.block([i * BM], [BM]).store(m / D);
    rs.block([i * BM], [BM]).store(m % D);
}
