//! Issue 18 ("Trust, round 2"), the local controller's side: what an unprivileged user on
//! a node could make `cheferd local` spend (memory, log, waits), each attack replayed
//! against real processes. Attacks that must come from another uid run this test binary
//! again as uid 65534 (`setpriv`), in the helper `zz_local_attacker_helper`.

use crate::node_default::signal_global;
use crate::placement::Stage;
use crate::util::*;
use padll_wire::config::Identity;
use padll_wire::control::{self, ControlMessage, StageMessage, PROTOCOL_VERSION};
use std::io::{BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CONFIG: &str = TRUST_CONFIG;

/// How long an attack runs.
const ATTACK: Duration = Duration::from_secs(8);

fn hello(job: &str, mount: &Path) -> Vec<u8> {
    control::encode(&StageMessage::Hello {
        version: PROTOCOL_VERSION,
        stage_name: "trust-local".into(),
        identity: Identity {
            job_id: job.into(),
            job_size: 1,
            ..Identity::default()
        },
        mountpoints: vec![mount.display().to_string()],
    })
    .into_bytes()
}

fn place(id: u64, mount: &Path) -> Vec<u8> {
    control::encode(&StageMessage::Place {
        id,
        mount: mount.display().to_string(),
        stripes: 1,
    })
    .into_bytes()
}

/// Runs this binary's attacker helper as uid 65534 with `vars`.
fn as_nobody(vars: &[(&str, &str)]) -> std::process::Child {
    run_as_nobody(
        "trust_local::zz_local_attacker_helper",
        vars,
        std::process::Stdio::piped(),
    )
}

/// The number the attacker printed after `word`.
fn reported(output: &std::process::Output, word: &str) -> u64 {
    let out = String::from_utf8_lossy(&output.stdout);
    out.lines()
        .find_map(|l| l.strip_prefix(word)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {word} in {out}"))
}

/// A connection of the attacker: said hello, never reads.
fn connect_unread(socket: &Path, mount: &Path) -> Option<UnixStream> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.write_all(&hello("flood", mount)).ok()?;
    stream.set_nonblocking(true).ok()?;
    Some(stream)
}

/// Not a test: the attacker side of the attacks run as another uid.
#[test]
#[ignore = "helper, run as another uid by the attack tests"]
fn zz_local_attacker_helper() {
    let Ok(attack) = std::env::var("LOCAL_ATTACK") else {
        return;
    };
    let socket = PathBuf::from(std::env::var("LOCAL_SOCKET").unwrap());
    let mount = PathBuf::from(std::env::var("LOCAL_MOUNT").unwrap());
    match attack.as_str() {
        "place-flood" => {
            // Connections that ask for placements as fast as they can and never read;
            // each one the controller closes is replaced.
            let batch: Vec<u8> = (0..1000).flat_map(|id| place(id, &mount)).collect();
            let mut streams: Vec<UnixStream> = (0..16)
                .filter_map(|_| connect_unread(&socket, &mount))
                .collect();
            let (started, mut closed) = (Instant::now(), 0);
            while started.elapsed() < ATTACK {
                let mut progress = false;
                for stream in &mut streams {
                    match stream.write(&batch) {
                        Ok(_) => progress = true,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(_) => {
                            closed += 1;
                            if let Some(fresh) = connect_unread(&socket, &mount) {
                                *stream = fresh;
                            }
                        }
                    }
                }
                if !progress {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            println!("CLOSED {closed}");
        }
        "hello" => {
            let stage = Stage::register(&socket, "own-job", &mount);
            drop(stage);
        }
        other => panic!("unknown attack {other}"),
    }
}

/// Issue 18 (b): connections that send `place` requests and never read. The answers
/// queued to each were unbounded (local RSS 12 → 159 MB in 10 s). Now each stage's
/// queue is bounded and a stage that does not read is closed; a stage that reads is
/// served throughout.
#[test]
#[cfg_attr(
    not(has_root),
    ignore = "not running as root (the attack runs as uid 65534)"
)]
fn place_flood_without_reading_is_closed_and_bounded() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.open_to_others();
    cluster.start_global();
    cluster.start_local("n1");
    let pid = cluster.local_pid("n1");
    let socket = cluster.local_socket("n1");
    let mut good = Stage::register(&socket, &job_id("good"), &cluster.scratch);
    good.place(0, &cluster.scratch, 1);
    let (before, _) = rss_kib(pid);
    let attacker = as_nobody(&[
        ("LOCAL_ATTACK", "place-flood"),
        ("LOCAL_SOCKET", socket.to_str().unwrap()),
        ("LOCAL_MOUNT", cluster.scratch.to_str().unwrap()),
    ]);
    // The stage that reads gets its answers during the attack.
    let started = Instant::now();
    let mut id = 1;
    while started.elapsed() < ATTACK {
        good.place(id, &cluster.scratch, 1);
        id += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = attacker.wait_with_output().unwrap();
    assert!(out.status.success());
    let closed = reported(&out, "CLOSED");
    let (_, peak) = rss_kib(pid);
    eprintln!(
        "{closed} attacking connections closed; the good stage got {id} answers; local RSS \
         before {before} KiB, peak {peak} KiB"
    );
    assert!(closed >= 16, "only {closed} attacking connections closed");
    // Before: +56 MB in 6 s from one connection. Now: queues of 1 MiB per stage at most
    // and 16 MiB per uid, besides what the connections' own buffers take.
    assert!(
        peak < before + 48 * 1024,
        "peak {peak} KiB (before {before})"
    );
    good.place(id, &cluster.scratch, 1);
    let log = cluster.local_log("n1");
    assert!(log.contains("does not read its socket"), "no close logged");
    assert!(cluster.controllers_alive());
}

/// While the global controller was frozen (`kill -STOP`: its kernel keeps the
/// connection open and its window at 0), a user's stages coming and going grew the local
/// controller by 11 MB/s (every message kept for the global) and it never noticed. Now
/// it leaves the stream within the pings' timeout, or once its bounded queue is full,
/// in one line; resumed, the global controller lists the stages alive, none of those
/// that left meanwhile (their `StageLeft` lost with the stream).
#[test]
fn a_frozen_global_is_left_and_the_stages_that_left_meanwhile_do_not_stay() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    cluster.start_local("n1");
    let pid = cluster.local_pid("n1");
    let socket = cluster.local_socket("n1");
    let register = || Stage::register(&socket, &job_id("kept"), &cluster.scratch);
    let mut kept = vec![register(), register()];
    cluster.wait_for_stages(Duration::from_secs(20), &[("n1", 2)]);

    signal_global(&cluster, libc::SIGSTOP);
    let (before, _) = rss_kib(pid);
    let churn = |stages: usize| {
        for _ in 0..stages {
            Stage::register(&socket, &job_id("churn"), &cluster.scratch);
        }
    };
    let lost = |log: &str| log.matches("lost the global controller").count();
    let started = Instant::now();
    let mut churned = 0;
    while lost(&cluster.local_log("n1")) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(45),
            "the frozen global controller not left in 45 s ({churned} stages came and went)"
        );
        churn(100);
        churned += 100;
    }
    let noticed = started.elapsed();
    kept.push(register());
    let churning = Instant::now();
    while churning.elapsed() < Duration::from_secs(5) {
        churn(100);
        churned += 100;
    }
    let (_, peak) = rss_kib(pid);
    eprintln!(
        "left the frozen global controller after {noticed:?}; {churned} stages came and \
         went; local RSS before {before} KiB, peak {peak} KiB"
    );
    let log = cluster.local_log("n1");
    assert_eq!(lost(&log), 1, "{log}");
    // Before: +11 MB/s. Now: the queue holds 12 288 messages at most.
    assert!(
        peak < before + 128 * 1024,
        "peak {peak} KiB (before {before})"
    );

    signal_global(&cluster, libc::SIGCONT);
    let live = kept.len();
    wait_for(
        Duration::from_secs(90),
        "the global controller to list the live stages and no orphan",
        || {
            let snapshot = cluster.try_snapshot()?;
            let node = snapshot.nodes.iter().find(|n| n.node == "n1")?;
            (node.attached && node.stages == live && node.orphans == 0).then_some(())
        },
    );
    drop(kept);
    assert!(cluster.controllers_alive());
}

