#![deny(missing_docs)]
//! kfuse-ops: the standard kernels of kfuse, written in the kfuse language.
//!
//! [`kernels`] holds the `#[kfuse]` functions; the functions at the crate root are the
//! public API (`kfuse::ops::add(&a, &b)`): they check arguments, allocate the output
//! on the inputs' device and launch. Bad input is an `Err`, never a panic:
//! - shapes or dtypes that differ → `Error::ShapeMismatch` / `Error::DTypeMismatch`;
//! - integer tensors → `Error::InvalidArgument` (every op here computes on floats; a
//!   contiguous integer tensor still gets [`contiguous`]'s view of itself);
//! - empty tensors → an empty result, no launch;
//! - strided inputs (a transposed or narrowed view, any rank) are taken as PyTorch takes
//!   them, and outputs are always new contiguous tensors: see "Strided inputs" below;
//! - tensors on different devices → `Error::DeviceMismatch`;
//! - sizes: any, past 2^31 elements included (64-bit offsets; a long program axis runs
//!   along the grid's x). Refused with `Error::InvalidArgument` naming the limit: a
//!   launch of 2^31 or more programs along x, or of two axes of more than 65535 each,
//!   and, on sm_90a, a 16-bit, 8-bit or TF32 matrix product with an operand or output
//!   dimension above 2^31 (TMA coordinates are signed 32-bit).
//!
//! Row ops work along the last dimension: reductions ([`sum`], [`mean`], [`max`],
//! [`min`] with [`Dim::Last`], or over everything with [`Dim::All`]), [`softmax`],
//! [`log_softmax`], [`rms_norm`], [`add_rms_norm`] and [`layer_norm`]. They view `x` as
//! `[M, N]` rows (`N` the last dimension, rank 1 is one row), compute in f32 and round
//! to `x`'s dtype once; per-row results (and the norms' f32 statistics) have `x`'s shape
//! without its last dimension. `x` is a float tensor (an integer one is an
//! `Error::InvalidArgument`, empty or not). `M = 0` gives empty results; rows of `N = 0`
//! elements are an `Error::InvalidArgument` for softmax and the norms (sums of them are
//! 0, means NaN, max and min an error, as in PyTorch).
//!
//! [`gemm`] multiplies matrices: `a: [M, K]` by `b: [K, N]` of one float dtype, any
//! strides, accumulated in f32 and rounded to the inputs' dtype once. [`gemm_ex`] adds
//! [`GemmOptions`]: `out = alpha · a·b + beta · c` and the output dtype; [`gemm_batched`]
//! and [`gemm_batched_ex`] take leading batch dimensions (`b` may be shared by the
//! batch). Each is one launch of a `#[kfuse]` kernel whose epilogue does the scaling.
//!
//! [`attention`] is flash attention forward (options: [`AttentionOptions`]): causal
//! (aligned to the bottom right), sliding windows, grouped-query heads, `[B, S, H, D]` or
//! `[B, H, S, D]`, D up to 256, with the f32 log-sum-exp of each row; one launch of
//! `kernels::attention`. [`attention_varlen`] takes packed sequences of different lengths
//! (`cu_seqlens`) in one launch.
//!
//! [`conv2d`] is 2-D convolution of NHWC activations with `[K, R, S, C / groups]`
//! filters (options: [`Conv2dOptions`]: stride, padding, dilation, groups, bias,
//! [`Activation`]): an implicit GEMM whose rows gather their input pixels, a depthwise
//! kernel, for 1 × 1 stride-1 layers a GEMM on the tensors as they lie, or for f32 3 × 3
//! stride-1 layers Winograd F(2 × 2, 3 × 3).
//!
//! [`warm`] compiles the kernels of a list of op calls ahead of time (`gemm bf16
//! 4096x4096 4096x4096`, a line each: [`parse_warm_list`]), so that a later process finds
//! them in the disk cache: its first call of each then loads a cubin instead of
//! compiling.
//!
//! # Examples
//!
//! The examples here are written against the facade crate (`kfuse::ops`, `kfuse::Tensor`)
//! and run on the CPU interpreter; a tensor made on `Device::gpu(0)?` runs the same
//! calls on the GPU.
//!
//! ```
//! # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
//! use kfuse::{DType, Device, Tensor};
//!
//! let dev = Device::cpu();
//! let x = Tensor::from_f32(&[1., 2., 3., 4., 5., 6.], &[2, 3], DType::BF16, &dev)?;
//! let y = kfuse::ops::scale(&x, 0.5)?;
//! let s = kfuse::ops::softmax(&kfuse::ops::add(&x, &y)?)?; // rows of 3
//! let rows = kfuse::ops::sum(&s, kfuse::ops::Dim::Last)?; // [2]
//! assert!(rows.to_vec_f32()?.iter().all(|v| (v - 1.0).abs() < 1e-2));
//! let t = kfuse::ops::transpose(&x)?; // [3, 2], contiguous
//! assert_eq!(t.to_vec_f32()?, [1., 4., 2., 5., 3., 6.]);
//! # Ok::<(), kfuse::Error>(())
//! ```
//!
//! # Strided inputs
//!
//! Every op takes inputs of any strides; a contiguous input takes the same kernel and
//! launch as ever. Which ops read strides as they lie and which make one internal copy:
//! - elementwise ops ([`add`], [`sub`], [`mul`], [`div`], [`swiglu`], [`scale`], [`silu`],
//!   [`gelu`], [`gelu_tanh`]), [`copy`] and [`contiguous`]: read as they lie. The
//!   operands' dimensions are merged where all their strides allow; one strided dimension
//!   takes the 1-D kernel, two or three the `[NB, M, N]` kernels (`kernels::add3d` …),
//!   and more than three one such launch per index of the leading dimensions. Operands
//!   may be strided differently (a transposed `a` plus a contiguous `b`).
//! - row ops and last-axis reductions ([`softmax`], [`log_softmax`], [`rms_norm`],
//!   [`add_rms_norm`], [`layer_norm`], [`sum`]/[`mean`]/[`max`]/[`min`] with
//!   [`Dim::Last`]): `x` (and the residual `r`) read as it lies when its rows are
//!   unit-stride and its leading dimensions merge into one (a row or column slice of a
//!   matrix, or of a batch); otherwise (a transposed matrix, rows with a stride, a
//!   permuted batch) one internal contiguous copy first ([`copy`]: one extra read and
//!   write). Weights and biases of shape `[N]` are read as they lie, any stride.
//! - whole-tensor reductions ([`Dim::All`]): read as they lie when the elements form one
//!   strided run once the dimensions are ordered by stride (a transposed or permuted
//!   tensor is reduced in memory order); otherwise (a narrowed matrix) one internal
//!   contiguous copy.
//! - [`transpose`], [`gemm`] and the other matrix products: any strides (see each).
//! - [`rope`] rotates `q` and `k` in place, writing through their strides: one launch
//!   when `B` and `S` merge into one token dimension (a head slice of a larger tensor
//!   does), else one launch per batch. `q` and `k` still need storage of their own.

