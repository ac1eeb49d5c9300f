//! Configuration: the README's table of environment variables against the variables
//! the library's sources read; the README's snapshot example against the test file that
//! runs it; settings made in code (`kfuse::Config`) over the
//! environment's; and `STAGES=3`, a pipeline depth that is no power of two, accepted and
//! built (NVRTC + `ptxas -v`) on the matrix paths of sm_90a and sm_80. No GPU needed.
//! The test of settings over the environment runs alone in a child process
//! (`common::isolation`): it changes both. And the guard of that rule: no source of the
//! workspace changes its process's environment outside the places `ENV_WRITERS` lists,
//! each alone in its process (issue 23).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::gemm::spec_mnk;
use kfuse::codegen::{compile, Target};
use kfuse::runtime::settings::{self, Config};
use kfuse::runtime::{autotune, launch::tile_overrides, ModuleCache};
use kfuse::{DType, Device, Tensor};

/// The library's sources: every crate's `src/` (not its tests, benches or examples).
const LIBRARY_SOURCES: [&str; 6] = ["src", "kfuse-ir/src", "kfuse-macros/src", "kfuse-codegen/src", "kfuse-runtime/src", "ops/src"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The string literals of `src` that are all capitals, digits and underscores (the
/// shape of an environment variable's name), with the byte offset of each.
fn caps_literals(src: &str) -> Vec<(usize, String)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            let start = i + 1;
            let mut j = start;
            while j < b.len() && (b[j].is_ascii_uppercase() || b[j].is_ascii_digit() || b[j] == b'_') {
                j += 1;
            }
            if j < b.len() && b[j] == b'"' && j > start && b[start].is_ascii_uppercase() && src[start..j].contains('_') {
                out.push((start, src[start..j].to_string()));
                i = j + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The environment variables the library's sources read: every `"KFUSE_…"` literal, and
/// every literal passed straight to `env::var` / `env::var_os` (or in an array read that
/// way on the same line). A file's unit tests (from `#[cfg(test)] mod …` on) are left out.
fn variables_read(root: &Path) -> BTreeSet<String> {
    let mut files = Vec::new();
    for d in LIBRARY_SOURCES {
        rust_files(&root.join(d), &mut files);
    }
    assert!(files.len() > 20, "found only {files:?}");
    let mut vars = BTreeSet::new();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        let src = match src.find("#[cfg(test)]\nmod ") {
            Some(i) => &src[..i],
            None => &src[..],
        };
        for (at, lit) in caps_literals(src) {
            let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
            let line_end = src[at..].find('\n').map_or(src.len(), |i| at + i);
            let line = &src[line_start..line_end];
            let before = &src[line_start..at];
            let env_read = before.trim_end().ends_with("env::var(\"") || before.trim_end().ends_with("env::var_os(\"");
            let array_read = line.contains("env::var") && before.contains('[');
            if lit.starts_with("KFUSE_") || env_read || array_read {
                vars.insert(lit);
            }
        }
    }
    vars
}

/// The variables the README's table under `## Environment` names (every backquoted name
/// in its first column).
fn readme_table(readme: &str) -> BTreeSet<String> {
    let section = &readme[readme.find("\n## Environment\n").expect("README: no `## Environment` section")..];
    let mut lines = section.lines().skip(1).skip_while(|l| !l.starts_with("| variable |"));
    assert!(lines.next().is_some(), "README: no `| variable | …` table under Environment");
    let mut names = BTreeSet::new();
    for row in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let first = row.split('|').nth(1).unwrap();
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1 {
                names.insert(part.to_string());
            }
        }
    }
    names
}

/// The first `rust` block of the README's section `heading` (`## …`) and the file `path`,
/// read from the repository.
fn readme_block_and_file(heading: &str, path: &str) -> (String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = &readme[readme.find(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("README: no `{heading}` section"))..];
    let start = section.find("```rust\n").unwrap_or_else(|| panic!("README: no rust block under `{heading}`")) + "```rust\n".len();
    let block = &section[start..start + section[start..].find("```\n").expect("README: an unclosed block")];
    (block.to_string(), std::fs::read_to_string(root.join(path)).unwrap())
}