/// The counts of every summary line of `log` ("N stages registered, M left"), added up.
fn summarised(log: &str) -> (u64, u64) {
    let count = |line: &str, after: &str| -> u64 {
        line.split(after)
            .next()
            .and_then(|head| head.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    log.lines()
        .filter(|l| l.contains("stages registered"))
        .map(|l| (count(l, " stages registered"), count(l, " left")))
        .fold((0, 0), |(r, l), (dr, dl)| (r + dr, l + dl))
}

/// Issue 18 (f): connect, hello, close in a loop registered thousands of stages a
/// second and grew the local's log by 210–292 KB/s. Now the lines of stages coming and
/// going share the limit of peer-caused lines (20 per 5 s), and a summary line counts
/// what was not logged.
#[test]
fn hello_close_loop_does_not_flood_the_log() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    let started = Instant::now();
    cluster.start_local("n1");
    let socket = cluster.local_socket("n1");
    const STAGES: u64 = 3000;
    for _ in 0..STAGES {
        Stage::register(&socket, &job_id("churn"), &cluster.scratch);
    }
    eprintln!(
        "{STAGES} stages registered and left in {:?}",
        started.elapsed()
    );
    // Every stage is in a summary or a line of its own (a period whose lines were all
    // logged has no summary).
    let log = wait_for(
        Duration::from_secs(90),
        "a summary counting every stage",
        || {
            let log = cluster.local_log("n1");
            let (registered, left) = summarised(&log);
            let (registered_lines, left_lines) = (
                log.matches("stage registered").count() as u64,
                log.matches("stage left").count() as u64,
            );
            (registered + registered_lines >= STAGES && left + left_lines >= STAGES).then_some(log)
        },
    );
    let windows = started.elapsed().as_secs() / 5 + 1;
    let lines = log.lines().count() as u64;
    eprintln!(
        "{lines} log lines in {windows} windows of 5 s, {} bytes",
        log.len()
    );
    // 20 peer-caused lines per 5 s, the summaries and a few lines of the controller's own.
    assert!(
        lines <= 20 * windows + 10,
        "{lines} lines in {windows} windows of 5 s:\n{log}"
    );
    for summary in log.lines().filter(|l| l.contains("stages registered")) {
        eprintln!("{summary}");
    }
    assert!(summarised(&log).0 > 0, "no summary line:\n{log}");
    assert!(cluster.controllers_alive());
}

/// Issue 18 (d, e): the names of a job's files in `/dev/shm` could be taken by another
/// user first. The local controller makes each user's own directory
/// `/dev/shm/padll/<uid>` (the uid's, `0700`, in root's `/dev/shm/padll`) before that
/// user's stage is welcomed (and so before it gets rules and opens its job's files),
/// clearing away whatever was in the way, never following it.
#[test]
#[cfg_attr(
    not(has_root),
    ignore = "not running as root (the stage runs as uid 65534)"
)]
fn a_users_directory_is_made_before_its_stage_is_welcomed() {
    use std::os::unix::fs::MetadataExt;
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.open_to_others();
    cluster.start_global();
    cluster.start_local("n1");
    // Something in the way of uid 65534's directory: a symlink to a directory of root's.
    let directory = Path::new(padll_wire::node_files::NODE_DIRECTORY).join("65534");
    let target = tempfile::tempdir().unwrap();
    let _ = std::fs::remove_dir_all(&directory);
    let _ = std::fs::remove_file(&directory);
    std::os::unix::fs::symlink(target.path(), &directory).unwrap();
    let stage = as_nobody(&[
        ("LOCAL_ATTACK", "hello"),
        ("LOCAL_SOCKET", cluster.local_socket("n1").to_str().unwrap()),
        ("LOCAL_MOUNT", cluster.scratch.to_str().unwrap()),
    ]);
    let out = stage.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the stage of uid 65534 was not welcomed"
    );
    let meta = std::fs::symlink_metadata(&directory).unwrap();
    assert!(meta.is_dir(), "{} is not a directory", directory.display());
    assert_eq!((meta.uid(), meta.mode() & 0o777), (65534, 0o700));
    let target_meta = std::fs::metadata(target.path()).unwrap();
    assert_eq!(target_meta.uid(), 0, "the symlink was followed");
    assert!(cluster.local_log("n1").contains("was occupied by uid 0"));
}