mod attention;
mod conv;
pub mod kernels;
mod matmul;
mod rope;
mod warm;

pub use attention::{attention, attention_varlen, AttentionLayout, AttentionOptions};
pub use conv::{conv2d, Activation, Conv2dOptions};
pub use matmul::{gemm_batched, gemm_batched_ex, gemm_ex, gemm_grouped, gemm_grouped_ex, swiglu_gemm, GemmOptions};
pub use warm::{parse_warm_list, warm, WarmCall, WARM_OPS};
pub use rope::{rope, Freqs, Positions, RopeLayout, RopeOptions};

#[doc(hidden)]
pub mod deps {
    pub use kfuse_ir as ir;
    pub use kfuse_runtime as runtime;
}

use kfuse_runtime::{DType, Device, Error, Result, Tensor};

fn same(a: &Tensor, b: &Tensor, what: &str) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch(format!("{what}: {} vs {}", a.dtype(), b.dtype())));
    }
    if a.shape() != b.shape() {
        return Err(Error::ShapeMismatch(format!("{what}: {:?} vs {:?}", a.shape(), b.shape())));
    }
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch(format!("{what}: {} vs {}", a.device().name(), b.device().name())));
    }
    Ok(())
}

fn flat(x: &Tensor, what: &str, arg: &str) -> Result<Tensor> {
    if !x.is_contiguous() {
        return Err(Error::NonContiguous { what: format!("kfuse::ops::{what} (argument `{arg}`)"), shape: x.shape().to_vec(), strides: x.strides().to_vec() });
    }
    x.reshape(&[x.numel()])
}

type Binary = fn(&Tensor, &Tensor, &mut Tensor) -> Result<kfuse_runtime::Launched>;
type Unary = fn(&Tensor, &mut Tensor) -> Result<kfuse_runtime::Launched>;

