//! Devices: the CPU (the interpreter's home) and CUDA GPUs.
//!
//! Owns: finding the CUDA driver and the GPUs, one CUDA context and stream per GPU (and
//! devices on another library's stream, [`Device::from_cuda_stream`]), the
//! GPU's facts ([`Device::target`]), the per-device cache of loaded kernels and memory
//! pool ([`crate::pool`]: [`Device::memory_stats`], [`Device::empty_cache`]), loading
//! PTX into a module, and timing with CUDA events.
//!
//! Invariants:
//! - A [`Device`] is a cheap handle (`Clone` copies an `Arc`). All handles to one GPU
//!   ordinal share one `Gpu` record, created on first use and kept for the life of the
//!   process: one primary context, one stream, one kernel cache, one memory pool per GPU.
//! - Every GPU operation of the runtime (allocation, copies, memsets, launches, events)
//!   goes to that GPU's one stream, the context's legacy default stream. Work is
//!   therefore ordered as issued, which is why cudarc's per-allocation event tracking is
//!   switched off (it only matters with several streams, and costs two events per
//!   allocation). It is also what lets the memory pool hand a freed block to the next
//!   tensor at once: whatever used the block earlier is ahead on the same stream. A
//!   device of [`Device::from_cuda_stream`] keeps that rule with another library's
//!   stream in place of the default one, and leaves that library's event tracking on.
//! - Nothing here panics when libcuda is missing or no GPU is present: the driver library
//!   is probed without loading it for good, and the remaining cudarc calls that could
//!   panic (a missing symbol in an old driver) run under `catch_unwind`. Those cases are
//!   [`Error::NoGpu`].
//! - Devices compare equal iff they are of the same kind and, for GPUs, share the `Gpu`
//!   record: the same ordinal, or the same stream for [`Device::from_cuda_stream`]'s
//!   devices, which carry another library's stream (one record per stream, each with
//!   its own kernel cache and pool, its work all on that stream).

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;
use kfuse_codegen::Target;

use crate::cache::FunctionCache;
use crate::error::{driver, Error, Result};
use crate::pool::{DevicePool, MemoryStats};

/// One GPU: its context, its stream, its facts, its cache of loaded kernels and its
/// memory pool.
pub(crate) struct Gpu {
    pub(crate) ordinal: usize,
    pub(crate) ctx: Arc<CudaContext>,
    /// The one stream all of this runtime's work on the GPU goes to (see module docs).
    pub(crate) stream: Arc<CudaStream>,
    /// True for a record made by [`Device::from_cuda_stream`]: another library's stream
    /// (and context handle), whose event tracking is left as that library set it.
    pub(crate) foreign: bool,
    pub(crate) name: String,
    /// Compute capability (major, minor).
    pub(crate) cc: (i32, i32),
    pub(crate) num_sms: u32,
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, in bytes.
    pub(crate) smem_optin: u32,
    pub(crate) functions: FunctionCache,
    /// The device memory of tensors (see [`crate::pool`]).
    pub(crate) memory: DevicePool,
    /// [`Device::describe`]'s text, made once (launches and their error messages use it).
    pub(crate) description: String,
}

impl Gpu {
    /// The compilation target of this GPU, as the hardware reports it.
    pub(crate) fn native_target(&self) -> Target {
        Target { sm: (self.cc.0 * 10 + self.cc.1) as u32, num_sms: self.num_sms, smem_per_block: self.smem_optin }
    }

