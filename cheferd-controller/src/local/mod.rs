//! `cheferd local`: the controller of one compute node (PADLL paper §III-B).
//!
//! It serves the stages of its node on a Unix socket (JSON lines, see
//! `padll_wire::control`), records each peer's uid/gid/pid as the kernel reports them
//! (`SO_PEERCRED`), takes each stage's job and size from its cgroup and the scheduler
//! rather than from its claim ([`crate::identity`]), keeps the usage rates of every
//! stage, and relays between its stages and the global controller, to which it keeps
//! one gRPC stream: it pushes the usage of its stages once per control interval, on the
//! global controller's [`crate::proto::Schedule`], and hands the rules of every
//! `Enforce` to the stages. When that stream breaks it retries with backoff and, once
//! reconnected, re-registers and re-announces every stage; the stages keep their last
//! rules meanwhile.
//!
//! One concept per module: `admission` (the caps on connections and jobs per uid and
//! node), `stage` (the stage protocol on the socket), `outbox` (the bounded queue to
//! each stage), `placement` (stages' placement requests and their limits), `upstream`
//! (the stream to the global controller), `upstream_queue` (its queue, bounded in
//! messages and bytes, with room kept from advice), `report` (when and what usage is pushed),
//! `rules` (a global rule as a stage channel), `default_rules` (what a stage gets while
//! its job has no rules from the global controller: `--default-limit`), `log_summary`
//! (peer-caused log lines summarised), `user_files` (each user's directory for its
//! jobs' files in `/dev/shm`) and `trim` (giving freed memory back).

mod admission;
mod default_rules;
mod log_summary;
mod outbox;
mod placement;
mod report;
mod rules;
mod stage;
mod trim;
mod upstream;
mod upstream_queue;
mod user_files;

pub use default_rules::{parse_default_limit, DefaultLimit, DefaultLimitError};
pub use report::ReportClock;
pub use rules::rule_to_spec;

use crate::bounds::{self, Budget, LogLimit};
use crate::identity::{Resolver, SlurmCgroups};
use crate::supervise::Supervisor;
use padll_wire::control;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::UnixListener;
use tracing::info;

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
    /// What a stage gets while its job has no rules from the global controller.
    pub default_limit: DefaultLimit,
}

/// The local controller's caps (`cheferd local --max-…`); see docs/security.md, Bounds.
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

/// Lines a peer can cause (malformed lines, clamped reports, refused connections,
/// stages registered and left): at most 20 per 5 s, whatever the peers do.
static PEER_LOG: LogLimit = LogLimit::new(20, Duration::from_secs(5));

/// Stages registered, left, rejected and closed: their lines count in [`PEER_LOG`], and
/// are summarised when some were not logged.
static ACTIVITY: log_summary::Activity = log_summary::Activity::new(&PEER_LOG);

/// Stages' usage reports above their rules, summarised.
static OVER_REPORTS: log_summary::OverReports = log_summary::OverReports::new();

/// The local controller's state, which a panic can leave half-changed: after one, no one
/// goes on with it (`padll_wire::sync::lock_or_panic`; the panic reaches the supervisor,
/// which ends the process).
const STATE: &str = "the local controller's state";

/// The local controller's state, shared by its tasks.
pub struct Local {
    options: LocalOptions,
    /// Stages' jobs and sizes from the kernel and the scheduler, not their claims.
    identity: Resolver,
    peers: Mutex<admission::Peers>,
    pending: Arc<Budget>,
    /// Bytes queued to all stages (`outbox`).
    queued: Arc<Budget>,
    next_stage_id: AtomicU64,
    stages: Mutex<HashMap<u64, stage::StageEntry>>,
    upstream: Mutex<Option<Arc<upstream::Upstream>>>,
    /// Placement requests relayed to the global controller.
    placements: placement::Placements,
    /// File sizes the node's stages may report.
    size_rate: Mutex<placement::Rate>,
    user_directories: user_files::UserDirectories,
    /// Who holds a default, and which jobs have rules from the global controller.
    defaults: default_rules::Defaults,
}