fn binary(a: &Tensor, b: &Tensor, what: &str, k: Binary, k3: Binary) -> Result<Tensor> {
    same(a, b, what)?;
    float_x(a, what, "a")?;
    let out = Tensor::empty(a.shape(), a.dtype(), &a.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    if !(a.is_contiguous() && b.is_contiguous()) {
        strided(&[a, b], &out, &mut |v, o| {
            if o.rank() == 1 {
                k(&v[0], &v[1], o)
            } else {
                k3(&v[0], &v[1], o)
            }
        })?;
        return Ok(out);
    }
    if out.rank() == 1 {
        // already the kernel's rank-1 shape: no views to make (host time a call)
        let mut out = out;
        k(a, b, &mut out)?;
        return Ok(out);
    }
    let (fa, fb) = (flat(a, what, "a")?, flat(b, what, "b")?);
    let mut fo = out.reshape(&[out.numel()])?;
    k(&fa, &fb, &mut fo)?;
    Ok(out)
}

fn unary(x: &Tensor, what: &str, k: Unary, k3: Unary) -> Result<Tensor> {
    float_x(x, what, "x")?;
    let out = Tensor::empty(x.shape(), x.dtype(), &x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    if !x.is_contiguous() {
        strided(&[x], &out, &mut |v, o| if o.rank() == 1 { k(&v[0], o) } else { k3(&v[0], o) })?;
        return Ok(out);
    }
    if out.rank() == 1 {
        let mut out = out;
        k(x, &mut out)?;
        return Ok(out);
    }
    let fx = flat(x, what, "x")?;
    let mut fo = out.reshape(&[out.numel()])?;
    k(&fx, &mut fo)?;
    Ok(out)
}

/// The shape of `shape` without its size-1 dimensions and with adjacent dimensions
/// merged wherever every view of `strides` allows it (`s[d] = s[d + 1] · shape[d + 1]`
/// between the kept dimensions): the fewest dimensions all the views share. At least one
/// dimension.
fn merged_shape(shape: &[usize], strides: &[&[isize]]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    let mut prev: Option<usize> = None;
    for d in (0..shape.len()).filter(|&d| shape[d] != 1) {
        match (prev, out.last_mut()) {
            (Some(p), Some(last)) if strides.iter().all(|s| s[p] == s[d].saturating_mul(shape[d] as isize)) => *last *= shape[d],
            _ => out.push(shape[d]),
        }
        prev = Some(d);
    }
    if out.is_empty() {
        out.push(1);
    }
    out
}

/// Calls `k` on views of the inputs `ins` and the output `out` (one shape, not empty;
/// `out` new and contiguous), strides as they lie: their dimensions merged as far as all
/// of them allow; one merged dimension gives rank-1 views, two or three `[NB, M, N]`
/// views (padded with leading 1s), and more than three one call per index of the leading
/// dimensions.
fn strided(ins: &[&Tensor], out: &Tensor, k: &mut dyn FnMut(&[Tensor], &mut Tensor) -> Result<kfuse_runtime::Launched>) -> Result<()> {
    let strides: Vec<&[isize]> = ins.iter().map(|t| t.strides()).chain([out.strides()]).collect();
    let shape = merged_shape(out.shape(), &strides);
    let views = ins.iter().map(|t| t.view(&shape)).collect::<Result<Vec<_>>>()?;
    let mut o = out.view(&shape)?;
    if shape.len() == 1 {
        k(&views, &mut o)?;
        return Ok(());
    }
    each3d(views, o, k)
}

fn each3d(ins: Vec<Tensor>, out: Tensor, k: &mut dyn FnMut(&[Tensor], &mut Tensor) -> Result<kfuse_runtime::Launched>) -> Result<()> {
    if out.rank() <= 3 {
        let pad = |mut t: Tensor| -> Result<Tensor> {
            while t.rank() < 3 {
                t = t.unsqueeze(0)?;
            }
            Ok(t)
        };
        let ins = ins.into_iter().map(pad).collect::<Result<Vec<_>>>()?;
        k(&ins, &mut pad(out)?)?;
        return Ok(());
    }
    let rest = out.shape()[1..].to_vec();
    for i in 0..out.shape()[0] {
        let sub = |t: &Tensor| t.narrow(0, i, 1)?.view(&rest);
        each3d(ins.iter().map(sub).collect::<Result<Vec<_>>>()?, sub(&out)?, k)?;
    }
    Ok(())
}

/// `a + b`, elementwise.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let a = Tensor::from_f32(&[1., 2., 3., 4.], &[2, 2], DType::F32, &dev)?;
/// let b = Tensor::from_f32(&[10., 20., 30., 40.], &[2, 2], DType::F32, &dev)?;
/// assert_eq!(kfuse::ops::add(&a, &b)?.to_vec_f32()?, [11., 22., 33., 44.]);
/// // a transposed view is read as it lies, no copy first
/// assert_eq!(kfuse::ops::add(&a.t(), &b)?.to_vec_f32()?, [11., 23., 32., 44.]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, "add", kernels::add, kernels::add3d)
}
/// `a - b`, elementwise.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let a = Tensor::full(&[3], 5.0, DType::BF16, &dev)?;
/// let b = Tensor::from_f32(&[1., 2., 3.], &[3], DType::BF16, &dev)?;
/// assert_eq!(kfuse::ops::sub(&a, &b)?.to_vec_f32()?, [4., 3., 2.]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, "sub", kernels::sub, kernels::sub3d)
}
/// `a * b`, elementwise.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[0., 1., 2., 3., 4., 5.], &[6], DType::F16, &dev)?;
/// // every other element times the first three
/// let y = kfuse::ops::mul(&x.view(&[3, 2])?.narrow(1, 0, 1)?, &x.narrow(0, 0, 3)?.view(&[3, 1])?)?;
/// assert_eq!(y.to_vec_f32()?, [0., 2., 8.]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, "mul", kernels::mul, kernels::mul3d)
}
/// `a / b`, elementwise.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let a = Tensor::from_f32(&[1., 1.], &[2], DType::F32, &dev)?;
/// let b = Tensor::from_f32(&[4., 0.], &[2], DType::F32, &dev)?;
/// assert_eq!(kfuse::ops::div(&a, &b)?.to_vec_f32()?, [0.25, f32::INFINITY]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn div(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, "div", kernels::div, kernels::div3d)
}
/// `silu(g) * u`, elementwise (the SwiGLU activation).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let g = Tensor::from_f32(&[0., 10.], &[2], DType::F32, &dev)?;
/// let u = Tensor::from_f32(&[3., 2.], &[2], DType::F32, &dev)?;
/// let y = kfuse::ops::swiglu(&g, &u)?.to_vec_f32()?; // [0 · 3, silu(10) · 2]
/// assert_eq!(y[0], 0.0);
/// assert!((y[1] - 2.0 * 10.0 / (1.0 + (-10f32).exp())).abs() < 1e-4);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn swiglu(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    binary(g, u, "swiglu", kernels::swiglu, kernels::swiglu3d)
}
/// `x * s`.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[1., -2.], &[2], DType::BF16, &dev)?;
/// assert_eq!(kfuse::ops::scale(&x, 0.5)?.to_vec_f32()?, [0.5, -1.0]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn scale(x: &Tensor, s: f32) -> Result<Tensor> {
    float_x(x, "scale", "x")?;
    let out = Tensor::empty(x.shape(), x.dtype(), &x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    if !x.is_contiguous() {
        strided(&[x], &out, &mut |v, o| if o.rank() == 1 { kernels::scale(&v[0], o, s) } else { kernels::scale3d(&v[0], o, s) })?;
        return Ok(out);
    }
    let fx = flat(x, "scale", "x")?;
    let mut fo = out.reshape(&[out.numel()])?;
    kernels::scale(&fx, &mut fo, s)?;
    Ok(out)
}
/// SiLU, `x * sigmoid(x)`.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[0., 1.], &[2], DType::F32, &dev)?;
/// let y = kfuse::ops::silu(&x)?.to_vec_f32()?;
/// assert_eq!(y[0], 0.0);
/// assert!((y[1] - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn silu(x: &Tensor) -> Result<Tensor> {
    unary(x, "silu", kernels::silu, kernels::silu3d)
}
/// GELU (erf form).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[0., 3.], &[2], DType::F32, &dev)?;
/// let y = kfuse::ops::gelu(&x)?.to_vec_f32()?; // x · Φ(x)
/// assert_eq!(y[0], 0.0);
/// assert!((y[1] - 2.99595).abs() < 1e-4);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    unary(x, "gelu", kernels::gelu, kernels::gelu3d)
}
/// GELU (tanh approximation).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[-1., 1.], &[2], DType::F32, &dev)?;
/// let (erf, tanh) = (kfuse::ops::gelu(&x)?.to_vec_f32()?, kfuse::ops::gelu_tanh(&x)?.to_vec_f32()?);
/// assert!(erf.iter().zip(&tanh).all(|(a, b)| (a - b).abs() < 1e-3)); // close, not equal
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    unary(x, "gelu_tanh", kernels::gelu_tanh, kernels::gelu_tanh3d)
}