/// The README's snapshot example (`## Pinning what the compiler emits`) is
/// `tests/readme_snapshot.rs`, character for character: CI runs what the README shows.
#[test]
fn the_readme_snapshot_example_is_the_test_that_runs() {
    let (block, file) = readme_block_and_file("## Pinning what the compiler emits", "tests/readme_snapshot.rs");
    assert_eq!(block, file, "README's snapshot example and tests/readme_snapshot.rs differ");
}

/// The README's quickstart program (`## Quickstart`) is `tests/readme/quickstart.rs`,
/// character for character; that file runs as a doc test of the `kfuse` crate
/// (`src/lib.rs`, `ReadmeQuickstart`).
#[test]
fn the_readme_quickstart_is_the_program_that_runs() {
    let (block, file) = readme_block_and_file("## Quickstart", "tests/readme/quickstart.rs");
    assert_eq!(block, file, "README's quickstart and tests/readme/quickstart.rs differ");
}

#[test]
fn the_readme_lists_every_variable_the_library_reads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = variables_read(root);
    let listed = readme_table(&std::fs::read_to_string(root.join("README.md")).unwrap());
    for must in ["KFUSE_CACHE_DIR", "KFUSE_TILES", "KFUSE_TARGET", "KFUSE_AUTOTUNE", "KFUSE_DEVICE", "CUDA_HOME", "LD_LIBRARY_PATH"] {
        assert!(read.contains(must), "the scan missed {must}: it found {read:?}");
    }
    let unlisted: Vec<_> = read.difference(&listed).collect();
    let unread: Vec<_> = listed.difference(&read).collect();
    assert!(
        unlisted.is_empty() && unread.is_empty(),
        "README's Environment table and the library disagree: read but not listed {unlisted:?}, listed but not read {unread:?}"
    );
    // no variable is documented that nothing reads (`KFUSE_STAGES` was: the pipeline
    // depth is `KFUSE_TILES=STAGES=n`)
    assert!(!listed.contains("KFUSE_STAGES"));
}

#[test]
fn the_scan_sees_literals_and_env_reads() {
    let src = "let a = std::env::var(\"KFUSE_X\");\nlet b = std::env::var_os(\"OTHER_VAR\");\nlet c = [\"CUDA_Y\", \"CUDA_Z\"].iter().filter_map(std::env::var_os);\nlet d = \"NOT_READ\";\nlet e = \"KFUSE_TILES: bad\";\n";
    let lits: Vec<String> = caps_literals(src).into_iter().map(|(_, l)| l).collect();
    assert_eq!(lits, ["KFUSE_X", "OTHER_VAR", "CUDA_Y", "CUDA_Z", "NOT_READ"]);
}

