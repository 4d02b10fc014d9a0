//! `cheferd local`: the controller of one compute node (PADLL paper §III-B).
//!
//! It serves the stages of its node on a Unix socket (JSON lines, see
//! `padll_wire::control`), records each peer's uid/gid/pid as the kernel reports them
//! (`SO_PEERCRED`), takes each stage's job and size from its cgroup and the scheduler
//! rather than from its claim ([`crate::identity`]), keeps the usage rates of every stage, and relays between its
//! stages and the global controller, to which it keeps one gRPC stream: it pushes the
//! usage of its stages once per control interval, on the global controller's
//! [`proto::Schedule`], and hands the rules of every `Enforce` to the stages. When that
//! stream breaks it retries with backoff and, once reconnected, re-registers and
//! re-announces every stage; the stages keep their last rules meanwhile.

use crate::bounds::{self, AcceptBackoff, Budget, LogLimit};
use crate::config::Resource;
use crate::identity::{Resolver, SlurmCgroups};
use crate::limited_warn;
use crate::lines::{self, Line};
use crate::proto::{
    self, global_client::GlobalClient, global_message, local_message, GlobalMessage, LocalMessage,
};
use crate::supervise::Supervisor;
use crate::usage::UsageTracker;
use padll_wire::channel::{ChannelSpec, Scope, Unit};
use padll_wire::control::{
    self, ControlMessage, StageMessage, MAX_MESSAGE_BYTES, PROTOCOL_VERSION,
};
use padll_wire::ops::Class;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::{debug, info, warn};

/// How a local controller is run.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// This node's name, unique among the global controller's nodes.
    pub node: String,
    /// The Unix socket stages connect to.
    pub socket: PathBuf,
    /// The global controller (`https://host:port`; `http://` only without `tls`).
    pub global: String,
    /// This node's certificate, key and the site CA (mutual TLS); `None` is plaintext
    /// (`--insecure-plaintext`).
    pub tls: Option<crate::tls::ClientTls>,
    /// How often stages push usage.
    pub report_interval: Duration,
    /// Caps against hostile local users.
    pub limits: LocalLimits,
}

/// The local controller's caps (`cheferd local --max-…`); see ARCHITECTURE.md, Bounds.
#[derive(Clone, Debug)]
pub struct LocalLimits {
    /// Connections on the stage socket (registered stages and connections that have not
    /// said hello yet), all users together; further ones are closed at once. Also kept
    /// below the descriptor limit.
    pub max_connections: usize,
    /// The same, per uid.
    pub max_connections_per_uid: usize,
    /// Distinct job ids among one uid's stages; a stage of a further job is rejected.
    pub max_jobs_per_uid: usize,
    /// Bytes of partial (incomplete) lines buffered for all connections; a connection
    /// whose line would exceed it is closed.
    pub max_pending_bytes: usize,
    /// The same, per uid.
    pub max_pending_bytes_per_uid: usize,
}

impl Default for LocalLimits {
    fn default() -> LocalLimits {
        LocalLimits {
            max_connections: 4096,
            max_connections_per_uid: 1024,
            max_jobs_per_uid: 64,
            max_pending_bytes: 64 << 20,
            max_pending_bytes_per_uid: 16 << 20,
        }
    }
}

/// Before the control plane gave a stage a rule for a resource, it cannot have used
/// more than this per second of it (ops/s; [`PRE_RULE_BYTES`] for data): what it
/// reports above is clamped.
pub const PRE_RULE_OPS: u64 = 1_000_000;
/// The same for data resources, bytes/s (16 GiB/s).
pub const PRE_RULE_BYTES: u64 = 16 << 30;

/// Warnings caused by what a peer sent (malformed lines, clamped reports, refused
/// connections): at most 20 lines per 5 s, whatever the peers do.
/// The longest a local controller waits between attempts to reach a global one (the
/// backoff doubles from 100 ms): a new leader waits as long before its first cycle
/// (`crate::standby`), so that every live node has re-attached by then.
pub const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(5);
static PEER_LOG: LogLimit = LogLimit::new(20, Duration::from_secs(5));

struct StageEntry {
    info: proto::Stage,
    to_stage: mpsc::UnboundedSender<ControlMessage>,
    usage: UsageTracker,
}

