//! End-to-end tests of the control plane (issue #4): a `cheferd global`, two `cheferd
//! local`s and jobs of two processes each — `cheferd-lab replay` under `libpadll.so`, one
//! process per node, so every job spans both nodes (PADLL paper §III-B) — as separate
//! processes on loopback. Rates are measured by the replayers themselves (operations per
//! second they completed) and compared with what the global controller computed.

use crate::util::{assigned, job_id, read_line_with_timeout, Cluster, Replayer, START_TIMEOUT};
use cheferd_controller::global::Snapshot;
use cheferd_controller::proto::{self, local_message, LocalMessage};
use padll_wire::config::Identity;
use padll_wire::control::{
    self, ControlMessage, StageMessage, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Output;
use std::time::{Duration, Instant};

const MAX_RATE: f64 = 3000.0;
/// The jobs and their PSFA demands (PADLL Table I's 15/25/30/40 proportions, summing to
/// `MAX_RATE`), plus a fifth job that joins later; [`job_id`] makes the names ids.
const JOBS: [(&str, f64); 4] = [
    ("job-1", 400.0),
    ("job-2", 700.0),
    ("job-3", 800.0),
    ("job-4", 1100.0),
];
const LATE_JOB: (&str, f64) = ("job-5", 1100.0);
/// Every process offers more than any job's share can be.
const OFFERED_PER_PROCESS: u64 = 2000;
const NODES: [&str; 2] = ["n1", "n2"];
/// The control interval.
const INTERVAL: Duration = Duration::from_secs(1);
/// A change must show within two control cycles; plus slack for a loaded machine
/// (process start-up, a late cycle, polling the admin socket).
const REBALANCE_DEADLINE: Duration = Duration::from_millis(2 * 1000 + 1500);
/// A job's achieved rate must match its computed rate this closely, as a mean of
/// [`MEASURED`] seconds.
const RATE_TOLERANCE: f64 = 0.10;
/// Seconds an achieved rate is measured over: five whole windows of a replayer. One
/// window can hold more than a second of operations (ended late by a loaded machine)
/// and a batch of credit more than its rate; over two windows that broke +10 %.
const MEASURED: u32 = 6;
/// The lower bounds are only there to catch a job stopped or starved: a loaded 2-core
/// machine that deschedules the replayers can only make them slower, so upper bounds
/// protect the file system and lower ones are generous.
const SLOW_MACHINE_FLOOR: f64 = 0.5;
/// A job whose processes do less than this share of what they did before their
/// controller went away is starved: a loaded machine slows them before and after alike.
const STARVED: f64 = 0.25;

fn config(max_rate: f64) -> String {
    let mut text = format!(
        "interval_ms = {}\n[[resource]]\nname = \"{{scratch}}:metadata\"\nmax_rate = \"{max_rate}\"\npolicy = \"psfa\"\n",
        INTERVAL.as_millis()
    );
    for (job, demand) in JOBS.iter().chain([&LATE_JOB]) {
        text.push_str(&format!(
            "[[job]]\nid = \"{}\"\ndemand = {{ \"{{scratch}}:metadata\" = \"{demand}\" }}\n",
            job_id(job)
        ));
    }
    text
}

/// The ids of [`JOBS`], in order.
fn job_ids() -> Vec<String> {
    JOBS.iter().map(|(name, _)| job_id(name)).collect()
}

/// The global controller of `cluster`, two nodes and the four jobs, each with a process
/// per node, past their warm-up (every stage registered and the first cycles run on
/// real usage).
fn cluster_with_jobs(mut cluster: Cluster) -> Cluster {
    cluster.start_global();
    for node in NODES {
        cluster.start_local(node);
    }
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 0), ("n2", 0)]);
    for job in job_ids() {
        cluster.start_job(&job, &NODES, OFFERED_PER_PROCESS);
    }
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 4), ("n2", 4)]);
    std::thread::sleep(4 * INTERVAL);
    cluster
}