/// A contiguous copy of `x`, of any strides and rank (strides read as they lie: one
/// launch up to rank 3, and above that one per index of the leading dimensions that do
/// not merge).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[1., 2., 3., 4., 5., 6.], &[2, 3], DType::F32, &dev)?;
/// let y = kfuse::ops::copy(&x.t())?; // [3, 2], packed
/// assert!(y.is_contiguous() && !y.same_storage(&x));
/// assert_eq!(y.to_vec_f32()?, [1., 4., 2., 5., 3., 6.]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn copy(x: &Tensor) -> Result<Tensor> {
    float_x(x, "copy", "x")?;
    let out = Tensor::empty(x.shape(), x.dtype(), &x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    if x.is_contiguous() {
        let fx = x.reshape(&[x.numel()])?;
        let mut fo = out.reshape(&[out.numel()])?;
        kernels::copy(&fx, &mut fo)?;
        return Ok(out);
    }
    match x.shape().len() {
        1 => {
            let mut fo = out.reshape(&[1, out.numel()])?;
            kernels::copy2d(&x.unsqueeze(0)?, &mut fo)?;
            Ok(out)
        }
        2 => {
            let mut out = out;
            kernels::copy2d(x, &mut out)?;
            Ok(out)
        }
        3 => {
            let mut out = out;
            kernels::copy3d(x, &mut out)?;
            Ok(out)
        }
        _ => {
            strided(&[x], &out, &mut |v, o| if o.rank() == 1 { kernels::copy(&v[0], o) } else { kernels::copy3d(&v[0], o) })?;
            Ok(out)
        }
    }
}

/// `x` itself if contiguous (a cheap view), else a contiguous copy.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::zeros(&[4, 4], DType::F32, &dev)?;
/// assert!(kfuse::ops::contiguous(&x)?.same_storage(&x)); // already packed: a view
/// assert!(!kfuse::ops::contiguous(&x.t())?.same_storage(&x)); // a copy
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn contiguous(x: &Tensor) -> Result<Tensor> {
    if x.is_contiguous() {
        Ok(x.clone())
    } else {
        copy(x)
    }
}

/// The transpose of a 2-D tensor (any strides), as a new contiguous tensor.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[1., 2., 3., 4., 5., 6.], &[3, 2], DType::BF16, &dev)?;
/// let t = kfuse::ops::transpose(&x)?;
/// assert_eq!((t.shape(), t.to_vec_f32()?), (&[2, 3][..], vec![1., 3., 5., 2., 4., 6.]));
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn transpose(x: &Tensor) -> Result<Tensor> {
    if x.shape().len() != 2 {
        return Err(Error::InvalidArgument(format!("transpose: expected a 2-D tensor, got shape {:?}", x.shape())));
    }
    let (m, n) = (x.shape()[0], x.shape()[1]);
    let mut out = Tensor::empty(&[n, m], x.dtype(), &x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    kernels::transpose(x, &mut out)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Reductions, softmax and norms. Rows: a tensor of rank ≥ 2 is viewed as `[M, N]` with `N`
// its last dimension and `M` the product of the others; rank 1 is one row `[1, N]`. Row
// results (a last-axis reduction, a norm's statistics) have the input's shape without its
// last dimension. Inputs of any strides are read as they lie where the leading dimensions
// merge into `M` (else copied first: `rows_of`); `M = 0` gives empty results without a
// launch.

/// The axes a reduction runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// The last axis: `[.., N]` → `[..]` (a rank-1 input gives a rank-0 result).
    Last,
    /// Every element: a rank-0 result. Two or more launches (chunks of
    /// [`kernels::CHUNK`] elements into f32 partials, then the partials), with the same
    /// bits on every run.
    All,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
}

impl Red {
    fn name(self) -> &'static str {
        match self {
            Red::Sum => "sum",
            Red::Mean => "mean",
            Red::Max => "max",
            Red::Min => "min",
        }
    }
}

