//! The module cache: compiled modules (PTX and cubin, [`Module`]) in memory and on disk,
//! loaded kernels per device.
//!
//! Owns: [`ModuleCache`] (source → module, memory + disk), [`compile_cached`], and the
//! per-device `FunctionCache` of loaded kernels. A GPU loads a module's cubin as it is:
//! a kernel found on disk costs no NVRTC and no PTX → SASS step in the driver.
//!
//! Levels, fastest first:
//! 1. per device, loaded functions keyed by `ModuleKey` — (kernel, dtypes, [`Spec`],
//!    [`Target`]; the emitted kernel, with its tensor-map boxes, swizzles and persistent
//!    grid, is a function of these) — so that a repeated launch skips IR building,
//!    codegen and NVRTC, and by a hash of source *and* launch rule for pre-emitted
//!    kernels (`source_key`);
//! 2. per process, modules keyed by the disk key below ([`CacheOutcome::Memory`]);
//! 3. on disk, module files in `$KFUSE_CACHE_DIR` or the directory set in code
//!    ([`crate::settings::Config::cache_dir`]; default `<user cache dir>/kfuse`; an
//!    empty `KFUSE_CACHE_DIR` or [`crate::settings::Config::no_disk_cache`] turns the
//!    disk level off) ([`CacheOutcome::Disk`]);
//! 4. NVRTC ([`CacheOutcome::Compiled`]).
//!
//! A GPU launch that misses level 1 asks the launch index ([`crate::launch_index`],
//! `<key>.launch` files in the same directory) for the kernel an earlier process
//! generated for its `ModuleKey`'s facts, and generates CUDA only when it holds none;
//! either way the emitted kernel's source, arch and options then go through levels 2–4.
//!
//! Invariants:
//! - The disk key is the hex SHA-256 of the entry format, the source, the architecture
//!   and the complete NVRTC option list ([`crate::nvrtc::full_options`]), each
//!   length-prefixed; the file is `<key>.module`. The NVRTC version is recorded in the
//!   entry ([`Module::nvrtc`]) but is not part of the key: a process that finds every
//!   kernel on disk never loads NVRTC (a 40 ms load), and a cubin's validity does not
//!   depend on the NVRTC that built it (the driver checks it at load). After installing
//!   another NVRTC, [`ModuleCache::clear`] rebuilds every entry with it.
//! - A file is a header — `kfuse-module 3`, `nvrtc <major>.<minor>`, `cubin <bytes> <hex
//!   SHA-256 of the cubin>`, `ptx <bytes> <hex SHA-256 of the PTX>`, an empty line — and
//!   the body: the cubin (none for a virtual architecture), then the PTX. A file whose
//!   header or lengths do not check out, or whose hash of a part read does not, is
//!   deleted and recompiled, never loaded. A GPU that loads the cubin reads the header
//!   and the cubin alone (`ModuleCache::compile_for_device`): a first launch neither
//!   reads nor hashes the PTX, two thirds of a GEMM's file; [`ModuleCache::compile`]
//!   reads and verifies both.
//! - Files are written to a temporary name in the same directory and renamed into place,
//!   so readers see a whole file or none. The disk level is best effort: a directory
//!   that cannot be created or written costs a recompile, not an error.
//! - A key is compiled once per process: concurrent calls of a [`ModuleCache`] for a key
//!   that is not in memory share one in-flight entry; the first looks on disk and
//!   compiles, the others wait for its result and get it as [`CacheOutcome::Memory`]. A
//!   failure reaches the waiters too, but is not kept: the next call tries again. The
//!   per-device `FunctionCache` loads a kernel once the same way (and runs the source
//!   hook once).
//! - A key is compiled once per cache directory: before compiling a key missing on disk,
//!   a process takes the exclusive lock file `<key>.lock` (`File::try_lock`, polled;
//!   released at exit by the OS); holding it, it reads the entry again, compiles only if
//!   it is still missing, renames the file into place, removes the lock file and
//!   unlocks. A waiter that finds the entry written meanwhile takes it
//!   ([`CacheOutcome::Disk`]); one that locks a file already removed opens the new one.
//!   The wait is bounded ([`DEFAULT_LOCK_WAIT`], [`ModuleCache::with_lock_wait`]): past it,
//!   or where no lock can be taken (no disk level, a directory that cannot be written, a
//!   file system without locks), the process compiles without one — at worst a second
//!   compile, never an error or a hang.
//! - [`crate::nvrtc::compiles`] counts the process's NVRTC compiles,
//!   [`ModuleCache::stats`] a cache's compiles, memory and disk hits, and
//!   [`ModuleCache::disk_usage`] the entries and bytes of its directory.
//! - Everything here but `FunctionCache` works without a GPU (only NVRTC), so CI tests
//!   the disk cache and its corruption recovery.
//!
//! A development aid, compiled in only with the cargo feature `dev-hooks` (off by
//! default) and then off unless asked for: `KFUSE_SOURCE_HOOK=CMD` runs `CMD FILE ENTRY`
//! (through `sh -c`) on every generated source before it is compiled, `FILE` holding the
//! source; what `FILE` holds afterwards is compiled and loaded instead (`hooked`). It
//! lets a change to the generated code be timed on a GPU before the compiler learns to
//! make it. The hook runs once per generated kernel and process: the loaded function is
//! kept under the generated source's key, the module on disk under the new source's.

use std::collections::HashMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::CudaFunction;
use kfuse_codegen::{EmittedKernel, Spec, Target};
use kfuse_ir::DType;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::build_times::{measured, ms, Step};
use crate::nvrtc::{self, Module};
use crate::settings::Settings;

/// Where a compile was answered from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheOutcome {
    /// This process had it already (a module or a loaded function).
    Memory,
    /// Read from a verified file of the disk cache.
    Disk,
    /// Compiled by NVRTC (and written to the disk cache).
    Compiled,
}

const MAGIC: &str = "kfuse-module 3";

/// The extension of a cache file.
const EXTENSION: &str = "module";

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// The hex SHA-256 of `parts`, each prefixed by its length (so that no two lists of
/// parts hash the same bytes): the cache keys.
pub(crate) fn sha256_of_parts(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex(&h.finalize())
}

/// How long a compile waits for another process's lock on its cache entry before it
/// compiles anyway ([`ModuleCache::with_lock_wait`]).
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(120);

/// What a [`ModuleCache`] has answered so far ([`ModuleCache::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// NVRTC compiles this cache ran, failed ones included.
    pub compiles: u64,
    /// Calls answered from memory, waits for another thread's compile of the same key
    /// included.
    pub memory_hits: u64,
    /// Calls answered from a verified disk file, one another process wrote while this
    /// one waited for its lock included.
    pub disk_hits: u64,
    /// Compiles that found another holder's lock on their entry and waited for it.
    pub lock_waits: u64,
}

