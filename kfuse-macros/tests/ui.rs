//! The macro's diagnostics, pinned: each `tests/ui/*.rs` must fail to compile with the
//! messages and spans of its `.stderr` (regenerate with
//! `TRYBUILD=overwrite cargo test -p kfuse-macros --test ui`, then read every diff).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
