//! Rotary position embedding: [`rope`] and its options. The kernels are
//! `kernels::rope_offset`, `rope_pos`, `rope_table_offset` and `rope_table_pos` (one per
//! way of getting positions and angles); the head layout is a matter of strides, chosen
//! here.

use kfuse_ir::DType;
use kfuse_runtime::{Error, Result, Tensor};

use crate::kernels;

/// Which elements of a head form the rotated pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RopeLayout {
    /// `(x[j], x[j + D/2])` — GPT-NeoX, Llama, most current models.
    #[default]
    HalfSplit,
    /// `(x[2j], x[2j + 1])` — GPT-J, the original RoFormer.
    Interleaved,
}

/// The position of each token.
#[derive(Clone, Copy, Debug)]
pub enum Positions<'a> {
    /// `offset + s` for the token at sequence index `s` (for `[B, S, H, D]` inputs every
    /// sequence of the batch starts at `offset`; `[T, H, D]` inputs are one sequence).
    Offset(i64),
    /// One `i64` position per token: shape `[T]`, or `[B, S]` for `[B, S, H, D]` inputs.
    Tensor(&'a Tensor),
}

/// Where the rotation angles come from. Pair `j` of a token at position `p` turns by
/// `θ = p · base^(-2j/D)`.
#[derive(Clone, Copy, Debug)]
pub enum Freqs<'a> {
    /// Computed in the kernel, in f32.
    Computed {
        /// The base of the frequencies (10000 in most models); positive and finite.
        base: f32,
    },
    /// Read from tables: `cos[p, j] = cos θ`, `sin[p, j] = sin θ`, both `[P, D/2]` of one
    /// float dtype (f32 recommended). Positions must lie in `0..P`; a token whose position
    /// does not is left unchanged.
    Table {
        /// `cos θ` by position and pair.
        cos: &'a Tensor,
        /// `sin θ` by position and pair.
        sin: &'a Tensor,
    },
}

/// Options of [`rope`]. The default is half-split pairs, positions from 0 and angles
/// computed with base 10000.
#[derive(Clone, Copy, Debug)]
pub struct RopeOptions<'a> {
    /// Which elements of a head are paired.
    pub layout: RopeLayout,
    /// Each token's position.
    pub positions: Positions<'a>,
    /// The rotation angles.
    pub freqs: Freqs<'a>,
}

impl Default for RopeOptions<'_> {
    fn default() -> Self {
        RopeOptions { layout: RopeLayout::HalfSplit, positions: Positions::Offset(0), freqs: Freqs::Computed { base: 10000.0 } }
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(format!("kfuse::ops::rope: {msg}"))
}

fn shape_err(msg: String) -> Error {
    Error::ShapeMismatch(format!("kfuse::ops::rope: {msg}"))
}

/// `[B, S, H, D]` or `[T, H, D]` → (tokens, sequence length, heads, head dim).
fn dims(x: &Tensor, name: &str) -> Result<(usize, usize, usize, usize)> {
    match *x.shape() {
        // saturating: only an empty `x` ([2, MAX, 0, D]) has a `B · S` that does not fit
        [b, s, h, d] => Ok((b.saturating_mul(s), s, h, d)),
        [t, h, d] => Ok((t, t, h, d)),
        _ => Err(shape_err(format!("`{name}` must be [B, S, H, D] or [T, H, D], got shape {:?}", x.shape()))),
    }
}

/// The `[T, H, 2, D/2]` view of a `[.., H, D]` tensor whose index `(t, h, r, j)` is
/// element `r` of pair `j` of head `h` of token `t`, sharing its storage and strides
/// (`NonContiguous` when the leading dimensions do not merge into `T`).
fn pair_view(x: &Tensor, t: usize, h: usize, d: usize, layout: RopeLayout) -> Result<Tensor> {
    match layout {
        RopeLayout::HalfSplit => x.view(&[t, h, 2, d / 2]),
        RopeLayout::Interleaved => x.view(&[t, h, d / 2, 2])?.permute(&[0, 1, 3, 2]),
    }
}

