//! A standby global controller with a real etcd (issue 11, part 2): two `cheferd
//! global --etcd`, two local controllers given both, jobs under the stage.
//!
//! - the leader is killed (`SIGKILL`): the standby leads within the lease's TTL and two
//!   intervals (and what a loaded machine adds), the locals follow it, an administrative change made before is still in
//!   force, the aggregate never exceeds `Max_R` × 1.05 in a second and no job fails;
//! - etcd is killed: every standby confirms it cannot reach etcd either, so the leader
//!   keeps controlling (a change made meanwhile reaches the jobs) and says so, in its
//!   log and `ctl status`; once etcd is back it still leads, with a valid lease;
//! - more changes than the bound are made: the leader folds them into one key, and the
//!   next leader restores the last of them;
//! - the leader is stopped (`SIGSTOP`) past its lease: the standby leads with the
//!   AdapTBF records it saved, and when the old leader resumes its rules are not
//!   applied (it finds its lease gone and exits).

use crate::ports::{self, Ports};
use crate::util::{job_id, wait_for, Cluster, CAP_TOLERANCE};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INTERVAL: Duration = Duration::from_millis(200);
/// The leases' time to live (`--etcd-ttl`).
pub(crate) const TTL: Duration = Duration::from_secs(2);
/// etcd revokes expired leases in a sweep every 500 ms, and the log is polled.
const SWEEP: Duration = Duration::from_millis(700);
/// What a loaded machine adds to a takeover: etcd's revoke (a write with its fsync),
/// the standby's campaign returning and its four reads before it says it leads, all
/// beside whatever else runs on the two cores.
const LOADED: Duration = Duration::from_secs(2);
/// High enough that a stage's few requests past its rule (one per thread, a batch:
/// ARCHITECTURE.md, invariant 12) stay within the 5 % tolerance.
pub(crate) const MAX_RATE: f64 = 2000.0;
/// `ctl set-max-rate` before the failover.
const CHANGED_MAX_RATE: f64 = 1400.0;
const NODES: [&str; 2] = ["n1", "n2"];
pub(crate) const ETCD_PREFIX: &str = "/padll-test";
/// How long etcd or a global controller may take to start serving (a loaded machine).
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);

/// An etcd member on loopback, its data in the cluster's directory (kept across a
/// restart, as a real member's disk is).
struct Member {
    name: String,
    /// The site directory whose CA and server certificate it serves clients with
    /// (`--client-cert-auth`); `None`: plaintext.
    tls: Option<PathBuf>,
    child: Option<Child>,
    data: PathBuf,
    log: PathBuf,
    client: u16,
    peer: u16,
}

impl Member {
    fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer)
    }

    /// Starts it (again), one of the cluster `initial_cluster`.
    fn start(&mut self, initial_cluster: &str) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("etcd log");
        let mut command = Command::new("etcd");
        if let Some(site) = &self.tls {
            command
                .arg("--cert-file")
                .arg(site.join("server.pem"))
                .arg("--key-file")
                .arg(site.join("server.key"))
                .arg("--trusted-ca-file")
                .arg(site.join("ca.pem"))
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--listen-client-urls", &self.client_url()])
            .args(["--advertise-client-urls", &self.client_url()])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its log, if it was started and has exited.
    fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        child.try_wait().ok().flatten()?;
        Some(std::fs::read_to_string(&self.log).unwrap_or_default())
    }
}

/// An etcd cluster of one or three members on loopback.
pub(crate) struct Etcd {
    members: Vec<Member>,
    /// The site directory of its TLS files, with the client certificate
    /// [`ETCD_CLIENT`] made for the global controllers; `None`: plaintext.
    tls: Option<PathBuf>,
    /// The members' client and peer ports, held while it lives (kept across restarts).
    _ports: Ports,
}

/// The name of the client certificate the global controllers present to etcd.
const ETCD_CLIENT: &str = "etcd-client";

