//! kfuse-ops: the standard kernels of kfuse, written in the kfuse language.
//!
//! [`kernels`] holds the `#[kfuse]` functions; the functions at the crate root are the
//! public API (`kfuse::ops::add(&a, &b)`): they check arguments, allocate the output
//! on the inputs' device and launch. Bad input is an `Err`, never a panic:
//! - shapes or dtypes that differ → `Error::ShapeMismatch` / `Error::DTypeMismatch`;
//! - empty tensors → an empty result, no launch;
//! - non-contiguous inputs → elementwise ops refuse them (`Error::NonContiguous`, which
//!   says to call [`contiguous`] first); `copy`, `contiguous` and `transpose` read any
//!   2-D strides;
//! - tensors on different devices → `Error::DeviceMismatch`.

pub mod kernels;
mod rope;

pub use rope::{rope, Freqs, Positions, RopeLayout, RopeOptions};

#[doc(hidden)]
pub mod deps {
    pub use kfuse_ir as ir;
    pub use kfuse_runtime as runtime;
}

use kfuse_runtime::{Error, Result, Tensor};

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

fn binary(a: &Tensor, b: &Tensor, what: &str, k: Binary) -> Result<Tensor> {
    same(a, b, what)?;
    let out = Tensor::empty(a.shape(), a.dtype(), &a.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let (fa, fb) = (flat(a, what, "a")?, flat(b, what, "b")?);
    let mut fo = out.reshape(&[out.numel()])?;
    k(&fa, &fb, &mut fo)?;
    Ok(out)
}

fn unary(x: &Tensor, what: &str, k: Unary) -> Result<Tensor> {
    let out = Tensor::empty(x.shape(), x.dtype(), &x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let fx = flat(x, what, "x")?;
    let mut fo = out.reshape(&[out.numel()])?;
    k(&fx, &mut fo)?;
    Ok(out)
}

/// `a + b`, elementwise.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, "add", kernels::add)
}
/// `a - b`, elementwise.
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, "sub", kernels::sub)
}
/// `a * b`, elementwise.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, "mul", kernels::mul)
}
/// `a / b`, elementwise.
pub fn div(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, "div", kernels::div)
}
/// `silu(g) * u`, elementwise (the SwiGLU activation).
pub fn swiglu(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    binary(g, u, "swiglu", kernels::swiglu)
}
/// `x * s`.
pub fn scale(x: &Tensor, s: f32) -> Result<Tensor> {
    let out = Tensor::empty(x.shape(), x.dtype(), &x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let fx = flat(x, "scale", "x")?;
    let mut fo = out.reshape(&[out.numel()])?;
    kernels::scale(&fx, &mut fo, s)?;
    Ok(out)
}
/// SiLU, `x * sigmoid(x)`.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    unary(x, "silu", kernels::silu)
}
/// GELU (erf form).
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    unary(x, "gelu", kernels::gelu)
}
/// GELU (tanh approximation).
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    unary(x, "gelu_tanh", kernels::gelu_tanh)
}

/// A contiguous copy of `x` (any strides for rank ≤ 2; contiguous inputs of any rank).
pub fn copy(x: &Tensor) -> Result<Tensor> {
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
            kernels::copy2d(&x.unsqueeze(0), &mut fo)?;
            Ok(out)
        }
        2 => {
            let mut out = out;
            kernels::copy2d(x, &mut out)?;
            Ok(out)
        }
        r => Err(Error::InvalidArgument(format!("kfuse::ops::copy reads strides of tensors of rank ≤ 2; this one has rank {r}"))),
    }
}

/// `x` itself if contiguous (a cheap view), else a contiguous copy.
pub fn contiguous(x: &Tensor) -> Result<Tensor> {
    if x.is_contiguous() {
        Ok(x.clone())
    } else {
        copy(x)
    }
}

/// The transpose of a 2-D tensor (any strides), as a new contiguous tensor.
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
