//! The settings a launch consults: from the `KFUSE_*` environment variables, read once
//! and kept, and from code ([`Config`]), which overrides them.
//!
//! Owns: reading and parsing `KFUSE_TILES`, `KFUSE_THREADS`, `KFUSE_MIN_BLOCKS`,
//! `KFUSE_TARGET`, `KFUSE_AUTOTUNE`, `KFUSE_SYNC` and
//! `KFUSE_CACHE_DIR` ([`current`]), re-reading them ([`reload`]), and the settings made
//! in code ([`Config::apply`], [`clear_config`]) that take precedence over them.
//!
//! ```no_run
//! use kfuse_runtime::settings::Config;
//! use kfuse_codegen::Target;
//! # fn main() -> kfuse_runtime::Result<()> {
//! Config::new()
//!     .cache_dir("/var/cache/my-app/kfuse") // instead of KFUSE_CACHE_DIR
//!     .target(Target::sm80())               // instead of KFUSE_TARGET
//!     .autotune(true)                       // instead of KFUSE_AUTOTUNE
//!     .tile("BN", 128)                      // over KFUSE_TILES's BN, if it names one
//!     .tile("STAGES", 3)
//!     .apply()?;
//! # Ok(()) }
//! ```
//!
//! Why a snapshot: a launch consulted each variable on every call, and each read of the
//! environment takes the standard library's environment lock and scans the whole
//! environment — about 0.15 µs apiece on the H100's host, close to a microsecond a
//! launch, where a small GEMM's kernel runs for 18 µs and the host must keep ahead of it
//! (NOTES, g26).
//!
//! Invariants:
//! - The variables are read on the first call of [`current`] (or [`Config::apply`]) in
//!   the process, and again only on [`reload`]: a program that changes one of them after
//!   its first launch calls [`reload`] for the change to apply (the tests and examples
//!   that switch tile overrides between launches do).
//! - What [`Config::apply`] sets wins over the environment until [`clear_config`], a
//!   [`reload`] included; each apply changes only the settings it names. A launch sees
//!   the settings in force when it starts; launches before an apply keep the old ones.
//! - A variable that does not parse is kept as its error message and reported by every
//!   launch that needs it (`Error::InvalidArgument`), as before; nothing here panics. A
//!   [`Config`] that does not check out is refused by [`Config::apply`] and changes
//!   nothing.
//! - Tile overrides are powers of two, except the pipeline options that count something
//!   ([`COUNT_OPTIONS`]: `STAGES`, at least 2, and `GROUPM`, at least 1).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

use kfuse_codegen::Target;

use crate::error::{Error, Result};

/// The `KFUSE_TILES` entries that count something rather than size a tile, with their
/// least value: they need not be powers of two (`STAGES=3`: three pipeline stages of a
/// `dot` loop; `GROUPM=6`: tile rows in each group of the persistent walk).
pub const COUNT_OPTIONS: [(&str, u32); 2] = [("STAGES", 2), ("GROUPM", 1)];

/// The parsed settings (see the module docs for when they are read).
#[derive(Clone, Debug)]
pub struct Settings {
    tiles: std::result::Result<BTreeMap<String, u32>, String>,
    threads: std::result::Result<Option<u32>, String>,
    min_blocks: std::result::Result<Option<u32>, String>,
    target: std::result::Result<Option<Target>, String>,
    cache_dir: Option<PathBuf>,
    /// `KFUSE_AUTOTUNE=1` or [`Config::autotune`].
    pub autotune: bool,
    /// `KFUSE_SYNC=1` or [`Config::sync`].
    pub sync: bool,
}

