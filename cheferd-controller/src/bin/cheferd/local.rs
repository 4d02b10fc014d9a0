//! `cheferd local`: its flags, checked into the library's `LocalOptions`, and the
//! controller run until it fails or a stop signal.

use crate::common::{failed, usage, Failure, MAX_COUNT};
use cheferd_controller::bounds;
use cheferd_controller::local::{self, LocalLimits, LocalOptions};
use clap::Args;
use padll_wire::flags::whole;
use std::path::PathBuf;
use std::time::Duration;

/// Where the local controller's socket is by default: systemd makes it
/// (`RuntimeDirectory=cheferd` in `etc/systemd/`); elsewhere give the path.
const LOCAL_SOCKET: &str = "/run/cheferd/local.sock";

/// Upper bound of byte flags (see [`MAX_COUNT`]): 1 TiB.
const MAX_BYTES: usize = 1 << 40;

/// `cheferd local`.
#[derive(Args)]
pub struct LocalArgs {
    /// This node's name (default: its certificate's; with --insecure-plaintext, the
    /// host name). With TLS it must be a name the certificate carries.
    #[arg(long)]
    node: Option<String>,
    /// Unix socket the stages connect to (their PADLL_CONTROLLER).
    #[arg(long, value_name = "PATH", default_value = LOCAL_SOCKET)]
    socket: PathBuf,
    /// The global controller (`http://…` only with --insecure-plaintext); with a
    /// standby, every global controller, comma-separated: the leader is followed.
    #[arg(
        long,
        value_name = "URL[,URL…]",
        default_value = "https://127.0.0.1:50051"
    )]
    global: String,
    #[command(flatten)]
    tls: LocalTlsArgs,
    /// How often stages report usage, ms.
    #[arg(long, default_value_t = 250)]
    #[arg(allow_negative_numbers = true, value_parser = whole(10..=60_000u64))]
    report_ms: u64,
    /// Stage connections, all users together (also kept below the descriptor limit).
    #[arg(long, default_value_t = 4096)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_COUNT))]
    max_connections: usize,
    /// Stage connections per uid.
    #[arg(long, default_value_t = 1024)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_COUNT))]
    max_connections_per_uid: usize,
    /// Distinct jobs among one uid's stages.
    #[arg(long, default_value_t = 64)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_COUNT))]
    max_jobs_per_uid: usize,
    /// Bytes of partial lines buffered for all connections.
    #[arg(long, default_value_t = 64 << 20)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_BYTES))]
    max_pending_bytes: usize,
    /// Bytes of partial lines buffered for one uid's connections.
    #[arg(long, default_value_t = 16 << 20)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_BYTES))]
    max_pending_bytes_per_uid: usize,
    /// Limits of a job on this node while it has no rules from the global controller
    /// (starting, frozen, unreachable, fenced), whatever its own environment says: as
    /// PADLL_RULES (`/scratch:metadata=2000/s,/scratch:data=1GiB/s`), or 0 for none
    /// [default: 1 % of each resource's Max_R, once the global controller said it]
    #[arg(long, value_name = "RULES", value_parser = local::parse_default_limit)]
    #[arg(allow_hyphen_values = true)]
    default_limit: Option<local::DefaultLimit>,
}

/// A local controller's TLS flags.
#[derive(clap::Args)]
struct LocalTlsArgs {
    /// This node's certificate (PEM; `cheferd certs node` makes it). Its DNS name is
    /// the node's name.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The site CA the global controller's certificate must chain to.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// The name the global controller's certificate must carry (default: the host of
    /// --global).
    #[arg(long, value_name = "NAME")]
    tls_server_name: Option<String>,
    /// Talk plaintext gRPC to a global controller run with --insecure-plaintext.
    #[arg(long)]
    insecure_plaintext: bool,
}

/// `--global` of a local controller or a relay: URLs, comma-separated.
pub fn check_global(global: &str) -> Result<(), Failure> {
    if global
        .split(',')
        .all(|url| url.starts_with("http://") || url.starts_with("https://"))
    {
        return Ok(());
    }
    Err(usage(format!(
        "--global '{global}' must be a URL such as http://10.0.0.1:50051"
    )))
}

/// Runs the local controller until it fails, or a stop signal (then exits 0).
pub async fn run(args: LocalArgs) -> Result<(), Failure> {
    let LocalArgs {
        node,
        socket,
        global,
        tls,
        report_ms,
        max_connections,
        max_connections_per_uid,
        max_jobs_per_uid,
        max_pending_bytes,
        max_pending_bytes_per_uid,
        default_limit,
    } = args;
    let limits = LocalLimits {
        max_connections,
        max_connections_per_uid,
        max_jobs_per_uid,
        max_pending_bytes,
        max_pending_bytes_per_uid,
    };
    check_global(&global)?;
    let tls = local_tls(tls)?;
    // With a certificate, the node is who the certificate says (its first DNS name).
    let certified = match &tls {
        Some(tls) => Some(tls.node_names().map_err(usage)?.remove(0)),
        None => None,
    };
    let node = node
        .or(certified)
        .unwrap_or_else(padll_wire::config::hostname);
    let mut stop = bounds::StopSignals::install().map_err(failed)?;
    let run = local::run(LocalOptions {
        node,
        socket,
        global,
        tls,
        report_interval: Duration::from_millis(report_ms),
        limits,
        default_limit: default_limit.unwrap_or(local::DefaultLimit::BuiltIn),
    });
    let signal = tokio::select! {
        result = run => return result.map_err(|error| match error {
            // Stopped while running: a failure (exit 1, restarted), not a usage error.
            local::LocalError::Ended(_) | local::LocalError::SocketGone { .. } => failed(error),
            error => usage(error),
        }),
        signal = stop.recv() => signal,
    };
    // `run`, which owns the socket file, is dropped by now: the socket is gone.
    tracing::info!(signal, "local controller stopped");
    Ok(())
}

/// A local controller's TLS files; `None` only when plaintext is asked for.
fn local_tls(flags: LocalTlsArgs) -> Result<Option<cheferd_controller::tls::ClientTls>, Failure> {
    match (flags.tls_cert, flags.tls_key, flags.tls_ca) {
        (None, None, None) if flags.insecure_plaintext => {
            tracing::warn!(
                "--insecure-plaintext: the stream to the global controller is neither \
                 encrypted nor authenticated"
            );
            Ok(None)
        }
        (None, None, None) => Err(usage(
            "the global controller is reached with --tls-cert, \
             --tls-key and --tls-ca (`cheferd certs` makes them), or --insecure-plaintext",
        )),
        _ if flags.insecure_plaintext => Err(usage(
            "--insecure-plaintext conflicts with the TLS files given",
        )),
        (Some(cert), Some(key), Some(ca)) => Ok(Some(cheferd_controller::tls::ClientTls {
            cert,
            key,
            ca,
            server_name: flags.tls_server_name,
        })),
        (cert, key, _) => Err(usage(format!(
            "mutual TLS needs {} as well",
            if cert.is_none() {
                "--tls-cert"
            } else if key.is_none() {
                "--tls-key"
            } else {
                "--tls-ca"
            }
        ))),
    }
}
