//! NVRTC: finding libnvrtc and the CUDA headers, compiling CUDA C++ to PTX and cubins.
//!
//! Owns: the search for libnvrtc, [`compile_ptx`] and [`compile_module`] (PTX and, for a
//! real architecture, the cubin of one compile: [`Module`]), [`nvrtc_version`],
//! [`cuda_include_dirs`] and the count of NVRTC compiles, [`compiles`]. Needs no GPU and
//! no driver.
//!
//! Finding libnvrtc. cudarc loads it by name (`libnvrtc.so`, `libnvrtc.so.13`, …), which
//! the dynamic loader resolves through `LD_LIBRARY_PATH` and the system paths. When that
//! fails, this module looks in the usual places itself — `$CUDA_HOME/lib64`,
//! `$CUDA_PATH/lib64`, `/usr/local/cuda/lib64`, and the pip package `nvidia-cuda-nvrtc`
//! installed with `--target` into `$KFUSE_CUDA_PIP` or into a `.cuda` folder of the
//! current directory or one of its parents (`.cuda/nvidia/cu13/lib`) — and loads the
//! library found there by its full path (NVRTC's builtins library first). Once loaded,
//! the loader matches cudarc's by-name request against the library's soname, so cudarc
//! uses that copy. The libraries stay loaded for the life of the process.
//!
//! Invariants:
//! - A missing libnvrtc is [`Error::NvrtcMissing`] listing every place and name tried,
//!   never a panic; the probe runs once per process.
//! - A compile failure is [`Error::Nvrtc`] with NVRTC's log and the source.
//! - The options passed to NVRTC are exactly [`full_options`]`(arch, options)`; the disk
//!   cache keys on the same list.
//! - [`compiles`] counts every NVRTC compile of the process, failed ones included: the
//!   cache's "compile once" guarantees are checked against it.
//! - Generated sources are self-contained: the include directories found are passed
//!   with `--include-path` when they exist, but none is required.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;


use crate::error::{Error, Result};

/// The file names of libnvrtc looked for in each directory, preferred first.
const NVRTC_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so"];

/// pip `--target` roots that may hold `nvidia/cu13/{lib,include}`: `$KFUSE_CUDA_PIP`,
/// then `.cuda` in the current directory and each of its parents.
pub(crate) fn pip_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Some(p) = std::env::var_os("KFUSE_CUDA_PIP").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        roots.push(p.join("nvidia").join("cu13"));
        roots.push(p);
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            roots.push(dir.join(".cuda").join("nvidia").join("cu13"));
        }
    }
    roots
}

/// CUDA toolkit roots from the environment and the default install location.
pub(crate) fn toolkit_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            roots.push(PathBuf::from(p));
        }
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots
}

/// The directories searched for libnvrtc, in order: `LD_LIBRARY_PATH` entries, the
/// toolkit roots' `lib64` (and `lib`), the pip roots' `lib`.
pub fn nvrtc_search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(p) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&p).filter(|d| !d.as_os_str().is_empty()));
    }
    for r in toolkit_roots() {
        dirs.push(r.join("lib64"));
        dirs.push(r.join("lib"));
    }
    for r in pip_roots() {
        dirs.push(r.join("lib"));
    }
    dedup(dirs)
}

pub(crate) fn dedup(v: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in v {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// CUDA include directories that exist: `$CUDA_HOME/include`, `$CUDA_PATH/include`,
/// `/usr/local/cuda/include`, and the pip roots' `include` (`$KFUSE_CUDA_PIP`, `.cuda`
/// in the current directory or a parent). Each becomes an `--include-path`.
/// Looked for once a process (every compile's options, and so its cache key, name them).
pub fn cuda_include_dirs() -> Vec<PathBuf> {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let cands = toolkit_roots().into_iter().chain(pip_roots()).map(|r| r.join("include"));
        dedup(cands.filter(|d| d.join("cuda_fp16.h").is_file() || d.join("cuda.h").is_file()).collect())
    })
    .clone()
}

/// Looks for libnvrtc in `dirs`: the first existing file named `libnvrtc.so.13` or `libnvrtc.so`.
/// On failure returns the list of what was tried, for [`Error::NvrtcMissing`].
pub fn find_nvrtc_in(dirs: &[PathBuf]) -> std::result::Result<PathBuf, Vec<String>> {
    let mut tried = Vec::new();
    for d in dirs {
        for n in NVRTC_NAMES {
            let p = d.join(n);
            if p.is_file() {
                return Ok(p);
            }
            tried.push(p.display().to_string());
        }
    }
    Err(tried)
}

