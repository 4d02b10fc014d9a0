//! Shared harness: locate (building if needed) `libpadll.so`, run commands natively and
//! under the stage, snapshot directory trees, read statistics.

use padll_wire::report::{self, OpStats, Report};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

#[path = "../../scripts/test-turns.rs"]
mod turns;
pub use turns::{alone, together};

#[path = "../../scripts/test-clocks.rs"]
pub mod clocks;

#[path = "../../scripts/test-cargo.rs"]
mod cargo;

#[path = "../../scripts/test-moosefs.rs"]
pub mod moosefs;

/// The stage library, built once per test binary.
pub fn library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        cargo::build(&["-p", "padll-stage"]);
        let library = cargo::profile_dir().join("libpadll.so");
        assert!(
            library.is_file(),
            "no {} after building it",
            library.display()
        );
        library
    })
}

/// The probe binary.
pub fn probe() -> &'static str {
    env!("CARGO_BIN_EXE_padll-probe")
}

/// A fresh, empty directory for one test, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        Scratch::under(&std::env::temp_dir(), name)
    }

    /// A scratch directory under `base` (e.g. `/dev/shm`, a tmpfs).
    pub fn under(base: &Path, name: &str) -> Scratch {
        let dir = base.join(format!("padll-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The stage's environment: `mount` managed with `rules`, statistics as JSON to `stats`.
pub fn stage_env(mount: &Path, rules: &str, stats: Option<&Path>) -> Vec<(String, String)> {
    let mut env = vec![
        ("LD_PRELOAD".to_string(), library().display().to_string()),
        ("PADLL_MOUNTS".to_string(), mount.display().to_string()),
    ];
    if !rules.is_empty() {
        env.push(("PADLL_RULES".into(), rules.into()));
    }
    if let Some(stats) = stats {
        env.push(("PADLL_STATS".into(), stats.display().to_string()));
    }
    env
}

/// The C program `source` (its text) compiled with `cc -O1` into `dir` as `name`.
pub fn compile_c(source: &str, dir: &Path, name: &str) -> PathBuf {
    let file = dir.join(format!("{name}.c"));
    std::fs::write(&file, source).unwrap();
    let program = dir.join(name);
    let status = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&program)
        .arg(&file)
        .status()
        .expect("cc");
    assert!(status.success(), "cc {name}.c failed");
    program
}

/// Runs `program args` in `cwd` with `env` added.
pub fn run(program: &str, args: &[&str], cwd: &Path, env: &[(String, String)]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(cwd)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// The probe's `key=value` output as a map (exits the test on failure).
pub fn probe_run(
    scenario: &str,
    dir: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> BTreeMap<String, f64> {
    let mut all = vec![scenario, dir.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run(probe(), &all, dir, env);
    assert!(
        out.status.success(),
        "padll-probe {scenario} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "the stage wrote to stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(f64::NAN)))
        .collect()
}

/// Reports in a JSON statistics file (one line per process).
pub fn reports(path: &Path) -> Vec<Report> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no statistics at {}: {e}", path.display()));
    report::parse(&text).expect("statistics JSON")
}

/// The summed counters of one operation over all reports.
pub fn op(reports: &[Report], name: &str) -> OpStats {
    report::total(reports)
        .into_iter()
        .find(|r| r.op == name)
        .unwrap_or_default()
}

/// A directory tree as (relative path → kind, size, mode, content hash), for comparing
/// a native run with a run under the stage.
pub fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let relative = path.strip_prefix(root).unwrap().display().to_string();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o7777;
        let description = if meta.file_type().is_symlink() {
            format!(
                "link -> {}",
                std::fs::read_link(&path)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default()
            )
        } else if meta.is_dir() {
            walk(root, &path, out);
            format!("dir {mode:o}")
        } else {
            let content = std::fs::read(&path).unwrap_or_default();
            format!("file {mode:o} {} {:016x}", content.len(), fnv(&content))
        };
        out.insert(relative, description);
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}