/// `x` as `[M, N]` rows, and the shape of a per-row result (`x`'s shape without its last
/// dimension).
fn as_rows(x: &Tensor, what: &str, arg: &str) -> Result<(Tensor, Vec<usize>)> {
    let r = x.rank();
    if r == 0 {
        return Err(Error::InvalidArgument(format!(
            "kfuse::ops::{what}: `{arg}` is a scalar (rank 0); it works along the last dimension of a tensor of rank ≥ 1"
        )));
    }
    float_x(x, what, arg)?;
    let n = x.shape()[r - 1];
    let lead = x.shape()[..r - 1].to_vec();
    // an empty `x` ([MAX, 2, 0]) may have leading sizes whose product does not fit: its
    // rows are then "many" (saturated; a per-row result of that shape cannot exist)
    let m = if lead.contains(&0) { 0 } else { lead.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX) };
    Ok((rows_of(x, m, n)?, lead))
}

/// `x` (of `m · n` elements, `n` its last dimension) as `[m, n]` rows: a view, strides as
/// they lie, when each row is unit-stride and the leading dimensions merge (a row or
/// column slice of a matrix or of a batch); else a contiguous copy (one launch of
/// [`copy`]). A row kernel holds a whole row in one tile: reading rows across the unit
/// stride (a transposed matrix) would take a layout conversion through shared memory
/// that long rows do not fit (64 KiB for 16384 f32 elements), and strided rows lose the
/// vector loads; the copy reads a transposed tile by tile.
fn rows_of(x: &Tensor, m: usize, n: usize) -> Result<Tensor> {
    if n <= 1 || x.strides().last() == Some(&1) {
        match x.view(&[m, n]) {
            Err(Error::NonContiguous { .. }) => {}
            v => return v,
        }
    }
    copy(x)?.reshape(&[m, n])
}

/// `x` (not empty) as one dimension for a whole-tensor reduction, whose result does not
/// depend on the order of the elements: `x` itself when its elements form one strided
/// run once its dimensions are ordered by stride (a transposed or permuted tensor is
/// its storage read in order), else a contiguous copy.
fn flat_any(x: &Tensor) -> Result<Tensor> {
    let n = x.numel();
    if x.is_contiguous() {
        return x.reshape(&[n]);
    }
    let mut order: Vec<usize> = (0..x.rank()).collect();
    order.sort_by_key(|&d| std::cmp::Reverse(x.strides()[d]));
    match x.permute(&order)?.view(&[n]) {
        Err(Error::NonContiguous { .. }) => copy(x)?.reshape(&[n]),
        v => v,
    }
}

/// The elementwise ops, the row ops and the reductions take floats only (their kernels
/// are `T: Float`); said before any shortcut for empty sizes, so that an integer tensor
/// is refused whatever its shape.
fn float_x(x: &Tensor, what: &str, arg: &str) -> Result<()> {
    if x.dtype().is_float() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "kfuse::ops::{what}: `{arg}` has dtype {}; {what} takes f32, f16, bf16, f8e4m3 or f8e5m2",
        x.dtype()
    )))
}

/// Same dtype, device and exact shape as `want` (a weight or bias of shape `[N]`, a
/// residual of `x`'s shape); any strides.
fn like(t: &Tensor, dtype: DType, shape: &[usize], dev: &Device, what: &str, arg: &str) -> Result<()> {
    if t.dtype() != dtype {
        return Err(Error::DTypeMismatch(format!("kfuse::ops::{what}: `{arg}` is {} but `x` is {dtype}", t.dtype())));
    }
    if t.shape() != shape {
        return Err(Error::ShapeMismatch(format!("kfuse::ops::{what}: `{arg}` has shape {:?}, expected {shape:?}", t.shape())));
    }
    if &t.device() != dev {
        return Err(Error::DeviceMismatch(format!("kfuse::ops::{what}: `{arg}` is on {} but `x` is on {}", t.device().name(), dev.name())));
    }
    Ok(())
}

fn check_eps(eps: f32, what: &str) -> Result<()> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("kfuse::ops::{what}: eps must be finite and ≥ 0, got {eps}")))
    }
}

/// Rows of an op that needs at least one element per row (softmax, norms).
fn nonempty_rows(n: usize, m: usize, what: &str) -> Result<()> {
    if n == 0 && m > 0 {
        return Err(Error::InvalidArgument(format!(
            "kfuse::ops::{what}: the last dimension of `x` is 0; {what} needs rows of at least one element"
        )));
    }
    Ok(())
}

fn reduce(x: &Tensor, dim: Dim, op: Red) -> Result<Tensor> {
    match dim {
        Dim::Last => reduce_last(x, op),
        Dim::All => reduce_all(x, op),
    }
}

/// A reduction over no elements, as PyTorch defines it: sum 0, mean NaN, max and min an
/// error (`why` says which elements are missing).
fn reduce_nothing(mut out: Tensor, op: Red, why: &str) -> Result<Tensor> {
    let what = op.name();
    match op {
        Red::Sum => out.fill(0.0)?,
        Red::Mean => out.fill(f64::NAN)?,
        _ => return Err(Error::InvalidArgument(format!("kfuse::ops::{what}: {why} and {what} of no elements is undefined"))),
    }
    Ok(out)
}

