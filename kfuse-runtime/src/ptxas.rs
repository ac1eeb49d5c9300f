//! `ptxas`, the CUDA assembler: finding it, running `ptxas -v` on PTX, and reading what
//! it reports of a kernel (registers, shared memory, stack frame, spills).
//!
//! Owns: [`find_ptxas`] and the places it looks ([`ptxas_candidates`]), [`assemble`] and
//! its result [`Assembly`], and the parser of the `-v` report, [`PtxasInfo::parse`].
//! Needs no GPU and no driver. A GPU launch does not use it (the driver assembles, and
//! the runtime reads the result from the loaded function); [`crate::explain()`] and the
//! compile checks of the tests do.
//!
//! Finding ptxas, first found wins: `$KFUSE_PTXAS` when it names a file; the pip package
//! `nvidia-cuda-nvcc` installed with `--target` into `$KFUSE_CUDA_PIP` or into a `.cuda`
//! folder of the current directory or one of its parents (`.cuda/nvidia/cu13/bin/ptxas`,
//! the places [`crate::nvrtc`] looks for libnvrtc); `$CUDA_HOME/bin`, `$CUDA_PATH/bin`,
//! `/usr/local/cuda/bin`; then each directory of `PATH`.
//!
//! Invariants: a missing ptxas is [`Error::Ptxas`] naming every place tried and how to
//! get one, never a panic; [`assemble`] leaves no file behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The places [`find_ptxas`] looks, in order (see the module docs); not all exist.
pub fn ptxas_candidates() -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Some(p) = std::env::var_os("KFUSE_PTXAS").filter(|p| !p.is_empty()) {
        c.push(PathBuf::from(p));
    }
    c.extend(crate::nvrtc::pip_roots().into_iter().map(|r| r.join("bin").join("ptxas")));
    c.extend(crate::nvrtc::toolkit_roots().into_iter().map(|r| r.join("bin").join("ptxas")));
    if let Some(path) = std::env::var_os("PATH") {
        c.extend(std::env::split_paths(&path).filter(|d| !d.as_os_str().is_empty()).map(|d| d.join("ptxas")));
    }
    crate::nvrtc::dedup(c)
}

/// The first of [`ptxas_candidates`] that is a file.
pub fn find_ptxas() -> Option<PathBuf> {
    ptxas_candidates().into_iter().find(|p| p.is_file())
}

/// How to get ptxas, for [`Error::Ptxas`] when none is found.
pub const PTXAS_INSTALL_HINT: &str = "install it with\n    \
     python3 -m pip install --target .cuda \"nvidia-cuda-nvcc==13.0.*\"\n\
     (kfuse looks in ./.cuda and its parent directories), or set KFUSE_PTXAS to its path";

/// What `ptxas -v` reports of one kernel (an entry function).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxasInfo {
    /// The entry function the facts are of (empty when the report names none).
    pub function: String,
    /// Registers a thread.
    pub registers: u32,
    /// Shared memory the kernel declares statically, in bytes (dynamic shared memory is
    /// sized at launch: the kernel's `EmittedKernel::smem_bytes`).
    pub static_smem_bytes: u32,
    /// The stack frame a thread, in bytes: its local memory (spill slots included).
    pub stack_frame_bytes: u32,
    /// Bytes a thread stores to local memory because registers ran out.
    pub spill_store_bytes: u32,
    /// Bytes a thread loads back from those spill slots.
    pub spill_load_bytes: u32,
    /// The `ptxas warning` lines of the report, as printed.
    pub warnings: Vec<String>,
}

impl PtxasInfo {
    /// Bytes of spill stores and spill loads together (0: no spills).
    pub fn spill_bytes(&self) -> u32 {
        self.spill_store_bytes + self.spill_load_bytes
    }

    /// Reads the facts of the `-v` report `log` of one assembly: those of the last entry
    /// function it compiled (kfuse's modules hold one), `None` when it names no
    /// registers. Lines it does not know are skipped.
    ///
    /// ```
    /// use kfuse_runtime::ptxas::PtxasInfo;
    ///
    /// let log = "ptxas info    : Compiling entry function 'kf_add' for 'sm_90a'\n\
    ///            ptxas info    : Function properties for kf_add\n    \
    ///            8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads\n\
    ///            ptxas info    : Used 98 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]\n";
    /// let info = PtxasInfo::parse(log).unwrap();
    /// assert_eq!((info.function.as_str(), info.registers, info.static_smem_bytes), ("kf_add", 98, 1024));
    /// assert_eq!((info.stack_frame_bytes, info.spill_bytes()), (8, 16));
    /// ```
    pub fn parse(log: &str) -> Option<PtxasInfo> {
        let mut done: Vec<PtxasInfo> = Vec::new();
        let mut cur = PtxasInfo::default();
        let mut seen_regs = false;
        // whether the `Function properties` lines at hand are the entry's (not a callee's)
        let mut own_properties = true;
        let mut warnings = Vec::new();
        for line in log.lines() {
            let l = line.trim();
            if l.starts_with("ptxas warning") {
                warnings.push(l.to_string());
            }
            if let Some(name) = quoted_after(l, "Compiling entry function '") {
                if seen_regs {
                    done.push(std::mem::take(&mut cur));
                    seen_regs = false;
                }
                cur.function = name.to_string();
            }
            if let Some(at) = l.find("Function properties for ") {
                let name = l[at + "Function properties for ".len()..].trim();
                own_properties = cur.function.is_empty() || name == cur.function;
            }
            if own_properties && (l.contains("stack frame") || l.contains("spill stores")) {
                for part in l.split(',') {
                    let (n, what) = bytes_of(part);
                    match what {
                        "stack frame" => cur.stack_frame_bytes = n,
                        "spill stores" => cur.spill_store_bytes = n,
                        "spill loads" => cur.spill_load_bytes = n,
                        _ => {}
                    }
                }
            }
            if let Some(at) = l.find("Used ") {
                for part in l[at..].split(',') {
                    let part = part.trim();
                    if let Some(r) = part.strip_prefix("Used ").and_then(|p| p.strip_suffix(" registers")) {
                        cur.registers = r.trim().parse().unwrap_or(0);
                        seen_regs = true;
                    }
                    if let (n, "smem") = bytes_of(part) {
                        cur.static_smem_bytes = n;
                    }
                }
            }
        }
        if seen_regs {
            done.push(cur);
        }
        let mut info = done.pop()?;
        info.warnings = warnings;
        Some(info)
    }
}

