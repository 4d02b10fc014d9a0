//! `cheferd ctl`: views of a running global controller and changes to it, through its
//! admin socket.

use crate::ADMIN_SOCKET;
use cheferd_controller::admin::{self, AdminRequest, CtlError, CtlErrorKind};
use cheferd_controller::global::Change;
use clap::{Args, Subcommand};
use padll_wire::exit::print;
use std::path::PathBuf;
use std::time::Duration;

/// `cheferd ctl`.
#[derive(Args)]
pub struct CtlArgs {
    /// The global controller's admin socket.
    #[arg(long, value_name = "PATH", default_value = ADMIN_SOCKET)]
    #[arg(global = true)]
    socket: PathBuf,
    /// Print the views (nodes, jobs, stages, top, dump) and replies as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// Role (single, leader or follower), term, leader, etcd and lease.
    Status,
    /// Attached local controllers.
    Nodes,
    /// Jobs with usage, demand and assigned rate per resource.
    Jobs,
    /// Registered stages.
    Stages,
    /// Live jobs view, refreshed every second (Ctrl-C to quit).
    Top {
        /// Print once and exit.
        #[arg(long)]
        once: bool,
    },
    /// The whole state as JSON (registry, last cycle, configuration).
    Dump,
    /// Change a resource's policy.
    SetPolicy {
        /// `MOUNT:CLASS`.
        resource: String,
        /// Policy name.
        policy: String,
    },
    /// Change a resource's capacity Max_R (a rate: static from then on; `auto`: steered by
    /// the file system's service times again, for a resource configured so).
    SetMaxRate {
        /// `MOUNT:CLASS`.
        resource: String,
        /// Rate (`110000`, `110k`, `20GiB/s`) or `auto`.
        #[arg(allow_negative_numbers = true)]
        rate: String,
    },
    /// Change a job's priority, or its demand / static limit on a resource.
    SetJob {
        /// Job id.
        job: String,
        /// New priority (0.000001 to 1000000).
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<f64>,
        /// The resource for --demand / --limit.
        #[arg(long)]
        resource: Option<String>,
        /// New demand (a rate: `40000`, `40k`, `1GiB/s`).
        #[arg(long, allow_negative_numbers = true)]
        demand: Option<String>,
        /// New static limit (a rate), or `none` to lift it.
        #[arg(long, allow_negative_numbers = true)]
        limit: Option<String>,
    },
}

/// Prints the view asked for, or sends the change.
pub async fn ctl(args: CtlArgs) -> Result<(), CtlError> {
    let CtlArgs {
        socket,
        json,
        command,
    } = args;
    let socket = socket.as_path();
    // `--json`: each view prints the part of the admin socket's snapshot it shows.
    let snapshot_json = || admin::request(socket, &AdminRequest::Snapshot);
    match command {
        CtlCommand::Status if json => print_line(&snapshot_json().await?["leadership"]),
        CtlCommand::Status => print(&admin::snapshot(socket).await?.leadership.render()),
        CtlCommand::Nodes if json => print_line(&snapshot_json().await?["nodes"]),
        CtlCommand::Stages if json => print_line(&snapshot_json().await?["stages"]),
        CtlCommand::Jobs | CtlCommand::Top { once: true } if json => {
            print_line(jobs_json(snapshot_json().await?))
        }
        CtlCommand::Top { .. } if json => loop {
            print_line(jobs_json(snapshot_json().await?));
            tokio::time::sleep(Duration::from_secs(1)).await;
        },
        CtlCommand::Nodes => print(&admin::nodes_table(&admin::snapshot(socket).await?)),
        CtlCommand::Jobs => print(&admin::jobs_table(&admin::snapshot(socket).await?)),
        CtlCommand::Stages => print(&admin::stages_table(&admin::snapshot(socket).await?)),
        CtlCommand::Top { once } => loop {
            let table = admin::jobs_table(&admin::snapshot(socket).await?);
            if once {
                print(&table);
                break;
            }
            // Clear the screen only on a terminal: a pipe or file gets one table a second.
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                print(&format!("\x1b[2J\x1b[H{table}"));
            } else {
                print_line(table);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        },
        CtlCommand::Dump => {
            let snapshot = admin::request(socket, &AdminRequest::Snapshot).await?;
            let config = admin::request(socket, &AdminRequest::Config).await?;
            let dump = serde_json::json!({ "state": snapshot, "config": config });
            print_line(serde_json::to_string_pretty(&dump).unwrap_or_default());
        }
        CtlCommand::SetPolicy { resource, policy } => {
            send_change(socket, Change::Policy { resource, policy }, json).await?
        }
        CtlCommand::SetMaxRate { resource, rate } => {
            send_change(socket, Change::MaxRate { resource, rate }, json).await?
        }
        CtlCommand::SetJob {
            job,
            priority,
            resource,
            demand,
            limit,
        } => {
            let change = Change::Job {
                job,
                priority,
                resource,
                demand,
                limit,
            };
            send_change(socket, change, json).await?
        }
    }
    Ok(())
}

/// Sends a change, checked first so that a typo is bad usage (exit 2) naming the value;
/// the controller refuses (exit 1) what only it can judge, such as a resource it does
/// not share.
async fn send_change(socket: &std::path::Path, change: Change, json: bool) -> Result<(), CtlError> {
    change
        .check()
        .map_err(|error| CtlError::new(CtlErrorKind::Usage, error.to_string()))?;
    print_ok(
        admin::request(socket, &AdminRequest::Change { change }).await?,
        json,
    );
    Ok(())
}

/// The jobs view of a snapshot for `ctl jobs --json` and `ctl top --json`: what the
/// table shows (cycle, latency, resources, every job's share of each).
fn jobs_json(mut snapshot: serde_json::Value) -> serde_json::Value {
    let keys = [
        "cycle",
        "latency_ms_p50",
        "latency_ms_p99",
        "resources",
        "shares",
    ];
    let view = keys.map(|key| (key.to_string(), snapshot[key].take()));
    serde_json::Value::Object(view.into_iter().collect())
}

fn print_ok(value: serde_json::Value, json: bool) {
    match value {
        serde_json::Value::String(s) if !json => print_line(s),
        other => print_line(other),
    }
}

/// [`print()`] with a newline.
fn print_line(text: impl std::fmt::Display) {
    print(&format!("{text}\n"));
}
