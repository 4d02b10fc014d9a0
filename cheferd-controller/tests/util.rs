//! A control plane on loopback for the end-to-end tests: one `cheferd global`, `cheferd
//! local`s and jobs (`cheferd-lab replay` under `libpadll.so`), each a real process, all in
//! a temporary directory of their own. Every wait has a deadline, and dropping the
//! cluster kills and reaps every process it started (also when a test fails, when it
//! prints the tail of every log first).

use crate::ports::{self, Ports};
use cheferd_controller::global::Snapshot;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a `cheferd ctl` call may take before the test fails.
const CTL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long what a test starts (a controller, a job's stages) may take to be up on a
/// loaded machine.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The aggregate may exceed `Max_R` by this much, over three seconds.
pub const CAP_TOLERANCE: f64 = 1.05;
/// How much more than its rate a one-second window may hold: a long-running thread is
/// admitted in batches of up to 128 ms of its rate (`padll-stage/src/credit.rs`,
/// `BATCH_SPAN_MAX_NS`) plus its 10 ms bucket, so a window that catches one batch more
/// than its share holds up to 13.8 % more, and a window next to it as much less; and a
/// replayer's own windows stretch when it is descheduled. Over three seconds it evens out
/// to [`CAP_TOLERANCE`]. A stage that lost its limit runs at what it offers, several
/// times its share, and crosses both.
const ONE_SECOND_TOLERANCE: f64 = CAP_TOLERANCE + 0.138;
/// Replayers run until the test kills them.
const REPLAY_SECONDS: &str = "600";

#[path = "../../scripts/test-turns.rs"]
mod turns;
pub use turns::{alone, together};

#[path = "../../scripts/test-clocks.rs"]
pub mod clocks;

/// `name` made unique to this test run, for a job whose processes run under the stage:
/// the stage keeps a job's shared buckets and last rules in `/dev/shm` under its id
/// (`padll-<uid>-<job>`, `padll-rules-<uid>-<job>`), which two test runs on one machine
/// must not share.
pub fn job_id(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

#[path = "../../scripts/test-cargo.rs"]
mod cargo;
pub use cargo::profile_dir;

#[path = "../../scripts/test-moosefs.rs"]
pub mod moosefs;
use moosefs::MooseFs;

/// The repository's root.
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/ is in cheferd-controller/, in the repository")
        .to_path_buf()
}

/// The binary `name` of `cheferd-controller` (`cheferd`, …), built once per test
/// binary.
pub fn bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| cargo::build(&["-p", "cheferd-controller", "--bins"]));
    profile_dir().join(name)
}

/// The `cheferd` binary under test.
pub fn cheferd() -> PathBuf {
    bin("cheferd")
}

/// The `cheferd-lab` binary under test (the demo, the replayer).
pub fn cheferd_lab() -> PathBuf {
    bin("cheferd-lab")
}

/// The stage (and `padll`), built once per test binary.
pub fn stage_library() -> PathBuf {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            cargo::build(&["-p", "padll-stage"]);
            padll_wire::locate_stage_library(&profile_dir()).expect("libpadll.so after building it")
        })
        .clone()
}

