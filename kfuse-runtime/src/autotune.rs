//! Optional autotuning of `dot` kernels (`KFUSE_AUTOTUNE=1`): per (kernel, shape
//! bucket, device), the fastest of [`kfuse_codegen::tuning_candidates`], timed once on
//! the device and remembered on disk.
//!
//! Owns: whether tuning is on ([`enabled`]), the bucket key ([`bucket_key`]), the winner
//! store (`autotune.json`, [`Store`]), how an explicit `KFUSE_TILES` combines with a
//! winner ([`merge_tiles`]) and the count of timed candidates ([`timings`]). The timing
//! itself is [`crate::launch`](mod@crate::launch)'s (it owns loading and issuing kernels).
//!
//! Bucket key: the hex SHA-256 of, length-prefixed, the kernel name, the SHA-256 of its
//! printed IR (dtypes included), the [`Spec`] with `tiles` cleared (power-of-two shape
//! buckets, tensor alignment and stride facts, thread overrides), the device name and
//! the [`Target`] (architecture, SM count, shared memory). A launch whose key is known
//! uses the stored tiles and never times anything again.
//!
//! File: `autotune.json` in the module cache directory ([`ModuleCache::default_dir`] as it
//! is at the launch; with `KFUSE_CACHE_DIR` empty there is no file, winners live in this
//! process only):
//!
//! ```json
//! {"format": "kfuse-autotune 1",
//!  "buckets": {"<key>": {"kernel": "gemm", "device": "NVIDIA H100 80GB HBM3",
//!                        "arch": "sm_90a", "tiles": {"BM": 128, "BN": 256}, "ms": 0.0123}}}
//! ```
//!
//! Invariants:
//! - Only `tiles` is trusted on reading: an entry whose tiles are not names mapped to
//!   powers of two is ignored (its bucket tunes again); a file that does not parse or
//!   has another `format` counts as empty and is replaced at the next store.
//! - A store re-reads the file, adds its bucket and writes a temporary file in the same
//!   directory that is renamed into place, so readers see a whole file or none;
//!   failing to write costs a re-tune in another process, never an error.
//! - Winners are also kept in memory per (directory, key), so a known bucket costs no
//!   file read after the first launch.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use kfuse_codegen::{Spec, Target};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::cache::ModuleCache;

/// The file's `format` value.
pub const FORMAT: &str = "kfuse-autotune 1";

/// The file name in the cache directory.
pub const FILE: &str = "autotune.json";

/// Whether `KFUSE_AUTOTUNE=1` (default off; read through [`crate::settings`]).
pub fn enabled() -> bool {
    crate::settings::current().autotune
}

static TIMINGS: AtomicU64 = AtomicU64::new(0);

/// How many candidates this process has timed (one per candidate per tuning): tests
/// check that a known bucket is never tuned again.
pub fn timings() -> u64 {
    TIMINGS.load(Ordering::Relaxed)
}

pub(crate) fn count_timing() {
    TIMINGS.fetch_add(1, Ordering::Relaxed);
}

/// A tuning's progress over its candidates, as a bar on standard error when that is a
/// terminal (nothing otherwise: logs, CI and captured output stay as they were). The
/// bar is cleared when the tuning ends.
pub(crate) struct Progress(indicatif::ProgressBar);