/// Measures `jobs` for `seconds` while sampling what the global controller computed for
/// them, then checks that the aggregate stayed under `max_rate` (+5 %) in every second,
/// that the computed rates share out all of it, and that no job achieved more than its
/// computed rate +10 % (nor far less). Returns each job's mean computed rate.
fn assert_policy_enforced(
    cluster: &Cluster,
    jobs: &[&str],
    max_rate: f64,
    seconds: u32,
) -> Vec<f64> {
    let from = Instant::now();
    let mut computed: Vec<Vec<f64>> = Vec::new();
    while from.elapsed() < seconds * INTERVAL {
        let snapshot = cluster.snapshot();
        computed.push(jobs.iter().map(|j| assigned(&snapshot, j)).collect());
        std::thread::sleep(INTERVAL / 2);
    }
    let to = Instant::now();
    // The last window of every replayer is reported up to a second after `to`.
    std::thread::sleep(Duration::from_millis(1300));
    cluster.assert_aggregate_capped(from, to, max_rate);
    let mean = |k: usize| computed.iter().map(|row| row[k]).sum::<f64>() / computed.len() as f64;
    let expected: Vec<f64> = (0..jobs.len()).map(mean).collect();
    let achieved: Vec<f64> = jobs.iter().map(|j| cluster.job_rate(j, from, to)).collect();
    let report: String = jobs
        .iter()
        .zip(expected.iter().zip(&achieved))
        .map(|(job, (e, a))| format!("  {job}: computed {e:.0} achieved {a:.0}\n"))
        .collect();
    eprintln!("Max_R {max_rate:.0}:\n{report}");
    let total: f64 = expected.iter().sum();
    assert!(
        (total - max_rate).abs() <= 0.01 * max_rate,
        "the policy shared {total:.0} of Max_R {max_rate:.0}\n{report}"
    );
    for ((job, e), a) in jobs.iter().zip(&expected).zip(&achieved) {
        assert!(
            *a <= e * (1.0 + RATE_TOLERANCE) && *a >= e * SLOW_MACHINE_FLOOR,
            "{job} achieved {a:.0} ops/s, the policy computed {e:.0} (+10 %, or far below)\n{report}"
        );
    }
    expected
}

/// Case 1 and 2: PSFA caps the aggregate at `Max_R` and each job gets what the policy
/// computed; a job leaving frees its share for the others within two cycles, a job
/// joining takes its share from them within two cycles.
#[test]
fn psfa_caps_the_aggregate_and_rebalances_when_jobs_leave_and_join() {
    let _turn = crate::util::alone();
    psfa_caps_and_rebalances(Cluster::new(&config(MAX_RATE)));
}

/// The same on a real shared file system: the jobs' files on a MooseFS (each of their
/// calls a round trip through its mount and master), the controllers where they were.
#[test]
#[cfg_attr(not(has_moosefs), ignore = "needs MooseFS (root, /dev/fuse)")]
fn psfa_caps_the_aggregate_and_rebalances_on_moosefs() {
    let _turn = crate::util::alone();
    let cluster = Cluster::on_moosefs(&config(MAX_RATE));
    let moosefs = cluster.moosefs().expect("on MooseFS");
    let (before, started) = (moosefs.master_ops(), Instant::now());
    let cluster = psfa_caps_and_rebalances(cluster);
    let moosefs = cluster.moosefs().expect("on MooseFS");
    let reached = moosefs.master_ops().since(&before);
    let rate = reached["total"] as f64 / started.elapsed().as_secs_f64();
    eprintln!("the MooseFS master: {rate:.0} ops/s ({reached:?})");
    // The replayers' calls cost the master one operation each on average (a stat is a
    // lookup, an open a lookup and an open, a close nothing); unthrottled, the eight
    // of them send it several times Max_R.
    assert!(
        rate <= 2.0 * MAX_RATE,
        "the MooseFS master served {rate:.0} ops/s under Max_R {MAX_RATE}: {reached:?}"
    );
}

