//! `cheferd relay`: its flags, checked into the library's `RelayOptions`, and the relay
//! run until it fails or a stop signal.

use crate::common::{failed, usage, Failure};
use cheferd_controller::bounds;
use cheferd_controller::relay::{self, RelayOptions};
use cheferd_controller::tls::{ClientTls, ServerTls};
use clap::Args;
use std::path::PathBuf;

/// `cheferd relay`.
#[derive(Args)]
pub struct RelayArgs {
    /// gRPC address the local controllers attach to (their --global).
    #[arg(long, default_value = "127.0.0.1:50052")]
    listen: String,
    /// The global controller (`http://…` only with --insecure-plaintext); with a
    /// standby, every global controller, comma-separated: the leader is followed.
    #[arg(
        long,
        value_name = "URL[,URL…]",
        default_value = "https://127.0.0.1:50051"
    )]
    global: String,
    #[command(flatten)]
    tls: RelayTlsArgs,
}

/// A relay's TLS flags: a server certificate for the local controllers, a node
/// certificate for the global controller, one site CA.
#[derive(clap::Args)]
struct RelayTlsArgs {
    /// Its server certificate, which the local controllers check (PEM; `cheferd certs
    /// server` makes it).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Its node certificate, which the global controller checks (`cheferd certs node
    /// NAME`; NAME must be in the global controller's `relays`).
    #[arg(long, value_name = "FILE")]
    node_cert: Option<PathBuf>,
    /// That certificate's private key (PEM).
    #[arg(long, value_name = "FILE")]
    node_key: Option<PathBuf>,
    /// The site CA: the local controllers' and the global controller's certificates
    /// must chain to it.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// The name the global controller's certificate must carry (default: the host of
    /// --global).
    #[arg(long, value_name = "NAME")]
    tls_server_name: Option<String>,
    /// Serve and talk plaintext gRPC, unauthenticated: the global controller must run
    /// with --insecure-plaintext too. For tests and trusted networks only.
    #[arg(long)]
    insecure_plaintext: bool,
}

/// Runs the relay until it fails, or a stop signal (then exits 0).
pub async fn run(args: RelayArgs) -> Result<(), Failure> {
    let RelayArgs {
        listen,
        global,
        tls,
    } = args;
    crate::local::check_global(&global)?;
    let (downstream_tls, upstream_tls) = match relay_tls(tls)? {
        Some((server, client)) => (
            Some(
                server
                    .load_as(["--tls-cert", "--tls-key", "--tls-ca"])
                    .map_err(usage)?,
            ),
            Some(
                client
                    .load_as(["--node-cert", "--node-key", "--tls-ca"])
                    .map_err(usage)?,
            ),
        ),
        None => (None, None),
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| usage(format!("--listen {listen}: {e}")))?;
    if downstream_tls.is_none() {
        tracing::warn!(
            "--insecure-plaintext: the relay's streams are neither encrypted nor authenticated"
        );
    }
    tracing::info!(listen = %listener.local_addr().map_err(failed)?, %global, "relay started");
    let mut stop = bounds::StopSignals::install().map_err(failed)?;
    let options = RelayOptions {
        global,
        upstream_tls,
        downstream_tls,
    };
    let signal = tokio::select! {
        result = relay::run(listener, options) => return result.map_err(failed),
        signal = stop.recv() => signal,
    };
    tracing::info!(signal, "relay stopped");
    Ok(())
}

/// The TLS files as the library takes them, or `None` with --insecure-plaintext.
fn relay_tls(flags: RelayTlsArgs) -> Result<Option<(ServerTls, ClientTls)>, Failure> {
    let files = [
        ("--tls-cert", &flags.tls_cert),
        ("--tls-key", &flags.tls_key),
        ("--node-cert", &flags.node_cert),
        ("--node-key", &flags.node_key),
        ("--tls-ca", &flags.tls_ca),
    ];
    let given = files.iter().filter(|(_, file)| file.is_some()).count();
    if flags.insecure_plaintext {
        if given > 0 {
            return Err(usage(
                "--insecure-plaintext conflicts with the TLS files given",
            ));
        }
        return Ok(None);
    }
    if let Some((missing, _)) = files.iter().find(|(_, file)| file.is_none()) {
        return Err(usage(if given == 0 {
            "a relay is reached and reaches the global controller with --tls-cert, --tls-key, \
             --node-cert, --node-key and --tls-ca (`cheferd certs` makes them), or \
             --insecure-plaintext"
                .to_string()
        } else {
            format!("mutual TLS needs {missing} as well")
        }));
    }
    let [Some(cert), Some(key), Some(node_cert), Some(node_key), Some(ca)] =
        files.map(|(_, file)| file.clone())
    else {
        return Err(usage("mutual TLS needs every TLS file"));
    };
    let server = ServerTls {
        cert,
        key,
        client_ca: ca.clone(),
    };
    let client = ClientTls {
        cert: node_cert,
        key: node_key,
        ca,
        server_name: flags.tls_server_name,
    };
    Ok(Some((server, client)))
}