#[test]
fn settings_made_in_code_win_over_the_environment() {
    const NAME: &str = "settings_made_in_code_win_over_the_environment";
    if !common::isolation::is_alone(NAME) {
        let tmp = std::env::temp_dir().join(format!("kfuse-config-{}", std::process::id()));
        let env_dir = tmp.join("env");
        let vars = [
            ("KFUSE_TILES", Some("BM=64,BN=64,STAGES=3".as_ref())),
            ("KFUSE_AUTOTUNE", Some("1".as_ref())),
            ("KFUSE_CACHE_DIR", Some(env_dir.as_os_str())),
            ("KFUSE_TARGET", None),
        ];
        common::isolation::run_alone(NAME, &vars);
        let _ = std::fs::remove_dir_all(&tmp);
        return;
    }
    // alone in a child process started with the variables above
    let env_dir = PathBuf::from(std::env::var_os("KFUSE_CACHE_DIR").unwrap());
    let code_dir = env_dir.with_file_name("code");

    // the environment's values (as the process started) are the defaults
    let s = settings::current();
    assert_eq!(tile_overrides().unwrap(), [("BM".into(), 64), ("BN".into(), 64), ("STAGES".into(), 3)].into());
    assert!(s.autotune);
    assert_eq!(s.cache_dir(), Some(env_dir.as_path()));
    assert_eq!(ModuleCache::default_dir(), Some(env_dir.clone()));
    assert_eq!(ModuleCache::global().dir(), Some(env_dir.as_path()));
    assert_eq!(s.target().unwrap(), None);

    // code wins, entry by entry for the tiles
    Config::new().cache_dir(&code_dir).target(Target::sm80()).autotune(false).tile("BN", 128).apply().unwrap();
    let s = settings::current();
    assert_eq!(tile_overrides().unwrap(), [("BM".into(), 64), ("BN".into(), 128), ("STAGES".into(), 3)].into());
    assert!(!s.autotune);
    assert_eq!(s.target().unwrap(), Some(Target::sm80()));
    assert_eq!(ModuleCache::global().dir(), Some(code_dir.as_path()), "compiles go to the directory set in code");
    assert_eq!(autotune::Store::current().path(), Some(code_dir.join(autotune::FILE)));
    // … what a launch plans with (no GPU needed): BN from code, BM from the environment
    let dev = Device::cpu();
    let a = Tensor::zeros(&[512, 512], DType::BF16, &dev).unwrap();
    let b = Tensor::zeros(&[512, 512], DType::BF16, &dev).unwrap();
    let mut c = Tensor::zeros(&[512, 512], DType::BF16, &dev).unwrap();
    let def = &kfuse::ops::kernels::gemm::DEF;
    let args = [kfuse::runtime::Arg::In(&a), kfuse::runtime::Arg::In(&b), kfuse::runtime::Arg::Out(&mut c)];
    let plan = kfuse::runtime::gpu_plan_tiles(def, &args, &Target::sm90a()).unwrap();
    assert_eq!((plan.get("BM"), plan.get("BN")), (Some(&64), Some(&128)), "{plan:?}");

    // … and stays over a changed, reloaded environment (alone in this process, the
    // test may change it); a later apply changes only what it names
    std::env::set_var("KFUSE_AUTOTUNE", "1");
    std::env::set_var("KFUSE_TILES", "BM=128");
    settings::reload();
    assert!(!settings::current().autotune);
    assert_eq!(tile_overrides().unwrap(), [("BM".into(), 128), ("BN".into(), 128)].into());
    Config::new().tiles([("BK", 32)]).no_disk_cache().apply().unwrap();
    let s = settings::current();
    assert_eq!(tile_overrides().unwrap(), [("BK".into(), 32)].into(), "a whole list replaces KFUSE_TILES");
    assert_eq!((s.cache_dir(), s.autotune, s.target().unwrap()), (None, false, Some(Target::sm80())));
    assert_eq!(ModuleCache::global().dir(), None);

    // a bad setting is refused and changes nothing
    let e = Config::new().tile("BM", 96).autotune(true).apply().unwrap_err().to_string();
    assert!(e.contains("BM=96") && e.contains("power of two"), "{e}");
    assert!(!settings::current().autotune);

    // clearing goes back to the environment
    settings::clear_config();
    assert_eq!(settings::config(), Config::new());
    let s = settings::current();
    assert_eq!(tile_overrides().unwrap(), [("BM".into(), 128)].into());
    assert!(s.autotune);
    assert_eq!((s.cache_dir(), s.target().unwrap()), (Some(env_dir.as_path()), None));
}