/// Case 1 and 2 on `cluster` (configured by [`config`] with [`MAX_RATE`]), which it
/// returns afterwards.
fn psfa_caps_and_rebalances(cluster: Cluster) -> Cluster {
    let mut cluster = cluster_with_jobs(cluster);
    let ids = job_ids();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let computed = assert_policy_enforced(&cluster, &names, MAX_RATE, MEASURED);
    // Demands sum to Max_R and every job is saturated: PSFA gives each its demand.
    for ((job, demand), rate) in JOBS.iter().zip(computed) {
        assert!(
            (rate - demand).abs() <= RATE_TOLERANCE * demand,
            "{job}: PSFA computed {rate:.0} for demand {demand}"
        );
    }

    // job-4 leaves: its share goes to the others within two cycles.
    let before = cluster.snapshot();
    cluster.kill_job(names[3]);
    let left = Instant::now();
    wait_rebalanced(&cluster, "job-4 leaving", |snapshot| {
        snapshot.shares.iter().all(|s| s.job != names[3])
            && names[..3]
                .iter()
                .all(|j| assigned(snapshot, j) > assigned(&before, j) * 1.1)
    });
    eprintln!("job-4 left: rebalanced in {:?}", left.elapsed());
    std::thread::sleep(2 * INTERVAL);
    assert_policy_enforced(&cluster, &names[..3], MAX_RATE, MEASURED);

    // job-5 joins: it gets a share and the others shrink within two cycles.
    let before = cluster.snapshot();
    let late = job_id(LATE_JOB.0);
    cluster.start_job(&late, &NODES, OFFERED_PER_PROCESS);
    // Its processes' start-up (the stage, the first rules) is not the controller's.
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 4), ("n2", 4)]);
    let joined = Instant::now();
    wait_rebalanced(&cluster, "job-5 joining", |snapshot| {
        assigned(snapshot, &late) > 0.0
            && names[..3]
                .iter()
                .all(|j| assigned(snapshot, j) < assigned(&before, j) * 0.9)
    });
    eprintln!("job-5 joined: rebalanced in {:?}", joined.elapsed());
    std::thread::sleep(3 * INTERVAL);
    assert_policy_enforced(
        &cluster,
        &[names[0], names[1], names[2], &late],
        MAX_RATE,
        MEASURED,
    );
    assert!(cluster.controllers_alive(), "a controller died");
    cluster
}

/// Polls the snapshot until `done` holds, failing after [`REBALANCE_DEADLINE`].
fn wait_rebalanced(cluster: &Cluster, what: &str, mut done: impl FnMut(&Snapshot) -> bool) {
    crate::util::wait_for(
        REBALANCE_DEADLINE,
        &format!("rebalancing after {what}"),
        || cluster.try_snapshot().filter(&mut done).map(|_| ()),
    );
}

/// Each process's achieved rate over `from..to` (by index in `cluster.jobs`).
fn process_rates(cluster: &Cluster, from: Instant, to: Instant) -> Vec<f64> {
    cluster
        .jobs
        .iter()
        .map(|p| p.mean_rate(from, to).unwrap_or(0.0))
        .collect()
}

/// Measures every process for `seconds` (waiting for their last windows).
fn measure_processes(cluster: &Cluster, seconds: u32) -> (Instant, Instant, Vec<f64>) {
    let from = Instant::now();
    std::thread::sleep(seconds * INTERVAL);
    let to = Instant::now();
    std::thread::sleep(Duration::from_millis(1300));
    (from, to, process_rates(cluster, from, to))
}

/// Fail-static: the processes `affected` picks went on under the rules in force when
/// their controller went away, neither freed nor stopped. Checked per job over those
/// processes (the split of a job's rate over its processes follows their usage, so no
/// single process' rate bounds another's): the rules of the job's stages add up to what
/// the job was assigned (in `snapshot`, taken just before), so together they stay under
/// it (+10 %, as in [`assert_policy_enforced`]), while a stage that lost its rule runs at
/// the 2 000/s it offers, more than any job is assigned; and they all still run, at no
/// less than [`STARVED`] of what they did `before` (each process' rate, by index in
/// `cluster.jobs`).
fn assert_rates_kept(
    cluster: &mut Cluster,
    snapshot: &Snapshot,
    before: &[f64],
    after: &[f64],
    affected: impl Fn(&Replayer) -> bool,
    what: &str,
) {
    let mut totals: std::collections::BTreeMap<String, (f64, f64)> =
        std::collections::BTreeMap::new();
    for (i, process) in cluster.jobs.iter_mut().enumerate() {
        if !affected(process) {
            continue;
        }
        let (job, node) = (process.job.clone(), process.node.clone());
        assert!(process.is_running(), "{job} on {node} died {what}");
        let total = totals.entry(job).or_default();
        total.0 += before[i];
        total.1 += after[i];
    }
    for (job, (before_total, after_total)) in totals {
        let rule = assigned(snapshot, &job);
        let summary = format!(
            "{job} ran at {after_total:.0} ops/s {what}; it was assigned {rule:.0} and ran at {before_total:.0} before"
        );
        eprintln!("{summary}");
        let detail = format!("{summary} (all processes before {before:.0?}, after {after:.0?})");
        assert!(after_total <= rule * (1.0 + RATE_TOLERANCE), "{detail}");
        assert!(after_total >= before_total * STARVED, "{detail}");
    }
}

