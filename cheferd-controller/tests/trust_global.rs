//! Issue 18 ("Trust, round 2"), the global controller's side: what an unprivileged user
//! did to its listeners and views, each replayed here against real processes, with what
//! must hold instead. Descriptor limits are set low (1024) so that a modest flood would
//! have exhausted them; the caps are what `ListenerCaps` gives for that limit. Attacks
//! that must come from another uid run as uid 65534 (`setpriv`): `cheferd ctl` itself,
//! or this test binary's `zz_nobody_helper`.

use crate::util::*;
use cheferd_controller::admin::{IDLE_TIMEOUT, MAX_CONNECTIONS_PER_USER};
use cheferd_controller::bounds::{ListenerCaps, METRICS_LIFETIME, UNAUTHENTICATED_LIFETIME};
use cheferd_controller::proto::{self, global_message, local_message, LocalMessage};
use padll_wire::config::Identity;
use padll_wire::control::{self, StageMessage, PROTOCOL_VERSION};
use std::io::{BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The global controller's descriptor limit in these tests.
const NOFILE: u64 = 1024;

const CONFIG: &str = TRUST_CONFIG;

/// The caps the global controller runs with under [`NOFILE`].
fn caps() -> ListenerCaps {
    ListenerCaps::for_descriptors(NOFILE)
}

/// Sockets a process holds open (its descriptors that are sockets).
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// `127.0.0.N`, a loopback address of its own for a flood's source.
fn loopback(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

/// Raises this process' soft descriptor limit to its hard one (a flood's client side
/// holds many).
fn raise_own_nofile() {
    cheferd_controller::bounds::raise_nofile();
}

/// A TLS client configuration that trusts the cluster's CA and has no certificate.
fn without_certificate(cluster: &Cluster) -> tonic::transport::ClientTlsConfig {
    let ca = std::fs::read(cluster.tls.join("ca.pem")).unwrap();
    tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
}

/// Opens `count` TLS connections without a client certificate to `port`, from
/// `sources` in turn, 16 at a time, and keeps them (as the attacker did) until the
/// returned channels are dropped; `opened` counts those that connected.
async fn certificateless_flood(
    port: u16,
    tls: tonic::transport::ClientTlsConfig,
    count: usize,
    sources: Vec<IpAddr>,
    opened: Arc<AtomicUsize>,
) -> Vec<tonic::transport::Channel> {
    let mut connecting = tokio::task::JoinSet::new();
    let mut channels = Vec::new();
    for i in 0..count {
        if connecting.len() >= 16 {
            if let Some(Ok(Some(channel))) = connecting.join_next().await {
                channels.push(channel);
            }
        }
        let endpoint = cheferd_controller::tls::endpoint(
            &format!("https://127.0.0.1:{port}"),
            Some(tls.clone()),
        )
        .unwrap()
        .local_address(Some(sources[i % sources.len()]));
        let opened = opened.clone();
        connecting.spawn(async move {
            let channel = tokio::time::timeout(Duration::from_secs(20), endpoint.connect())
                .await
                .ok()?
                .ok()?;
            opened.fetch_add(1, Ordering::Relaxed);
            Some(channel)
        });
    }
    while let Some(joined) = connecting.join_next().await {
        if let Ok(Some(channel)) = joined {
            channels.push(channel);
        }
    }
    channels
}

/// Attack a: TLS connections without a client certificate on the gRPC port. Before,
/// they stayed open for ever (~23 KB each) and 3 × 6 700 of them took every descriptor:
/// `ctl status` failed and a real node could not attach. Now such a client can ask
/// `Standing` and nothing else; at most the unauthenticated cap is open at once (the
/// oldest of a crowded address is closed for a newcomer), each for a few seconds; a
/// node attaches and `ctl status` answers during a flood of more connections than the
/// descriptor limit.
#[test]
fn attack_a_certificateless_tls_flood_is_capped_and_a_node_still_attaches() {
    let _turn = alone();
    raise_own_nofile();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global_with(Some(NOFILE));
    let pid = cluster.global_pid();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // A standby's question works without a certificate; attaching does not.
    let tls = without_certificate(&cluster);
    let port = cluster.port;
    let (standing, attach) = runtime.block_on(async {
        let mut client = grpc_client(port, Some(tls.clone())).await;
        let standing = client.standing(proto::StandingRequest {}).await;
        let (_tx, rx) = tokio::sync::mpsc::unbounded_channel::<LocalMessage>();
        let attach = client
            .attach(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await;
        (standing, attach.map(|_| ()))
    });
    assert!(standing.is_ok(), "{standing:?}");
    let refused = attach.expect_err("attached without a certificate");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    std::thread::sleep(Duration::from_secs(1));
    let baseline = sockets(pid);
    let (rss_before, _) = rss_kib(pid);
    // More connections than the descriptor limit, from eight addresses (the node's
    // among them).
    let total = NOFILE as usize + 500;
    let opened = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let (done, flooded) = std::sync::mpsc::channel::<()>();
    let flood = {
        let (tls, opened) = (tls.clone(), opened.clone());
        let sources = (1..=8).map(loopback).collect();
        // Its runtime, and so its side of the connections, lives until `stop`.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            let channels =
                runtime.block_on(certificateless_flood(port, tls, total, sources, opened));
            let _ = done.send(());
            let _ = stopped.recv();
            drop(channels);
        })
    };
    let mut most = 0;
    let sample = |most: &mut usize| *most = (*most).max(sockets(pid));
    wait_for(Duration::from_secs(120), "a third of the flood", || {
        sample(&mut most);
        (opened.load(Ordering::Relaxed) >= total / 3).then_some(())
    });
    // A real node attaches during the flood, and ctl answers.
    cluster.start_local("n1");
    wait_for(
        Duration::from_secs(60),
        "n1 to attach during the flood",
        || {
            sample(&mut most);
            cluster
                .try_snapshot()
                .filter(|s| s.nodes.iter().any(|n| n.node == "n1" && n.attached))
        },
    );
    let status = cluster.ctl(&["status"]);
    assert!(
        status.status.success(),
        "ctl status during the flood: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    wait_for(Duration::from_secs(300), "the whole flood", || {
        sample(&mut most);
        flooded.try_recv().ok()
    });
    for _ in 0..10 {
        sample(&mut most);
        std::thread::sleep(Duration::from_millis(100));
    }
    let opened = opened.load(Ordering::Relaxed);
    let (_, rss_peak) = rss_kib(pid);
    let cap = caps().grpc.provisional;
    eprintln!(
        "{opened} connections opened; the global held at most {most} sockets (baseline {baseline}, cap {cap}); RSS {rss_before} → peak {rss_peak} KiB"
    );
    assert!(opened > NOFILE as usize, "only {opened} connections opened");
    // The baseline, the cap, n1's stream, and ctl's connections.
    assert!(most <= baseline + cap + 8, "{most} sockets open");
    assert!(rss_peak < rss_before + 64 * 1024, "RSS peak {rss_peak} KiB");
    // The attacker keeps its connections open: the controller closes them.
    let lifetime = UNAUTHENTICATED_LIFETIME;
    wait_for(
        lifetime * 6,
        "every unauthenticated connection closed",
        || (sockets(pid) <= baseline + 2).then_some(()),
    );
    let _ = stop.send(());
    flood.join().unwrap();
    let snapshot = cluster.snapshot();
    assert!(
        snapshot.nodes.iter().any(|n| n.node == "n1" && n.attached),
        "n1 lost its stream: {:?}",
        snapshot.nodes
    );
    let log = cluster.global_log();
    assert!(!log.contains("accept failed"), "{log}");
    assert!(log.contains("closed the oldest from"), "no eviction logged");
    assert!(cluster.controllers_alive());
}