    /// The target kernels are compiled for: [`Gpu::native_target`], unless
    /// `KFUSE_TARGET` or [`Config::target`](crate::settings::Config::target) names an older one (`sm_80`, `sm_89`; `sm_90a` is Hopper's own):
    /// then that architecture with this GPU's multiprocessor count and the smaller of the
    /// two shared-memory limits. The driver compiles the PTX for the GPU it runs on, so
    /// the sm_80 matrix path (mma.sync) can be checked on an H100. Unset, nothing changes.
    pub(crate) fn target(&self) -> Result<Target> {
        let native = self.native_target();
        let Some(named) = crate::settings::current().target()? else { return Ok(native) };
        if named.sm > native.sm {
            return Err(Error::InvalidArgument(format!(
                "target {} (KFUSE_TARGET or Config::target) needs a GPU of compute capability {}.{} or newer; cuda:{} is sm_{}{}",
                named.arch(),
                named.sm / 10,
                named.sm % 10,
                self.ordinal,
                self.cc.0,
                self.cc.1
            )));
        }
        Ok(Target { sm: named.sm, num_sms: native.num_sms, smem_per_block: named.smem_per_block.min(native.smem_per_block) })
    }

    /// Binds the context to the calling thread (for raw driver calls).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver("binding the CUDA context"))
    }

    /// Waits for all work on the stream, then reports any error the driver stored from a
    /// call that could not return one (a free in a `Drop`).
    pub(crate) fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver(format_args!("synchronizing cuda:{}", self.ordinal)))?;
        self.ctx.check_err().map_err(driver(format_args!("an earlier asynchronous operation on cuda:{}", self.ordinal)))
    }
}

#[derive(Clone)]
enum Kind {
    Cpu,
    Gpu(Arc<Gpu>),
}

/// Where tensors live and kernels run: the CPU (kernels run in the IR interpreter) or a
/// CUDA GPU. See the module docs.
///
/// # Examples
///
/// ```
/// use kfuse_runtime::Device;
///
/// let cpu = Device::cpu();
/// assert!(cpu.is_cpu() && cpu.target().is_none());
/// assert_eq!(cpu.describe(), "cpu");
/// let dev = Device::best(); // GPU 0 when there is one
/// println!("running on {}", dev.describe());
/// ```
#[derive(Clone)]
pub struct Device {
    kind: Kind,
}

/// The GPUs opened so far, by ordinal.
static GPUS: Mutex<BTreeMap<usize, Arc<Gpu>>> = Mutex::new(BTreeMap::new());

/// The driver probe, once per process: the number of devices, or why there are none.
fn driver_status() -> &'static std::result::Result<usize, String> {
    static STATUS: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    STATUS.get_or_init(|| {
        if !library_loadable("cuda") {
            return Err("the CUDA driver library (libcuda.so.1) was not found: this machine has no NVIDIA driver \
                        (or the loader cannot see it); kernels run in the CPU interpreter instead"
                .to_string());
        }
        let probe = catch_unwind(|| -> std::result::Result<usize, cudarc::driver::DriverError> {
            cudarc::driver::result::init()?;
            Ok(cudarc::driver::result::device::get_count()?.max(0) as usize)
        });
        match probe {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
            Ok(Err(e)) => Err(format!("the CUDA driver failed to initialize: {}", crate::error::driver_error_text(e))),
            Err(p) => Err(format!("the CUDA driver library is unusable: {}", panic_text(&p))),
        }
    })
}

/// Whether the CUDA library `name` (`cuda`, `nvrtc`, `cublas`, …) loads under one of the
/// Linux file names cudarc tries for it (`libNAME.so`, `libNAME.so.13` … `.9`, `.1`).
/// Where cudarc loads the libraries at run time this is its own test; where a crate of
/// the build made cudarc link them (candle's `cuda` feature), the process could not have
/// started without them and the test finds them loaded.
pub(crate) fn library_loadable(name: &str) -> bool {
    library_names(name).iter().any(|file| {
        // SAFETY: loading a CUDA library runs its initializers, as cudarc's own load would;
        // the handle is dropped again (the library stays loaded while anything uses it).
        unsafe { libloading::Library::new(file) }.is_ok()
    })
}

/// The file names [`library_loadable`] tries for the CUDA library `name`, in order.
pub(crate) fn library_names(name: &str) -> Vec<String> {
    ["", ".13", ".12", ".11", ".10", ".9", ".1"].iter().map(|suffix| format!("lib{name}.so{suffix}")).collect()
}