/// Case 3: SIGKILL a local controller, then the global one. Their stages keep their
/// last rates (fail-static) and nothing else dies; restarted on the same socket / port,
/// the stages re-register (through the local) and control resumes: new rates take effect.
#[test]
fn controllers_killed_leave_rates_in_force_and_control_resumes_after_restart() {
    let _turn = crate::util::alone();
    let mut cluster = cluster_with_jobs(Cluster::new(&config(MAX_RATE)));
    let ids = job_ids();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();

    // The local controller of n1 dies: its stages keep their rates, and the global
    // controller keeps their share for them (handing it to their jobs' other stages
    // would overload the file system by as much).
    let (_, _, before) = measure_processes(&cluster, MEASURED);
    let in_force = cluster.snapshot();
    cluster.kill_local("n1");
    cluster.wait_for_stages(REBALANCE_DEADLINE, &[("n2", 4)]);
    let snapshot = cluster.snapshot();
    assert!(
        snapshot
            .nodes
            .iter()
            .any(|n| n.node == "n1" && !n.attached && n.orphans == 4),
        "the global controller forgot n1's stages: {:?}",
        snapshot.nodes
    );
    std::thread::sleep(2 * INTERVAL);
    let (from, to, after) = measure_processes(&cluster, MEASURED);
    cluster.assert_aggregate_capped(from, to, MAX_RATE);
    assert_rates_kept(
        &mut cluster,
        &in_force,
        &before,
        &after,
        |p| p.node == "n1",
        "without its local controller",
    );
    assert!(
        cluster.controllers_alive(),
        "a controller died with the local one"
    );

    // Restarted on the same socket, it gets its stages back (they retry with a backoff of
    // at most 5 s), never overloading meanwhile, and the global controller controls them
    // again: a new Max_R reaches every stage.
    let restarted = Instant::now();
    cluster.start_local("n1");
    let snapshot = cluster.wait_for_stages(
        Duration::from_secs(5) + REBALANCE_DEADLINE,
        &[("n1", 4), ("n2", 4)],
    );
    let registered = Instant::now();
    eprintln!(
        "n1's stages re-registered {:?} after the restart",
        restarted.elapsed()
    );
    assert!(
        snapshot.nodes.iter().all(|n| n.orphans == 0),
        "re-registered stages are still orphans: {:?}",
        snapshot.nodes
    );
    std::thread::sleep(Duration::from_millis(1300));
    cluster.assert_aggregate_capped(restarted, registered, MAX_RATE);
    let halved = MAX_RATE / 2.0;
    let output = cluster.ctl(&["set-max-rate", &cluster.metadata(), &halved.to_string()]);
    assert!(output.status.success(), "set-max-rate: {output:?}");
    std::thread::sleep(3 * INTERVAL);
    assert_policy_enforced(&cluster, &names, halved, MEASURED);

    // The global controller dies: every stage keeps its rate, the locals keep serving.
    let (_, _, before) = measure_processes(&cluster, 2);
    let in_force = cluster.snapshot();
    cluster.kill_global();
    std::thread::sleep(INTERVAL);
    let (from, to, after) = measure_processes(&cluster, MEASURED);
    assert_rates_kept(
        &mut cluster,
        &in_force,
        &before,
        &after,
        |_| true,
        "without the global controller",
    );
    cluster.assert_aggregate_capped(from, to, halved);
    assert!(
        cluster.controllers_alive(),
        "a local controller died with the global one"
    );

    // Restarted on the same port (with its configuration's Max_R), the locals re-attach
    // and re-announce their stages, and the jobs share the whole capacity again.
    let restarted = Instant::now();
    cluster.start_global();
    cluster.wait_for_stages(
        Duration::from_secs(5) + REBALANCE_DEADLINE,
        &[("n1", 4), ("n2", 4)],
    );
    eprintln!(
        "the locals re-attached {:?} after the restart",
        restarted.elapsed()
    );
    std::thread::sleep(3 * INTERVAL);
    assert_policy_enforced(&cluster, &names, MAX_RATE, MEASURED);
    assert!(cluster.controllers_alive(), "a controller died");
}