impl Etcd {
    /// Starts `size` members — with TLS (server and client certificates of the
    /// cluster's site `tls`) if given — and waits until the cluster answers.
    pub(crate) fn start(dir: &std::path::Path, size: usize, tls: Option<PathBuf>) -> Etcd {
        if let Some(site) = &tls {
            cheferd_controller::tls::make_leaf(
                cheferd_controller::tls::Role::Node,
                &[ETCD_CLIENT.to_string()],
                site,
                site,
                30,
            )
            .expect("a client certificate for etcd");
        }
        // The data and log of each attempt are named after its ports: a member's data
        // records its cluster's peer URLs.
        ports::start_on_fresh_ports(2 * size as u16, "etcd", |ports| {
            let members = (0..size)
                .map(|i| {
                    let (client, peer) = (ports.get(2 * i as u16), ports.get(2 * i as u16 + 1));
                    Member {
                        name: format!("m{i}"),
                        tls: tls.clone(),
                        child: None,
                        data: dir.join(format!("etcd-{client}")),
                        log: dir.join(format!("etcd-{client}.log")),
                        client,
                        peer,
                    }
                })
                .collect();
            let mut etcd = Etcd {
                members,
                tls: tls.clone(),
                _ports: ports,
            };
            etcd.try_restart().then_some(etcd)
        })
    }

    /// `--etcd-ca`, `--etcd-cert` and `--etcd-key` (none without TLS).
    fn tls_args(&self) -> Vec<std::ffi::OsString> {
        let Some(site) = &self.tls else {
            return Vec::new();
        };
        let client = cheferd_controller::tls::loopback_node(site, ETCD_CLIENT);
        vec![
            "--etcd-ca".into(),
            client.ca.into(),
            "--etcd-cert".into(),
            client.cert.into(),
            "--etcd-key".into(),
            client.key.into(),
        ]
    }

    /// Every member's client URL, comma-separated (as `--etcd` takes them).
    fn urls(&self) -> String {
        let urls: Vec<String> = self.members.iter().map(Member::client_url).collect();
        urls.join(",")
    }

    /// Starts every member that is not running (again) and waits until the cluster
    /// answers.
    pub(crate) fn restart(&mut self) {
        assert!(self.try_restart(), "another process took an etcd port");
    }

    /// [`Etcd::restart`], or `false` if a member exited because its port was taken.
    fn try_restart(&mut self) -> bool {
        let initial_cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        let initial_cluster = initial_cluster.join(",");
        for member in self.members.iter_mut().filter(|m| m.child.is_none()) {
            member.start(&initial_cluster);
        }
        wait_for(START_TIMEOUT, "etcd to answer", || {
            if let Some(log) = self.members.iter_mut().find_map(Member::exited) {
                assert!(ports::in_use(&log), "an etcd member exited:\n{log}");
                return Some(false);
            }
            // Every member listens (a quorum answers before the last one has started).
            let listening = self
                .members
                .iter()
                .all(|m| std::net::TcpStream::connect(("127.0.0.1", m.client)).is_ok());
            let answers = || {
                self.call(|client| async move { client.leader("/padll-test/probe").await })
                    .is_ok()
            };
            (listening && answers()).then_some(true)
        })
    }