/// The text of a caught panic.
pub(crate) fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "unknown panic".to_string()
    }
}

/// Number of CUDA GPUs visible to this process (0 without a driver).
///
/// # Examples
///
/// ```
/// let gpus: Vec<_> = (0..kfuse_runtime::gpu_count()).filter_map(|i| kfuse_runtime::Device::gpu(i).ok()).collect();
/// for g in &gpus {
///     println!("{}", g.describe());
/// }
/// ```
pub fn gpu_count() -> usize {
    match driver_status() {
        Ok(n) => *n,
        Err(_) => 0,
    }
}

fn open_gpu(ordinal: usize) -> Result<Gpu> {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<Gpu> {
        let ctx = CudaContext::new(ordinal).map_err(driver(format_args!("opening cuda:{ordinal}")))?;
        // SAFETY: every allocation of this runtime is used on the one stream below only
        // (module docs), so cross-stream tracking is not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        gpu_record(stream, false)
    }));
    match r {
        Ok(r) => r,
        Err(p) => Err(Error::NoGpu { reason: format!("opening cuda:{ordinal} failed: {}", panic_text(&p)) }),
    }
}

/// The record of the GPU of `stream`'s context, with `stream` as its one stream: the
/// GPU's facts read from the driver, an empty kernel cache and memory pool.
fn gpu_record(stream: Arc<CudaStream>, foreign: bool) -> Result<Gpu> {
    let ctx = stream.context().clone();
    let ordinal = ctx.ordinal();
    let what = format_args!("opening cuda:{ordinal}").to_string();
    let name = ctx.name().map_err(driver(&what))?;
    let cc = ctx.compute_capability().map_err(driver(&what))?;
    let num_sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(driver(&what))?;
    let smem = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).map_err(driver(&what))?;
    let num_sms = num_sms.max(0) as u32;
    let on = if foreign { format!(", stream {:#x}", stream.cu_stream() as usize) } else { String::new() };
    let description = format!("cuda:{ordinal} ({name}, sm_{}{}, {num_sms} SMs{on})", cc.0, cc.1);
    Ok(Gpu { ordinal, ctx, stream, foreign, name, cc, num_sms, smem_optin: smem.max(0) as u32, functions: FunctionCache::new(cc), memory: DevicePool::default(), description })
}

/// The records [`Device::from_cuda_stream`] made, by context and stream handle.
static FOREIGN_GPUS: Mutex<BTreeMap<(usize, usize), Arc<Gpu>>> = Mutex::new(BTreeMap::new());

impl Device {
    /// The CPU: tensors in host memory, kernels run by the IR interpreter.
    pub fn cpu() -> Device {
        Device { kind: Kind::Cpu }
    }

    /// The GPU with this ordinal. Fails with [`Error::NoGpu`] when there is no driver, no
    /// device, or fewer devices than `ordinal + 1`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use kfuse_runtime::Device;
    ///
    /// let gpu = Device::gpu(0)?;
    /// let target = gpu.target().expect("a GPU has a target");
    /// println!("{}: compiling for {}", gpu.describe(), target.arch());
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn gpu(ordinal: usize) -> Result<Device> {
        // while the driver starts: NVRTC's libraries into the OS's page cache, for the
        // first compile (a hint in the background; see `nvrtc::prefetch_libraries`)
        crate::nvrtc::prefetch_libraries();
        let count = match driver_status() {
            Ok(n) => *n,
            Err(reason) => return Err(Error::NoGpu { reason: reason.clone() }),
        };
        if ordinal >= count {
            let reason = if count == 0 {
                "the CUDA driver reports no device".to_string()
            } else {
                format!("cuda:{ordinal} was asked for but the driver reports {count} device(s) (cuda:0..cuda:{})", count - 1)
            };
            return Err(Error::NoGpu { reason });
        }
        let mut gpus = GPUS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = gpus.get(&ordinal) {
            return Ok(Device { kind: Kind::Gpu(g.clone()) });
        }
        let g = Arc::new(open_gpu(ordinal)?);
        gpus.insert(ordinal, g.clone());
        Ok(Device { kind: Kind::Gpu(g) })
    }