/// Ample time for one request/reply on loopback, even on a loaded machine.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// A line longer than every socket's limit (256 KiB for stages, 64 KiB for the admin).
fn oversized_line() -> Vec<u8> {
    let mut line = vec![b'x'; 300 * 1024];
    line.push(b'\n');
    line
}

/// Connects to a Unix socket with read and write deadlines.
fn connect(path: &std::path::Path) -> (UnixStream, BufReader<UnixStream>) {
    let stream = UnixStream::connect(path).expect("socket accepts");
    stream
        .set_write_timeout(Some(REPLY_TIMEOUT))
        .expect("timeout");
    let reader = BufReader::new(stream.try_clone().expect("clone"));
    (stream, reader)
}

fn hello(version: u32, job: &str, mount: &str) -> Vec<u8> {
    let identity = Identity {
        job_id: job.into(),
        ..Identity::default()
    };
    control::encode(&StageMessage::Hello {
        version,
        stage_name: "e2e-probe".into(),
        identity,
        mountpoints: vec![mount.into()],
    })
    .into_bytes()
}

/// Sends `first` as a stage's first message and expects a `reject` naming `needle`,
/// then the connection closed.
fn expect_rejected(socket: &std::path::Path, first: &[u8], needle: &str) {
    let (mut stream, mut reader) = connect(socket);
    stream.write_all(first).expect("write");
    let line = read_line_with_timeout(&mut reader, REPLY_TIMEOUT).expect("a reply");
    match control::decode::<ControlMessage>(line.trim_end()) {
        Ok(ControlMessage::Reject { reason, .. }) => {
            assert!(
                reason.contains(needle),
                "reject '{reason}' should name {needle:?}"
            )
        }
        other => panic!("expected a reject naming {needle:?}, got {other:?}"),
    }
    assert_eq!(
        read_line_with_timeout(&mut reader, REPLY_TIMEOUT),
        None,
        "the controller should close a rejected connection"
    );
}