fn reduce_last(x: &Tensor, op: Red) -> Result<Tensor> {
    let what = op.name();
    let (rows, lead) = as_rows(x, what, "x")?;
    let (m, n) = (rows.shape()[0], rows.shape()[1]);
    let out = Tensor::empty(&lead, x.dtype(), &x.device())?;
    if m == 0 {
        return Ok(out);
    }
    if n == 0 {
        return reduce_nothing(out, op, &format!("the last dimension of `x` (shape {:?}) is 0", x.shape()));
    }
    let mut o = out.reshape(&[m])?;
    match op {
        Red::Sum => kernels::row_sum(&rows, &mut o)?,
        Red::Mean => kernels::row_mean(&rows, &mut o)?,
        Red::Max => kernels::row_max(&rows, &mut o)?,
        Red::Min => kernels::row_min(&rows, &mut o)?,
    };
    Ok(out)
}

fn reduce_all(x: &Tensor, op: Red) -> Result<Tensor> {
    let what = op.name();
    float_x(x, what, "x")?;
    let n = x.numel();
    let dev = x.device();
    let out = Tensor::empty(&[], x.dtype(), &dev)?;
    if n == 0 {
        return reduce_nothing(out, op, &format!("`x` (shape {:?}) is empty", x.shape()));
    }
    let mut cur = flat_any(x)?;
    loop {
        let parts = cur.numel().div_ceil(kernels::CHUNK);
        let last = parts == 1;
        // Partials stay f32 until the last stage, which rounds to the input's dtype once.
        let mut p = if last { out.reshape(&[1])? } else { Tensor::empty(&[parts], DType::F32, &dev)? };
        match op {
            Red::Sum => kernels::sum_chunks(&cur, &mut p, 1.0)?,
            Red::Mean => kernels::sum_chunks(&cur, &mut p, if last { n as f32 } else { 1.0 })?,
            Red::Max => kernels::max_chunks(&cur, &mut p)?,
            Red::Min => kernels::min_chunks(&cur, &mut p)?,
        };
        if last {
            return Ok(out);
        }
        cur = p;
    }
}

/// The sum along `dim`, accumulated in f32, in `x`'s dtype. Empty: 0.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// use kfuse::ops::Dim;
/// let x = Tensor::from_f32(&[1., 2., 3., 4., 5., 6.], &[2, 3], DType::F32, &dev)?;
/// assert_eq!(kfuse::ops::sum(&x, Dim::Last)?.to_vec_f32()?, [6., 15.]); // shape [2]
/// let all = kfuse::ops::sum(&x, Dim::All)?; // shape []
/// assert_eq!((all.rank(), all.to_vec_f32()?), (0, vec![21.]));
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn sum(x: &Tensor, dim: Dim) -> Result<Tensor> {
    reduce(x, dim, Red::Sum)
}
/// The mean along `dim`, accumulated in f32, in `x`'s dtype. Empty: NaN.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[1., 2., 3., 4.], &[2, 2], DType::F32, &dev)?;
/// // over the columns: the mean of the transposed view's rows
/// assert_eq!(kfuse::ops::mean(&x.t(), kfuse::ops::Dim::Last)?.to_vec_f32()?, [2., 3.]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn mean(x: &Tensor, dim: Dim) -> Result<Tensor> {
    reduce(x, dim, Red::Mean)
}
/// The maximum along `dim` (exact). Over no elements: an error.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[3., -1., 7., 2.], &[4], DType::F16, &dev)?;
/// assert_eq!(kfuse::ops::max(&x, kfuse::ops::Dim::All)?.to_vec_f32()?, [7.]);
/// let none = Tensor::zeros(&[0], DType::F16, &dev)?;
/// assert!(kfuse::ops::max(&none, kfuse::ops::Dim::All).is_err()); // no elements
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn max(x: &Tensor, dim: Dim) -> Result<Tensor> {
    reduce(x, dim, Red::Max)
}
/// The minimum along `dim` (exact). Over no elements: an error.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[3., -1., 7., 2.], &[2, 2], DType::F32, &dev)?;
/// assert_eq!(kfuse::ops::min(&x, kfuse::ops::Dim::Last)?.to_vec_f32()?, [-1., 2.]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn min(x: &Tensor, dim: Dim) -> Result<Tensor> {
    reduce(x, dim, Red::Min)
}

fn row_op(x: &Tensor, what: &str, k: Unary) -> Result<Tensor> {
    let (rows, _) = as_rows(x, what, "x")?;
    let (m, n) = (rows.shape()[0], rows.shape()[1]);
    nonempty_rows(n, m, what)?;
    let out = Tensor::empty(x.shape(), x.dtype(), &x.device())?;
    if m == 0 {
        return Ok(out);
    }
    k(&rows, &mut out.reshape(&[m, n])?)?;
    Ok(out)
}

/// Softmax along the last dimension, computed in f32 (PyTorch's semantics: a row of
/// only `-inf` gives NaN).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[0., 0., f32::NEG_INFINITY, 1.], &[2, 2], DType::F32, &dev)?;
/// let p = kfuse::ops::softmax(&x)?.to_vec_f32()?;
/// assert_eq!(&p[..3], [0.5, 0.5, 0.0]);
/// assert_eq!(p[3], 1.0);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    row_op(x, "softmax", kernels::softmax)
}

/// Log-softmax along the last dimension, computed in f32 (a row of only `-inf` gives
/// NaN; `-inf` elements of other rows give `-inf`).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[0., 0.], &[2], DType::F32, &dev)?;
/// let l = kfuse::ops::log_softmax(&x)?.to_vec_f32()?;
/// assert!(l.iter().all(|v| (v + std::f32::consts::LN_2).abs() < 1e-6));
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    row_op(x, "log_softmax", kernels::log_softmax)
}