/// Whether the server is done with a client's connection: it closed it (or answered),
/// rather than leaving it waiting.
fn closed_by_server(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let waiting = stream.peek(&mut [0u8; 1]);
    stream.set_nonblocking(false).unwrap();
    !matches!(waiting, Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// `count` TCP connections to `port` on 127.0.0.1 from the address `source`.
fn connect_from(source: IpAddr, port: u16, count: usize) -> Vec<TcpStream> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut streams = Vec::new();
        for _ in 0..count {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind((source, 0).into()).unwrap();
            let stream = socket.connect((loopback(1), port).into()).await.unwrap();
            streams.push(stream.into_std().unwrap());
        }
        streams
    })
}

/// Attack a, one address: plain TCP connections (no TLS handshake ever) from one
/// address. At most its share is open at once — the oldest are closed for newcomers —
/// another address is not affected, and the rest close at the end of their lifetime.
#[test]
fn attack_a_one_address_holds_at_most_its_share_for_a_few_seconds() {
    let _turn = alone();
    raise_own_nofile();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global_with(Some(NOFILE));
    let per_source = caps().grpc.per_source;
    let crowd = connect_from(loopback(9), cluster.port, per_source * 3);
    let other = connect_from(loopback(10), cluster.port, per_source / 2);
    let open = |streams: &[TcpStream]| streams.iter().filter(|s| !closed_by_server(s)).count();
    let open_crowd = wait_for(
        Duration::from_secs(20),
        "the crowd cut to its share",
        || {
            let open = open(&crowd);
            (open <= per_source).then_some(open)
        },
    );
    eprintln!(
        "{open_crowd} of {} connections from one address open",
        crowd.len()
    );
    assert!(
        !closed_by_server(crowd.last().unwrap()),
        "the newest connection was closed"
    );
    assert_eq!(
        open(&other),
        other.len(),
        "another address lost connections"
    );
    let lifetime = UNAUTHENTICATED_LIFETIME;
    wait_for(lifetime * 6, "every connection closed", || {
        (open(&crowd) + open(&other) == 0).then_some(())
    });
    assert!(cluster.controllers_alive());
}

