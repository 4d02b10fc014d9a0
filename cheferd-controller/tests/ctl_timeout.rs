//! `cheferd ctl` against a controller that accepts the connection but never answers
//! (hung, or stopped with SIGSTOP): it gives up with exit 69 and a message naming the
//! socket, instead of hanging the administrator's shell.

use std::os::unix::net::UnixListener;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_controller_that_never_answers_is_reported_unavailable() {
    let _turn = crate::util::together();
    let dir = std::env::temp_dir().join(format!("cheferd-ctl-timeout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("admin.sock");
    // Bound and listening, never accepted: connect succeeds, no reply ever comes.
    let _listener = UnixListener::bind(&socket).unwrap();

    let started = Instant::now();
    let out = Command::new(crate::util::cheferd())
        .args(["ctl", "--socket", socket.to_str().unwrap(), "nodes"])
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("did not answer") && stderr.contains("admin.sock"),
        "{stderr}"
    );
    assert!(
        elapsed < Duration::from_secs(60),
        "gave up only after {elapsed:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
