//! The controllers as services: one line at start naming what they serve, a second
//! controller on a live socket refused while the first keeps answering, and the
//! socket removed and one line logged when SIGTERM or SIGINT stops them.

mod common;

use common::{cheferd, run_with_timeout, wait_for};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// A controller started by a test, its stderr in `log`; killed if the test ends first.
struct Controller {
    child: Child,
    log: PathBuf,
}

impl Controller {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Controller {
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(cheferd())
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("cheferd starts");
        Controller { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its log has a line with `message`, the version and commit, and every one of
    /// `needles`.
    fn assert_start_line(&self, message: &str, needles: &[&str]) {
        let log = self.log();
        let line = log
            .lines()
            .find(|l| l.contains(message))
            .unwrap_or_else(|| panic!("no '{message}' in:\n{log}"));
        let version = format!("version=\"{} (commit ", env!("CARGO_PKG_VERSION"));
        for needle in needles.iter().chain([&version.as_str()]) {
            assert!(line.contains(needle), "{needle} missing from: {line}");
        }
    }

    /// Sends `signal` and waits for the process to end.
    fn stop(&mut self, signal: libc::c_int) -> ExitStatus {
        // SAFETY: kill has no memory arguments; the pid is our own unreaped child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
        self.wait()
    }

    /// Waits (30 s at most) for the process to end.
    fn wait(&mut self) -> ExitStatus {
        wait_for(Duration::from_secs(30), "the controller to exit", || {
            self.child.try_wait().expect("wait")
        })
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn global_args<'a>(config: &'a str, admin: &'a str) -> Vec<&'a str> {
    vec![
        "global",
        "--config",
        config,
        "--listen",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
        "--insecure-plaintext",
        "--admin-socket",
        admin,
    ]
}

fn ctl_nodes(admin: &str) -> std::process::Output {
    let mut command = Command::new(cheferd());
    command.args(["ctl", "--socket", admin, "nodes"]);
    run_with_timeout(&mut command, Duration::from_secs(30))
}

/// The global controller logs its version, configuration, addresses and admin socket
/// at start; a second one on the same admin socket exits non-zero naming it, and the
/// first still answers; SIGTERM stops the first, logs it and removes the socket.
#[test]
fn global_refuses_a_live_admin_socket_and_removes_its_own_at_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("global.toml");
    std::fs::write(
        &config,
        "[[resource]]\nname = \"/scratch:metadata\"\nmax_rate = \"1k\"\npolicy = \"uniform\"\n",
    )
    .unwrap();
    let admin = dir.path().join("admin.sock");
    let (config, admin) = (config.to_str().unwrap(), admin.to_str().unwrap());
    let mut first = Controller::start(dir.path(), "first", &global_args(config, admin));
    wait_for(Duration::from_secs(30), "the global controller", || {
        ctl_nodes(admin).status.success().then_some(())
    });
    first.assert_start_line(
        "global controller started",
        &[config, admin, "listen=127.0.0.1:", "metrics=127.0.0.1:"],
    );

    let mut second = Controller::start(dir.path(), "second", &global_args(config, admin));
    let status = second.wait();
    let refused = second.log();
    assert!(!status.success(), "a second global started: {refused}");
    assert!(
        refused.contains(&format!(
            "refusing the socket {admin}: a running controller answers on it"
        )),
        "{refused}"
    );
    assert!(
        ctl_nodes(admin).status.success(),
        "the first stopped answering"
    );

    let status = first.stop(libc::SIGTERM);
    assert!(status.success(), "{status:?}\n{}", first.log());
    assert!(
        !Path::new(admin).exists(),
        "the admin socket was left behind"
    );
    assert!(
        first
            .log()
            .contains("global controller stopped signal=\"SIGTERM\""),
        "{}",
        first.log()
    );
}

/// The local controller logs its version and socket at start, and at SIGINT (Ctrl-C)
/// removes its socket and logs its stop.
#[test]
fn local_removes_its_socket_at_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("local.sock");
    let mut local = Controller::start(
        dir.path(),
        "local",
        &[
            "local",
            "--node",
            "n1",
            "--global",
            "http://127.0.0.1:1",
            "--insecure-plaintext",
            "--socket",
            socket.to_str().unwrap(),
        ],
    );
    wait_for(Duration::from_secs(30), "the local socket", || {
        UnixStream::connect(&socket).ok()
    });
    local.assert_start_line("local controller started", &[socket.to_str().unwrap()]);
    let status = local.stop(libc::SIGINT);
    assert!(status.success(), "{status:?}\n{}", local.log());
    assert!(!socket.exists(), "the socket was left behind");
    assert!(
        local
            .log()
            .contains("local controller stopped signal=\"SIGINT\""),
        "{}",
        local.log()
    );
}