/// What a [`ModuleCache`]'s directory holds ([`ModuleCache::disk_usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Module files (`<key>.module`), one per compiled kernel and architecture.
    pub entries: u64,
    /// Their size in bytes.
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    compiles: AtomicU64,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    lock_waits: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Modules compiled from CUDA source, cached in memory and on disk (see the module docs).
///
/// # Examples
///
/// Needs NVRTC (not a GPU):
///
/// ```
/// use kfuse_runtime::{CacheOutcome, ModuleCache};
///
/// let src = r#"extern "C" __global__ void k(float* p) { p[threadIdx.x] = 1.0f; }"#;
/// let dir = std::env::temp_dir().join(format!("kfuse-doc-{}", std::process::id()));
/// let cache = ModuleCache::new(Some(dir.clone()));
/// let (_, first) = cache.compile(src, "sm_90a", &[])?; // NVRTC, then a file on disk
/// let (_, again) = cache.compile(src, "sm_90a", &[])?;
/// assert_eq!((first, again), (CacheOutcome::Compiled, CacheOutcome::Memory));
/// // another process (or another cache of this directory) reads the file instead
/// let (_, fresh) = ModuleCache::new(cache.dir().map(Into::into)).compile(src, "sm_90a", &[])?;
/// assert_eq!(fresh, CacheOutcome::Disk);
/// assert_eq!(cache.stats().compiles, 1);
/// assert_eq!(cache.disk_usage()?.entries, 1);
/// assert_eq!(cache.clear()?, 1); // files deleted
/// # std::fs::remove_dir_all(dir)?;
/// # Ok::<(), kfuse_runtime::Error>(())
/// ```
pub struct ModuleCache {
    dir: Option<PathBuf>,
    mem: Mutex<HashMap<String, Arc<Module>>>,
    flights: InFlight<Arc<Module>>,
    lock_wait: Duration,
    counters: Counters,
}

impl ModuleCache {
    /// A cache with its own memory level and disk files in `dir` (`None`: no disk level).
    pub fn new(dir: Option<PathBuf>) -> ModuleCache {
        ModuleCache { dir, mem: Mutex::default(), flights: InFlight::default(), lock_wait: DEFAULT_LOCK_WAIT, counters: Counters::default() }
    }

    /// The same cache with another bound on the wait for another process's lock on an
    /// entry (default [`DEFAULT_LOCK_WAIT`]); past it, the compile runs anyway.
    pub fn with_lock_wait(mut self, wait: Duration) -> ModuleCache {
        self.lock_wait = wait;
        self
    }

    /// The cache directory of the settings in force ([`crate::settings::Settings::cache_dir`]):
    /// [`Config::cache_dir`](crate::settings::Config::cache_dir) if set in code, else the
    /// directory `KFUSE_CACHE_DIR` names (none if it is set but empty), else
    /// `<user cache dir>/kfuse`.
    pub fn default_dir() -> Option<PathBuf> {
        crate::settings::current().cache_dir().map(Path::to_path_buf)
    }

