//! Types and parsers shared by `libpadll.so`, the `padll` CLI and the controllers.
//! Nothing here intercepts anything: a binary can depend on this crate without
//! exporting the stage's hooks.

pub mod channel;
pub mod config;
pub mod control;
pub mod ops;
pub mod report;

use std::path::{Path, PathBuf};

/// The stage's file name.
pub const STAGE_LIBRARY: &str = "libpadll.so";

/// Finds `libpadll.so` for a program installed in `dir` (the directory of `padll`,
/// `cheferd` or a test executable's profile directory).
///
/// Installed, the library sits beside the binaries. In a cargo target directory it is
/// in `<profile>/` after `cargo build`, but only in `<profile>/deps/` after `cargo test`
/// (cargo does not uplift a cdylib built as a dependency); when both exist the newer one
/// wins, so a stale uplifted copy is never preloaded.
pub fn locate_stage_library(dir: &Path) -> Option<PathBuf> {
    [
        dir.join(STAGE_LIBRARY),
        dir.join("deps").join(STAGE_LIBRARY),
    ]
    .into_iter()
    .filter_map(|path| {
        let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
        Some((modified, path))
    })
    .max_by_key(|(modified, _)| *modified)
    .map(|(_, path)| path)
}