/// Shapes and outputs shared by the norms: `x` as rows, `y` like `x`, and an f32 per-row
/// statistic.
struct NormIo {
    rows: Tensor,
    m: usize,
    n: usize,
    y: Tensor,
    lead: Vec<usize>,
}

fn norm_io(x: &Tensor, what: &str, eps: f32) -> Result<NormIo> {
    check_eps(eps, what)?;
    let (rows, lead) = as_rows(x, what, "x")?;
    let (m, n) = (rows.shape()[0], rows.shape()[1]);
    nonempty_rows(n, m, what)?;
    let y = Tensor::empty(x.shape(), x.dtype(), &x.device())?;
    Ok(NormIo { rows, m, n, y, lead })
}

fn stat(lead: &[usize], x: &Tensor) -> Result<Tensor> {
    Tensor::empty(lead, DType::F32, &x.device())
}

/// RMSNorm along the last dimension: `y = x * rstd [* w] [+ b]` with
/// `rstd = 1 / sqrt(mean(x²) + eps)`, in f32, rounded to `x`'s dtype. Returns `(y, rstd)`;
/// `rstd` (f32) has `x`'s shape without its last dimension. `w` and `b` have shape `[N]`
/// and `x`'s dtype; a bias needs a weight.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[3., 4., 0., 0.], &[2, 2], DType::F32, &dev)?;
/// let w = Tensor::from_f32(&[1., 2.], &[2], DType::F32, &dev)?;
/// let (y, rstd) = kfuse::ops::rms_norm(&x, Some(&w), None, 0.0)?;
/// let r = 1.0 / 12.5f32.sqrt(); // 1 / sqrt(mean(3², 4²))
/// assert!((rstd.to_vec_f32()?[0] - r).abs() < 1e-6);
/// assert!((y.to_vec_f32()?[1] - 4.0 * r * 2.0).abs() < 1e-5);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn rms_norm(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, eps: f32) -> Result<(Tensor, Tensor)> {
    const WHAT: &str = "rms_norm";
    let io = norm_io(x, WHAT, eps)?;
    let dev = x.device();
    for (t, arg) in [(w, "w"), (b, "b")] {
        if let Some(t) = t {
            like(t, x.dtype(), &[io.n], &dev, WHAT, arg)?;
        }
    }
    if b.is_some() && w.is_none() {
        return Err(Error::InvalidArgument("kfuse::ops::rms_norm: a bias `b` needs a weight `w` (pass the weight, or no bias)".into()));
    }
    let rstd = stat(&io.lead, x)?;
    if io.m == 0 {
        return Ok((io.y, rstd));
    }
    let (mut y2, mut r1) = (io.y.reshape(&[io.m, io.n])?, rstd.reshape(&[io.m])?);
    match (w, b) {
        (None, _) => kernels::rms_norm(&io.rows, &mut y2, &mut r1, eps)?,
        (Some(w), None) => kernels::rms_norm_w(&io.rows, w, &mut y2, &mut r1, eps)?,
        (Some(w), Some(b)) => kernels::rms_norm_wb(&io.rows, w, b, &mut y2, &mut r1, eps)?,
    };
    Ok((io.y, rstd))
}

/// Residual add, then RMSNorm: `s = x + r` (rounded to the dtype), `y = s * rstd [* w]`
/// with `rstd = 1 / sqrt(mean(s²) + eps)` in f32. One launch; returns `(s, y, rstd)`.
/// `r` has `x`'s shape and dtype; `w` has shape `[N]`.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[1., 2.], &[1, 2], DType::BF16, &dev)?;
/// let r = Tensor::from_f32(&[2., 2.], &[1, 2], DType::BF16, &dev)?;
/// let (s, y, _rstd) = kfuse::ops::add_rms_norm(&x, &r, None, 1e-6)?;
/// assert_eq!(s.to_vec_f32()?, [3., 4.]); // the new residual
/// assert_eq!(y.shape(), [1, 2]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn add_rms_norm(x: &Tensor, r: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<(Tensor, Tensor, Tensor)> {
    const WHAT: &str = "add_rms_norm";
    let io = norm_io(x, WHAT, eps)?;
    let dev = x.device();
    like(r, x.dtype(), x.shape(), &dev, WHAT, "r")?;
    if let Some(w) = w {
        like(w, x.dtype(), &[io.n], &dev, WHAT, "w")?;
    }
    let s = Tensor::empty(x.shape(), x.dtype(), &dev)?;
    let rstd = stat(&io.lead, x)?;
    if io.m == 0 {
        return Ok((s, io.y, rstd));
    }
    let rr = rows_of(r, io.m, io.n)?;
    let (mut s2, mut y2, mut r1) = (s.reshape(&[io.m, io.n])?, io.y.reshape(&[io.m, io.n])?, rstd.reshape(&[io.m])?);
    match w {
        None => kernels::add_rms_norm(&io.rows, &rr, &mut s2, &mut y2, &mut r1, eps)?,
        Some(w) => kernels::add_rms_norm_w(&io.rows, &rr, w, &mut s2, &mut y2, &mut r1, eps)?,
    };
    Ok((s, io.y, rstd))
}