    /// The process-wide cache of [`ModuleCache::default_dir`] as it is now: one cache, with
    /// its own memory level, for each directory the settings have named in this process
    /// (a program that moves its cache directory in code compiles into the new one).
    pub fn global() -> &'static ModuleCache {
        static G: OnceLock<Mutex<HashMap<Option<PathBuf>, &'static ModuleCache>>> = OnceLock::new();
        let dir = ModuleCache::default_dir();
        let mut g = lock(G.get_or_init(Default::default));
        g.entry(dir.clone()).or_insert_with(|| Box::leak(Box::new(ModuleCache::new(dir))))
    }

    /// The disk directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Deletes this cache's entries on disk (files `*.module` of its directory, and the
    /// launch index's `*.launch` beside them: [`crate::launch_index`]) and in memory, and
    /// returns how many module files it deleted; kernels already loaded on a device stay
    /// loaded. The next compile of each kernel runs NVRTC again, and the next process
    /// generates each kernel again (choosing its register-room attempt anew).
    pub fn clear(&self) -> Result<usize> {
        lock(&self.mem).clear();
        let files = self.module_files()?;
        for path in files.iter().chain(&self.files_with(crate::launch_index::EXTENSION)?) {
            std::fs::remove_file(path)?;
        }
        Ok(files.len())
    }

    /// The entry files (`*.module`) of the disk directory: none without a disk level or
    /// before the directory exists.
    fn module_files(&self) -> Result<Vec<PathBuf>> {
        self.files_with(EXTENSION)
    }

    /// The files `*.<extension>` of the disk directory: none without a disk level or
    /// before the directory exists.
    fn files_with(&self, extension: &str) -> Result<Vec<PathBuf>> {
        let Some(dir) = &self.dir else { return Ok(Vec::new()) };
        let entries = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut files = Vec::new();
        for e in entries {
            let path = e?.path();
            if path.extension().is_some_and(|x| x == extension) {
                files.push(path);
            }
        }
        Ok(files)
    }

    /// What this cache has answered so far: NVRTC compiles, memory and disk hits, waits
    /// for another process's lock.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            compiles: c.compiles.load(Ordering::Relaxed),
            memory_hits: c.memory_hits.load(Ordering::Relaxed),
            disk_hits: c.disk_hits.load(Ordering::Relaxed),
            lock_waits: c.lock_waits.load(Ordering::Relaxed),
        }
    }

    /// The entries of this cache's directory on disk (its `*.module` files, those
    /// [`ModuleCache::clear`] deletes) and the bytes they take; zero without a disk level
    /// or before the directory exists. Other processes sharing the directory count too.
    ///
    /// ```
    /// let cache = kfuse_runtime::ModuleCache::new(None); // no disk level
    /// assert_eq!(cache.disk_usage()?, kfuse_runtime::cache::DiskUsage { entries: 0, bytes: 0 });
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn disk_usage(&self) -> Result<DiskUsage> {
        let mut usage = DiskUsage::default();
        for path in self.module_files()? {
            // an entry another process deletes meanwhile is not counted
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => {
                    usage.entries += 1;
                    usage.bytes += m.len();
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(usage)
    }

    /// The cache key of a compile: hex SHA-256 of the entry format, source, arch and
    /// complete options (module docs: not the NVRTC version, which a warm process does
    /// not load NVRTC to learn).
    pub fn key(source: &str, arch: &str, full_options: &[String]) -> String {
        let count = (full_options.len() as u64).to_le_bytes();
        let mut parts = vec![MAGIC.as_bytes(), source.as_bytes(), arch.as_bytes(), &count];
        parts.extend(full_options.iter().map(|o| o.as_bytes()));
        sha256_of_parts(&parts)
    }

    /// The file a compile is cached in; `None` without a disk level. The lock that
    /// guards its writing is the same path with `.lock`.
    pub fn entry_path(&self, source: &str, arch: &str, options: &[String]) -> Result<Option<PathBuf>> {
        let full = nvrtc::full_options(arch, options);
        let key = ModuleCache::key(source, arch, &full);
        Ok(self.dir.as_ref().map(|d| d.join(format!("{key}.{EXTENSION}"))))
    }

    /// The module of `source` compiled for `arch` with extra NVRTC `options`, and where it came
    /// from. Concurrent calls for one key compile it once (module docs).
    pub fn compile(&self, source: &str, arch: &str, options: &[String]) -> Result<(Arc<Module>, CacheOutcome)> {
        let full = nvrtc::full_options(arch, options);
        let key = ModuleCache::key(source, arch, &full);
        let memory = || lock(&self.mem).get(&key).cloned();
        let t = Instant::now();
        let (module, outcome) = match memory() {
            Some(p) => (p, CacheOutcome::Memory),
            None => self.flights.run(&key, memory, || self.fill(&key, source, &full))?,
        };
        tracing::debug!(target: "kfuse::cache", %arch, key = %&key[..16], ?outcome, elapsed_ms = ms(t.elapsed()), "module cache lookup");
        if outcome == CacheOutcome::Memory {
            bump(&self.counters.memory_hits);
        }
        Ok((module, outcome))
    }

    /// [`ModuleCache::compile`] for an emitted kernel (its source, arch and options).
    pub fn compile_emitted(&self, emitted: &EmittedKernel) -> Result<(Arc<Module>, CacheOutcome)> {
        let _span = tracing::debug_span!(target: "kfuse::cache", "compile", kernel = %emitted.entry).entered();
        self.compile(&emitted.source, &emitted.arch, &emitted.options)
    }

    /// [`ModuleCache::compile_emitted`] for a device, which loads the module's cubin
    /// (`cubin`: the emitted arch's cubin runs there) or its PTX. For the cubin, a module
    /// not in memory is read from disk without its PTX: a [`Module`] whose `ptx` is
    /// empty, kept nowhere, for the device to load and for nothing else. Every other
    /// case, a file without a cubin and a miss among them, is `compile_emitted`'s.
    pub(crate) fn compile_for_device(&self, emitted: &EmittedKernel, cubin: bool) -> Result<(Arc<Module>, CacheOutcome)> {
        if let (true, Some(dir)) = (cubin, &self.dir) {
            let full = nvrtc::full_options(&emitted.arch, &emitted.options);
            let key = ModuleCache::key(&emitted.source, &emitted.arch, &full);
            if let Some(m) = lock(&self.mem).get(&key).cloned() {
                bump(&self.counters.memory_hits);
                return Ok((m, CacheOutcome::Memory));
            }
            let path = dir.join(format!("{key}.{EXTENSION}"));
            let (r, d) = measured(Step::Disk, || read_cubin(&path));
            tracing::debug!(target: "kfuse::cache", hit = matches!(r, CubinRead::Cubin(..)), path = %path.display(), elapsed_ms = ms(d), "disk cache read (cubin)");
            if let CubinRead::Cubin(cubin, nvrtc) = r {
                bump(&self.counters.disk_hits);
                return Ok((Arc::new(Module { ptx: String::new(), cubin, nvrtc }), CacheOutcome::Disk));
            }
        }
        self.compile_emitted(emitted)
    }

    /// The module of a key that is not in memory, which this thread alone is looking for:
    /// from disk, else compiled under the entry's lock file. Puts it in memory.
    fn fill(&self, key: &str, source: &str, full: &[String]) -> Result<(Arc<Module>, CacheOutcome)> {
        let path = self.dir.as_ref().map(|d| d.join(format!("{key}.{EXTENSION}")));
        let disk = |m: Module| {
            bump(&self.counters.disk_hits);
            Ok((self.remember(key, m), CacheOutcome::Disk))
        };
        let mut held = None;
        if let Some(path) = &path {
            let (m, d) = measured(Step::Disk, || read_entry(path));
            tracing::debug!(target: "kfuse::cache", hit = m.is_some(), path = %path.display(), elapsed_ms = ms(d), "disk cache read");
            if let Some(m) = m {
                return disk(m);
            }
            // another process may be compiling it: wait for its lock, and take the entry
            // it writes
            match lock_entry(&path.with_extension("lock"), self.lock_wait, &self.counters.lock_waits, || read_entry(path)) {
                Locked::Entry(m) => return disk(m),
                Locked::Held(l) => held = Some(l),
                Locked::Without => {}
            }
        }
        bump(&self.counters.compiles);
        // (the library's first load is a step of its own, not part of the compile's time)
        nvrtc::ensure_nvrtc()?;
        let (m, d) = measured(Step::Nvrtc, || nvrtc::compile_module_exact(source, full));
        tracing::debug!(target: "kfuse::nvrtc", ok = m.is_ok(), elapsed_ms = ms(d), "NVRTC compile");
        let m = m?;
        if let Some(path) = &path {
            let _ = write_entry(path, &m);
        }
        // the entry is in place (or cannot be): the next process may look
        drop(held);
        Ok((self.remember(key, m), CacheOutcome::Compiled))
    }

    fn remember(&self, key: &str, m: Module) -> Arc<Module> {
        let p = Arc::new(m);
        lock(&self.mem).insert(key.to_string(), p.clone());
        p
    }
}

/// Calls for one key at a time: the first runs the work, the others that come while it
/// runs wait for its result (module docs).
struct InFlight<V> {
    map: Mutex<HashMap<String, Flight<V>>>,
}

type Flight<V> = Arc<OnceLock<std::result::Result<(V, CacheOutcome), Arc<Error>>>>;

impl<V> Default for InFlight<V> {
    fn default() -> Self {
        InFlight { map: Mutex::default() }
    }
}

impl<V: Clone> InFlight<V> {
    /// `done()` if it answers (asked under the map's lock), else the result of the run
    /// of `work` under way for `key`, else `work()` run here. What another call found or
    /// ran is [`CacheOutcome::Memory`] to this one. `work` must leave its success where
    /// `done` finds it before it returns; the entry is dropped after, so a failure
    /// reaches the calls that waited for it but is not kept: a later call runs the work
    /// again.
    fn run(&self, key: &str, done: impl FnOnce() -> Option<V>, work: impl FnOnce() -> Result<(V, CacheOutcome)>) -> Result<(V, CacheOutcome)> {
        let cell = {
            let mut m = lock(&self.map);
            if let Some(v) = done() {
                return Ok((v, CacheOutcome::Memory));
            }
            m.entry(key.to_string()).or_default().clone()
        };
        let mut led = false;
        // a panic in `work` leaves the cell empty, and the next caller runs it
        let r = match cell.get_or_init(|| {
            led = true;
            work().map_err(Arc::new)
        }) {
            Ok(v) => Ok(v.clone()),
            Err(e) => Err(duplicate(e)),
        };
        if !led {
            return r.map(|(v, _)| (v, CacheOutcome::Memory));
        }
        let mut m = lock(&self.map);
        if m.get(key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            m.remove(key);
        }
        r
    }
}

/// A copy of an error for each caller that waited on one run ([`Error`] holds an
/// `io::Error`, which is not `Clone`).
fn duplicate(e: &Error) -> Error {
    match e {
        Error::ShapeMismatch(m) => Error::ShapeMismatch(m.clone()),
        Error::DTypeMismatch(m) => Error::DTypeMismatch(m.clone()),
        Error::NonContiguous { what, shape, strides } => Error::NonContiguous { what: what.clone(), shape: shape.clone(), strides: strides.clone() },
        Error::DeviceMismatch(m) => Error::DeviceMismatch(m.clone()),
        Error::Aliasing(m) => Error::Aliasing(m.clone()),
        Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
        Error::NoGpu { reason } => Error::NoGpu { reason: reason.clone() },
        Error::NvrtcMissing { searched } => Error::NvrtcMissing { searched: searched.clone() },
        Error::Nvrtc { log, source } => Error::Nvrtc { log: log.clone(), source: source.clone() },
        Error::Driver(m) => Error::Driver(m.clone()),
        Error::Codegen(c) => Error::Codegen(c.clone()),
        Error::Ir(i) => Error::Ir(i.clone()),
        Error::Io(io) => Error::Io(std::io::Error::new(io.kind(), io.to_string())),
        Error::Ptxas(m) => Error::Ptxas(m.clone()),
        Error::Vendor(m) => Error::Vendor(m.clone()),
    }
}

/// The lock file of a cache entry, held: removed, then unlocked, when dropped.
struct EntryLock {
    file: File,
    path: PathBuf,
}

impl Drop for EntryLock {
    fn drop(&mut self) {
        // removed while still held: whoever waits on this file finds it gone and opens
        // the next one (`lock_entry`)
        #[cfg(unix)]
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

/// What [`lock_entry`] got.
enum Locked {
    /// The lock: the entry was not there once it was held.
    Held(EntryLock),
    /// The entry, which another process wrote meanwhile.
    Entry(Module),
    /// No lock to be had — the directory or file system does not allow one, or the wait
    /// ran out: compile without.
    Without,
}

/// Takes the exclusive lock file `path` (created if missing), waiting at most `wait` and
/// watching `entry` meanwhile; never an error. A wait bumps `waits`.
fn lock_entry(path: &Path, wait: Duration, waits: &AtomicU64, entry: impl Fn() -> Option<Module>) -> Locked {
    let deadline = Instant::now() + wait;
    let mut waited = false;
    let mut pause = Duration::from_millis(1);
    if let Some(dir) = path.parent() {
        if std::fs::create_dir_all(dir).is_err() {
            return Locked::Without;
        }
    }
    loop {
        let Ok(file) = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path) else {
            return Locked::Without;
        };
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if !waited => {
                    waited = true;
                    bump(waits);
                }
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(_)) => return Locked::Without,
            }
            if let Some(m) = entry() {
                return Locked::Entry(m);
            }
            if Instant::now() >= deadline {
                return Locked::Without;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        if !is_at(&file, path) {
            // its holder removed it before unlocking: a lock on nothing, and the file now
            // at `path` (if any) is the lock
            drop(file);
            if Instant::now() >= deadline {
                return Locked::Without;
            }
            continue;
        }
        let held = EntryLock { file, path: path.to_path_buf() };
        return match entry() {
            Some(m) => Locked::Entry(m),
            None => Locked::Held(held),
        };
    }
}

/// Whether `file` is the file at `path` (always, where that cannot be told).
fn is_at(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, path);
        true
    }
}