impl Local {
    fn new(options: LocalOptions, user_directories: user_files::UserDirectories) -> Local {
        Local {
            pending: Budget::new(options.limits.max_pending_bytes),
            queued: Budget::new(outbox::MAX_BYTES_PER_NODE),
            // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
            identity: Resolver::new(Box::new(SlurmCgroups::system()), unsafe { libc::geteuid() }),
            options,
            peers: Mutex::new(admission::Peers::default()),
            next_stage_id: AtomicU64::new(1),
            stages: Mutex::new(HashMap::new()),
            upstream: Mutex::new(None),
            placements: Default::default(),
            size_rate: Mutex::new(placement::Rate::new(placement::SIZE_RATE_PER_NODE)),
            user_directories,
            defaults: Default::default(),
        }
    }

    fn lock_stages(&self) -> MutexGuard<'_, HashMap<u64, stage::StageEntry>> {
        padll_wire::sync::lock_or_panic(&self.stages, STATE)
    }

    fn lock_peers(&self) -> MutexGuard<'_, admission::Peers> {
        padll_wire::sync::lock_or_panic(&self.peers, STATE)
    }

    fn lock_upstream(&self) -> MutexGuard<'_, Option<Arc<upstream::Upstream>>> {
        padll_wire::sync::lock_or_panic(&self.upstream, STATE)
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
    let (listener, socket_file) = bounds::bind_unix(&options.socket, 0o666)?;
    let socket_file = Arc::new(socket_file);
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
    let local = Arc::new(Local::new(options, user_files::UserDirectories::prepare()));
    let secured = if local.options.tls.is_some() {
        "mutual TLS"
    } else {
        "PLAINTEXT"
    };
    info!(
        version = crate::VERSION,
        node = %local.options.node,
        socket = %local.options.socket.display(),
        global = %local.options.global,
        upstream = secured,
        "local controller started"
    );
    info!(
        "stages without rules from the global controller get, per job: {}",
        local.options.default_limit
    );
    // Each task runs for the life of the process: the first to end (or panic) ends it.
    let mut tasks = Supervisor::default();
    {
        let local = local.clone();
        tasks.spawn("the upstream loop", async move {
            upstream::upstream_loop(local, globals).await;
            Ok(())
        });
    }
    tasks.spawn("the log summary", async {
        log_summary::summary_loop(&ACTIVITY, &OVER_REPORTS).await;
        Ok(())
    });
    {
        let local = local.clone();
        tasks.spawn("the default rules loop", async move {
            default_rules::resplit_loop(local).await;
            Ok(())
        });
    }
    tasks.spawn("the memory trim loop", async {
        trim::trim_loop().await;
        Ok(())
    });
    tasks.spawn("the stage socket", async move {
        stage::accept_stages(local, listener).await;
        Ok(())
    });
    {
        // A socket file removed or replaced leaves the controller serving the stages
        // attached and no new one: their processes would run on their own limits (none
        // by default) until a restart, with nothing said. Ending (exit 1) says it, and
        // the service manager makes the socket anew.
        let socket_file = socket_file.clone();
        tasks.spawn("the socket watch", async move {
            loop {
                tokio::time::sleep(SOCKET_CHECK).await;
                if !socket_file.still_bound() {
                    return Err(LocalError::SocketGone {
                        socket: socket_file.path().to_path_buf(),
                    });
                }
            }
        });
    }
    Err(tasks.first_end().await.into_error(LocalError::Ended))
}

/// How often the stage socket's file is checked to still be the one bound.
const SOCKET_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

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
    /// The stage socket's file was removed or replaced while running.
    #[error("the socket {} was removed or replaced: new stages cannot reach this controller; exiting so that it is made anew", socket.display())]
    SocketGone {
        /// The socket.
        socket: PathBuf,
    },
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
