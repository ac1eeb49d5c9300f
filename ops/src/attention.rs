//! Attention forward: [`attention`], [`attention_varlen`] and their options. The kernel is `kernels::attention`
//! (one `#[kfuse]` function); the layouts are a matter of strides, chosen here.

use kfuse_ir::DType;
use kfuse_runtime::{Error, Result, Tensor};

use crate::kernels;

/// How `q`, `k`, `v` and the output hold their dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionLayout {
    /// `[B, S, H, D]` (FlashAttention's, most model code's).
    #[default]
    Bshd,
    /// `[B, H, S, D]` (PyTorch's `scaled_dot_product_attention`).
    Bhsd,
}

/// Options of [`attention`]. The default is no mask, `scale = 1/√D`, `[B, S, H, D]`.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct AttentionOptions {
    /// Each query sees no key after its own position (counted from the bottom right when
    /// `Sq ≠ Skv`: query `r` sits on key `r + Skv − Sq`, as FlashAttention aligns it).
    pub causal: bool,
    /// The factor on `q·kᵀ` before the softmax; `None` is `1/√D`. Finite and positive.
    pub scale: Option<f32>,
    /// A sliding window `(left, right)`: query `r` sees the keys from `left` before its
    /// position to `right` after it (both counted as above). With `causal`, `right` is 0.
    pub window: Option<(usize, usize)>,
    /// The layout of `q`, `k`, `v` and the output.
    pub layout: AttentionLayout,
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(format!("kfuse::ops::attention: {msg}"))
}

fn shape_err(msg: String) -> Error {
    Error::ShapeMismatch(format!("kfuse::ops::attention: {msg}"))
}

/// The `[B, S, H, D]` view of `x` in `layout`, sharing its storage.
fn bshd(x: &Tensor, layout: AttentionLayout) -> Result<Tensor> {
    match layout {
        AttentionLayout::Bshd => Ok(x.clone()),
        AttentionLayout::Bhsd => x.permute(&[0, 2, 1, 3]),
    }
}

/// Checks the arguments; returns `(B, Sq, Skv, Hq, Hkv, D)` and the `[B, S, H, D]` views
/// of `q`, `k` and `v`.
fn check(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions) -> Result<([usize; 6], [Tensor; 3])> {
    for (x, name) in [(q, "q"), (k, "k"), (v, "v")] {
        if x.rank() != 4 {
            return Err(shape_err(format!("`{name}` must have rank 4 ({:?}), got shape {:?}", opts.layout, x.shape())));
        }
        if x.dtype() != q.dtype() {
            return Err(Error::DTypeMismatch(format!("kfuse::ops::attention: `{name}` is {} but `q` is {}", x.dtype(), q.dtype())));
        }
        if x.device() != q.device() {
            return Err(Error::DeviceMismatch(format!("kfuse::ops::attention: `{name}` is on {} but `q` is on {}", x.device().name(), q.device().name())));
        }
    }
    if !matches!(q.dtype(), DType::BF16 | DType::F16) {
        return Err(Error::DTypeMismatch(format!("kfuse::ops::attention: q, k and v must be bf16 or f16, got {}", q.dtype())));
    }
    let (qs, ks, vs) = (bshd(q, opts.layout)?, bshd(k, opts.layout)?, bshd(v, opts.layout)?);
    let [b, sq, hq, d] = <[usize; 4]>::try_from(qs.shape()).expect("rank 4");
    let [kb, skv, hkv, kd] = <[usize; 4]>::try_from(ks.shape()).expect("rank 4");
    if ks.shape() != vs.shape() {
        return Err(shape_err(format!("`k` and `v` must have one shape, got {:?} and {:?}", k.shape(), v.shape())));
    }
    if kb != b || kd != d {
        return Err(shape_err(format!("`q` {:?} and `k` {:?} must agree on the batch and the head dimension ({:?})", q.shape(), k.shape(), opts.layout)));
    }
    if d == 0 || d > 256 {
        return Err(invalid(format!("the head dimension D must be 1 to 256, got {d}")));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(invalid(format!("the query heads ({hq}) must be a multiple of the key/value heads ({hkv})")));
    }
    if let Some(s) = opts.scale {
        if !(s.is_finite() && s > 0.0) {
            return Err(invalid(format!("scale must be finite and positive, got {s}")));
        }
    }
    Ok(([b, sq, skv, hq, hkv, d], [qs, ks, vs]))
}

