//! One global controller, wired: its listeners and the tasks that run for its life (the
//! gRPC server, the admin socket, the metrics endpoint, the control loop or the standby),
//! supervised so that the first to end ends it. `cheferd global`, the demo and the bench
//! all start it here; the checks of `cheferd global`'s options that are more than clap's
//! (the configuration file, TLS flags over `[tls]`, the standby's flags) are here too.

use crate::admin::{self, AdminSocketError};
use crate::bounds::{self, SocketError, SocketFile};
use crate::config::{ConfigError, GlobalConfig, TlsSettings};
use crate::global::Controller;
use crate::standby::{StandbyError, StandbyOptions};
use crate::supervise::Supervisor;
use crate::tls::{ServerTls, TlsFileError};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// What a global controller serves, and how.
pub struct GlobalOptions {
    /// Resources, policies, jobs, scheduled rules.
    pub config: GlobalConfig,
    /// The file `config` was read from, named in the start line (`None`: made by the
    /// caller).
    pub config_file: Option<PathBuf>,
    /// The gRPC address for local controllers (port 0: any, see [`Running::grpc_address`]).
    pub listen: String,
    /// The admin socket for `cheferd ctl`, if any.
    pub admin_socket: Option<PathBuf>,
    /// The Prometheus metrics address, if any.
    pub metrics: Option<String>,
    /// Mutual TLS on the gRPC port; `None` is plaintext.
    pub tls: Option<ServerTls>,
    /// Who runs the control cycles.
    pub cycles: Cycles,
}

/// Who runs a global controller's control cycles.
pub enum Cycles {
    /// Its control loop, every `interval_ms`: the only global controller.
    Loop,
    /// The standby, while this controller leads the etcd election (`crate::standby`).
    Standby(Box<StandbyOptions>),
    /// The caller, one [`Controller::cycle_at`] at a time (the bench, which times each).
    Caller,
}