/// What the by-name load tries, for the error message.
fn by_name_note() -> String {
    let names = crate::device::library_names("nvrtc");
    let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    format!(
        "by name through the dynamic loader ({}), with LD_LIBRARY_PATH={}",
        names.join(", "),
        if ld.is_empty() { "(unset)".to_string() } else { ld }
    )
}

/// Loads a library by full path and keeps it loaded for the life of the process.
fn preload(path: &Path) -> std::result::Result<(), String> {
    // SAFETY: loading libnvrtc runs its initializers, which is what cudarc would do.
    match unsafe { libloading::Library::new(path) } {
        Ok(lib) => {
            std::mem::forget(lib);
            Ok(())
        }
        Err(e) => Err(format!("{} (found but failed to load: {e})", path.display())),
    }
}

/// Makes libnvrtc loadable for cudarc (see the module docs); the probe runs once.
pub fn ensure_nvrtc() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), Vec<String>>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let (r, d) = crate::build_times::measured(crate::build_times::Step::NvrtcLoad, probe);
            tracing::debug!(target: "kfuse::nvrtc", found = r.is_ok(), elapsed_ms = crate::build_times::ms(d), "NVRTC library load");
            r
        })
        .clone()
        .map_err(|searched| Error::NvrtcMissing { searched })
}

/// Finds and loads libnvrtc (see [`ensure_nvrtc`]); the places tried on failure.
fn probe() -> std::result::Result<(), Vec<String>> {
    if crate::device::library_loadable("nvrtc") {
        return Ok(());
    }
    let mut searched = vec![by_name_note()];
    match find_nvrtc_in(&nvrtc_search_dirs()) {
        Err(tried) => {
            searched.extend(tried);
            Err(searched)
        }
        Ok(path) => {
            // NVRTC opens its builtins library by name at compile time; load the
            // copy beside it first so that the name resolves to it.
            for b in builtins_beside(&path) {
                let _ = preload(&b);
            }
            if let Err(e) = preload(&path) {
                searched.push(e);
                return Err(searched);
            }
            if crate::device::library_loadable("nvrtc") {
                Ok(())
            } else {
                searched.push(format!("{} (loaded, but not under a name cudarc asks for)", path.display()));
                Err(searched)
            }
        }
    }
}

/// The files of the libnvrtc [`ensure_nvrtc`] would load when it searches itself (the
/// first of [`nvrtc_search_dirs`] that holds one) and the NVRTC builtins libraries beside
/// it; empty when none is found. (cudarc's by-name load tries the dynamic loader first,
/// which resolves through the same `LD_LIBRARY_PATH` entries first.)
pub fn library_files() -> Vec<PathBuf> {
    let Ok(lib) = find_nvrtc_in(&nvrtc_search_dirs()) else { return vec![] };
    let mut files = vec![lib.clone()];
    files.extend(builtins_beside(&lib));
    files
}

/// The NVRTC builtins libraries (`libnvrtc-builtins.so*`) in the folder of `lib`, sorted.
fn builtins_beside(lib: &Path) -> Vec<PathBuf> {
    let Some(Ok(rd)) = lib.parent().map(std::fs::read_dir) else { return vec![] };
    let mut builtins: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so")))
        .collect();
    builtins.sort();
    builtins
}

/// Reads [`library_files`] once a process, from a background thread, so that the
/// operating system holds them in its page cache (the bytes read are dropped). In a
/// process whose libraries are not cached yet (the first after a machine starts), a
/// compile pages NVRTC's code in from disk piece by piece as it runs it: NVRTC took
/// 683 ms of an 827 ms first GEMM call on the H100 host without this, 629 of 658 with
/// it, and 26-33 ms with the libraries cached. [`crate::Device::gpu`] calls it before it starts the driver, so that the
/// reading overlaps the context's creation. With the libraries cached it costs a
/// background copy of ~115 MB; a process that finds every kernel in the module cache
/// never needs them.
pub fn prefetch_libraries() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new().name("kfuse-nvrtc-prefetch".into()).spawn(|| {
            use std::io::Read;
            let mut buf = vec![0u8; 4 << 20];
            for f in library_files() {
                if let Ok(mut file) = std::fs::File::open(&f) {
                    while matches!(file.read(&mut buf), Ok(n) if n > 0) {}
                }
            }
        });
    });
}

