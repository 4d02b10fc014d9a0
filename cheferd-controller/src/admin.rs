//! The admin socket of the global controller and the `cheferd ctl` client.
//!
//! Authorisation model: the socket (a Unix socket, mode 0666) answers anyone who can
//! reach it, and who is asking is known from `SO_PEERCRED`, i.e. from the kernel, not
//! from anything the client says. **Administrators** — root, the uid running the
//! controller and the uids listed in `admins` — see everything and may make *changes*
//! (policy, `Max_R`, a job's priority, demand or static limit). **Everyone else** sees
//! only their own: the stages of their uid, the shares and settings of the jobs those
//! stages belong to, plus what is no one's (resources, nodes, leadership, cycle
//! latency) — as Slurm's `PrivateData=jobs` does for `squeue`. Put the socket in a
//! directory only admins can enter to make even that admin-only.
//!
//! Bounds: connections are capped (a share of the descriptor limit,
//! [`crate::bounds::ListenerCaps`]); a uid that is no administrator holds at most
//! [`MAX_CONNECTIONS_PER_USER`] of them and non-administrators together at most three
//! quarters, so the rest always remains for `cheferd ctl` run by an administrator; a
//! connection whose next request or reply does not move within [`IDLE_TIMEOUT`] is
//! closed.
//!
//! Protocol: one JSON request per line (`{"request":"snapshot"}`, `{"request":"config"}`,
//! `{"request":"change","change":{…}}`), one JSON reply per line
//! (`{"ok":…}` or `{"error":"…"}`).

use crate::config::GlobalConfig;
use crate::global::{AutoSnapshot, Change, Controller, ServiceSummary, Snapshot};
use crate::lines::{self, Line};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::info;

const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// How a refused change's reply begins: the client tells the kind of the refusal by it
/// (the reply is one line of text on the wire).
const PERMISSION_DENIED: &str = "permission denied";
/// Admin connections one uid that is no administrator may hold open at once.
pub const MAX_CONNECTIONS_PER_USER: usize = 8;
/// How long a connection may wait for its next request, or take to read a reply.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
static ADMIN_LOG: crate::bounds::LogLimit = crate::bounds::LogLimit::new(5, Duration::from_secs(5));

/// Who may see everything and make changes on the admin socket.
struct Administrators {
    /// The uid running the controller.
    owner: u32,
    /// The configuration's `admins`.
    listed: Vec<u32>,
}

impl Administrators {
    fn include(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner || self.listed.contains(&uid)
    }
}

/// The admin connections open: in all, and per uid that is no administrator.
struct Holders {
    cap: usize,
    state: Mutex<HolderCounts>,
}

#[derive(Default)]
struct HolderCounts {
    total: usize,
    /// Connections of non-administrators, in all and per uid.
    users: usize,
    per_user: HashMap<u32, usize>,
}

impl Holders {
    /// Counts a new connection of `uid` (`admin`: an administrator's) until the guard
    /// is dropped; `None` at a cap.
    fn take(self: &Arc<Self>, uid: u32, admin: bool) -> Option<Held> {
        let mut counts = padll_wire::sync::lock(&self.state);
        if counts.total >= self.cap {
            return None;
        }
        if !admin {
            let mine = counts.per_user.get(&uid).copied().unwrap_or(0);
            // A quarter of the cap is kept for administrators.
            if mine >= MAX_CONNECTIONS_PER_USER || counts.users >= self.cap - self.cap / 4 {
                return None;
            }
            counts.per_user.insert(uid, mine + 1);
            counts.users += 1;
        }
        counts.total += 1;
        Some(Held {
            holders: self.clone(),
            user: (!admin).then_some(uid),
        })
    }
}

/// One counted admin connection.
struct Held {
    holders: Arc<Holders>,
    /// The uid, if it is no administrator's.
    user: Option<u32>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut counts = padll_wire::sync::lock(&self.holders.state);
        counts.total -= 1;
        if let Some(uid) = self.user {
            counts.users -= 1;
            match counts.per_user.get_mut(&uid) {
                Some(n) if *n > 1 => *n -= 1,
                _ => {
                    counts.per_user.remove(&uid);
                }
            }
        }
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
/// ends; `admins` are the configuration's.
pub async fn serve(
    controller: Arc<Controller>,
    listener: std::os::unix::net::UnixListener,
    admins: Vec<u32>,
) -> Result<(), AdminSocketError> {
    let listener = UnixListener::from_std(listener).map_err(AdminSocketError)?;
    let administrators = Administrators {
        // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
        owner: unsafe { libc::geteuid() },
        listed: admins,
    };
    let holders = Arc::new(Holders {
        cap: crate::bounds::ListenerCaps::of_this_process().admin,
        state: Mutex::default(),
    });
    let mut backoff = crate::bounds::AcceptBackoff::default();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff.succeeded("admin socket");
                stream
            }
            Err(e) => {
                tokio::time::sleep(backoff.failed("admin socket", &e)).await;
                continue;
            }
        };
        let Ok(uid) = stream.peer_cred().map(|c| c.uid()) else {
            continue;
        };
        let admin = administrators.include(uid);
        let Some(held) = holders.take(uid, admin) else {
            crate::limited_warn!(
                ADMIN_LOG,
                "refused an admin connection of uid {uid}: at its cap ({} open at most, {MAX_CONNECTIONS_PER_USER} per user who is no administrator)",
                holders.cap
            );
            continue;
        };
        let caller = Caller { uid, admin };
        tokio::spawn(serve_connection(controller.clone(), stream, caller, held));
    }
}

/// Who sent a request: their uid, and whether they are an administrator.
#[derive(Clone, Copy, Debug)]
struct Caller {
    uid: u32,
    admin: bool,
}

