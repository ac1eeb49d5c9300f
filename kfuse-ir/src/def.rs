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
    Tensor {
        /// The parameter's name.
        name: &'static str,
        /// Its element type: a generic or a concrete dtype.
        dtype: DTypeSig,
        /// The shape symbol of each dimension (`["M", "N"]`).
        dims: &'static [&'static str],
        /// True for `&mut Tensor`.
        output: bool,
    },
    /// `eps: f32` and the like; passed by value.
    Scalar {
        /// The parameter's name.
        name: &'static str,
        /// `F32` or `I64`.
        dtype: DType,
    },
}

impl ParamSig {
    /// The parameter's name.
    pub fn name(&self) -> &'static str {
        match self {
            ParamSig::Tensor { name, .. } | ParamSig::Scalar { name, .. } => name,
        }
    }
}

/// A kernel as `#[kfuse]` describes it: its signature and a function that builds its IR
/// for concrete dtypes (one per generic parameter, in order).
///
/// `#[kfuse] fn name` generates one as `name::DEF`; a front end or a test may also
/// write one by hand:
///
/// ```
/// use kfuse_ir::error::Result;
/// use kfuse_ir::{Builder, DType, DTypeSig, Kernel, KernelDef, ParamSig};
///
/// // out = x, one program per element
/// fn build(dtypes: &[DType]) -> Result<Kernel> {
///     let mut b = Builder::new("copy");
///     let n = b.shape_sym("N");
///     let x = b.tensor_param("x", dtypes[0], &[n], false);
///     let out = b.tensor_param("out", dtypes[0], &[n], true);
///     let i = b.program_id(0)?;
///     let v = b.load(x, &[i], &[kfuse_ir::AccessDim::Index])?;
///     b.store(out, &[i], &[kfuse_ir::AccessDim::Index], v)?;
///     b.finish()
/// }
///
/// static DEF: KernelDef = KernelDef {
///     name: "copy",
///     generics: &["T"],
///     params: &[
///         ParamSig::Tensor { name: "x", dtype: DTypeSig::Generic(0), dims: &["N"], output: false },
///         ParamSig::Tensor { name: "out", dtype: DTypeSig::Generic(0), dims: &["N"], output: true },
///     ],
///     build,
/// };
///
/// let k = (DEF.build)(&[DType::BF16])?;
/// assert_eq!(k.params[1].name, DEF.params[1].name());
/// # Ok::<(), kfuse_ir::IrError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct KernelDef {
    /// The kernel's name (the Rust function's).
    pub name: &'static str,
    /// Names of the dtype generics (`["T"]`).
    pub generics: &'static [&'static str],
    /// The parameters, in signature order.
    pub params: &'static [ParamSig],
    /// Builds the kernel's IR for one dtype per generic, in order.
    pub build: fn(&[DType]) -> Result<Kernel>,
}
