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

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

/// `text` as a one-line message echoes it: in single quotes, see [`escape`].
pub fn quote<T: AsRef<[u8]> + ?Sized>(text: &T) -> Quoted<'_> {
    Quoted(text.as_ref())
}

/// `text` with what would break or hide in a one-line message escaped: control
/// characters as Rust writes them (`\n`, `\u{1b}`), line and paragraph separators
/// (`\u{2028}`), bytes that are not UTF-8 as `\xNN` (a path or variable may hold
/// any). Everything else is kept as it is.
pub fn escape<T: AsRef<[u8]> + ?Sized>(text: &T) -> Escaped<'_> {
    Escaped(text.as_ref())
}

/// See [`quote`].
pub struct Quoted<'a>(&'a [u8]);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}'", Escaped(self.0))
    }
}

/// See [`escape`].
pub struct Escaped<'a>(&'a [u8]);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
                    write!(f, "{}", c.escape_debug())?;
                } else {
                    f.write_char(c)?;
                }
            }
            for byte in chunk.invalid() {
                write!(f, "\\x{byte:02x}")?;
            }
        }
        Ok(())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_stay_on_one_line() {
        assert_eq!(quote("/scratch").to_string(), "'/scratch'");
        assert_eq!(quote("don't").to_string(), "'don't'");
        assert_eq!(
            quote("a\nb\tc\u{1b}[31m").to_string(),
            "'a\\nb\\tc\\u{1b}[31m'"
        );
        assert_eq!(
            quote("caf\u{e9}\u{2028}").to_string(),
            "'caf\u{e9}\\u{2028}'"
        );
        assert_eq!(quote(b"caf\xe9/x").to_string(), "'caf\\xe9/x'");
        assert_eq!(escape("line `a\rb`").to_string(), "line `a\\rb`");
    }
}