#[test]
fn three_pipeline_stages_build_on_sm90a_and_sm80() {
    // STAGES counts stages and sizes no tile (`KFUSE_TILES=STAGES=3` is accepted: the
    // test above); the writers take any count the shared memory holds
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    for (target, shape) in [(Target::sm90a(), (4096, 4096, 4096)), (Target::sm90a(), (127, 4096, 4096)), (Target::sm80(), (4096, 4096, 4096)), (Target::sm89(), (4096, 4096, 4096))] {
        let mut spec = spec_mnk(def, shape.0, shape.1, shape.2);
        spec.tiles.insert("STAGES".into(), 3);
        let e = compile(&k, &spec, &target).unwrap_or_else(|e| panic!("{} {shape:?} STAGES=3: {e}", target.arch()));
        // (the producer warpgroup's TMA rings on sm_90a, `cp.async` rings on sm_80/sm_89)
        let plan = e.plan.to_string();
        assert!(plan.contains("3-stage ring"), "{} {shape:?}: {plan}", target.arch());
        let (regs, spill) = common::assemble(&e.source, &e.arch, &e.options, &format!("gemm_stages3_{}", shape.0)).unwrap_or_else(|e| panic!("{} {shape:?} STAGES=3: {e}", target.arch()));
        assert_eq!(spill, 0, "{} {shape:?} STAGES=3: {spill} bytes of spills ({regs} registers)", target.arch());
    }
}

/// The calls that change the process's environment (each spelt in two halves, so that
/// this file's patterns are not taken for calls).
const ENV_WRITES: [&str; 3] = [concat!("set_", "var("), concat!("remove_", "var("), concat!("set", "env(")];

/// The places of the workspace's sources that may change their process's environment,
/// each `(file, place, why it races with nothing)`; `place` is the function whose body
/// does (it must start by going alone into a child process: `common::isolation`), or
/// `doc test of NAME` for an example in the rustdoc of `NAME`. Anywhere else a write
/// could change what another test of the same binary reads at the same moment (every
/// `KFUSE_*` setting a launch consults, `kfuse::runtime::settings`), or race with a
/// thread that reads the environment (the CUDA libraries'): settings are made in code
/// (`kfuse::Config`) instead, or the test runs alone in a child process, its variables
/// set on the child's command.
const ENV_WRITERS: [(&str, &str, &str); 3] = [
    (
        "tests/settings.rs",
        "settings_are_read_once_and_again_on_reload",
        "alone in a child process of its binary (`isolation::alone`): it checks that a changed variable is seen only after `settings::reload`",
    ),
    (
        "tests/configuration.rs",
        "settings_made_in_code_win_over_the_environment",
        "alone in a child process of its binary (`isolation::is_alone`/`run_alone`): settings made in code stay over a changed, reloaded environment",
    ),
    (
        "kfuse-runtime/src/settings.rs",
        "doc test of reload",
        "a doc test is a program of its own (edition 2021: rustdoc builds and runs each alone), one thread; it shows what a program that changes a variable must call",
    ),
];

/// Every write of the environment in `src` ([`ENV_WRITES`]): its line (from 1) and its
/// place, the function whose body it is in, or `doc test of NAME` inside a fenced block
/// of `NAME`'s rustdoc (`doc test of the module` for `//!`). Comments and doc prose are
/// not calls and are left out.
fn env_writes(src: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = src.lines().collect();
    let (mut out, mut fence, mut last_fn) = (Vec::new(), false, String::from("(no function)"));
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let doc = t.strip_prefix("///").map(|r| (r, false)).or_else(|| t.strip_prefix("//!").map(|r| (r, true)));
        let writes = ENV_WRITES.iter().any(|w| line.contains(w));
        match doc {
            Some((rest, _)) if rest.trim_start().starts_with("```") => fence = !fence,
            Some((_, inner)) if fence && writes => {
                let item = if inner { "the module".to_string() } else { lines[i..].iter().find_map(|l| fn_name(l)).unwrap_or_default() };
                out.push((i + 1, format!("doc test of {item}")));
            }
            Some(_) => {}
            None => {
                fence = false;
                if t.starts_with("//") {
                    continue;
                }
                if let Some(name) = fn_name(line) {
                    last_fn = name;
                }
                if writes {
                    out.push((i + 1, last_fn.clone()));
                }
            }
        }
    }
    out
}

/// The name of the function `line` declares, if it does (`fn NAME(` or `fn NAME<`).
fn fn_name(line: &str) -> Option<String> {
    let code = line.split("//").next().unwrap();
    let at = code.match_indices("fn ").map(|(i, _)| i).find(|&i| i == 0 || !code.as_bytes()[i - 1].is_ascii_alphanumeric() && code.as_bytes()[i - 1] != b'_')?;
    let rest = &code[at + 3..];
    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
    (end > 0 && matches!(rest.as_bytes()[end], b'(' | b'<')).then(|| rest[..end].to_string())
}

