//! The stream to the global controller (the leader, of several: see
//! `crate::standby::follow`): registering and announcing every stage, following its
//! messages, pushing usage on its schedule, relaying placement requests, and
//! re-establishing it with backoff when it breaks.

use super::report::{report_usage, ReportClock};
use super::{rules, Local};
use crate::proto::{
    self, global_client::GlobalClient, global_message, local_message, GlobalMessage, LocalMessage,
};
use crate::standby::follow::{reconnecting, Globals, Verdict};
use std::ops::ControlFlow;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};
use tracing::{debug, info, warn};

/// Keeps one stream to the global controller, re-establishing it with backoff.
pub(super) async fn upstream_loop(local: Arc<Local>, globals: Globals) {
    reconnecting(globals, |mut globals, channel| {
        let local = local.clone();
        async move {
            let (attached, wrapped) = attach(&local, &mut globals, channel).await;
            (globals, attached, wrapped)
        }
    })
    .await;
}

/// One stream on `channel`, until it ends. Returns whether the global controller took
/// it, and whether the list of globals wrapped in moving on.
async fn attach(local: &Local, globals: &mut Globals, channel: Channel) -> (bool, bool) {
    let (sender, receiver) = mpsc::unbounded_channel::<LocalMessage>();
    let _ = sender.send(LocalMessage {
        body: Some(local_message::Body::Register(proto::Register {
            node: local.options.node.clone(),
            version: proto::VERSION,
        })),
    });
    {
        // Announce every stage and start forwarding joins/leaves atomically, so none is
        // missed or announced twice.
        let stages = local.lock_stages();
        for entry in stages.values() {
            let _ = sender.send(LocalMessage {
                body: Some(local_message::Body::StageJoined(proto::StageJoined {
                    stage: Some(entry.info.clone()),
                    announced: true,
                })),
            });
        }
        *local.lock_upstream() = Some(sender.clone());
    }
    let mut client = GlobalClient::new(channel);
    let outcome = match client.attach(UnboundedReceiverStream::new(receiver)).await {
        Ok(response) => {
            info!(global = %globals.url(), "attached to the global controller");
            let ended = follow(local, globals, response.into_inner(), &sender).await;
            warn!(
                global = %globals.url(),
                "lost the global controller; stages keep their last rules"
            );
            // A deposed leader is not a stream taken: reconnecting backs off as from
            // a refusal, or a local that reaches only it would retry every few ms.
            (ended == Ended::Lost, globals.move_on())
        }
        Err(status) => {
            warn!(
                global = %globals.url(),
                "the global controller refused the stream: {}",
                status.message()
            );
            (false, globals.refused(&status))
        }
    };
    *local.lock_upstream() = None;
    local.placements.clear();
    outcome
}

/// What one stream keeps.
#[derive(Default)]
struct Session {
    clock: ReportClock,
    /// The resource table of this stream's `Registered`.
    resources: Vec<Option<rules::TableResource>>,
    /// The latest `Enforce` applied, acknowledged in the next report.
    applied: u64,
}

/// How a stream ended.
#[derive(Debug, PartialEq)]
enum Ended {
    /// It broke or the global controller closed it.
    Lost,
    /// It was left: the global controller was deposed.
    Left,
}

/// Follows the global controller's messages and pushes usage on its schedule until the
/// stream ends or is left.
async fn follow(
    local: &Local,
    globals: &mut Globals,
    mut inbound: Streaming<GlobalMessage>,
    upstream: &mpsc::UnboundedSender<LocalMessage>,
) -> Ended {
    let mut session = Session::default();
    loop {
        tokio::select! {
            message = inbound.message() => {
                if let ControlFlow::Break(ended) = received(local, globals, &mut session, message) {
                    return ended;
                }
            }
            cycle = session.clock.next() => report_usage(local, upstream, cycle, session.applied, &session.resources),
        }
    }
}

/// Handles what the stream delivered; `Break` when the stream is over or to be left.
fn received(
    local: &Local,
    globals: &mut Globals,
    session: &mut Session,
    message: Result<Option<GlobalMessage>, Status>,
) -> ControlFlow<Ended> {
    let message = match message {
        Ok(Some(message)) => message,
        Ok(None) => return ControlFlow::Break(Ended::Lost),
        Err(status) => {
            debug!("global stream error: {status}");
            return ControlFlow::Break(Ended::Lost);
        }
    };
    match globals.check(&message) {
        Verdict::Follow => handle_global(local, session, message),
        Verdict::Ignore(why) => warn!("an Enforce was not applied: {why}"),
        Verdict::Leave(why) => {
            warn!("left the global controller: {why}");
            return ControlFlow::Break(Ended::Left);
        }
    }
    ControlFlow::Continue(())
}

/// Handles a message from the global controller. An `Enforce` is acknowledged in the
/// next usage report (`applied`: the latest one's cycle).
fn handle_global(local: &Local, session: &mut Session, message: GlobalMessage) {
    match message.body {
        Some(global_message::Body::Schedule(schedule)) => session.clock.schedule(&schedule),
        Some(global_message::Body::Enforce(proto::Enforce {
            cycle,
            stages: plans,
            ..
        })) => {
            rules::enforce(local, cycle, plans, &session.resources);
            session.applied = session.applied.max(cycle);
        }
        Some(global_message::Body::Registered(registered)) => {
            debug!(
                interval_ms = registered.interval_ms,
                resources = registered.resources.len(),
                "registered with the global controller"
            );
            local.learn_resources(&registered.resources);
            session.resources = rules::resource_table(registered.resources);
        }
        Some(global_message::Body::PlaceReply(reply)) => {
            if let Some((stage_id, id)) = local.placements.answered(reply.request) {
                local.placed(stage_id, id, reply.targets);
            }
        }
        None => warn!("empty message from the global controller"),
    }
}

impl Local {
    /// Sends `body` on the stream to the global controller, if there is one.
    pub(super) fn send_upstream(&self, body: local_message::Body) {
        if let Some(upstream) = self.lock_upstream().as_ref() {
            let _ = upstream.send(LocalMessage { body: Some(body) });
        }
    }
}
