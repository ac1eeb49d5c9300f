#![deny(missing_docs)]
//! kfuse-ir: the tile IR of kfuse.
//!
//! A kernel is a graph of tile ops ([`kernel`]) built with the [`builder`], checked by
//! the [`verify`]er, printed by [`print`](mod@print), run on the CPU by the [`interp`]reter, and
//! scheduled by the passes of `kfuse-codegen`, which record their decisions in the
//! [`schedule`] side table. This crate knows nothing of Rust syntax or CUDA.
//!
//! **Masking.** A tile may hang over the edge of its tensor. Lanes outside the tensor
//! are *invalid*: loads do not read them, stores do not write them, and reductions skip
//! them (`mean` divides by the count of valid lanes). Validity is per axis: a tile's
//! valid region is a rectangle starting at its origin, and elementwise ops keep the
//! intersection of their operands' regions.

pub mod builder;
pub mod def;
pub mod dtype;
pub mod error;
pub mod grid;
pub mod interp;
pub mod kernel;
pub mod print;
pub mod schedule;
pub mod verify;

pub use builder::Builder;
pub use def::{DTypeSig, KernelDef, ParamSig};
pub use dtype::DType;
pub use error::IrError;
pub use kernel::*;
pub use schedule::{AxisSteps, Blocked, Layout, RowChunks, Schedule, SmemLayout};
