//! The admin socket of the global controller and the `cheferd ctl` client.
//!
//! Authorisation model: the socket (a Unix socket, mode 0666) answers anyone who can
//! reach it with *read-only* views (nodes, jobs, stages, top, dump): that information is
//! what `squeue` shows too. *Changes* (policy, `Max_R`, a job's priority, demand or
//! static limit) are accepted only from root, from the uid running the controller, and
//! from the uids listed in `admins` — checked with `SO_PEERCRED`, i.e. by the kernel, not
//! by anything the client says. Put the socket in a directory only admins can enter to
//! make even read-only access admin-only.
//!
//! Protocol: one JSON request per line (`{"request":"snapshot"}`, `{"request":"config"}`,
//! `{"request":"change","change":{…}}`), one JSON reply per line
//! (`{"ok":…}` or `{"error":"…"}`).

use crate::global::{Change, Controller, Snapshot};
use crate::lines::{self, Line};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tracing::info;

const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// How a refused change's reply begins: the client tells the kind of the refusal by it
/// (the reply is one line of text on the wire).
const PERMISSION_DENIED: &str = "permission denied";
/// Admin connections open at once; further ones are closed at once.
pub const MAX_ADMIN_CONNECTIONS: usize = 256;
static ADMIN_LOG: crate::bounds::LogLimit =
    crate::bounds::LogLimit::new(5, std::time::Duration::from_secs(5));

/// One open admin connection, counted until dropped.
struct Counted(Arc<std::sync::atomic::AtomicUsize>);

impl Counted {
    fn new(count: Arc<std::sync::atomic::AtomicUsize>) -> Counted {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A request on the admin socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    /// Registry and last cycle.
    Snapshot,
    /// The configuration in force.
    Config,
    /// A change (admins only).
    Change {
        /// What to change.
        change: Change,
    },
}

/// A reply on the admin socket.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminReply {
    /// Success, with a payload.
    Ok(serde_json::Value),
    /// Failure, with the reason.
    Error(String),
}

/// The admin socket, bound, could not be served.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve the admin socket: {0}")]
pub struct AdminSocketError(pub std::io::Error);

