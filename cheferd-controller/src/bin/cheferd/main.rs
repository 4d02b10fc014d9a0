//! `cheferd`: the PADLL control plane's daemon and its administration — the global and
//! local controllers, `ctl`, `certs`. The operator's tools (demo, bench, replayer, the
//! policies' dry runs) are `cheferd-lab`'s, so the daemon run as root carries none of
//! them. This file parses the command line and dispatches; each command is a module.

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

mod certs;
#[path = "../../../../scripts/cli-docs.rs"]
mod cli_docs;
#[path = "../common/mod.rs"]
mod common;
mod ctl;
mod global;
mod local;
mod man_pages;
mod relay;

use common::{global_runtime, in_runtime, usage, Failure};

/// The global controller's admin socket by default: systemd makes its directory
/// (`RuntimeDirectory=cheferd` in `etc/systemd/`); elsewhere give the path.
const ADMIN_SOCKET: &str = "/run/cheferd/admin.sock";

#[derive(Parser)]
#[command(
    name = "cheferd",
    version = cheferd_controller::VERSION,
    about = "PADLL control plane: global and local controllers, admin CLI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the global controller.
    Global(global::GlobalArgs),
    /// Run a local controller (one per compute node).
    Local(local::LocalArgs),
    /// Run a relay: local controllers attach to it, and it carries all their streams
    /// to the global controller in one (one per rack, say).
    Relay(relay::RelayArgs),
    /// Make the site CA and the certificates of the global and local controllers
    /// (mutual TLS; no openssl needed).
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Administer a running global controller.
    Ctl(ctl::CtlArgs),
    /// Write man pages or shell completions (used by scripts/install.sh).
    #[command(hide = true, subcommand)]
    Generate(cli_docs::Generate),
}

fn main() -> ExitCode {
    common::main(default_level, dispatch)
}

/// Daemons log their lifecycle; one-shot commands only what goes wrong.
fn default_level(cli: &Cli) -> &'static str {
    match cli.command {
        Command::Global(_) | Command::Local(_) | Command::Relay(_) => "info",
        _ => "warn",
    }
}

/// Each subcommand's entry function. The controllers and `ctl` run in an async runtime;
/// the others are plain code.
fn dispatch(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Global(args) => global_runtime()?.block_on(global::run(args)),
        Command::Local(args) => in_runtime(local::run(args)),
        Command::Relay(args) => global_runtime()?.block_on(relay::run(args)),
        Command::Certs(command) => certs::certs(command),
        Command::Ctl(args) => in_runtime(async {
            ctl::ctl(args)
                .await
                .map_err(cheferd_controller::admin::CtlError::into_kind)
        }),
        Command::Generate(what) => {
            cli_docs::generate(&what, Cli::command(), &man_pages::EXTRAS).map_err(usage)
        }
    }
}