    /// The device to use by default: `KFUSE_DEVICE` if set (`cpu`, `cuda`, `cuda:N`;
    /// a GPU named there that cannot be opened falls back to the CPU), else GPU 0 when a
    /// driver and a device exist, else the CPU. Never panics.
    pub fn best() -> Device {
        match std::env::var("KFUSE_DEVICE").ok().as_deref().map(str::trim) {
            Some("cpu") => return Device::cpu(),
            Some(s) if s.starts_with("cuda") => {
                let ord = s.strip_prefix("cuda").and_then(|r| r.strip_prefix(':')).and_then(|n| n.parse().ok()).unwrap_or(0);
                return Device::gpu(ord).unwrap_or_else(|_| Device::cpu());
            }
            _ => {}
        }
        Device::gpu(0).unwrap_or_else(|_| Device::cpu())
    }

    /// The GPU of `stream`'s context, with all of this runtime's work on it (allocations,
    /// copies, launches, events) issued to `stream` instead of the context's default
    /// stream: for sharing tensors with another library that works on its own stream
    /// (candle's `CudaDevice::cuda_stream`), so that kfuse's work and the other library's
    /// are ordered as issued, without synchronizing the two.
    ///
    /// Such a device has its own kernel cache and memory pool (both filled as it is
    /// used), and equals only devices made from the same stream: a tensor of
    /// [`Device::gpu`]'s device is not one of this device's, and moves to it by
    /// [`Tensor::to_device`](crate::Tensor::to_device) (through the host). The record
    /// of each stream is kept, and so is the stream, for the life of the process.
    /// The context's event tracking is left as the other library set it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use kfuse_runtime::Device;
    ///
    /// let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    /// let stream = ctx.new_stream().unwrap();
    /// let dev = Device::from_cuda_stream(stream.clone())?;
    /// assert_eq!(dev.cuda_stream().map(|s| s.cu_stream()), Some(stream.cu_stream()));
    /// assert_ne!(dev, Device::gpu(0)?); // another stream: another device
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn from_cuda_stream(stream: Arc<CudaStream>) -> Result<Device> {
        crate::nvrtc::prefetch_libraries();
        if let Err(reason) = driver_status() {
            return Err(Error::NoGpu { reason: reason.clone() });
        }
        // the handles of the per-thread and legacy streams are the same in every context
        let key = (stream.context().cu_ctx() as usize, stream.cu_stream() as usize);
        let mut gpus = FOREIGN_GPUS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = gpus.get(&key) {
            return Ok(Device { kind: Kind::Gpu(g.clone()) });
        }
        let ordinal = stream.context().ordinal();
        let g = catch_unwind(AssertUnwindSafe(|| gpu_record(stream, true)))
            .unwrap_or_else(|p| Err(Error::NoGpu { reason: format!("opening cuda:{ordinal} failed: {}", panic_text(&p)) }))?;
        let g = Arc::new(g);
        gpus.insert(key, g.clone());
        Ok(Device { kind: Kind::Gpu(g) })
    }

    /// True for a GPU.
    pub fn is_gpu(&self) -> bool {
        matches!(self.kind, Kind::Gpu(_))
    }