/// LayerNorm along the last dimension with weight and bias: `y = (x - mean) * rstd * w + b`
/// with the biased variance `var = mean((x - mean)²)` and `rstd = 1 / sqrt(var + eps)`, in
/// f32, rounded to `x`'s dtype. Returns `(y, mean, rstd)`; the statistics are f32 with
/// `x`'s shape without its last dimension.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[1., 3.], &[1, 2], DType::F32, &dev)?;
/// let w = Tensor::full(&[2], 1.0, DType::F32, &dev)?;
/// let b = Tensor::zeros(&[2], DType::F32, &dev)?;
/// let (y, mean, rstd) = kfuse::ops::layer_norm(&x, &w, &b, 0.0)?;
/// assert_eq!((mean.to_vec_f32()?, rstd.to_vec_f32()?), (vec![2.], vec![1.]));
/// assert_eq!(y.to_vec_f32()?, [-1., 1.]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f32) -> Result<(Tensor, Tensor, Tensor)> {
    const WHAT: &str = "layer_norm";
    let io = norm_io(x, WHAT, eps)?;
    let dev = x.device();
    like(w, x.dtype(), &[io.n], &dev, WHAT, "w")?;
    like(b, x.dtype(), &[io.n], &dev, WHAT, "b")?;
    let (mean, rstd) = (stat(&io.lead, x)?, stat(&io.lead, x)?);
    if io.m == 0 {
        return Ok((io.y, mean, rstd));
    }
    let (mut y2, mut m1, mut r1) = (io.y.reshape(&[io.m, io.n])?, mean.reshape(&[io.m])?, rstd.reshape(&[io.m])?);
    kernels::layer_norm(&io.rows, w, b, &mut y2, &mut m1, &mut r1, eps)?;
    Ok((io.y, mean, rstd))
}

// ---------------------------------------------------------------------------------------
// Matrix products.

/// The matrix product `a · b` of `a: [M, K]` and `b: [K, N]`, as a new contiguous `[M, N]`
/// tensor of their dtype on `a`'s device.
///
/// `a` and `b` are 2-D, of one float dtype (f32, f16, bf16, f8e4m3, f8e5m2), on one device, with any
/// strides. Products are accumulated in f32 (the interpreter sums each `BK`-wide slice
/// of `K` exactly in f64 and then adds it in f32; the GPU's order of summation may
/// differ) and the result is rounded to the dtype once. `M = 0` or `N = 0` gives an
/// empty result and `K = 0` a result of zeros (the empty sum), both without a launch.
///
/// Errors: a rank other than 2 or an integer dtype (`Error::InvalidArgument`), different
/// dtypes (`Error::DTypeMismatch`), inner dimensions that differ (`Error::ShapeMismatch`),
/// different devices (`Error::DeviceMismatch`), on sm_90a a 16-bit or 8-bit product with
/// `M`, `N` or `K` above 2^31 (`Error::InvalidArgument`: the TMA path's coordinates are
/// signed 32-bit).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let a = Tensor::from_f32(&[1., 2., 3., 4., 5., 6.], &[2, 3], DType::BF16, &dev)?;
/// let b = Tensor::from_f32(&[1., 0., 0., 1., 1., 1.], &[3, 2], DType::BF16, &dev)?;
/// let c = kfuse::ops::gemm(&a, &b)?; // [2, 2], bf16
/// assert_eq!(c.to_vec_f32()?, [4., 5., 10., 11.]);
/// // operands of any strides: `a · aᵀ` reads the transposed view as it lies
/// assert_eq!(kfuse::ops::gemm(&a, &a.t())?.to_vec_f32()?, [14., 32., 32., 77.]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn gemm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    // the default case of the configurable product: same checks, same launch
    matmul::product("kfuse::ops::gemm", a, b, &GemmOptions::default())
}

/// `t` itself when the tensor-memory accelerator can read it (one unit-stride
/// dimension, the other stride a multiple of 16 bytes, data 16-byte aligned), else a
/// copy with its rows padded to whole 128-byte lines (viewed at `t`'s shape). The copy costs one
/// read and one write of `t`; the matrix product reads it many times. f32 operands are
/// returned as they are — exact FMAs read any strides
/// — unless `tf32` sends them to the tensor cores.
fn tma_readable(t: &Tensor, tf32: bool) -> Result<std::borrow::Cow<'_, Tensor>> {
    use std::borrow::Cow;
    if t.dtype() == DType::F32 && !tf32 {
        return Ok(Cow::Borrowed(t));
    }
    let esz = t.dtype().size_bytes();
    let (r, c) = (t.shape()[0], t.shape()[1]);
    let st = t.strides();
    let aligned = |s: isize| s > 0 && (s as usize * esz).is_multiple_of(16);
    let ok = (st[1] == 1 && aligned(st[0])) || (st[0] == 1 && aligned(st[1]));
    if ok && t.address().is_multiple_of(16) {
        return Ok(Cow::Borrowed(t));
    }
    // whole 128-byte lines a row: TMA boxes then start on line boundaries. The copy
    // keeps the operand's contiguous axis (a transposed view stays transposed), which
    // decides how the matrix path reads it (8-bit operands must stay K-major).
    let per = 128 / esz.max(1);
    let transposed = st[0] == 1 && st[1] != 1 && r > 1;
    let (rows, cols) = if transposed { (c, r) } else { (r, c) };
    let storage = Tensor::empty(&[rows, cols.div_ceil(per) * per], t.dtype(), &t.device())?;
    let view = storage.narrow(1, 0, cols)?;
    let mut view = if transposed { view.t() } else { view };
    kernels::copy2d(t, &mut view)?;
    Ok(Cow::Owned(view))
}