impl Progress {
    pub(crate) fn new(kernel: &str, candidates: usize) -> Progress {
        use std::io::IsTerminal;
        let target = if std::io::stderr().is_terminal() { indicatif::ProgressDrawTarget::stderr() } else { indicatif::ProgressDrawTarget::hidden() };
        let bar = indicatif::ProgressBar::with_draw_target(Some(candidates as u64), target);
        if let Ok(style) = indicatif::ProgressStyle::with_template("kfuse: autotuning {prefix} [{bar:24}] {pos}/{len} {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(kernel.to_string());
        Progress(bar)
    }

    /// Candidate `i` (0-based) is being timed: `i` are done; its tiles are shown.
    pub(crate) fn at(&self, i: usize, tiles: &BTreeMap<String, u32>) {
        let text: Vec<String> = tiles.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.0.set_position(i as u64);
        self.0.set_message(text.join(" "));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bucket key of a launch (see the module docs); `spec.tiles` is ignored.
pub fn bucket_key(kernel: &str, ir_text: &str, spec: &Spec, device_name: &str, target: &Target) -> String {
    let spec = Spec { tiles: BTreeMap::new(), ..spec.clone() };
    let mut h = Sha256::new();
    let ir = hex(&Sha256::digest(ir_text.as_bytes()));
    for part in [FORMAT, kernel, &ir, &format!("{spec:?}"), device_name, &format!("{target:?}")] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex(&h.finalize())
}

/// A winner's tiles with the explicit overrides (`KFUSE_TILES`) on top: an entry named
/// in both takes the explicit value.
pub fn merge_tiles(winner: &BTreeMap<String, u32>, explicit: &BTreeMap<String, u32>) -> BTreeMap<String, u32> {
    let mut t = winner.clone();
    t.extend(explicit.iter().map(|(k, v)| (k.clone(), *v)));
    t
}

/// One stored winner.
#[derive(Clone, Debug, PartialEq)]
pub struct Winner {
    /// The kernel's name (for people reading the file).
    pub kernel: String,
    /// The device's name (for people reading the file).
    pub device: String,
    /// The target architecture (`sm_90a`; for people reading the file).
    pub arch: String,
    /// The fastest tile settings by tile-symbol name: the one field a launch uses.
    pub tiles: BTreeMap<String, u32>,
    /// Its median time in milliseconds (for people reading the file).
    pub ms: f64,
}

/// The buckets of an `autotune.json` text; damage gives fewer (or no) buckets, never
/// an error.
pub fn parse(text: &str) -> BTreeMap<String, Winner> {
    let mut out = BTreeMap::new();
    let Ok(v) = serde_json::from_str::<Value>(text) else { return out };
    if v.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return out;
    }
    let Some(buckets) = v.get("buckets").and_then(Value::as_object) else { return out };
    for (key, e) in buckets {
        let s = |f: &str| e.get(f).and_then(Value::as_str).unwrap_or("").to_string();
        let Some(tiles) = e.get("tiles").and_then(Value::as_object) else { continue };
        let parsed: Option<BTreeMap<String, u32>> = tiles
            .iter()
            .map(|(k, v)| {
                let n = u32::try_from(v.as_u64()?).ok()?;
                (!k.is_empty() && n.is_power_of_two()).then(|| (k.clone(), n))
            })
            .collect();
        let Some(tiles) = parsed else { continue };
        if tiles.is_empty() || key.len() != 64 {
            continue;
        }
        let ms = e.get("ms").and_then(Value::as_f64).unwrap_or(0.0);
        out.insert(key.clone(), Winner { kernel: s("kernel"), device: s("device"), arch: s("arch"), tiles, ms });
    }
    out
}

/// The text of an `autotune.json` holding `buckets`.
pub fn format(buckets: &BTreeMap<String, Winner>) -> String {
    let mut m = Map::new();
    for (k, w) in buckets {
        m.insert(
            k.clone(),
            json!({ "kernel": w.kernel, "device": w.device, "arch": w.arch, "tiles": w.tiles, "ms": if w.ms.is_finite() { w.ms } else { 0.0 } }),
        );
    }
    let v = json!({ "format": FORMAT, "buckets": Value::Object(m) });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// Winners on disk in one directory (or in memory only), with a memory level.
pub struct Store {
    dir: Option<PathBuf>,
}

type Memo = Mutex<HashMap<(Option<PathBuf>, String), BTreeMap<String, u32>>>;

fn memo() -> &'static Memo {
    static M: OnceLock<Memo> = OnceLock::new();
    M.get_or_init(Default::default)
}

impl Store {
    /// The store in `dir` (`None`: memory only).
    pub fn new(dir: Option<PathBuf>) -> Store {
        Store { dir }
    }

    /// The store of the module cache directory as the settings name it now
    /// (`KFUSE_CACHE_DIR`, `Config::cache_dir`).
    pub fn current() -> Store {
        Store::new(ModuleCache::default_dir())
    }

    /// The file, if there is a disk level.
    pub fn path(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(FILE))
    }

    /// The winner's tiles of a bucket, if known (memory first, then the file).
    pub fn get(&self, key: &str) -> Option<BTreeMap<String, u32>> {
        let mk = (self.dir.clone(), key.to_string());
        if let Some(t) = memo().lock().unwrap_or_else(|e| e.into_inner()).get(&mk) {
            return Some(t.clone());
        }
        let text = std::fs::read_to_string(self.path()?).ok()?;
        let tiles = parse(&text).remove(key)?.tiles;
        memo().lock().unwrap_or_else(|e| e.into_inner()).insert(mk, tiles.clone());
        Some(tiles)
    }

    /// Records a bucket's winner (memory, and the file when there is one; see the
    /// module docs).
    pub fn put(&self, key: &str, w: &Winner) {
        memo().lock().unwrap_or_else(|e| e.into_inner()).insert((self.dir.clone(), key.to_string()), w.tiles.clone());
        if let Some(path) = self.path() {
            let mut all = std::fs::read_to_string(&path).map(|t| parse(&t)).unwrap_or_default();
            all.insert(key.to_string(), w.clone());
            let _ = write_atomic(&path, format(&all).as_bytes());
        }
    }
}

/// Writes `path` through a temporary file in its directory and a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{FILE}.{}.{}.tmp", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use kfuse_codegen::TensorSpec;