/// Applies rotary position embedding to `q` and `k` in place, in one launch (one per
/// batch for the layouts named at the end).
///
/// `q` is `[B, S, HQ, D]` and `k` `[B, S, HK, D]` (or `[T, HQ, D]` and `[T, HK, D]`),
/// of any strides (written through them: a head slice of a larger tensor is rotated
/// where it lies), of one float dtype (f32, f16, bf16) and one device; `HQ` and `HK` may
/// differ (grouped-query attention), `D` is any even number. Each pair `(x1, x2)` of a
/// head (see [`RopeLayout`]) of a token at position `p` (see [`Positions`]) becomes
/// `(x1 cos θ − x2 sin θ, x2 cos θ + x1 sin θ)` with `θ = p · base^(-2j/D)` for pair `j`
/// (see [`Freqs`]), computed in f32 and rounded to the dtype once.
///
/// Errors (nothing is written): ranks or shapes that do not fit (`ShapeMismatch`), dtypes
/// (`DTypeMismatch`: q and k differ or are not floats, positions not i64, tables not
/// floats of one dtype), tensors on different devices (`DeviceMismatch`), `q` and `k` sharing
/// storage (`Aliasing`), an odd `D`, a base that is not positive and finite, an offset
/// that runs outside the tables or whose positions overflow i64 (`InvalidArgument`).
///
/// One launch, or one per batch where `B` and `S` of `q`, `k` or `[B, S]` positions do
/// not merge into one token dimension (a `[S, B, H, D]` tensor permuted to `[B, S, H, D]`).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// use kfuse::ops::{Positions, RopeOptions};
/// // one token at position 1, one head of dimension 2: the pair turns by 1 radian
/// let mut q = Tensor::from_f32(&[1., 0.], &[1, 1, 2], DType::F32, &dev)?;
/// let mut k = Tensor::from_f32(&[0., 1.], &[1, 1, 2], DType::F32, &dev)?;
/// kfuse::ops::rope(&mut q, &mut k, &RopeOptions { positions: Positions::Offset(1), ..Default::default() })?;
/// let (c, s) = (1f32.cos(), 1f32.sin());
/// let (q, k) = (q.to_vec_f32()?, k.to_vec_f32()?);
/// assert!((q[0] - c).abs() < 1e-6 && (q[1] - s).abs() < 1e-6);
/// assert!((k[0] + s).abs() < 1e-6 && (k[1] - c).abs() < 1e-6);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn rope(q: &mut Tensor, k: &mut Tensor, opts: &RopeOptions<'_>) -> Result<()> {
    // Shapes.
    if q.rank() != k.rank() {
        return Err(shape_err(format!("`q` and `k` must have the same rank, got shapes {:?} and {:?}", q.shape(), k.shape())));
    }
    let (t, s, hq, d) = dims(q, "q")?;
    let (tk, _, hk, dk) = dims(k, "k")?;
    if q.shape()[..q.rank() - 2] != k.shape()[..k.rank() - 2] || tk != t {
        return Err(shape_err(format!("`q` and `k` must have the same tokens (leading dimensions), got shapes {:?} and {:?}", q.shape(), k.shape())));
    }
    if dk != d {
        return Err(shape_err(format!("`q` and `k` must have the same head dimension, got {d} and {dk}")));
    }
    if d % 2 != 0 {
        return Err(invalid(format!("the head dimension must be even (pairs of elements rotate), got {d}")));
    }
    // Dtypes and devices.
    if q.dtype() != k.dtype() {
        return Err(Error::DTypeMismatch(format!("kfuse::ops::rope: `q` is {} but `k` is {}", q.dtype(), k.dtype())));
    }
    if !q.dtype().is_float() {
        return Err(Error::DTypeMismatch(format!("kfuse::ops::rope: `q` and `k` must be f32, f16 or bf16, got {}", q.dtype())));
    }
    if q.device() != k.device() {
        return Err(Error::DeviceMismatch(format!("kfuse::ops::rope: `q` is on {} but `k` is on {}", q.device().name(), k.device().name())));
    }
    if q.same_storage(k) {
        return Err(Error::Aliasing("kfuse::ops::rope: `q` and `k` share storage; they must be distinct tensors".into()));
    }
    let pos = match opts.positions {
        Positions::Offset(_) => None,
        Positions::Tensor(p) => {
            if p.dtype() != DType::I64 {
                return Err(Error::DTypeMismatch(format!("kfuse::ops::rope: positions must be i64, got {}", p.dtype())));
            }
            let want_bs = q.rank() == 4 && p.shape() == &q.shape()[..2];
            if p.shape() != [t] && !want_bs {
                let bs = if q.rank() == 4 { format!(" or {:?}", &q.shape()[..2]) } else { String::new() };
                return Err(shape_err(format!("positions must have shape [{t}]{bs} (one per token), got {:?}", p.shape())));
            }
            if p.device() != q.device() {
                return Err(Error::DeviceMismatch(format!("kfuse::ops::rope: positions are on {} but `q` is on {}", p.device().name(), q.device().name())));
            }
            Some(p)
        }
    };
    match opts.freqs {
        Freqs::Computed { base } => {
            if !(base.is_finite() && base > 0.0) {
                return Err(invalid(format!("the base must be positive and finite, got {base}")));
            }
        }
        Freqs::Table { cos, sin } => {
            if cos.rank() != 2 || cos.shape()[1] != d / 2 || sin.shape() != cos.shape() {
                return Err(shape_err(format!(
                    "the cos and sin tables must both be [P, {}] (one row per position, D/2 = {} columns), got {:?} and {:?}",
                    d / 2,
                    d / 2,
                    cos.shape(),
                    sin.shape()
                )));
            }
            if cos.dtype() != sin.dtype() || !cos.dtype().is_float() {
                return Err(Error::DTypeMismatch(format!(
                    "kfuse::ops::rope: the cos and sin tables must be floats of one dtype, got {} and {}",
                    cos.dtype(),
                    sin.dtype()
                )));
            }
            for (x, name) in [(cos, "cos"), (sin, "sin")] {
                if x.device() != q.device() {
                    return Err(Error::DeviceMismatch(format!("kfuse::ops::rope: the {name} table is on {} but `q` is on {}", x.device().name(), q.device().name())));
                }
            }
            if let Positions::Offset(o) = opts.positions {
                let p = cos.shape()[0] as i64;
                if t > 0 && (o < 0 || o.checked_add(s as i64).is_none_or(|end| end > p)) {
                    return Err(invalid(format!("positions {o}..{} run outside the {p} rows of the tables", o.saturating_add(s as i64))));
                }
            }
        }
    }
    if t == 0 || (hq == 0 && hk == 0) || d == 0 {
        return Ok(());
    }
    // the kernels compute `offset + s` in i64 (wrapping): every position must fit
    if let Positions::Offset(o) = opts.positions {
        if i64::try_from(s - 1).ok().and_then(|last| o.checked_add(last)).is_none() {
            return Err(invalid(format!("the positions of offset {o} and a sequence of {s} tokens run past i64::MAX")));
        }
    }
    match launch(q, k, pos, t, s, (hq, hk, d), opts) {
        Err(Error::NonContiguous { .. }) if q.rank() == 4 => {
            // `B` and `S` do not merge in some tensor: one launch per batch, on its
            // `[S, H, D]` views (the positions restart at `offset` in each, as they do in
            // one launch)
            let b = q.shape()[0];
            for i in 0..b {
                let one = |x: &Tensor| x.narrow(0, i, 1)?.view(&x.shape()[1..]);
                let p = match pos {
                    Some(p) if p.rank() == 1 => Some(p.narrow(0, i * s, s)?),
                    Some(p) => Some(one(p)?),
                    None => None,
                };
                launch(&one(q)?, &one(k)?, p.as_ref(), s, s, (hq, hk, d), opts)?;
            }
            Ok(())
        }
        r => r,
    }
}

