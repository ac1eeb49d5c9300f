//! kfuse-codegen: the scheduling passes and the CUDA C++ writer.
//!
//! [`compile`] runs the pipeline on a verified kernel for one specialization
//! ([`Spec`]: facts about the actual arguments) and one [`Target`], and returns an
//! [`EmittedKernel`]: CUDA source plus everything the runtime needs to launch it.
//! Codegen knows tile ops, never op names.

pub mod target;

pub use target::{EmittedKernel, GridAxisEval, KernelParam, Spec, Target, TensorSpec};

use kfuse_ir::Kernel;

/// An error of the passes or the writer.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum CodegenError {
    #[error(transparent)]
    Ir(#[from] kfuse_ir::IrError),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("target {0}: {1}")]
    Target(String, String),
}

/// Compiles a kernel for one specialization and target (pipeline to be written).
pub fn compile(kernel: &Kernel, spec: &Spec, target: &Target) -> Result<EmittedKernel, CodegenError> {
    let _ = (kernel, spec, target);
    Err(CodegenError::Unsupported("codegen pipeline not written yet".into()))
}