    /// The value of `key`, if etcd answers and it is set.
    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        let key = key.to_string();
        self.call(|client| async move { client.get(&key).await })
            .ok()
            .flatten()
    }

    /// The values of the keys that start with `prefix` (`None`: etcd does not answer).
    fn values(&self, prefix: &str) -> Option<Vec<String>> {
        let prefix = prefix.to_string();
        let kvs = self
            .call(|client| async move { client.range_prefix(&prefix).await })
            .ok()?;
        Some(
            kvs.iter()
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
                .collect(),
        )
    }

    /// One call of the project's etcd client, on a runtime of its own.
    fn call<F: std::future::Future>(
        &self,
        call: impl FnOnce(cheferd_controller::standby::etcd::Etcd) -> F,
    ) -> F::Output {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        // The client's channel spawns its connection task on the runtime.
        let _entered = runtime.enter();
        let urls: Vec<String> = self.members.iter().map(Member::client_url).collect();
        let tls = self.tls.as_ref().map(|site| {
            cheferd_controller::tls::loopback_node(site, ETCD_CLIENT)
                .load()
                .expect("the etcd client certificate")
        });
        let client = cheferd_controller::standby::etcd::Etcd::new(&urls, tls).expect("etcd URL");
        runtime.block_on(call(client))
    }

    /// Kills every member (`SIGKILL`).
    pub(crate) fn kill(&mut self) {
        self.members.iter_mut().for_each(Member::kill);
    }

    /// Kills every member and deletes its data: what a lost or rebuilt etcd holds.
    pub(crate) fn wipe(&mut self) {
        self.kill();
        for member in &self.members {
            std::fs::remove_dir_all(&member.data).expect("etcd's data deleted");
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One `cheferd global --etcd`, with its own port and admin socket.
pub(crate) struct Global {
    pub(crate) child: Child,
    port: u16,
    pub(crate) admin: PathBuf,
    log: PathBuf,
    /// Its name, and how many times it was started (each start logs to a file of its own).
    name: String,
    starts: usize,
    /// Holds its port while it lives.
    _port: Ports,
}

impl Global {
    /// Starts it and waits until it serves (on another port if its was taken).
    pub(crate) fn start(cluster: &Cluster, name: &str, etcd: &Etcd) -> Global {
        let admin = cluster.dir.path().join(format!("admin-{name}.sock"));
        ports::start_on_fresh_ports(1, "the global controller", |reserved| {
            let port = reserved.get(0);
            let log = cluster.dir.path().join(format!("global-{name}-1.log"));
            let mut global = Global {
                child: Self::spawn(cluster, etcd, port, &admin, &log),
                port,
                admin: admin.clone(),
                log,
                name: name.to_string(),
                starts: 1,
                _port: reserved,
            };
            global.wait_until_served().then_some(global)
        })
    }

    /// Starts it again on its port, as its service manager does once it has exited
    /// (killed if it has not), and waits until it serves.
    pub(crate) fn restart(&mut self, cluster: &Cluster, etcd: &Etcd) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.starts += 1;
        self.log = cluster
            .dir
            .path()
            .join(format!("global-{}-{}.log", self.name, self.starts));
        self.child = Self::spawn(cluster, etcd, self.port, &self.admin, &self.log);
        assert!(self.wait_until_served(), "another process took its port");
    }

    fn spawn(
        cluster: &Cluster,
        etcd: &Etcd,
        port: u16,
        admin: &std::path::Path,
        log: &std::path::Path,
    ) -> Child {
        let mut command = Command::new(crate::util::cheferd());
        cluster.global_args(&mut command, port, admin);
        command
            .args(["--etcd", &etcd.urls(), "--etcd-prefix", ETCD_PREFIX])
            .args(["--etcd-ttl", &TTL.as_secs().to_string()])
            .args(etcd.tls_args())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("cheferd global starts")
    }

    /// Waits until it serves: `false` if it exited because its port was taken.
    fn wait_until_served(&mut self) -> bool {
        wait_for(START_TIMEOUT, "the global controller to serve", || {
            if self.log().contains("global controller started") {
                return Some(true);
            }
            self.child.try_wait().ok().flatten()?;
            let log = self.log();
            assert!(ports::in_use(&log), "the global controller exited:\n{log}");
            Some(false)
        })
    }

    pub(crate) fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until its log says `what`; returns when it was seen.
    pub(crate) fn wait_for_log(&self, timeout: Duration, what: &str) -> Instant {
        wait_for(
            timeout,
            &format!("'{what}' in {}", self.log.display()),
            || self.log().contains(what).then(Instant::now),
        )
    }

    /// `ctl --json status` on its admin socket.
    pub(crate) fn status(&self) -> serde_json::Value {
        let mut command = Command::new(crate::util::cheferd());
        command
            .arg("ctl")
            .arg("--socket")
            .arg(&self.admin)
            .args(["--json", "status"]);
        let output = crate::util::run_with_timeout(&mut command, Duration::from_secs(10));
        assert!(output.status.success(), "ctl status: {output:?}");
        serde_json::from_slice(&output.stdout).expect("ctl --json status prints JSON")
    }

    /// Waits until its `ctl status` satisfies `holds`.
    pub(crate) fn wait_for_status(&self, what: &str, holds: impl Fn(&serde_json::Value) -> bool) {
        wait_for(Duration::from_secs(20), what, || {
            let status = self.status();
            holds(&status).then_some(())
        });
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }
}

impl Drop for Global {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A cluster of one resource, `Max_R` [`MAX_RATE`] under `policy`; nothing started.
pub(crate) fn new_cluster(policy: &str) -> Cluster {
    Cluster::new(&format!(
        "interval_ms = {}\n[[resource]]\nname = \"{{scratch}}:metadata\"\nmax_rate = \"{MAX_RATE}\"\npolicy = \"{policy}\"\n",
        INTERVAL.as_millis()
    ))
}

/// Global controller A elected on `etcd`, then B standing by; `cluster`'s admin
/// commands go to A, and local controllers started after are given B's URL first (B
/// refuses them and they follow it to A).
pub(crate) fn leader_and_standby(cluster: &mut Cluster, etcd: &Etcd) -> (Global, Global) {
    let a = Global::start(cluster, "a", etcd);
    a.wait_for_log(START_TIMEOUT, "elected leader");
    let b = Global::start(cluster, "b", etcd);
    b.wait_for_log(START_TIMEOUT, "following");
    cluster.admin = a.admin.clone();
    cluster.global_urls = format!("{},{}", b.url(), a.url());
    (a, b)
}

/// etcd, global controller A elected, B standing by, both nodes' local controllers
/// (given both URLs) attached to A, and two jobs offering more than `Max_R` on both
/// nodes under `policy`, past their warm-up.
pub(crate) fn cluster(
    policy: &str,
    etcd_members: usize,
    etcd_tls: bool,
) -> (Cluster, Etcd, Global, Global) {
    let mut cluster = new_cluster(policy);
    let etcd = Etcd::start(
        cluster.dir.path(),
        etcd_members,
        etcd_tls.then(|| cluster.tls.clone()),
    );
    let (a, b) = leader_and_standby(&mut cluster, &etcd);
    for node in NODES {
        cluster.start_local(node);
    }
    for job in ["j1", "j2"] {
        cluster.start_job(&job_id(job), &NODES, MAX_RATE as u64);
    }
    cluster.wait_for_stages(Duration::from_secs(20), &[("n1", 2), ("n2", 2)]);
    std::thread::sleep(4 * INTERVAL);
    (cluster, etcd, a, b)
}

/// Waits until the aggregate runs at `max_rate` (a change took effect: between half
/// of it, the floor of a loaded machine, and the tolerance); returns when.
pub(crate) fn wait_capped(cluster: &Cluster, max_rate: f64) -> Instant {
    wait_for(
        Duration::from_secs(20),
        &format!("the aggregate to run at {max_rate:.0}/s"),
        || {
            let t = Instant::now() - Duration::from_millis(1200);
            let aggregate = cluster.whole_aggregate_at(t)?;
            (aggregate > max_rate / 2.0 && aggregate <= max_rate * CAP_TOLERANCE).then(Instant::now)
        },
    )
}

pub(crate) fn set_max_rate(cluster: &Cluster, rate: f64) {
    let output = cluster.ctl(&["set-max-rate", &cluster.metadata(), &rate.to_string()]);
    assert!(
        output.status.success(),
        "ctl set-max-rate: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Starts etcd again with its data: `leader` finds its lease and leads on in `term`.
pub(crate) fn restart_etcd_and_lead_on(etcd: &mut Etcd, leader: &Global, term: u64) {
    etcd.restart();
    leader.wait_for_status("the leader to find etcd and its lease again", |status| {
        status["etcd_reachable"] == true && status["lease_valid"] == true
    });
    assert_eq!(leader.status()["term"], term, "it leads in the same term");
}

pub(crate) fn assert_jobs_running(cluster: &mut Cluster) {
    for process in &mut cluster.jobs {
        assert!(
            process.is_running(),
            "a process of job {} on {} ended",
            process.job,
            process.node
        );
    }
}

#[test]
#[cfg_attr(not(has_etcd), ignore = "etcd not installed")]
fn the_standby_takes_over_a_killed_leader_with_its_changes_and_jobs_stay_capped() {
    let _turn = crate::util::alone();
    let (cluster, _etcd, a, b) = cluster("psfa", 1, false);
    fails_over(cluster, a, b);
}

/// The same with a three-member etcd cluster, one of whose members is killed before
/// the leader: the two left keep quorum, and the election works on.
#[test]
#[cfg_attr(not(has_etcd), ignore = "etcd not installed")]
fn with_three_etcd_members_one_killed_the_standby_still_takes_over() {
    let _turn = crate::util::alone();
    let (cluster, mut etcd, a, b) = cluster("psfa", 3, false);
    etcd.members[0].kill();
    // Whichever member led etcd's Raft, the two left elect one (≈ 1 s) and every
    // controller's etcd calls go to them.
    std::thread::sleep(Duration::from_secs(3));
    a.wait_for_status("A controlling with two etcd members", |status| {
        status["controlling"] == true
    });
    fails_over(cluster, a, b);
}

/// The same with etcd speaking TLS only, and asking for client certificates.
#[test]
#[cfg_attr(not(has_etcd), ignore = "etcd not installed")]
fn over_tls_to_etcd_the_standby_still_takes_over() {
    let _turn = crate::util::alone();
    let (cluster, etcd, a, b) = cluster("psfa", 1, true);
    assert!(etcd.urls().starts_with("https://"));
    fails_over(cluster, a, b);
}

/// `kill -9` of leader A with a change made: B leads within TTL + 2 intervals + etcd's
/// sweep (+ [`LOADED`]), with the change, the jobs stay capped and none fails.
fn fails_over(mut cluster: Cluster, mut a: Global, b: Global) {
    // A standby refuses changes, naming the leader.
    let refused = {
        let mut on_b = Command::new(crate::util::cheferd());
        on_b.arg("ctl").arg("--socket").arg(&b.admin).args([
            "set-max-rate",
            &cluster.metadata(),
            "100",
        ]);
        crate::util::run_with_timeout(&mut on_b, Duration::from_secs(10))
    };
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains(&a.url()));

    set_max_rate(&cluster, CHANGED_MAX_RATE);
    let capped = wait_capped(&cluster, CHANGED_MAX_RATE);
    std::thread::sleep(Duration::from_secs(2));

    let killed = Instant::now();
    let _ = a.child.kill();
    let _ = a.child.wait();
    let elected = b.wait_for_log(Duration::from_secs(15), "elected leader");
    let takeover = elected - killed;
    eprintln!("the standby led {takeover:?} after the leader was killed");
    assert!(
        takeover <= TTL + 2 * INTERVAL + SWEEP + LOADED,
        "the standby led {takeover:?} after the kill (TTL {TTL:?}, interval {INTERVAL:?})"
    );
    assert!(
        b.log().contains("restored=1"),
        "the change was not restored"
    );

    cluster.admin = b.admin.clone();
    cluster.wait_for_stages(Duration::from_secs(20), &[("n1", 2), ("n2", 2)]);
    let resources = cluster.snapshot().resources;
    assert_eq!(resources[0].max_rate, CHANGED_MAX_RATE, "{resources:?}");
    std::thread::sleep(Duration::from_secs(6));
    cluster.assert_aggregate_capped(capped, Instant::now(), CHANGED_MAX_RATE);
    // B controls: a new change reaches the jobs.
    set_max_rate(&cluster, CHANGED_MAX_RATE / 2.0);
    wait_capped(&cluster, CHANGED_MAX_RATE / 2.0);
    assert_jobs_running(&mut cluster);
    assert!(cluster.controllers_alive(), "a local controller died");
}

#[test]
#[cfg_attr(not(has_etcd), ignore = "etcd not installed")]
fn with_etcd_down_the_leader_keeps_controlling_and_says_so() {
    let _turn = crate::util::alone();
    let (mut cluster, mut etcd, a, b) = cluster("psfa", 1, false);
    let status = a.status();
    assert_eq!(status["role"], "leader", "{status}");
    assert_eq!(status["leader"], a.url().as_str(), "{status}");
    assert_eq!(
        (&status["etcd_reachable"], &status["lease_valid"]),
        (&true.into(), &true.into()),
        "{status}"
    );
    let term = status["term"].as_u64().expect("a term");
    assert_eq!(b.status()["role"], "follower");
    assert_eq!(b.status()["term"], term, "B knows A's term");

    etcd.kill();
    a.wait_for_log(
        Duration::from_secs(15),
        &format!(
            "keeping control in term {term} (every standby confirms that it cannot reach etcd either)"
        ),
    );
    assert!(a.log().contains("etcd unreachable since "), "{}", a.log());
    let status = a.status();
    assert_eq!(status["etcd_reachable"], false, "{status}");
    assert_eq!(status["controlling"], true, "{status}");
    assert_eq!(b.status()["etcd_reachable"], false);
    // A still adapts the rules: a change made with etcd down reaches the jobs.
    set_max_rate(&cluster, CHANGED_MAX_RATE);
    let capped = wait_capped(&cluster, CHANGED_MAX_RATE);
    std::thread::sleep(Duration::from_secs(3));
    cluster.assert_aggregate_capped(capped, Instant::now(), CHANGED_MAX_RATE);
    assert!(
        !b.log().contains("elected leader"),
        "B was elected with etcd down"
    );

    restart_etcd_and_lead_on(&mut etcd, &a, term);
    // A controls on: another change reaches the jobs.
    set_max_rate(&cluster, CHANGED_MAX_RATE / 2.0);
    wait_capped(&cluster, CHANGED_MAX_RATE / 2.0);
    assert!(!b.log().contains("elected leader"), "B was elected");
    assert_jobs_running(&mut cluster);
    assert!(cluster.controllers_alive(), "a local controller died");
}

#[test]
#[cfg_attr(not(has_etcd), ignore = "etcd not installed")]
fn a_leader_stopped_past_its_lease_is_replaced_and_its_rules_are_not_applied() {
    let _turn = crate::util::alone();
    let (mut cluster, etcd, mut a, b) = cluster("adaptbf", 1, false);
    // AdapTBF's records, saved every 5 s, go to the next leader.
    let key = format!("{ETCD_PREFIX}/policy-state");
    wait_for(Duration::from_secs(20), "the policy state in etcd", || {
        etcd.get(&key)
    });
    a.signal(libc::SIGSTOP);
    b.wait_for_log(Duration::from_secs(15), "elected leader");
    assert!(b.log().contains("policy_states=1"), "{}", b.log());
    cluster.admin = b.admin.clone();
    cluster.wait_for_stages(Duration::from_secs(20), &[("n1", 2), ("n2", 2)]);
    // The new leader lowers Max_R; the old one still plans the configured one.
    set_max_rate(&cluster, CHANGED_MAX_RATE);
    let capped = wait_capped(&cluster, CHANGED_MAX_RATE);

    a.signal(libc::SIGCONT);
    let status = wait_for(Duration::from_secs(15), "the old leader to exit", || {
        a.child.try_wait().ok().flatten()
    });
    assert!(!status.success());
    // Whichever notices first: its keep-alive (the lease is gone), B (a newer term)
    // or a write to etcd (its election key is gone).
    let log = a.log();
    assert!(
        [
            "has expired",
            "another global controller leads",
            "it no longer leads"
        ]
        .iter()
        .any(|why| log.contains(why)),
        "{log}"
    );
    std::thread::sleep(Duration::from_secs(4));
    cluster.assert_aggregate_capped(capped, Instant::now(), CHANGED_MAX_RATE);
    assert_jobs_running(&mut cluster);
    assert!(cluster.controllers_alive(), "a local controller died");
}

#[test]
#[cfg_attr(not(has_etcd), ignore = "etcd not installed")]
fn the_leader_folds_the_stored_changes_and_the_next_one_restores_them() {
    use cheferd_controller::standby::persist::FOLD_AFTER;
    let _turn = crate::util::alone();
    let (mut cluster, etcd, mut a, b) = cluster("psfa", 1, false);
    // A priority set with a demand folds into two assignments, both restored.
    let j1 = job_id("j1");
    let metadata = cluster.metadata();
    let set_job = [
        "set-job",
        &j1,
        "--priority",
        "5",
        "--resource",
        &metadata,
        "--demand",
        "500",
    ];
    let output = cluster.ctl(&set_job);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let changes = FOLD_AFTER + 6;
    for i in 0..changes {
        set_max_rate(&cluster, CHANGED_MAX_RATE + i as f64);
    }
    let last = CHANGED_MAX_RATE + (changes - 1) as f64;
    let keys = format!("{ETCD_PREFIX}/changes/");
    // The leader stores changes after `ctl` has its answer: wait for the last one.
    let last_change = format!("\"rate\":\"{last}\"");
    let folded = wait_for(Duration::from_secs(20), "the changes folded", || {
        let left = etcd.values(&keys)?;
        let folded = etcd.get(&format!("{ETCD_PREFIX}/changes-folded"))?;
        let stored = left.iter().any(|change| change.contains(&last_change));
        (stored && left.len() <= FOLD_AFTER).then_some((left.len(), folded))
    });
    let (left, folded) = (
        folded.0,
        serde_json::from_slice::<serde_json::Value>(&folded.1),
    );
    eprintln!("{left} change keys left, folded: {folded:?}");
    let folded = folded.expect("the folded changes are JSON");
    assert_eq!(folded.as_array().map(Vec::len), Some(3), "{folded}");
    assert!(a.log().contains("folded the stored changes"), "{}", a.log());

    let _ = a.child.kill();
    let _ = a.child.wait();
    b.wait_for_log(Duration::from_secs(15), "elected leader");
    assert!(
        b.log().contains(&format!("restored={}", left + 3)),
        "{}",
        b.log()
    );
    cluster.admin = b.admin.clone();
    let resources = cluster.snapshot().resources;
    assert_eq!(resources[0].max_rate, last, "{resources:?}");
    let dump: serde_json::Value =
        serde_json::from_slice(&cluster.ctl(&["dump"]).stdout).expect("ctl dump is JSON");
    let restored = &dump["config"]["jobs"][&j1];
    assert_eq!(restored["priority"], serde_json::json!(5.0), "{restored}");
    assert_jobs_running(&mut cluster);
}
