//! NVRTC and the PTX cache, without a GPU. Needs libnvrtc (found through
//! `LD_LIBRARY_PATH` or the places `kfuse_runtime::nvrtc` searches, e.g. `.cuda/` in the
//! repository); without it these tests pass vacuously unless `KFUSE_REQUIRE_NVRTC=1`.

use std::path::PathBuf;

use kfuse_runtime::nvrtc::{compile_ptx, cuda_include_dirs, nvrtc_available, nvrtc_version};
use kfuse_runtime::{CacheOutcome, Error, ModuleCache};

const SRC: &str = r#"
extern "C" __global__ void axpy(float* __restrict__ y, const float* __restrict__ x, float a, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

fn have_nvrtc() -> bool {
    if nvrtc_available() {
        return true;
    }
    if std::env::var("KFUSE_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
        panic!("KFUSE_REQUIRE_NVRTC=1 but: {}", kfuse_runtime::nvrtc::ensure_nvrtc().unwrap_err());
    }
    eprintln!("libnvrtc not found; skipping: {}", kfuse_runtime::nvrtc::ensure_nvrtc().unwrap_err());
    false
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kfuse-test-{tag}-{}-{:?}", std::process::id(), std::time::Instant::now()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn version_is_13() {
    if !have_nvrtc() {
        return;
    }
    let (major, _minor) = nvrtc_version().unwrap();
    assert!(major >= 12, "NVRTC {major}");
}

#[test]
fn compiles_for_sm90a_and_sm80() {
    if !have_nvrtc() {
        return;
    }
    for arch in ["sm_90a", "sm_80"] {
        let ptx = compile_ptx(SRC, arch, &[]).unwrap();
        assert!(ptx.contains(&format!(".target {arch}")), "{arch}:\n{ptx}");
        assert!(ptx.contains(".entry axpy"), "{ptx}");
    }
}

#[test]
fn compile_errors_carry_log_and_source() {
    if !have_nvrtc() {
        return;
    }
    let bad = "extern \"C\" __global__ void k(float* y) {\n    y[0] = undefined_name;\n}\n";
    match compile_ptx(bad, "sm_80", &[]) {
        Err(e @ Error::Nvrtc { .. }) => {
            let s = e.to_string();
            assert!(s.contains("undefined_name"), "{s}");
            assert!(s.contains("2 |     y[0] = undefined_name;"), "{s}");
        }
        other => panic!("expected Error::Nvrtc, got {other:?}"),
    }
}

#[test]
fn headers_are_found_when_installed() {
    if !have_nvrtc() || cuda_include_dirs().is_empty() {
        return;
    }
    let src = "#include <cuda_bf16.h>\nextern \"C\" __global__ void k(__nv_bfloat16* y) { y[0] = __float2bfloat16(1.0f); }\n";
    compile_ptx(src, "sm_90a", &[]).unwrap();
}

#[test]
fn disk_cache_levels_and_corruption_recovery() {
    if !have_nvrtc() {
        return;
    }
    let dir = temp_dir("cache");
    for arch in ["sm_90a", "sm_80"] {
        let c1 = ModuleCache::new(Some(dir.clone()));
        let (p1, o1) = c1.compile(SRC, arch, &[]).unwrap();
        assert_eq!(o1, CacheOutcome::Compiled, "{arch}");
        // a real architecture: the cubin (an ELF file) comes with the PTX
        assert!(p1.cubin.starts_with(b"\x7fELF") && p1.ptx.contains(".entry axpy"), "{arch}");
        let (p2, o2) = c1.compile(SRC, arch, &[]).unwrap();
        assert_eq!((o2, &p2), (CacheOutcome::Memory, &p1));

        // A fresh process-level cache finds the file.
        let c2 = ModuleCache::new(Some(dir.clone()));
        let (p3, o3) = c2.compile(SRC, arch, &[]).unwrap();
        assert_eq!((o3, &p3), (CacheOutcome::Disk, &p1));

        // Corrupt the file (flip a byte of the body, then truncate): never loaded,
        // recompiled, and rewritten whole.
        let path = c2.entry_path(SRC, arch, &[]).unwrap().unwrap();
        assert!(path.starts_with(&dir));
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 10] ^= 0x20;
        std::fs::write(&path, &bytes).unwrap();
        let (p4, o4) = ModuleCache::new(Some(dir.clone())).compile(SRC, arch, &[]).unwrap();
        assert_eq!((o4, &p4), (CacheOutcome::Compiled, &p1));
        std::fs::write(&path, &bytes[..n / 2]).unwrap();
        let (_, o5) = ModuleCache::new(Some(dir.clone())).compile(SRC, arch, &[]).unwrap();
        assert_eq!(o5, CacheOutcome::Compiled);
        let (_, o6) = ModuleCache::new(Some(dir.clone())).compile(SRC, arch, &[]).unwrap();
        assert_eq!(o6, CacheOutcome::Disk, "the rewritten entry verifies");

        // Other options make another entry.
        let (_, o7) = c2.compile(SRC, arch, &["--use_fast_math".to_string()]).unwrap();
        assert_eq!(o7, CacheOutcome::Compiled);
    }
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(files.len(), 4, "{files:?}");
    assert!(files.iter().all(|f| f.ends_with(".module") && f.len() == 64 + 7), "{files:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_disk_level_still_compiles() {
    if !have_nvrtc() {
        return;
    }
    let c = ModuleCache::new(None);
    assert_eq!(c.compile(SRC, "sm_80", &[]).unwrap().1, CacheOutcome::Compiled);
    assert_eq!(c.compile(SRC, "sm_80", &[]).unwrap().1, CacheOutcome::Memory);
    assert_eq!(c.entry_path(SRC, "sm_80", &[]).unwrap(), None);
}