/// The text between `prefix` and the next `'` in `l`.
fn quoted_after<'a>(l: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = &l[l.find(prefix)? + prefix.len()..];
    rest.split('\'').next()
}

/// `12 bytes spill stores` → (12, "spill stores"); (0, "") for anything else.
fn bytes_of(part: &str) -> (u32, &str) {
    let mut w = part.trim().splitn(3, ' ');
    match (w.next().and_then(|n| n.parse().ok()), w.next(), w.next()) {
        (Some(n), Some("bytes"), Some(what)) => (n, what.trim()),
        _ => (0, ""),
    }
}

/// One run of `ptxas -v`: the facts it reported and its whole report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assembly {
    /// The facts parsed from the report.
    pub info: PtxasInfo,
    /// What ptxas printed (its `-v` report and any warnings).
    pub log: String,
}

/// Assembles `ptx` for `arch` (`sm_90a`, `sm_80`, …) with `ptxas -v` (found by
/// [`find_ptxas`]) and reads its report. The PTX and the cubin go through files in the
/// system's temporary directory, removed before it returns. Errors: no ptxas, or ptxas
/// failing (its report in the message), as [`Error::Ptxas`].
pub fn assemble(ptx: &str, arch: &str) -> Result<Assembly> {
    let ptxas = find_ptxas().ok_or_else(|| {
        let tried: Vec<String> = ptxas_candidates().iter().map(|p| p.display().to_string()).collect();
        Error::Ptxas(format!("ptxas not found (looked at {}); {PTXAS_INSTALL_HINT}", tried.join(", ")))
    })?;
    assemble_with(&ptxas, ptx, arch)
}

/// [`assemble`] with this ptxas.
pub fn assemble_with(ptxas: &Path, ptx: &str, arch: &str) -> Result<Assembly> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let stem = std::env::temp_dir().join(format!("kfuse-ptxas-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let (src, out) = (stem.with_extension("ptx"), stem.with_extension("cubin"));
    let fail = |what: String| Error::Ptxas(format!("{} -arch={arch} -v: {what}", ptxas.display()));
    std::fs::write(&src, ptx).map_err(|e| fail(format!("writing {}: {e}", src.display())))?;
    let run = std::process::Command::new(ptxas).arg(format!("-arch={arch}")).arg("-v").arg(&src).arg("-o").arg(&out).output();
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&out);
    let run = run.map_err(|e| fail(format!("running it: {e}")))?;
    let log = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    if !run.status.success() {
        return Err(fail(format!("it exited with {}:\n{}", run.status, log.trim_end())));
    }
    let info = PtxasInfo::parse(&log).ok_or_else(|| fail(format!("no register count in its report:\n{}", log.trim_end())))?;
    Ok(Assembly { info, log })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_entry_of_a_report() {
        let log = "ptxas info    : 0 bytes gmem\n\
                   ptxas info    : Compiling entry function 'kf_gemm' for 'sm_90a'\n\
                   ptxas info    : Function properties for kf_gemm\n    \
                   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 168 registers, used 1 barriers, 16 bytes smem, 400 bytes cmem[0]\n\
                   ptxas warning : something to say\n";
        let i = PtxasInfo::parse(log).unwrap();
        assert_eq!(i.function, "kf_gemm");
        assert_eq!((i.registers, i.static_smem_bytes, i.stack_frame_bytes, i.spill_bytes()), (168, 16, 0, 0));
        assert_eq!(i.warnings, ["ptxas warning : something to say"]);
    }

    #[test]
    fn a_report_without_function_names() {
        let log = "ptxas info    : Used 98 registers, used 0 barriers\n    8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads";
        let i = PtxasInfo::parse(log).unwrap();
        assert_eq!((i.registers, i.stack_frame_bytes, i.spill_store_bytes, i.spill_load_bytes), (98, 8, 12, 4));
        assert_eq!(PtxasInfo::parse("ptxas info    : 0 bytes gmem"), None);
    }

    #[test]
    fn candidates_cover_the_pip_folder_and_the_toolkit() {
        let c = ptxas_candidates();
        let cwd = std::env::current_dir().unwrap();
        assert!(c.contains(&cwd.join(".cuda/nvidia/cu13/bin/ptxas")));
        assert!(c.contains(&PathBuf::from("/usr/local/cuda/bin/ptxas")));
    }
}