/// The module of an emitted kernel through the process-wide [`ModuleCache::global`]. Needs NVRTC,
/// not a GPU.
///
/// # Examples
///
/// ```
/// use kfuse_codegen::Target;
/// use kfuse_runtime::{compile_cached, emit, ArgDesc, DType, Result};
///
/// /// Compiles what a launch of `def` (`k::DEF` of a `#[kfuse] fn k(x: Tensor<T, (N,)>,
/// /// y: &mut Tensor<T, (N,)>)`) on 2^20 bf16 elements runs on an sm_80 GPU, without one.
/// fn precompile(def: &kfuse_ir::KernelDef) -> Result<usize> {
///     let t = ArgDesc::tensor(DType::BF16, &[1 << 20]);
///     let emitted = emit(def, &[t.clone(), t], &Target::sm80())?;
///     let (module, outcome) = compile_cached(&emitted)?;
///     println!("{}: {outcome:?}", emitted.entry);
///     Ok(module.ptx.len())
/// }
/// ```
pub fn compile_cached(emitted: &EmittedKernel) -> Result<(Arc<Module>, CacheOutcome)> {
    ModuleCache::global().compile_emitted(emitted)
}

/// Reads and verifies a cache file; a file that exists but does not verify is deleted.
fn read_entry(path: &Path) -> Option<Module> {
    read_verified(path, parse_entry)
}

/// What `parse` makes of the bytes of the file at `path`; a file that exists but that
/// `parse` refuses is deleted (module files, launch-index files).
pub(crate) fn read_verified<T>(path: &Path, parse: impl FnOnce(Vec<u8>) -> Option<T>) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    match parse(bytes) {
        Some(v) => Some(v),
        None => {
            let _ = std::fs::remove_file(path);
            None
        }
    }
}

/// The header of a cache file: the NVRTC that built the module, the length and hex
/// SHA-256 of the cubin and of the PTX, and where the body starts.
struct Header {
    nvrtc: (i32, i32),
    cubin: (usize, String),
    ptx: (usize, String),
    body: usize,
}

/// How many bytes a header takes at most (a longer one is damage).
const MAX_HEADER: usize = 512;

impl Header {
    /// The header at the start of `bytes`, if it is one and the body it announces is
    /// `file_len - header` bytes long.
    fn parse(bytes: &[u8], file_len: u64) -> Option<Header> {
        let end = bytes.windows(2).position(|w| w == b"\n\n")?;
        let text = std::str::from_utf8(&bytes[..end]).ok()?;
        let mut lines = text.split('\n');
        if lines.next()? != MAGIC {
            return None;
        }
        let (major, minor) = lines.next()?.strip_prefix("nvrtc ")?.split_once('.')?;
        let mut part = |name: &str| -> Option<(usize, String)> {
            let (len, sha) = lines.next()?.strip_prefix(name)?.split_once(' ')?;
            Some((len.parse().ok()?, sha.to_string()))
        };
        let (cubin, ptx) = (part("cubin ")?, part("ptx ")?);
        let h = Header { nvrtc: (major.parse().ok()?, minor.parse().ok()?), cubin, ptx, body: end + 2 };
        let total = h.body.checked_add(h.cubin.0)?.checked_add(h.ptx.0)?;
        (lines.next().is_none() && total as u64 == file_len).then_some(h)
    }
}

