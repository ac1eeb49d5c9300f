//! `compile_cached` through the process-wide cache with `KFUSE_CACHE_DIR` pointing at a
//! temporary directory. One test in its own binary: it sets the variable before anything
//! reads it.

use std::collections::BTreeMap;

use kfuse_codegen::EmittedKernel;
use kfuse_runtime::{compile_cached, CacheOutcome, PtxCache};

#[test]
fn compile_cached_uses_kfuse_cache_dir() {
    let dir = std::env::temp_dir().join(format!("kfuse-test-global-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY (edition 2024 wording): no other thread of this binary reads the environment.
    std::env::set_var("KFUSE_CACHE_DIR", &dir);
    if !kfuse_runtime::nvrtc::nvrtc_available() {
        assert!(std::env::var("KFUSE_REQUIRE_NVRTC").map_or(true, |v| v != "1"), "KFUSE_REQUIRE_NVRTC=1 but no libnvrtc");
        return;
    }
    assert_eq!(PtxCache::global().dir(), Some(dir.as_path()));
    let e = EmittedKernel {
        entry: "k".into(),
        source: "extern \"C\" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }\n".into(),
        arch: "sm_90a".into(),
        options: vec![],
        block_threads: 32,
        smem_bytes: 0,
        params: vec![],
        grid: vec![],
        cluster_x: 1,
        persistent: None,
        grouped: false,
        ir: String::new(),
        tiles: BTreeMap::new(),
        register_attempt: (0, 1),
    };
    let (p1, o1) = compile_cached(&e).unwrap();
    assert_eq!(o1, CacheOutcome::Compiled);
    let (p2, o2) = compile_cached(&e).unwrap();
    assert_eq!((o2, p2), (CacheOutcome::Memory, p1.clone()));
    let (p3, o3) = PtxCache::new(Some(dir.clone())).compile_emitted(&e).unwrap();
    assert_eq!((o3, p3), (CacheOutcome::Disk, p1));
    let _ = std::fs::remove_dir_all(&dir);
}
