//! Issue 8 ("Trust"): the attacks an unprivileged local user ran against the control
//! plane, each replayed here against real processes, with what must hold instead.
//! Attacks that must come from another uid run this test binary again as uid 65534
//! (`setpriv`), in the helper `zz_attacker_helper`.

use crate::util::*;
use cheferd_controller::proto::{self, global_message, local_message, LocalMessage};
use padll_wire::channel::{ChannelId, ChannelInfo, ChannelSpec, LimitScope, Scope, Unit};
use padll_wire::config::Identity;
use padll_wire::control::{self, StageMessage, PROTOCOL_VERSION};
use padll_wire::ops::Class;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What the victim's process offers, ops/s.
const OFFERED: u64 = 800;
/// A process doing less than this share of what it offers (and is given) is starved:
/// a loaded machine slows it, an attack that succeeds cuts it to a few percent.
const STARVED: f64 = 0.25;

const CONFIG: &str = TRUST_CONFIG;

fn hello(job: &str, mount: &Path) -> String {
    hello_sized(job, 1, mount)
}

fn hello_sized(job: &str, job_size: u32, mount: &Path) -> String {
    control::encode(&StageMessage::Hello {
        version: PROTOCOL_VERSION,
        stage_name: "fake".into(),
        identity: Identity {
            job_id: job.into(),
            job_size,
            ..Identity::default()
        },
        mountpoints: vec![mount.display().to_string()],
    })
}

