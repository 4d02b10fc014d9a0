//! The stage's control client against a scripted controller: registration, usage
//! reports, rules applied at run time, malformed and oversized messages, refused rules,
//! fail-static when the controller disappears, and reconnection.

use crate::util::{calls_are_timed, library, scratch};
use padll_wire::channel::{ChannelSpec, Costs, Scope};
use padll_wire::control::{
    self, ControlMessage, StageMessage, MAX_MESSAGE_BYTES, PROTOCOL_VERSION,
};
use padll_wire::ops::{Class, Op};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The job of the loop working in `dir`: one per test (the job's last rules on the node
/// are kept across its processes).
fn job(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

/// Where the stage keeps the last rules of the job working in `dir`.
fn last_rules(dir: &Path) -> PathBuf {
    // SAFETY: geteuid takes no arguments and cannot fail.
    let uid = unsafe { libc::geteuid() };
    padll_wire::node_files::last_rules(uid, &job(dir)).into()
}

/// `padll mdloop DIR SECONDS` (stat + open + close in a loop) under the stage, limited
/// to 500 metadata ops/s by its configuration until the controller says otherwise.
fn spawn_loop(dir: &Path, socket: &Path, seconds: u32) -> Child {
    Command::new(crate::util::padll())
        .args(["mdloop", dir.to_str().unwrap(), &seconds.to_string()])
        .env("LD_PRELOAD", library())
        .env("PADLL_MOUNTS", dir)
        .env("PADLL_RULES", "metadata=500/s")
        .env("PADLL_CONTROLLER", socket)
        .env("PADLL_JOB_ID", job(dir))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The controller's end of one connection. A reader thread timestamps every message
/// as it arrives, so rates computed from usage reports are not skewed by queueing.
struct Peer {
    messages: Receiver<(Instant, StageMessage)>,
    writer: UnixStream,
}

impl Peer {
    /// The next stage to connect, its hello received and welcomed as stage 1, reporting
    /// every 100 ms.
    fn welcomed(listener: &UnixListener) -> Peer {
        let mut peer = Peer::accept(listener);
        assert!(matches!(peer.receive().1, StageMessage::Hello { .. }));
        peer.send(&ControlMessage::Welcome {
            version: PROTOCOL_VERSION,
            stage_id: 1,
            report_interval_ms: 100,
        });
        peer
    }

    /// The next connection; fails the test (rather than hanging it) when no stage
    /// connects within 30 s.
    fn accept(listener: &UnixListener) -> Peer {
        listener.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "no stage connected within 30 s");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        stream.set_nonblocking(false).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let (sender, messages) = channel();
        std::thread::spawn(move || loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let message =
                        control::decode(line.trim_end()).unwrap_or_else(|e| panic!("{e}: {line}"));
                    if sender.send((Instant::now(), message)).is_err() {
                        return;
                    }
                }
            }
        });
        Peer {
            messages,
            writer: stream,
        }
    }

    fn receive(&mut self) -> (Instant, StageMessage) {
        self.messages
            .recv_timeout(Duration::from_secs(20))
            .expect("no message from the stage")
    }

    fn send_raw(&mut self, line: &str) {
        self.writer.write_all(line.as_bytes()).unwrap();
    }

    fn send(&mut self, message: &ControlMessage) {
        self.send_raw(&control::encode(message));
    }

    /// The next `Applied` (skipping usage reports).
    fn applied(&mut self) -> (u64, Option<String>) {
        loop {
            if let (_, StageMessage::Applied { seq, error }) = self.receive() {
                return (seq, error);
            }
        }
    }

    /// Tokens of the metadata channel in the next usage report, with its arrival time.
    fn metadata_tokens(&mut self) -> (u64, Instant) {
        loop {
            if let (at, StageMessage::Usage { channels, .. }) = self.receive() {
                let tokens = channels
                    .iter()
                    .find(|c| c.spec.scope == Scope::Class(Class::Metadata))
                    .map_or(0, |c| c.tokens);
                return (tokens, at);
            }
        }
    }

    /// Discards what arrived so far.
    fn drain(&mut self) {
        while self.messages.try_recv().is_ok() {}
    }
}