/// Flash attention forward: `o = softmax(q·kᵀ · scale + mask) · v`, and the log-sum-exp
/// of each row of `q·kᵀ · scale + mask` (natural log, f32, `[B, Hq, Sq]`), in one launch.
///
/// `q` is `[B, Sq, Hq, D]`, `k` and `v` `[B, Skv, Hkv, D]` (or `[B, H, S, D]` with
/// [`AttentionLayout::Bhsd`]), bf16 or f16, of any strides; `Hq` a multiple of `Hkv`
/// (grouped-query and multi-query attention: query head `h` reads key/value head
/// `h / (Hq / Hkv)`); `D` from 1 to 256; `Sq` and `Skv` may differ. The output has `q`'s
/// shape and layout, new and contiguous; the products and the softmax are f32, `P` is
/// rounded to the dtype before `P·V` (as FlashAttention rounds it) and the output once.
/// A query that sees no key (a causal `Sq > Skv`, a window, `Skv = 0`) gives a zero row
/// and a log-sum-exp of −∞.
///
/// Errors (nothing is launched): ranks or shapes that do not fit (`ShapeMismatch`),
/// dtypes that differ or are not bf16/f16 (`DTypeMismatch`), tensors on different devices
/// (`DeviceMismatch`), `D` of 0 or above 256, head counts that do not divide, a scale
/// that is not finite and positive (`InvalidArgument`).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::ops::AttentionOptions;
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x: Vec<f32> = (0..2 * 5 * 4 * 8).map(|i| ((i * 7) % 13) as f32 / 13.0 - 0.5).collect();
/// let q = Tensor::from_f32(&x, &[2, 5, 4, 8], DType::BF16, &dev)?; // [B, S, Hq, D]
/// let k = Tensor::from_f32(&x[..2 * 5 * 2 * 8], &[2, 5, 2, 8], DType::BF16, &dev)?; // Hkv = 2
/// let opts = AttentionOptions { causal: true, ..Default::default() };
/// let (o, lse) = kfuse::ops::attention(&q, &k, &k, &opts)?;
/// assert_eq!((o.shape(), lse.shape()), (&[2, 5, 4, 8][..], &[2, 4, 5][..]));
/// // the first query sees only the first key: its output is that key's value
/// let (o, v) = (o.to_vec_f32()?, k.to_vec_f32()?);
/// assert!((0..8).all(|x| (o[x] - v[x]).abs() < 1e-2));
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions) -> Result<(Tensor, Tensor)> {
    let ([b, sq, skv, hq, hkv, d], [qs, ks, vs]) = check(q, k, v, opts)?;
    let dev = q.device();
    let out_shape = match opts.layout {
        AttentionLayout::Bshd => [b, sq, hq, d],
        AttentionLayout::Bhsd => [b, hq, sq, d],
    };
    let out = Tensor::empty(&out_shape, q.dtype(), &dev)?;
    if b * sq * hq == 0 {
        return Ok((out, Tensor::empty(&[b, hq, sq], DType::F32, &dev)?));
    }
    if skv == 0 {
        // no key to see: zero rows, log-sum-exp −∞ (no launch)
        return Ok((Tensor::zeros(&out_shape, q.dtype(), &dev)?, Tensor::full(&[b, hq, sq], f64::NEG_INFINITY, DType::F32, &dev)?));
    }
    let mut lse = Tensor::empty(&[b, hq, sq], DType::F32, &dev)?;
    let (scale, group, left, right) = launch_scalars(opts, sq, skv, d, hq / hkv);
    let mut o = bshd(&out, opts.layout)?;
    kernels::attention(&qs, &ks, &vs, &mut o, &mut lse, scale, group, left, right)?;
    Ok((out, lse))
}

/// The sequence bounds of `cu_seqlens` (`[B + 1]` i64, from 0, not decreasing, ending at
/// `total`), each sequence at most `max` long.
fn seq_bounds(cu: &Tensor, total: usize, max: usize, name: &str) -> Result<Vec<usize>> {
    if cu.dtype() != DType::I64 || cu.rank() != 1 || cu.shape()[0] == 0 {
        return Err(invalid(format!("`{name}` must be a non-empty 1-D i64 tensor [B + 1], got {} {:?}", cu.dtype(), cu.shape())));
    }
    let bytes = cu.contiguous()?.to_bytes()?;
    let vals: Vec<i64> = bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    if vals[0] != 0 || vals.windows(2).any(|w| w[1] < w[0]) || *vals.last().expect("non-empty") != total as i64 {
        return Err(invalid(format!("`{name}` must start at 0, never decrease and end at the packed length {total}, got {vals:?}")));
    }
    let bounds: Vec<usize> = vals.iter().map(|&v| v as usize).collect();
    if let Some(w) = bounds.windows(2).find(|w| w[1] - w[0] > max) {
        return Err(invalid(format!("`{name}` holds a sequence of {} tokens, longer than its maximum {max}", w[1] - w[0])));
    }
    Ok(bounds)
}