/// Audit (local, 1): one user's stages sending `file_size` as fast as they could cut
/// the node off the global controller again and again ("lost the global controller: it
/// did not read the 12288 messages queued to it", 6–7 times in 8 s): every size was one
/// message on the node's one queue upstream, and a full queue gave the stream up. Now
/// sizes are advice: capped per uid and node, sent together while unread, and dropped
/// (counted) past their room in the queue, never costing the stream; another user's
/// stage is welcomed meanwhile.
#[test]
fn a_flood_of_file_sizes_does_not_cut_the_node_off() {
    use std::io::{BufRead, BufReader};
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    cluster.start_local("n1");
    let socket = cluster.local_socket("n1");
    let mount = cluster.scratch.clone();
    cluster.wait_for_stages(Duration::from_secs(30), &[("n1", 0)]);
    // 64 stages, each welcomed, then flooding.
    let size = control::encode(&StageMessage::FileSize {
        mount: mount.display().to_string(),
        bytes: 4096,
    });
    let batch = size.repeat(2000).into_bytes();
    let mut streams = Vec::new();
    for i in 0..64 {
        let mut stream = UnixStream::connect(&socket).unwrap();
        stream
            .write_all(&hello(&format!("sizes{}", i % 8), &mount))
            .unwrap();
        let mut welcome = String::new();
        BufReader::new(stream.try_clone().unwrap())
            .read_line(&mut welcome)
            .unwrap();
        assert!(welcome.contains("welcome"), "{welcome}");
        streams.push(stream);
    }
    let started = Instant::now();
    let pumps: Vec<_> = streams
        .chunks(8)
        .map(|group| {
            let mut group: Vec<UnixStream> = group.iter().map(|s| s.try_clone().unwrap()).collect();
            let batch = batch.clone();
            std::thread::spawn(move || {
                let mut sent = 0u64;
                while started.elapsed() < ATTACK {
                    for stream in &mut group {
                        stream
                            .set_write_timeout(Some(Duration::from_secs(1)))
                            .unwrap();
                        if stream.write_all(&batch).is_ok() {
                            sent += 2000;
                        }
                    }
                }
                sent
            })
        })
        .collect();
    // Another stage registers during the flood and is welcomed.
    std::thread::sleep(ATTACK / 2);
    let welcomed = Instant::now();
    let other = Stage::register(&socket, &job_id("other"), &mount);
    let waited = welcomed.elapsed();
    let sent: u64 = pumps.into_iter().map(|p| p.join().unwrap()).sum();
    eprintln!("{sent} file sizes sent in {ATTACK:?}; another stage welcomed in {waited:?}");
    let log = cluster.local_log("n1");
    assert!(sent > 20_000, "only {sent} sizes sent");
    assert!(
        !log.contains("lost the global controller"),
        "the flood cut the node off:\n{log}"
    );
    // The node stayed attached with every stage (64 + the other one).
    wait_for(
        Duration::from_secs(30),
        "the global controller to list the node's 65 stages",
        || {
            let snapshot = cluster.try_snapshot()?;
            let node = snapshot.nodes.iter().find(|n| n.node == "n1")?;
            (node.attached && node.stages == 65).then_some(())
        },
    );
    drop((other, streams));
    assert!(cluster.controllers_alive());
}