fn metadata_rule(dir: &Path, rate: u64) -> ChannelSpec {
    crate::util::metadata_rule(dir, rate, 3)
}

#[test]
fn stage_follows_the_controller_and_survives_its_loss() {
    let dir = scratch("follow");
    let socket = dir.join("controller.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    // Long enough for every step below on a loaded machine: the loop must still run
    // when the controller comes back.
    let child = spawn_loop(&dir, &socket, 10);

    // Registration.
    let mut peer = Peer::accept(&listener);
    match peer.receive().1 {
        StageMessage::Hello {
            version,
            identity,
            mountpoints,
            ..
        } => {
            assert_eq!(version, PROTOCOL_VERSION);
            assert_eq!(identity.job_id, job(&dir));
            assert_eq!(identity.pid, child.id());
            assert_eq!(mountpoints, vec![dir.display().to_string()]);
        }
        other => panic!("expected hello, got {other:?}"),
    }
    peer.send(&ControlMessage::Welcome {
        version: PROTOCOL_VERSION,
        stage_id: 1,
        report_interval_ms: 100,
    });

    // Rules at run time: 300 metadata ops/s.
    peer.send(&ControlMessage::SetRules {
        seq: 1,
        rules: vec![metadata_rule(&dir, 300)],
    });
    assert_eq!(peer.applied(), (1, None));

    // Garbage and an oversized line are dropped; the stage keeps serving.
    peer.send_raw("this is not json\n");
    peer.send_raw(&format!("{}\n", "x".repeat(MAX_MESSAGE_BYTES + 10)));
    peer.send(&ControlMessage::SetRules {
        seq: 2,
        rules: vec![ChannelSpec {
            mount: Some("/not/a/mountpoint".into()),
            ..metadata_rule(&dir, 10)
        }],
    });
    let (seq, error) = peer.applied();
    assert_eq!(seq, 2);
    assert!(error.unwrap().contains("/not/a/mountpoint"));

    // The achieved rate follows the rule: not above it (+25 % for the reports' arrival
    // times, still below the configured 500/s), nor far below (a loaded machine
    // descheduling the loop slows it; half the rule would be starved).
    peer.drain();
    let (t0, at0) = peer.metadata_tokens();
    std::thread::sleep(Duration::from_secs(3));
    peer.drain();
    let (t1, at1) = peer.metadata_tokens();
    let rate = (t1 - t0) as f64 / (at1 - at0).as_secs_f64();
    assert!(
        (150.0..375.0).contains(&rate),
        "metadata rate {rate:.0}/s under a 300/s rule"
    );

    // The stage's own socket I/O is not counted as the application's: the only data
    // call in the usage reports is the loop's one 5-byte file write.
    loop {
        if let (_, StageMessage::Usage { ops, .. }) = peer.receive() {
            let counted = |name: &str| {
                ops.iter()
                    .find(|o| o.op == name)
                    .map_or((0, 0), |o| (o.managed, o.bytes))
            };
            assert_eq!(
                counted("write"),
                (1, 5),
                "the stage managed its own writes: {ops:?}"
            );
            assert_eq!(
                counted("read"),
                (0, 0),
                "the stage managed its own reads: {ops:?}"
            );
            break;
        }
    }

    // The controller disappears: the stage keeps its rules and reconnects.
    drop(peer);
    let mut peer = Peer::accept(&listener);
    assert!(matches!(peer.receive().1, StageMessage::Hello { .. }));
    drop(peer);
    drop(listener);

    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let achieved: f64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    // 10 s at ≤ 500 ops/s, most of it at 300 (the rules outlived the controller).
    assert!(
        achieved < 1000.0,
        "the loop ran at {achieved:.0} ops/s: rules were lost"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.matches("lost the controller").count(),
        1,
        "said once: {stderr}"
    );
    // The job's last rules were kept for its next processes.
    assert!(last_rules(&dir).is_file());
    let _ = std::fs::remove_file(last_rules(&dir));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn unreachable_controller_is_reported_once_and_configured_rules_apply() {
    let dir = scratch("unreachable");
    let output = Command::new(crate::util::padll())
        .args(["mdloop", dir.to_str().unwrap(), "1"])
        .env("LD_PRELOAD", library())
        .env("PADLL_MOUNTS", &dir)
        .env("PADLL_RULES", "metadata=600/s")
        .env("PADLL_CONTROLLER", dir.join("nobody-listens.sock"))
        .output()
        .unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("nobody-listens.sock"), "{stderr}");
    let achieved: f64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(
        achieved < 900.0,
        "configured limit ignored: {achieved:.0} ops/s"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The Python interpreter itself, not a wrapper script (pyenv's shim forks and execs).
fn python() -> String {
    Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| p.starts_with('/'))
        .expect("python3 not installed")
}

#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn a_forked_child_registers_on_its_own_connection() {
    let python = python();
    let dir = scratch("fork");
    let socket = dir.join("controller.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    // The parent forks without exec; the child keeps working in the mountpoint.
    let script = format!(
        "import os, time\npid = os.fork()\nend = time.time() + 4\nwhile time.time() < end:\n    os.stat('{}')\nif pid:\n    os.waitpid(pid, 0)\n",
        dir.display()
    );
    let child = Command::new(python)
        .args(["-c", &script])
        .env("LD_PRELOAD", library())
        .env("PADLL_MOUNTS", &dir)
        .env("PADLL_CONTROLLER", &socket)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pids = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..2 {
        let mut peer = Peer::accept(&listener);
        match peer.receive().1 {
            StageMessage::Hello { identity, .. } => pids.push(identity.pid),
            other => panic!("expected hello, got {other:?}"),
        }
        peer.send(&ControlMessage::Welcome {
            version: PROTOCOL_VERSION,
            stage_id: pids.len() as u64,
            report_interval_ms: 100,
        });
        peers.push(peer);
    }
    assert!(pids.contains(&child.id()), "{pids:?}");
    assert_eq!(pids.len(), 2);
    assert_ne!(pids[0], pids[1], "the child registered with its own pid");
    // Both keep reporting on their own connections.
    for peer in &mut peers {
        assert!(matches!(peer.receive().1, StageMessage::Usage { .. }));
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(not(has_root), ignore = "needs root to serve a socket as another uid")]
fn a_controller_run_by_another_user_is_not_obeyed() {
    // Another user (uid 65534) serves a socket at the controller's path and sends
    // welcome + a 2 ops/s rule. The stage (root) sees from SO_PEERCRED who serves it,
    // refuses it in one line and keeps its configured 500/s.
    let dir = scratch("impostor");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = dir.join("controller.sock");
    let payload = [
        control::encode(&ControlMessage::Welcome {
            version: PROTOCOL_VERSION,
            stage_id: 1,
            report_interval_ms: 100,
        }),
        control::encode(&ControlMessage::SetRules {
            seq: 1,
            rules: vec![metadata_rule(&dir, 2)],
        }),
    ]
    .concat();
    let impostor = serve_as_nobody(&socket, payload.as_bytes());
    let output = spawn_loop(&dir, &socket, 2).wait_with_output().unwrap();
    // SAFETY: our own child.
    unsafe {
        libc::kill(impostor, libc::SIGKILL);
        libc::waitpid(impostor, std::ptr::null_mut(), 0);
    }
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("uid 65534") && stderr.contains("refused"),
        "{stderr}"
    );
    let achieved: f64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    // Far above the impostor's rule even on a loaded machine, at most the configured.
    assert!(
        achieved > 100.0 && achieved < 550.0,
        "the impostor's rule (2/s) or none was applied instead of the configured 500/s: {achieved:.0} ops/s"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Forks a child that becomes uid 65534, listens on `path` and writes `payload` to
/// every connection (for 20 s at most). Only raw system calls after the fork. The
/// socket is bound under another name and renamed to `path` once it listens, so a stage
/// started as soon as `path` exists is never refused.
fn serve_as_nobody(path: &Path, payload: &[u8]) -> libc::pid_t {
    let binding = path.with_extension("binding");
    let [binding_name, name] = [&binding, path].map(|p| {
        std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("a path without NUL")
    });
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = binding_name.as_bytes();
    assert!(bytes.len() < addr.sun_path.len());
    for (slot, byte) in addr.sun_path.iter_mut().zip(bytes) {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: the child makes only async-signal-safe system calls and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            // The other tests' descriptors it inherited: held here, their peers would
            // see no end of file while it lives.
            libc::syscall(libc::SYS_close_range, 3, u32::MAX, 0);
            libc::alarm(20);
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                libc::_exit(1);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let size = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), size) != 0
                || libc::listen(fd, 8) != 0
                || libc::rename(binding_name.as_ptr(), name.as_ptr()) != 0
            {
                libc::_exit(1);
            }
            loop {
                let connection = libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut());
                if connection < 0 {
                    libc::_exit(0);
                }
                libc::write(connection, payload.as_ptr().cast(), payload.len());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "the impostor never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    pid
}

#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn service_times_are_reported_without_a_channel() {
    service_times_are_reported("times-unruled", None);
}

#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn service_times_are_reported_through_a_channel() {
    service_times_are_reported("times-ruled", Some("all=1000000/s"));
}

/// A program makes `STATS` stats on the mountpoint, opens a FIFO there and reads from it
/// while a thread of its own writes to it a second later: the usage reports count every
/// managed call's service time once, in its mountpoint's row of its class, and the
/// read as taking long.
fn service_times_are_reported(name: &str, rules: Option<&str>) {
    const STATS: usize = 300;
    let dir = scratch(name);
    let socket = dir.join("controller.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let fifo = dir.join("fifo");
    let fifo_name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo_name.as_ptr(), 0o600) }, 0);
    // The stage measures the time-stamp counter's rate 10 ms after it loads and times
    // no call before; the program ends when its standard input closes.
    let script = format!(
        "import os, sys, threading, time
time.sleep(0.1)
for _ in range({STATS}):
    os.stat('{dir}')
fd = os.open('{fifo}', os.O_RDWR)
def write_later():
    time.sleep(1)
    os.write(fd, b'x')
threading.Thread(target=write_later).start()
os.read(fd, 1)
sys.stdin.read()
",
        dir = dir.display(),
        fifo = fifo.display()
    );
    let mut command = Command::new(python());
    command
        .args(["-c", &script])
        .env("LD_PRELOAD", library())
        .env("PADLL_MOUNTS", &dir)
        .env("PADLL_CONTROLLER", &socket)
        .stdin(Stdio::piped());
    if let Some(rules) = rules {
        command.env("PADLL_RULES", rules);
    }
    let mut child = command.spawn().unwrap();
    let mut peer = Peer::welcomed(&listener);

    // The first report after the read returned (the program's thread wrote after it).
    let written =
        |ops: &[padll_wire::report::OpStats]| ops.iter().any(|o| o.op == "write" && o.managed == 1);
    let (ops, latency) = loop {
        if let (_, StageMessage::Usage { ops, latency, .. }) = peer.receive() {
            let managed = |name: &str| ops.iter().find(|o| o.op == name).map_or(0, |o| o.managed);
            if written(&ops) && managed("read") == 1 {
                break (ops, latency);
            }
        }
    };
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);

    if !calls_are_timed() {
        assert!(
            latency.is_empty(),
            "timed without a usable clock: {latency:?}"
        );
        return;
    }
    let mount = dir.display().to_string();
    assert!(latency.iter().all(|row| row.mount == mount), "{latency:?}");
    let total = |class: Class| -> u64 {
        latency
            .iter()
            .filter(|row| row.class == class)
            .flat_map(|row| row.counts.iter())
            .sum()
    };
    // Every managed call is timed once: the stats and the open, the read and the write.
    let managed: u64 = ops.iter().map(|o| o.managed).sum();
    let timed: u64 = Class::ALL.into_iter().map(total).sum();
    assert_eq!(timed, managed, "{latency:?}\n{ops:?}");
    assert_eq!(total(Class::Metadata), STATS as u64 + 1, "{latency:?}");
    assert_eq!(total(Class::Data), 2, "{latency:?}");
    // The read waited about a second for the write: counted as at least 50 ms.
    let data = latency.iter().find(|row| row.class == Class::Data).unwrap();
    let slow: u64 = data
        .counts
        .iter()
        .enumerate()
        .filter(|(bucket, _)| padll_wire::latency::lower_bound_ns(*bucket) >= 50_000_000)
        .map(|(_, count)| count)
        .sum();
    assert!(slow >= 1, "the blocked read: {:?}", data.counts);
}

