//! The git commit a binary is built from, for its `--version`, set by the build
//! scripts of the crates with binaries
//! (`#[path = "../scripts/git-commit.rs"] mod git_commit;` in `build.rs`).

use std::path::PathBuf;
use std::process::Command;

/// Sets `PADLL_GIT_COMMIT` for the crate (`env!("PADLL_GIT_COMMIT")`): the short hash
/// of `HEAD`, or `unknown` outside a git checkout (a source tarball, `cargo install`
/// from a registry) or without git. Cargo builds again when `HEAD` moves.
pub fn emit() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo::rustc-env=PADLL_GIT_COMMIT={commit}");
    // HEAD names the branch; the branch's ref file (or packed-refs) moves on commit.
    // `--git-path` resolves both for linked worktrees too.
    for name in ["HEAD", "packed-refs"] {
        watch(name);
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(&branch);
    }
}

fn watch(git_path: &str) {
    if let Some(path) = git(&["rev-parse", "--git-path", git_path]) {
        let path = PathBuf::from(path);
        if path.exists() {
            println!("cargo::rerun-if-changed={}", path.display());
        }
    }
}

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_string())
}