/// `GET /metrics` on `port`: the status line and body.
fn get_metrics(port: u16) -> (String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_default();
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// Attack g: idle connections to the metrics endpoint (it had no cap and no timeout,
/// and spun on accept errors). At most its cap is open at once, a fresh client is
/// served meanwhile, no CPU is spent on the idle ones, and they are closed after the
/// endpoint's lifetime (a client that sends half a request too).
#[test]
fn attack_g_idle_metrics_connections_are_capped_and_closed() {
    let _turn = alone();
    raise_own_nofile();
    let mut cluster = Cluster::new(CONFIG);
    cluster.start_global_with(Some(NOFILE));
    let pid = cluster.global_pid();
    std::thread::sleep(Duration::from_secs(1));
    let baseline = sockets(pid);
    let cap = caps().metrics.total;
    let mut idle = Vec::new();
    for n in 1..=4 {
        idle.extend(connect_from(loopback(n), cluster.metrics_port, cap));
    }
    let mut half = TcpStream::connect(("127.0.0.1", cluster.metrics_port)).unwrap();
    half.write_all(b"GET /metr").unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let held = sockets(pid);
    let ticks = cpu_ticks(pid);
    let (status, body) = get_metrics(cluster.metrics_port);
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("cheferd_cycles_total"), "{body}");
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_ticks(pid) - ticks;
    // SAFETY: sysconf takes a plain constant and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    eprintln!(
        "{} idle connections: the global held {held} sockets (baseline {baseline}, cap {cap}); {spent} CPU ticks in 2 s",
        idle.len() + 1
    );
    assert!(held <= baseline + cap + 4, "{held} sockets open");
    assert!(
        spent < hz,
        "{spent} ticks of CPU in 2 s with idle connections"
    );
    let open = |streams: &[TcpStream]| streams.iter().filter(|s| !closed_by_server(s)).count();
    wait_for(METRICS_LIFETIME * 4, "every idle connection closed", || {
        (open(&idle) == 0 && closed_by_server(&half)).then_some(())
    });
    let (status, _) = get_metrics(cluster.metrics_port);
    assert!(status.contains("200"), "{status}");
    let log = cluster.global_log();
    assert!(!log.contains("accept failed"), "{log}");
    assert!(cluster.controllers_alive());
}

/// A feed of three targets on one server whose emptiest is `emptiest`, padded with
/// comment lines to `bytes`.
fn feed(emptiest: u32, bytes: usize) -> String {
    let mut text = String::from("oss=0 cpu=10 memory=20\n");
    for target in 0..3 {
        let avail = if target == emptiest { 900_000 } else { 100_000 };
        text.push_str(&format!(
            "obdfilter.lustre-OST{target:04x}.kbytestotal=1000000\n\
             obdfilter.lustre-OST{target:04x}.kbytesavail={avail}\n"
        ));
    }
    let padding = "# a long feed: other parameters, stats blocks and comments are skipped\n";
    while text.len() < bytes {
        text.push_str(padding);
    }
    text
}

/// A local controller's side of a gRPC stream (a valid node certificate) that asks
/// for placements.
struct Placer {
    tx: tokio::sync::mpsc::UnboundedSender<LocalMessage>,
    inbound: tonic::Streaming<proto::GlobalMessage>,
    next: u64,
}

