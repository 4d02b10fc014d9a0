//! A vfork child runs in its parent's memory: what it does before `exec` must not change
//! how the stage sees the parent (`padll-stage/src/vfork.rs`).

use crate::util::{compile_c, op, reports, run, stage_env, together, Scratch};
use std::path::{Path, PathBuf};

const PROBE: &str = include_str!("vfork_probe.c");

/// A scratch directory holding `file` (world-readable), with the statistics file path
/// beside it.
fn mount_with_file(name: &str) -> (Scratch, PathBuf) {
    let mount = Scratch::new(name);
    std::fs::write(mount.join("file"), b"contents\n").unwrap();
    let stats = mount.path().with_extension("json");
    let _ = std::fs::remove_file(&stats);
    (mount, stats)
}

/// The probe's stdout natively and under the stage: they must be the same.
fn same_outcome(probe: &Path, mount: &Path, mode: &str, stats: &Path) -> String {
    let args = [mount.to_str().unwrap(), mode];
    let native = run(probe.to_str().unwrap(), &args, mount, &[]);
    let staged = run(
        probe.to_str().unwrap(),
        &args,
        mount,
        &stage_env(mount, "all=1M/s", Some(stats)),
    );
    for (what, out) in [("natively", &native), ("under the stage", &staged)] {
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "vfork_probe {mode} {what}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(native.stdout, staged.stdout, "vfork_probe {mode}");
    String::from_utf8_lossy(&staged.stdout).into_owned()
}

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn a_vfork_child_leaves_the_parents_descriptors_and_directory_alone() {
    let _turn = together();
    let (mount, stats) = mount_with_file("vfork-share");
    let build = Scratch::new("vfork-share-build");
    let probe = compile_c(PROBE, build.path(), "vfork_probe");
    same_outcome(&probe, mount.path(), "share", &stats);
    let reports = reports(&stats);
    assert_eq!(reports.len(), 1, "the child wrote no statistics of its own");
    // The parent's read and relative stat after the child closed its descriptor,
    // reused the number and changed directory are still managed; the child's calls are
    // not counted at all.
    assert_eq!(
        op(&reports, "read").managed,
        2,
        "{:?}",
        op(&reports, "read")
    );
    assert_eq!(op(&reports, "getattr").managed, 2);
    assert_eq!(op(&reports, "close").managed, 1);
    assert_eq!(
        op(&reports, "open").passthrough,
        0,
        "the child's open counted"
    );
    let _ = std::fs::remove_file(stats);
}

#[test]
#[cfg_attr(not(all(has_cc, has_root)), ignore = "cc not installed, or not root")]
fn a_failed_vfork_returns_glibcs_result_and_errno() {
    let _turn = together();
    let (mount, stats) = mount_with_file("vfork-fail");
    let build = Scratch::new("vfork-fail-build");
    let probe = compile_c(PROBE, build.path(), "vfork_probe");
    let out = same_outcome(&probe, mount.path(), "fail", &stats);
    assert_eq!(out.trim(), format!("result=-1 errno={}", libc::EAGAIN));
    // The stage goes on after it: the stat that follows is managed.
    assert_eq!(op(&reports(&stats), "getattr").managed, 1);
    let _ = std::fs::remove_file(stats);
}

/// The case users meet: Python's `subprocess` launches through `vfork`, and its child
/// closes descriptors and changes directory (`cwd=`) before `exec`.
#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn python_subprocess_leaves_the_parent_managed() {
    let _turn = together();
    let script = r#"
import os, subprocess, sys
os.chdir(sys.argv[1])
fd = os.open("file", os.O_RDONLY)
def calls():
    for _ in range(5):
        os.pread(fd, 8, 0)
        os.stat("file")
calls()
if sys.argv[2] == "spawn":
    subprocess.run(["true"], cwd="/", check=True)
calls()
os.close(fd)
"#;
    let mut managed = Vec::new();
    for mode in ["alone", "spawn"] {
        let (mount, stats) = mount_with_file(&format!("vfork-python-{mode}"));
        let env = stage_env(mount.path(), "all=1M/s", Some(&stats));
        let out = run(
            "python3",
            &["-c", script, mount.path().to_str().unwrap(), mode],
            mount.path(),
            &env,
        );
        assert!(
            out.status.success(),
            "python3 ({mode}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let reports = reports(&stats);
        managed.push((
            op(&reports, "read").managed,
            op(&reports, "getattr").managed,
        ));
        let _ = std::fs::remove_file(stats);
    }
    assert!(managed[0].0 >= 10 && managed[0].1 >= 10, "{managed:?}");
    assert_eq!(
        managed[1], managed[0],
        "(reads, stats) managed without and with a subprocess in between"
    );
}
