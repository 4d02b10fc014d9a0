//! The stage protocol on the Unix socket: admission, hello, identity, welcome, then the
//! stage's messages until it leaves (see `padll_wire::control`).

use super::admission::Admission;
use super::log_summary::Event;
use super::outbox::{Closed, Outbox, WRITE_STALL};
use super::placement::{Rate, PLACE_RATE_PER_STAGE};
use super::{Local, ACTIVITY, OVER_REPORTS, PEER_LOG};
use crate::bounds::{self, AcceptBackoff, Budget};
use crate::limited_info;
use crate::limited_warn;
use crate::lines::{self, Line};
use crate::proto::{self, local_message};
use crate::usage::UsageTracker;
use padll_wire::config::Identity;
use padll_wire::control::{
    self, ControlMessage, StageMessage, MAX_MESSAGE_BYTES, OLDEST_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf, UCred};
use tokio::net::{UnixListener, UnixStream};

/// A registered stage.
pub(super) struct StageEntry {
    pub(super) info: proto::Stage,
    pub(super) outbox: Arc<Outbox>,
    pub(super) usage: UsageTracker,
}

/// Serves each stage connecting to `listener` in a task of its own.
pub(super) async fn accept_stages(local: Arc<Local>, listener: UnixListener) {
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

/// A stage's first message.
struct Hello {
    /// The stage's protocol version (its welcome names it back).
    version: u32,
    stage_name: String,
    identity: Identity,
    mountpoints: Vec<String>,
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
            limited_warn!(
                ACTIVITY.on(Event::Rejected),
                pid = ?credentials.pid(),
                "refused a stage connection: {why}"
            );
            // A cap: it frees up as stages leave, so the stage tries again later.
            let reject = ControlMessage::Reject {
                reason: format!("refused: {why}"),
                retry: true,
            };
            let _ = stream.try_write(control::encode(&reject).as_bytes());
            return;
        }
    };
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let node_pending = local.pending.clone();
    let user_pending = admission.pending.clone();
    let budgets = [&*node_pending, &*user_pending];

    let Some(hello) = read_hello(&mut reader, &mut write, &budgets, &credentials).await else {
        return;
    };
    let version = hello.version;
    let Some(info) = identify(&local, &mut admission, &credentials, hello, &mut write).await else {
        return;
    };
    let stage_id = info.stage_id;
    let outbox = Outbox::new(admission.queued.clone(), local.queued.clone());
    if !welcome(&local, stage_id, version, write, &outbox).await {
        return;
    }
    limited_info!(
        ACTIVITY.on(Event::Registered),
        stage_id,
        job = %padll_wire::escape(&info.job_id),
        pid = info.pid,
        uid = info.uid,
        "stage registered"
    );
    local.lock_stages().insert(
        stage_id,
        StageEntry {
            info: info.clone(),
            outbox: outbox.clone(),
            usage: UsageTracker::new(Instant::now()),
        },
    );
    local.give_first_rules(stage_id);
    local.send_upstream(local_message::Body::StageJoined(proto::StageJoined {
        stage: Some(info),
        announced: false,
    }));

    let mut stage = Registered {
        stage_id,
        uid: admission.uid(),
        place_rate: Rate::new(PLACE_RATE_PER_STAGE),
        uid_place_rate: admission.place_rate.clone(),
        size_rate: Rate::new(PLACE_RATE_PER_STAGE),
        uid_size_rate: admission.size_rate.clone(),
    };
    loop {
        let line = tokio::select! {
            line = lines::read_line_within(&mut reader, MAX_MESSAGE_BYTES, &budgets) => line,
            why = outbox.closed() => {
                if why != Closed::Ended {
                    limited_warn!(
                        ACTIVITY.on(Event::Closed),
                        stage_id,
                        "closed a stage connection: {why}"
                    );
                }
                break;
            }
        };
        if stage_line(&local, &mut stage, line).is_break() {
            break;
        }
    }
    outbox.close(Closed::Ended);
    local.lock_stages().remove(&stage_id);
    limited_info!(ACTIVITY.on(Event::Left), stage_id, "stage left");
    local.send_upstream(local_message::Body::StageLeft(proto::StageLeft {
        stage_id,
    }));
}

/// Tells a stage it is not accepted, why, and whether that may change (`retry`: it
/// tries again later).
async fn reject(write: &mut OwnedWriteHalf, reason: String, retry: bool) {
    let _ = write
        .write_all(control::encode(&ControlMessage::Reject { reason, retry }).as_bytes())
        .await;
}