impl Placer {
    async fn attach(cluster: &Cluster, node: &str) -> Placer {
        let mut client = cluster.grpc_client(node).await;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(LocalMessage {
            body: Some(local_message::Body::Register(proto::Register {
                node: node.into(),
                version: proto::VERSION,
            })),
        })
        .unwrap();
        let inbound = client
            .attach(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Placer {
            tx,
            inbound,
            next: 1,
        }
    }

    /// The targets the global controller gives a new one-stripe file on `mount`.
    async fn place(&mut self, mount: &Path) -> Vec<u32> {
        self.next += 1;
        let request = self.next;
        self.tx
            .send(LocalMessage {
                body: Some(local_message::Body::PlaceRequest(proto::PlaceRequest {
                    request,
                    mount: mount.display().to_string(),
                    stripes: 1,
                    stage_id: 0,
                })),
            })
            .unwrap();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(20), self.inbound.message())
                .await
                .expect("a placement answer within 20 s")
                .unwrap()
                .expect("the stream stays open");
            if let Some(global_message::Body::PlaceReply(reply)) = message.body {
                if reply.request == request {
                    return reply.targets;
                }
            }
        }
    }
}

/// Replaces the feed at `path` as its documentation says: a new file renamed over it
/// (a reader never sees it half-written).
fn replace_feed(path: &Path, text: &str) {
    let new = path.with_extension("new");
    std::fs::write(&new, text).unwrap();
    std::fs::rename(&new, path).unwrap();
}

/// Replaces `path` with a FIFO no one writes to.
fn make_fifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let made = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path, which lives across the call.
    assert_eq!(unsafe { libc::mkfifo(made.as_ptr(), 0o600) }, 0);
}

/// Attack i: placement feeds larger than 1 MiB. A feed of up to 4 MiB (its documented
/// cap) is used; a larger one, and a FIFO, are refused naming the file while requests
/// are answered from the last loads; the next good feed is taken (the reader never
/// hung on the FIFO).
#[test]
fn attack_i_feeds_up_to_4_mib_are_used_and_refused_ones_do_not_block_requests() {
    let _turn = alone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ost-load");
    replace_feed(&path, &feed(2, 3 << 20));
    let mut cluster = Cluster::new(&format!(
        "{CONFIG}[placement]\nmount = \"{{scratch}}\"\nplacer = \"mcmf\"\nfeed = \"{}\"\nrefresh_ms = 200\n",
        path.display()
    ));
    cluster.start_global();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut node = runtime.block_on(Placer::attach(&cluster, "n1"));
    let scratch = cluster.scratch.clone();
    let mut place = || runtime.block_on(node.place(&scratch));
    wait_for(
        Duration::from_secs(20),
        "the 3 MiB feed's emptiest target",
        || (place() == [2]).then_some(()),
    );
    let shown = path.display().to_string();
    let refused = |why: &str| {
        let log = cluster.global_log();
        log.lines()
            .any(|l| l.contains(&format!("feed '{shown}'")) && l.contains(why))
    };
    replace_feed(&path, &feed(0, 4 << 20 | 1));
    wait_for(
        Duration::from_secs(20),
        "the 4 MiB + 1 feed refused",
        || refused("exceeds the limit of 4194304").then_some(()),
    );
    assert_eq!(place(), [2], "the last loads stay in use");
    make_fifo(&path);
    wait_for(Duration::from_secs(20), "the FIFO refused", || {
        refused("not a regular file").then_some(())
    });
    let asked = Instant::now();
    assert_eq!(place(), [2], "the last loads stay in use");
    eprintln!("answered in {:?} with a FIFO as the feed", asked.elapsed());
    std::fs::remove_file(&path).unwrap();
    replace_feed(&path, &feed(1, 100));
    wait_for(Duration::from_secs(20), "the next good feed taken", || {
        (place() == [1]).then_some(())
    });
    assert!(cluster.controllers_alive());
}