impl Settings {
    /// Reads and parses the variables now (no settings made in code).
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
            cache_dir: cache_dir_from(std::env::var_os("KFUSE_CACHE_DIR")),
            autotune: flag("KFUSE_AUTOTUNE"),
            sync: flag("KFUSE_SYNC"),
        }
    }

    /// The tile-size overrides (`KFUSE_TILES=BM=128,BN=64`, [`Config::tile`]): every
    /// kernel with a tile symbol of that name uses that size instead of the scheduler's
    /// choice; `dot` loops also read the pipeline options among them (`STAGES`,
    /// `GROUPM`, …).
    pub fn tiles(&self) -> Result<&BTreeMap<String, u32>> {
        self.tiles.as_ref().map_err(|m| Error::InvalidArgument(m.clone()))
    }

    /// Threads a block, instead of the scheduler's choice (`KFUSE_THREADS`,
    /// [`Config::threads`]).
    pub fn threads(&self) -> Result<Option<u32>> {
        self.threads.clone().map_err(Error::InvalidArgument)
    }

    /// The `__launch_bounds__` minimum of blocks a multiprocessor (`KFUSE_MIN_BLOCKS`,
    /// [`Config::min_blocks`]).
    pub fn min_blocks(&self) -> Result<Option<u32>> {
        self.min_blocks.clone().map_err(Error::InvalidArgument)
    }

    /// The target to compile for instead of the GPU's own (`KFUSE_TARGET`: `sm_80`,
    /// `sm_89` or `sm_90a`, unset or empty: none; [`Config::target`]).
    pub fn target(&self) -> Result<Option<Target>> {
        self.target.clone().map_err(Error::InvalidArgument)
    }

    /// The directory of the on-disk module cache (PTX and cubins) and of `autotune.json`: `KFUSE_CACHE_DIR`
    /// or [`Config::cache_dir`], else `<user cache dir>/kfuse`; `None` (an empty
    /// `KFUSE_CACHE_DIR`, [`Config::no_disk_cache`]) keeps both in memory only.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// These settings with `code`'s over them.
    fn overlaid(&self, code: &Config) -> Settings {
        let mut s = self.clone();
        if let Some(t) = &code.tiles {
            s.tiles = Ok(t.clone());
        }
        if let Ok(t) = &mut s.tiles {
            t.extend(code.tile.iter().map(|(k, v)| (k.clone(), *v)));
        }
        if let Some(t) = code.threads {
            s.threads = Ok(t);
        }
        if let Some(m) = code.min_blocks {
            s.min_blocks = Ok(m);
        }
        if let Some(t) = &code.target {
            s.target = Ok(t.clone());
        }
        if let Some(d) = &code.cache_dir {
            s.cache_dir = d.clone();
        }
        s.autotune = code.autotune.unwrap_or(s.autotune);
        s.sync = code.sync.unwrap_or(s.sync);
        s
    }
}

/// Settings made in code, over the environment's (module docs): a builder of the
/// settings to change, applied to the whole process by [`Config::apply`]. Each method
/// names the variable it stands for; what a `Config` leaves alone keeps its current value
/// (the variable's, or an earlier apply's).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    cache_dir: Option<Option<PathBuf>>,
    target: Option<Option<Target>>,
    autotune: Option<bool>,
    tiles: Option<BTreeMap<String, u32>>,
    tile: BTreeMap<String, u32>,
    threads: Option<Option<u32>>,
    min_blocks: Option<Option<u32>>,
    sync: Option<bool>,
}

impl Config {
    /// A config that changes nothing yet.
    pub fn new() -> Config {
        Config::default()
    }

    /// The directory of the on-disk module cache (PTX and cubins) and of the tuner's `autotune.json`
    /// (`KFUSE_CACHE_DIR`). Compiles after the apply use it; PTX already in memory stays
    /// there.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Config {
        self.cache_dir = Some(Some(dir.into()));
        self
    }

    /// No disk level: PTX and tuning winners stay in this process's memory (an empty
    /// `KFUSE_CACHE_DIR`).
    pub fn no_disk_cache(mut self) -> Config {
        self.cache_dir = Some(None);
        self
    }

    /// Compile for `target` instead of the GPU's own architecture (`KFUSE_TARGET`): an
    /// older one than the GPU's, with the GPU's multiprocessor count and the smaller of
    /// the two shared-memory limits (`kfuse_codegen::Target::sm80()`, `sm89()`,
    /// `sm90a()`).
    pub fn target(mut self, target: Target) -> Config {
        self.target = Some(Some(target));
        self
    }

    /// Compile for the GPU's own architecture, whatever `KFUSE_TARGET` says.
    pub fn native_target(mut self) -> Config {
        self.target = Some(None);
        self
    }

    /// Tune `dot` kernels' tiles on first sight of a shape bucket (`KFUSE_AUTOTUNE=1`;
    /// see [`crate::autotune`]).
    pub fn autotune(mut self, on: bool) -> Config {
        self.autotune = Some(on);
        self
    }

    /// One tile override (a `KFUSE_TILES` entry, over the variable's entry of that name):
    /// every kernel with a tile symbol `name` uses `size`, a power of two, instead of the
    /// scheduler's choice; `dot` loops also take the pipeline options (`STAGES=n`,
    /// `GROUPM=n`).
    pub fn tile(mut self, name: impl Into<String>, size: u32) -> Config {
        self.tile.insert(name.into(), size);
        self
    }

    /// All tile overrides at once, instead of `KFUSE_TILES`'s and earlier applies' (none
    /// at all: an empty list).
    pub fn tiles<S: Into<String>>(mut self, tiles: impl IntoIterator<Item = (S, u32)>) -> Config {
        self.tiles = Some(tiles.into_iter().map(|(k, v)| (k.into(), v)).collect());
        self.tile.clear();
        self
    }

    /// Threads a block for every kernel instead of the scheduler's choice
    /// (`KFUSE_THREADS`; `None`: the scheduler's).
    pub fn threads(mut self, threads: Option<u32>) -> Config {
        self.threads = Some(threads);
        self
    }

    /// The `__launch_bounds__` minimum of blocks a multiprocessor (`KFUSE_MIN_BLOCKS`;
    /// `None`: the scheduler's).
    pub fn min_blocks(mut self, blocks: Option<u32>) -> Config {
        self.min_blocks = Some(blocks);
        self
    }

    /// Synchronize after every GPU launch, so that a failing kernel reports its own
    /// error (`KFUSE_SYNC=1`).
    pub fn sync(mut self, on: bool) -> Config {
        self.sync = Some(on);
        self
    }

    /// Makes these settings the process's, over the environment's, from the next launch
    /// on. Errors ([`Error::InvalidArgument`], nothing changed): a tile override that is
    /// not a power of two (or a count option below its least value, [`COUNT_OPTIONS`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kfuse_runtime::settings::{self, Config};
    ///
    /// Config::new().tile("BN", 256).sync(true).apply()?;
    /// assert_eq!(settings::current().tiles()?.get("BN"), Some(&256));
    /// assert!(Config::new().tile("BN", 100).apply().is_err()); // not a power of two
    /// settings::clear_config(); // back to the environment's
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn apply(self) -> Result<()> {
        for (name, &v) in self.tiles.iter().flatten().chain(&self.tile) {
            check_tile(name, v).map_err(|m| Error::InvalidArgument(format!("Config::tile: {m}")))?;
        }
        let mut st = state().write().unwrap_or_else(|e| e.into_inner());
        let code = &mut st.code;
        if let Some(t) = self.tiles {
            code.tiles = Some(t);
            code.tile.clear();
        }
        code.tile.extend(self.tile);
        macro_rules! take {
            ($($f:ident),*) => { $( if self.$f.is_some() { code.$f = self.$f; } )* };
        }
        take!(cache_dir, target, autotune, threads, min_blocks, sync);
        st.refresh(false);
        Ok(())
    }
}