/// Attention forward over a batch of sequences of different lengths, packed: `q`
/// `[total_q, Hq, D]`, `k` and `v` `[total_k, Hkv, D]`; sequence `b` holds the tokens
/// `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of `q` and `cu_seqlens_k[b]..cu_seqlens_k[b + 1]`
/// of `k` and `v` (`[B + 1]` i64 tensors, from 0, not decreasing, ending at the packed
/// lengths; empty sequences allowed). `max_q` and `max_k` bound the lengths (a longer
/// sequence is an error). Returns the output `[total_q, Hq, D]` and the f32 log-sum-exp
/// `[B, Hq, max_q]` (position `r` of sequence `b` at `[b, h, r]`; −∞ past the sequence's
/// length). Masks, scale and heads as in [`attention`] (the causal diagonal aligned to
/// each sequence's bottom right); the layout must be [`AttentionLayout::Bshd`] (packed
/// tensors have no batch dimension).
///
/// One launch of `kernels::attention_varlen` (`ceil(max_q / BM) × Hq × B` programs):
/// each program reads its sequence's bounds from `cu_seqlens` on the device and writes
/// only its sequence's rows (`store_where`). The key tiles a sequence's last one
/// overhangs are masked, but they are read: a non-finite value in the next sequence's
/// `v` rows there would reach this one's output through `0 · v`.
///
/// Errors as [`attention`]'s, and `InvalidArgument` for `cu_seqlens` that are not i64
/// `[B + 1]`, do not start at 0, decrease, do not end at the packed length, differ in
/// `B`, or hold a sequence longer than its maximum (checked on the host: one copy of
/// `cu_seqlens` to it).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::ops::AttentionOptions;
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x: Vec<f32> = (0..7 * 2 * 8).map(|i| ((i * 5) % 11) as f32 / 11.0 - 0.5).collect();
/// let q = Tensor::from_f32(&x, &[7, 2, 8], DType::F16, &dev)?; // sequences of 3, 0 and 4 tokens
/// let cu = Tensor::from_f64(&[0.0, 3.0, 3.0, 7.0], &[4], DType::I64, &dev)?;
/// let opts = AttentionOptions { causal: true, ..Default::default() };
/// let (o, lse) = kfuse::ops::attention_varlen(&q, &q, &q, &cu, &cu, 4, 4, &opts)?;
/// assert_eq!((o.shape(), lse.shape()), (&[7, 2, 8][..], &[3, 2, 4][..]));
/// # Ok::<(), kfuse::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &Tensor,
    cu_seqlens_k: &Tensor,
    max_q: usize,
    max_k: usize,
    opts: &AttentionOptions,
) -> Result<(Tensor, Tensor)> {
    if opts.layout != AttentionLayout::Bshd {
        return Err(invalid("attention_varlen takes packed [total, H, D] tensors: the layout must be Bshd".into()));
    }
    for (x, name) in [(q, "q"), (k, "k"), (v, "v")] {
        if x.rank() != 3 {
            return Err(shape_err(format!("`{name}` must be packed [total, H, D], got shape {:?}", x.shape())));
        }
    }
    // the checks of `attention`, on the packed tensors as one batch
    let batch = |x: &Tensor| x.unsqueeze(0);
    let ([_, total_q, total_k, hq, hkv, d], _) = check(&batch(q)?, &batch(k)?, &batch(v)?, opts)?;
    for cu in [cu_seqlens_q, cu_seqlens_k] {
        if cu.device() != q.device() {
            return Err(Error::DeviceMismatch(format!("kfuse::ops::attention_varlen: `cu_seqlens` is on {} but `q` is on {}", cu.device().name(), q.device().name())));
        }
    }
    let bq = seq_bounds(cu_seqlens_q, total_q, max_q, "cu_seqlens_q")?;
    let bk = seq_bounds(cu_seqlens_k, total_k, max_k, "cu_seqlens_k")?;
    if bq.len() != bk.len() {
        return Err(invalid(format!("`cu_seqlens_q` and `cu_seqlens_k` must hold one batch, got {} and {} sequences", bq.len() - 1, bk.len() - 1)));
    }
    let dev = q.device();
    let b = bq.len() - 1;
    // (`max_q` sizes the grid and the log-sum-exp)
    let mut lse = Tensor::full(&[b, hq, max_q], f64::NEG_INFINITY, DType::F32, &dev)?;
    if total_q == 0 {
        return Ok((Tensor::empty(&[total_q, hq, d], q.dtype(), &dev)?, lse));
    }
    if total_k == 0 {
        return Ok((Tensor::zeros(&[total_q, hq, d], q.dtype(), &dev)?, lse));
    }
    let mut out = Tensor::empty(&[total_q, hq, d], q.dtype(), &dev)?;
    // the lengths' sum, not a sequence's: "no limit" for every sequence
    let (scale, group, left, right) = launch_scalars(opts, total_q, total_k, d, hq / hkv);
    let (cq, ck) = (cu_seqlens_q.contiguous()?, cu_seqlens_k.contiguous()?);
    kernels::attention_varlen(q, k, v, &cq, &ck, &mut out, &mut lse, scale, group, left, right)?;
    Ok((out, lse))
}

/// The kernel's scalars for `opts` at these lengths: (scale, group, left, right).
fn launch_scalars(opts: &AttentionOptions, sq: usize, skv: usize, d: usize, group: usize) -> (f32, i64, i64, i64) {
    let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt());
    // "no limit": one more than any distance between a query and a key
    let far = (sq + skv) as i64;
    let (left, right) = match opts.window {
        Some((l, r)) => ((l as i64).min(far), (r as i64).min(far)),
        None => (far, far),
    };
    (scale, group as i64, left, if opts.causal { 0 } else { right })
}
