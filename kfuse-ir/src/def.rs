//! [`KernelDef`]: what `#[kfuse]` records about a kernel's Rust signature, so that the
//! runtime can check arguments, bind dtype generics and build the IR on demand.

use crate::dtype::DType;
use crate::error::Result;
use crate::kernel::Kernel;

/// The element type of a parameter as written in the signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DTypeSig {
    /// A generic parameter of the kernel (`T` in `fn k<T: Float>`), by position.
    Generic(usize),
    /// A concrete type (`f32`, `bf16`, …).
    Concrete(DType),
}

/// One parameter of a kernel's signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamSig {
    /// `x: Tensor<T, (M, N)>` (input) or `y: &mut Tensor<T, (M, N)>` (output);
    /// `dims` names the shape symbols.
    Tensor { name: &'static str, dtype: DTypeSig, dims: &'static [&'static str], output: bool },
    /// `eps: f32` and the like; passed by value.
    Scalar { name: &'static str, dtype: DType },
}

impl ParamSig {
    pub fn name(&self) -> &'static str {
        match self {
            ParamSig::Tensor { name, .. } | ParamSig::Scalar { name, .. } => name,
        }
    }
}

/// A kernel as `#[kfuse]` describes it: its signature and a function that builds its IR
/// for concrete dtypes (one per generic parameter, in order).
#[derive(Clone, Copy, Debug)]
pub struct KernelDef {
    pub name: &'static str,
    /// Names of the dtype generics (`["T"]`).
    pub generics: &'static [&'static str],
    pub params: &'static [ParamSig],
    pub build: fn(&[DType]) -> Result<Kernel>,
}