/// True when libnvrtc can be loaded (see [`ensure_nvrtc`]).
///
/// # Examples
///
/// ```
/// use kfuse_runtime::nvrtc;
///
/// if nvrtc::nvrtc_available() {
///     println!("NVRTC {:?}", nvrtc::nvrtc_version()?);
/// } else {
///     println!("no NVRTC: GPU launches cannot compile; emit() and the interpreter still work");
/// }
/// # Ok::<(), kfuse_runtime::Error>(())
/// ```
pub fn nvrtc_available() -> bool {
    ensure_nvrtc().is_ok()
}

/// NVRTC's version `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers; the library is loaded.
    let r = std::panic::catch_unwind(move || unsafe {
        let r = cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor);
        (r, major, minor)
    });
    match r {
        Ok((cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS, a, b)) => Ok((a, b)),
        Ok((r, _, _)) => Err(Error::Nvrtc { log: format!("nvrtcVersion failed: {r:?}"), source: String::new() }),
        Err(p) => Err(Error::Nvrtc { log: format!("nvrtcVersion: {}", crate::device::panic_text(&p)), source: String::new() }),
    }
}

/// The complete NVRTC option list for a compile: `--gpu-architecture=<arch>`, then
/// `options`, then `--include-path=` for each of [`cuda_include_dirs`].
pub fn full_options(arch: &str, options: &[String]) -> Vec<String> {
    let mut o = vec![format!("--gpu-architecture={arch}")];
    o.extend(options.iter().cloned());
    o.extend(cuda_include_dirs().iter().map(|d| format!("--include-path={}", d.display())));
    o
}

/// Compiles CUDA C++ `source` for `arch` (`sm_90a`, `sm_80`, …) with extra `options`
/// and returns the PTX text.
///
/// # Examples
///
/// ```
/// let src = r#"extern "C" __global__ void zero(float* p) { p[threadIdx.x] = 0.0f; }"#;
/// let ptx = kfuse_runtime::nvrtc::compile_ptx(src, "sm_80", &[])?;
/// assert!(ptx.contains(".entry zero"));
/// # Ok::<(), kfuse_runtime::Error>(())
/// ```
pub fn compile_ptx(source: &str, arch: &str, options: &[String]) -> Result<String> {
    compile_ptx_exact(source, &full_options(arch, options))
}

static COMPILES: AtomicU64 = AtomicU64::new(0);

/// How many times this process has run NVRTC (successful compiles and failed ones).
pub fn compiles() -> u64 {
    COMPILES.load(Ordering::Relaxed)
}

/// What one NVRTC compile gives: the PTX, and for a real architecture (`sm_90a`,
/// `sm_80`, …) the cubin NVRTC's own assembler built from it. A GPU loads the cubin as
/// it is, with no PTX → SASS step in the driver; a virtual architecture (`compute_90a`)
/// gives PTX only, which the driver assembles when it loads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// The PTX text.
    pub ptx: String,
    /// The cubin (ELF) for a real architecture; empty for a virtual one.
    pub cubin: Vec<u8>,
    /// The version `(major, minor)` of the NVRTC that built it.
    pub nvrtc: (i32, i32),
}

impl Module {
    /// What the driver's `cuModuleLoadData` takes: the cubin when there is one, else
    /// the PTX with its terminating NUL.
    pub fn image(&self) -> Vec<u8> {
        if self.cubin.is_empty() {
            self.ptx_image()
        } else {
            self.cubin.clone()
        }
    }

    /// The PTX with its terminating NUL, as `cuModuleLoadData` takes it (the driver
    /// assembles it for the GPU at hand).
    pub fn ptx_image(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.ptx.len() + 1);
        v.extend_from_slice(self.ptx.as_bytes());
        v.push(0);
        v
    }
}

/// Compiles with exactly these NVRTC options (see [`full_options`]) and returns the PTX.
pub(crate) fn compile_ptx_exact(source: &str, options: &[String]) -> Result<String> {
    compile_module_exact(source, options).map(|m| m.ptx)
}

/// Compiles CUDA C++ `source` for `arch` with extra `options` into PTX and, for a real
/// architecture, a cubin ([`Module`]).
pub fn compile_module(source: &str, arch: &str, options: &[String]) -> Result<Module> {
    compile_module_exact(source, &full_options(arch, options))
}

