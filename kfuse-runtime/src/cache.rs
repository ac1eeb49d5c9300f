//! The module cache: compiled PTX in memory and on disk, loaded kernels per device.
//!
//! Owns: [`PtxCache`] (source → PTX, memory + disk), [`compile_cached`], and the
//! per-device `FunctionCache` of loaded kernels.
//!
//! Levels, fastest first:
//! 1. per device, loaded functions keyed by `ModuleKey` — (kernel, dtypes, [`Spec`],
//!    [`Target`]; the emitted kernel, with its tensor-map boxes, swizzles and persistent
//!    grid, is a function of these) — so that a repeated launch skips IR building,
//!    codegen and NVRTC, and by a hash of source *and* launch rule for pre-emitted
//!    kernels (`source_key`);
//! 2. per process, PTX keyed by the disk key below ([`CacheOutcome::Memory`]);
//! 3. on disk, PTX files in `$KFUSE_CACHE_DIR` (default `<user cache dir>/kfuse`; an
//!    empty `KFUSE_CACHE_DIR` turns the disk level off) ([`CacheOutcome::Disk`]);
//! 4. NVRTC ([`CacheOutcome::Compiled`]).
//!
//! Invariants:
//! - The disk key is the hex SHA-256 of the source, the architecture, the complete NVRTC
//!   option list ([`crate::nvrtc::full_options`]) and the NVRTC version, each
//!   length-prefixed; the file is `<key>.ptx`.
//! - A file is a header — `kfuse-ptx 1`, `sha256 <hex of body>`, `len <bytes>`, an
//!   empty line — and the PTX body. A file whose header, length or hash does not check
//!   out is deleted and recompiled, never loaded.
//! - Files are written to a temporary name in the same directory and renamed into place,
//!   so readers see a whole file or none. The disk level is best effort: a directory
//!   that cannot be created or written costs a recompile, not an error.
//! - Everything here but `FunctionCache` works without a GPU (only NVRTC), so CI tests
//!   the disk cache and its corruption recovery.
//!
//! A development aid, off unless asked for: `KFUSE_SOURCE_HOOK=CMD` runs `CMD FILE ENTRY`
//! (through `sh -c`) on every generated source before it is compiled, `FILE` holding the
//! source; what `FILE` holds afterwards is compiled and loaded instead (`hooked`). It
//! lets a change to the generated code be timed on a GPU before the compiler learns to
//! make it. The hook runs once per generated kernel and process: the loaded function is
//! kept under the generated source's key, the PTX on disk under the new source's.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaFunction;
use kfuse_codegen::{EmittedKernel, Spec, Target};
use kfuse_ir::DType;
use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::nvrtc;

/// Where a compile was answered from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheOutcome {
    /// This process had it already (PTX or a loaded function).
    Memory,
    /// Read from a verified file of the disk cache.
    Disk,
    /// Compiled by NVRTC (and written to the disk cache).
    Compiled,
}

const MAGIC: &str = "kfuse-ptx 1";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// PTX compiled from CUDA source, cached in memory and on disk (see the module docs).
pub struct PtxCache {
    dir: Option<PathBuf>,
    mem: Mutex<HashMap<String, Arc<String>>>,
}

impl PtxCache {
    /// A cache with its own memory level and disk files in `dir` (`None`: no disk level).
    pub fn new(dir: Option<PathBuf>) -> PtxCache {
        PtxCache { dir, mem: Mutex::new(HashMap::new()) }
    }

    /// The directory `KFUSE_CACHE_DIR` names (none if it is set but empty), else
    /// `<user cache dir>/kfuse`.
    pub fn default_dir() -> Option<PathBuf> {
        match std::env::var_os("KFUSE_CACHE_DIR") {
            Some(d) if d.is_empty() => None,
            Some(d) => Some(PathBuf::from(d)),
            None => dirs::cache_dir().map(|d| d.join("kfuse")),
        }
    }

