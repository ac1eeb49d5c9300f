//! The loop kernels of `tests/loops.rs`, also compiled by `tests/gpu_coverage.rs`.

use kfuse::prelude::*;

/// RMS normalization of a row walked in chunks of `BN`: a running sum of squares, then a
/// second loop that scales and stores.
#[kfuse]
pub fn rms_chunked<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>, eps: f32) {
    let r = program_id(0);
    let mut ss = 0.0f32;
    for j in (0..N).step_by(BN) {
        let t = x.block([r, j], [_, BN]).load().to_f32();
        ss = ss + (t * t).sum(); // the lanes past the row's end do not take part
    }
    let rs = rsqrt(ss / N.to_f32() + eps);
    for j in (0..N).step_by(BN) {
        let t = x.block([r, j], [_, BN]).load().to_f32();
        out.block([r, j], [_, BN]).store((t * rs).cast::<T>());
    }
}

/// Softmax of a row in one pass over chunks for its statistics (a running maximum `m` and
/// a sum `l` rescaled whenever `m` grows), then a pass that writes.
#[kfuse]
pub fn online_softmax<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let r = program_id(0);
    let mut m = -3.0e38f32;
    let mut l = 0.0f32;
    for j in (0..N).step_by(BN) {
        let t = x.block([r, j], [_, BN]).load().to_f32();
        let m_new = max(m, t.max());
        l = l * exp(m - m_new) + exp(t - m_new).sum();
        m = m_new;
    }
    for j in (0..N).step_by(BN) {
        let t = x.block([r, j], [_, BN]).load().to_f32();
        out.block([r, j], [_, BN]).store((exp(t - m) / l).cast::<T>());
    }
}

/// Row sums of squares walking the columns in blocks: a per-row tile carried across the
/// loop.
#[kfuse]
pub fn row_sumsq_blocks<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<f32, (M,)>) {
    let i = program_id(0);
    let mut s = zeros::<f32>([BM]);
    for j in (0..N).step_by(BN) {
        let t = x.block([i * BM, j], [BM, BN]).load().to_f32();
        s = s + (t * t).sum_axis(1);
    }
    out.block([i * BM], [BM]).store(s);
}

/// The same sums in two loops: whole column blocks (`0..N / BN · BN`, each block inside
/// the row: the compiler drops their bounds arithmetic), then the columns left.
#[kfuse]
pub fn row_sumsq_whole_blocks<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<f32, (M,)>) {
    let i = program_id(0);
    let whole = N / BN * BN;
    let mut s = zeros::<f32>([BM]);
    for j in (0..whole).step_by(BN) {
        let t = x.block([i * BM, j], [BM, BN]).load().to_f32();
        s = s + (t * t).sum_axis(1);
    }
    for j in (whole..N).step_by(BN) {
        let t = x.block([i * BM, j], [BM, BN]).load().to_f32();
        s = s + (t * t).sum_axis(1);
    }
    out.block([i * BM], [BM]).store(s);
}

/// `out[i] = Σ_b Σ_k x[b, i, k]`: a loop over the batch around a loop over K.
#[kfuse]
pub fn batch_k_sums<T: Float>(x: Tensor<T, (B, M, K)>, out: &mut Tensor<f32, (M,)>) {
    let i = program_id(0);
    let mut s = zeros::<f32>([BM]);
    for b in 0..B {
        for k in (0..K).step_by(BK) {
            let t = x.block([b, i * BM, k], [_, BM, BK]).load().to_f32();
            s = s + t.sum_axis(1);
        }
    }
    out.block([i * BM], [BM]).store(s);
}

/// `out[r] = Σ_{j < len[r]} x[r, j]`: a loop whose bound is an `i64` loaded per row.
#[kfuse]
pub fn prefix_sums<T: Float>(x: Tensor<T, (M, N)>, len: Tensor<i64, (M,)>, out: &mut Tensor<f32, (M,)>) {
    let r = program_id(0);
    let n = len.block([r], [_]).load();
    let mut s = 0.0f32;
    for j in (0..n).step_by(BN) {
        let t = x.block([r, j], [_, BN]).load().to_f32();
        s = s + select(iota(BN) + j < n, t, 0.0).sum();
    }
    out.block([r], [_]).store(s);
}

/// Sums of a long row, once per leading index: the row tile needs a thread-block cluster
/// at 131072 elements, whose reductions serve one use, not one an iteration.
#[kfuse]
pub fn long_row_sums<T: Float>(x: Tensor<T, (R, M, N)>, out: &mut Tensor<f32, (M,)>) {
    let i = program_id(0);
    let mut s = 0.0f32;
    for r in 0..R {
        s = s + x.block([r, i, 0], [_, _, N]).load().to_f32().sum();
    }
    out.block([i], [_]).store(s);
}

/// `out = scale · a · b` with the scale applied to each K block's product
/// (`acc = acc + dot(a, b) * scale`): a loop with one `dot` that is not the matrix
/// path's `acc += dot(load, load)`, so it is lowered where it stands (on sm_90a:
/// `wgmma`, its operands in rings a producer warpgroup fills, no turns to take).
#[kfuse]
pub fn scaled_products<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, out: &mut Tensor<f32, (M, N)>, scale: f32) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        let at = a.block([i * BM, k], [BM, BK]).load();
        let bt = b.block([k, j * BN], [BK, BN]).load();
        acc = acc + dot(at, bt) * scale;
    }
    out.block([i * BM, j * BN], [BM, BN]).store(acc);
}

/// The product walked by a tile count: the loop runs over `t`, and the blocks' offset
/// `t * BK` is computed in its body. Not the matrix path's form (its offsets come from
/// inside the loop), so its dot is lowered where it stands; on sm_90a its operands still
/// take `cp.async` rings, which compute the next iteration's offset ahead.
#[kfuse]
pub fn products_by_tile_count<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, out: &mut Tensor<f32, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for t in 0..(K + BK - 1) / BK {
        let k0 = t * BK;
        acc += dot(a.block([i * BM, k0], [BM, BK]).load(), b.block([k0, j * BN], [BK, BN]).load());
    }
    out.block([i * BM, j * BN], [BM, BN]).store(acc);
}
