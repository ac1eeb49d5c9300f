//! The `KFUSE_*` environment settings a launch consults, read once and kept.
//!
//! Owns: reading and parsing `KFUSE_TILES`, `KFUSE_THREADS`, `KFUSE_MIN_BLOCKS`,
//! `KFUSE_TARGET`, `KFUSE_AUTOTUNE`, `KFUSE_TAIL_SPLIT` and `KFUSE_SYNC` ([`current`]),
//! and re-reading them ([`reload`]).
//!
//! Why a snapshot: a launch consulted each variable on every call, and each read of the
//! environment takes the standard library's environment lock and scans the whole
//! environment — about 0.15 µs apiece on the H100's host, close to a microsecond a
//! launch, where a small GEMM's kernel runs for 18 µs and the host must keep ahead of it
//! (NOTES, g26).
//!
//! Invariants:
//! - The variables are read on the first call of [`current`] in the process, and again
//!   only on [`reload`]: a program that changes one of them after its first launch
//!   calls [`reload`] for the change to apply (the tests and examples that switch tile
//!   overrides between launches do).
//! - A value that does not parse is kept as its error message and reported by every
//!   launch that needs it (`Error::InvalidArgument`), as before; nothing here panics.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use kfuse_codegen::Target;

use crate::error::{Error, Result};

/// The parsed settings (see the module docs for when they are read).
#[derive(Clone, Debug)]
pub struct Settings {
    tiles: std::result::Result<BTreeMap<String, u32>, String>,
    threads: std::result::Result<Option<u32>, String>,
    min_blocks: std::result::Result<Option<u32>, String>,
    target: std::result::Result<Option<Target>, String>,
    /// `KFUSE_AUTOTUNE=1`.
    pub autotune: bool,
    /// `KFUSE_TAIL_SPLIT=1`.
    pub tail_split: bool,
    /// `KFUSE_SYNC=1`.
    pub sync: bool,
}

impl Settings {
    /// Reads and parses the variables now.
    pub fn from_env() -> Settings {
        let var = |name: &str| std::env::var(name).ok();
        let flag = |name: &str| var(name).is_some_and(|v| v.trim() == "1");
        let num = |name: &str| -> std::result::Result<Option<u32>, String> {
            match var(name) {
                Some(v) => v.trim().parse::<u32>().map(Some).map_err(|_| format!("{name}: `{v}` is not a number")),
                None => Ok(None),
            }
        };
        Settings {
            tiles: parse_tiles(var("KFUSE_TILES").as_deref()),
            threads: num("KFUSE_THREADS"),
            min_blocks: num("KFUSE_MIN_BLOCKS"),
            target: parse_target(var("KFUSE_TARGET").as_deref()),
            autotune: flag("KFUSE_AUTOTUNE"),
            tail_split: flag("KFUSE_TAIL_SPLIT"),
            sync: flag("KFUSE_SYNC"),
        }
    }

    /// The tile-size overrides of `KFUSE_TILES` (`BM=128,BN=64`): every kernel with a
    /// tile symbol of that name uses that size instead of the scheduler's choice.
    pub fn tiles(&self) -> Result<&BTreeMap<String, u32>> {
        self.tiles.as_ref().map_err(|m| Error::InvalidArgument(m.clone()))
    }

    /// `KFUSE_THREADS`: threads a block, instead of the scheduler's choice.
    pub fn threads(&self) -> Result<Option<u32>> {
        self.threads.clone().map_err(Error::InvalidArgument)
    }

    /// `KFUSE_MIN_BLOCKS`: the `__launch_bounds__` minimum of blocks a multiprocessor.
    pub fn min_blocks(&self) -> Result<Option<u32>> {
        self.min_blocks.clone().map_err(Error::InvalidArgument)
    }

    /// The target `KFUSE_TARGET` names (`sm_80`, `sm_89` or `sm_90a`; unset or empty:
    /// none).
    pub fn target(&self) -> Result<Option<Target>> {
        self.target.clone().map_err(Error::InvalidArgument)
    }
}

