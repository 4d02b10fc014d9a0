//! `cheferd global`: its flags, checked into the library's `GlobalOptions`, and the
//! controller run until it fails or a stop signal.

use crate::common::{failed, usage, Failure, Kind};
use crate::ADMIN_SOCKET;
use cheferd_controller::bounds;
use cheferd_controller::global_process::{self, Cycles, GlobalError, GlobalOptions, OptionsError};
use clap::Args;
use padll_wire::flags::whole;
use std::path::PathBuf;
use std::time::Duration;

/// `cheferd global`.
#[derive(Args)]
pub struct GlobalArgs {
    /// TOML configuration (resources, policies, jobs, scheduled rules).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// gRPC address for local controllers.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: String,
    /// Admin socket for `cheferd ctl`.
    #[arg(long, value_name = "PATH", default_value = ADMIN_SOCKET)]
    admin_socket: PathBuf,
    /// Prometheus metrics address (`GET /metrics`).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    #[command(flatten)]
    tls: GlobalTlsArgs,
    #[command(flatten)]
    standby: StandbyArgs,
}

/// The global controller's TLS flags (they override `[tls]` of the configuration).
#[derive(clap::Args)]
struct GlobalTlsArgs {
    /// Its certificate (PEM; `cheferd certs server` makes it).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The site CA: local controllers must present a node certificate it signed.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Serve plaintext gRPC, unauthenticated: anyone who reaches the port can pose as
    /// any node. For tests and trusted networks only.
    #[arg(long)]
    insecure_plaintext: bool,
}

/// `cheferd global`'s standby flags (see `cheferd_controller::standby`).
#[derive(Args)]
struct StandbyArgs {
    /// Run as one of several global controllers, the leader elected in this etcd
    /// cluster (client URLs, comma-separated). Without it, the only global controller.
    #[arg(long, value_name = "URL[,URL…]", value_delimiter = ',')]
    etcd: Vec<String>,
    /// The etcd key prefix of this cluster's election and administrative changes.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "/padll",
        requires = "etcd"
    )]
    etcd_prefix: String,
    /// Seconds a dead leader keeps the leadership (its etcd lease's TTL).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10,
        requires = "etcd",
        allow_negative_numbers = true,
        value_parser = whole(1..=3600u64)
    )]
    etcd_ttl: u64,
    /// The URL local controllers reach this global controller by, as in their
    /// `--global` lists (default: http(s)://LISTEN).
    #[arg(long, value_name = "URL", requires = "etcd")]
    advertise: Option<String>,
    /// The CA of etcd's server certificates: talk to etcd over TLS (https:// URLs).
    #[arg(long, value_name = "PEM", requires = "etcd")]
    etcd_ca: Option<PathBuf>,
    /// A client certificate for etcd (its `--client-cert-auth`), with --etcd-key.
    #[arg(long, value_name = "PEM", requires_all = ["etcd_key", "etcd_ca"])]
    etcd_cert: Option<PathBuf>,
    /// The key of --etcd-cert.
    #[arg(long, value_name = "PEM", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
}

/// Runs the global controller until it fails, or a stop signal (then exits 0).
pub async fn run(args: GlobalArgs) -> Result<(), Failure> {
    let options = options(args).map_err(usage)?;
    let mut stop = bounds::StopSignals::install().map_err(failed)?;
    tokio::select! {
        result = global_process::run(options) => result.map_err(failure),
        signal = stop.recv() => {
            tracing::info!(signal, "global controller stopped");
            Ok(())
        }
    }
}

fn options(args: GlobalArgs) -> Result<GlobalOptions, OptionsError> {
    let GlobalArgs {
        config: config_file,
        listen,
        admin_socket,
        metrics,
        tls,
        standby,
    } = args;
    let config = global_process::read_config(&config_file)?;
    let tls_flags = global_process::TlsFlags {
        cert: tls.tls_cert,
        key: tls.tls_key,
        client_ca: tls.tls_client_ca,
        insecure_plaintext: tls.insecure_plaintext,
    };
    let tls = global_process::server_tls(&config_file, &config.tls, tls_flags)?;
    let standby = global_process::StandbyFlags {
        etcd: standby.etcd,
        prefix: standby.etcd_prefix,
        ttl: Duration::from_secs(standby.etcd_ttl),
        advertise: standby.advertise,
        etcd_ca: standby.etcd_ca,
        etcd_cert: standby.etcd_cert,
        etcd_key: standby.etcd_key,
    }
    .check(&listen, tls.as_ref())?;
    Ok(GlobalOptions {
        config,
        config_file: Some(config_file),
        listen,
        admin_socket: Some(admin_socket),
        metrics,
        tls,
        cycles: standby.map_or(Cycles::Loop, |options| Cycles::Standby(Box::new(options))),
    })
}

/// What refused to start is bad usage (exit 2); what failed while running is not.
fn failure(error: GlobalError) -> Failure {
    let kind = match error {
        GlobalError::Tls(_)
        | GlobalError::AdminSocket(_)
        | GlobalError::AdminServe(_)
        | GlobalError::Listen { .. }
        | GlobalError::Config(_) => Kind::Usage,
        GlobalError::Standby(_) | GlobalError::Serve(_) | GlobalError::Ended(_) => Kind::Failed,
    };
    Failure::new(kind, error.to_string())
}