/// A raw client of the stage socket that said hello; returns it and the first reply.
fn raw_stage(socket: &Path, job: &str, mount: &Path) -> (UnixStream, String) {
    let mut stream = UnixStream::connect(socket).expect("connect to the stage socket");
    stream.write_all(hello(job, mount).as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_line_with_timeout(&mut reader, Duration::from_secs(20)).unwrap_or_default();
    (stream, reply)
}

fn line_count(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

/// Asserts that the lines of `log` containing `needle` kept to the controllers' log
/// limit (20 per 5 s window) over the `elapsed` time they may have been written in: a
/// loaded machine stretches an attack over more windows, so the bound follows the
/// clock, not the attack's size.
fn assert_rate_limited(log: &str, needle: &str, elapsed: Duration) {
    let windows = elapsed.as_secs() / 5 + 2;
    let lines = line_count(log, needle);
    assert!(
        lines as u64 <= 20 * windows,
        "{lines} lines '{needle}' in {elapsed:?}: not rate-limited"
    );
}

/// Runs this binary's attacker helper as uid 65534 with `vars`.
fn as_nobody(vars: &[(&str, &str)]) -> std::process::Child {
    run_as_nobody(
        "trust::zz_attacker_helper",
        vars,
        std::process::Stdio::inherit(),
    )
}

/// Not a test: the attacker side of the attacks run as another uid.
#[test]
#[ignore = "helper, run as another uid by the attack tests"]
fn zz_attacker_helper() {
    let Ok(attack) = std::env::var("TRUST_ATTACK") else {
        return;
    };
    let socket = PathBuf::from(std::env::var("TRUST_SOCKET").unwrap());
    match attack.as_str() {
        "claim" => {
            // Claims another user's job and an enormous size, and stays, reporting use.
            let mount = PathBuf::from(std::env::var("TRUST_MOUNT").unwrap());
            let job = std::env::var("TRUST_JOB").unwrap();
            let mut stream = UnixStream::connect(&socket).expect("connect");
            stream
                .write_all(hello_sized(&job, 4_000_000_000, &mount).as_bytes())
                .unwrap();
            let spec = ChannelSpec {
                mount: Some(mount.display().to_string()),
                scope: Scope::Class(Class::Metadata),
                rate: 2000,
                unit: Unit::Requests,
                burst: 20,
                costs: Default::default(),
            };
            for seq in 1..=40u64 {
                let usage = StageMessage::Usage {
                    seq,
                    channels: vec![ChannelInfo {
                        id: ChannelId(0),
                        spec: spec.clone(),
                        admitted: seq * 200,
                        tokens: seq * 200,
                        binds: LimitScope::Process,
                    }],
                    ops: Vec::new(),
                    latency: Vec::new(),
                };
                if stream
                    .write_all(control::encode(&usage).as_bytes())
                    .is_err()
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        "join" => {
            let mount = PathBuf::from(std::env::var("TRUST_MOUNT").unwrap());
            let (_, reply) = raw_stage(&socket, &std::env::var("TRUST_JOB").unwrap(), &mount);
            println!("REPLY {}", reply.trim());
        }
        "slow-lines" => {
            // SAFETY: plain setrlimit on a local struct.
            unsafe {
                let mut l: libc::rlimit = std::mem::zeroed();
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
                l.rlim_cur = l.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            }
            let mut streams = Vec::new();
            for _ in 0..2000 {
                match UnixStream::connect(&socket) {
                    Ok(s) => streams.push(s),
                    Err(_) => break,
                }
            }
            // 256 KiB partial lines, 16 KiB at a time, slowly; never a newline.
            let chunk = vec![b'x'; 16 * 1024];
            for _ in 0..16 {
                for s in &mut streams {
                    let _ = s.set_nonblocking(true);
                    let _ = s.write(&chunk);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            println!("HELD {}", streams.len());
            std::thread::sleep(Duration::from_secs(3));
        }
        other => panic!("unknown attack {other}"),
    }
}

/// Attack 3: a raw client joins a running job and reports 1e8 tokens per report. Its
/// reports are clamped to what its rule admits, so the job's real stage keeps its rate;
/// a client of another uid cannot join the job at all.
#[test]
fn attack03_fake_stage_cannot_starve_the_real_one() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.open_to_others();
    cluster.start_global();
    cluster.start_local("n1");
    let victim = job_id("victim");
    cluster.start_process(&victim, "n1", OFFERED);
    cluster.wait_for_stages(Duration::from_secs(20), &[("n1", 1)]);
    std::thread::sleep(Duration::from_secs(3));

    let socket = cluster.local_socket("n1");
    let (mut fake, reply) = raw_stage(&socket, &victim, &cluster.scratch);
    assert!(reply.contains("welcome"), "{reply}");
    let mut drain = BufReader::new(fake.try_clone().unwrap());
    std::thread::spawn(move || {
        let mut line = String::new();
        while drain.read_line(&mut line).unwrap_or(0) > 0 {
            line.clear();
        }
    });
    let spec = ChannelSpec {
        mount: Some(cluster.scratch.display().to_string()),
        scope: Scope::Class(Class::Metadata),
        rate: 2000,
        unit: Unit::Requests,
        burst: 20,
        costs: Default::default(),
    };
    let started = Instant::now();
    let mut seq = 0;
    while started.elapsed() < Duration::from_secs(12) {
        seq += 1;
        let usage = StageMessage::Usage {
            seq,
            channels: vec![ChannelInfo {
                id: ChannelId(0),
                spec: spec.clone(),
                admitted: seq * 100_000_000,
                tokens: seq * 100_000_000,
                binds: LimitScope::Process,
            }],
            ops: Vec::new(),
            latency: Vec::new(),
        };
        fake.write_all(control::encode(&usage).as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(250));
    }
    let now = Instant::now();
    let real = cluster.job_rate(&victim, now - Duration::from_secs(6), now);
    eprintln!("the real stage ran at {real:.0} ops/s under the attack");
    // Before: cut to 50 ops/s. The job has 2000 ops/s; the fake can hold at most its
    // split of it (about half), so the real stage keeps the rate it offers, or what a
    // loaded machine lets it do.
    assert!(
        real >= STARVED * OFFERED as f64,
        "the real stage ran at {real:.0} ops/s"
    );
    let log = cluster.local_log("n1");
    assert!(log.contains("more than its rules admit"), "no clamp logged");
    // Rate-limited: at most 20 lines per 5 s over the ~15 s of the attack.
    assert!(line_count(&log, "more than its rules admit") <= 80);

    if cfg!(has_root) {
        let out = as_nobody(&[
            ("TRUST_ATTACK", "join"),
            ("TRUST_SOCKET", socket.to_str().unwrap()),
            ("TRUST_JOB", &victim),
            ("TRUST_MOUNT", cluster.scratch.to_str().unwrap()),
        ])
        .wait_with_output()
        .unwrap();
        assert!(out.status.success());
        // Without a scheduler job, a claim of uid 65534 is scoped to that uid: it is a
        // job of its own, "victim@uid65534", and cannot join root's "victim".
        let scoped = format!("{victim}@uid65534");
        wait_for(
            Duration::from_secs(20),
            &format!("the other uid's claim scoped to its uid ({scoped}) in the log"),
            || cluster.local_log("n1").contains(&scoped).then_some(()),
        );
    }
    assert!(cluster.controllers_alive());
}

/// Attacks 1 and 2: a process of another uid claims the victim's job id and a job size
/// of 4 000 000 000 under a size-fair policy. Before: it joined the job (halving the
/// victim) or took the whole resource by size (the victim fell to 0). Now, without a
/// scheduler job, its claim is scoped to its uid (`victim@uid65534`, a job of its own)
/// and counts as one node.
#[test]
#[cfg_attr(
    not(all(has_root, has_setpriv)),
    ignore = "needs root and setpriv to attack as another uid"
)]
fn attack01_02_claimed_job_ids_and_sizes_are_not_believed() {
    let _turn = alone();
    let mut cluster = Cluster::new(
        r#"
interval_ms = 500
[[resource]]
name = "{scratch}:metadata"
max_rate = "2000"
policy = "themis:size"
"#,
    );
    cluster.open_to_others();
    cluster.start_global();
    cluster.start_local("n1");
    let victim = job_id("victim");
    cluster.start_process(&victim, "n1", OFFERED);
    cluster.wait_for_stages(Duration::from_secs(20), &[("n1", 1)]);
    let socket = cluster.local_socket("n1");
    let mut attacker = as_nobody(&[
        ("TRUST_ATTACK", "claim"),
        ("TRUST_SOCKET", socket.to_str().unwrap()),
        ("TRUST_JOB", &victim),
        ("TRUST_MOUNT", cluster.scratch.to_str().unwrap()),
    ]);
    let snapshot = wait_for(Duration::from_secs(20), "the attacker's stage", || {
        cluster
            .try_snapshot()
            .filter(|s| s.stages.iter().any(|stage| stage.uid == 65534))
    });
    let theirs: Vec<&str> = snapshot
        .stages
        .iter()
        .filter(|stage| stage.uid == 65534)
        .map(|stage| stage.job.as_str())
        .collect();
    assert_eq!(
        theirs,
        [format!("{victim}@uid65534")],
        "the claim was believed"
    );
    std::thread::sleep(Duration::from_secs(5));
    let now = Instant::now();
    let real = cluster.job_rate(&victim, now - Duration::from_secs(3), now);
    let share = assigned(&cluster.snapshot(), &victim);
    let _ = attacker.wait();
    // Size-fair between two one-node jobs: the victim may have half of 2000, more than
    // the 800 it offers, and runs at them; a believed size would leave it nothing.
    eprintln!("the victim was assigned {share:.0} ops/s and ran at {real:.0}");
    let starved = STARVED * OFFERED as f64;
    assert!(share >= starved, "the victim was assigned {share:.0} ops/s");
    assert!(
        real >= starved,
        "the victim ran at {real:.0} ops/s under the attack"
    );
    assert!(cluster.controllers_alive());
}

/// Attack 9: 20 short processes of one job in a row under `Max_R` 1 000. Before, each
/// ran unthrottled until its first rules arrived (~10 ms): 101 804 operations in 2.25 s,
/// ≈ 45 × `Max_R`. Now a starting program waits (≤ 100 ms) for its first rules, so
/// every operation of every process is under the job's rules.
#[test]
fn attack09_short_processes_start_under_their_rules() {
    let _turn = alone();
    let mut cluster = Cluster::new(
        r#"
interval_ms = 200
[[resource]]
name = "{scratch}:metadata"
max_rate = "1000"
policy = "psfa"
"#,
    );
    cluster.start_global();
    cluster.start_local("n1");
    let dir = cluster.scratch.join("short");
    std::fs::create_dir_all(&dir).unwrap();
    // Let the local controller attach before the first process starts.
    wait_for(Duration::from_secs(20), "the node attached", || {
        cluster
            .try_snapshot()
            .filter(|s| s.nodes.iter().any(|n| n.node == "n1" && n.attached))
    });
    let burst = job_id("burst");
    let started = Instant::now();
    let mut total = 0u64;
    let mut fastest = 0f64;
    for _ in 0..20 {
        // 300 operations due within 0.1 s: unthrottled, a process is done in a few ms.
        let out = run_with_timeout(
            Command::new(cheferd_lab())
                .args(["replay", "--rate", "300", "--seconds", "1", "--speed", "10"])
                .args(["--threads", "2", "--dir"])
                .arg(&dir)
                .env("LD_PRELOAD", stage_library())
                .env("PADLL_MOUNTS", &cluster.scratch)
                .env("PADLL_CONTROLLER", cluster.local_socket("n1"))
                .env("PADLL_JOB_ID", &burst)
                .env("PADLL_LOG", "warn"),
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // "# total <calls> calls (<operations> operations) in <seconds> s = <rate> calls/s":
        // the process' own rate (the parenthesis is no number).
        let text = String::from_utf8_lossy(&out.stdout);
        let summary: Vec<f64> = text
            .lines()
            .find_map(|l| l.strip_prefix("# total "))
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect()
            })
            .unwrap_or_else(|| panic!("no total in {text}"));
        total += summary[0] as u64;
        fastest = fastest.max(summary[2]);
    }
    let seconds = started.elapsed().as_secs_f64();
    let rate = total as f64 / seconds;
    eprintln!("{total} operations in {seconds:.2} s = {rate:.0}/s; fastest process {fastest:.0}/s");
    assert!(total >= 20 * 300, "{total} operations");
    assert!(
        rate <= 1000.0 * 1.05,
        "20 short processes ran at {rate:.0} ops/s under Max_R 1000"
    );
    // Each on its own: unthrottled, 300 operations take a few ms (≥ 3 000/s over the
    // 0.1 s they are due in); under the job's rules at most Max_R, plus the bucket's
    // 10 ms burst over the process' 0.3 s or more.
    assert!(
        fastest <= 1000.0 * 1.05 + 10.0 / 0.3,
        "a short process ran at {fastest:.0} ops/s under Max_R 1000"
    );
    assert!(cluster.controllers_alive());
}

/// What a would-be local controller got from the global controller: `Err` with the
/// reason if its connection or `Attach` was refused, else the first message it received
/// after registering as `node` and announcing a forged stage of uid 0 in job `victim`
/// (none if its stream ended, or stayed silent for 10 s).
fn fake_local(
    port: u16,
    tls: Option<tonic::transport::ClientTlsConfig>,
    node: &str,
    mount: &str,
) -> Result<Vec<proto::GlobalMessage>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (node, mount) = (node.to_string(), mount.to_string());
    runtime.block_on(async move {
        let mut client = try_grpc_client(port, tls).await?;
        let messages = vec![
            LocalMessage {
                body: Some(local_message::Body::Register(proto::Register {
                    node,
                    version: proto::VERSION,
                })),
            },
            LocalMessage {
                body: Some(local_message::Body::StageJoined(proto::StageJoined {
                    stage: Some(proto::Stage {
                        stage_id: 1,
                        job_id: "victim".into(),
                        uid: 0,
                        pid: 4242,
                        mountpoints: vec![mount],
                        ..Default::default()
                    }),
                    announced: false,
                })),
            },
        ];
        // The stream stays open (as an attacker's would) while we read.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for m in messages {
            tx.send(m).unwrap();
        }
        let attach = client.attach(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        let mut inbound = tokio::time::timeout(Duration::from_secs(10), attach)
            .await
            .map_err(|_| "no answer to Attach within 10 s".to_string())?
            .map_err(|status| {
                format!(
                    "{:?}: {}",
                    status.code(),
                    cheferd_controller::tls::error_chain(&status)
                )
            })?
            .into_inner();
        let first = tokio::time::timeout(Duration::from_secs(10), inbound.message()).await;
        drop(tx);
        match first {
            Ok(Ok(message)) => Ok(message.into_iter().collect()),
            Ok(Err(status)) => Err(format!(
                "{:?}: {}",
                status.code(),
                cheferd_controller::tls::error_chain(&status)
            )),
            Err(_) => Ok(Vec::new()),
        }
    })
}

/// The global controller still knows only n1, with its one real stage (nothing forged
/// joined, no node was added or replaced).
fn only_the_real_node(cluster: &Cluster) {
    let snapshot = cluster.snapshot();
    let nodes: Vec<(&str, bool, usize, usize)> = snapshot
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.attached, n.stages, n.orphans))
        .collect();
    assert_eq!(nodes, vec![("n1", true, 1, 0)], "{snapshot:?}");
    assert!(
        snapshot.stages.iter().all(|s| s.pid != 4242),
        "a forged stage joined: {:?}",
        snapshot.stages
    );
    let global = cluster.global_log();
    assert!(!global.contains("previous stream is replaced"), "{global}");
    let local = cluster.local_log("n1");
    assert!(!local.contains("lost the global controller"), "{local}");
}