/// Attack j: hostile file sizes on a node's stream — a batch over the bound, an empty
/// one, a size beyond `MAX_FILE_BYTES`, a stage id never announced — are each dropped
/// with one line naming why; placement goes on.
#[test]
fn attack_j_hostile_file_sizes_are_dropped_naming_why() {
    let _turn = alone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ost-load");
    replace_feed(&path, &feed(2, 100));
    let mut cluster = Cluster::new(&format!(
        "{CONFIG}[placement]\nmount = \"{{scratch}}\"\nplacer = \"mcmf\"\nfeed = \"{}\"\n",
        path.display()
    ));
    cluster.start_global();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut node = runtime.block_on(Placer::attach(&cluster, "n1"));
    let scratch = cluster.scratch.clone();
    let max = padll_wire::control::MAX_FILE_BYTES;
    for (stage_id, bytes) in [
        (1, vec![1; 65]),
        (1, vec![]),
        (1, vec![1, max + 1]),
        (999, vec![max]),
    ] {
        node.tx
            .send(LocalMessage {
                body: Some(local_message::Body::FileSizes(proto::FileSizes {
                    stage_id,
                    mount: scratch.display().to_string(),
                    bytes,
                })),
            })
            .unwrap();
    }
    wait_for(Duration::from_secs(20), "every refusal logged", || {
        let log = cluster.global_log();
        [
            "dropped file sizes: 65 sizes in one message (1 to 64)",
            "dropped file sizes: 0 sizes in one message (1 to 64)",
            &format!(
                "dropped file sizes: a size of {} bytes is beyond {max}",
                max + 1
            ),
            "dropped file sizes: unknown stage id 999",
        ]
        .iter()
        .all(|line| log.contains(line))
        .then_some(())
    });
    assert_eq!(runtime.block_on(node.place(&scratch)), [2]);
    assert!(cluster.controllers_alive());
}

/// Not a test: what runs as uid 65534 for the tests below, until killed. With
/// `TRUST_GLOBAL_JOB`, a stage on the socket `TRUST_GLOBAL_SOCKET` that said hello as a
/// process of that job on `TRUST_GLOBAL_MOUNT`; without, as many idle connections to
/// the admin socket `TRUST_GLOBAL_SOCKET` as it can open (up to 300).
#[test]
#[ignore = "helper, run as another uid by the tests of this module"]
fn zz_nobody_helper() {
    let Ok(socket) = std::env::var("TRUST_GLOBAL_SOCKET") else {
        return;
    };
    let mut held = Vec::new();
    match std::env::var("TRUST_GLOBAL_JOB") {
        Ok(job) => {
            let mount = std::env::var("TRUST_GLOBAL_MOUNT").unwrap();
            let (stream, reply) = stage(Path::new(&socket), &job, &mount);
            println!("REPLY {}", reply.trim());
            held.push(stream);
        }
        Err(_) => held.extend((0..300).map_while(|_| UnixStream::connect(&socket).ok())),
    }
    println!("HELD {}", held.len());
    std::thread::sleep(Duration::from_secs(600));
}

/// Runs this binary's attacker helper as uid 65534 with `vars`.
fn as_nobody(vars: &[(&str, &str)]) -> std::process::Child {
    run_as_nobody(
        "trust_global::zz_nobody_helper",
        vars,
        std::process::Stdio::null(),
    )
}

/// A stage connection that said hello as a process of `job` on `mount`, and the reply.
fn stage(socket: &Path, job: &str, mount: &str) -> (UnixStream, String) {
    let mut stream = UnixStream::connect(socket).expect("connect to the stage socket");
    let hello = StageMessage::Hello {
        version: PROTOCOL_VERSION,
        stage_name: "privacy".into(),
        identity: Identity {
            job_id: job.into(),
            job_size: 1,
            ..Identity::default()
        },
        mountpoints: vec![mount.to_string()],
    };
    stream
        .write_all(control::encode(&hello).as_bytes())
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_line_with_timeout(&mut reader, Duration::from_secs(20)).unwrap_or_default();
    (stream, reply)
}

