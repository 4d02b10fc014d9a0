//! Types and parsers shared by `libpadll.so`, the `padll` CLI and the controllers.
//! Nothing here intercepts anything: a binary can depend on this crate without
//! exporting the stage's hooks.

pub mod channel;
pub mod config;
pub mod control;
pub mod exit;
pub mod flags;
pub mod latency;
pub mod node_files;
pub mod ops;
pub mod report;
pub mod sync;

use std::path::{Path, PathBuf};

/// FNV-1a: the hash that names job files and shared buckets, the same in every build
/// and process (unlike std's hashers).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// The stage's file name.
pub const STAGE_LIBRARY: &str = "libpadll.so";

/// Where an installation puts the stage, relative to the binaries' directory:
/// `PREFIX/bin` → `PREFIX/lib/padll` (`scripts/install.sh`, the Debian package).
pub const INSTALLED_STAGE_DIR: &str = "../lib/padll";

/// Finds `libpadll.so` for the programs in `bin_dir`: beside them (a cargo target
/// directory, see [`locate_stage_library`]), else in the installed layout
/// ([`INSTALLED_STAGE_DIR`]). Without it, the places looked in.
pub fn find_stage_library(bin_dir: &Path) -> Result<PathBuf, Vec<PathBuf>> {
    if let Some(found) = locate_stage_library(bin_dir) {
        return Ok(found);
    }
    let installed = bin_dir.join(INSTALLED_STAGE_DIR).join(STAGE_LIBRARY);
    match installed.canonicalize() {
        Ok(found) if found.is_file() => Ok(found),
        _ => Err(vec![
            bin_dir.join(STAGE_LIBRARY),
            bin_dir.join("deps").join(STAGE_LIBRARY),
            installed,
        ]),
    }
}

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