/// A cluster with n1 attached and one stage of job `victim` on it.
fn cluster_with_victim() -> (Cluster, UnixStream) {
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    cluster.start_local("n1");
    let (stage, reply) = raw_stage(&cluster.local_socket("n1"), "victim", &cluster.scratch);
    assert!(reply.contains("welcome"), "{reply}");
    cluster.wait_for_stages(Duration::from_secs(20), &[("n1", 1)]);
    (cluster, stage)
}

/// Mutual TLS: a client that presents no certificate is refused in the handshake (or
/// its `Attach` fails); it receives nothing and registers nothing.
#[test]
fn tls_client_without_certificate_is_refused() {
    let _turn = alone();
    let (cluster, _stage) = cluster_with_victim();
    let ca = std::fs::read(cluster.tls.join("ca.pem")).unwrap();
    // Trusts the real CA, so the server is accepted: only the client lacks a certificate.
    let no_identity = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca));
    let mount = cluster.scratch.display().to_string();
    let result = fake_local(cluster.port, Some(no_identity), "n1", &mount);
    eprintln!("without a certificate: {result:?}");
    assert!(result.is_err(), "got {result:?}");
    only_the_real_node(&cluster);
}

/// Mutual TLS: certificates of another CA are refused — a node certificate made by
/// another site CA for the same node name, and the global controller's own server
/// certificate (signed by the right CA, but for `serverAuth` only).
#[test]
fn tls_client_with_certificate_of_another_ca_is_refused() {
    let _turn = alone();
    let (cluster, _stage) = cluster_with_victim();
    let other = tempfile::tempdir().unwrap();
    cheferd_controller::tls::make_loopback_site(other.path(), &["n1"]).unwrap();
    let foreign = cheferd_controller::tls::ClientTls {
        ca: cluster.tls.join("ca.pem"),
        ..cheferd_controller::tls::loopback_node(other.path(), "n1")
    };
    let server_as_client = cheferd_controller::tls::ClientTls {
        cert: cluster.tls.join("server.pem"),
        key: cluster.tls.join("server.key"),
        ca: cluster.tls.join("ca.pem"),
        server_name: None,
    };
    let mount = cluster.scratch.display().to_string();
    for (what, tls, node) in [
        ("another CA's node certificate", foreign, "n1"),
        ("the server certificate", server_as_client, "localhost"),
    ] {
        let result = fake_local(cluster.port, Some(tls.load().unwrap()), node, &mount);
        eprintln!("{what}: {result:?}");
        assert!(result.is_err(), "{what}: got {result:?}");
    }
    only_the_real_node(&cluster);
}

