//! The `KFUSE_*` settings a launch consults are read once a process and again on
//! `settings::reload()` (kfuse-runtime's `settings` module). The test changes the
//! environment, so it runs alone in a child process (`common::isolation`).

mod common;

use kfuse::runtime::launch::tile_overrides;
use kfuse::runtime::settings;

#[test]
fn settings_are_read_once_and_again_on_reload() {
    let set = |v: &'static str| Some(std::ffi::OsStr::new(v));
    let vars = [("KFUSE_TILES", set("BM=64,BN=128")), ("KFUSE_SYNC", set("1")), ("KFUSE_THREADS", None)];
    if !common::isolation::alone("settings_are_read_once_and_again_on_reload", &vars) {
        return;
    }
    // the process's first read sees the variables it started with
    let t = tile_overrides().unwrap();
    assert_eq!((t.get("BM"), t.get("BN")), (Some(&64), Some(&128)));
    assert!(settings::current().sync);

    // (alone in this process: changing its environment races with no other test)
    // a change without a reload is not seen …
    std::env::set_var("KFUSE_TILES", "BM=256");
    std::env::remove_var("KFUSE_SYNC");
    assert_eq!(tile_overrides().unwrap().get("BM"), Some(&64));
    assert!(settings::current().sync);
    // … and is after one
    settings::reload();
    assert_eq!(tile_overrides().unwrap().get("BM"), Some(&256));
    assert!(!settings::current().sync);

    // a value that does not parse is an error at every use, not a panic
    std::env::set_var("KFUSE_TILES", "BM=96");
    std::env::set_var("KFUSE_THREADS", "many");
    settings::reload();
    let e = tile_overrides().unwrap_err().to_string();
    assert!(e.contains("KFUSE_TILES") && e.contains("BM=96"), "{e}");
    let e = settings::current().threads().unwrap_err().to_string();
    assert!(e.contains("KFUSE_THREADS") && e.contains("many"), "{e}");

    std::env::remove_var("KFUSE_TILES");
    std::env::remove_var("KFUSE_THREADS");
    settings::reload();
    assert!(tile_overrides().unwrap().is_empty());
    assert_eq!(settings::current().threads().unwrap(), None);
}