/// Polls `probe` every 100 ms until it returns `Some`, or fails the test at `timeout`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs a command to completion, killing it and failing the test after `timeout`.
pub fn run_with_timeout(command: &mut Command, timeout: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("command starts");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped")));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// A daemon (controller) with its log file.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One process of a job: a constant-load replayer under the stage. Its per-second
/// output is read by a thread and stamped with the time it arrived.
pub struct Replayer {
    /// Job id (`PADLL_JOB_ID`).
    pub job: String,
    /// The node whose local controller it talks to.
    pub node: String,
    child: Child,
    /// End of each one-second window of the replayer, and the operations done in it.
    windows: Arc<Mutex<Vec<(Instant, u64)>>>,
}

impl Replayer {
    /// Still running?
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Operations per second in the replayer's one-second window containing `t`.
    pub fn rate_at(&self, t: Instant) -> Option<f64> {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows
            .iter()
            .find(|(end, _)| *end >= t && *end - Duration::from_secs(1) < t)
            .map(|(_, ops)| *ops as f64)
    }

    /// Mean operations per second over its windows lying wholly within `from..=to`.
    pub fn mean_rate(&self, from: Instant, to: Instant) -> Option<f64> {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let inside: Vec<u64> = windows
            .iter()
            .filter(|(end, _)| *end <= to && *end - Duration::from_secs(1) >= from)
            .map(|(_, ops)| *ops)
            .collect();
        (!inside.is_empty()).then(|| inside.iter().sum::<u64>() as f64 / inside.len() as f64)
    }
}

impl Drop for Replayer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A global controller, local controllers and jobs on loopback.
pub struct Cluster {
    /// Everything lives here: configuration, sockets, logs, the managed scratch dir.
    pub dir: tempfile::TempDir,
    /// The managed mountpoint (`PADLL_MOUNTS`).
    pub scratch: PathBuf,
    /// The global controller's gRPC port (kept across its restarts).
    pub port: u16,
    /// Its Prometheus metrics port.
    pub metrics_port: u16,
    /// Holds both ports for this cluster while it lives.
    ports: Ports,
    /// Whether the global controller has served on them: it cannot move ports after.
    global_served: bool,
    /// The admin socket.
    pub admin: PathBuf,
    /// The site CA, the global controller's certificate (for 127.0.0.1 and localhost)
    /// and node certificates (made as nodes start), all by `cheferd certs`.
    pub tls: PathBuf,
    global: Option<Daemon>,
    locals: BTreeMap<String, Daemon>,
    /// Environment variables for local controllers (e.g. `SLURM_CONF` for `scontrol`).
    pub local_env: Vec<(String, String)>,
    /// Local controllers' `--global` (this cluster's port; a standby's test lists
    /// every global controller).
    pub global_urls: String,
    /// Jobs' processes, in start order.
    pub jobs: Vec<Replayer>,
    /// Every job it started a process of (ids of this run, see [`job_id`]).
    started_jobs: std::collections::BTreeSet<String>,
    restarts: usize,
    /// The MooseFS the managed directory is on, if any; stopped after every process
    /// of the cluster (fields drop after [`Cluster`]'s own drop).
    moosefs: Option<MooseFs>,
}

impl Cluster {
    /// A cluster whose global controller runs `config` (TOML; `{scratch}` stands for the
    /// managed directory). Nothing is started yet.
    pub fn new(config: &str) -> Cluster {
        Cluster::with_moosefs(config, None)
    }

    /// [`Cluster::new`] with the managed directory on a MooseFS of its own: the jobs'
    /// processes run in its mount namespace, the controllers where they are.
    pub fn on_moosefs(config: &str) -> Cluster {
        Cluster::with_moosefs(config, Some(MooseFs::start()))
    }

    fn with_moosefs(config: &str, moosefs: Option<MooseFs>) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("cheferd-e2e-")
            .tempdir()
            .expect("temp dir");
        let scratch = match &moosefs {
            Some(moosefs) => moosefs.mount().join("scratch"),
            None => dir.path().join("scratch"),
        };
        std::fs::create_dir(reachable(&moosefs, &scratch)).expect("scratch dir");
        let config = config.replace("{scratch}", &scratch.display().to_string());
        std::fs::write(dir.path().join("global.toml"), config).expect("config written");
        let ports = Ports::reserve(2);
        let (port, metrics_port) = (ports.get(0), ports.get(1));
        let tls = dir.path().join("tls");
        certs(&["ca", "--out", tls.to_str().unwrap()]);
        certs(&[
            "server",
            "127.0.0.1",
            "localhost",
            "--ca",
            tls.to_str().unwrap(),
            "--out",
            tls.to_str().unwrap(),
        ]);
        Cluster {
            tls,
            admin: dir.path().join("admin.sock"),
            scratch,
            port,
            metrics_port,
            ports,
            global_served: false,
            dir,
            global: None,
            locals: BTreeMap::new(),
            local_env: Vec::new(),
            global_urls: format!("https://127.0.0.1:{port}"),
            jobs: Vec::new(),
            started_jobs: Default::default(),
            restarts: 0,
            moosefs,
        }
    }

    /// The MooseFS the managed directory is on ([`Cluster::on_moosefs`]).
    pub fn moosefs(&self) -> Option<&MooseFs> {
        self.moosefs.as_ref()
    }

    /// The `resource` name of the scratch directory's metadata.
    pub fn metadata(&self) -> String {
        format!("{}:metadata", self.scratch.display())
    }

    /// A log file, fresh for every (re)start of a process.
    fn log(&mut self, name: &str) -> (PathBuf, std::fs::File) {
        self.restarts += 1;
        let path = self
            .dir
            .path()
            .join(format!("{:02}-{name}.log", self.restarts));
        let file = std::fs::File::create(&path).expect("log file");
        (path, file)
    }

    /// Starts (or restarts) the global controller on the cluster's port and waits for
    /// its admin socket to answer.
    pub fn start_global(&mut self) {
        self.start_global_with(None);
    }

    /// Starts the global controller with its descriptor limit set to `nofile` (soft and
    /// hard), if given. At its first start, on other ports if one of its was taken.
    pub fn start_global_with(&mut self, nofile: Option<u64>) {
        for attempt in 1.. {
            let (log, file) = self.log("global");
            let mut command = limit_nofile(Command::new(cheferd()), nofile);
            self.global_args(&mut command, self.port, &self.admin);
            let child = command
                .args(["--metrics", &format!("127.0.0.1:{}", self.metrics_port)])
                .stderr(file)
                .spawn()
                .expect("cheferd global starts");
            self.global = Some(Daemon { child, log });
            // A killed predecessor's socket file refuses connections until it is replaced.
            let exited = wait_for(START_TIMEOUT, "the global controller", || {
                if self.try_snapshot().is_some() {
                    return Some(None);
                }
                let global = self.global.as_mut().expect("just started");
                global.exited().map(|_| Some(self.global_log()))
            });
            let Some(log) = exited else {
                self.global_served = true;
                return;
            };
            assert!(
                ports::in_use(&log) && !self.global_served && attempt < ports::ATTEMPTS,
                "the global controller exited:\n{log}"
            );
            eprintln!("the global controller's port was taken: starting it on others");
            self.ports = Ports::reserve(2);
            (self.port, self.metrics_port) = (self.ports.get(0), self.ports.get(1));
            self.global_urls = format!("https://127.0.0.1:{}", self.port);
        }
    }

    /// `cheferd global` of this cluster's configuration and TLS files, on `port` and
    /// the admin socket `admin` (stdout and stdin null, logging at info).
    pub fn global_args(&self, command: &mut Command, port: u16, admin: &std::path::Path) {
        command
            .arg("global")
            .arg("--config")
            .arg(self.dir.path().join("global.toml"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--tls-cert")
            .arg(self.tls.join("server.pem"))
            .arg("--tls-key")
            .arg(self.tls.join("server.key"))
            .arg("--tls-client-ca")
            .arg(self.tls.join("ca.pem"))
            .arg("--admin-socket")
            .arg(admin)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
    }

    /// Samples the aggregate of every job's processes once per second over `from..to`
    /// (windows ended and reported by now) and fails if the mean of three seconds in a
    /// row (of all, if fewer) exceeds `max_rate` × [`CAP_TOLERANCE`], or one second
    /// `max_rate` × [`ONE_SECOND_TOLERANCE`].
    pub fn assert_aggregate_capped(&self, from: Instant, to: Instant, max_rate: f64) {
        let reported = Instant::now() - Duration::from_millis(1200);
        let mut t = from + Duration::from_millis(500);
        let mut samples = Vec::new();
        while t < to.min(reported) {
            samples.push(self.aggregate_at(t));
            t += Duration::from_secs(1);
        }
        assert!(!samples.is_empty(), "no window to check");
        eprintln!("aggregate per second (Max_R {max_rate:.0}): {samples:.0?}");
        for (s, total) in samples.iter().enumerate() {
            assert!(
                *total <= max_rate * ONE_SECOND_TOLERANCE,
                "second {s}: aggregate {total:.0} ops/s > Max_R {max_rate:.0} + 18.8 % (all: {samples:.0?})"
            );
        }
        for (s, three) in samples.windows(3.min(samples.len())).enumerate() {
            let mean = three.iter().sum::<f64>() / three.len() as f64;
            assert!(
                mean <= max_rate * CAP_TOLERANCE,
                "seconds {s}-{}: aggregate {mean:.0} ops/s > Max_R {max_rate:.0} + 5 % (all: {samples:.0?})",
                s + three.len() - 1
            );
        }
    }

    /// SIGKILLs the global controller.
    pub fn kill_global(&mut self) {
        if let Some(mut global) = self.global.take() {
            global.kill();
        }
    }

    /// The socket of a node's local controller (its stages' `PADLL_CONTROLLER`).
    pub fn local_socket(&self, node: &str) -> PathBuf {
        self.dir.path().join(format!("local-{node}.sock"))
    }

    /// Starts (or restarts) a node's local controller and waits for its socket.
    pub fn start_local(&mut self, node: &str) {
        self.start_local_with(node, &[], None);
    }

    /// Starts a node's local controller with extra arguments and its descriptor limit
    /// set to `nofile` (soft and hard), if given.
    pub fn start_local_with(&mut self, node: &str, extra: &[&str], nofile: Option<u64>) {
        let socket = self.local_socket(node);
        let _ = std::fs::remove_file(&socket);
        let (log, file) = self.log(&format!("local-{node}"));
        let tls = self.node_tls(node);
        let child = limit_nofile(Command::new(cheferd()), nofile)
            .args(["local", "--node", node, "--report-ms", "250"])
            .args(extra)
            .arg("--socket")
            .arg(&socket)
            .args(["--global", &self.global_urls])
            .arg("--tls-cert")
            .arg(&tls.cert)
            .arg("--tls-key")
            .arg(&tls.key)
            .arg("--tls-ca")
            .arg(&tls.ca)
            .envs(self.local_env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("cheferd local starts");
        self.locals.insert(node.to_string(), Daemon { child, log });
        wait_for(START_TIMEOUT, "the local socket", || {
            socket.exists().then_some(())
        });
    }

    /// A node's certificate, key and the site CA, made with `cheferd certs node` the
    /// first time.
    pub fn node_tls(&self, node: &str) -> cheferd_controller::tls::ClientTls {
        let tls = cheferd_controller::tls::loopback_node(&self.tls, node);
        if !tls.cert.exists() {
            let dir = self.tls.to_str().unwrap();
            certs(&["node", node, "--ca", dir, "--out", dir]);
        }
        tls
    }

    /// A gRPC client of the global controller presenting `node`'s certificate.
    pub fn grpc_client(&self, node: &str) -> impl std::future::Future<Output = GrpcClient> {
        let tls = self.node_tls(node).load().expect("node TLS files load");
        grpc_client(self.port, Some(tls))
    }

    /// The process id of a node's local controller.
    pub fn local_pid(&self, node: &str) -> u32 {
        self.locals[node].child.id()
    }

    /// The process id of the global controller.
    pub fn global_pid(&self) -> u32 {
        self.global.as_ref().expect("global started").child.id()
    }

    /// The global controller's log so far.
    pub fn global_log(&self) -> String {
        self.global
            .as_ref()
            .and_then(|g| std::fs::read_to_string(&g.log).ok())
            .unwrap_or_default()
    }

    /// SIGKILLs a node's local controller.
    pub fn kill_local(&mut self, node: &str) {
        if let Some(mut local) = self.locals.remove(node) {
            local.kill();
        }
    }

    /// Whether every controller started is still running (none crashed).
    pub fn controllers_alive(&mut self) -> bool {
        let global = self.global.as_mut().is_none_or(|g| g.exited().is_none());
        global && self.locals.values_mut().all(|l| l.exited().is_none())
    }

    /// The log of a node's local controller so far.
    pub fn local_log(&self, node: &str) -> String {
        self.locals
            .get(node)
            .and_then(|l| std::fs::read_to_string(&l.log).ok())
            .unwrap_or_default()
    }

    /// Starts one process of `job` on `node`: the replayer offering `rate` ops/s under
    /// the stage, in its own directory of the scratch dir.
    pub fn start_process(&mut self, job: &str, node: &str, rate: u64) -> usize {
        let dir = self.scratch.join(job);
        std::fs::create_dir_all(reachable(&self.moosefs, &dir)).expect("job dir");
        let (_, file) = self.log(&format!("{job}-{node}"));
        let mut command = match &self.moosefs {
            Some(moosefs) => moosefs.command(cheferd_lab()),
            None => Command::new(cheferd_lab()),
        };
        let mut child = command
            .args(["replay", "--rate", &rate.to_string()])
            .args(["--seconds", REPLAY_SECONDS, "--threads", "4", "--dir"])
            .arg(&dir)
            .env("LD_PRELOAD", stage_library())
            .env("PADLL_MOUNTS", &self.scratch)
            .env("PADLL_CONTROLLER", self.local_socket(node))
            .env("PADLL_JOB_ID", job)
            .env("PADLL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .expect("cheferd-lab replay starts");
        let windows = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("piped");
        let sink = windows.clone();
        // Ends at EOF, i.e. when the replayer exits or is killed.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Some((_, ops)) = line.split_once(',') else {
                    continue;
                };
                if let Ok(ops) = ops.trim().parse::<u64>() {
                    sink.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((Instant::now(), ops));
                }
            }
        });
        self.started_jobs.insert(job.to_string());
        self.jobs.push(Replayer {
            job: job.to_string(),
            node: node.to_string(),
            child,
            windows,
        });
        self.jobs.len() - 1
    }

    /// Starts `job` with one process on each of `nodes` (a job spanning nodes).
    pub fn start_job(&mut self, job: &str, nodes: &[&str], rate_per_process: u64) {
        for node in nodes {
            self.start_process(job, node, rate_per_process);
        }
    }

    /// SIGKILLs every process of `job` and forgets them.
    pub fn kill_job(&mut self, job: &str) {
        self.jobs.retain(|p| p.job != job);
    }

    /// The processes of a job.
    pub fn processes<'a>(&'a self, job: &'a str) -> impl Iterator<Item = &'a Replayer> + 'a {
        self.jobs.iter().filter(move |p| p.job == job)
    }

    /// Sum over all running processes of the rate of their window containing `t`.
    pub fn aggregate_at(&self, t: Instant) -> f64 {
        self.jobs.iter().filter_map(|p| p.rate_at(t)).sum()
    }

    /// [`Cluster::aggregate_at`], once every process has reported its window containing
    /// `t` (a process not yet heard from would read as a lower aggregate).
    pub fn whole_aggregate_at(&self, t: Instant) -> Option<f64> {
        self.jobs.iter().map(|p| p.rate_at(t)).sum()
    }

    /// A job's achieved rate over `from..=to` (sum of its processes' mean rates).
    pub fn job_rate(&self, job: &str, from: Instant, to: Instant) -> f64 {
        self.processes(job)
            .filter_map(|p| p.mean_rate(from, to))
            .sum()
    }

    /// `cheferd ctl --socket ADMIN ARGS…` (with a deadline).
    pub fn ctl(&self, args: &[&str]) -> Output {
        let mut command = Command::new(cheferd());
        command
            .arg("ctl")
            .arg("--socket")
            .arg(&self.admin)
            .args(args);
        run_with_timeout(&mut command, CTL_TIMEOUT)
    }

    /// The global controller's state (`cheferd ctl dump`), if it answers.
    pub fn try_snapshot(&self) -> Option<Snapshot> {
        let output = self.ctl(&["dump"]);
        if !output.status.success() {
            return None;
        }
        let dump: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        serde_json::from_value(dump["state"].clone()).ok()
    }

    /// The global controller's state; fails the test if it does not answer.
    pub fn snapshot(&self) -> Snapshot {
        self.try_snapshot()
            .unwrap_or_else(|| panic!("the global controller does not answer on its admin socket"))
    }

    /// Waits until the global controller lists exactly `stages` stages per attached node.
    pub fn wait_for_stages(&self, timeout: Duration, stages: &[(&str, usize)]) -> Snapshot {
        let want: BTreeMap<String, usize> =
            stages.iter().map(|(n, s)| (n.to_string(), *s)).collect();
        wait_for(
            timeout,
            &format!("the global controller to list stages {want:?}"),
            || {
                let snapshot = self.try_snapshot()?;
                let have: BTreeMap<String, usize> = snapshot
                    .nodes
                    .iter()
                    .filter(|n| n.attached)
                    .map(|n| (n.node.clone(), n.stages))
                    .collect();
                (have == want).then_some(snapshot)
            },
        )
    }
}