fn parse_tiles(v: Option<&str>) -> std::result::Result<BTreeMap<String, u32>, String> {
    let mut out = BTreeMap::new();
    let Some(v) = v else { return Ok(out) };
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parsed = part.split_once('=').and_then(|(k, n)| Some((k.trim().to_string(), n.trim().parse::<u32>().ok()?)));
        match parsed {
            Some((k, n)) if n.is_power_of_two() => {
                out.insert(k, n);
            }
            _ => return Err(format!("KFUSE_TILES: `{part}` is not NAME=SIZE with SIZE a power of two (e.g. KFUSE_TILES=BM=128,BN=64)")),
        }
    }
    Ok(out)
}

fn parse_target(v: Option<&str>) -> std::result::Result<Option<Target>, String> {
    match v.map(str::trim) {
        None | Some("") => Ok(None),
        Some("sm_80") => Ok(Some(Target::sm80())),
        Some("sm_89") => Ok(Some(Target::sm89())),
        Some("sm_90a") => Ok(Some(Target::sm90a())),
        Some(other) => Err(format!("KFUSE_TARGET={other}: expected sm_80, sm_89 or sm_90a")),
    }
}

fn slot() -> &'static RwLock<Option<Arc<Settings>>> {
    static SLOT: OnceLock<RwLock<Option<Arc<Settings>>>> = OnceLock::new();
    SLOT.get_or_init(|| RwLock::new(None))
}

/// The settings in force: read from the environment on the first call, then kept
/// until [`reload`].
pub fn current() -> Arc<Settings> {
    if let Some(s) = slot().read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return s.clone();
    }
    let mut w = slot().write().unwrap_or_else(|e| e.into_inner());
    w.get_or_insert_with(|| Arc::new(Settings::from_env())).clone()
}

/// Re-reads the variables: call it after changing one of them in-process (launches
/// before the call keep the old values, launches after it see the new ones).
pub fn reload() {
    *slot().write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(Settings::from_env()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_parse_and_refuse() {
        assert!(parse_tiles(None).unwrap().is_empty());
        let t = parse_tiles(Some(" BM=128, BN=64 ,")).unwrap();
        assert_eq!(t.get("BM"), Some(&128));
        assert_eq!(t.get("BN"), Some(&64));
        let e = parse_tiles(Some("BM=96")).unwrap_err();
        assert!(e.contains("`BM=96`") && e.contains("power of two"), "{e}");
        assert!(parse_tiles(Some("BM")).is_err());
    }

    #[test]
    fn target_values() {
        assert_eq!(parse_target(Some("")).unwrap(), None);
        assert_eq!(parse_target(None).unwrap(), None);
        assert_eq!(parse_target(Some("sm_80")).unwrap(), Some(Target::sm80()));
        assert_eq!(parse_target(Some(" sm_89 ")).unwrap(), Some(Target::sm89()));
        assert_eq!(parse_target(Some("sm_90a")).unwrap(), Some(Target::sm90a()));
        let e = parse_target(Some("sm_75")).unwrap_err();
        assert!(e.contains("KFUSE_TARGET=sm_75") && e.contains("sm_80, sm_89 or sm_90a"), "{e}");
    }

    #[test]
    fn errors_reach_the_caller_as_invalid_argument() {
        let s = Settings {
            tiles: Err("KFUSE_TILES: bad".into()),
            threads: Err("KFUSE_THREADS: `x` is not a number".into()),
            min_blocks: Ok(Some(2)),
            target: Ok(None),
            autotune: false,
            tail_split: false,
            sync: false,
        };
        assert!(matches!(s.tiles(), Err(Error::InvalidArgument(m)) if m == "KFUSE_TILES: bad"));
        assert!(matches!(s.threads(), Err(Error::InvalidArgument(m)) if m.contains("not a number")));
        assert_eq!(s.min_blocks().unwrap(), Some(2));
    }
}
