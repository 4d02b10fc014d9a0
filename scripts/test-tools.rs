//! What the tests of a crate need from the machine, probed by the build script of the
//! package the tests are (`#[path = "…/scripts/test-tools.rs"] mod tools;` in
//! `build.rs`): `padll-stage/tests`, `cheferd-controller/tests`, `interpose-tests`.
//! Never by a crate that ships: the probe reruns whenever the machine changes, and the
//! crate with it.
//!
//! For every tool found, [`probe`] emits `cfg(has_<name>)` (`-` becomes `_`: `has_stress_ng`),
//! and a test states what it needs in one line:
//!
//! ```ignore
//! #[cfg_attr(not(has_fio), ignore = "fio not installed")]
//! ```
//!
//! so without the tool `cargo test` prints `test … ignored, fio not installed` and
//! counts it under "N ignored" instead of passing it. With `CI=true` (or `CI=1`) every
//! cfg is emitted: each test runs, and one whose tool is missing fails. The probe is
//! redone when `PATH` or `CI` change, and when a directory on `PATH` (or a probed
//! file's directory) changes, e.g. when a package is installed.

#![allow(dead_code)] // each build script uses what its tests need

use std::path::{Path, PathBuf};

/// Something a test needs.
pub enum Need {
    /// An executable found on `PATH`.
    Program(&'static str),
    /// A file, e.g. a shared library: `File("libjemalloc", "/usr/lib/…/libjemalloc.so.2")`.
    File(&'static str, &'static str),
    /// Running as root (`has_root`).
    Root,
    /// A character device this user can open for reading and writing:
    /// `Device("fuse", "/dev/fuse")`.
    Device(&'static str, &'static str),
    /// Several needs under one name, met when all of them are: `All("moosefs", &[…])`.
    All(&'static str, &'static [Need]),
}

impl Need {
    fn name(&self) -> &'static str {
        match self {
            Need::Program(name)
            | Need::File(name, _)
            | Need::Device(name, _)
            | Need::All(name, _) => name,
            Need::Root => "root",
        }
    }

    /// What is missing when this need is not met: `fio`, `libjemalloc (no FILE)`,
    /// `moosefs (no mfsmaster, /dev/fuse)`; `None` for root, which is not installed.
    fn absent(&self, path: &[PathBuf]) -> Option<String> {
        match self {
            Need::Program(name) => Some(name.to_string()),
            Need::File(name, file) => Some(format!("{name} (no {file})")),
            Need::Device(name, device) => Some(format!("{name} (cannot open {device} read-write)")),
            Need::All(name, parts) => {
                let missing: Vec<&str> = parts
                    .iter()
                    .filter(|part| !part.found(path))
                    .map(|part| match part {
                        Need::Program(name) => *name,
                        Need::File(_, file) | Need::Device(_, file) => *file,
                        Need::Root | Need::All(..) => part.name(),
                    })
                    .collect();
                Some(format!("{name} (no {})", missing.join(", ")))
            }
            Need::Root => None,
        }
    }

    fn found(&self, path: &[PathBuf]) -> bool {
        match self {
            Need::Program(name) => path.iter().any(|dir| is_executable(&dir.join(name))),
            Need::File(_, file) => Path::new(file).is_file(),
            Need::Device(_, device) => {
                use std::os::unix::fs::FileTypeExt;
                let opened = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(device);
                opened.is_ok_and(|file| {
                    file.metadata()
                        .is_ok_and(|meta| meta.file_type().is_char_device())
                })
            }
            Need::Root => effective_uid() == Some(0),
            Need::All(_, parts) => parts.iter().all(|part| part.found(path)),
        }
    }

    /// Whether finding it searches `PATH`.
    fn searches_path(&self) -> bool {
        match self {
            Need::Program(_) => true,
            Need::All(_, parts) => parts.iter().any(Need::searches_path),
            Need::File(..) | Need::Device(..) | Need::Root => false,
        }
    }

    /// The files it looks for outside `PATH`.
    fn files(&self) -> Vec<&'static str> {
        match self {
            Need::File(_, file) | Need::Device(_, file) => vec![*file],
            Need::All(_, parts) => parts.iter().flat_map(Need::files).collect(),
            Need::Program(_) | Need::Root => Vec::new(),
        }
    }
}

/// A throwaway MooseFS (`scripts/moosefs.sh`, `scripts/test-moosefs.rs`): its daemons,
/// mount and admin tool, the util-linux and iproute2 tools that give it namespaces of its
/// own, root, and a `/dev/fuse` to mount with.
pub const MOOSEFS: Need = Need::All(
    "moosefs",
    &[
        Need::Program("mfsmaster"),
        Need::Program("mfschunkserver"),
        Need::Program("mfsmount"),
        Need::Program("mfscli"),
        Need::Program("mfssettrashtime"),
        Need::Program("mfssetgoal"),
        Need::Program("unshare"),
        Need::Program("nsenter"),
        Need::Program("setpriv"),
        Need::Program("ip"),
        Need::Root,
        Need::Device("fuse", "/dev/fuse"),
    ],
);

/// True when the build runs under CI (`CI=true` or `CI=1`, as CI services set it).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Emits `cfg(has_<name>)` for every need that is met (every one under CI), declares
/// them all to rustc's cfg checker, and tells cargo when to probe again.
pub fn probe(needs: &[Need]) {
    let ci = is_ci();
    println!("cargo::rerun-if-env-changed=CI");
    // This file is compiled into the build script: cargo reruns it when either changes.
    println!("cargo::rerun-if-changed=build.rs");
    let path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let mut watched: Vec<PathBuf> = Vec::new();
    let mut watch = |dir: &Path| {
        // `/bin` is often `/usr/bin`: watch each directory once.
        if let Ok(dir) = dir.canonicalize() {
            if dir.is_dir() && !watched.contains(&dir) {
                println!("cargo::rerun-if-changed={}", dir.display());
                watched.push(dir);
            }
        }
    };
    if needs.iter().any(Need::searches_path) {
        println!("cargo::rerun-if-env-changed=PATH");
        path.iter().for_each(|dir| watch(dir));
    }
    let (mut absent, mut not_root) = (Vec::new(), false);
    for need in needs {
        for file in need.files() {
            if let Some(dir) = Path::new(file).parent() {
                watch(dir);
            }
        }
        let cfg = format!("has_{}", need.name().replace(['-', '.'], "_"));
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        let found = need.found(&path);
        if found || ci {
            println!("cargo::rustc-cfg={cfg}");
        }
        if !found {
            match need.absent(&path) {
                Some(what) => absent.push(what),
                None => not_root = true,
            }
        }
    }
    // One line per crate: every build prints it, the demo's included.
    let mut missing = Vec::new();
    if !absent.is_empty() {
        missing.push(format!("not installed: {}", absent.join(", ")));
    }
    if not_root {
        missing.push("not running as root".to_string());
    }
    if !missing.is_empty() {
        let consequence = if ci {
            "CI is set, so the tests that need them run and fail"
        } else {
            "the tests that need them are ignored (docs/tests.md)"
        };
        println!("cargo::warning={}; {consequence}", missing.join(", "));
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The build's effective uid, from `/proc/self/status` (no libc in build scripts).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}
