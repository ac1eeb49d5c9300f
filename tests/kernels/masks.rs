//! The mask kernels of `tests/masks.rs`, also compiled by `tests/gpu_coverage.rs`.

use kfuse::prelude::*;

/// Row softmax of a score tile under a causal mask: column `c` of row `r` takes part when
/// `c <= r`; the others are `-inf` before the softmax (so 0 after it).
#[kfuse]
pub fn causal_softmax<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let i = program_id(0);
    let s = x.block([i * BM, 0], [BM, N]).load().to_f32();
    let r = iota(BM).unsqueeze(1) + i * BM;
    let c = iota(N).unsqueeze(0);
    let s = select(c <= r, s, f32::NEG_INFINITY);
    let m = s.max_axis(1).unsqueeze(1);
    let e = exp(s - m);
    out.block([i * BM, 0], [BM, N]).store((e / e.sum_axis(1).unsqueeze(1)).cast::<T>());
}

/// Each row scaled by its position plus one, and every column by its own: the row index
/// as a column vector `[BM, 1]` and the column index as a row vector `[1, BN]`.
#[kfuse]
pub fn position_scale<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let t = x.block([i * BM, j * BN], [BM, BN]).load().to_f32();
    let r = (iota(BM) + i * BM + 1).to_f32().unsqueeze(1);
    let c = (iota(BN) + j * BN).to_f32().unsqueeze(0);
    out.block([i * BM, j * BN], [BM, BN]).store((t * r + c).cast::<T>());
}

/// `store_where`: twice `x` on and below the diagonal; the elements above it keep what
/// `out` held.
#[kfuse]
pub fn lower_triangle<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let t = x.block([i * BM, j * BN], [BM, BN]).load();
    let r = iota(BM).unsqueeze(1) + i * BM;
    let c = iota(BN).unsqueeze(0) + j * BN;
    out.block([i * BM, j * BN], [BM, BN]).store_where(c <= r, t * 2.0);
}

/// `store_where` with a per-row bound loaded from an `i64` tensor (variable lengths): row
/// `b` of `out` takes the first `len[b]` elements of row `b` of `x` plus one; the rest of
/// the row keeps what `out` held.
#[kfuse]
pub fn prefix_rows<T: Float>(x: Tensor<T, (B, N)>, len: Tensor<i64, (B,)>, out: &mut Tensor<T, (B, N)>) {
    let (b, j) = (program_id(0), program_id(1));
    let n = len.block([b], [_]).load();
    let c = iota(BN) + j * BN;
    out.block([b, j * BN], [_, BN]).store_where(c < n, x.block([b, j * BN], [_, BN]).load() + 1.0);
}