/// Drops every setting made in code ([`Config::apply`]): the environment's apply again
/// (as last read; [`reload`] reads it anew).
pub fn clear_config() {
    let mut st = state().write().unwrap_or_else(|e| e.into_inner());
    st.code = Config::default();
    st.refresh(false);
}

/// The settings [`Config::apply`] made in force (`Config::new()` after
/// [`clear_config`]).
pub fn config() -> Config {
    state().read().unwrap_or_else(|e| e.into_inner()).code.clone()
}

/// Why a tile override `name = v` is refused, if it is.
fn check_tile(name: &str, v: u32) -> std::result::Result<(), String> {
    match COUNT_OPTIONS.iter().find(|(n, _)| *n == name) {
        Some(&(_, least)) if v < least => Err(format!("`{name}={v}`: {name} is at least {least}")),
        Some(_) => Ok(()),
        None if !v.is_power_of_two() => Err(format!("`{name}={v}`: a tile size is a power of two")),
        None => Ok(()),
    }
}

fn parse_tiles(v: Option<&str>) -> std::result::Result<BTreeMap<String, u32>, String> {
    let mut out = BTreeMap::new();
    let Some(v) = v else { return Ok(out) };
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parsed = part.split_once('=').and_then(|(k, n)| Some((k.trim().to_string(), n.trim().parse::<u32>().ok()?)));
        match parsed {
            Some((k, n)) => match check_tile(&k, n) {
                Ok(()) => {
                    out.insert(k, n);
                }
                Err(why) => return Err(format!("KFUSE_TILES: {why} (e.g. KFUSE_TILES=BM=128,BN=64,STAGES=3)")),
            },
            None => return Err(format!("KFUSE_TILES: `{part}` is not NAME=SIZE (e.g. KFUSE_TILES=BM=128,BN=64,STAGES=3)")),
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

/// The cache directory for a `KFUSE_CACHE_DIR` value: empty → none, unset → the user
/// cache dir's `kfuse`.
fn cache_dir_from(v: Option<std::ffi::OsString>) -> Option<PathBuf> {
    match v {
        Some(d) if d.is_empty() => None,
        Some(d) => Some(PathBuf::from(d)),
        None => dirs::cache_dir().map(|d| d.join("kfuse")),
    }
}

/// The environment as last read, the code's settings and what they make together.
#[derive(Default)]
struct State {
    env: Option<Arc<Settings>>,
    code: Config,
    effective: Option<Arc<Settings>>,
}

impl State {
    /// Recomputes the settings in force, reading the environment first if `reread` or
    /// never read.
    fn refresh(&mut self, reread: bool) -> Arc<Settings> {
        if reread || self.env.is_none() {
            self.env = Some(Arc::new(Settings::from_env()));
        }
        let env = self.env.as_ref().unwrap();
        let s = if self.code == Config::default() { env.clone() } else { Arc::new(env.overlaid(&self.code)) };
        self.effective = Some(s.clone());
        s
    }
}

fn state() -> &'static RwLock<State> {
    static STATE: OnceLock<RwLock<State>> = OnceLock::new();
    STATE.get_or_init(Default::default)
}

/// The settings in force: the environment as read on the first call (or at the last
/// [`reload`]), with what [`Config::apply`] set over it.
pub fn current() -> Arc<Settings> {
    if let Some(s) = state().read().unwrap_or_else(|e| e.into_inner()).effective.as_ref() {
        return s.clone();
    }
    let mut w = state().write().unwrap_or_else(|e| e.into_inner());
    match &w.effective {
        Some(s) => s.clone(),
        None => w.refresh(false),
    }
}

/// Re-reads the variables: call it after changing one of them in-process (launches
/// before the call keep the old values, launches after it see the new ones). Settings
/// made in code stay over them.
///
/// # Examples
///
/// ```
/// // a program that sets a variable after its first launch
/// std::env::set_var("KFUSE_THREADS", "256");
/// kfuse_runtime::settings::reload();
/// assert_eq!(kfuse_runtime::settings::current().threads()?, Some(256));
/// # Ok::<(), kfuse_runtime::Error>(())
/// ```
pub fn reload() {
    state().write().unwrap_or_else(|e| e.into_inner()).refresh(true);
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
        // the pipeline options that count something need not be powers of two
        let t = parse_tiles(Some("BM=128,STAGES=3,GROUPM=6")).unwrap();
        assert_eq!((t.get("STAGES"), t.get("GROUPM")), (Some(&3), Some(&6)));
        let e = parse_tiles(Some("STAGES=1")).unwrap_err();
        assert!(e.contains("`STAGES=1`") && e.contains("at least 2"), "{e}");
        assert!(parse_tiles(Some("SPLITK=3")).unwrap_err().contains("power of two"));
    }

    #[test]
    fn code_settings_override_the_environment() {
        let env = Settings {
            tiles: Ok([("BM".to_string(), 64), ("BN".to_string(), 64)].into()),
            threads: Err("KFUSE_THREADS: `x` is not a number".into()),
            min_blocks: Ok(Some(2)),
            target: Ok(Some(Target::sm80())),
            cache_dir: Some(PathBuf::from("/env")),
            autotune: false,
            sync: true,
        };
        // nothing set in code: the environment's values
        let s = env.overlaid(&Config::new());
        assert_eq!(s.tiles().unwrap(), env.tiles().unwrap());
        assert_eq!((s.cache_dir(), s.target().unwrap()), (Some(Path::new("/env")), Some(Target::sm80())));
        // single entries go over the variable's, the rest replace it
        let c = Config::new().tile("BN", 128).tile("STAGES", 3).threads(Some(256)).native_target().cache_dir("/code").autotune(true).sync(false);
        let s = env.overlaid(&c);
        assert_eq!(s.tiles().unwrap(), &[("BM".to_string(), 64), ("BN".to_string(), 128), ("STAGES".to_string(), 3)].into());
        assert_eq!((s.threads().unwrap(), s.min_blocks().unwrap(), s.target().unwrap()), (Some(256), Some(2), None));
        assert_eq!((s.cache_dir(), s.autotune, s.sync), (Some(Path::new("/code")), true, false));
        // a whole list replaces the variable's; no disk cache
        let s = env.overlaid(&Config::new().tiles([("BK", 32)]).no_disk_cache());
        assert_eq!(s.tiles().unwrap(), &[("BK".to_string(), 32)].into());
        assert_eq!(s.cache_dir(), None);
    }

    #[test]
    fn bad_code_settings_are_refused() {
        let e = Config::new().tile("BM", 96).apply().unwrap_err().to_string();
        assert!(e.contains("BM=96") && e.contains("power of two"), "{e}");
        let e = Config::new().tiles([("STAGES", 1)]).apply().unwrap_err().to_string();
        assert!(e.contains("STAGES=1") && e.contains("at least 2"), "{e}");
        assert_eq!(config(), Config::new(), "a refused config changes nothing");
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
            cache_dir: None,
            autotune: false,
            sync: false,
        };
        assert!(matches!(s.tiles(), Err(Error::InvalidArgument(m)) if m == "KFUSE_TILES: bad"));
        assert!(matches!(s.threads(), Err(Error::InvalidArgument(m)) if m.contains("not a number")));
        assert_eq!(s.min_blocks().unwrap(), Some(2));
    }
}