/// `path` as this process reaches it: through the MooseFS's namespace, if it is on one.
fn reachable(moosefs: &Option<MooseFs>, path: &Path) -> PathBuf {
    match moosefs {
        Some(moosefs) => moosefs.outside(path),
        None => path.to_path_buf(),
    }
}

/// `cheferd certs ARGS…`, which must succeed.
pub fn certs(args: &[&str]) {
    let mut command = Command::new(cheferd());
    command.arg("certs").args(args);
    let output = run_with_timeout(&mut command, Duration::from_secs(30));
    assert!(
        output.status.success(),
        "cheferd certs {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A gRPC client of the global controller.
pub type GrpcClient =
    cheferd_controller::proto::global_client::GlobalClient<tonic::transport::Channel>;

/// A client of the global controller on `port` over TLS with `tls` (`https://`), or
/// plaintext without (`http://`). Panics if the connection cannot be made.
pub async fn grpc_client(port: u16, tls: Option<tonic::transport::ClientTlsConfig>) -> GrpcClient {
    try_grpc_client(port, tls).await.expect("gRPC connects")
}

/// The same, or the connection error (one line with its causes).
pub async fn try_grpc_client(
    port: u16,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<GrpcClient, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://127.0.0.1:{port}");
    let endpoint = cheferd_controller::tls::endpoint(&url, tls).map_err(|e| e.to_string())?;
    endpoint
        .connect()
        .await
        .map(GrpcClient::new)
        .map_err(|e| cheferd_controller::tls::error_chain(&e))
}

/// `command` with its descriptor limit (soft and hard) set to `nofile`, if given.
fn limit_nofile(mut command: Command, nofile: Option<u64>) -> Command {
    use std::os::unix::process::CommandExt;
    if let Some(n) = nofile {
        // SAFETY: setrlimit is async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    command
}

/// A process' resident memory now and at its peak, KiB (`/proc/PID/status`).
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time (user + system) a process used so far, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let at = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    at(11) + at(12)
}

/// A job's assigned rate of the resource in a snapshot (0 if it has no share).
pub fn assigned(snapshot: &Snapshot, job: &str) -> f64 {
    snapshot
        .shares
        .iter()
        .find(|s| s.job == job)
        .map_or(0.0, |s| s.assigned)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.jobs.clear();
        self.locals.clear();
        self.global = None;
        self.remove_job_files();
        if std::thread::panicking() {
            let mut logs: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
                .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default();
            logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
            logs.sort();
            for log in logs {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("==== {} (last 30 lines)", log.display());
                for line in &lines[lines.len().saturating_sub(30)..] {
                    eprintln!("{line}");
                }
            }
        }
    }
}

impl Cluster {
    /// Removes what its jobs' stages left in `/dev/shm` (flat, or in the user's
    /// directory `/dev/shm/padll/<uid>`): the segments of its jobs (a killed job's last
    /// process cannot), and the last rules (they name its scratch directory), of every
    /// uid and half-written ones included, so no later test starts a job of the same id
    /// under them.
    fn remove_job_files(&self) {
        use padll_wire::node_files::{both_places, NODE_DIRECTORY};
        // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
        let uid = unsafe { libc::geteuid() };
        for files in self
            .started_jobs
            .iter()
            .flat_map(|job| both_places(uid, job))
        {
            let _ = std::fs::remove_file(files.segment);
        }
        let scratch = self.scratch.display().to_string();
        let user_directories = std::fs::read_dir(NODE_DIRECTORY)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path());
        let places = std::iter::once(PathBuf::from("/dev/shm")).chain(user_directories);
        for path in places
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flatten()
            .flatten()
            .map(|e| e.path())
        {
            let rules = path.file_name().is_some_and(|n| {
                let name = n.to_string_lossy();
                name.starts_with("padll-rules-") || name.starts_with("rules-")
            });
            if rules && std::fs::read_to_string(&path).is_ok_and(|text| text.contains(&scratch)) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Reads one line from a blocking stream with a deadline; `None` on EOF.
pub fn read_line_with_timeout(
    reader: &mut BufReader<std::os::unix::net::UnixStream>,
    timeout: Duration,
) -> Option<String> {
    reader
        .get_ref()
        .set_read_timeout(Some(timeout))
        .expect("read timeout");
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => None,
        Ok(_) => Some(line),
        Err(e) => panic!("no line within {timeout:?}: {e}"),
    }
}

/// The configuration of the attack tests (`trust*.rs`): one metadata resource.
pub const TRUST_CONFIG: &str = r#"
interval_ms = 500
[[resource]]
name = "{scratch}:metadata"
max_rate = "2000"
policy = "psfa"
"#;

/// Runs the ignored test `helper` of this test binary (its module path, e.g.
/// `trust::zz_attacker_helper`) as uid 65534 with `vars`: an attacker of another uid.
pub fn run_as_nobody(helper: &str, vars: &[(&str, &str)], stdout: Stdio) -> Child {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args([helper, "--exact", "--ignored", "--nocapture"])
        .envs(vars.iter().copied())
        .stdout(stdout)
        .spawn()
        .expect("setpriv runs")
}

impl Cluster {
    /// Makes the cluster's directory reachable by other uids (the stage socket is 0666).
    pub fn open_to_others(&self) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}