/// Attack 5: a fake local controller on the global's gRPC port (it got the resource
/// table and `Enforce` messages, and a forged stage of uid 0 cut the victim's rate).
/// Without a valid node certificate — plaintext, or TLS without a certificate — it
/// receives no message at all (no `Registered` with the resource table, no `Enforce`),
/// and its forged stage never reaches the plan.
#[test]
fn attack05_fake_local_gets_no_resource_table_nor_enforce() {
    let _turn = alone();
    let (cluster, _stage) = cluster_with_victim();
    let before = assigned(&cluster.snapshot(), "victim");
    let mount = cluster.scratch.display().to_string();
    let ca = std::fs::read(cluster.tls.join("ca.pem")).unwrap();
    let no_identity = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca));
    for (what, tls) in [
        ("plaintext", None),
        ("TLS without a certificate", Some(no_identity)),
    ] {
        for node in ["n1", "evil"] {
            let result = fake_local(cluster.port, tls.clone(), node, &mount);
            eprintln!("{what} as {node}: {result:?}");
            let Err(_) = result else {
                panic!("{what} as {node}: received {result:?}");
            };
        }
    }
    only_the_real_node(&cluster);
    std::thread::sleep(Duration::from_secs(2));
    let after = assigned(&cluster.snapshot(), "victim");
    assert!(
        after >= before * 0.9,
        "the victim's share fell from {before} to {after}"
    );
}