/// Why a global controller did not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GlobalError {
    /// A TLS file refused.
    #[error(transparent)]
    Tls(#[from] TlsFileError),
    /// The admin socket refused or not made.
    #[error(transparent)]
    AdminSocket(#[from] SocketError),
    /// The admin socket made but not served.
    #[error(transparent)]
    AdminServe(#[from] AdminSocketError),
    /// A TCP address that cannot be listened on.
    #[error("cannot listen on {flag} {address}: {error}")]
    Listen {
        /// `--listen` or `--metrics`.
        flag: &'static str,
        /// The address.
        address: String,
        /// Why.
        error: std::io::Error,
    },
    /// The configuration refused when building the controller (a policy, placement).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The standby stopped (e.g. deposed by a newer leader).
    #[error(transparent)]
    Standby(#[from] StandbyError),
    /// The gRPC server did not start or stopped.
    #[error(transparent)]
    Serve(#[from] crate::global::ServeError),
    /// A task that runs for the life of the controller ended (which and how).
    #[error("{0}")]
    Ended(String),
}

/// A global controller running: its tasks stop, and its admin socket is removed, when
/// it is dropped.
pub struct Running {
    controller: Arc<Controller>,
    grpc_address: SocketAddr,
    tasks: Supervisor<GlobalError>,
    _admin_socket: Option<SocketFile>,
}

impl Running {
    /// The controller (its snapshot, changes, and cycles with [`Cycles::Caller`]).
    pub fn controller(&self) -> &Arc<Controller> {
        &self.controller
    }

    /// The address the gRPC server listens on.
    pub fn grpc_address(&self) -> SocketAddr {
        self.grpc_address
    }

    /// Waits until one of its tasks ends, which none should: why.
    pub async fn ended(&mut self) -> GlobalError {
        self.tasks.first_end().await.into_error(GlobalError::Ended)
    }
}

/// Runs a global controller until one of its tasks ends (it should not: the error says
/// which and why). Stopping it is dropping this future.
pub async fn run(options: GlobalOptions) -> Result<(), GlobalError> {
    let mut running = start(options).await?;
    Err(running.ended().await)
}

/// Starts a global controller: binds its listeners and spawns its tasks.
pub async fn start(options: GlobalOptions) -> Result<Running, GlobalError> {
    let GlobalOptions {
        config,
        config_file,
        listen,
        admin_socket,
        metrics,
        tls,
        cycles,
    } = options;
    let secured = if tls.is_some() {
        "mutual TLS"
    } else {
        "PLAINTEXT"
    };
    let tls = tls.map(|tls| tls.load()).transpose()?;
    // The socket file is removed when `Running` is dropped, or when starting fails below.
    let admin = match &admin_socket {
        Some(path) => Some(bounds::bind_unix(path, 0o666)?),
        None => None,
    };
    let grpc = bind("--listen", &listen).await?;
    let metrics_listener = match &metrics {
        Some(address) => Some(bind("--metrics", address).await?),
        None => None,
    };
    let admins = config.admins.clone();
    let controller = Controller::new(config)?;
    let grpc_address = grpc.local_addr().map_err(|error| GlobalError::Listen {
        flag: "--listen",
        address: listen,
        error,
    })?;
    tracing::info!(
        version = crate::VERSION,
        config = %config_file.as_deref().map_or("built in".into(), |file| file.display().to_string()),
        listen = %grpc_address,
        grpc = secured,
        admin_socket = %admin_socket.as_deref().map_or("none".into(), |path| path.display().to_string()),
        metrics = %metrics_listener.as_ref().map_or("off".into(), bound),
        "global controller started"
    );
    // Each task runs for the life of the controller: the first to end (or panic) ends it.
    let mut tasks = Supervisor::default();
    if let Some(listener) = metrics_listener {
        let controller = controller.clone();
        tasks.spawn("the metrics endpoint", async move {
            crate::metrics::serve(controller, listener).await;
            Ok(())
        });
    }
    let (admin_listener, admin_file) = admin.unzip();
    if let Some(listener) = admin_listener {
        let controller = controller.clone();
        tasks.spawn("the admin socket", async move {
            Ok(admin::serve(controller, listener, admins).await?)
        });
    }
    match cycles {
        Cycles::Loop => {
            let controller = controller.clone();
            tasks.spawn("the control loop", async move {
                controller.run_loop().await;
                Ok(())
            });
        }
        Cycles::Standby(options) => {
            let controller = controller.clone();
            tasks.spawn("the standby", async move {
                Ok(crate::standby::run(controller, *options).await?)
            });
        }
        Cycles::Caller => {}
    }
    {
        let controller = controller.clone();
        tasks.spawn("the gRPC server", async move {
            Ok(crate::global::serve(controller, grpc, tls).await?)
        });
    }
    Ok(Running {
        controller,
        grpc_address,
        tasks,
        _admin_socket: admin_file,
    })
}

async fn bind(flag: &'static str, address: &str) -> Result<TcpListener, GlobalError> {
    TcpListener::bind(address)
        .await
        .map_err(|error| GlobalError::Listen {
            flag,
            address: address.to_string(),
            error,
        })
}

fn bound(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|e| e.to_string(), |a| a.to_string())
}

/// `cheferd global`'s options refused before anything was started.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// The configuration file could not be read.
    #[error("cannot read --config {}: {error}", path.display())]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        error: padll_wire::config::ReadError,
    },
    /// The configuration file refused.
    #[error("{}: {error}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// Why.
        error: Box<ConfigError>,
    },
    /// Neither TLS files nor plaintext asked for.
    #[error(
        "the gRPC port needs --tls-cert, --tls-key and --tls-client-ca (or [tls] in the \
         configuration; `cheferd certs` makes them), or --insecure-plaintext"
    )]
    NoTls,
    /// Plaintext asked for with TLS files.
    #[error("--insecure-plaintext conflicts with the TLS files given")]
    PlaintextAndTls,
    /// Some TLS files given, not all (the first missing flag).
    #[error("mutual TLS needs {0} as well")]
    MissingTls(&'static str),
    /// A TLS file (the standby's) refused.
    #[error(transparent)]
    Tls(#[from] TlsFileError),
    /// A bad `--etcd-prefix`.
    #[error("--etcd-prefix '{0}' must start with / and be at most 256 bytes")]
    EtcdPrefix(String),
    /// An `--advertise` URL of the other scheme than the gRPC port's.
    #[error(
        "--advertise '{url}' must be a {scheme}:// URL (as in the local controllers' --global)"
    )]
    Advertise {
        /// The URL.
        url: String,
        /// `http` or `https`.
        scheme: &'static str,
    },
}

/// The largest `--config` read: thousands of jobs' terms, far below what a FIFO or
/// `/dev/zero` in its place would make of it.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Reads and checks a configuration file (with care: see
/// [`padll_wire::config::read_text_file`]), logging its warnings.
pub fn read_config(path: &Path) -> Result<GlobalConfig, OptionsError> {
    let text = padll_wire::config::read_text_file(path, MAX_CONFIG_BYTES).map_err(|error| {
        OptionsError::ReadConfig {
            path: path.to_path_buf(),
            error,
        }
    })?;
    let config = GlobalConfig::parse(&text, &crate::policy::check).map_err(|error| {
        OptionsError::Config {
            path: path.to_path_buf(),
            error: Box::new(error),
        }
    })?;
    for warning in config.warnings() {
        tracing::warn!("{}: {warning}", path.display());
    }
    Ok(config)
}