/// The stage's hello (within 10 s), or `None` once it was rejected (told and logged)
/// or left.
async fn read_hello(
    reader: &mut BufReader<OwnedReadHalf>,
    write: &mut OwnedWriteHalf,
    budgets: &[&Budget],
    credentials: &UCred,
) -> Option<Hello> {
    let hello = match tokio::time::timeout(
        Duration::from_secs(10),
        lines::read_line_within(reader, MAX_MESSAGE_BYTES, budgets),
    )
    .await
    {
        Ok(Ok(Line::Text(line))) => {
            control::decode::<StageMessage>(&line).map_err(HelloError::from)
        }
        Ok(Ok(Line::TooLong(n))) => Err(HelloError::TooLong(n)),
        Ok(Ok(Line::OverBudget)) => Err(HelloError::OverBudget),
        Ok(Ok(Line::End)) | Ok(Err(_)) => return None,
        Err(_) => Err(HelloError::Late),
    };
    match hello {
        Ok(StageMessage::Hello {
            version: version @ OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION,
            stage_name,
            identity,
            mountpoints,
        }) => Some(Hello {
            version,
            stage_name,
            identity,
            mountpoints,
        }),
        Ok(StageMessage::Hello { version, .. }) => {
            let reason = format!("protocol version {version} is not supported (this controller speaks {PROTOCOL_VERSION})");
            limited_warn!(ACTIVITY.on(Event::Rejected), pid = ?credentials.pid(), "{reason}");
            reject(write, reason, false).await;
            None
        }
        Ok(_) => {
            limited_warn!(
                ACTIVITY.on(Event::Rejected),
                pid = ?credentials.pid(),
                "stage spoke before saying hello"
            );
            None
        }
        Err(e) => {
            limited_warn!(
                ACTIVITY.on(Event::Rejected),
                pid = ?credentials.pid(),
                "rejected a stage connection: {e}"
            );
            // A budget or a slow start passes; a malformed hello does not.
            let retry = matches!(e, HelloError::OverBudget | HelloError::Late);
            reject(write, e.to_string(), retry).await;
            None
        }
    }
}