/// Serves the admin socket (bound by [`crate::bounds::bind_unix`]) until the process
/// ends.
pub async fn serve(
    controller: Arc<Controller>,
    listener: std::os::unix::net::UnixListener,
    admins: Vec<u32>,
) -> Result<(), AdminSocketError> {
    let listener = UnixListener::from_std(listener).map_err(AdminSocketError)?;
    // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
    let owner = unsafe { libc::geteuid() };
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut backoff = crate::bounds::AcceptBackoff::default();
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => {
                backoff.succeeded("admin socket");
                s
            }
            Err(e) => {
                tokio::time::sleep(backoff.failed("admin socket", &e)).await;
                continue;
            }
        };
        if connections.load(std::sync::atomic::Ordering::Relaxed) >= MAX_ADMIN_CONNECTIONS {
            crate::limited_warn!(
                ADMIN_LOG,
                "refused an admin connection: {MAX_ADMIN_CONNECTIONS} are open"
            );
            continue;
        }
        let controller = controller.clone();
        let admins = admins.clone();
        let counted = Counted::new(connections.clone());
        tokio::spawn(async move {
            let _counted = counted;
            let uid = stream.peer_cred().map(|c| c.uid()).ok();
            let (read, mut write) = stream.into_split();
            let mut reader = BufReader::new(read);
            loop {
                let reply = match lines::read_line(&mut reader, MAX_REQUEST_BYTES).await {
                    Ok(Line::Text(line)) => match serde_json::from_str::<AdminRequest>(&line) {
                        Ok(request) => {
                            let may_change =
                                uid.is_some_and(|u| u == 0 || u == owner || admins.contains(&u));
                            answer(&controller, request, may_change, uid)
                        }
                        Err(e) => AdminReply::Error(format!(
                            "malformed request: {}",
                            padll_wire::control::short(&e.to_string())
                        )),
                    },
                    Ok(Line::TooLong(n)) => AdminReply::Error(format!(
                        "request of {n} bytes exceeds {MAX_REQUEST_BYTES}"
                    )),
                    Ok(Line::End) | Ok(Line::OverBudget) | Err(_) => return,
                };
                let mut text = serde_json::to_string(&reply).unwrap_or_default();
                text.push('\n');
                if write.write_all(text.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

fn answer(
    controller: &Controller,
    request: AdminRequest,
    may_change: bool,
    uid: Option<u32>,
) -> AdminReply {
    match request {
        AdminRequest::Snapshot => serde_json::to_value(controller.snapshot())
            .map_or_else(|e| AdminReply::Error(e.to_string()), AdminReply::Ok),
        AdminRequest::Config => serde_json::to_value(controller.config())
            .map_or_else(|e| AdminReply::Error(e.to_string()), AdminReply::Ok),
        AdminRequest::Change { .. } if !may_change => AdminReply::Error(format!(
            "{PERMISSION_DENIED}: uid {} is not an administrator of this controller",
            uid.map_or("unknown".to_string(), |u| u.to_string())
        )),
        AdminRequest::Change { change } => {
            let description = format!("{change:?}");
            match controller.change(change) {
                Ok(message) => {
                    info!(uid = ?uid, "admin change: {description}");
                    AdminReply::Ok(serde_json::Value::String(message))
                }
                Err(e) => AdminReply::Error(e.to_string()),
            }
        }
    }
}

/// Why a `ctl` command failed: one line for the administrator, and its kind, from
/// which `cheferd` takes its exit code.
pub type CtlError = padll_wire::exit::Failure<CtlErrorKind>;

/// What kind of failure a [`CtlError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtlErrorKind {
    /// The controller cannot be reached or did not answer.
    Unavailable,
    /// The controller refused: the caller is not one of its administrators.
    PermissionDenied,
    /// Bad usage: a change that cannot be right, or a socket that is not an admin
    /// socket.
    Usage,
    /// The controller refused the request, or its reply was unreadable.
    Refused,
}

/// How long `cheferd ctl` waits for a controller that accepted the connection: a hung
/// controller must not hang the administrator's shell or script.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Sends one request and returns the reply's payload.
pub async fn request(socket: &Path, request: &AdminRequest) -> Result<serde_json::Value, CtlError> {
    tokio::time::timeout(REQUEST_TIMEOUT, exchange(socket, request))
        .await
        .unwrap_or_else(|_| {
            Err(CtlError::new(
                CtlErrorKind::Unavailable,
                format!(
                    "the global controller at {} did not answer within {} s",
                    socket.display(),
                    REQUEST_TIMEOUT.as_secs()
                ),
            ))
        })
}

async fn exchange(socket: &Path, request: &AdminRequest) -> Result<serde_json::Value, CtlError> {
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
        CtlError::new(
            CtlErrorKind::Unavailable,
            format!(
                "cannot reach the global controller's admin socket {}: {e}",
                socket.display()
            ),
        )
    })?;
    let (read, mut write) = stream.into_split();
    let mut text = serde_json::to_string(request).unwrap_or_default();
    text.push('\n');
    let unavailable = |e: std::io::Error| {
        CtlError::new(
            CtlErrorKind::Unavailable,
            format!("admin socket {}: {e}", socket.display()),
        )
    };
    write
        .write_all(text.as_bytes())
        .await
        .map_err(unavailable)?;
    let mut reader = BufReader::new(read);
    let line = match lines::read_line(&mut reader, 64 * 1024 * 1024)
        .await
        .map_err(unavailable)?
    {
        Line::Text(line) => line,
        _ => {
            return Err(CtlError::new(
                CtlErrorKind::Unavailable,
                "the controller closed the admin connection",
            ))
        }
    };
    if padll_wire::control::decode::<padll_wire::control::ControlMessage>(&line).is_ok() {
        return Err(CtlError::new(
            CtlErrorKind::Usage,
            format!(
                "{} is a local controller's stage socket (cheferd local --socket), not the \
                 global controller's admin socket: give --socket the path of cheferd global \
                 --admin-socket",
                socket.display()
            ),
        ));
    }
    match serde_json::from_str::<AdminReply>(&line) {
        Ok(AdminReply::Ok(value)) => Ok(value),
        Ok(AdminReply::Error(message)) => {
            let kind = if message.starts_with(PERMISSION_DENIED) {
                CtlErrorKind::PermissionDenied
            } else {
                CtlErrorKind::Refused
            };
            Err(CtlError::new(kind, message))
        }
        Err(e) => Err(CtlError::new(
            CtlErrorKind::Refused,
            format!("unreadable reply from the controller: {e}"),
        )),
    }
}

/// Fetches and decodes a snapshot.
pub async fn snapshot(socket: &Path) -> Result<Snapshot, CtlError> {
    let value = request(socket, &AdminRequest::Snapshot).await?;
    serde_json::from_value(value)
        .map_err(|e| CtlError::new(CtlErrorKind::Refused, format!("unreadable snapshot: {e}")))
}

/// A rate or count rounded to a whole number, never written `-0` (an empty sum of
/// floats is `-0.0`, and a tiny negative rounds to it).
fn whole(value: f64) -> String {
    // Adding +0.0 turns -0.0 into +0.0 and leaves every other value as it is.
    format!("{:.0}", value.round() + 0.0)
}

/// Renders the jobs table (`ctl jobs`, `ctl top`).
pub fn jobs_table(snapshot: &Snapshot) -> String {
    let mut out = format!(
        "cycle {}  nodes {}  stages {}  cycle latency p50 {:.2} ms p99 {:.2} ms\n",
        snapshot.cycle,
        snapshot.nodes.len(),
        snapshot.stages.len(),
        snapshot.latency_ms_p50,
        snapshot.latency_ms_p99
    );
    for resource in &snapshot.resources {
        let shares: Vec<_> = snapshot
            .shares
            .iter()
            .filter(|s| s.resource.to_string() == resource.resource)
            .collect();
        let used: f64 = shares.iter().map(|s| s.usage).sum();
        out.push_str(&format!(
            "\n{}  Max_R {}  policy {}  used {} ({} %)\n",
            resource.resource,
            whole(resource.max_rate),
            resource.policy,
            whole(used),
            whole(100.0 * used / resource.max_rate.max(1.0))
        ));
        out.push_str(&format!(
            "  {:<20} {:>7} {:>6} {:>9} {:>12} {:>12} {:>12} {:>10}\n",
            "job", "stages", "nodes", "priority", "demand", "usage", "assigned", "static"
        ));
        for s in shares {
            out.push_str(&format!(
                "  {:<20} {:>7} {:>6} {:>9} {:>12} {:>12} {:>12} {:>10}\n",
                s.job,
                s.stages,
                s.nodes,
                s.priority,
                whole(s.demand),
                whole(s.usage),
                whole(s.assigned),
                s.static_limit.map_or("-".to_string(), whole)
            ));
        }
    }
    out
}

/// Renders the nodes table.
pub fn nodes_table(snapshot: &Snapshot) -> String {
    let mut out = format!(
        "{:<24} {:<9} {:>7} {:>14} {:>14} {:>13}\n",
        "node", "state", "stages", "bytes in", "bytes out", "unacked cycle"
    );
    for n in &snapshot.nodes {
        let state = if n.attached { "attached" } else { "detached" };
        let unacked = n.unacked_cycle.map_or("-".to_string(), |c| c.to_string());
        out.push_str(&format!(
            "{:<24} {:<9} {:>7} {:>14} {:>14} {:>13}\n",
            n.node, state, n.stages, n.bytes_in, n.bytes_out, unacked
        ));
    }
    out
}

/// Renders the stages table.
pub fn stages_table(snapshot: &Snapshot) -> String {
    let mut out = format!(
        "{:<16} {:>6} {:<16} {:>8} {:>6} {:<16} usage\n",
        "node", "stage", "job", "pid", "uid", "program"
    );
    for s in &snapshot.stages {
        let usage: Vec<String> = s
            .usage
            .iter()
            .map(|(r, v)| format!("{r}={}", whole(*v)))
            .collect();
        out.push_str(&format!(
            "{:<16} {:>6} {:<16} {:>8} {:>6} {:<16} {}\n",
            s.node,
            s.stage_id,
            s.job,
            s.pid,
            s.uid,
            s.name.rsplit('/').next().unwrap_or(&s.name),
            usage.join(" ")
        ));
    }
    out
}