    fn spec() -> Spec {
        Spec {
            tensors: vec![Some(TensorSpec { ptr_align: 16, stride_div: vec![16, 0] }), None],
            shape_pow2: vec![512, 1024],
            ..Default::default()
        }
    }

    fn winner(bm: u32) -> Winner {
        Winner {
            kernel: "gemm".into(),
            device: "GPU X".into(),
            arch: "sm_90a".into(),
            tiles: [("BM".to_string(), bm), ("BN".to_string(), 256)].into(),
            ms: 0.25,
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kfuse-autotune-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn key_ignores_tiles_and_depends_on_the_rest() {
        let t = Target::sm90a();
        let k = bucket_key("gemm", "ir", &spec(), "GPU X", &t);
        assert_eq!(k.len(), 64);
        let mut tiled = spec();
        tiled.tiles.insert("BM".into(), 64);
        assert_eq!(k, bucket_key("gemm", "ir", &tiled, "GPU X", &t));
        let mut bigger = spec();
        bigger.shape_pow2[0] = 1024;
        let mut misaligned = spec();
        misaligned.tensors[0] = Some(TensorSpec { ptr_align: 2, stride_div: vec![16, 0] });
        for other in [
            bucket_key("gemm2", "ir", &spec(), "GPU X", &t),
            bucket_key("gemm", "ir2", &spec(), "GPU X", &t),
            bucket_key("gemm", "ir", &bigger, "GPU X", &t),
            bucket_key("gemm", "ir", &misaligned, "GPU X", &t),
            bucket_key("gemm", "ir", &Spec { threads: Some(128), ..spec() }, "GPU X", &t),
            bucket_key("gemm", "ir", &spec(), "GPU Y", &t),
            bucket_key("gemm", "ir", &spec(), "GPU X", &Target::sm80()),
        ] {
            assert_ne!(k, other);
        }
    }

    #[test]
    fn json_round_trips() {
        let mut b = BTreeMap::new();
        b.insert("a".repeat(64), winner(128));
        b.insert("b".repeat(64), winner(64));
        let text = format(&b);
        assert!(text.contains("\"format\": \"kfuse-autotune 1\""), "{text}");
        assert_eq!(parse(&text), b);
        assert_eq!(parse(&format(&BTreeMap::new())), BTreeMap::new());
    }

    #[test]
    fn damage_is_ignored_never_trusted() {
        let good = format(&[("a".repeat(64), winner(128))].into());
        assert_eq!(parse(&good).len(), 1);
        for bad in [
            String::new(),
            "{".to_string(),
            "\u{0}\u{ff}".to_string(),
            "[1, 2]".to_string(),
            good.replace(FORMAT, "kfuse-autotune 2"),
            good[..good.len() / 2].to_string(),
            good.replace("128", "96"),  // not a power of two
            good.replace("128", "-1"),  // not a size
            good.replace("128", "\"x\""),
            good.replace(&"a".repeat(64), "short-key"),
        ] {
            assert!(parse(&bad).is_empty(), "{bad}");
        }
    }

    #[test]
    fn store_writes_atomically_and_rewrites_a_corrupt_file() {
        let dir = tmp("store");
        let s = Store::new(Some(dir.clone()));
        let (k1, k2) = ("1".repeat(64), "2".repeat(64));
        assert_eq!(s.get(&k1), None);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(s.path().unwrap(), b"{ not json").unwrap();
        assert_eq!(s.get(&k1), None, "a corrupt file is not trusted");
        s.put(&k1, &winner(128));
        s.put(&k2, &winner(64));
        let on_disk = parse(&std::fs::read_to_string(s.path().unwrap()).unwrap());
        assert_eq!(on_disk.len(), 2, "the corrupt file was replaced, both buckets kept");
        assert_eq!(on_disk[&k1].tiles["BM"], 128);
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE)], "no temporary files left");
        // another process (no memory level for this key yet) reads the file
        memo().lock().unwrap().retain(|(d, _), _| d.as_deref() != Some(dir.as_path()));
        assert_eq!(s.get(&k2).unwrap()["BM"], 64);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn memory_only_without_a_directory() {
        let s = Store::new(None);
        let k = "m".repeat(64);
        assert_eq!(s.path(), None);
        assert_eq!(s.get(&k), None);
        s.put(&k, &winner(64));
        assert_eq!(s.get(&k).unwrap()["BM"], 64);
    }

    #[test]
    fn explicit_tiles_win_over_the_winner() {
        let w = winner(128).tiles;
        let explicit: BTreeMap<String, u32> = [("BM".to_string(), 64), ("STAGES".to_string(), 4)].into();
        let m = merge_tiles(&w, &explicit);
        assert_eq!(m, [("BM".to_string(), 64), ("BN".to_string(), 256), ("STAGES".to_string(), 4)].into());
        assert_eq!(merge_tiles(&w, &BTreeMap::new()), w);
    }
}
