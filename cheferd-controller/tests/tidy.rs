//! ARCHITECTURE.md stays true: every file it names exists, and every source file of the
//! workspace's crates is on its map (a new module gets its line there).

use crate::util::repository;
use std::collections::BTreeSet;
use std::path::Path;

pub(crate) const CRATES: [&str; 4] = [
    "padll-stage",
    "padll-wire",
    "cheferd-controller",
    "policies",
];
/// Endings of what the map names as files (paths of the running system, under `/`, are
/// not files of the repository).
const FILE_ENDINGS: [&str; 8] = [
    ".rs", ".md", ".toml", ".c", ".sh", ".proto", ".service", ".conf",
];

/// Every file below `dir` (not `target/` nor hidden ones), relative to `root`.
fn files_below(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            files_below(root, &path, out);
        } else {
            out.push(path.strip_prefix(root).unwrap().display().to_string());
        }
    }
}

/// What ARCHITECTURE.md writes between backticks.
fn named() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repository().join("ARCHITECTURE.md")).unwrap();
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| !t.contains(char::is_whitespace))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_file_the_architecture_names_exists() {
    let root = repository();
    let mut files = Vec::new();
    files_below(&root, &root, &mut files);
    let missing: Vec<String> = named()
        .into_iter()
        .map(|t| t.split(':').next().unwrap_or_default().to_string())
        .filter(|t| FILE_ENDINGS.iter().any(|e| t.ends_with(e)))
        .filter(|t| !t.starts_with(['/', '$', '~']) && !t.contains(['<', '*']))
        .filter(|t| {
            !files
                .iter()
                .any(|f| f == t || f.ends_with(&format!("/{t}")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names files that do not exist: {missing:?}"
    );
}

#[test]
fn every_source_file_is_on_the_map() {
    let root = repository();
    let named = named();
    let mut absent = Vec::new();
    for krate in CRATES {
        let src = root.join(krate).join("src");
        let mut files = Vec::new();
        files_below(&src, &src, &mut files);
        for file in files.iter().filter(|f| f.ends_with(".rs")) {
            let base = file.rsplit('/').next().unwrap_or(file);
            let full = format!("{krate}/src/{file}");
            if ![file.as_str(), base, full.as_str()]
                .iter()
                .any(|n| named.contains(*n))
            {
                absent.push(full);
            }
        }
    }
    assert!(
        absent.is_empty(),
        "source files missing from ARCHITECTURE.md's map: {absent:?}"
    );
}