/// The workspace's Rust sources (paths relative to `root`, `/`-separated): every crate's
/// sources, tests, benches and examples; build outputs and hidden folders left out.
fn workspace_sources(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.is_dir() && !name.starts_with('.') && name != "target" {
                dirs.push(p);
            } else if name.ends_with(".rs") {
                files.push(p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
            }
        }
    }
    files.sort();
    files
}

/// Issue 23: the tests of one binary run in parallel threads of one process, so a test
/// that changed the environment raced with every other test reading it. Only the places
/// of [`ENV_WRITERS`] may write it, each alone in its process, and each of them does.
#[test]
fn no_test_changes_the_environment_of_other_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = workspace_sources(root);
    for must in ["tests/settings.rs", "tests/common/isolation.rs", "kfuse-runtime/tests/cache_global.rs", "kfuse-runtime/src/settings.rs", "examples/gemm_sustained.rs", "benches/gemm.rs"] {
        assert!(files.iter().any(|f| f == must), "the scan missed {must}: it found {files:?}");
    }
    let mut found = BTreeSet::new();
    let mut stray = Vec::new();
    for f in &files {
        let src = std::fs::read_to_string(root.join(f)).unwrap();
        for (line, place) in env_writes(&src) {
            if ENV_WRITERS.iter().any(|&(file, p, _)| file == f && p == place) {
                found.insert((f.clone(), place));
            } else {
                stray.push(format!("{f}:{line} (in {place})"));
            }
        }
    }
    assert!(
        stray.is_empty(),
        "these change the process's environment, where other tests of the binary (and the CUDA libraries' threads) read it at the same time: make the settings in code (`kfuse::Config` under `common::isolation::SettingsLock`), or run the test alone in a child process with the variables set on its command (`common::isolation::alone`); or, if it is alone in its process, add it to ENV_WRITERS with the reason:\n{}",
        stray.join("\n")
    );
    for (file, place, why) in ENV_WRITERS {
        assert!(found.contains(&(file.to_string(), place.to_string())), "ENV_WRITERS lists {file} ({place}), which writes no variable any more: drop the entry ({why})");
        if place.starts_with("doc test of ") {
            continue;
        }
        // the function goes alone into a child process before its first write
        let src = std::fs::read_to_string(root.join(file)).unwrap();
        let body = &src[src.find(&format!("fn {place}(")).unwrap()..];
        let first = ENV_WRITES.iter().filter_map(|w| body.find(w)).min().unwrap();
        assert!(body[..first].contains("isolation::alone(") || body[..first].contains("isolation::is_alone("), "{file}: `{place}` writes the environment before it runs alone in a child process ({why})");
    }
}

#[test]
fn the_environment_scan_finds_writes_in_code_and_doc_tests() {
    let [set, remove, _] = ENV_WRITES;
    let src = format!(
        "//! prose about `std::env::{set}\"A\")`\n//! ```\n//! std::env::{set}\"A\", \"1\");\n//! ```\n/// ```\n/// std::env::{remove}\"B\");\n/// ```\npub fn reload() {{}}\n\n#[test]\nfn first() {{\n    // std::env::{set}\"C\", \"1\") in a comment\n    let f = |x| x;\n    std::env::{set}\"C\", \"1\");\n}}\n\nfn second<T>() {{\n    unsafe {{ std::env::{remove}\"D\") }};\n}}\n"
    );
    let got = env_writes(&src);
    let want = [(3, "doc test of the module"), (6, "doc test of reload"), (14, "first"), (18, "second")];
    assert_eq!(got, want.map(|(l, p)| (l, p.to_string())), "{src}");
    assert_eq!((fn_name("pub(crate) fn a_b<T>(x: T)"), fn_name("let dfn x(")), (Some("a_b".into()), None));
}
