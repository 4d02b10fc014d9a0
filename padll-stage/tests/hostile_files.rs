//! Issue 8, attack 16: `PADLL_CONFIG` pointing at `/dev/zero` or a FIFO, and
//! `PADLL_STATS` naming a FIFO. The program must run (unthrottled for a bad
//! configuration), never hang or balloon, and the stage says why in one line naming
//! the value.

use crate::util::{library, scratch};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated CString alive across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Runs `padll --version` (which ends through `exit` and keeps stderr open, so
/// statistics are written and the stage can complain; coreutils close stderr) under the
/// stage with `env`; returns (stdout, stderr, its peak RSS in KiB), failing if it takes
/// longer than 20 s. The RSS is this child's own (`wait4`), not the largest of every
/// child the test process reaped (`cargo build` among them).
#[expect(
    clippy::zombie_processes,
    reason = "reaped by wait4, which clippy does not see"
)]
fn run(env: &[(&str, &str)]) -> (String, String, u64) {
    let mut child = Command::new(crate::util::padll())
        .arg("--version")
        .env("LD_PRELOAD", library())
        .env_remove("PADLL_RULES")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().unwrap()));
    let stderr = read_all(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid plain data.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `usage` are valid out-pointers; `pid` is our own child.
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if reaped == pid {
            break (status, usage);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the program hung under {env:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{env:?}: wait status {status:#x}"
    );
    (
        stdout.join().unwrap(),
        stderr.join().unwrap(),
        usage.ru_maxrss as u64,
    )
}

#[test]
fn config_from_dev_zero_or_a_fifo_is_refused_in_one_line() {
    let dir = scratch("config");
    let fifo = dir.join("config.fifo");
    mkfifo(&fifo);
    for value in ["/dev/zero", fifo.to_str().unwrap(), dir.to_str().unwrap()] {
        let (stdout, stderr, rss_kib) = run(&[("PADLL_CONFIG", value)]);
        assert!(stdout.starts_with("padll "), "{value}: {stdout}");
        assert_eq!(stderr.lines().count(), 1, "{value}: {stderr}");
        assert!(
            stderr.contains(&format!("'{value}'")) && stderr.contains("unthrottled"),
            "{value}: {stderr}"
        );
        assert!(rss_kib < 200 * 1024, "{value}: peak RSS {rss_kib} KiB");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn statistics_to_a_fifo_or_through_a_symlink_never_hang() {
    let dir = scratch("stats");
    let fifo = dir.join("stats.fifo");
    mkfifo(&fifo);
    let link = dir.join("stats.link");
    std::os::unix::fs::symlink(dir.join("elsewhere.json"), &link).unwrap();
    let mount = dir.display().to_string();
    for value in [fifo.to_str().unwrap(), link.to_str().unwrap()] {
        let (stdout, stderr, _) = run(&[("PADLL_MOUNTS", &mount), ("PADLL_STATS", value)]);
        assert!(stdout.starts_with("padll "), "{value}: {stdout}");
        assert_eq!(stderr.lines().count(), 1, "{value}: {stderr}");
        assert!(stderr.contains(value), "{value}: {stderr}");
    }
    assert!(
        !dir.join("elsewhere.json").exists(),
        "written through the link"
    );
    // A regular file still gets its statistics.
    let good = dir.join("good.json");
    let (_, stderr, _) = run(&[
        ("PADLL_MOUNTS", &mount),
        ("PADLL_STATS", good.to_str().unwrap()),
    ]);
    assert_eq!(stderr, "");
    assert!(std::fs::read_to_string(&good).unwrap().contains("\"ops\""));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A statistics file another user (uid 65534) made, world-writable, in a sticky
/// directory every user may write (the documented `/tmp/job-%j.json` is a name anyone
/// can guess) is refused in one line naming it, and gets nothing; the job's own file
/// there is written.
#[test]
#[cfg_attr(not(has_root), ignore = "needs root to plant a file as another user")]
fn statistics_into_a_file_another_user_planted_in_a_shared_directory_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("planted");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let planted = dir.join("job-4711.json");
    std::fs::write(&planted, "").unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    let mount = dir.display().to_string();
    let (stdout, stderr, _) = run(&[
        ("PADLL_MOUNTS", &mount),
        ("PADLL_STATS", planted.to_str().unwrap()),
    ]);
    assert!(stdout.starts_with("padll "), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // Where the kernel enforces `fs.protected_regular` it refuses the open itself.
    let kernel_refuses = std::fs::read_to_string("/proc/sys/fs/protected_regular")
        .is_ok_and(|value| value.trim() != "0");
    assert!(
        stderr.contains(planted.to_str().unwrap())
            && (kernel_refuses || stderr.contains("uid 65534")),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), "");
    let own = dir.join("job-4712.json");
    let (_, stderr, _) = run(&[
        ("PADLL_MOUNTS", &mount),
        ("PADLL_STATS", own.to_str().unwrap()),
    ]);
    assert_eq!(stderr, "");
    assert!(std::fs::read_to_string(&own).unwrap().contains("\"ops\""));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A mountpoint holding a newline (a legal path) is echoed escaped: the stage's lines
/// stay one line each.
#[test]
fn a_mountpoint_with_a_newline_is_echoed_on_one_line() {
    let (stdout, stderr, _) = run(&[("PADLL_MOUNTS", "/tmp/a\nb"), ("PADLL_LOG", "info")]);
    assert!(stdout.starts_with("padll "), "{stdout}");
    let managing: Vec<&str> = stderr.lines().filter(|l| l.contains("managing")).collect();
    assert_eq!(managing.len(), 1, "{stderr}");
    assert!(
        managing[0].contains("managing '/tmp/a\\nb' with"),
        "{stderr}"
    );
    assert!(
        stderr.lines().all(|l| l.starts_with("padll[")),
        "every line is the stage's own: {stderr}"
    );
}

/// A `PADLL_*` value that is not UTF-8 (a Latin-1 mountpoint) is named in one line,
/// not taken as unset without a word.
#[test]
fn a_variable_that_is_not_utf8_is_named() {
    use std::os::unix::ffi::OsStrExt;
    let env = [
        ("PADLL_MOUNTS", std::ffi::OsStr::from_bytes(b"/tmp/caf\xe9")),
        ("PADLL_RULES", "open=5".as_ref()),
    ];
    crate::util::refused_in_one_line(
        &env,
        "running unthrottled: PADLL_MOUNTS: '/tmp/caf\\xe9' is not UTF-8",
    );
}