/// The verified module of a cache file, or `None`. The file's buffer becomes the PTX
/// (moved down over the header and the cubin, not copied): of a first call's disk read,
/// fresh memory to fill is most of the time.
fn parse_entry(mut bytes: Vec<u8>) -> Option<Module> {
    let h = Header::parse(&bytes[..bytes.len().min(MAX_HEADER)], bytes.len() as u64)?;
    let cubin_end = h.body + h.cubin.0;
    let cubin = &bytes[h.body..cubin_end];
    if sha256_hex(cubin) != h.cubin.1 || sha256_hex(&bytes[cubin_end..]) != h.ptx.1 {
        return None;
    }
    let cubin = cubin.to_vec();
    bytes.drain(..cubin_end);
    Some(Module { ptx: String::from_utf8(bytes).ok()?, cubin, nvrtc: h.nvrtc })
}

/// What [`read_cubin`] found.
enum CubinRead {
    /// The verified cubin and the NVRTC version of the file.
    Cubin(Vec<u8>, (i32, i32)),
    /// A file with no cubin (a virtual architecture's).
    NoCubin,
    /// No file, or one that could not be read or did not verify (and was deleted).
    Miss,
}

/// The cubin of a cache file, read and verified without the PTX; a file whose header,
/// length or cubin does not check out is deleted.
fn read_cubin(path: &Path) -> CubinRead {
    use std::io::Read;
    let Ok(mut f) = File::open(path) else { return CubinRead::Miss };
    let Ok(len) = f.metadata().map(|m| m.len()) else { return CubinRead::Miss };
    let mut head = vec![0; (len as usize).min(MAX_HEADER)];
    if f.read_exact(&mut head).is_err() {
        return CubinRead::Miss;
    }
    let damaged = || {
        let _ = std::fs::remove_file(path);
        CubinRead::Miss
    };
    let Some(h) = Header::parse(&head, len) else { return damaged() };
    if h.cubin.0 == 0 {
        return CubinRead::NoCubin;
    }
    // the header's chunk may hold the cubin's start (or all of it); the rest goes
    // straight into the cubin's own buffer
    let mut cubin = Vec::with_capacity(h.cubin.0);
    cubin.extend_from_slice(&head[h.body.min(head.len())..(h.body + h.cubin.0).min(head.len())]);
    let rest = (h.cubin.0 - cubin.len()) as u64;
    if f.take(rest).read_to_end(&mut cubin).is_err() || cubin.len() != h.cubin.0 {
        return CubinRead::Miss;
    }
    if sha256_hex(&cubin) != h.cubin.1 {
        return damaged();
    }
    CubinRead::Cubin(cubin, h.nvrtc)
}

/// The bytes of a cache file for `m`.
fn format_entry(m: &Module) -> Vec<u8> {
    let (major, minor) = m.nvrtc;
    let (cubin, ptx) = (&m.cubin, m.ptx.as_bytes());
    let mut out = format!("{MAGIC}\nnvrtc {major}.{minor}\ncubin {} {}\nptx {} {}\n\n", cubin.len(), sha256_hex(cubin), ptx.len(), sha256_hex(ptx)).into_bytes();
    out.extend_from_slice(cubin);
    out.extend_from_slice(ptx);
    out
}

/// Writes a cache file atomically (temporary file in the same directory, then rename).
fn write_entry(path: &Path, m: &Module) -> std::io::Result<()> {
    write_atomically(path, &format_entry(m))
}

/// Writes `bytes` to `path` atomically: to a temporary file in the same directory
/// (created if missing), then renamed into place.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.flush()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// What identifies a specialized kernel of a [`kfuse_ir::KernelDef`] on one device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ModuleKey {
    /// The address of the def's `build` function: two defs with one name stay apart.
    pub build: usize,
    pub kernel: String,
    pub dtypes: Vec<DType>,
    pub spec: Spec,
    pub target: Target,
}

/// A kernel loaded on a device, with how to launch it.
pub(crate) struct LoadedKernel {
    pub func: CudaFunction,
    pub emitted: EmittedKernel,
    /// Registers a thread and local memory a thread in bytes (spills), as the driver's
    /// assembler built the function.
    pub registers: u32,
    pub local_bytes: u32,
    /// The kernel's plan with those registers and local memory (`Launched::plan`), built
    /// once here so that a launch only clones the `Arc`.
    pub plan: Arc<kfuse_codegen::Plan>,
    /// What of this kernel the device holds at once, from the driver's occupancy
    /// calculator on the first launch (`launch::resident`): blocks per multiprocessor
    /// without clusters, clusters per device with them; 0 when it cannot say. Sizes a
    /// persistent grid.
    pub resident: std::sync::OnceLock<u32>,
    /// The tensor maps its launches encoded last (`launch::issue`).
    pub maps: crate::tma::MapCache,
}

/// Per-device loaded kernels, by `ModuleKey` and by source hash (see module docs), and
/// by launch signature (`launch::LaunchSig`) under the settings they were launched with.
pub(crate) struct FunctionCache {
    /// The device's compute capability: whether it loads a module's cubin
    /// (`device::cubin_runs_on`) or its PTX.
    cc: (i32, i32),
    by_key: Mutex<HashMap<ModuleKey, Arc<LoadedKernel>>>,
    by_source: Mutex<HashMap<String, Arc<LoadedKernel>>>,
    loading: InFlight<Arc<LoadedKernel>>,
    by_signature: Mutex<BySignature>,
}

/// Loaded kernels by launch signature, with the settings they were launched under.
type BySignature = HashMap<Box<[u64]>, (Arc<Settings>, Arc<LoadedKernel>), std::hash::BuildHasherDefault<WordHasher>>;

/// A multiply-rotate hasher (FxHash's step) for the signature memo, whose keys are a
/// few words this process builds, not input an adversary picks: a tenth of SipHash's
/// time on a launch's path.
#[derive(Default)]
pub(crate) struct WordHasher(u64);

