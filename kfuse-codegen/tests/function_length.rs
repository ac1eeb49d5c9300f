//! Issue 20's bar for the code generator: no function in `kfuse-codegen/src` is longer
//! than [`MAX_LINES`] lines. A longer one is split into named parts (see the writers of
//! `cuda/emit/`: a context struct planned first, then one method per part of the text).
//!
//! The scanner is a few lines of text matching, not a parser. It relies on the sources'
//! formatting (rustfmt's): a function item starts on a line of its own — `fn name`,
//! after any of `pub`, `pub(…)`, `const`, `async`, `unsafe`, `extern "…"` — and a body
//! that does not fit on that line closes with a line holding only `}` at the same
//! indentation. A function's length counts its lines from the `fn` line to that closing
//! line, both included (its doc comment and attributes are not counted). A body on the
//! `fn` line itself counts one line; a declaration without a body (`fn f(&self);` in a
//! trait) is not a function here. Braces inside the body (format strings, blocks) do not
//! matter: only where the closing line stands does. A `fn` line whose closing line the
//! scanner cannot find fails the test rather than going unmeasured, and the test checks
//! that it finds a few hundred functions and measures a known one exactly, so that it
//! cannot pass by finding nothing.

use std::path::{Path, PathBuf};

/// The longest a function may be, in lines.
const MAX_LINES: usize = 200;

/// Fewest functions the scanner must find under `src` (there are well over 300).
const MIN_FUNCTIONS: usize = 250;

/// One measured function: where it starts (1-based line) and how many lines it spans.
#[derive(Debug, PartialEq)]
struct Measured {
    name: String,
    line: usize,
    lines: usize,
}

/// The name of the function item that `line` starts, if it starts one.
fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    loop {
        let next = if let Some(r) = rest.strip_prefix("pub(") {
            r.split_once(')').map(|(_, r)| r)
        } else if let Some(r) = rest.strip_prefix("extern \"") {
            r.split_once('"').map(|(_, r)| r)
        } else {
            ["pub ", "const ", "async ", "unsafe "].iter().find_map(|p| rest.strip_prefix(p))
        };
        match next {
            Some(r) => rest = r.trim_start(),
            None => break,
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// Every function of one source text with its length; `Err` names a `fn` line whose
/// end the scanner cannot find.
fn measure(text: &str) -> Result<Vec<Measured>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(name) = fn_name(l) else { continue };
        let indent = &l[..l.len() - l.trim_start().len()];
        // the signature's last line: it opens the body (`{`), ends a declaration (`;`),
        // or holds the whole body (`{ … }` on the `fn` line)
        let Some(sig_end) = (i..lines.len()).find(|&j| {
            let t = lines[j].trim_end();
            t.ends_with('{') || t.ends_with(';') || (j == i && t.ends_with('}') && t.contains('{'))
        }) else {
            return Err(format!("line {}: `fn {name}` without the end of its signature", i + 1));
        };
        let t = lines[sig_end].trim_end();
        if t.ends_with(';') {
            continue;
        }
        if !t.ends_with('{') {
            out.push(Measured { name: name.to_string(), line: i + 1, lines: 1 });
            continue;
        }
        let close = (sig_end + 1..lines.len()).find(|&j| lines[j].strip_prefix(indent).is_some_and(|r| r.trim_end() == "}"));
        let Some(close) = close else {
            return Err(format!("line {}: `fn {name}` without a closing `}}` at its indentation", i + 1));
        };
        out.push(Measured { name: name.to_string(), line: i + 1, lines: close - i + 1 });
    }
    Ok(out)
}

/// The `.rs` files under `dir`, in path order.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())).map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

#[test]
fn no_function_in_the_codegen_sources_is_longer_than_200_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all: Vec<(PathBuf, Measured)> = Vec::new();
    for file in rust_files(&src) {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(&src).unwrap().to_path_buf();
        let found = measure(&text).unwrap_or_else(|e| panic!("src/{}: {e}", rel.display()));
        all.extend(found.into_iter().map(|m| (rel.clone(), m)));
    }
    assert!(all.len() >= MIN_FUNCTIONS, "the scanner found {} functions under src/, expected at least {MIN_FUNCTIONS}", all.len());
    // a function it must measure exactly: `entry_name` of `cuda/emit.rs`, three lines
    let entry = all.iter().find(|(f, m)| f.ends_with("cuda/emit.rs") && m.name == "entry_name").expect("`entry_name` in src/cuda/emit.rs");
    assert_eq!(entry.1.lines, 3, "`entry_name` measured {:?}", entry.1);
    all.sort_by_key(|(_, m)| std::cmp::Reverse(m.lines));
    eprintln!("{} functions measured; the longest:", all.len());
    for (f, m) in all.iter().take(5) {
        eprintln!("{:4} lines  src/{}:{} {}", m.lines, f.display(), m.line, m.name);
    }
    let long: Vec<String> = all
        .iter()
        .filter(|(_, m)| m.lines > MAX_LINES)
        .map(|(f, m)| format!("src/{}:{} `{}` is {} lines", f.display(), m.line, m.name, m.lines))
        .collect();
    assert!(long.is_empty(), "functions longer than {MAX_LINES} lines (split them into named parts):\n{}", long.join("\n"));
}

#[test]
fn the_scanner_measures_signatures_bodies_and_declarations() {
    let text = r#"/// docs
pub(crate) fn multi_line_signature(
    a: u32,
) -> String {
    let s = format!("{{ {} }}", a);
    if a > 0 {
        return s;
    }
    s
}

pub trait T {
    fn declared(&self);
    fn provided(&self) -> u32 {
        1
    }
}

const fn one_line() -> u32 { 1 }
pub unsafe extern "C" fn callback() {
}
const NOT_A_FN: u32 = 1;
"#;
    let m = measure(text).unwrap();
    let got: Vec<(&str, usize, usize)> = m.iter().map(|m| (m.name.as_str(), m.line, m.lines)).collect();
    assert_eq!(got, [("multi_line_signature", 2, 9), ("provided", 14, 3), ("one_line", 19, 1), ("callback", 20, 2)]);
    // a body the scanner cannot close is an error, not a function skipped
    assert!(measure("fn open() {\n    1\n").is_err());
}
