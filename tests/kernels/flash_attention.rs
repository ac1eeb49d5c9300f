//! Flash attention forward as a user writes it in `#[kfuse]` (the proof kernel of the
//! general lowering): shared by `tests/attention.rs` and `benches/attention.rs`.

use kfuse::prelude::*;

/// One program: `BM` query rows of one head (`program_id(1)`) of one batch
/// (`program_id(2)`). `causal != 0` masks the keys after
/// each query's position, counted from the bottom right (`c <= r + SK − SQ`): the key
/// tiles every row of the block sees whole run without the mask, those on the diagonal
/// with it, and none after the last tile a row sees.
#[kfuse]
pub fn flash_attention<T: Float>(
    q: Tensor<T, (B, SQ, H, D)>,
    k: Tensor<T, (B, SK, H, D)>,
    v: Tensor<T, (B, SK, H, D)>,
    o: &mut Tensor<T, (B, SQ, H, D)>,
    lse: &mut Tensor<f32, (B, H, SQ)>,
    scale: f32,
    causal: i64,
) {
    let (i, h, b) = (program_id(0), program_id(1), program_id(2));
    let qt = q.block([b, i * BM, h, 0], [_, BM, _, D]).load();
    let rows = iota(BM).unsqueeze(1) + i * BM + (SK - SQ);
    let mut m = zeros::<f32>([BM]) + f32::NEG_INFINITY;
    let mut l = zeros::<f32>([BM]);
    let mut acc = zeros::<f32>([BM, D]);
    // causal: the key tiles past this block's last row hold no live key, and those
    // before `diag` no masked one (every row of the block sees all of them), so only
    // the second loop computes the mask
    let kv_end = select(causal == 0, SK, min(SK, (i + 1) * BM + (SK - SQ)));
    let diag = select(causal == 0, kv_end, min(kv_end, max(0, i * BM + (SK - SQ) + 1) / BN * BN));
    for j in (0..diag).step_by(BN) {
        let kt = k.block([b, j, h, 0], [_, BN, _, D]).load();
        let vt = v.block([b, j, h, 0], [_, BN, _, D]).load();
        let s = dot(qt, kt.t()) * scale;
        let m_new = max(m, s.max_axis(1));
        let p = exp(s - m_new.unsqueeze(1));
        let alpha = exp(m - m_new);
        l = l * alpha + p.sum_axis(1);
        acc = acc * alpha.unsqueeze(1) + dot(p.cast::<T>(), vt);
        m = m_new;
    }
    for j in (diag..kv_end).step_by(BN) {
        let kt = k.block([b, j, h, 0], [_, BN, _, D]).load();
        let vt = v.block([b, j, h, 0], [_, BN, _, D]).load();
        let cols = iota(BN).unsqueeze(0) + j;
        let s = select(cols <= rows, dot(qt, kt.t()) * scale, f32::NEG_INFINITY);
        let m_new = max(m, s.max_axis(1));
        let p = exp(s - m_new.unsqueeze(1));
        let alpha = exp(m - m_new);
        l = l * alpha + p.sum_axis(1);
        acc = acc * alpha.unsqueeze(1) + dot(p.cast::<T>(), vt);
        m = m_new;
    }
    o.block([b, i * BM, h, 0], [_, BM, _, D]).store((acc / l.unsqueeze(1)).cast::<T>());
    lse.block([b, h, i * BM], [_, _, BM]).store(m + ln(l));
}