/// Attack 6: a local controller registered under a real node's name, 12 times, and
/// replaced the real node's stream each time (orphaning its stages). With a node
/// certificate for `node-a` it cannot register as `n1`: every attempt is refused with
/// `PERMISSION_DENIED` naming both, the real n1 keeps its stream and its stage, and
/// `node-a` can still register as itself.
#[test]
fn attack06_node_certificate_cannot_register_as_another_node() {
    let _turn = alone();
    let (cluster, _stage) = cluster_with_victim();
    let mount = cluster.scratch.display().to_string();
    let node_a = cluster.node_tls("node-a").load().unwrap();
    for attempt in 1..=12 {
        let result = fake_local(cluster.port, Some(node_a.clone()), "n1", &mount);
        let error = result.expect_err("registering as another node must be refused");
        assert!(
            error.starts_with("PermissionDenied")
                && error.contains("for node 'node-a'")
                && error.contains("cannot register as 'n1'"),
            "attempt {attempt}: {error}"
        );
    }
    only_the_real_node(&cluster);
    let log = cluster.global_log();
    assert_eq!(
        line_count(
            &log,
            "its certificate is for node 'node-a', it registered as 'n1'"
        ),
        12,
        "{log}"
    );
    // Its own name is fine: it gets the resource table.
    let received = fake_local(cluster.port, Some(node_a), "node-a", &mount)
        .expect("node-a registers as itself");
    assert!(
        received
            .iter()
            .any(|m| matches!(m.body, Some(global_message::Body::Registered(_)))),
        "{received:?}"
    );
}

/// Attack 7: usage `NaN` / `inf`, and of a resource index past the table, over gRPC.
/// Refused at the registry: `ctl jobs` works and the stage still gets its rules.
#[test]
fn attack07_non_finite_usage_is_refused() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    let attack = Instant::now();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // A compromised node: a valid certificate, hostile reports.
    let client = cluster.grpc_client("evil");
    let mount = cluster.scratch.display().to_string();
    let rules_seen = runtime.block_on(async move {
        let mut client = client.await;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let send = |body| {
            tx.send(LocalMessage { body: Some(body) }).unwrap();
        };
        send(local_message::Body::Register(proto::Register {
            node: "evil".into(),
            version: proto::VERSION,
        }));
        for (id, job) in [
            (1, "nan-job"),
            (2, "inf-job"),
            (3, "neg-job"),
            (4, "far-job"),
        ] {
            send(local_message::Body::StageJoined(proto::StageJoined {
                stage: Some(proto::Stage {
                    stage_id: id,
                    job_id: job.into(),
                    pid: 1000 + id as u32,
                    mountpoints: vec![mount.clone()],
                    ..Default::default()
                }),
                announced: false,
            }));
        }
        let mut inbound = client
            .attach(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let mut rules_seen = std::collections::BTreeMap::new();
        // Reports for 5 s (cycles refuse them meanwhile), longer if a loaded machine has
        // not sent every stage its rules by then.
        let started = tokio::time::Instant::now();
        let (enough, deadline) = (
            started + Duration::from_secs(5),
            started + Duration::from_secs(30),
        );
        let mut cycle = 0;
        loop {
            cycle += 1;
            // The configuration's one resource is index 0; stage 4 names one past it.
            let stages = [
                (1, 0, f64::NAN),
                (2, 0, f64::INFINITY),
                (3, 0, -5.0),
                (4, 1, 1.0),
            ]
            .into_iter()
            .map(|(id, index, rate)| proto::StageUsage {
                stage_id: id,
                resources: vec![proto::ResourceUsage {
                    resource: index,
                    rate,
                    limit: 0,
                    latency: Vec::new(),
                }],
            })
            .collect();
            send(local_message::Body::Usage(proto::Usage {
                cycle,
                stages,
                applied: 0,
            }));
            match tokio::time::timeout(Duration::from_millis(250), inbound.message()).await {
                Ok(Ok(Some(message))) => {
                    if let Some(global_message::Body::Enforce(e)) = message.body {
                        for s in e.stages {
                            rules_seen.insert(s.stage_id, s.rules.len());
                        }
                    }
                }
                Ok(_) => break,
                Err(_) => {}
            }
            let now = tokio::time::Instant::now();
            let all_ruled = [1, 2, 3, 4]
                .iter()
                .all(|id| rules_seen.get(id).is_some_and(|n| *n > 0));
            if now > deadline || (now > enough && all_ruled) {
                break;
            }
        }
        rules_seen
    });
    let out = cluster.ctl(&["jobs"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in [1, 2, 3, 4] {
        assert!(
            rules_seen.get(&id).is_some_and(|n| *n > 0),
            "stage {id}: {rules_seen:?}"
        );
    }
    let snapshot = cluster.snapshot();
    for job in ["nan-job", "inf-job", "neg-job", "far-job"] {
        assert!(assigned(&snapshot, job) > 0.0, "{job} has no share");
    }
    let log = cluster.global_log();
    assert!(log.contains("ignored a usage report"), "refusal not logged");
    assert!(
        log.contains("resource 1 is not configured (the table has 1 resources)"),
        "{log}"
    );
    assert_rate_limited(&log, "ignored a usage report", attack.elapsed());
}

/// Attack 11: 2 000 slow partial 256 KiB lines from another uid. Partial lines are
/// held in per-uid and per-node budgets, connections per uid are capped, and the memory
/// goes back when the clients leave; a legitimate stage still registers meanwhile.
#[test]
#[cfg_attr(
    not(has_root),
    ignore = "not running as root (the attack runs as uid 65534)"
)]
fn attack11_slow_partial_lines_leave_no_memory_behind() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.open_to_others();
    cluster.start_global();
    cluster.start_local("n1");
    let pid = cluster.local_pid("n1");
    std::thread::sleep(Duration::from_secs(1));
    let (before, _) = rss_kib(pid);
    let socket = cluster.local_socket("n1");
    let attacker = as_nobody(&[
        ("TRUST_ATTACK", "slow-lines"),
        ("TRUST_SOCKET", socket.to_str().unwrap()),
    ]);
    std::thread::sleep(Duration::from_secs(2));
    // A legitimate stage of another uid registers during the attack.
    let (_stage, reply) = raw_stage(&socket, "legit", &cluster.scratch);
    assert!(reply.contains("welcome"), "{reply}");
    let out = attacker.wait_with_output().unwrap();
    assert!(out.status.success());
    let (_, peak) = rss_kib(pid);
    eprintln!("local controller RSS: before {before} KiB, peak {peak} KiB");
    assert!(
        peak < before + 120 * 1024,
        "peak {peak} KiB (before {before})"
    );
    // The memory goes back as the controller closes the connections the attacker left.
    wait_for(
        Duration::from_secs(30),
        "the memory back (RSS within 24 MiB of before)",
        || (rss_kib(pid).0 < before + 24 * 1024).then_some(()),
    );
    let log = cluster.local_log("n1");
    assert!(log.len() < 64 * 1024, "log of {} bytes", log.len());
    assert!(cluster.controllers_alive());
}

