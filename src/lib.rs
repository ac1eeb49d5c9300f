#![deny(missing_docs)]
//! # kfuse
//!
//! A tile-level GPU kernel language embedded in Rust. Write a kernel as a Rust function
//! under [`#[kfuse]`](kfuse); the macro lowers it to the tile IR ([`ir`]); the passes of
//! [`codegen`] schedule it for the GPU at hand and print CUDA C++; the [`runtime`]
//! compiles that with NVRTC, caches it and launches it — or, with no GPU, runs the IR
//! on the CPU interpreter and says so.
//!
//! ```
//! use kfuse::prelude::*;
//!
//! /// `out = a * x + y`, computed in f32.
//! #[kfuse]
//! pub fn axpy<T: Float>(x: Tensor<T, (N,)>, y: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, a: f32) {
//!     let i = program_id(0); // one program per BN elements: ceil(N / BN) of them
//!     let v = x.block([i * BN], [BN]).load().to_f32() * a + y.block([i * BN], [BN]).load().to_f32();
//!     out.block([i * BN], [BN]).store(v.cast::<T>());
//! }
//!
//! # fn main() -> kfuse::Result<()> {
//! let dev = Device::best(); // GPU 0 if there is one, else the CPU interpreter
//! let x = Tensor::from_f32(&[1., 2., 3.], &[3], DType::BF16, &dev)?;
//! let y = Tensor::from_f32(&[10., 20., 30.], &[3], DType::BF16, &dev)?;
//! let mut out = Tensor::empty(&[3], DType::BF16, &dev)?;
//! let ran = axpy(&x, &y, &mut out, 2.0)?; // the launcher #[kfuse] generates
//! println!("ran on {}", ran.backend);
//! assert_eq!(out.to_vec_f32()?, [12., 24., 36.]);
//! assert_eq!(kfuse::ops::add(&x, &y)?.to_vec_f32()?, [11., 22., 33.]);
//! # Ok(()) }
//! ```
//!
//! The standard kernels live in [`ops`] and are written the same way. The README's
//! quickstart says how the launch grid follows from the kernel, what `#[kfuse]`
//! generates, how to time a call on the GPU ([`Device::time_ms`]) and which ops take
//! strided inputs.
//!
//! What a launch runs is visible: every GPU launch's [`Launched`] carries the kernel's
//! plan (`Launched::plan`: matrix path and why, tiles, stages, warps, cluster,
//! persistence, shared memory, registers, spills), and [`explain()`] gives the same
//! without a GPU — for a kernel, argument shapes and dtypes ([`runtime::ArgDesc`]) and a
//! target — with the IR after scheduling, the CUDA, the PTX, `ptxas -v`'s facts and a
//! roofline estimate ([`runtime::Roofline`]: compulsory bytes and FLOPs, the time at the
//! device's peak). The `kfuse explain` command prints it for the standard kernels.
//! Explaining needs NVRTC and ptxas (`scripts/cuda-env.sh` in a checkout), no GPU:
//!
//! ```
//! use kfuse::codegen::Target;
//! use kfuse::runtime::ArgDesc;
//!
//! let t = ArgDesc::tensor(kfuse::DType::BF16, &[4096, 4096]);
//! let e = kfuse::explain(&kfuse::ops::kernels::gemm::DEF, &[t.clone(), t.clone(), t], &Target::sm90a())?;
//! println!("{e}"); // the plan, `ptxas -v`'s registers and shared memory, the roofline
//! assert_eq!(e.roofline.flops, Some(2 * 4096u64.pow(3)));
//! assert!(e.ptxas.registers > 0 && e.ptx.contains(".target sm_90a"));
//! # Ok::<(), kfuse::Error>(())
//! ```
//!
//! Settings (cache directory, target, autotuning, tile overrides, …) come from the
//! `KFUSE_*` environment variables, or from code, which wins over them:
//! `kfuse::Config::new().cache_dir(dir).autotune(true).tile("BM", 128).apply()?`
//! ([`runtime::settings`]; the README's Environment section lists every variable).
//!
//! Cargo features, all off by default: `vendor-baselines` (`kfuse::runtime::vendor`,
//! cuBLAS / cuBLASLt GEMMs on kfuse tensors, the baselines of the benchmarks and
//! tests), `dev-hooks` (`KFUSE_SOURCE_HOOK`, a development aid), `cli` (the `kfuse`
//! command, `src/bin/kfuse.rs`), `candle` and `candle-cuda` (`kfuse::candle`: candle
//! tensors to kfuse and back, kfuse calls as candle custom ops).
//!
//! This library only re-exports; it holds no logic of its own (the `kfuse` command is a
//! thin binary over it).

pub use kfuse_codegen as codegen;
pub use kfuse_ir as ir;
pub use kfuse_macros::kfuse;
pub use kfuse_runtime as runtime;
pub use kfuse_runtime::{explain, Backend, Config, DType, Device, Error, Explain, Launched, Result, Tensor};

/// candle interop (cargo feature `candle`; CUDA tensors, shared without a copy, with
/// `candle-cuda`): [`candle::from_candle`], [`candle::to_candle`] and
/// [`candle::KernelOp`], a candle custom op running kfuse calls.
#[cfg(feature = "candle")]
pub use kfuse_runtime::candle;

/// The standard kernels (`kfuse::ops::add(&a, &b)`, `kfuse::ops::transpose(&x)`, …).
pub mod ops {
    pub use kfuse_ops::*;
}

/// The README's quickstart (`## Quickstart`), run as a doc test; `tests/configuration.rs`
/// checks that the README shows this file.
#[cfg(doctest)]
#[doc = concat!("```\n", include_str!("../tests/readme/quickstart.rs"), "```")]
struct ReadmeQuickstart;

/// What a kernel file needs: the attribute, the tensor type and the `Float` bound.
pub mod prelude {
    pub use crate::{kfuse, DType, Device, Tensor};

    /// The bound of a kernel's dtype generics (`fn k<T: Float>`): `T` stands for one of
    /// f32, f16 and bf16, chosen by the arguments at launch. The `#[kfuse]` macro reads
    /// it; it has no methods.
    pub trait Float {}
}
