//! The controllers as services: one line at start naming what they serve, a second
//! controller on a live socket refused while the first keeps answering, and the
//! socket removed and one line logged when SIGTERM or SIGINT stops them.

use crate::util::{cheferd, run_with_timeout, wait_for};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

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
    /// `needles`. The socket answers before the line is written, and on a busy
    /// machine the line may come a while later: it is waited for (30 s at most).
    fn assert_start_line(&self, message: &str, needles: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let line = loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|l| l.contains(message)) {
                break line.to_string();
            }
            assert!(Instant::now() < deadline, "no '{message}' in:\n{log}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let version = format!("version=\"{} (commit ", env!("CARGO_PKG_VERSION"));
        for needle in needles.iter().chain([&version.as_str()]) {
            assert!(line.contains(needle), "{needle} missing from: {line}");
        }
    }

    /// Sends `signal`; the process must exit 0, having removed `socket` and logged
    /// `stop_line`.
    fn stop_cleanly(&mut self, signal: libc::c_int, socket: &Path, stop_line: &str) {
        // SAFETY: kill has no memory arguments; the pid is our own unreaped child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
        let status = self.wait();
        let log = self.log();
        assert!(status.success(), "{status:?}\n{log}");
        assert!(!socket.exists(), "{} was left behind", socket.display());
        assert!(log.contains(stop_line), "no '{stop_line}' in:\n{log}");
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
    let _turn = crate::util::together();
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

    first.stop_cleanly(
        libc::SIGTERM,
        Path::new(admin),
        "global controller stopped signal=\"SIGTERM\"",
    );
}

/// The local controller logs its version and socket at start, and at SIGINT (Ctrl-C)
/// removes its socket and logs its stop.
#[test]
fn local_removes_its_socket_at_sigint() {
    let _turn = crate::util::together();
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
    local.stop_cleanly(
        libc::SIGINT,
        &socket,
        "local controller stopped signal=\"SIGINT\"",
    );
}

/// A socket file is removed when its owner drops it, but not one that replaced it
/// (someone removed the owner's file and another controller bound the path).
#[test]
fn a_socket_file_is_removed_only_while_it_is_ours() {
    let _turn = crate::util::together();
    use cheferd_controller::bounds::bind_unix;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("controller.sock");
    let (listener, file) = bind_unix(&path, 0o600).unwrap();
    drop(listener);
    drop(file);
    assert!(!path.exists(), "the socket file was left behind");

    // The owner's accept loop ended (its listener is gone) but it has not dropped the
    // file yet, when someone removes the file and another controller binds the path.
    let (listener, old) = bind_unix(&path, 0o600).unwrap();
    drop(listener);
    std::fs::remove_file(&path).unwrap();
    let (_listener, _new) = bind_unix(&path, 0o600).expect("the path is free again");
    drop(old);
    assert!(
        UnixStream::connect(&path).is_ok(),
        "the old owner removed its successor's socket"
    );
}
