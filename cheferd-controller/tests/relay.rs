//! `cheferd relay` between local controllers and the global controller, all real
//! processes under mutual TLS: only a relay the configuration names may speak for
//! nodes; the nodes attached through it are controlled as if attached directly; a
//! local controller must present its own node's certificate to the relay; when the
//! relay goes, its nodes' stages keep their rules, and its nodes come back with it.

use crate::ports::Ports;
use crate::util::{self, cheferd, job_id, wait_for, Cluster, START_TIMEOUT};
use cheferd_controller::proto::{self, local_message, LocalMessage};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MAX_RATE: f64 = 2000.0;
const INTERVAL: Duration = Duration::from_secs(1);

/// A `cheferd relay` with its log.
struct Relay {
    child: Child,
    log: PathBuf,
}

impl Relay {
    /// Starts the relay `name` (its node certificate's) on `port`, attached to the
    /// global controller of `cluster`; it serves the cluster's server certificate
    /// (127.0.0.1).
    fn start(cluster: &Cluster, name: &str, port: u16) -> Relay {
        let node = cluster.node_tls(name);
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let log = cluster
            .dir
            .path()
            .join(format!("relay-{name}-{started}.log"));
        let child = Command::new(cheferd())
            .args(["relay", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--global", &format!("https://127.0.0.1:{}", cluster.port)])
            .arg("--tls-cert")
            .arg(cluster.tls.join("server.pem"))
            .arg("--tls-key")
            .arg(cluster.tls.join("server.key"))
            .arg("--node-cert")
            .arg(&node.cert)
            .arg("--node-key")
            .arg(&node.key)
            .arg("--tls-ca")
            .arg(&node.ca)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("relay log"))
            .spawn()
            .expect("cheferd relay starts");
        Relay { child, log }
    }

    fn wait_for_log(&self, what: &str) {
        wait_for(START_TIMEOUT, what, || {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            log.contains(what).then_some(())
        });
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Measures the job's aggregate over five seconds and checks it against `Max_R`.
fn assert_capped(cluster: &Cluster) {
    let from = Instant::now();
    std::thread::sleep(5 * INTERVAL);
    let to = Instant::now();
    // The last window of every replayer is reported up to a second after `to`.
    std::thread::sleep(Duration::from_millis(1300));
    cluster.assert_aggregate_capped(from, to, MAX_RATE);
}

#[test]
fn nodes_attached_through_a_relay_are_controlled_and_come_back_with_it() {
    let _turn = util::alone();
    let mut cluster = Cluster::new(&format!(
        "interval_ms = {}\nrelays = [\"rack1\"]\n[[resource]]\nname = \"{{scratch}}:metadata\"\nmax_rate = \"{MAX_RATE}\"\npolicy = \"psfa\"\n",
        INTERVAL.as_millis()
    ));
    cluster.start_global();
    let ports = Ports::reserve(1);
    let port = ports.get(0);

    // A relay whose certificate `relays` does not name cannot speak for nodes.
    let rogue = Relay::start(&cluster, "rack2", port);
    rogue.wait_for_log("node 'rack2' is not a relay");
    drop(rogue);

    let mut relay = Relay::start(&cluster, "rack1", port);
    relay.wait_for_log("relaying to the global controller");
    cluster.global_urls = format!("https://127.0.0.1:{port}");
    for node in ["n1", "n2"] {
        cluster.start_local(node);
    }
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 0), ("n2", 0)]);
    let job = job_id("relayed");
    cluster.start_job(&job, &["n1", "n2"], 2 * MAX_RATE as u64);
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 1), ("n2", 1)]);
    std::thread::sleep(4 * INTERVAL);
    assert_capped(&cluster);

    // A local controller must present the certificate of the node it registers as.
    let refused = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let tls = cluster.node_tls("n3").load().expect("node TLS files load");
        let mut client = util::grpc_client(port, Some(tls)).await;
        let register = LocalMessage {
            body: Some(local_message::Body::Register(proto::Register {
                node: "n1".into(),
                version: proto::VERSION,
            })),
        };
        let stream =
            tokio_stream::StreamExt::chain(tokio_stream::iter([register]), tokio_stream::pending());
        client.attach(stream).await.err()
    });
    let refused = refused.expect("a stream registering another node's name is refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");

    // The relay goes: its nodes detach, and their stages keep their last rules.
    drop(relay);
    wait_for(START_TIMEOUT, "the relay's nodes to detach", || {
        let snapshot = cluster.try_snapshot()?;
        snapshot.nodes.iter().all(|n| !n.attached).then_some(())
    });
    assert_capped(&cluster);

    // It comes back: the local controllers attach through it again.
    relay = Relay::start(&cluster, "rack1", port);
    relay.wait_for_log("relaying to the global controller");
    cluster.wait_for_stages(Duration::from_secs(30), &[("n1", 1), ("n2", 1)]);
    assert_capped(&cluster);
}