/// Attack 12: malformed 256 KiB lines, as fast as possible. Each error echoes at most a
/// short prefix and errors are rate-limited: the log stays small.
#[test]
fn attack12_malformed_lines_do_not_flood_the_log() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    cluster.start_local("n1");
    let socket = cluster.local_socket("n1");
    let (mut stage, reply) = raw_stage(&socket, "noisy", &cluster.scratch);
    assert!(reply.contains("welcome"));
    let tag = "z".repeat(255 * 1024);
    let bad = format!("{{\"type\":\"{tag}\"}}\n");
    let started = Instant::now();
    for _ in 0..200 {
        stage.write_all(bad.as_bytes()).unwrap();
    }
    // Malformed first lines on fresh connections, too.
    for _ in 0..50 {
        let mut s = UnixStream::connect(&socket).unwrap();
        let _ = s.write_all(bad.as_bytes());
    }
    eprintln!("sent 250 malformed lines in {:?}", started.elapsed());
    wait_for(Duration::from_secs(20), "the drops logged", || {
        let log = cluster.local_log("n1");
        log.contains("dropped a message from a stage").then_some(())
    });
    // The lines still buffered are read meanwhile: the log must stay small with them.
    std::thread::sleep(Duration::from_secs(1));
    let log = cluster.local_log("n1");
    assert_rate_limited(&log, "dropped a message from a stage", started.elapsed());
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 1024, "a log line of {longest} bytes");
    assert!(
        !log.contains(&"z".repeat(200)),
        "hostile input echoed at length"
    );
    assert!(cluster.controllers_alive());
}

/// Attack 13: the controllers run out of descriptors. Accept loops back off (one log
/// line per burst, no busy loop) and work again once descriptors are free.
#[test]
fn attack13_descriptor_exhaustion_backs_off() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global_with(Some(40));
    cluster.start_local_with("n1", &[], Some(24));
    let socket = cluster.local_socket("n1");
    let (local, global) = (cluster.local_pid("n1"), cluster.global_pid());
    let mut held = Vec::new();
    for _ in 0..100 {
        if let Ok(s) = UnixStream::connect(&socket) {
            held.push(s);
        }
    }
    let mut tcp = Vec::new();
    for _ in 0..100 {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", cluster.port)) {
            tcp.push(s);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let (l0, g0) = (cpu_ticks(local), cpu_ticks(global));
    std::thread::sleep(Duration::from_secs(3));
    let (l1, g1) = (cpu_ticks(local), cpu_ticks(global));
    // SAFETY: sysconf takes a plain constant and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    eprintln!(
        "CPU over 3 s while out of descriptors: local {} ticks, global {} ticks (of {hz}/s)",
        l1 - l0,
        g1 - g0
    );
    assert!(l1 - l0 < hz / 2, "local used {} ticks in 3 s", l1 - l0);
    assert!(g1 - g0 < hz / 2, "global used {} ticks in 3 s", g1 - g0);
    let (local_log, global_log) = (cluster.local_log("n1"), cluster.global_log());
    assert!(line_count(&local_log, "accept failed") <= 2, "{local_log}");
    assert!(
        line_count(&global_log, "accept failed") <= 2,
        "{global_log}"
    );
    drop(held);
    drop(tcp);
    // Descriptors are free again: a stage registers.
    std::thread::sleep(Duration::from_millis(1500));
    let (_stage, reply) = raw_stage(&socket, "after", &cluster.scratch);
    assert!(reply.contains("welcome"), "{reply}");
    assert!(cluster.controllers_alive());
}