/// One launch on `t` tokens of `q`, `k` (checked) and their positions (`[T]` or
/// `[B, S]`), read and written through their strides (`NonContiguous` when a tensor's
/// tokens do not form one dimension).
fn launch(q: &Tensor, k: &Tensor, pos: Option<&Tensor>, t: usize, s: usize, (hq, hk, d): (usize, usize, usize), opts: &RopeOptions<'_>) -> Result<()> {
    // The pair views; an empty side (no heads) gets a one-head scratch tensor, so that
    // the launch is not skipped for the other.
    let dev = q.device();
    let view = |x: &Tensor, h: usize| -> Result<Tensor> {
        if h == 0 {
            Tensor::zeros(&[t, 1, 2, d / 2], x.dtype(), &dev)
        } else {
            pair_view(x, t, h, d, opts.layout)
        }
    };
    let (mut qv, mut kv) = (view(q, hq)?, view(k, hk)?);
    let pos = pos.map(|p| p.view(&[t])).transpose()?;
    let (seq, offset) = (s as i64, match opts.positions { Positions::Offset(o) => o, Positions::Tensor(_) => 0 });
    match (&pos, opts.freqs) {
        (None, Freqs::Computed { base }) => kernels::rope_offset(&mut qv, &mut kv, seq, offset, base)?,
        (Some(p), Freqs::Computed { base }) => kernels::rope_pos(&mut qv, &mut kv, p, base)?,
        (None, Freqs::Table { cos, sin }) => kernels::rope_table_offset(&mut qv, &mut kv, cos, sin, seq, offset)?,
        (Some(p), Freqs::Table { cos, sin }) => kernels::rope_table_pos(&mut qv, &mut kv, p, cos, sin)?,
    };
    Ok(())
}