/// Audit (local, 2): a job id claimed with a newline forged a well-formed line in the
/// local controller's log (`stage registered … job=…`), and escape sequences in it or in
/// the program name reached the administrator's terminal through `cheferd ctl`. Now a
/// job id with control characters is refused at hello, naming the field; a program
/// name keeps them escaped, in the log and in every table.
#[test]
fn control_characters_forge_no_log_line_and_reach_no_terminal() {
    use std::io::{BufRead, BufReader};
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    cluster.start_local("n1");
    let socket = cluster.local_socket("n1");
    let forged = "x\n2026-01-01T00:00:00.000000Z  WARN cheferd: FORGED LINE";
    let say_hello = |job: &str, program: &str| {
        let mut stream = UnixStream::connect(&socket).unwrap();
        let hello = control::encode(&StageMessage::Hello {
            version: PROTOCOL_VERSION,
            stage_name: program.into(),
            identity: Identity {
                job_id: job.into(),
                job_size: 1,
                ..Identity::default()
            },
            mountpoints: vec![cluster.scratch.display().to_string()],
        });
        stream.write_all(hello.as_bytes()).unwrap();
        let mut reply = String::new();
        BufReader::new(stream.try_clone().unwrap())
            .read_line(&mut reply)
            .unwrap();
        (stream, reply)
    };
    let (_, refused) = say_hello(forged, "prog");
    assert!(
        refused.contains("reject") && refused.contains("job id"),
        "{refused}"
    );
    let (_, refused) = say_hello("job\u{1b}]0;owned\u{7}", "prog");
    assert!(refused.contains("job id"), "{refused}");
    let (_kept, welcome) = say_hello(&job_id("esc"), "/bin/prog\u{1b}[2J\n");
    assert!(welcome.contains("welcome"), "{welcome}");
    cluster.wait_for_stages(Duration::from_secs(30), &[("n1", 1)]);
    let log = cluster.local_log("n1");
    assert!(
        !log.lines().any(|l| l.starts_with("2026-01-01")) && !log.contains('\u{1b}'),
        "{log}"
    );
    for view in ["stages", "jobs", "nodes"] {
        let out = cluster.ctl(&[view]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains('\u{1b}'), "{view}: {text:?}");
        if view == "stages" {
            assert!(text.contains("prog\\u{1b}[2J\\n"), "{text}");
        }
    }
    assert!(cluster.controllers_alive());
}