/// Attack 14: 200 000 `StageJoined` with fresh job ids over gRPC. Stages and jobs per
/// node are capped: memory stays small, `ctl jobs` answers, cycles stay short.
#[test]
fn attack14_stage_joined_flood_is_bounded() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    let attack = Instant::now();
    let pid = cluster.global_pid();
    let (before, _) = rss_kib(pid);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // A compromised node: a valid certificate, a hostile flood.
    let client = cluster.grpc_client("flood");
    let mount = cluster.scratch.display().to_string();
    let (_stream, total) = runtime.block_on(async move {
        let mut client = client.await;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(LocalMessage {
            body: Some(local_message::Body::Register(proto::Register {
                node: "flood".into(),
                version: proto::VERSION,
            })),
        })
        .unwrap();
        let mut total = 0u64;
        for id in 0..200_000u64 {
            let message = LocalMessage {
                body: Some(local_message::Body::StageJoined(proto::StageJoined {
                    stage: Some(proto::Stage {
                        stage_id: id,
                        job_id: format!("fresh-job-{id}"),
                        pid: id as u32,
                        mountpoints: vec![mount.clone()],
                        ..Default::default()
                    }),
                    announced: false,
                })),
            };
            total += prost::Message::encoded_len(&message) as u64;
            tx.send(message).unwrap();
        }
        let inbound = client
            .attach(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .unwrap();
        ((tx, inbound), total) // never read: the attacker does not drain its stream
    });
    let snapshot = wait_for(Duration::from_secs(60), "the flood to be taken in", || {
        let s = cluster.try_snapshot()?;
        let node = s.nodes.iter().find(|n| n.node == "flood")?;
        (node.bytes_in >= total).then_some(s)
    });
    std::thread::sleep(Duration::from_secs(3));
    let out = cluster.ctl(&["jobs"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snapshot = cluster.try_snapshot().unwrap_or(snapshot);
    let stages = snapshot.stages.len();
    assert!(stages <= 1024, "{stages} stages registered");
    let (after, peak) = rss_kib(pid);
    eprintln!(
        "global RSS: before {before} KiB, after {after} KiB, peak {peak} KiB; cycle p50 {:.2} ms, p99 {:.2} ms, last {:.2} ms",
        snapshot.latency_ms_p50,
        snapshot.latency_ms_p99,
        snapshot.latency_ms_last
    );
    assert!(
        peak < before + 150 * 1024,
        "peak {peak} KiB (before {before})"
    );
    // A node that never reports is waited for once (its first due cycle), not again: a
    // cycle that waits for its reports takes half an interval (250 ms) or more, one
    // that does not a few ms; one such cycle a loaded machine may stretch a long way,
    // their median not.
    assert!(
        snapshot.latency_ms_p50 < 125.0 && snapshot.latency_ms_last < 250.0,
        "cycle p50 {} ms, last {} ms",
        snapshot.latency_ms_p50,
        snapshot.latency_ms_last
    );
    assert_rate_limited(&cluster.global_log(), "ignored a stage", attack.elapsed());
    drop(runtime);
}

/// Attack 16: one node's stages of ONE job (the job cap does not bite), each with the
/// most mountpoints a stage may register (64) of the longest length (4 KiB), every
/// field within the stage bounds: the global kept every byte (512 stages, 128 MiB;
/// 4096 held 2 GiB and `ctl nodes` stopped answering, the snapshot copying them all
/// under the state lock). It keeps of a stage's mountpoints the configured ones only,
/// and a node's stages' names and mountpoints within a byte budget.
#[test]
fn attack16_one_node_s_stages_cannot_make_the_global_hold_their_mountpoints() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global();
    let pid = cluster.global_pid();
    let (before, _) = rss_kib(pid);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = cluster.grpc_client("bloat");
    let (_stream, total) = runtime.block_on(async move {
        let mut client = client.await;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(LocalMessage {
            body: Some(local_message::Body::Register(proto::Register {
                node: "bloat".into(),
                version: proto::VERSION,
            })),
        })
        .unwrap();
        let inbound = client
            .attach(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .unwrap();
        let mut total = 0u64;
        for id in 0..512u64 {
            let mountpoints = (0..64)
                .map(|m| format!("/{id}-{m}-{}", "x".repeat(4000)))
                .collect();
            let message = LocalMessage {
                body: Some(local_message::Body::StageJoined(proto::StageJoined {
                    stage: Some(proto::Stage {
                        stage_id: id,
                        job_id: "one-job".into(),
                        pid: id as u32 + 1,
                        mountpoints,
                        ..Default::default()
                    }),
                    announced: false,
                })),
            };
            total += prost::Message::encoded_len(&message) as u64;
            tx.send(message).unwrap();
        }
        ((tx, inbound), total)
    });
    wait_for(Duration::from_secs(60), "the stages to be taken in", || {
        let s = cluster.try_snapshot()?;
        let node = s.nodes.iter().find(|n| n.node == "bloat")?;
        (node.bytes_in >= total).then_some(())
    });
    let (after, peak) = rss_kib(pid);
    let started = Instant::now();
    let out = cluster.ctl(&["nodes"]);
    let answered = started.elapsed();
    eprintln!(
        "sent {total} bytes; global RSS before {before} KiB, after {after} KiB, peak {peak} KiB; ctl nodes in {answered:?}"
    );
    assert!(
        out.status.success() && answered < Duration::from_secs(30),
        "ctl nodes: {:?} after {answered:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        after < before + 64 * 1024,
        "one node's stages hold {} MiB of the global controller",
        (after - before) / 1024
    );
    drop(runtime);
}

/// Attack 15: what is at the socket path before start. A stale socket is replaced; a
/// dangling symlink, a plain file, a directory writable by others and a live
/// controller are refused in one line naming the path.
#[test]
fn attack15_socket_paths_are_created_safely() {
    let _turn = crate::util::together();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("local.sock");
    let start = |path: &Path| {
        Command::new(cheferd())
            .args([
                "local",
                "--node",
                "n",
                "--global",
                "http://127.0.0.1:1",
                "--insecure-plaintext",
                "--socket",
            ])
            .arg(path)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let refused = |path: &Path, why: &str| {
        let child = start(path);
        let out = run_to_end(child, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{why}: started");
        assert_eq!(err.lines().count(), 1, "{why}: {err}");
        assert!(
            err.contains(&path.display().to_string()) && err.contains(why),
            "{err}"
        );
    };
    // A dangling symlink.
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &socket).unwrap();
    refused(&socket, "symbolic link");
    std::fs::remove_file(&socket).unwrap();
    // A plain file.
    std::fs::write(&socket, "data").unwrap();
    refused(&socket, "not a socket");
    std::fs::remove_file(&socket).unwrap();
    // A stale socket (its listener is gone): replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut live = start(&socket);
    wait_for(START_TIMEOUT, "the controller on the stale socket", || {
        UnixStream::connect(&socket).ok()
    });
    // A live controller is never taken over.
    refused(&socket, "answers on it");
    assert!(UnixStream::connect(&socket).is_ok());
    let _ = live.kill();
    let _ = live.wait();
    // A directory others may write to (no sticky bit).
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&open.join("local.sock"), "writable by others");
    // The global's admin socket too.
    let admin = dir.path().join("admin.sock");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &admin).unwrap();
    std::fs::write(dir.path().join("g.toml"), "").unwrap();
    let child = Command::new(cheferd())
        .arg("global")
        .arg("--config")
        .arg(dir.path().join("g.toml"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--insecure-plaintext",
            "--admin-socket",
        ])
        .arg(&admin)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = run_to_end(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("symbolic link"),
        "{err}"
    );
}

/// Neither controller starts without TLS files unless plaintext is asked for; a
/// missing or unusable file, a partial set and a `--node` the certificate does not
/// carry are named in one line, exit 2.
#[test]
fn tls_files_are_required_and_checked_at_start() {
    let _turn = crate::util::together();
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    cheferd_controller::tls::make_loopback_site(&tls, &["n1"]).unwrap();
    std::fs::write(dir.path().join("g.toml"), "").unwrap();
    let path = |name: &str| tls.join(name).display().to_string();
    let missing = dir.path().join("missing.pem").display().to_string();
    let admin = dir.path().join("admin.sock").display().to_string();
    let socket = dir.path().join("local.sock").display().to_string();
    let config = dir.path().join("g.toml").display().to_string();
    let global = |extra: &[&str]| {
        let mut args = vec!["global", "--config", &config, "--listen", "127.0.0.1:0"];
        args.extend(["--admin-socket", &admin]);
        args.extend(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let local = |extra: &[&str]| {
        let mut args = vec![
            "local",
            "--socket",
            &socket,
            "--global",
            "https://127.0.0.1:1",
        ];
        args.extend(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let (cert, key, ca) = (path("node-n1.pem"), path("node-n1.key"), path("ca.pem"));
    let (server, server_key) = (path("server.pem"), path("server.key"));
    for (args, needle) in [
        (global(&[]), "--insecure-plaintext"),
        (
            global(&["--tls-cert", &server, "--tls-key", &server_key]),
            "needs --tls-client-ca",
        ),
        (
            global(&[
                "--tls-cert",
                &missing,
                "--tls-key",
                &server_key,
                "--tls-client-ca",
                &ca,
            ]),
            &missing,
        ),
        (
            global(&[
                "--tls-cert",
                &server,
                "--tls-key",
                &key,
                "--tls-client-ca",
                &ca,
            ]),
            "unusable",
        ),
        (local(&[]), "--insecure-plaintext"),
        (
            local(&["--tls-cert", &cert, "--tls-key", &key, "--tls-ca", &missing]),
            &missing,
        ),
        (
            local(&[
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-ca",
                &ca,
                "--node",
                "n2",
            ]),
            "is for node 'n1'",
        ),
    ] {
        let child = Command::new(cheferd())
            .args(&args)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = run_to_end(child, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err} should name {needle}");
    }
}

fn run_to_end(mut child: std::process::Child, timeout: Duration) -> std::process::Output {
    let deadline = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