    /// The process-wide cache, on [`PtxCache::default_dir`] as it was at first use.
    pub fn global() -> &'static PtxCache {
        static G: OnceLock<PtxCache> = OnceLock::new();
        G.get_or_init(|| PtxCache::new(PtxCache::default_dir()))
    }

    /// The disk directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The cache key of a compile: hex SHA-256 of source, arch, complete options and
    /// NVRTC version.
    pub fn key(source: &str, arch: &str, full_options: &[String], nvrtc_version: (i32, i32)) -> String {
        let mut h = Sha256::new();
        let mut part = |b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        part(MAGIC.as_bytes());
        part(source.as_bytes());
        part(arch.as_bytes());
        part(&(full_options.len() as u64).to_le_bytes());
        for o in full_options {
            part(o.as_bytes());
        }
        part(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
        hex(&h.finalize())
    }

    /// The file a compile is cached in (needs NVRTC for its version); `None` without a
    /// disk level.
    pub fn entry_path(&self, source: &str, arch: &str, options: &[String]) -> Result<Option<PathBuf>> {
        let full = nvrtc::full_options(arch, options);
        let key = PtxCache::key(source, arch, &full, nvrtc::nvrtc_version()?);
        Ok(self.dir.as_ref().map(|d| d.join(format!("{key}.ptx"))))
    }

    /// PTX for `source` compiled for `arch` with extra NVRTC `options`, and where it came
    /// from.
    pub fn compile(&self, source: &str, arch: &str, options: &[String]) -> Result<(String, CacheOutcome)> {
        let full = nvrtc::full_options(arch, options);
        let key = PtxCache::key(source, arch, &full, nvrtc::nvrtc_version()?);
        if let Some(p) = self.mem.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok((p.to_string(), CacheOutcome::Memory));
        }
        let path = self.dir.as_ref().map(|d| d.join(format!("{key}.ptx")));
        if let Some(path) = &path {
            if let Some(ptx) = read_entry(path) {
                self.remember(key, &ptx);
                return Ok((ptx, CacheOutcome::Disk));
            }
        }
        let ptx = nvrtc::compile_ptx_exact(source, &full)?;
        if let Some(path) = &path {
            let _ = write_entry(path, &ptx);
        }
        self.remember(key, &ptx);
        Ok((ptx, CacheOutcome::Compiled))
    }

    /// [`PtxCache::compile`] for an emitted kernel (its source, arch and options).
    pub fn compile_emitted(&self, emitted: &EmittedKernel) -> Result<(String, CacheOutcome)> {
        self.compile(&emitted.source, &emitted.arch, &emitted.options)
    }

    fn remember(&self, key: String, ptx: &str) {
        self.mem.lock().unwrap_or_else(|e| e.into_inner()).insert(key, Arc::new(ptx.to_string()));
    }
}

/// PTX for an emitted kernel through the process-wide [`PtxCache::global`]. Needs NVRTC,
/// not a GPU.
pub fn compile_cached(emitted: &EmittedKernel) -> Result<(String, CacheOutcome)> {
    PtxCache::global().compile_emitted(emitted)
}

/// Reads and verifies a cache file; a file that exists but does not verify is deleted.
fn read_entry(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    match parse_entry(&bytes) {
        Some(ptx) => Some(ptx),
        None => {
            let _ = std::fs::remove_file(path);
            None
        }
    }
}

/// The verified body of a cache file, or `None`.
fn parse_entry(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut rest = text;
    let mut line = || -> Option<&str> {
        let (l, r) = rest.split_once('\n')?;
        rest = r;
        Some(l)
    };
    if line()? != MAGIC {
        return None;
    }
    let sha = line()?.strip_prefix("sha256 ")?.to_string();
    let len: usize = line()?.strip_prefix("len ")?.parse().ok()?;
    if !line()?.is_empty() {
        return None;
    }
    (rest.len() == len && sha256_hex(rest.as_bytes()) == sha).then(|| rest.to_string())
}

/// The bytes of a cache file for `ptx`.
fn format_entry(ptx: &str) -> Vec<u8> {
    format!("{MAGIC}\nsha256 {}\nlen {}\n\n{ptx}", sha256_hex(ptx.as_bytes()), ptx.len()).into_bytes()
}

/// Writes a cache file atomically (temporary file in the same directory, then rename).
fn write_entry(path: &Path, ptx: &str) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&format_entry(ptx))?;
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
    /// What of this kernel the device holds at once, from the driver's occupancy
    /// calculator on the first launch (`launch::resident`): blocks per multiprocessor
    /// without clusters, clusters per device with them; 0 when it cannot say. Sizes a
    /// persistent grid.
    pub resident: std::sync::OnceLock<u32>,
    /// The tensor maps its launches encoded last (`launch::issue`).
    pub maps: crate::tma::MapCache,
}

/// Per-device loaded kernels, by `ModuleKey` and by source hash (see module docs).
#[derive(Default)]
pub(crate) struct FunctionCache {
    by_key: Mutex<HashMap<ModuleKey, Arc<LoadedKernel>>>,
    by_source: Mutex<HashMap<String, Arc<LoadedKernel>>>,
}

impl FunctionCache {
    pub(crate) fn get(&self, key: &ModuleKey) -> Option<Arc<LoadedKernel>> {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
    }

