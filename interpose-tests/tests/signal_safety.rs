//! `open`, `close`, `dup`, `fchdir` and `chdir` are async-signal-safe: a signal handler
//! may call them while the thread it interrupted holds the allocator's lock. The stage
//! keeps the paths of directory descriptors and of the current directory, under and
//! above a mountpoint; keeping them must never reach `malloc` or `free`, or such a
//! program hangs (`padll-stage/src/path_pool.rs`).

use crate::util::{compile_c, library, together, Scratch};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PROGRAM: &str = include_str!("signal_safety.c");

/// Far beyond what the program takes even on a loaded machine (it stops by itself
/// after 60 s): only a hang reaches it.
const HANG: Duration = Duration::from_secs(180);

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn directory_calls_in_a_signal_handler_that_interrupted_malloc_finish() {
    let _turn = together();
    let root = Scratch::new("signal-safety");
    let mount = root.join("mnt");
    let under = mount.join("sub");
    std::fs::create_dir_all(&under).unwrap();
    let build = Scratch::new("signal-safety-build");
    let program = compile_c(PROGRAM, build.path(), "signal_safety");
    let mut child = Command::new(&program)
        .args([&under, &mount, root.path()])
        .arg("3000")
        .current_dir(build.path())
        .env("LD_PRELOAD", library())
        .env("PADLL_MOUNTS", &mount)
        .env("PADLL_RULES", "all=1G/s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("signal_safety");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the program hung for {} s: a hook called in a signal handler waited on \
                 the allocator the handler interrupted",
                HANG.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status}: {stdout}{stderr}");
    assert_eq!(stdout, "ok failed=0\n", "{stderr}");
    assert_eq!(stderr, "");
}
