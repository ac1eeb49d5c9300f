//! Issue 20's boundary bar: `kfuse-ir/src` names no target instruction or mechanism.
//! The IR knows tiles, dtypes, shapes and layouts; the instructions a target has
//! (WGMMA, mma.sync, ldmatrix), its copies (TMA, cp.async, mbarriers) and its block
//! groups (thread-block clusters) are `kfuse-codegen`'s.
//!
//! The check reads every source file under `src` (comments included: a doc that
//! explains the IR in a target's terms is the same leak) and looks for the words
//! below, case-insensitively. It also checks that it read the files it should, so that
//! it cannot pass by reading nothing.

use std::path::{Path, PathBuf};

/// Words that name a target's instructions or mechanisms.
const TARGET_WORDS: [&str; 12] =
    ["wgmma", "mma.sync", "mma_sync", "ldmatrix", "tma", "cp.async", "mbarrier", "cluster", "setmaxnreg", "hgmma", "sm_90", "sm_80"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether `word` stands in `line` as a word of its own (not inside a longer
/// identifier: `tma` in `format` or `utmatrix` does not count).
fn names(line: &str, word: &str) -> bool {
    let l = line.to_ascii_lowercase();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    l.match_indices(word).any(|(i, _)| {
        let before = l[..i].chars().next_back();
        let after = l[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(|c| ident(c) && !word.ends_with('_'))
    })
}

#[test]
fn the_word_check_finds_what_it_should() {
    assert!(names("/// TMA loads", "tma"));
    assert!(names("pub cluster: u32,", "cluster"));
    assert!(names("Wgmma(", "wgmma"));
    assert!(names("uses mma.sync here", "mma.sync"));
    assert!(!names("format!(\"{x}\")", "tma"));
    assert!(!names("let clustered_ops = 1;", "cluster"));
}

#[test]
fn ir_sources_name_no_target_instruction() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let read: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for want in ["schedule.rs", "print.rs", "verify.rs", "kernel.rs", "interp.rs"] {
        assert!(read.iter().any(|f| f == want), "{want} not found under {}: {read:?}", src.display());
    }
    let mut found = Vec::new();
    for p in &files {
        let text = std::fs::read_to_string(p).unwrap();
        for (n, line) in text.lines().enumerate() {
            for w in TARGET_WORDS {
                if names(line, w) {
                    found.push(format!("{}:{}: `{w}`: {}", p.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "kfuse-ir names target facts (they belong in kfuse-codegen):\n{}", found.join("\n"));
}
