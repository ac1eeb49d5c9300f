//! Errors of building, verifying and interpreting IR.

use thiserror::Error;

/// An error from the builder, the verifier, the grid analysis or the interpreter.
///
/// Builder errors are the typing rules of the language: the `#[kfuse]` macro reports
/// them at the user's code with a span, and they are what a hand-built kernel gets back.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    #[error("dtype mismatch in `{op}`: {left} vs {right}")]
    DTypeMismatch { op: String, left: String, right: String },
    #[error("shape mismatch in `{op}`: {left} vs {right}")]
    ShapeMismatch { op: String, left: String, right: String },
    #[error("`{op}` expects {expected}, found {found}")]
    Expected { op: String, expected: String, found: String },
    #[error("axis {axis} is out of range for a tile of rank {rank}")]
    BadAxis { axis: i64, rank: usize },
    #[error("`{tensor}` has {rank} dimensions but the access gives {given} offsets")]
    OffsetCount { tensor: String, rank: usize, given: usize },
    #[error("`{tensor}` is an input (`Tensor`): only `&mut Tensor` parameters can be stored to")]
    StoreToInput { tensor: String },
    #[error("program_id axis {0} is out of range (0, 1 or 2)")]
    GridAxis(u8),
    #[error("cannot derive the launch grid: {0}")]
    Grid(String),
    #[error("IR verification failed after `{pass}`: {msg}")]
    Verify { pass: String, msg: String },
    #[error("interpreter: {0}")]
    Interp(String),
}

pub type Result<T, E = IrError> = std::result::Result<T, E>;
