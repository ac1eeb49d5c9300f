#![deny(missing_docs)]
//! kfuse-runtime: devices, tensors, NVRTC compilation, the module cache, and launching
//! kernels.
//!
//! A kernel ([`kfuse_ir::KernelDef`], what `#[kfuse]` records) is launched with
//! [`launch()`] on [`Arg`]s: the runtime checks the arguments against the signature, binds
//! the dtype generics, builds the IR, and then either interprets it on the CPU (CPU
//! tensors) or specializes it on the actual arguments, generates CUDA with
//! `kfuse-codegen`, compiles it with NVRTC through a memory + disk cache, and launches it
//! (GPU tensors).
//!
//! Modules, one concern each:
//! - [`error`]: the [`Error`] type and its messages;
//! - [`device`]: [`Device`] (CPU or a CUDA GPU), the driver probe, streams, timing;
//! - [`tensor`]: [`Tensor`], strided views of host or device storage;
//! - [`pool`]: the per-GPU caching pool of device memory and its [`MemoryStats`]
//!   ([`Device::memory_stats`], [`Device::empty_cache`]);
//! - [`nvrtc`]: finding libnvrtc and the CUDA headers, compiling to PTX and cubins;
//! - [`explain`](mod@explain): [`explain()`], what a launch on described arguments would
//!   run — plan, IR, CUDA, PTX, `ptxas -v` facts and a roofline estimate — without a
//!   GPU; [`roofline()`] the estimate alone;
//! - [`roofline`](mod@roofline): compulsory bytes and FLOPs, and the peaks of the
//!   devices the targets stand for;
//! - [`ptxas`]: finding ptxas, running `ptxas -v` on PTX and reading its report
//!   (registers, shared memory, spills), for [`explain()`] and the compile checks;
//! - [`cache`]: module cache (PTX and cubin) in memory and on disk, loaded kernels per
//!   device;
//! - [`launch_index`]: the emitted kernels of earlier processes on disk, beside the
//!   modules, so that a kernel the disk cache holds is launched without codegen;
//! - [`build_times`](mod@build_times): where first calls' time goes (IR, codegen, disk, NVRTC, load);
//! - [`settings`]: the `KFUSE_*` variables launches consult, read once a process, and
//!   the same settings made in code ([`Config`]), which win over them;
//! - [`autotune`]: optional tuning of `dot` kernels' tiles (`KFUSE_AUTOTUNE=1`), winners
//!   kept in `autotune.json` beside the module cache;
//! - [`launch`](mod@launch): argument checking, specialization, dispatch, and
//!   [`emit()`]: the IR and CUDA a launch on described arguments ([`ArgDesc`]) compiles,
//!   without a GPU (for snapshot tests of a user's kernels);
//! - [`tma`]: TMA tensor maps (`cuTensorMapEncodeTiled`) for kernels that take them;
//! - [`operand_copy`]: padded copies of matrix operands TMA cannot read as they lie
//!   (rows not a multiple of 16 bytes apart), which a launch makes so that its matrix
//!   loop reaches the tensor cores, and says so in its plan;
//! - `vendor` (cargo feature `vendor-baselines`, off by default; the benchmarks and tests
//!   turn it on): cuBLAS / cuBLASLt GEMMs on kfuse tensors — benchmark and test support
//!   (baselines in the same process), not part of the kernel path;
//! - `candle` (cargo features `candle` and `candle-cuda`, off by default): candle tensors
//!   to kfuse tensors and back (on a GPU without a copy, on candle's stream), and kfuse
//!   calls as candle custom ops.
//!
//! Without a GPU or a CUDA driver everything builds and the CPU path works; compiling
//! needs only libnvrtc (see [`nvrtc`] for where it is looked for); running on a GPU needs
//! the driver. No call panics for a missing library: it returns [`Error::NoGpu`] or
//! [`Error::NvrtcMissing`].
//!
//! Environment: `KFUSE_DEVICE` (`cpu`, `cuda:N`) picks [`Device::best`];
//! `KFUSE_CACHE_DIR` moves (or, empty, disables) the disk cache; `KFUSE_CUDA_PIP` names
//! a pip `--target` folder holding `nvidia-cuda-nvrtc`; `KFUSE_SYNC=1` synchronizes after
//! every GPU launch so that a failing kernel reports its own error; `KFUSE_TARGET`
//! (`sm_80`, `sm_89`, `sm_90a`) compiles for an older architecture than the GPU's;
//! `KFUSE_AUTOTUNE=1` times a few tile settings of each `dot` kernel once per shape
//! bucket and device ([`autotune`]). Those a launch consults (`KFUSE_TILES`,
//! `KFUSE_THREADS`, `KFUSE_MIN_BLOCKS`, `KFUSE_TARGET`, `KFUSE_AUTOTUNE`,
//! `KFUSE_SYNC`, `KFUSE_CACHE_DIR`) are read once, at the first
//! launch, and again only after [`settings::reload`]; a program sets the same in code
//! with [`Config`] (`Config::new().cache_dir(d).tile("BM", 128).apply()?`), over the
//! variables. The README's Environment section has the table of every variable read.
//!
//! Logging: the runtime reports through [`tracing`](https://docs.rs/tracing) and prints
//! nothing itself. At `debug` each step a first call takes is an event with its
//! `elapsed_ms` — the IR build, the launch index read and the module load (target
//! `kfuse::runtime`, inside a `build` span naming the kernel on a GPU), codegen (`kfuse::codegen`), the disk cache
//! read and the lookup's [`CacheOutcome`] (`kfuse::cache`, inside a `compile` span naming
//! the kernel), the NVRTC library load and compile (`kfuse::nvrtc`); at `trace` every
//! launch (`kfuse::launch`: kernel, grid, host time), which costs a launch one atomic load
//! when `trace` is off; at `debug` also each padded operand copy a launch makes
//! (`kfuse::launch`, [`operand_copy`]). So with `tracing_subscriber`'s `EnvFilter`, `RUST_LOG=kfuse=debug`
//! shows what a call did (`examples/trace_first_call.rs`).

pub mod autotune;
pub mod build_times;
pub mod cache;
#[cfg(feature = "candle")]
pub mod candle;
pub mod device;
pub mod error;
pub mod explain;
pub mod launch;
pub mod launch_index;
pub mod nvrtc;
pub mod operand_copy;
pub mod pool;
pub mod ptxas;
pub mod roofline;
pub mod settings;
pub mod tensor;
pub mod tma;
#[cfg(feature = "vendor-baselines")]
pub mod vendor;

pub use build_times::{build_times, BuildTimes};
pub use cache::{compile_cached, CacheOutcome, CacheStats, DiskUsage, ModuleCache};
pub use nvrtc::Module;
pub use device::{gpu_count, Device};
pub use pool::MemoryStats;
pub use error::{Error, Result};
pub use explain::{explain, roofline, Explain};
pub use roofline::Roofline;
pub use kfuse_ir::DType;
pub use settings::Config;
pub use launch::{check_args, emit, emit_for, gpu_plan_tiles, launch, launch_emitted, launch_grouped, launch_interpreter, launch_spec, spec_for, Arg, ArgDesc, Backend, BuildInfo, Launched, Scalar, TensorDesc};
pub use tensor::Tensor;

/// The cudarc version this runtime is built on, for interoperation (cuBLAS baselines).
pub use cudarc;

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_and_sync() {
        send_sync::<crate::Tensor>();
        send_sync::<crate::Device>();
        send_sync::<crate::Error>();
        send_sync::<crate::Launched>();
        send_sync::<crate::ModuleCache>();
        send_sync::<crate::Explain>();
    }
}