    /// True for the CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self.kind, Kind::Cpu)
    }

    /// The GPU ordinal; `None` for the CPU.
    pub fn ordinal(&self) -> Option<usize> {
        match &self.kind {
            Kind::Cpu => None,
            Kind::Gpu(g) => Some(g.ordinal),
        }
    }

    /// `"cpu"`, or the GPU's product name (`"NVIDIA H100 80GB HBM3"`).
    pub fn name(&self) -> String {
        match &self.kind {
            Kind::Cpu => "cpu".to_string(),
            Kind::Gpu(g) => g.name.clone(),
        }
    }

    /// A one-line description: `cpu` or `cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 132 SMs)`.
    pub fn describe(&self) -> String {
        self.description().to_string()
    }

    /// [`Device::describe`]'s text, borrowed (made once per GPU).
    pub(crate) fn description(&self) -> &str {
        match &self.kind {
            Kind::Cpu => "cpu",
            Kind::Gpu(g) => &g.description,
        }
    }

    /// Compute capability `(major, minor)` of a GPU.
    pub fn compute_capability(&self) -> Option<(i32, i32)> {
        self.gpu_ref().map(|g| g.cc)
    }

    /// The compilation target of a GPU: compute capability, SM count and the opt-in
    /// maximum of shared memory per block — the one launches compile for, so
    /// `KFUSE_TARGET` applies (an invalid value, which launches report as an error,
    /// gives the GPU's own). `None` for the CPU.
    pub fn target(&self) -> Option<Target> {
        self.gpu_ref().map(|g| g.target().unwrap_or_else(|_| g.native_target()))
    }

    /// Waits until all work issued to the device is done and reports asynchronous
    /// errors. A no-op on the CPU.
    ///
    /// ```no_run
    /// # use kfuse_runtime::{DType, Device, Tensor};
    /// let gpu = Device::gpu(0)?;
    /// let mut t = Tensor::empty(&[1 << 20], DType::F32, &gpu)?;
    /// t.fill(1.0)?; // queued
    /// gpu.synchronize()?; // done, and no earlier launch failed
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        match &self.kind {
            Kind::Cpu => Ok(()),
            Kind::Gpu(g) => g.sync(),
        }
    }

    /// What the GPU's memory pool holds and has done ([`MemoryStats`]: bytes allocated to
    /// tensors, reserved from the driver, the peak; allocations, pool hits, driver
    /// allocations). All zeros on the CPU, whose tensors are not pooled.
    pub fn memory_stats(&self) -> MemoryStats {
        self.gpu_ref().map_or_else(MemoryStats::default, |g| g.memory.stats())
    }

    /// Starts [`MemoryStats::peak_allocated_bytes`] over from the bytes allocated now.
    pub fn reset_peak_memory_stats(&self) {
        if let Some(g) = self.gpu_ref() {
            g.memory.reset_peak();
        }
    }

    /// Gives the cached free blocks of the GPU's memory pool back to the driver (after
    /// the work issued so far, which it waits for), so that other libraries and processes
    /// can have that memory; `reserved_bytes` drops to `allocated_bytes`. Storage of live
    /// tensors stays. A no-op on the CPU.
    ///
    /// ```no_run
    /// # use kfuse_runtime::{DType, Device, Tensor};
    /// let gpu = Device::gpu(0)?;
    /// drop(Tensor::empty(&[1 << 28], DType::F32, &gpu)?); // 1 GiB back to the pool
    /// assert!(gpu.memory_stats().reserved_bytes >= 1 << 30);
    /// gpu.empty_cache()?; // and from the pool to the driver
    /// assert_eq!(gpu.memory_stats().reserved_bytes, gpu.memory_stats().allocated_bytes);
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn empty_cache(&self) -> Result<()> {
        let Some(g) = self.gpu_ref() else { return Ok(()) };
        g.memory.release_cached(&g.stream).map_err(driver(format_args!("freeing the cached memory of {}", self.description())))?;
        g.sync()
    }

    /// Times `f`: runs it `warmup` times, then `iters` times with a CUDA event recorded
    /// before and after each call (wall-clock on the CPU), and returns the `iters`
    /// per-call times in milliseconds. `f` should only issue work to this device (e.g.
    /// [`crate::launch()`]); it must not synchronize if the times are to mean GPU time.
    ///
    /// # Examples
    ///
    /// The median of 20 calls after 3 warm-ups (a fill here; a kernel launch, a
    /// `#[kfuse]` function's call or a `kfuse::ops` call in practice):
    ///
    /// ```
    /// use kfuse_runtime::{DType, Device, Tensor};
    ///
    /// let dev = Device::best();
    /// let mut t = Tensor::empty(&[1 << 20], DType::F32, &dev)?;
    /// let mut ms = dev.time_ms(3, 20, || t.fill(0.5))?;
    /// ms.sort_by(f32::total_cmp);
    /// println!("median {:.4} ms on {}", ms[ms.len() / 2], dev.describe());
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn time_ms(&self, warmup: usize, iters: usize, f: impl FnMut() -> Result<()>) -> Result<Vec<f32>> {
        self.time_ms_with(warmup, iters, || Ok(()), f)
    }

    /// Like [`Device::time_ms`], with `before` issued ahead of every call of `f` (warm-ups
    /// included) and outside its timed interval: for work each measurement needs but
    /// must not count, such as evicting the L2 cache. Work `before` leaves on the GPU
    /// also keeps the stream busy while the host issues `f`, so the interval holds the
    /// GPU time of `f` rather than the host's launch latency.
    ///
    /// # Examples
    ///
    /// Each timed call starts from a freshly written input:
    ///
    /// ```
    /// use kfuse_runtime::{DType, Device, Tensor};
    ///
    /// let dev = Device::best();
    /// let mut src = Tensor::zeros(&[1 << 16], DType::F32, &dev)?;
    /// let mut dst = Tensor::empty(&[1 << 16], DType::F32, &dev)?;
    /// let mut calls = 0;
    /// let ms = dev.time_ms_with(1, 5, || src.fill(1.0), || { calls += 1; dst.fill(2.0) })?;
    /// assert_eq!((ms.len(), calls), (5, 6)); // 1 warm-up, 5 timed
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn time_ms_with(&self, warmup: usize, iters: usize, mut before: impl FnMut() -> Result<()>, mut f: impl FnMut() -> Result<()>) -> Result<Vec<f32>> {
        for _ in 0..warmup {
            before()?;
            f()?;
        }
        match &self.kind {
            Kind::Cpu => (0..iters)
                .map(|_| {
                    before()?;
                    let t = Instant::now();
                    f()?;
                    Ok(t.elapsed().as_secs_f32() * 1e3)
                })
                .collect(),
            Kind::Gpu(g) => {
                g.sync()?;
                let ev = || g.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("creating a CUDA event"));
                let events = (0..iters).map(|_| Ok((ev()?, ev()?))).collect::<Result<Vec<_>>>()?;
                for (start, end) in &events {
                    before()?;
                    start.record(&g.stream).map_err(driver("recording a CUDA event"))?;
                    f()?;
                    end.record(&g.stream).map_err(driver("recording a CUDA event"))?;
                }
                g.sync()?;
                events.iter().map(|(s, e)| s.elapsed_ms(e).map_err(driver("reading a CUDA event"))).collect()
            }
        }
    }

    /// The cudarc context of a GPU, for interoperation (cuBLAS comparisons and the like).
    pub fn cuda_context(&self) -> Option<&Arc<CudaContext>> {
        self.gpu_ref().map(|g| &g.ctx)
    }

    /// The stream this runtime issues all of a GPU's work to (the context's default
    /// stream), for interoperation.
    pub fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        self.gpu_ref().map(|g| &g.stream)
    }

    pub(crate) fn gpu_ref(&self) -> Option<&Arc<Gpu>> {
        match &self.kind {
            Kind::Cpu => None,
            Kind::Gpu(g) => Some(g),
        }
    }

    /// Loads a module compiled for `arch` on this GPU — its cubin when the cubin runs
    /// here ([`cubin_runs_on`]), else its PTX, which the driver assembles — and returns
    /// its function `entry`; when
    /// `smem_bytes` exceeds the 48 KiB default, raises the function's dynamic shared
    /// memory limit to it, when the kernel asks for `blocks` ≥ 2 blocks a
    /// multiprocessor (its launch bounds) and takes dynamic shared memory, prefers the
    /// largest shared-memory carveout (the driver otherwise picks one that holds a
    /// single such block), and when `cluster` (blocks per thread-block cluster) exceeds
    /// the portable 8, allows the function non-portable cluster sizes.
    pub(crate) fn load_module(&self, m: &crate::nvrtc::Module, arch: &str, entry: &str, smem_bytes: u32, blocks: u32, cluster: u32) -> Result<CudaFunction> {
        let g = self.gpu_ref().ok_or_else(|| Error::InvalidArgument("a module can only be loaded on a GPU".into()))?;
        if smem_bytes > g.smem_optin {
            return Err(Error::InvalidArgument(format!(
                "kernel `{entry}` needs {smem_bytes} bytes of shared memory per block, but {} allows at most {}",
                self.description(),
                g.smem_optin
            )));
        }
        if m.cubin.is_empty() && m.ptx.contains('\0') {
            return Err(Error::InvalidArgument(format!("the PTX of `{entry}` contains a NUL byte")));
        }
        let r = catch_unwind(AssertUnwindSafe(|| -> Result<CudaFunction> {
            // the cubin as it is (no PTX → SASS step), else the PTX, NUL-terminated
            let image = if cubin_runs_on(arch, g.cc) { m.image() } else { m.ptx_image() };
            let module = g.ctx.load_module(Ptx::from_binary(image)).map_err(driver(format_args!(
                "loading the module of `{entry}` on {} (compiled for another architecture or by a newer NVRTC than the driver supports?)",
                self.description()
            )))?;
            let f = module.load_function(entry).map_err(driver(format_args!("finding `{entry}` in its module")))?;
            if smem_bytes > 48 * 1024 {
                g.bind()?;
                f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes as i32)
                    .map_err(driver(format_args!("allowing `{entry}` {smem_bytes} bytes of dynamic shared memory")))?;
            }
            if blocks >= 2 && smem_bytes > 0 {
                g.bind()?;
                f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
                    .map_err(driver(format_args!("preferring the largest shared-memory carveout for `{entry}`")))?;
            }
            if cluster > 8 {
                // clusters above the portable 8 blocks (sm_90 takes 16) need the
                // function's permission
                g.bind()?;
                f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                    .map_err(driver(format_args!("allowing `{entry}` clusters of {cluster} blocks")))?;
            }
            Ok(f)
        }));
        r.unwrap_or_else(|p| Err(Error::Driver(format!("loading `{entry}`: {}", panic_text(&p)))))
    }
}

