//! Errors of building, verifying and interpreting IR.

use thiserror::Error;

/// An error from the builder, the verifier, the grid analysis or the interpreter.
///
/// Builder errors are the typing rules of the language: the `#[kfuse]` macro reports
/// them at the user's code with a span, and they are what a hand-built kernel gets back.
///
/// # Examples
///
/// ```
/// use kfuse_ir::{BinaryOp, Builder, DType, IrError};
///
/// let mut b = Builder::new("k");
/// let x = b.constant(kfuse_ir::Literal::Float(1.0), DType::F32);
/// let i = b.constant(kfuse_ir::Literal::Int(1), DType::I64);
/// let e = b.binary(BinaryOp::Add, x, i).unwrap_err();
/// assert!(matches!(e, IrError::DTypeMismatch { .. }));
/// assert_eq!(e.to_string(), "dtype mismatch in `add`: f32 vs i64");
/// ```
#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    /// Two operands (or a stored value and its tensor) of different dtypes.
    #[error("dtype mismatch in `{op}`: {left} vs {right}")]
    DTypeMismatch {
        /// The operation (`add`, `store`, `dot`, …).
        op: String,
        /// The left operand's dtype (a store's: the tensor's, with its name).
        left: String,
        /// The right operand's dtype (a store's: the value's).
        right: String,
    },
    /// Two shapes that do not broadcast to each other, or a value that does not fit
    /// the block it is stored to.
    #[error("shape mismatch in `{op}`: {left} vs {right}")]
    ShapeMismatch {
        /// The operation.
        op: String,
        /// The first shape, with symbol names (`[BM, N]`).
        left: String,
        /// The second shape.
        right: String,
    },
    /// An operand of the wrong kind: a float where an index is needed, a tile of the
    /// wrong rank, a loop closed out of order, …
    #[error("`{op}` expects {expected}, found {found}")]
    Expected {
        /// The operation.
        op: String,
        /// What it takes.
        expected: String,
        /// What it was given.
        found: String,
    },
    /// A reduction or `expand_dims` axis outside the tile.
    #[error("axis {axis} is out of range for a tile of rank {rank}")]
    BadAxis {
        /// The axis as written (negative counts from the end).
        axis: i64,
        /// The tile's rank.
        rank: usize,
    },
    /// A load or store with more or fewer offsets than its tensor has dimensions.
    #[error("`{tensor}` has {rank} dimensions but the access gives {given} offsets")]
    OffsetCount {
        /// The tensor parameter's name.
        tensor: String,
        /// Its number of dimensions.
        rank: usize,
        /// The number of offsets (or extents) given.
        given: usize,
    },
    /// A store to an input (`Tensor`, not `&mut Tensor`) parameter.
    #[error("`{tensor}` is an input (`Tensor`): only `&mut Tensor` parameters can be stored to")]
    StoreToInput {
        /// The input parameter's name.
        tensor: String,
    },
    /// `program_id(k)` with `k` above 2.
    #[error("program_id axis {0} is out of range (0, 1 or 2)")]
    GridAxis(u8),
    /// The launch grid cannot be derived from the stores ([`crate::grid::derive`]).
    #[error("cannot derive the launch grid: {0}")]
    Grid(String),
    /// A graph that breaks the IR's rules ([`crate::verify::verify`]), after the pass
    /// named.
    #[error("IR verification failed after `{pass}`: {msg}")]
    Verify {
        /// The pass (or front end) after which the check ran.
        pass: String,
        /// The rule broken.
        msg: String,
    },
    /// A run of the interpreter failed: arguments unlike the parameters, a division by
    /// zero, a loop step of 0 or less, …
    #[error("interpreter: {0}")]
    Interp(String),
}

/// `Result` with [`IrError`] as the default error.
pub type Result<T, E = IrError> = std::result::Result<T, E>;