    pub(crate) fn insert(&self, key: ModuleKey, k: Arc<LoadedKernel>) {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner()).insert(key, k);
    }

    /// The loaded kernel for an emitted kernel, loading it (through [`compile_cached`]
    /// and `load`) on a miss.
    pub(crate) fn get_or_load(
        &self,
        emitted: &EmittedKernel,
        load: impl FnOnce(&str, &EmittedKernel) -> Result<CudaFunction>,
    ) -> Result<(Arc<LoadedKernel>, CacheOutcome)> {
        // keyed by what the compiler generated (a hook, if set, is the same all process
        // long, so it runs once per kernel, not once per launch)
        let skey = source_key(emitted);
        if let Some(k) = self.by_source.lock().unwrap_or_else(|e| e.into_inner()).get(&skey) {
            return Ok((k.clone(), CacheOutcome::Memory));
        }
        let hooked = match std::env::var("KFUSE_SOURCE_HOOK") {
            Ok(cmd) => hooked(&cmd, emitted)?,
            Err(_) => None,
        };
        let emitted = hooked.as_ref().unwrap_or(emitted);
        let (ptx, outcome) = compile_cached(emitted)?;
        let func = load(&ptx, emitted)?;
        let what = |a: &str| crate::error::driver(format!("reading the {a} of `{}`", emitted.entry));
        let registers = func.num_regs().map_err(what("registers"))? as u32;
        let local_bytes = func.local_size_bytes().map_err(what("local memory"))? as u32;
        let k = Arc::new(LoadedKernel { func, emitted: emitted.clone(), registers, local_bytes, resident: Default::default(), maps: Default::default() });
        self.by_source.lock().unwrap_or_else(|e| e.into_inner()).insert(skey, k.clone());
        Ok((k, outcome))
    }
}

/// The emitted kernel with its source as the `KFUSE_SOURCE_HOOK` command `cmd` left it
/// (module doc), or `None` when the command left the source as it was. A line `//
/// kfuse-hook: smem_bytes=N` in the new source sets the dynamic shared memory the kernel
/// is launched with (for a change that adds pipeline stages, say). A command that fails
/// is an error, not a silent fallback to the unchanged source.
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
    let mut h = Sha256::new();
    for part in [emitted.source.as_str(), &emitted.arch, &emitted.entry, &emitted.options.join("\u{1}"), &launch] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

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
            entry: "k".into(),
            source: "src".into(),
            arch: "sm_90a".into(),
            options: vec![],
            block_threads: 128,
            grouped: false,
            smem_bytes: 0,
            params: vec![KernelParam::TensorMap { tensor: ParamId(0), box_dims: vec![64, 64], swizzle: 128, order: vec![1, 0] }],
            grid: vec![GridAxisEval { dim: ShapeSym(0), step: 64 }],
            cluster_x: 1,
            persistent: None,
            ir: String::new(),
            tiles: Default::default(),
            register_attempt: (0, 1),
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
    fn entry_format_round_trips_and_rejects_damage() {
        let ptx = "//\n.version 9.0\n.target sm_80\n";
        let e = format_entry(ptx);
        assert_eq!(parse_entry(&e).as_deref(), Some(ptx));
        // Truncated.
        assert_eq!(parse_entry(&e[..e.len() - 3]), None);
        // One byte of the body changed.
        let mut bad = e.clone();
        let n = bad.len();
        bad[n - 2] ^= 1;
        assert_eq!(parse_entry(&bad), None);
        // Garbage, empty, wrong magic.
        assert_eq!(parse_entry(b""), None);
        assert_eq!(parse_entry(b"\xff\xfe"), None);
        assert_eq!(parse_entry(b"kfuse-ptx 2\nsha256 00\nlen 0\n\n"), None);
    }

    #[test]
    fn key_depends_on_every_input() {
        let o = vec!["--gpu-architecture=sm_80".to_string()];
        let k = PtxCache::key("src", "sm_80", &o, (13, 0));
        assert_eq!(k.len(), 64);
        assert_eq!(k, PtxCache::key("src", "sm_80", &o, (13, 0)));
        assert_ne!(k, PtxCache::key("src2", "sm_80", &o, (13, 0)));
        assert_ne!(k, PtxCache::key("src", "sm_90a", &o, (13, 0)));
        assert_ne!(k, PtxCache::key("src", "sm_80", &[], (13, 0)));
        assert_ne!(k, PtxCache::key("src", "sm_80", &o, (13, 1)));
    }

    #[test]
    fn write_is_atomic_and_leaves_no_temp_files() {
        let dir = std::env::temp_dir().join(format!("kfuse-cache-unit-{}", std::process::id()));
        let p = dir.join("x.ptx");
        write_entry(&p, "body").unwrap();
        assert_eq!(read_entry(&p).as_deref(), Some("body"));
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        std::fs::write(&p, b"kfuse-ptx 1\nsha256 0\nlen 4\n\nbody").unwrap();
        assert_eq!(read_entry(&p), None);
        assert!(!p.exists(), "a corrupt entry is deleted");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