/// `cheferd ctl --socket ADMIN ARGS…` as uid 65534.
fn ctl_as_nobody(admin: &Path, args: &[&str]) -> std::process::Output {
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(cheferd())
        .arg("ctl")
        .arg("--socket")
        .arg(admin)
        .args(args);
    let output = run_with_timeout(&mut command, Duration::from_secs(30));
    assert!(
        output.status.success(),
        "ctl {args:?} as uid 65534: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Attack c: `ctl stages --json` and `ctl jobs` as uid 65534 showed every user's job
/// names, pids, uids, mountpoints and usage. A user who is no administrator now sees
/// only the stages of their uid and their jobs' shares and settings, in every view;
/// root sees all.
#[test]
#[cfg_attr(
    not(all(has_root, has_setpriv)),
    ignore = "needs root and setpriv to look as another uid"
)]
fn attack_c_a_user_sees_only_their_own_stages_and_jobs() {
    let _turn = alone();
    let secret = job_id("secret-project");
    let mut cluster = Cluster::new(&format!(
        "{CONFIG}[[job]]\nid = \"{secret}\"\npriority = 2\n"
    ));
    std::fs::set_permissions(cluster.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    cluster.start_global();
    cluster.start_local("n1");
    let socket = cluster.local_socket("n1");
    let scratch = cluster.scratch.display().to_string();
    let (_root_stage, reply) = stage(&socket, &secret, &scratch);
    assert!(reply.contains("welcome"), "{reply}");
    let mut nobody = as_nobody(&[
        ("TRUST_GLOBAL_SOCKET", socket.to_str().unwrap()),
        ("TRUST_GLOBAL_JOB", "mine"),
        ("TRUST_GLOBAL_MOUNT", &scratch),
    ]);
    let mine = "mine@uid65534";
    // Root sees both stages and both jobs' shares.
    wait_for(Duration::from_secs(30), "both jobs planned", || {
        let snapshot = cluster.try_snapshot()?;
        let jobs: Vec<&str> = snapshot.shares.iter().map(|s| s.job.as_str()).collect();
        (snapshot.stages.len() == 2 && jobs.contains(&mine) && jobs.contains(&secret.as_str()))
            .then_some(())
    });
    let admin = cluster.admin.clone();
    let stages: Vec<serde_json::Value> =
        serde_json::from_slice(&ctl_as_nobody(&admin, &["stages", "--json"]).stdout).unwrap();
    assert_eq!(stages.len(), 1, "{stages:?}");
    assert_eq!(
        (stages[0]["uid"].as_u64(), stages[0]["job"].as_str()),
        (Some(65534), Some(mine))
    );
    let jobs: serde_json::Value =
        serde_json::from_slice(&ctl_as_nobody(&admin, &["jobs", "--json"]).stdout).unwrap();
    let shares: Vec<&str> = jobs["shares"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["job"].as_str())
        .collect();
    assert_eq!(shares, [mine], "{jobs}");
    for view in [
        &["stages"][..],
        &["jobs"],
        &["top", "--once"],
        &["dump"],
        &["nodes"],
        &["status"],
        &["stages", "--json"],
        &["jobs", "--json"],
    ] {
        let output = ctl_as_nobody(&admin, view);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            !text.contains("secret-project"),
            "ctl {view:?} as uid 65534:\n{text}"
        );
    }
    let dump: serde_json::Value =
        serde_json::from_slice(&ctl_as_nobody(&admin, &["dump"]).stdout).unwrap();
    assert!(
        dump["config"]["jobs"].as_object().unwrap().is_empty(),
        "{dump}"
    );
    // Root sees every stage in the same views.
    let all = cluster.ctl(&["stages", "--json"]);
    let all: Vec<serde_json::Value> = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(all.len(), 2, "{all:?}");
    let dump = String::from_utf8_lossy(&cluster.ctl(&["dump"]).stdout).into_owned();
    assert!(dump.contains(&secret) && dump.contains(mine));
    let _ = nobody.kill();
    let _ = nobody.wait();
}

/// A user who is no administrator holds at most a few admin connections, so idle ones
/// of theirs never keep root's `cheferd ctl` out; they are closed when idle.
#[test]
#[cfg_attr(
    not(all(has_root, has_setpriv)),
    ignore = "needs root and setpriv to connect as another uid"
)]
fn idle_admin_connections_of_a_user_leave_room_for_administrators() {
    let _turn = alone();
    let mut cluster = Cluster::new(CONFIG);
    std::fs::set_permissions(cluster.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    cluster.start_global();
    let pid = cluster.global_pid();
    let baseline = sockets(pid);
    let mut holder = as_nobody(&[("TRUST_GLOBAL_SOCKET", cluster.admin.to_str().unwrap())]);
    wait_for(
        Duration::from_secs(30),
        "the user's connections refused",
        || {
            let log = cluster.global_log();
            log.contains("refused an admin connection of uid 65534")
                .then_some(())
        },
    );
    let held = sockets(pid) - baseline.min(sockets(pid));
    eprintln!("the global holds {held} of the user's admin connections");
    assert!(held <= MAX_CONNECTIONS_PER_USER, "{held} connections held");
    let status = cluster.ctl(&["status"]);
    assert!(
        status.status.success(),
        "ctl status as root: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    // Idle connections are closed.
    wait_for(IDLE_TIMEOUT * 4, "the idle connections closed", || {
        (sockets(pid) <= baseline).then_some(())
    });
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(cluster.controllers_alive());
}