/// Connections and jobs of one uid.
struct UserState {
    connections: usize,
    pending: Arc<Budget>,
    /// Its stages' job ids, with how many stages each.
    jobs: HashMap<String, usize>,
}

/// Who is connected, for the caps.
#[derive(Default)]
struct Peers {
    connections: usize,
    users: HashMap<u32, UserState>,
    /// Which uid runs each job on this node (the uid of its first stage).
    job_owner: HashMap<String, u32>,
}

/// A connection counted in [`Peers`]; uncounted (and its job released) when dropped.
struct Admission {
    local: Arc<Local>,
    uid: u32,
    job: Option<String>,
    pending: Arc<Budget>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut peers = self.local.lock_peers();
        peers.connections = peers.connections.saturating_sub(1);
        let mut release_job = false;
        let mut remove_user = false;
        if let Some(user) = peers.users.get_mut(&self.uid) {
            user.connections = user.connections.saturating_sub(1);
            if let Some(job) = &self.job {
                if let Some(count) = user.jobs.get_mut(job) {
                    *count -= 1;
                    if *count == 0 {
                        user.jobs.remove(job);
                        release_job = true;
                    }
                }
            }
            remove_user = user.connections == 0;
        }
        if remove_user {
            peers.users.remove(&self.uid);
        }
        if let (true, Some(job)) = (release_job, &self.job) {
            if peers.job_owner.get(job) == Some(&self.uid) {
                peers.job_owner.remove(job);
            }
        }
        // Buffers of a connection that held a large line go back to the allocator's
        // free lists; give them back to the system soon (see `trim_loop`).
        TRIM_WANTED.store(true, Ordering::Relaxed);
    }
}