/// [`compile_module`] with exactly these NVRTC options (see [`full_options`]).
pub(crate) fn compile_module_exact(source: &str, options: &[String]) -> Result<Module> {
    ensure_nvrtc()?;
    if source.contains('\0') {
        return Err(Error::InvalidArgument("the CUDA source contains a NUL byte".into()));
    }
    if let Some(o) = options.iter().find(|o| o.contains('\0')) {
        return Err(Error::InvalidArgument(format!("the NVRTC option {o:?} contains a NUL byte")));
    }
    COMPILES.fetch_add(1, Ordering::Relaxed);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_nvrtc(source, options)));
    let log = match r {
        Ok(Ok(m)) => return Ok(m),
        Ok(Err(log)) => log,
        Err(p) => format!("NVRTC panicked: {}", crate::device::panic_text(&p)),
    };
    Err(Error::Nvrtc { log, source: source.to_string() })
}

/// One NVRTC program: created, compiled, its PTX and cubin read, destroyed. The error is
/// NVRTC's log (or the failing call) with the options.
fn run_nvrtc(source: &str, options: &[String]) -> std::result::Result<Module, String> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::CString;
    let src = CString::new(source).map_err(|e| e.to_string())?;
    let name = c"kfuse_kernel.cu";
    let prog = result::create_program(&src, Some(name)).map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    struct Destroy(sys::nvrtcProgram);
    impl Drop for Destroy {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once here.
            let _ = unsafe { result::destroy_program(self.0) };
        }
    }
    let prog = Destroy(prog);
    let text = |v: Vec<std::ffi::c_char>| -> String {
        let bytes: Vec<u8> = v.into_iter().map(|c| c as u8).take_while(|&b| b != 0).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    // SAFETY: `prog` is a live program for every call below; `src` and `name` outlive it.
    unsafe {
        if let Err(e) = result::compile_program(prog.0, options) {
            let log = result::get_program_log(prog.0).map(text).unwrap_or_default();
            return Err(format!("{}\n({e:?}; options: {})", log.trim_end(), options.join(" ")));
        }
        let (mut major, mut minor) = (0, 0);
        sys::nvrtcVersion(&mut major, &mut minor).result().map_err(|e| format!("nvrtcVersion: {e:?}"))?;
        let ptx = text(result::get_ptx(prog.0).map_err(|e| format!("nvrtcGetPTX: {e:?}"))?);
        let mut size = 0usize;
        let mut cubin = Vec::new();
        // a virtual architecture has no cubin: the size call fails or says 0
        if sys::nvrtcGetCUBINSize(prog.0, &mut size) == sys::nvrtcResult::NVRTC_SUCCESS && size > 0 {
            cubin = vec![0u8; size];
            sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()).result().map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))?;
        }
        Ok(Module { ptx, cubin, nvrtc: (major, minor) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_lists_what_was_tried() {
        let dirs = vec![PathBuf::from("/definitely/not/here"), PathBuf::from("/nor/here")];
        let tried = find_nvrtc_in(&dirs).unwrap_err();
        assert_eq!(tried.len(), 2 * NVRTC_NAMES.len());
        assert!(tried.contains(&"/definitely/not/here/libnvrtc.so.13".to_string()));
        let msg = Error::NvrtcMissing { searched: tried }.to_string();
        assert!(msg.contains("/nor/here/libnvrtc.so"));
        assert!(msg.contains("nvidia-cuda-nvrtc==13.0.*"));
    }

    #[test]
    fn search_dirs_cover_the_documented_places() {
        let dirs = nvrtc_search_dirs();
        assert!(dirs.contains(&PathBuf::from("/usr/local/cuda/lib64")));
        let cwd = std::env::current_dir().unwrap();
        assert!(dirs.contains(&cwd.join(".cuda/nvidia/cu13/lib")));
        assert!(by_name_note().contains("libnvrtc.so"));
    }

    #[test]
    fn full_options_start_with_the_arch() {
        let o = full_options("sm_80", &["--std=c++17".into()]);
        assert_eq!(o[0], "--gpu-architecture=sm_80");
        assert_eq!(o[1], "--std=c++17");
        assert!(o[2..].iter().all(|x| x.starts_with("--include-path=")));
    }
}
