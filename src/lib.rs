//! # kfuse
//!
//! A tile-level GPU kernel language embedded in Rust. Write a kernel as a Rust function
//! under [`#[kfuse]`](kfuse); the macro lowers it to the tile IR ([`ir`]); the passes of
//! [`codegen`] schedule it for the GPU at hand and print CUDA C++; the [`runtime`]
//! compiles that with NVRTC, caches it and launches it — or, with no GPU, runs the IR
//! on the CPU interpreter and says so.
//!
//! ```ignore
//! use kfuse::prelude::*;
//!
//! #[kfuse]
//! pub fn axpy<T: Float>(x: Tensor<T, (N,)>, y: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, a: f32) {
//!     let i = program_id(0);
//!     let v = x.block([i * BN], [BN]).load().to_f32() * a + y.block([i * BN], [BN]).load().to_f32();
//!     out.block([i * BN], [BN]).store(v.cast::<T>());
//! }
//! ```
//!
//! The standard kernels live in [`ops`] and are written the same way.
//!
//! Settings (cache directory, target, autotuning, tile overrides, …) come from the
//! `KFUSE_*` environment variables, or from code, which wins over them:
//! `kfuse::Config::new().cache_dir(dir).autotune(true).tile("BM", 128).apply()?`
//! ([`runtime::settings`]; the README's Environment section lists every variable).
//!
//! Cargo features, all off by default: `vendor-baselines` (`kfuse::runtime::vendor`,
//! cuBLAS / cuBLASLt GEMMs on kfuse tensors, the baselines of the benchmarks and
//! tests), `dev-hooks` (`KFUSE_SOURCE_HOOK`, a development aid) and `cli` (the `kfuse`
//! command, `src/bin/kfuse.rs`).
//!
//! This library only re-exports; it holds no logic of its own (the `kfuse` command is a
//! thin binary over it).

pub use kfuse_codegen as codegen;
pub use kfuse_ir as ir;
pub use kfuse_macros::kfuse;
pub use kfuse_runtime as runtime;
pub use kfuse_runtime::{Backend, Config, DType, Device, Error, Launched, Result, Tensor};

/// The standard kernels (`kfuse::ops::add(&a, &b)`, `kfuse::ops::transpose(&x)`, …).
pub mod ops {
    pub use kfuse_ops::*;
}

/// What a kernel file needs: the attribute, the tensor type and the `Float` bound.
pub mod prelude {
    pub use crate::{kfuse, DType, Device, Tensor};

    /// The bound of a kernel's dtype generics (`fn k<T: Float>`): `T` stands for one of
    /// f32, f16 and bf16, chosen by the arguments at launch. The `#[kfuse]` macro reads
    /// it; it has no methods.
    pub trait Float {}
}