static TRIM_WANTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Returns freed heap memory to the system at most once a second after connections
/// left, so a burst of clients holding large partial lines leaves no lasting RSS.
async fn trim_loop() {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if TRIM_WANTED.swap(false, Ordering::Relaxed) {
            // SAFETY: malloc_trim only releases free memory.
            #[cfg(target_env = "gnu")]
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

/// A task panicked while it held the local controller's state, leaving it half-changed:
/// no one goes on with it (the panic reaches the supervisor, which ends the process).
const POISONED: &str = "the local controller's state was left inconsistent by a panic";

/// The local controller's state, shared by its tasks.
pub struct Local {
    options: LocalOptions,
    /// Stages' jobs and sizes from the kernel and the scheduler, not their claims.
    identity: Resolver,
    peers: Mutex<Peers>,
    pending: Arc<Budget>,
    next_stage_id: AtomicU64,
    stages: Mutex<HashMap<u64, StageEntry>>,
    upstream: Mutex<Option<mpsc::UnboundedSender<LocalMessage>>>,
    /// Placement requests relayed to the global controller.
    placements: crate::placement_service::Relay,
}

impl Local {
    fn lock_stages(&self) -> std::sync::MutexGuard<'_, HashMap<u64, StageEntry>> {
        self.stages.lock().expect(POISONED)
    }

    fn lock_peers(&self) -> std::sync::MutexGuard<'_, Peers> {
        self.peers.lock().expect(POISONED)
    }

    fn lock_upstream(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<mpsc::UnboundedSender<LocalMessage>>> {
        self.upstream.lock().expect(POISONED)
    }

    /// Counts a new connection of `uid`, or says which cap refuses it.
    fn admit(self: &Arc<Self>, uid: u32) -> Result<Admission, Refusal> {
        let limits = &self.options.limits;
        let mut peers = self.lock_peers();
        if peers.connections >= limits.max_connections {
            return Err(Refusal::NodeConnections(peers.connections));
        }
        let per_uid = limits.max_pending_bytes_per_uid;
        let user = peers.users.entry(uid).or_insert_with(|| UserState {
            connections: 0,
            pending: Budget::new(per_uid),
            jobs: HashMap::new(),
        });
        if user.connections >= limits.max_connections_per_uid {
            return Err(Refusal::UidConnections {
                uid,
                connections: user.connections,
            });
        }
        user.connections += 1;
        let pending = user.pending.clone();
        peers.connections += 1;
        Ok(Admission {
            local: self.clone(),
            uid,
            job: None,
            pending,
        })
    }

    /// Records that the connection of `admission` is a stage of `job`, or says why not:
    /// the job runs under another uid on this node, or its uid has too many jobs.
    fn join_job(&self, admission: &mut Admission, job: &str) -> Result<(), Refusal> {
        let max_jobs = self.options.limits.max_jobs_per_uid;
        let mut peers = self.lock_peers();
        let uid = admission.uid;
        if let Some(&owner) = peers.job_owner.get(job) {
            if owner != uid && uid != 0 {
                return Err(Refusal::OtherOwner {
                    job: job.to_string(),
                    owner,
                    uid,
                });
            }
        }
        let Some(user) = peers.users.get_mut(&uid) else {
            return Err(Refusal::NotCounted);
        };
        if !user.jobs.contains_key(job) && user.jobs.len() >= max_jobs {
            return Err(Refusal::UidJobs {
                uid,
                jobs: user.jobs.len(),
            });
        }
        *user.jobs.entry(job.to_string()).or_insert(0) += 1;
        peers.job_owner.entry(job.to_string()).or_insert(uid);
        admission.job = Some(job.to_string());
        Ok(())
    }

    /// Relays a stage's placement request to the global controller; without one (or
    /// with too many in flight) answers "no advice" at once, so the stage does not wait.
    fn relay_placement(&self, stage_id: u64, id: u64, mount: String, stripes: u32) {
        let upstream = self.lock_upstream().clone();
        let Some((to, request)) =
            upstream.and_then(|to| Some((to, self.placements.ask(stage_id, id)?)))
        else {
            return self.placed(stage_id, id, Vec::new());
        };
        let body = local_message::Body::PlaceRequest(proto::PlaceRequest {
            request,
            mount,
            stripes,
        });
        if to.send(LocalMessage { body: Some(body) }).is_err() {
            self.placements.answered(request);
            self.placed(stage_id, id, Vec::new());
        }
    }

    /// Hands a stage the answer to its placement request `id`.
    fn placed(&self, stage_id: u64, id: u64, targets: Vec<u32>) {
        if let Some(entry) = self.lock_stages().get(&stage_id) {
            let _ = entry.to_stage.send(ControlMessage::Placed { id, targets });
        }
    }

    fn send_upstream(&self, body: local_message::Body) {
        if let Some(upstream) = self.lock_upstream().as_ref() {
            let _ = upstream.send(LocalMessage { body: Some(body) });
        }
    }

    /// Number of stages connected now.
    pub fn stage_count(&self) -> usize {
        self.lock_stages().len()
    }
}

/// Runs a local controller until its future is dropped (which removes its socket), or
/// until one of its tasks ends (the error says which). Fails at once (with a message
/// naming the path) if the socket cannot be created.
pub async fn run(mut options: LocalOptions) -> Result<(), LocalError> {
    // The TLS files are checked before anything else is done, and the node name must
    // be one the certificate carries (the global controller would refuse any other).
    if let Some(tls) = &options.tls {
        let mut names = tls.node_names()?;
        if !names.contains(&options.node) {
            return Err(LocalError::OtherNode {
                node: options.node.clone(),
                cert: tls.cert.clone(),
                certified: names.swap_remove(0),
            });
        }
    }
    let tls = options.tls.as_ref().map(|t| t.load()).transpose()?;
    let globals =
        crate::standby::follow::Globals::new(&options.global, tls).map_err(LocalError::Global)?;
    // Stages of every user must reach the socket, so it is world-writable; who connected
    // is recorded from `SO_PEERCRED`, and a stage can only ever affect its own channels.
    // The socket file is removed when this future is dropped (the daemon stops).
    let (listener, _socket_file) = bounds::bind_unix(&options.socket, 0o666)?;
    let listener = UnixListener::from_std(listener).map_err(|error| LocalError::Listen {
        socket: options.socket.clone(),
        error,
    })?;
    // Connections stay well below the descriptor limit (the gRPC stream, logs and the
    // runtime need some).
    let descriptors = bounds::raise_nofile() as usize;
    let fitting = descriptors.saturating_sub(64).max(16);
    if options.limits.max_connections > fitting {
        info!(
            descriptors,
            "at most {fitting} stage connections (the descriptor limit is {descriptors})"
        );
        options.limits.max_connections = fitting;
    }
    let local = Arc::new(Local {
        pending: Budget::new(options.limits.max_pending_bytes),
        // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
        identity: Resolver::new(Box::new(SlurmCgroups::system()), unsafe { libc::geteuid() }),
        options,
        peers: Mutex::new(Peers::default()),
        next_stage_id: AtomicU64::new(1),
        stages: Mutex::new(HashMap::new()),
        upstream: Mutex::new(None),
        placements: Default::default(),
    });
    let secured = if local.options.tls.is_some() {
        "mutual TLS"
    } else {
        "PLAINTEXT"
    };
    info!(version = crate::VERSION, node = %local.options.node, socket = %local.options.socket.display(), global = %local.options.global, upstream = secured, "local controller started");
    // Each task runs for the life of the process: the first to end (or panic) ends it.
    let mut tasks = Supervisor::default();
    {
        let local = local.clone();
        tasks.spawn("the upstream loop", async move {
            upstream_loop(local, globals).await;
            Ok(())
        });
    }
    tasks.spawn("the memory trim loop", async {
        trim_loop().await;
        Ok(())
    });
    tasks.spawn("the stage socket", async move {
        accept_stages(local, listener).await;
        Ok(())
    });
    Err(tasks.first_end().await.into_error(LocalError::Ended))
}

/// Why a local controller did not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A TLS file refused.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsFileError),
    /// `--node` is not a name the certificate carries.
    #[error("--node '{}': the certificate {} is for node '{}'", control::short(node), cert.display(), control::short(certified))]
    OtherNode {
        /// `--node`.
        node: String,
        /// The certificate.
        cert: PathBuf,
        /// The first name it carries.
        certified: String,
    },
    /// A bad `--global`.
    #[error(transparent)]
    Global(#[from] crate::tls::EndpointError),
    /// The stage socket refused or not made.
    #[error(transparent)]
    Socket(#[from] bounds::SocketError),
    /// The stage socket made but not listened on.
    #[error("cannot listen on {}: {error}", socket.display())]
    Listen {
        /// The socket.
        socket: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A task that runs for the life of the process ended (which and how).
    #[error("{0}")]
    Ended(String),
}

/// Why a stage's connection or job was refused (it is told, and it is logged).
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// The node has as many connections as it takes.
    #[error("{0} connections on this node (the limit)")]
    NodeConnections(usize),
    /// The uid has as many connections as it may.
    #[error("uid {uid} has {connections} connections (the limit per uid)")]
    UidConnections { uid: u32, connections: usize },
    /// The job runs under another uid on this node.
    #[error(
        "job '{}' runs under uid {owner} on this node, not uid {uid}",
        control::short(job)
    )]
    OtherOwner { job: String, owner: u32, uid: u32 },
    /// The connection was never admitted.
    #[error("connection not counted")]
    NotCounted,
    /// The uid has as many jobs on this node as it may.
    #[error("uid {uid} already has {jobs} jobs on this node (the limit per uid)")]
    UidJobs { uid: u32, jobs: usize },
}