/// Whether a cubin NVRTC built for `arch` (`sm_90a`, `sm_80`, …) runs on a GPU of
/// compute capability `cc`: an architecture-specific one (`sm_90a`) on exactly that
/// capability, a plain one (`sm_XY`) on the same major version with a minor of at least
/// Y. Otherwise the PTX is loaded instead (e.g. `KFUSE_TARGET=sm_80` on an H100).
pub(crate) fn cubin_runs_on(arch: &str, cc: (i32, i32)) -> bool {
    let Some(digits) = arch.strip_prefix("sm_") else { return false };
    let (digits, specific) = match digits.strip_suffix('a') {
        Some(d) => (d, true),
        None => (digits, false),
    };
    let Ok(sm) = digits.parse::<i32>() else { return false };
    let (major, minor) = (sm / 10, sm % 10);
    if specific {
        (major, minor) == cc
    } else {
        major == cc.0 && minor <= cc.1
    }
}

impl Default for Device {
    /// [`Device::best`].
    fn default() -> Device {
        Device::best()
    }
}

impl PartialEq for Device {
    /// The CPU equals the CPU; a GPU device equals the devices of the same GPU and stream
    /// (every [`Device::gpu`] of one ordinal; [`Device::from_cuda_stream`] of one stream).
    fn eq(&self, other: &Device) -> bool {
        match (&self.kind, &other.kind) {
            (Kind::Cpu, Kind::Cpu) => true,
            (Kind::Gpu(a), Kind::Gpu(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Device {}

impl std::hash::Hash for Device {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.is_gpu().hash(state);
        self.ordinal().hash(state);
    }
}

impl fmt::Display for Device {
    /// `cpu` or `cuda:N`; `cuda:N (stream 0x…)` for [`Device::from_cuda_stream`]'s.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Cpu => f.write_str("cpu"),
            Kind::Gpu(g) if g.foreign => write!(f, "cuda:{} (stream {:#x})", g.ordinal, g.stream.cu_stream() as usize),
            Kind::Gpu(g) => write!(f, "cuda:{}", g.ordinal),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.description())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    #[test]
    fn cubins_run_on_their_own_family() {
        assert!(cubin_runs_on("sm_90a", (9, 0)));
        assert!(!cubin_runs_on("sm_90a", (10, 0)));
        assert!(cubin_runs_on("sm_80", (8, 6)) && cubin_runs_on("sm_80", (8, 0)));
        assert!(!cubin_runs_on("sm_80", (9, 0)), "an sm_80 cubin does not run on Hopper: its PTX is loaded");
        assert!(!cubin_runs_on("sm_89", (8, 6)));
        assert!(!cubin_runs_on("compute_90a", (9, 0)) && !cubin_runs_on("sm_x", (9, 0)));
    }

    #[test]
    fn cpu_device_basics() {
        let d = Device::cpu();
        assert!(d.is_cpu() && !d.is_gpu());
        assert_eq!(d.name(), "cpu");
        assert_eq!(d.to_string(), "cpu");
        assert_eq!(d.target(), None);
        assert_eq!(d, Device::cpu());
        d.synchronize().unwrap();
        let _held = Tensor::zeros(&[64], kfuse_ir::DType::F32, &d).unwrap();
        assert_eq!(d.memory_stats(), MemoryStats::default(), "host tensors are not pooled");
        d.reset_peak_memory_stats();
        d.empty_cache().unwrap();
        let mut n = 0;
        let t = d.time_ms(2, 3, || {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(n, 5);
    }

    #[test]
    fn device_memory_and_hand_over_refuse_what_they_cannot_take() {
        let cpu = Device::cpu();
        // SAFETY: refused before the memory would be used
        let e = unsafe { Tensor::from_device_memory(0x1000, 64, &[4], &[1], 0, kfuse_ir::DType::F32, &cpu, Box::new(())) };
        assert!(matches!(e, Err(Error::InvalidArgument(m)) if m.contains("GPU")));
        let t = Tensor::zeros(&[4], kfuse_ir::DType::F32, &cpu).unwrap();
        assert!(t.external_owner().is_none());
        let e = t.clone().into_cuda_slice::<f32>().unwrap_err().to_string();
        assert!(e.contains("CPU"), "{e}");
        let e = t.into_cuda_slice::<u16>().unwrap_err().to_string();
        assert!(e.contains("4 bytes"), "{e}");
        assert_eq!(library_names("nvrtc")[..2], ["libnvrtc.so", "libnvrtc.so.13"]);
    }

    #[test]
    fn best_never_panics_and_gpu_errors_cleanly() {
        let d = Device::best();
        if gpu_count() == 0 {
            assert!(d.is_cpu());
            match Device::gpu(0) {
                Err(Error::NoGpu { reason }) => assert!(!reason.is_empty()),
                other => panic!("expected NoGpu, got {other:?}"),
            }
        }
        let n = gpu_count();
        assert!(matches!(Device::gpu(n + 7), Err(Error::NoGpu { .. })));
    }
}
