//! What a test binary runs from other packages of the workspace (`cheferd`, `padll`,
//! `libpadll.so`), built with cargo into the test binary's own target directory and
//! profile (`#[path = "../../scripts/test-cargo.rs"] mod cargo;` in a crate's
//! `tests/util.rs`). `cargo test` builds the binaries of the package under test only,
//! and never uplifts a cdylib, so a test package asks for them itself: once per test
//! binary, a no-op when they are fresh.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `<target>/<profile>`, where cargo put this test binary (in its `deps/`): the target
/// directory `CARGO_TARGET_DIR` or the configuration chose, and the profile the tests
/// were built with.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test executable is in <target>/<profile>/deps")
        .to_path_buf()
}

/// `cargo build -q ARGS` into [`profile_dir`]; fails the test when cargo does.
pub fn build(args: &[&str]) {
    let dir = profile_dir();
    let target = dir.parent().expect("<target>/<profile>");
    let profile = dir.file_name().expect("<profile>").to_string_lossy();
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .arg("build")
        .arg("-q")
        .args(args)
        .arg("--target-dir")
        .arg(target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    // The `dev` profile's directory is `debug`; every other profile's is its name.
    if profile != "debug" {
        cargo.args(["--profile", &profile]);
    }
    let status = cargo.status().expect("cargo runs");
    assert!(status.success(), "{cargo:?} failed");
}