/// Serves each stage connecting to `listener` in a task of its own.
async fn accept_stages(local: Arc<Local>, listener: UnixListener) {
    let mut backoff = AcceptBackoff::default();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                backoff.succeeded("stage socket");
                tokio::spawn(serve_stage(local.clone(), stream));
            }
            Err(e) => tokio::time::sleep(backoff.failed("stage socket", &e)).await,
        }
    }
}

async fn serve_stage(local: Arc<Local>, stream: UnixStream) {
    let credentials = match stream.peer_cred() {
        Ok(c) => c,
        Err(e) => {
            limited_warn!(PEER_LOG, "stage connection without peer credentials: {e}");
            return;
        }
    };
    let mut admission = match local.admit(credentials.uid()) {
        Ok(admission) => admission,
        Err(why) => {
            limited_warn!(PEER_LOG, pid = ?credentials.pid(), "refused a stage connection: {why}");
            let reason = format!("refused: {why}");
            let _ =
                stream.try_write(control::encode(&ControlMessage::Reject { reason }).as_bytes());
            return;
        }
    };
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let node_pending = local.pending.clone();
    let user_pending = admission.pending.clone();
    let budgets = [&*node_pending, &*user_pending];

    let hello = match tokio::time::timeout(
        Duration::from_secs(10),
        lines::read_line_within(&mut reader, MAX_MESSAGE_BYTES, &budgets),
    )
    .await
    {
        Ok(Ok(Line::Text(line))) => {
            control::decode::<StageMessage>(&line).map_err(HelloError::from)
        }
        Ok(Ok(Line::TooLong(n))) => Err(HelloError::TooLong(n)),
        Ok(Ok(Line::OverBudget)) => Err(HelloError::OverBudget),
        Ok(Ok(Line::End)) | Ok(Err(_)) => return,
        Err(_) => Err(HelloError::Late),
    };
    let (stage_name, identity, mountpoints) = match hello {
        Ok(StageMessage::Hello {
            version: PROTOCOL_VERSION,
            stage_name,
            identity,
            mountpoints,
        }) => (stage_name, identity, mountpoints),
        Ok(StageMessage::Hello { version, .. }) => {
            let reason = format!("protocol version {version} is not supported (this controller speaks {PROTOCOL_VERSION})");
            limited_warn!(PEER_LOG, pid = ?credentials.pid(), "{reason}");
            let _ = write
                .write_all(control::encode(&ControlMessage::Reject { reason }).as_bytes())
                .await;
            return;
        }
        Ok(_) => {
            limited_warn!(PEER_LOG, pid = ?credentials.pid(), "stage spoke before saying hello");
            return;
        }
        Err(e) => {
            limited_warn!(PEER_LOG, pid = ?credentials.pid(), "rejected a stage connection: {e}");
            let reason = e.to_string();
            let _ = write
                .write_all(control::encode(&ControlMessage::Reject { reason }).as_bytes())
                .await;
            return;
        }
    };

    let pid = credentials.pid().map_or(identity.pid, |p| p as u32);
    let resolved = {
        let (local, job, size, uid) = (
            local.clone(),
            identity.job_id.clone(),
            identity.job_size,
            credentials.uid(),
        );
        // Reads /proc and may run `scontrol`: off the async workers.
        tokio::task::spawn_blocking(move || local.identity.resolve(&job, size, uid, pid))
            .await
            .map_err(|e| format!("identity lookup failed: {e}"))
            .and_then(|resolved| resolved.map_err(|e| e.to_string()))
    };
    let resolved = match resolved {
        Ok(resolved) => resolved,
        Err(reason) => {
            limited_warn!(PEER_LOG, pid, "rejected a stage: {reason}");
            let _ = write
                .write_all(control::encode(&ControlMessage::Reject { reason }).as_bytes())
                .await;
            return;
        }
    };
    if let Some(note) = &resolved.note {
        limited_warn!(PEER_LOG, pid, job = %resolved.job_id, "stage identity corrected: {note}");
    }
    if let Err(refusal) = local.join_job(&mut admission, &resolved.job_id) {
        limited_warn!(PEER_LOG, pid = ?credentials.pid(), "rejected a stage: {refusal}");
        let reason = refusal.to_string();
        let _ = write
            .write_all(control::encode(&ControlMessage::Reject { reason }).as_bytes())
            .await;
        return;
    }
    let stage_id = local.next_stage_id.fetch_add(1, Ordering::Relaxed);
    let info = proto::Stage {
        stage_id,
        // What the kernel and the scheduler say, not what the stage claims.
        job_id: resolved.job_id,
        job_size: resolved.job_size,
        user: identity.user,
        account: identity.account,
        uid: credentials.uid(),
        gid: credentials.gid(),
        pid,
        ppid: identity.ppid,
        hostname: identity.hostname,
        stage_name,
        mountpoints,
    };
    if let Err(too_large) = bounds::check_stage(&info) {
        limited_warn!(PEER_LOG, pid = info.pid, "rejected a stage: {too_large}");
        let reason = too_large.to_string();
        let _ = write
            .write_all(control::encode(&ControlMessage::Reject { reason }).as_bytes())
            .await;
        return;
    }
    let (to_stage, mut outbox) = mpsc::unbounded_channel::<ControlMessage>();
    let welcome = ControlMessage::Welcome {
        version: PROTOCOL_VERSION,
        stage_id,
        report_interval_ms: local.options.report_interval.as_millis() as u64,
    };
    if write
        .write_all(control::encode(&welcome).as_bytes())
        .await
        .is_err()
    {
        return;
    }
    tokio::spawn(async move {
        while let Some(message) = outbox.recv().await {
            if write
                .write_all(control::encode(&message).as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    });
    info!(stage_id, job = %info.job_id, pid = info.pid, uid = info.uid, "stage registered");
    local.lock_stages().insert(
        stage_id,
        StageEntry {
            info: info.clone(),
            to_stage,
            usage: UsageTracker::new(Instant::now()),
        },
    );
    local.send_upstream(local_message::Body::StageJoined(proto::StageJoined {
        stage: Some(info),
        announced: false,
    }));

    loop {
        match lines::read_line_within(&mut reader, MAX_MESSAGE_BYTES, &budgets).await {
            Ok(Line::Text(line)) => match control::decode::<StageMessage>(&line) {
                Ok(StageMessage::Usage { channels, ops, .. }) => {
                    let mut stages = local.lock_stages();
                    if let Some(entry) = stages.get_mut(&stage_id) {
                        let mounts = entry.info.mountpoints.clone();
                        let clamped = entry.usage.record(Instant::now(), &mounts, &channels, &ops);
                        for (resource, reported, allowed) in clamped {
                            limited_warn!(
                                PEER_LOG,
                                stage_id,
                                pid = entry.info.pid,
                                "stage reported {reported} tokens of {resource}, more than its rules admit; counted {allowed}"
                            );
                        }
                    }
                }
                Ok(StageMessage::Applied {
                    seq,
                    error: Some(error),
                }) => {
                    limited_warn!(
                        PEER_LOG,
                        stage_id,
                        seq,
                        "stage refused rules: {}",
                        control::short(&error)
                    )
                }
                Ok(StageMessage::Applied { .. }) => {}
                Ok(StageMessage::Place { id, mount, stripes }) => {
                    local.relay_placement(stage_id, id, mount, stripes)
                }
                Ok(StageMessage::Hello { .. }) => {
                    limited_warn!(PEER_LOG, stage_id, "ignored a second hello")
                }
                Err(e) => limited_warn!(PEER_LOG, stage_id, "dropped a message from a stage: {e}"),
            },
            Ok(Line::TooLong(n)) => limited_warn!(
                PEER_LOG,
                stage_id,
                "dropped a {n}-byte message from a stage (limit {MAX_MESSAGE_BYTES})"
            ),
            Ok(Line::OverBudget) => {
                limited_warn!(
                    PEER_LOG,
                    stage_id,
                    "closed a stage connection: {}",
                    over_budget()
                );
                break;
            }
            Ok(Line::End) | Err(_) => break,
        }
    }
    local.lock_stages().remove(&stage_id);
    info!(stage_id, "stage left");
    local.send_upstream(local_message::Body::StageLeft(proto::StageLeft {
        stage_id,
    }));
}

/// Why a stage's first line was not taken as its hello.
#[derive(Debug, thiserror::Error)]
enum HelloError {
    /// Not a stage message.
    #[error(transparent)]
    Decode(#[from] control::DecodeError),
    /// Longer than a message may be (its length).
    #[error("first message of {0} bytes is too long")]
    TooLong(usize),
    /// Its uid or the node has too many partial lines pending.
    #[error("{}", over_budget())]
    OverBudget,
    /// Nothing within 10 s.
    #[error("no hello within 10 s")]
    Late,
}

fn over_budget() -> String {
    "too many bytes of partial lines pending (for this uid or this node)".to_string()
}

/// Keeps one stream to the global controller (the leader, of several: see
/// `crate::standby::follow`), re-establishing it with backoff.
async fn upstream_loop(local: Arc<Local>, mut globals: crate::standby::follow::Globals) {
    let mut backoff = Duration::from_millis(100);
    let mut reported_unreachable = false;
    loop {
        // Whether the whole list was tried without a stream (then back off longer).
        let wrapped;
        match globals.endpoint().connect().await.map(GlobalClient::new) {
            Ok(mut client) => {
                let (sender, receiver) = mpsc::unbounded_channel::<LocalMessage>();
                let _ = sender.send(LocalMessage {
                    body: Some(local_message::Body::Register(proto::Register {
                        node: local.options.node.clone(),
                        version: proto::VERSION,
                    })),
                });
                {
                    // Announce every stage and start forwarding joins/leaves atomically,
                    // so none is missed or announced twice.
                    let stages = local.lock_stages();
                    for entry in stages.values() {
                        let _ = sender.send(LocalMessage {
                            body: Some(local_message::Body::StageJoined(proto::StageJoined {
                                stage: Some(entry.info.clone()),
                                announced: true,
                            })),
                        });
                    }
                    *local.lock_upstream() = Some(sender.clone());
                }
                match client.attach(UnboundedReceiverStream::new(receiver)).await {
                    Ok(response) => {
                        info!(global = %globals.url(), "attached to the global controller");
                        backoff = Duration::from_millis(100);
                        reported_unreachable = false;
                        let mut inbound = response.into_inner();
                        let mut clock = ReportClock::default();
                        // The resource table of this stream's `Registered`.
                        let mut resources = Vec::new();
                        // The latest Enforce applied, acknowledged in the next report.
                        let mut applied = 0;
                        loop {
                            tokio::select! {
                                message = inbound.message() => match message {
                                    Ok(Some(message)) => match globals.check(&message) {
                                        crate::standby::follow::Verdict::Follow => handle_global(
                                        &local,
                                        &mut applied,
                                        &mut clock,
                                        &mut resources,
                                        message,
                                    ),
                                        crate::standby::follow::Verdict::Ignore(why) => {
                                            warn!("an Enforce was not applied: {why}")
                                        }
                                        crate::standby::follow::Verdict::Leave(why) => {
                                            warn!("left the global controller: {why}");
                                            break;
                                        }
                                    },                                    Ok(None) => break,
                                    Err(status) => {
                                        debug!("global stream error: {status}");
                                        break;
                                    }
                                },
                                cycle = clock.next() => report_usage(&local, &sender, cycle, applied),
                            }
                        }
                        warn!(global = %globals.url(), "lost the global controller; stages keep their last rules");
                        wrapped = globals.move_on();
                    }
                    Err(status) => {
                        warn!(
                            global = %globals.url(),
                            "the global controller refused the stream: {}",
                            status.message()
                        );
                        wrapped = globals.refused(&status);
                    }
                }
                *local.lock_upstream() = None;
                local.placements.clear();
            }
            Err(e) => {
                if !reported_unreachable {
                    warn!(global = %globals.url(), "cannot reach the global controller ({}); retrying", crate::tls::error_chain(&e));
                    reported_unreachable = true;
                }
                wrapped = globals.move_on();
            }
        }
        tokio::time::sleep(backoff).await;
        if wrapped {
            backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
        }
    }
}

/// When to push the next usage report, as the global controller scheduled it.
#[derive(Default)]
pub struct ReportClock {
    /// The next report: when, and for which cycle; `None` until scheduled.
    next: Option<(tokio::time::Instant, u64)>,
    interval: Duration,
}

impl ReportClock {
    /// Follows a (new) schedule from the global controller.
    pub fn schedule(&mut self, schedule: &proto::Schedule) {
        // A zero interval would report in a busy loop.
        self.interval = Duration::from_millis(schedule.interval_ms.max(1));
        self.next = Some((
            tokio::time::Instant::now() + Duration::from_millis(schedule.report_in_ms),
            schedule.cycle,
        ));
    }

    /// Waits for the next report's time (forever if none is scheduled); returns the
    /// cycle it is for and schedules the following one an interval later. The slots
    /// stay on the global controller's ticks even if this task runs late; slots it
    /// missed altogether are skipped (their reports would carry no new usage).
    pub async fn next(&mut self) -> u64 {
        let Some((at, cycle)) = self.next else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(at).await;
        let (mut next, mut next_cycle) = (at + self.interval, cycle + 1);
        let now = tokio::time::Instant::now();
        while next <= now {
            next += self.interval;
            next_cycle += 1;
        }
        self.next = Some((next, next_cycle));
        cycle
    }
}

/// Pushes the usage of every stage over the control interval that ends now, with the
/// acknowledgement of the latest `Enforce` applied.
fn report_usage(
    local: &Local,
    upstream: &mpsc::UnboundedSender<LocalMessage>,
    cycle: u64,
    applied: u64,
) {
    let mut stages = local.lock_stages();
    let usage = proto::Usage {
        cycle,
        applied,
        stages: stages
            .values_mut()
            .map(|entry| {
                let rates = entry.usage.collect().clone();
                proto::StageUsage {
                    stage_id: entry.info.stage_id,
                    resources: rates
                        .iter()
                        .map(|(resource, rate)| proto::ResourceUsage {
                            mount: resource.mount.clone(),
                            class: resource.class.name().to_string(),
                            rate: *rate,
                            limit: entry.usage.limit(resource).unwrap_or(0),
                        })
                        .collect(),
                }
            })
            .collect(),
    };
    let _ = upstream.send(LocalMessage {
        body: Some(local_message::Body::Usage(usage)),
    });
}

/// Handles a message from the global controller. `resources` is the resource table of
/// the stream's `Registered` (its first message), which the rules of every `Enforce`
/// index; a resource this controller does not know (`None`) gets no channel. An
/// `Enforce` is acknowledged in the next usage report (`applied`: the latest one's cycle).
fn handle_global(
    local: &Local,
    applied: &mut u64,
    clock: &mut ReportClock,
    resources: &mut Vec<Option<Resource>>,
    message: GlobalMessage,
) {
    match message.body {
        Some(global_message::Body::Schedule(schedule)) => clock.schedule(&schedule),
        Some(global_message::Body::Enforce(proto::Enforce {
            cycle,
            stages: plans,
            ..
        })) => {
            let mut stages = local.lock_stages();
            for plan in plans {
                let Some(entry) = stages.get_mut(&plan.stage_id) else {
                    continue;
                };
                let rules: Vec<ChannelSpec> = plan
                    .rules
                    .iter()
                    .filter_map(|rule| rule_to_spec(rule, resources))
                    .collect();
                // What the stage reports is checked against what it was given.
                entry.usage.set_rules(rules.iter().filter_map(|spec| {
                    let (Some(mount), Scope::Class(class)) = (&spec.mount, spec.scope) else {
                        return None;
                    };
                    let resource = Resource {
                        mount: mount.clone(),
                        class,
                    };
                    Some((resource, spec.rate, spec.burst))
                }));
                // A stage gone meanwhile needs no rules.
                let _ = entry
                    .to_stage
                    .send(ControlMessage::SetRules { seq: cycle, rules });
            }
            *applied = (*applied).max(cycle);
        }
        Some(global_message::Body::Registered(registered)) => {
            debug!(
                interval_ms = registered.interval_ms,
                resources = registered.resources.len(),
                "registered with the global controller"
            );
            *resources = registered
                .resources
                .into_iter()
                .map(|r| {
                    Some(Resource {
                        class: Class::from_name(&r.class)?,
                        mount: r.mount,
                    })
                })
                .collect();
        }
        Some(global_message::Body::PlaceReply(reply)) => {
            if let Some((stage_id, id)) = local.placements.answered(reply.request) {
                local.placed(stage_id, id, reply.targets);
            }
        }
        None => warn!("empty message from the global controller"),
    }
}

/// A rule from the global controller as a stage channel, its resource looked up in the
/// table from `Registered` (the stage protocol names mount and class).
pub fn rule_to_spec(rule: &proto::Rule, resources: &[Option<Resource>]) -> Option<ChannelSpec> {
    let resource = resources.get(rule.resource as usize)?.as_ref()?;
    // A bytes rate cannot configure an ops resource, nor the reverse.
    if rule.bytes != resource.counts_bytes() {
        warn!(%resource, bytes = rule.bytes, "ignored a rule whose unit does not fit its resource");
        return None;
    }
    Some(ChannelSpec {
        mount: Some(resource.mount.clone()),
        scope: Scope::Class(resource.class),
        rate: rule.rate.max(1),
        unit: if rule.bytes {
            Unit::Bytes
        } else {
            Unit::Requests
        },
        burst: rule.burst.max(1),
    })
}