/// The stage as the control plane sees it: its job and size from the kernel and the
/// scheduler ([`crate::identity`]), joined to its job under the caps; `None` once it
/// was rejected (told and logged).
async fn identify(
    local: &Arc<Local>,
    admission: &mut Admission,
    credentials: &UCred,
    hello: Hello,
    write: &mut OwnedWriteHalf,
) -> Option<proto::Stage> {
    let Hello {
        stage_name,
        identity,
        mountpoints,
        ..
    } = hello;
    // A job id never holds control characters (one would forge log lines and reach an
    // administrator's terminal): refused. Free text a real program may carry (its
    // `argv[0]`, account, host) is kept with them escaped.
    if bounds::has_control(&identity.job_id) {
        let reason = format!(
            "job id {} contains control characters",
            padll_wire::quote(&padll_wire::control::short(&identity.job_id))
        );
        limited_warn!(ACTIVITY.on(Event::Rejected), pid = ?credentials.pid(), "rejected a stage: {reason}");
        // The job id is the program's environment: the same at every retry.
        reject(write, reason, false).await;
        return None;
    }
    let stage_name = escaped(stage_name);
    let identity = Identity {
        account: escaped(identity.account),
        hostname: escaped(identity.hostname),
        ..identity
    };
    let pid = credentials.pid().map_or(identity.pid, |p| p as u32);
    let resolved = {
        let (local, job, size, uid, gid) = (
            local.clone(),
            identity.job_id.clone(),
            identity.job_size,
            credentials.uid(),
            credentials.gid(),
        );
        // Reads /proc and may run `scontrol`: off the async workers. The user's
        // directory is made before the stage gets rules (and so opens its job's files).
        tokio::task::spawn_blocking(move || {
            local.user_directories.prepare_for(uid, gid);
            let user = crate::identity::user_name(uid);
            local
                .identity
                .resolve(&job, size, uid, pid)
                .map(|r| (r, user))
        })
        .await
        // A failed lookup may succeed later; a process in another uid's job stays there.
        .map_err(|e| (format!("identity lookup failed: {e}"), true))
        .and_then(|resolved| resolved.map_err(|e| (e.to_string(), false)))
    };
    let (resolved, user) = match resolved {
        Ok(resolved) => resolved,
        Err((reason, retry)) => {
            limited_warn!(
                ACTIVITY.on(Event::Rejected),
                pid,
                "rejected a stage: {reason}"
            );
            reject(write, reason, retry).await;
            return None;
        }
    };
    if let Some(note) = &resolved.note {
        limited_warn!(PEER_LOG, pid, job = %padll_wire::escape(&resolved.job_id), "stage identity corrected: {}", padll_wire::escape(note));
    }
    if let Err(refusal) = local.join_job(admission, &resolved.job_id) {
        limited_warn!(
            ACTIVITY.on(Event::Rejected),
            pid = ?credentials.pid(),
            "rejected a stage: {refusal}"
        );
        // A cap, or a job id another uid holds until its stages leave: both may change.
        reject(write, refusal.to_string(), true).await;
        return None;
    }
    let info = proto::Stage {
        stage_id: local.next_stage_id.fetch_add(1, Ordering::Relaxed),
        // What the kernel and the scheduler say, not what the stage claims.
        job_id: resolved.job_id,
        job_size: resolved.job_size,
        // The kernel's uid, not the claim (`PADLL_USER`): histories are kept per user.
        user,
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
        limited_warn!(
            ACTIVITY.on(Event::Rejected),
            pid = info.pid,
            "rejected a stage: {too_large}"
        );
        reject(write, too_large.to_string(), false).await;
        return None;
    }
    Some(info)
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`), as it is if none.
fn escaped(text: String) -> String {
    if bounds::has_control(&text) {
        padll_wire::escape(&text).to_string()
    } else {
        text
    }
}

/// Welcomes the stage in its protocol `version` and starts the task writing its outbox
/// to it; `false` if it left.
async fn welcome(
    local: &Local,
    stage_id: u64,
    version: u32,
    mut write: OwnedWriteHalf,
    outbox: &Arc<Outbox>,
) -> bool {
    let welcome = ControlMessage::Welcome {
        version,
        stage_id,
        report_interval_ms: local.options.report_interval.as_millis() as u64,
    };
    let written = tokio::time::timeout(
        WRITE_STALL,
        write.write_all(control::encode(&welcome).as_bytes()),
    )
    .await;
    if !matches!(written, Ok(Ok(()))) {
        return false;
    }
    tokio::spawn(outbox.clone().write_to(write, WRITE_STALL));
    true
}

/// A registered stage, as its reading task keeps it.
struct Registered {
    stage_id: u64,
    uid: u32,
    /// The placement requests it may make, and those of its uid.
    place_rate: Rate,
    uid_place_rate: Arc<Mutex<Rate>>,
    /// The file sizes it may report, and those of its uid.
    size_rate: Rate,
    uid_size_rate: Arc<Mutex<Rate>>,
}

impl Registered {
    /// Whether a placement request may go upstream now (within the rates of the stage
    /// and of its uid).
    fn may_place(&mut self) -> bool {
        let now = Instant::now();
        self.place_rate.take(now) && padll_wire::sync::lock(&self.uid_place_rate).take(now)
    }
}

/// Handles one line from a registered stage; `Break` when the connection is over.
fn stage_line(
    local: &Local,
    stage: &mut Registered,
    line: std::io::Result<Line>,
) -> ControlFlow<()> {
    let stage_id = stage.stage_id;
    match line {
        Ok(Line::Text(line)) => match control::decode::<StageMessage>(&line) {
            Ok(message) => stage_message(local, stage, message),
            Err(e) => limited_warn!(PEER_LOG, stage_id, "dropped a message from a stage: {e}"),
        },
        Ok(Line::TooLong(n)) => limited_warn!(
            PEER_LOG,
            stage_id,
            "dropped a {n}-byte message from a stage (limit {MAX_MESSAGE_BYTES})"
        ),
        Ok(Line::OverBudget) => {
            limited_warn!(
                ACTIVITY.on(Event::Closed),
                stage_id,
                "closed a stage connection: {}",
                over_budget()
            );
            return ControlFlow::Break(());
        }
        Ok(Line::End) | Err(_) => return ControlFlow::Break(()),
    }
    ControlFlow::Continue(())
}

/// Handles one message from a registered stage.
fn stage_message(local: &Local, stage: &mut Registered, message: StageMessage) {
    let stage_id = stage.stage_id;
    match message {
        StageMessage::Usage {
            channels,
            ops,
            latency,
            ..
        } => {
            let mut stages = local.lock_stages();
            if let Some(entry) = stages.get_mut(&stage_id) {
                let mounts = entry.info.mountpoints.clone();
                let clamped = entry.usage.record(Instant::now(), &mounts, &channels, &ops);
                entry.usage.record_latency(&mounts, &latency);
                for (resource, reported, allowed) in clamped {
                    if OVER_REPORTS.record(&entry.info.job_id, reported, allowed) {
                        limited_warn!(
                            PEER_LOG,
                            stage_id,
                            pid = entry.info.pid,
                            "stage reported {reported} tokens of {resource}, more than its rules admit; counted {allowed}"
                        );
                    }
                }
            }
        }
        StageMessage::Applied {
            seq,
            error: Some(error),
        } => {
            limited_warn!(
                PEER_LOG,
                stage_id,
                seq,
                "stage refused rules: {}",
                control::short(&error)
            )
        }
        StageMessage::Applied { .. } => {}
        StageMessage::Place { id, mount, stripes } if stage.may_place() => {
            local.relay_placement(stage_id, stage.uid, id, mount, stripes)
        }
        StageMessage::Place { id, .. } => local.placed(stage_id, id, Vec::new()),
        StageMessage::FileSize { mount, bytes } => {
            let uid_rate = &*stage.uid_size_rate;
            if let Err(why) =
                local.relay_file_size(stage_id, &mut stage.size_rate, uid_rate, mount, bytes)
            {
                limited_warn!(PEER_LOG, stage_id, "dropped a file size: {why}")
            }
        }
        StageMessage::Hello { .. } => {
            limited_warn!(PEER_LOG, stage_id, "ignored a second hello")
        }
    }
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