impl std::hash::Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.write_u64(b as u64);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Most launch signatures a device remembers; past it the memo starts over (a program
/// that launches ever new shapes pays the full path, never unbounded memory).
const MAX_SIGNATURES: usize = 4096;

impl FunctionCache {
    /// The cache of a device of compute capability `cc`, empty.
    pub(crate) fn new(cc: (i32, i32)) -> FunctionCache {
        FunctionCache { cc, by_key: Mutex::default(), by_source: Mutex::default(), loading: InFlight::default(), by_signature: Mutex::default() }
    }

    /// The kernel launched for this signature under these settings (the same `Arc`: a
    /// settings change, in code or by `settings::reload`, makes a new one).
    pub(crate) fn remembered(&self, sig: &[u64], settings: &Arc<Settings>) -> Option<Arc<LoadedKernel>> {
        let m = lock(&self.by_signature);
        let (s, k) = m.get(sig)?;
        Arc::ptr_eq(s, settings).then(|| k.clone())
    }

    pub(crate) fn remember(&self, sig: &[u64], settings: Arc<Settings>, k: Arc<LoadedKernel>) {
        let mut m = lock(&self.by_signature);
        if m.len() >= MAX_SIGNATURES {
            m.clear();
        }
        m.insert(sig.into(), (settings, k));
    }

    pub(crate) fn get(&self, key: &ModuleKey) -> Option<Arc<LoadedKernel>> {
        lock(&self.by_key).get(key).cloned()
    }

    pub(crate) fn insert(&self, key: ModuleKey, k: Arc<LoadedKernel>) {
        lock(&self.by_key).insert(key, k);
    }

    /// The loaded kernel for an emitted kernel, loading it (through the global
    /// [`ModuleCache`], which reads only the cubin of a module on disk where the device
    /// loads the cubin, and `load`) on a miss; concurrent misses of one kernel load it
    /// once.
    pub(crate) fn get_or_load(
        &self,
        emitted: &EmittedKernel,
        load: impl FnOnce(&Module, &EmittedKernel) -> Result<CudaFunction>,
    ) -> Result<(Arc<LoadedKernel>, CacheOutcome)> {
        // keyed by what the compiler generated (a hook, if set, is the same all process
        // long, so it runs once per kernel, not once per launch)
        let skey = source_key(emitted);
        let loaded = || lock(&self.by_source).get(&skey).cloned();
        if let Some(k) = loaded() {
            return Ok((k, CacheOutcome::Memory));
        }
        let work = || {
            #[cfg(feature = "dev-hooks")]
            let hooked = match std::env::var("KFUSE_SOURCE_HOOK") {
                Ok(cmd) => hooked(&cmd, emitted)?,
                Err(_) => None,
            };
            #[cfg(feature = "dev-hooks")]
            let emitted = hooked.as_ref().unwrap_or(emitted);
            let cubin = crate::device::cubin_runs_on(&emitted.arch, self.cc);
            let (module, outcome) = ModuleCache::global().compile_for_device(emitted, cubin)?;
            let (func, d) = measured(Step::Load, || load(&module, emitted));
            let func = func?;
            let what = |a: &str| crate::error::driver(format!("reading the {a} of `{}`", emitted.entry));
            let registers = func.num_regs().map_err(what("registers"))? as u32;
            let local_bytes = func.local_size_bytes().map_err(what("local memory"))? as u32;
            tracing::debug!(target: "kfuse::runtime", kernel = %emitted.entry, registers, local_bytes, smem_bytes = emitted.smem_bytes, elapsed_ms = ms(d), "module load");
            let plan = Arc::new(emitted.plan.assembled(registers, local_bytes));
            let k = Arc::new(LoadedKernel { func, emitted: emitted.clone(), registers, local_bytes, plan, resident: Default::default(), maps: Default::default() });
            lock(&self.by_source).insert(skey.clone(), k.clone());
            Ok((k, outcome))
        };
        self.loading.run(&skey, loaded, work)
    }
}

/// The emitted kernel with its source as the `KFUSE_SOURCE_HOOK` command `cmd` left it
/// (module doc), or `None` when the command left the source as it was. A line `//
/// kfuse-hook: smem_bytes=N` in the new source sets the dynamic shared memory the kernel
/// is launched with (for a change that adds pipeline stages, say). A command that fails
/// is an error, not a silent fallback to the unchanged source. Only with the cargo
/// feature `dev-hooks`.
#[cfg(feature = "dev-hooks")]
fn hooked(cmd: &str, emitted: &EmittedKernel) -> Result<Option<EmittedKernel>> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let file = std::env::temp_dir().join(format!("kfuse-hook-{}-{}.cu", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let fail = |what: String| crate::error::Error::InvalidArgument(format!("KFUSE_SOURCE_HOOK `{cmd}` on `{}`: {what}", emitted.entry));
    std::fs::write(&file, &emitted.source).map_err(|e| fail(format!("writing {}: {e}", file.display())))?;
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cmd} \"$0\" \"$1\""))
        .arg(&file)
        .arg(&emitted.entry)
        .status()
        .map_err(|e| fail(format!("running it: {e}")))?;
    let source = std::fs::read_to_string(&file).map_err(|e| fail(format!("reading {} back: {e}", file.display())))?;
    let _ = std::fs::remove_file(&file);
    if !status.success() {
        return Err(fail(format!("it exited with {status}")));
    }
    if source == emitted.source {
        return Ok(None);
    }
    let mut e = emitted.clone();
    if let Some(n) = source.lines().find_map(|l| l.trim().strip_prefix("// kfuse-hook: smem_bytes=")) {
        e.smem_bytes = n.trim().parse().map_err(|_| fail(format!("`smem_bytes={n}` is not a number")))?;
    }
    e.source = source;
    Ok(Some(e))
}