/// A rejection says whether it may change: a cap (`--max-connections-per-uid` here,
/// likewise the caps on jobs and the byte budgets) carries `retry`, so that the stage
/// tries again later; a protocol version the controller does not speak does not.
#[test]
fn a_rejection_says_whether_the_stage_may_retry() {
    let _turn = together();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    cluster.start_local_with("n1", &["--max-connections-per-uid", "1"], None);
    let socket = cluster.local_socket("n1");
    let reply = |first: &[u8]| {
        let stream = UnixStream::connect(&socket).expect("the socket accepts");
        (&stream).write_all(first).expect("write");
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let line = read_line_with_timeout(&mut reader, Duration::from_secs(10)).expect("a reply");
        let reply = control::decode::<ControlMessage>(line.trim_end())
            .unwrap_or_else(|e| panic!("{e}: {line}"));
        (stream, reply)
    };
    let mut old = hello("retry", &cluster.scratch);
    let version = format!("\"version\":{PROTOCOL_VERSION},");
    let future = format!("\"version\":{},", PROTOCOL_VERSION + 98);
    old = String::from_utf8(old)
        .unwrap()
        .replace(&version, &future)
        .into_bytes();
    match reply(&old).1 {
        ControlMessage::Reject { reason, retry } => {
            assert!(reason.contains("protocol version"), "{reason}");
            assert!(!retry, "a version never changes: {reason}");
        }
        other => panic!("expected a reject, got {other:?}"),
    }
    // The uid's one connection (once the rejected one is counted out).
    let held = wait_for(Duration::from_secs(20), "a welcome", || {
        match reply(&hello("retry", &cluster.scratch)) {
            (stream, ControlMessage::Welcome { .. }) => Some(stream),
            (_, ControlMessage::Reject { retry: true, .. }) => {
                std::thread::sleep(Duration::from_millis(100));
                None
            }
            (_, other) => panic!("expected a welcome, got {other:?}"),
        }
    });
    match reply(&hello("retry", &cluster.scratch)).1 {
        ControlMessage::Reject { reason, retry } => {
            assert!(reason.contains("limit per uid"), "{reason}");
            assert!(retry, "a cap frees up: {reason}");
        }
        other => panic!("expected a reject, got {other:?}"),
    }
    drop(held);
    assert!(cluster.controllers_alive());
}
