//! Helpers shared by the test modules: the built stage and scratch directories.

use std::path::PathBuf;

/// `libpadll.so`, built beside the `padll` binary under test.
pub fn library() -> PathBuf {
    let profile = PathBuf::from(env!("CARGO_BIN_EXE_padll"));
    padll_wire::locate_stage_library(profile.parent().unwrap()).expect("libpadll.so is built")
}

/// An empty directory of its own for a test: `name` must be unique in this binary (all
/// its tests share one pid).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("padll-stage-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