/// Sends garbage, oversized and wrong-version messages to a local controller: the
/// handshake ones are rejected with a reason; later ones are dropped (and logged) while
/// the stage's session carries on and keeps receiving rules.
fn garble_local_socket(cluster: &Cluster, node: &str) {
    let socket = cluster.local_socket(node);
    let mount = cluster.scratch.display().to_string();
    expect_rejected(&socket, b"this is not json\n", "malformed message");
    expect_rejected(&socket, &oversized_line(), "too long");
    expect_rejected(
        &socket,
        &hello(PROTOCOL_VERSION + 98, "probe", &mount),
        &format!("protocol version {}", PROTOCOL_VERSION + 98),
    );
    expect_rejected(
        &socket,
        b"{\"type\":\"usage\",\"seq\":1}\n",
        "malformed message",
    );
    // A partial line, then gone.
    let (mut stream, _) = connect(&socket);
    stream.write_all(b"{\"type\":\"hel").expect("write");
    drop(stream);

    // A stage of the oldest version served is welcomed in its own version.
    let (mut old, mut old_reader) = connect(&socket);
    old.write_all(&hello(OLDEST_PROTOCOL_VERSION, "probe", &mount))
        .expect("write");
    let welcome = read_line_with_timeout(&mut old_reader, REPLY_TIMEOUT).expect("welcome");
    assert!(
        matches!(
            control::decode::<ControlMessage>(welcome.trim_end()),
            Ok(ControlMessage::Welcome {
                version: OLDEST_PROTOCOL_VERSION,
                ..
            })
        ),
        "{welcome}"
    );
    drop((old, old_reader));

    let (mut stream, mut reader) = connect(&socket);
    stream
        .write_all(&hello(PROTOCOL_VERSION, "probe", &mount))
        .expect("write");
    let welcome = read_line_with_timeout(&mut reader, REPLY_TIMEOUT).expect("welcome");
    assert!(
        matches!(
            control::decode::<ControlMessage>(welcome.trim_end()),
            Ok(ControlMessage::Welcome {
                version: PROTOCOL_VERSION,
                ..
            })
        ),
        "{welcome}"
    );
    stream
        .write_all(b"\x00\x01 binary garbage \xff\n")
        .expect("write");
    stream.write_all(&oversized_line()).expect("write");
    stream
        .write_all(b"{\"type\":\"nuke\",\"everything\":true}\n")
        .expect("write");
    stream.write_all(b"{\"type\":\"usage\"}\n").expect("write");
    stream
        .write_all(&hello(PROTOCOL_VERSION, "probe", &mount))
        .expect("write");
    let usage = StageMessage::Usage {
        seq: 1,
        channels: Vec::new(),
        ops: Vec::new(),
        latency: Vec::new(),
    };
    stream
        .write_all(control::encode(&usage).as_bytes())
        .expect("write");
    // The session survived: rules of a cycle run after the garbage arrive.
    let sent = Instant::now();
    loop {
        let line = read_line_with_timeout(&mut reader, REPLY_TIMEOUT)
            .expect("the controller closed the probe's session after malformed messages");
        if let Ok(ControlMessage::SetRules { seq, .. }) = control::decode(line.trim_end()) {
            if seq > 0 && sent.elapsed() > INTERVAL {
                break;
            }
        }
        assert!(
            sent.elapsed() < 10 * INTERVAL,
            "no rules for the probe after the garbage"
        );
    }
    let snapshot = cluster.snapshot();
    assert!(
        snapshot
            .stages
            .iter()
            .any(|s| s.job == "probe" && s.node == node),
        "the global controller lost the probe stage: {:?}",
        snapshot.stages
    );
    drop((stream, reader));
    crate::util::wait_for(START_TIMEOUT, "the probe stage to leave", || {
        let snapshot = cluster.try_snapshot()?;
        snapshot
            .stages
            .iter()
            .all(|s| s.job != "probe")
            .then_some(())
    });
    let log = cluster.local_log(node);
    for needle in [
        "dropped a message from a stage",
        "dropped a 307200-byte message",
    ] {
        assert!(
            log.contains(needle),
            "the local log should say {needle:?}:\n{log}"
        );
    }
}

