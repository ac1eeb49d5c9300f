//! The row and column kernels of `tests/user_kernels.rs`, also compiled by `tests/gpu_coverage.rs`.

use kfuse::prelude::*;

/// Softmax of each row, one row per program.
#[kfuse]
pub fn softmax_rows<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let r = program_id(0);
    let v = x.row(r).load().to_f32();
    let e = exp(v - v.max());
    out.row(r).store((e / e.sum()).cast::<T>());
}

/// Each row minus its mean, `BM` rows per program (reduction with keep-dim broadcast).
#[kfuse]
pub fn center_rows<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    out.block([i * BM, 0], [BM, N]).store((t - t.mean_keepdim(1)).cast::<T>());
}

/// Column sums into an f32 vector (reduction along axis 0).
#[kfuse]
pub fn col_sums<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<f32, (N,)>) {
    let j = program_id(0);
    let t = x.block([0, j * BN], [M, BN]).load().to_f32();
    out.block([j * BN], [BN]).store(t.sum_axis(0));
}

/// Row maxima and minima of a 2-D tile (both reductions, one program per row block).
#[kfuse]
pub fn row_range<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M,)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load();
    out.block([i * BM], [BM]).store(t.max_axis(1) - t.min_axis(1));
}

/// Rows scaled by a weight vector, normalized by their RMS (a weight broadcast along M).
#[kfuse]
pub fn weighted_rms<T: Float>(x: Tensor<T, (M, N)>, w: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    let r = rsqrt((t * t).mean_axis(1) + 1e-6);
    out.block([i * BM, 0], [BM, N]).store((t * r.unsqueeze(1) * w.load().to_f32()).cast::<T>());
}
