//! Where the time of first calls goes: the process-wide time spent building kernels,
//! step by step.
//!
//! Owns: [`BuildTimes`] and [`build_times`]. Each step a launch takes only for a kernel
//! it has not seen adds its wall time here: building the IR, looking up the kernel in the
//! launch index (a hit skips generating CUDA), generating CUDA, reading and verifying a
//! module from the disk cache, loading libnvrtc (once), compiling with NVRTC (its front
//! end and its assembler: the cubin comes out of the same call), and loading the module
//! on a device. A first call's time is the sum of its steps plus one launch; the steps of a
//! warm process add nothing.
//!
//! Invariants: the counters only grow; threads that build at once each add their own
//! time (the sum can exceed the wall time that passed).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One step of building a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Ir,
    Codegen,
    Disk,
    NvrtcLoad,
    Nvrtc,
    Load,
    Index,
}

const STEPS: usize = 7;

static NANOS: [AtomicU64; STEPS] = [const { AtomicU64::new(0) }; STEPS];
static COUNTS: [AtomicU64; STEPS] = [const { AtomicU64::new(0) }; STEPS];

/// Runs `f`, adding its wall time to `step`; returns its result and that time (for the
/// step's `tracing` event).
pub(crate) fn measured<T>(step: Step, f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    let d = t.elapsed();
    add(step, d);
    (r, d)
}

/// A duration in milliseconds to the microsecond: the `elapsed_ms` field of the
/// runtime's `tracing` events (lib.rs, Logging).
pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Adds one run of `step` that took `d`.
pub(crate) fn add(step: Step, d: Duration) {
    NANOS[step as usize].fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    COUNTS[step as usize].fetch_add(1, Ordering::Relaxed);
}

/// The time this process has spent building kernels, by step, and how many times it
/// took each ([`build_times`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildTimes {
    /// Building a kernel's IR for its dtypes and deriving its grid (once per kernel and
    /// dtypes).
    pub ir: Duration,
    /// Generating CUDA from the IR (once per kernel specialization that the launch
    /// index does not hold, register-room attempts included).
    pub codegen: Duration,
    /// Reading and verifying modules from the disk cache.
    pub disk: Duration,
    /// Finding and loading libnvrtc (once a process, at its first compile; a process
    /// that finds every kernel on disk never loads it).
    pub nvrtc_load: Duration,
    /// NVRTC compiles: the front end and its assembler.
    pub nvrtc: Duration,
    /// Loading modules on a device (the driver's `cuModuleLoadData` of the cubin, and
    /// the function's attributes).
    pub load: Duration,
    /// Looking up kernels in the launch index ([`crate::launch_index`]): the key (the
    /// IR's text hashed, and once a process the compiler's fingerprint), then reading,
    /// verifying and parsing an entry, or finding none.
    pub index: Duration,
    /// How many times each step ran, in the order above.
    pub counts: [u64; STEPS],
}

impl BuildTimes {
    /// The sum of the steps.
    pub fn total(&self) -> Duration {
        self.ir + self.codegen + self.disk + self.nvrtc_load + self.nvrtc + self.load + self.index
    }

    /// The time between `earlier` (a value read before) and this one, step by step.
    pub fn since(&self, earlier: &BuildTimes) -> BuildTimes {
        let mut counts = [0; STEPS];
        for (i, c) in counts.iter_mut().enumerate() {
            *c = self.counts[i].saturating_sub(earlier.counts[i]);
        }
        BuildTimes {
            ir: self.ir.saturating_sub(earlier.ir),
            codegen: self.codegen.saturating_sub(earlier.codegen),
            disk: self.disk.saturating_sub(earlier.disk),
            nvrtc_load: self.nvrtc_load.saturating_sub(earlier.nvrtc_load),
            nvrtc: self.nvrtc.saturating_sub(earlier.nvrtc),
            load: self.load.saturating_sub(earlier.load),
            index: self.index.saturating_sub(earlier.index),
            counts,
        }
    }
}

impl std::fmt::Display for BuildTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let c = self.counts;
        write!(
            f,
            "IR {:.2} ms ({}), launch index {:.2} ms ({}), codegen {:.2} ms ({}), disk {:.2} ms ({}), NVRTC library load {:.2} ms ({}), NVRTC {:.2} ms ({}), module load {:.2} ms ({}); total {:.2} ms",
            ms(self.ir),
            c[0],
            ms(self.index),
            c[6],
            ms(self.codegen),
            c[1],
            ms(self.disk),
            c[2],
            ms(self.nvrtc_load),
            c[3],
            ms(self.nvrtc),
            c[4],
            ms(self.load),
            c[5],
            ms(self.total())
        )
    }
}

/// The time this process has spent building kernels so far, by step (module docs).
/// Take the [`BuildTimes::since`] of two readings for the cost of the calls between.
///
/// # Examples
///
/// ```
/// let before = kfuse_runtime::build_times();
/// // … the first calls of some kernels …
/// let spent = kfuse_runtime::build_times().since(&before);
/// println!("{spent}"); // IR … ms (n), codegen … ms (n), …; total … ms
/// assert!(spent.total() >= spent.nvrtc);
/// ```
pub fn build_times() -> BuildTimes {
    let d = |s: Step| Duration::from_nanos(NANOS[s as usize].load(Ordering::Relaxed));
    let mut counts = [0; STEPS];
    for (i, c) in counts.iter_mut().enumerate() {
        *c = COUNTS[i].load(Ordering::Relaxed);
    }
    BuildTimes {
        ir: d(Step::Ir),
        codegen: d(Step::Codegen),
        disk: d(Step::Disk),
        nvrtc_load: d(Step::NvrtcLoad),
        nvrtc: d(Step::Nvrtc),
        load: d(Step::Load),
        index: d(Step::Index),
        counts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_steps_add_up_and_since_subtracts() {
        let before = build_times();
        let ((), t) = measured(Step::Codegen, || std::thread::sleep(Duration::from_millis(2)));
        assert!(t >= Duration::from_millis(2) && ms(t) >= 2.0);
        let d = build_times().since(&before);
        assert!(d.codegen >= Duration::from_millis(2), "{d}");
        assert!(d.counts[1] >= 1);
        assert!(d.total() >= d.codegen);
        assert!(d.to_string().contains("codegen"), "{d}");
    }
}