/// Garbage and protocol violations on the global controller's gRPC port: raw bytes
/// close the connection (a truncated TLS record at the handshake timeout at the latest); an `Attach` with a wrong version, an empty node name or no
/// `Register` first fails with `InvalidArgument` naming the problem.
fn garble_global_port(cluster: &Cluster) {
    for garbage in [
        &b"GET / HTTP/1.1\r\nHost: cheferd\r\n\r\n"[..],
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not a TLS hello, not HTTP/2 either",
        &[0xffu8; 4096][..],
    ] {
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", cluster.port)).expect("gRPC port accepts");
        stream
            .set_read_timeout(Some(
                cheferd_controller::tls::HANDSHAKE_TIMEOUT + REPLY_TIMEOUT,
            ))
            .expect("timeout");
        stream.write_all(garbage).expect("write");
        // Whatever the server answers (an HTTP/2 GOAWAY, an HTTP/1 error), it must end
        // the connection rather than wait for more.
        let mut answer = Vec::new();
        let closed = match stream.read_to_end(&mut answer) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(closed, "the gRPC port kept a garbage connection open");
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Well-formed clients hold a node certificate (of `intruder`, or of n1 for the
    // impostor below): what is checked here is the protocol, not the identity.
    let intruder = cluster.node_tls("intruder").load().expect("TLS files");
    let n1 = cluster.node_tls("n1").load().expect("TLS files");
    let port = cluster.port;
    let attach = |first: local_message::Body| {
        let tls = if matches!(&first, local_message::Body::Register(r) if r.node == "n1") {
            n1.clone()
        } else {
            intruder.clone()
        };
        async move {
            let mut client = crate::util::grpc_client(port, Some(tls)).await;
            let messages = tokio_stream::iter(vec![LocalMessage { body: Some(first) }]);
            client.attach(messages).await.map(|_| ())
        }
    };
    let register = |node: &str, version: u32| {
        local_message::Body::Register(proto::Register {
            node: node.into(),
            version,
        })
    };
    for (first, needle) in [
        (register("intruder", 99), "protocol version 99"),
        // Version 4 local controllers send mount and class strings in every report.
        (
            register("old", 4),
            "protocol version 4 (or empty node name) not supported; expected 5",
        ),
        (register("", proto::VERSION), "empty node name"),
        (
            local_message::Body::StageLeft(proto::StageLeft { stage_id: 1 }),
            "the first message must be register",
        ),
    ] {
        let result = runtime
            .block_on(async { tokio::time::timeout(REPLY_TIMEOUT, attach(first)).await })
            .expect("the global controller answers an Attach in time");
        let status = result.expect_err("a bad Attach must be refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(needle),
            "{status:?} should name {needle:?}"
        );
    }

    // An impostor registers as n1 (as a restarted n1 would) and vanishes: the real n1
    // must not be left attached but ignored; it re-attaches and its stages come back.
    runtime
        .block_on(async {
            tokio::time::timeout(REPLY_TIMEOUT, attach(register("n1", proto::VERSION))).await
        })
        .expect("the global controller answers an Attach in time")
        .expect("a well-formed Attach is accepted");
    cluster.wait_for_stages(
        Duration::from_secs(5) + REBALANCE_DEADLINE,
        &[("n1", 1), ("n2", 1)],
    );
}

/// Malformed requests on the admin socket get an error reply; the connection serves on.
fn garble_admin_socket(cluster: &Cluster) {
    let (mut stream, mut reader) = connect(&cluster.admin);
    let mut exchange = |request: &[u8]| -> serde_json::Value {
        stream.write_all(request).expect("write");
        let line = read_line_with_timeout(&mut reader, REPLY_TIMEOUT).expect("a reply");
        serde_json::from_str(&line).expect("a JSON reply")
    };
    for (request, needle) in [
        (&b"this is not json\n"[..], "malformed request"),
        (&oversized_line()[..], "exceeds 65536"),
        (b"{\"request\":\"reboot\"}\n", "reboot"),
        (
            b"{\"request\":\"change\",\"change\":{\"change\":\"policy\",\"resource\":\"/x:metadata\"}}\n",
            "policy",
        ),
    ] {
        let reply = exchange(request);
        let error = reply["error"].as_str().unwrap_or_default();
        assert!(error.contains(needle), "reply {reply} should name {needle:?}");
    }
    let reply = exchange(b"{\"request\":\"snapshot\"}\n");
    assert!(
        reply["ok"]["cycle"].is_u64(),
        "no snapshot after bad requests: {reply}"
    );
}

/// Runs `cheferd ctl` and checks its exit code and that its first line names `needle`.
fn expect_ctl(cluster: &Cluster, args: &[&str], code: i32, needle: &str) -> Output {
    let output = cluster.ctl(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert_eq!(output.status.code(), Some(code), "ctl {args:?}: {stderr}");
    assert!(
        first.contains(needle),
        "ctl {args:?}: {first:?} should name {needle:?}"
    );
    output
}

/// Case 4: malformed messages on every socket are rejected with clear errors, bad admin
/// commands exit with the documented codes naming the bad value, and afterwards both
/// controllers still serve: stages register and are controlled, `ctl` answers.
#[test]
fn malformed_messages_and_bad_commands_are_rejected_and_nothing_crashes() {
    let _turn = crate::util::alone();
    let mut cluster = Cluster::new(&config(MAX_RATE));
    cluster.start_global();
    for node in NODES {
        cluster.start_local(node);
    }
    let (job_1, job_2) = (job_id("job-1"), job_id("job-2"));
    cluster.start_job(&job_1, &NODES, OFFERED_PER_PROCESS);
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 1), ("n2", 1)]);

    garble_local_socket(&cluster, "n1");
    garble_global_port(&cluster);
    garble_admin_socket(&cluster);

    let resource = cluster.metadata();
    expect_ctl(&cluster, &["frobnicate"], 2, "'frobnicate'");
    expect_ctl(
        &cluster,
        &["set-policy", &resource, "nosuchpolicy"],
        2,
        "nosuchpolicy",
    );
    expect_ctl(&cluster, &["set-policy", "scratch", "psfa"], 2, "'scratch'");
    expect_ctl(&cluster, &["set-max-rate", &resource, "fast"], 2, "'fast'");
    expect_ctl(&cluster, &["set-job", &job_1, "--priority=-1"], 2, "-1");
    expect_ctl(
        &cluster,
        &[
            "set-job",
            &job_1,
            "--resource",
            &resource,
            "--demand",
            "lots",
        ],
        2,
        "'lots'",
    );
    expect_ctl(
        &cluster,
        &["set-max-rate", "/nowhere:metadata", "1k"],
        1,
        "'/nowhere:metadata'",
    );
    expect_ctl(
        &cluster,
        &["set-job", "nosuchjob", "--priority", "2"],
        1,
        "'nosuchjob'",
    );
    let mut unreachable = std::process::Command::new(crate::util::cheferd());
    unreachable
        .args(["ctl", "--socket"])
        .arg(cluster.dir.path().join("nothing.sock"))
        .arg("dump");
    let output = crate::util::run_with_timeout(&mut unreachable, REPLY_TIMEOUT);
    assert_eq!(output.status.code(), Some(69), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("nothing.sock"),
        "{output:?}"
    );
    // Nothing bad was applied; good commands still work.
    expect_ctl(&cluster, &["set-job", &job_1, "--priority", "2"], 0, "");
    expect_ctl(&cluster, &["set-policy", &resource, "psfa"], 0, "");

    assert!(cluster.controllers_alive(), "a controller crashed");
    let cycle = cluster.snapshot().cycle;
    cluster.start_process(&job_2, "n1", OFFERED_PER_PROCESS);
    let snapshot = cluster.wait_for_stages(START_TIMEOUT, &[("n1", 2), ("n2", 1)]);
    crate::util::wait_for(START_TIMEOUT, "job-2 to get a share", || {
        let snapshot = cluster.try_snapshot()?;
        (assigned(&snapshot, &job_2) > 0.0 && snapshot.cycle > cycle + 1).then_some(())
    });
    let config = cluster.ctl(&["dump"]);
    let dump: serde_json::Value = serde_json::from_slice(&config.stdout).expect("dump is JSON");
    assert_eq!(dump["config"]["jobs"][&job_1]["priority"], 2.0, "{dump}");
    assert_eq!(snapshot.resources[0].max_rate, MAX_RATE);
    assert!(cluster.controllers_alive(), "a controller crashed");
}

