//! Attention forward: [`attention`] and its options. The kernel is `kernels::attention`
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
    /// The factor on `q·kᵀ` before the softmax; `None` is `1/√D`. Finite.
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

/// Checks the arguments; returns `(B, Sq, Skv, Hq, Hkv, D)` of the `[B, S, H, D]` views.
fn check(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions) -> Result<[usize; 6]> {
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
        if !s.is_finite() {
            return Err(invalid(format!("scale must be finite, got {s}")));
        }
    }
    Ok([b, sq, skv, hq, hkv, d])
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
/// that is not finite (`InvalidArgument`).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::ops::{AttentionOptions, AttentionLayout};
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
/// # let _ = AttentionLayout::Bhsd;
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions) -> Result<(Tensor, Tensor)> {
    let [b, sq, skv, hq, hkv, d] = check(q, k, v, opts)?;
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
    let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt());
    // "no limit": one more than any distance between a query and a key
    let far = (sq + skv) as i64;
    let (left, right) = match opts.window {
        Some((l, r)) => ((l as i64).min(far), (r as i64).min(far)),
        None => (far, far),
    };
    let right = if opts.causal { 0 } else { right };
    let mut o = bshd(&out, opts.layout)?;
    let (qs, ks, vs) = (bshd(q, opts.layout)?, bshd(k, opts.layout)?, bshd(v, opts.layout)?);
    kernels::attention(&qs, &ks, &vs, &mut o, &mut lse, scale, (hq / hkv) as i64, left, right)?;
    Ok((out, lse))
}