/// The TLS files given on the command line (`--tls-cert`, `--tls-key`,
/// `--tls-client-ca`) and `--insecure-plaintext`.
pub struct TlsFlags {
    /// The certificate.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
    /// The site CA of the nodes' certificates.
    pub client_ca: Option<PathBuf>,
    /// Plaintext gRPC.
    pub insecure_plaintext: bool,
}

/// The gRPC port's TLS files: flags over `[tls]` (whose relative paths are taken from the
/// directory of the configuration file, `config_file`); `None` only when plaintext is
/// asked for.
pub fn server_tls(
    config_file: &Path,
    settings: &TlsSettings,
    flags: TlsFlags,
) -> Result<Option<ServerTls>, OptionsError> {
    let base = config_file.parent().unwrap_or(Path::new("."));
    let from_config = |path: &Option<PathBuf>| path.as_ref().map(|p| base.join(p));
    let cert = flags.cert.or_else(|| from_config(&settings.cert));
    let key = flags.key.or_else(|| from_config(&settings.key));
    let client_ca = flags.client_ca.or_else(|| from_config(&settings.client_ca));
    let plaintext = flags.insecure_plaintext || settings.insecure_plaintext;
    match (cert, key, client_ca) {
        (None, None, None) if plaintext => {
            tracing::warn!(
                "--insecure-plaintext: the gRPC port is neither encrypted nor authenticated; \
                 anyone who reaches it can pose as any node"
            );
            Ok(None)
        }
        (None, None, None) => Err(OptionsError::NoTls),
        _ if plaintext => Err(OptionsError::PlaintextAndTls),
        (Some(cert), Some(key), Some(client_ca)) => Ok(Some(ServerTls {
            cert,
            key,
            client_ca,
        })),
        (None, _, _) => Err(OptionsError::MissingTls("--tls-cert")),
        (_, None, _) => Err(OptionsError::MissingTls("--tls-key")),
        (_, _, None) => Err(OptionsError::MissingTls("--tls-client-ca")),
    }
}

/// `cheferd global`'s standby flags (`--etcd …`), as given.
pub struct StandbyFlags {
    /// etcd client URLs; none: the only global controller.
    pub etcd: Vec<String>,
    /// The key prefix of the election and administrative changes.
    pub prefix: String,
    /// The etcd lease's time to live.
    pub ttl: Duration,
    /// The URL local controllers reach this one by (default: http(s)://LISTEN).
    pub advertise: Option<String>,
    /// The CA of etcd's server certificates.
    pub etcd_ca: Option<PathBuf>,
    /// A client certificate for etcd, with `etcd_key`.
    pub etcd_cert: Option<PathBuf>,
    /// Its key.
    pub etcd_key: Option<PathBuf>,
}

impl StandbyFlags {
    /// The standby's options, if etcd URLs were given, checked; `listen` and `tls` are the
    /// gRPC port's.
    pub fn check(
        self,
        listen: &str,
        tls: Option<&ServerTls>,
    ) -> Result<Option<StandbyOptions>, OptionsError> {
        if self.etcd.is_empty() {
            return Ok(None);
        }
        if !self.prefix.starts_with('/') || self.prefix.len() > 256 {
            return Err(OptionsError::EtcdPrefix(self.prefix));
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let advertise = self
            .advertise
            .unwrap_or_else(|| format!("{scheme}://{listen}"));
        if !advertise.starts_with(&format!("{scheme}://")) {
            return Err(OptionsError::Advertise {
                url: advertise,
                scheme,
            });
        }
        let etcd_tls = match (self.etcd_ca, self.etcd_cert, self.etcd_key) {
            (Some(ca), cert, key) => {
                let trust = crate::tls::trusting("--etcd-ca", &ca)?;
                Some(match (cert, key) {
                    (Some(cert), Some(key)) => trust.identity(crate::tls::identity(
                        "--etcd-cert",
                        &cert,
                        "--etcd-key",
                        &key,
                    )?),
                    _ => trust,
                })
            }
            _ => None,
        };
        Ok(Some(StandbyOptions {
            endpoints: self.etcd,
            etcd_tls,
            prefix: self.prefix.trim_end_matches('/').to_string(),
            advertise,
            ttl: self.ttl,
            peer_tls: tls.map(ServerTls::peer_client).transpose()?,
        }))
    }
}