/// Changes from a uid that is not an administrator exit with 77; reading still works.
#[test]
#[cfg_attr(not(has_root), ignore = "needs root (runs ctl as another uid)")]
fn changes_from_a_uid_that_is_not_an_administrator_are_refused() {
    let _turn = crate::util::alone();
    let mut cluster = Cluster::new(&config(MAX_RATE));
    cluster.start_global();
    let resource = cluster.metadata();
    expect_permission_denied(&cluster, &resource);
    // The controller's own uid may.
    expect_ctl(&cluster, &["set-policy", &resource, "psfa"], 0, "");
}

fn expect_permission_denied(cluster: &Cluster, resource: &str) {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    assert_eq!(
        // SAFETY: `geteuid` takes no arguments, touches no memory of ours and cannot fail.
        unsafe { libc::geteuid() },
        0,
        "the permission check needs root to run ctl as another uid"
    );
    let nobody = 65534;
    std::fs::set_permissions(cluster.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let ctl = |args: &[&str]| {
        let mut command = std::process::Command::new(crate::util::cheferd());
        command
            .args(["ctl", "--socket"])
            .arg(&cluster.admin)
            .args(args)
            .uid(nobody)
            .gid(nobody);
        crate::util::run_with_timeout(&mut command, REPLY_TIMEOUT)
    };
    let output = ctl(&["set-policy", resource, "uniform"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(77), "{stderr}");
    assert!(stderr.contains("uid 65534"), "{stderr}");
    let output = ctl(&["nodes"]);
    assert!(
        output.status.success(),
        "read-only ctl as uid {nobody}: {output:?}"
    );
}
