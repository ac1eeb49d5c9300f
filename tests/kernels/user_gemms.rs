//! The user GEMM and loop kernels of `tests/gemm.rs`, also compiled by `tests/gpu_coverage.rs`.

use kfuse::prelude::*;

/// `out = relu(a · b + bias)`: an epilogue on the accumulator after the loop.
#[kfuse]
pub fn gemm_bias_relu<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, bias: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    let y = acc + bias.block([j * BN], [BN]).load().to_f32();
    out.block([i * BM, j * BN], [BM, BN]).store(max(y, 0.0).cast::<T>());
}

/// A GEMM that reads its `b` through an output parameter (`&mut`, never stored): an
/// operand the kernel may write, which a launch must not copy.
#[kfuse]
pub fn gemm_b_mut<T: Float>(a: Tensor<T, (M, K)>, b: &mut Tensor<T, (K, N)>, c: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    c.block([i * BM, j * BN], [BM, BN]).store(acc.cast::<T>());
}

/// SwiGLU of two projections in one loop: `out = silu(x · wg) ⊙ (x · wu)`, two carried
/// accumulators sharing the `x` tile.
#[kfuse]
pub fn swiglu_proj<T: Float>(x: Tensor<T, (M, K)>, wg: Tensor<T, (K, N)>, wu: Tensor<T, (K, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut g = zeros::<f32>([BM, BN]);
    let mut u = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        let xt = x.block([i * BM, k], [BM, BK]).load();
        g += dot(xt, wg.block([k, j * BN], [BK, BN]).load());
        u = u + dot(xt, wu.block([k, j * BN], [BK, BN]).load());
    }
    out.block([i * BM, j * BN], [BM, BN]).store((g * sigmoid(g) * u).cast::<T>());
}

/// Row sums of squares walking the columns in blocks: a reduction carried across the
/// loop (masked lanes of the last block do not count), then one value per row.
#[kfuse]
pub fn row_sumsq<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<f32, (M,)>) {
    let i = program_id(0);
    let mut s = zeros::<f32>([BM]);
    for j in (0..N).step_by(BN) {
        let t = x.block([i * BM, j], [BM, BN]).load().to_f32();
        s += (t * t).sum_axis(1);
    }
    out.block([i * BM], [BM]).store(s);
}
