//! Tests and process-wide state. `cargo test` runs the tests of one binary in parallel
//! threads of one process, which share its environment variables and kfuse's settings
//! (`kfuse::runtime::settings`). The rule the tests follow:
//!
//! - No test changes the environment of a test process in which other tests run (a
//!   variable set while another thread, or the CUDA libraries, read the environment is a
//!   data race, and another test's launches would see it). Settings are made in code
//!   (`kfuse::Config`), not through `KFUSE_*` variables.
//! - A test about a variable itself (that it is read, when, and what it overrides) runs in
//!   a child process of its own: [`alone`] (or [`run_alone`]) starts the test binary again
//!   with `--exact NAME` and the variables set on the child's command; in the child that
//!   test is the only one, and may also change the environment with `std::env::set_var`.
//! - `kfuse::Config` is process-wide too: a test that applies one holds the binary's
//!   [`SettingsLock`] (as does every test whose launches those settings would change) and
//!   applies it through [`SettingsLock::apply`], whose guard clears it when dropped, a
//!   panic included.
//!
//! `tests/configuration.rs` keeps the first two: it fails on any write of the environment
//! in the workspace's sources outside the places its `ENV_WRITERS` lists (each of them a
//! test that goes alone into a child process before it writes, or a doc test).

use std::ffi::OsStr;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use kfuse::runtime::settings::{self, Config};

/// Set in a child started by [`run_alone`] to the name of the test it runs.
pub const ALONE: &str = "KFUSE_TEST_ALONE";

/// Whether this process is the child [`run_alone`] started for test `name`.
pub fn is_alone(name: &str) -> bool {
    std::env::var_os(ALONE).is_some_and(|v| v == name)
}

/// Runs test `name` of this test binary in a child process, the only test there, with
/// each of `vars` set (`Some`) or removed (`None`) on top of this process's environment.
/// Panics with the child's output when it fails or when it did not run exactly that one
/// test (a misspelt name); returns its standard output.
#[track_caller]
pub fn run_alone(name: &str, vars: &[(&str, Option<&OsStr>)]) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"]).env(ALONE, name);
    for &(k, v) in vars {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("starting the child for `{name}`: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "`{name}` failed in its own process ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("test result: ok. 1 passed"), "the child ran no test `{name}`:\n{stdout}\n{stderr}");
    stdout.into_owned()
}

/// For a test about the environment: in the test process, runs the test alone in a child
/// ([`run_alone`]) and returns false (the caller returns: the child did the work); in
/// that child, returns true (the caller goes on with its body, alone in its process).
#[track_caller]
pub fn alone(name: &str, vars: &[(&str, Option<&OsStr>)]) -> bool {
    if is_alone(name) {
        return true;
    }
    run_alone(name, vars);
    false
}

/// The binary's lock on kfuse's process-wide settings (see the module docs).
pub struct SettingsLock(MutexGuard<'static, ()>);

impl SettingsLock {
    /// Waits for the other tests of this binary that hold it (a test that panicked
    /// holding it left the settings cleared: the lock is taken over).
    pub fn take() -> SettingsLock {
        static LOCK: Mutex<()> = Mutex::new(());
        SettingsLock(LOCK.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Applies `config` (it must be accepted) until the guard returned is dropped, then
    /// clears every setting made in code (`settings::clear_config`).
    pub fn apply(&self, config: Config) -> Applied<'_> {
        config.apply().expect("a config the test means to be accepted");
        Applied(self)
    }
}

/// Settings made in code, in force until dropped ([`SettingsLock::apply`]).
pub struct Applied<'a>(&'a SettingsLock);

impl Drop for Applied<'_> {
    fn drop(&mut self) {
        settings::clear_config();
    }
}
