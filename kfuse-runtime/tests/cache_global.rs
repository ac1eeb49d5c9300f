//! `compile_cached` through the process-wide cache, its directory a temporary one set in
//! code (`Config::cache_dir`; that `KFUSE_CACHE_DIR` sets the same is checked by the
//! workspace's `tests/configuration.rs`). No test changes the environment of its process.

use std::collections::BTreeMap;

use kfuse_codegen::EmittedKernel;
use kfuse_runtime::settings::Config;
use kfuse_runtime::{compile_cached, CacheOutcome, ModuleCache};

#[test]
fn compile_cached_uses_the_configured_cache_dir() {
    let dir = std::env::temp_dir().join(format!("kfuse-test-global-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // (process-wide: the only test of this binary)
    Config::new().cache_dir(&dir).apply().unwrap();
    if !kfuse_runtime::nvrtc::nvrtc_available() {
        assert!(std::env::var("KFUSE_REQUIRE_NVRTC").map_or(true, |v| v != "1"), "KFUSE_REQUIRE_NVRTC=1 but no libnvrtc");
        return;
    }
    assert_eq!(ModuleCache::global().dir(), Some(dir.as_path()));
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
        plan: Default::default(),
    };
    let (p1, o1) = compile_cached(&e).unwrap();
    assert_eq!(o1, CacheOutcome::Compiled);
    let (p2, o2) = compile_cached(&e).unwrap();
    assert_eq!((o2, p2), (CacheOutcome::Memory, p1.clone()));
    let (p3, o3) = ModuleCache::new(Some(dir.clone())).compile_emitted(&e).unwrap();
    assert_eq!((o3, p3), (CacheOutcome::Disk, p1));
    let _ = std::fs::remove_dir_all(&dir);
}