/// The key of a pre-emitted kernel in [`FunctionCache`]: a hash of everything the loaded
/// kernel is launched with — source, arch, entry, options, shared memory — and of how it
/// is launched: the parameter list (tensor-map boxes and swizzles included), the grid
/// rule, threads, cluster width and the persistent block count. Two emitted kernels that
/// share a source but not a launch rule must not share a cache entry, since the entry
/// keeps the first one's [`EmittedKernel`] to launch with.
pub(crate) fn source_key(emitted: &EmittedKernel) -> String {
    let launch = format!(
        "params {:?}\ngrid {:?}\nthreads {}\ncluster_x {}\npersistent {:?}\nsmem {}",
        emitted.params, emitted.grid, emitted.block_threads, emitted.cluster_x, emitted.persistent, emitted.smem_bytes
    );
    let options = emitted.options.join("\u{1}");
    sha256_of_parts(&[emitted.source.as_bytes(), emitted.arch.as_bytes(), emitted.entry.as_bytes(), options.as_bytes(), launch.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made emitted kernel of `source`: sm_90a, 128 threads, no parameters.
    fn emitted_with(source: &str) -> EmittedKernel {
        EmittedKernel {
            entry: "kf_hooked".into(),
            source: source.into(),
            arch: "sm_90a".into(),
            options: vec![],
            block_threads: 128,
            grouped: false,
            smem_bytes: 0,
            params: vec![],
            grid: vec![],
            cluster_x: 1,
            persistent: None,
            ir: String::new(),
            tiles: Default::default(),
            register_attempt: (0, 1),
            plan: Default::default(),
        }
    }

    #[cfg(feature = "dev-hooks")]
    #[test]
    fn the_source_hook_replaces_the_source_and_may_set_shared_memory() {
        let e = emitted_with("// a\nint x;\n");
        // a command that leaves the file alone: nothing changes
        assert!(hooked("true", &e).unwrap().is_none());
        // one that edits it, and asks for more shared memory; it is given the entry name
        let cmd = r#"sh -c 'sed -i "s/int x/int y/" "$0" && printf "// kfuse-hook: smem_bytes=4096\n// %s\n" "$1" >> "$0"'"#;
        let h = hooked(cmd, &e).unwrap().expect("the source changed");
        assert!(h.source.contains("int y;") && h.source.contains(&format!("// {}", e.entry)), "{}", h.source);
        assert_eq!(h.smem_bytes, 4096);
        assert_ne!(source_key(&h), source_key(&e));
        // a failing command, or a malformed directive, is an error naming the hook
        let err = hooked("false", &e).unwrap_err().to_string();
        assert!(err.contains("KFUSE_SOURCE_HOOK `false`") && err.contains("exited"), "{err}");
        let err = hooked(r#"sh -c 'echo "// kfuse-hook: smem_bytes=lots" >> "$0"'"#, &e).unwrap_err().to_string();
        assert!(err.contains("smem_bytes=lots"), "{err}");
    }

    #[test]
    fn source_key_covers_the_launch_rule() {
        use kfuse_codegen::{GridAxisEval, KernelParam};
        use kfuse_ir::{ParamId, ShapeSym};
        let base = EmittedKernel {
            params: vec![KernelParam::TensorMap { tensor: ParamId(0), box_dims: vec![64, 64], swizzle: 128, order: vec![1, 0] }],
            grid: vec![GridAxisEval { dim: ShapeSym(0), step: 64 }],
            ..emitted_with("src")
        };
        let k = source_key(&base);
        assert_eq!(k, source_key(&base.clone()));
        let changed = [
            EmittedKernel { params: vec![KernelParam::TensorMap { tensor: ParamId(0), box_dims: vec![64, 32], swizzle: 128, order: vec![1, 0] }], ..base.clone() },
            EmittedKernel { params: vec![KernelParam::TensorMap { tensor: ParamId(0), box_dims: vec![64, 64], swizzle: 64, order: vec![1, 0] }], ..base.clone() },
            EmittedKernel { persistent: Some(132), ..base.clone() },
            EmittedKernel { cluster_x: 2, ..base.clone() },
            EmittedKernel { block_threads: 256, ..base.clone() },
            EmittedKernel { smem_bytes: 1024, ..base.clone() },
            EmittedKernel { grid: vec![GridAxisEval { dim: ShapeSym(0), step: 128 }], ..base.clone() },
            EmittedKernel { source: "src2".into(), ..base.clone() },
        ];
        for c in &changed {
            assert_ne!(source_key(c), k, "{c:?}");
        }
        // the IR text and the tile report do not change what is launched
        assert_eq!(source_key(&EmittedKernel { ir: "x".into(), ..base.clone() }), k);
    }

    #[test]
    fn in_flight_runs_the_work_once_and_keeps_no_failure() {
        use std::sync::Barrier;
        let f: InFlight<u32> = InFlight::default();
        let done: Mutex<Option<u32>> = Mutex::default();
        let runs = AtomicU64::new(0);
        let start = Barrier::new(8);
        let race = |fail: bool| -> Vec<Result<(u32, CacheOutcome)>> {
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..8)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            f.run("k", || *lock(&done), || {
                                runs.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(50));
                                if fail {
                                    return Err(Error::Io(std::io::Error::other("no")));
                                }
                                *lock(&done) = Some(7);
                                Ok((7, CacheOutcome::Compiled))
                            })
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        // a failure reaches every caller of its run, then is forgotten
        let r = race(true);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(r.iter().all(|x| matches!(x, Err(Error::Io(e)) if e.to_string() == "no")), "{r:?}");
        assert!(lock(&f.map).is_empty());
        let r = race(false);
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the failure was not kept");
        let mut outcomes: Vec<_> = r.into_iter().map(|x| x.unwrap()).collect();
        outcomes.sort_by_key(|&(_, o)| o != CacheOutcome::Compiled);
        assert_eq!(outcomes[0], (7, CacheOutcome::Compiled));
        assert!(outcomes[1..].iter().all(|&x| x == (7, CacheOutcome::Memory)));
        assert!(lock(&f.map).is_empty());
        // done: the work does not run
        assert_eq!(f.run("k", || Some(7), || unreachable!()).unwrap(), (7, CacheOutcome::Memory));
        // a panicking run leaves the next caller to run it
        let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.run("p", || None, || panic!("boom"))));
        assert!(p.is_err());
        assert_eq!(f.run("p", || None, || Ok((1, CacheOutcome::Compiled))).unwrap(), (1, CacheOutcome::Compiled));
        assert!(lock(&f.map).is_empty());
    }

    #[test]
    fn lock_entry_takes_the_lock_and_removes_its_file() {
        let dir = std::env::temp_dir().join(format!("kfuse-cache-lock-{}", std::process::id()));
        let path = dir.join("k.lock");
        let waits = AtomicU64::new(0);
        let Locked::Held(l) = lock_entry(&path, Duration::ZERO, &waits, || None) else { panic!("no lock") };
        assert!(path.exists());
        // held: another open of the file neither gets it nor waits past its bound
        assert!(matches!(lock_entry(&path, Duration::from_millis(20), &waits, || None), Locked::Without));
        assert_eq!(waits.load(Ordering::Relaxed), 1);
        // ... and takes the entry if it shows up meanwhile
        let m = Module { ptx: "ptx".into(), cubin: vec![1, 2], nvrtc: (13, 0) };
        assert!(matches!(lock_entry(&path, Duration::from_secs(5), &waits, || Some(m.clone())), Locked::Entry(p) if p == m));
        drop(l);
        #[cfg(unix)]
        assert!(!path.exists(), "removed on release");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn entry_format_round_trips_and_rejects_damage() {
        // a cubin is binary: newlines, NULs and bytes that are not UTF-8
        let m = Module { ptx: "//\n.version 9.0\n.target sm_80\n".into(), cubin: vec![0x7f, b'E', b'L', b'F', 0, b'\n', 0xff, 0xfe], nvrtc: (13, 2) };
        let e = format_entry(&m);
        assert_eq!(parse_entry(e.clone()).as_ref(), Some(&m));
        let ptx_only = Module { ptx: m.ptx.clone(), cubin: vec![], nvrtc: (12, 8) };
        assert_eq!(parse_entry(format_entry(&ptx_only)).as_ref(), Some(&ptx_only));
        // Truncated.
        assert_eq!(parse_entry(e[..e.len() - 3].to_vec()), None);
        // One byte of the body changed: of the PTX (last), of the cubin.
        let mut bad = e.clone();
        let n = bad.len();
        bad[n - 2] ^= 1;
        assert_eq!(parse_entry(bad), None);
        let mut bad = e.clone();
        bad[n - m.ptx.len() - 3] ^= 1;
        assert_eq!(parse_entry(bad), None);
        // Garbage, empty, wrong magic.
        assert_eq!(parse_entry(vec![]), None);
        assert_eq!(parse_entry(b"\xff\xfe".to_vec()), None);
        assert_eq!(parse_entry(b"kfuse-ptx 1\nsha256 00\nlen 0\n\n".to_vec()), None);
        // the lengths must add up to the body
        let text = String::from_utf8_lossy(&format_entry(&ptx_only)).replace(&format!("ptx {}", m.ptx.len()), &format!("ptx {}", m.ptx.len() - 1));
        assert_eq!(parse_entry(text.into_bytes()), None);
    }

    #[test]
    fn a_device_reads_the_cubin_alone() {
        let dir = std::env::temp_dir().join(format!("kfuse-cache-cubin-{}", std::process::id()));
        let p = dir.join("c.module");
        // a cubin longer than the header's chunk, and one inside it
        for cubin in [(0..2000u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>(), vec![0x7f, b'\n', b'\n', 0]] {
            let m = Module { ptx: ".version 9.0\n".repeat(50), cubin: cubin.clone(), nvrtc: (13, 1) };
            write_entry(&p, &m).unwrap();
            assert!(matches!(read_cubin(&p), CubinRead::Cubin(c, (13, 1)) if c == cubin));
            // damage to the PTX: the cubin still verifies (the PTX is not read), the whole
            // file does not, and is deleted
            let good = std::fs::read(&p).unwrap();
            let mut bad = good.clone();
            let n = bad.len();
            bad[n - 1] ^= 1;
            std::fs::write(&p, &bad).unwrap();
            assert!(matches!(read_cubin(&p), CubinRead::Cubin(..)));
            assert_eq!(read_entry(&p), None);
            assert!(!p.exists());
            // damage to the cubin, or a truncated file: a miss, and the file is deleted
            let mut bad = good.clone();
            bad[n - m.ptx.len() - 1] ^= 1;
            for damaged in [&bad[..], &good[..n - 1], &good[..n / 2]] {
                std::fs::write(&p, damaged).unwrap();
                assert!(matches!(read_cubin(&p), CubinRead::Miss));
                assert!(!p.exists(), "a corrupt entry is deleted");
            }
        }
        assert!(matches!(read_cubin(&p), CubinRead::Miss), "no file");
        // a module without a cubin: the PTX's to read
        write_entry(&p, &Module { ptx: "ptx".into(), cubin: vec![], nvrtc: (13, 0) }).unwrap();
        assert!(matches!(read_cubin(&p), CubinRead::NoCubin));
        assert!(p.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn compile_for_device_reads_only_what_the_device_loads() {
        let dir = std::env::temp_dir().join(format!("kfuse-cache-device-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let e = emitted_with("src");
        let cache = ModuleCache::new(Some(dir.clone()));
        let m = Module { ptx: "the ptx".into(), cubin: vec![1, 2, 3], nvrtc: (13, 0) };
        write_entry(&cache.entry_path(&e.source, &e.arch, &e.options).unwrap().unwrap(), &m).unwrap();
        // the cubin alone, kept nowhere
        let (c, o) = cache.compile_for_device(&e, true).unwrap();
        assert_eq!((c.cubin.as_slice(), c.ptx.as_str(), o), (&[1u8, 2, 3][..], "", CacheOutcome::Disk));
        // a device that loads the PTX gets the whole module, which memory keeps
        let (f, o) = cache.compile_for_device(&e, false).unwrap();
        assert_eq!((&*f, o), (&m, CacheOutcome::Disk));
        let (f, o) = cache.compile_for_device(&e, true).unwrap();
        assert_eq!((&*f, o), (&m, CacheOutcome::Memory));
        assert_eq!(cache.stats(), CacheStats { compiles: 0, memory_hits: 1, disk_hits: 2, lock_waits: 0 });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn key_depends_on_every_input() {
        let o = vec!["--gpu-architecture=sm_80".to_string()];
        let k = ModuleCache::key("src", "sm_80", &o);
        assert_eq!(k.len(), 64);
        assert_eq!(k, ModuleCache::key("src", "sm_80", &o));
        assert_ne!(k, ModuleCache::key("src2", "sm_80", &o));
        assert_ne!(k, ModuleCache::key("src", "sm_90a", &o));
        assert_ne!(k, ModuleCache::key("src", "sm_80", &[]));
    }

    #[test]
    fn disk_usage_counts_module_files_only() {
        let dir = std::env::temp_dir().join(format!("kfuse-cache-usage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = ModuleCache::new(Some(dir.clone()));
        // no directory yet, and no disk level: nothing
        assert_eq!(cache.disk_usage().unwrap(), DiskUsage::default());
        assert_eq!(ModuleCache::new(None).disk_usage().unwrap(), DiskUsage::default());
        let m = Module { ptx: "body".into(), cubin: vec![9; 3], nvrtc: (13, 0) };
        write_entry(&dir.join("a.module"), &m).unwrap();
        write_entry(&dir.join("b.module"), &Module { ptx: "longer body".into(), ..m.clone() }).unwrap();
        // lock files and the autotuning store are not entries
        std::fs::write(dir.join("a.lock"), b"").unwrap();
        std::fs::write(dir.join("autotune.json"), b"{}").unwrap();
        let bytes = (format_entry(&m).len() + format_entry(&Module { ptx: "longer body".into(), ..m.clone() }).len()) as u64;
        assert_eq!(cache.disk_usage().unwrap(), DiskUsage { entries: 2, bytes });
        assert_eq!(cache.clear().unwrap(), 2);
        assert_eq!(cache.disk_usage().unwrap(), DiskUsage::default());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn write_is_atomic_and_leaves_no_temp_files() {
        let dir = std::env::temp_dir().join(format!("kfuse-cache-unit-{}", std::process::id()));
        let p = dir.join("x.module");
        let m = Module { ptx: "body".into(), cubin: vec![9; 3], nvrtc: (13, 0) };
        write_entry(&p, &m).unwrap();
        assert_eq!(read_entry(&p), Some(m));
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        std::fs::write(&p, b"kfuse-module 3\nnvrtc 13.0\ncubin 0 0\nptx 4 0\n\nbody").unwrap();
        assert_eq!(read_entry(&p), None);
        assert!(!p.exists(), "a corrupt entry is deleted");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