async fn serve_connection(
    controller: Arc<Controller>,
    stream: UnixStream,
    caller: Caller,
    _held: Held,
) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let line = tokio::time::timeout(
            IDLE_TIMEOUT,
            lines::read_line(&mut reader, MAX_REQUEST_BYTES),
        );
        let reply = match line.await {
            Ok(Ok(Line::Text(line))) => match serde_json::from_str::<AdminRequest>(&line) {
                Ok(request) => answer(&controller, request, caller),
                Err(e) => AdminReply::Error(format!(
                    "malformed request: {}",
                    padll_wire::control::short(&e.to_string())
                )),
            },
            Ok(Ok(Line::TooLong(n))) => {
                AdminReply::Error(format!("request of {n} bytes exceeds {MAX_REQUEST_BYTES}"))
            }
            // The end, a read error, or no request within the idle timeout.
            _ => return,
        };
        let mut text = serde_json::to_string(&reply).unwrap_or_default();
        text.push('\n');
        let written = tokio::time::timeout(IDLE_TIMEOUT, write.write_all(text.as_bytes()));
        if !matches!(written.await, Ok(Ok(()))) {
            return;
        }
    }
}

fn answer(controller: &Controller, request: AdminRequest, caller: Caller) -> AdminReply {
    let reply = |value: Result<serde_json::Value, serde_json::Error>| {
        value.map_or_else(|e| AdminReply::Error(e.to_string()), AdminReply::Ok)
    };
    match request {
        AdminRequest::Snapshot => {
            let mut snapshot = controller.snapshot();
            if !caller.admin {
                own_snapshot(&mut snapshot, caller.uid);
            }
            reply(serde_json::to_value(snapshot))
        }
        AdminRequest::Config => {
            let mut config = controller.config();
            if !caller.admin {
                let mut snapshot = controller.snapshot();
                own_snapshot(&mut snapshot, caller.uid);
                own_config(&mut config, &snapshot);
            }
            reply(serde_json::to_value(config))
        }
        AdminRequest::Change { .. } if !caller.admin => AdminReply::Error(format!(
            "{PERMISSION_DENIED}: uid {} is not an administrator of this controller",
            caller.uid
        )),
        AdminRequest::Change { change } => {
            let description = format!("{change:?}");
            match controller.change(change) {
                Ok(message) => {
                    info!(uid = caller.uid, "admin change: {description}");
                    AdminReply::Ok(serde_json::Value::String(message))
                }
                Err(e) => AdminReply::Error(e.to_string()),
            }
        }
    }
}

/// What `uid`, no administrator, may see of a snapshot: the stages of that uid and the
/// shares of their jobs (nodes, resources and leadership are no one's).
fn own_snapshot(snapshot: &mut Snapshot, uid: u32) {
    snapshot.stages.retain(|stage| stage.uid == uid);
    let jobs: BTreeSet<&str> = snapshot.stages.iter().map(|s| s.job.as_str()).collect();
    snapshot
        .shares
        .retain(|share| jobs.contains(share.job.as_str()));
}

/// The configuration as a user sees it: the settings and scheduled rules of the jobs
/// in their `own` snapshot only.
fn own_config(config: &mut GlobalConfig, own: &Snapshot) {
    let jobs: BTreeSet<&str> = own.stages.iter().map(|s| s.job.as_str()).collect();
    config.jobs.retain(|job, _| jobs.contains(job.as_str()));
    config.rules.retain(|rule| jobs.contains(rule.job.as_str()));
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

/// A peer's text (a job id, a program name) for a table: control characters escaped,
/// so none reaches the administrator's terminal.
fn shown(text: &str) -> String {
    padll_wire::escape(text).to_string()
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
            "\n{}  Max_R {}{}  policy {}  used {} ({} %){}\n",
            resource.resource,
            whole(resource.max_rate),
            resource
                .auto
                .map_or_else(String::new, |auto| auto_targets(&auto)),
            resource.policy,
            whole(used),
            whole(100.0 * used / resource.max_rate.max(1.0)),
            service_times(&resource.service)
        ));
        out.push_str(&format!(
            "  {:<20} {:>7} {:>6} {:>9} {:>12} {:>12} {:>12} {:>10}\n",
            "job", "stages", "nodes", "priority", "demand", "usage", "assigned", "static"
        ));
        for s in shares {
            out.push_str(&format!(
                "  {:<20} {:>7} {:>6} {:>9} {:>12} {:>12} {:>12} {:>10}\n",
                shown(&s.job),
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

/// The file system's service times of a resource's calls, for its line of the jobs
/// table (nothing without calls).
fn service_times(service: &ServiceSummary) -> String {
    match (service.p50_ms, service.p99_ms) {
        (Some(p50), Some(p99)) => format!(
            "  service p50 {p50:.3} ms p99 {p99:.3} ms ({} calls)",
            service.calls
        ),
        _ => String::new(),
    }
}

/// What steers an `auto` resource's `Max_R`, after it in the jobs table.
fn auto_targets(auto: &AutoSnapshot) -> String {
    let targets: Vec<String> = [("p50", auto.target_p50_ms), ("p99", auto.target_p99_ms)]
        .into_iter()
        .filter_map(|(q, ms)| Some(format!("{q} {:.3} ms", ms?)))
        .collect();
    format!(
        " (auto: {}, {}–{})",
        targets.join(" "),
        whole(auto.floor),
        whole(auto.ceiling)
    )
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
            shown(&n.node),
            state,
            n.stages,
            n.bytes_in,
            n.bytes_out,
            unacked
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
            shown(&s.node),
            s.stage_id,
            shown(&s.job),
            s.pid,
            s.uid,
            shown(s.name.rsplit('/').next().unwrap_or(&s.name)),
            usage.join(" ")
        ));
    }
    out
}