/// A program makes `OPENS` opens (each closed) and `STATS` stats on the mountpoint under
/// one metadata channel the controller weighs (an open 3 tokens, a close none, a stat
/// half a token): the usage reports count its calls' tokens so; then at 300 tokens/s its
/// opens are held to about 100 a second, not the 300 of an unweighted channel.
#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn a_weighted_channel_charges_each_call_its_cost() {
    const OPENS: u64 = 200;
    const STATS: u64 = 301;
    const SECONDS: f64 = 2.0;
    let dir = scratch("weighted");
    let socket = dir.join("controller.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    // Each part starts when a line arrives on its standard input.
    let script = format!(
        "import os, sys, time
d = sys.argv[1]
sys.stdin.readline()
for i in range({OPENS}):
    os.close(os.open(f'{{d}}/f{{i}}', os.O_CREAT | os.O_WRONLY, 0o600))
for _ in range({STATS}):
    os.stat(d)
print('done', flush=True)
sys.stdin.readline()
count, start = 0, time.monotonic()
while time.monotonic() - start < {SECONDS}:
    os.close(os.open(f'{{d}}/f0', os.O_WRONLY))
    count += 1
print(count, time.monotonic() - start, flush=True)
sys.stdin.read()
"
    );
    let mut child = Command::new(python())
        .args(["-c", &script, dir.to_str().unwrap()])
        .env("LD_PRELOAD", library())
        .env("PADLL_MOUNTS", &dir)
        .env("PADLL_CONTROLLER", &socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut next_part = |input: &mut std::process::ChildStdin| {
        input.write_all(b"go\n").unwrap();
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        line
    };
    let mut peer = Peer::welcomed(&listener);
    let costs = Costs::new([(Op::Open, 3000), (Op::Close, 0), (Op::Getattr, 500)]).unwrap();
    let weighted = |rate, burst| ChannelSpec {
        costs: costs.clone(),
        ..crate::util::metadata_rule(&dir, rate, burst)
    };

    // Not limiting: the tokens counted are the calls' costs.
    peer.send(&ControlMessage::SetRules {
        seq: 1,
        rules: vec![weighted(1_000_000, 10_000)],
    });
    assert_eq!(peer.applied(), (1, None));
    assert_eq!(next_part(&mut input), "done\n");
    // The first report counting every call (the counts are cumulative; a report taken
    // during the last calls may still be on its way).
    let channel = loop {
        if let (_, StageMessage::Usage { channels, .. }) = peer.receive() {
            let channel = channels.into_iter().next().expect("the weighted channel");
            if channel.admitted >= OPENS + STATS {
                break channel;
            }
        }
    };
    assert_eq!(
        channel.spec,
        weighted(1_000_000, 10_000),
        "reported with its costs"
    );
    assert_eq!(channel.admitted, OPENS + STATS, "closes pass freely");
    assert_eq!(channel.tokens, (3000 * OPENS + 500 * STATS) / 1000);

    // 300 tokens/s: about 100 opens a second (an unweighted channel admits 300).
    peer.send(&ControlMessage::SetRules {
        seq: 2,
        rules: vec![weighted(300, 3)],
    });
    assert_eq!(peer.applied(), (2, None));
    let line = next_part(&mut input);
    let (count, elapsed) = line
        .trim()
        .split_once(' ')
        .map(|(count, elapsed)| {
            (
                count.parse::<f64>().unwrap(),
                elapsed.parse::<f64>().unwrap(),
            )
        })
        .unwrap_or_else(|| panic!("the program printed {line:?}"));
    let rate = count / elapsed;
    // Above 150/s would be a weight not applied; a loaded machine slows the program,
    // so the floor is far below the limit.
    assert!(
        (30.0..150.0).contains(&rate),
        "{count} opens in {elapsed} s"
    );
    drop(input);
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `script` (Python, given `log`) under the stage with a controller at `socket` that
/// gives it no rules: its standard output, once it succeeded.
fn python_under_controller(dir: &Path, socket: &Path, script: &str, log: &Path) -> String {
    let output = Command::new(python())
        .args(["-c", script, log.to_str().unwrap()])
        .env("LD_PRELOAD", library())
        .env("PADLL_MOUNTS", dir)
        .env("PADLL_CONTROLLER", socket)
        .env("PADLL_JOB_ID", job(dir))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // Nothing is wrong with the controller: the stage says nothing.
    assert!(stderr.is_empty(), "{stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Waits for the stage to register `count` times in all (each registration applies
/// the stub's rules once).
fn registrations(applied: &Receiver<()>, count: usize) {
    for n in 0..count {
        applied
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("the stage registered {n} times, not {count}"));
    }
}

#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn a_program_that_takes_the_connections_descriptor_keeps_its_file() {
    let dir = scratch("take-socket");
    let socket = dir.join("controller.sock");
    let applied = crate::util::controller_stub(&socket, Vec::new());
    // The program puts its log on the number of every socket it finds (the stage's
    // connection: `exec 4>log` in a batch script), and writes to it while the stage
    // reports its usage every 100 ms.
    let script = r#"
import os, sys, time
numbers = []
for name in os.listdir('/proc/self/fd'):
    try:
        if os.readlink('/proc/self/fd/' + name).startswith('socket:'):
            numbers.append(int(name))
    except OSError:
        pass
if not numbers:
    sys.exit('no socket of the stage')
f = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for n in numbers:
    os.dup2(f, n)
os.close(f)
for i in range(10):
    os.write(numbers[0], b'app-data\n')
    time.sleep(0.1)
sys.stdout.write(open(sys.argv[1]).read())
"#;
    let log = dir.join("log");
    let out = python_under_controller(&dir, &socket, script, &log);
    assert_eq!(
        out,
        "app-data\n".repeat(10),
        "the stage wrote into the file"
    );
    // It registered, lost its connection to the program and made a new one.
    registrations(&applied, 2);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn a_program_that_closes_every_descriptor_keeps_its_own() {
    let dir = scratch("closefrom");
    let socket = dir.join("controller.sock");
    let applied = crate::util::controller_stub(&socket, Vec::new());
    // As daemons and launchers do: every descriptor above 2 closed, then files of its
    // own, which get the lowest free numbers (the stage's before).
    let script = r#"
import os, sys, time
time.sleep(0.3)
os.closerange(3, 1 << 16)
f = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
spare = [os.open('/dev/null', os.O_WRONLY) for _ in range(4)]
for i in range(10):
    os.write(f, b'app-data\n')
    time.sleep(0.1)
os.close(f)
sys.stdout.write(open(sys.argv[1]).read())
"#;
    let log = dir.join("log");
    let out = python_under_controller(&dir, &socket, script, &log);
    assert_eq!(out, "app-data\n".repeat(10), "the program's file was lost");
    registrations(&applied, 2);
    let _ = std::fs::remove_dir_all(dir);
}

/// `cat` under the stage with a controller at `socket` (and a configured limit), in
/// the job of `dir`: it runs until its standard input closes.
fn spawn_cat(dir: &Path, socket: &Path) -> Child {
    Command::new("cat")
        .env("LD_PRELOAD", library())
        .env("PADLL_MOUNTS", dir)
        .env("PADLL_RULES", "metadata=500/s")
        .env("PADLL_CONTROLLER", socket)
        .env("PADLL_JOB_ID", job(dir))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Its standard error once its standard input closed and it ended well.
fn end_cat(mut child: Child) -> String {
    drop(child.stdin.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

#[test]
fn a_stage_rejected_for_a_while_comes_back_and_says_so_once() {
    let dir = scratch("rejected-retry");
    let socket = dir.join("controller.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let child = spawn_cat(&dir, &socket);
    // A cap refuses it three times (as `--max-connections-per-uid` does): it tries
    // again each time, on a backoff of seconds.
    let mut last = None;
    for _ in 0..3 {
        let mut peer = Peer::accept(&listener);
        assert!(matches!(peer.receive().1, StageMessage::Hello { .. }));
        let now = Instant::now();
        if let Some(last) = last {
            // Not hammering the controller (the first retry waits ≥ 0.5 s).
            assert!(now - last >= Duration::from_millis(400), "{:?}", now - last);
        }
        last = Some(now);
        peer.send(&ControlMessage::Reject {
            reason: "uid 1000 has 20 connections (the limit per uid)".into(),
            retry: true,
        });
    }
    // The cap lifted (the controller restarted without it): it registers and obeys.
    let mut peer = Peer::welcomed(&listener);
    peer.send(&ControlMessage::SetRules {
        seq: 1,
        rules: vec![metadata_rule(&dir, 300)],
    });
    assert_eq!(peer.applied(), (1, None));
    drop(peer);
    let stderr = end_cat(child);
    // One line on the job's error output for all the rejections (and no more for the
    // loss of the controller at the end than the one it says at most).
    let rejected = stderr.lines().filter(|l| l.contains("rejected")).count();
    assert_eq!(rejected, 1, "{stderr}");
    let _ = std::fs::remove_file(last_rules(&dir));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_stage_rejected_for_good_stops_trying() {
    let dir = scratch("rejected-for-good");
    let socket = dir.join("controller.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let child = spawn_cat(&dir, &socket);
    let mut peer = Peer::accept(&listener);
    assert!(matches!(peer.receive().1, StageMessage::Hello { .. }));
    // As every controller words a protocol version it does not speak (no `retry`).
    peer.send_raw(
        "{\"type\":\"reject\",\"reason\":\"protocol version 2 is not supported (this controller speaks 1)\"}\n",
    );
    drop(peer);
    // A retry would come within a second or two.
    std::thread::sleep(Duration::from_secs(4));
    listener.set_nonblocking(true).unwrap();
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the stage tried again"
    );
    let stderr = end_cat(child);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("protocol version"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_controller_lost_again_and_again_is_said_once() {
    let dir = scratch("lost-often");
    let socket = dir.join("controller.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let child = spawn_cat(&dir, &socket);
    // A crash-looping controller: welcomes the stage, gives it rules, goes away; four
    // times. The stage reconnects each time.
    for seq in 1..=4 {
        let mut peer = Peer::welcomed(&listener);
        peer.send(&ControlMessage::SetRules {
            seq,
            rules: vec![metadata_rule(&dir, 300)],
        });
        assert_eq!(peer.applied(), (seq, None));
    }
    let peer = Peer::welcomed(&listener);
    let stderr = end_cat(child);
    drop(peer);
    assert_eq!(
        stderr.matches("lost the controller").count(),
        1,
        "said once on the job's stderr: {stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let _ = std::fs::remove_file(last_rules(&dir));
    let _ = std::fs::remove_dir_all(dir);
}

/// A controller that stops reading: the control thread blocks in a write (holding the
/// writer) for up to its send timeout; a `fork` then must not leave the child's control
/// thread waiting for ever on the writer its parent's thread held. The controller
/// welcomes every connection of the parent, asks it for 2 000 usage reports and never
/// reads; the child's connection it welcomes, gives rules and reads.
#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn a_child_forked_during_a_blocked_write_registers_on_its_own() {
    let dir = scratch("fork-blocked");
    let socket = dir.join("controller.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let go = dir.join("go");
    let done = dir.join("done");
    // The parent forks when told; the child stays until told (at most 60 s).
    let script = format!(
        "import os, time
def wait_for(path):
    end = time.time() + 60
    while not os.path.exists(path) and time.time() < end:
        time.sleep(0.05)
wait_for('{go}')
pid = os.fork()
if pid == 0:
    wait_for('{done}')
    os._exit(0)
os.waitpid(pid, 0)
",
        go = go.display(),
        done = done.display()
    );
    let child = Command::new(python())
        .args(["-c", &script])
        .env("LD_PRELOAD", library())
        .env("PADLL_MOUNTS", &dir)
        .env("PADLL_CONTROLLER", &socket)
        .env("PADLL_JOB_ID", job(&dir))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let parent = child.id();
    let (flooded, flooded_rx) = channel();
    let (applied, applied_rx) = channel();
    let rules = vec![metadata_rule(&dir, 300)];
    std::thread::spawn(move || {
        let mut unread = Vec::new();
        for stream in listener.incoming().map_while(Result::ok) {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            let Ok(StageMessage::Hello { identity, .. }) = control::decode(line.trim_end()) else {
                continue;
            };
            let mut writer = stream;
            let welcome = control::encode(&ControlMessage::Welcome {
                version: PROTOCOL_VERSION,
                stage_id: 1,
                report_interval_ms: 10,
            });
            if identity.pid == parent {
                let flood = control::encode(&ControlMessage::CollectUsage).repeat(2000);
                let _ = writer.write_all(welcome.as_bytes());
                let _ = writer.write_all(flood.as_bytes());
                let _ = flooded.send(());
                unread.push((writer, reader));
                continue;
            }
            let (rules, applied) = (rules.clone(), applied.clone());
            std::thread::spawn(move || {
                let _ = writer.write_all(welcome.as_bytes());
                let set = ControlMessage::SetRules { seq: 7, rules };
                let _ = writer.write_all(control::encode(&set).as_bytes());
                for line in reader.lines().map_while(Result::ok) {
                    if let Ok(StageMessage::Applied { seq: 7, error }) = control::decode(&line) {
                        let _ = applied.send((identity.pid, error));
                    }
                }
            });
        }
    });
    flooded_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the program never registered");
    // Reports pile up unread: within a second the control thread blocks in a write
    // (for its 5 s send timeout); fork then.
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&go, "").unwrap();
    let outcome = applied_rx.recv_timeout(Duration::from_secs(30));
    std::fs::write(&done, "").unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let (pid, error) = outcome.expect("the forked child never applied its rules");
    assert_ne!(pid, parent);
    assert_eq!(error, None);
    let _ = std::fs::remove_file(last_rules(&dir));
    let _ = std::fs::remove_dir_all(dir);
}
