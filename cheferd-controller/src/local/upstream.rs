//! The stream to the global controller (the leader, of several: see
//! `crate::standby::follow`): registering and announcing every stage, following its
//! messages, pushing usage on its schedule, relaying placement requests, and
//! re-establishing it with backoff when it breaks, or when the global controller stops
//! reading it (its queue is bounded: [`super::upstream_queue`]). Advice (placement
//! requests, file sizes) never costs the node its stream: past its room in the queue it
//! is dropped, counted.

use super::report::{usage_report, ReportClock};
use super::upstream_queue;
use super::{rules, Local, PEER_LOG};
use crate::limited_warn;
use crate::outbox;
use crate::proto::{
    self, global_client::GlobalClient, global_message, local_message, GlobalMessage, LocalMessage,
};
use crate::standby::follow::{reconnecting, Globals, Verdict};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};
use tracing::{debug, error, info, warn};

/// Messages queued to the global controller at most, beyond one per stage the local
/// controller may hold (`--max-connections`: each stage is announced as the stream
/// starts): joins, leaves, reports and placement requests it has not read yet. A global
/// controller that stops reading (frozen; until the pings give up, see
/// [`Globals::new`]) would otherwise make the local controller keep every message its
/// stages cause (in bytes too: [`upstream_queue`]). Advice takes at most
/// [`upstream_queue::MAX_ADVISORY`] of it and is dropped past that, so it never fills it.
/// Past it the stream is given up and opened again, and the new one
/// announces the stages alive then: those that left meanwhile, their `StageLeft` not
/// queued, are not announced, so the global controller releases them as orphans.
const MAX_QUEUED: usize = outbox::MAX_QUEUED;

/// The queue to one stream to the global controller.
pub(super) struct Upstream {
    queue: upstream_queue::Sender,
    /// Notified when a message could not be queued: the stream is given up.
    refused: Notify,
    /// Advisory messages dropped for want of room.
    dropped: AtomicU64,
}

impl Upstream {
    /// Queues essential `body`; returns whether it was (if not, the stream is given
    /// up).
    pub(super) fn send(&self, body: local_message::Body) -> bool {
        let queued = self.queue.send(LocalMessage { body: Some(body) }).is_ok();
        if !queued {
            self.refused.notify_one();
        }
        queued
    }

    /// Queues advisory `body` (a placement request, a file size) if advice has room;
    /// returns whether it was. Never gives the stream up.
    pub(super) fn offer(&self, body: local_message::Body) -> bool {
        let what = match &body {
            local_message::Body::PlaceRequest(_) => "placement request",
            _ => "file size",
        };
        let queued = self.queue.offer(LocalMessage { body: Some(body) });
        if !queued {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            limited_warn!(
                PEER_LOG,
                dropped,
                "dropped a {what} for the global controller: {} advisory messages or {} \
                 bytes of them are queued to it, unread",
                upstream_queue::MAX_ADVISORY,
                upstream_queue::MAX_ADVISORY_BYTES
            );
        }
        queued
    }
}

/// The first wait before attaching again once the global controller replaced this
/// node's stream by another attachment of the node (see [`Replacements`]).
const FIRST_REPLACED_BACKOFF: Duration = Duration::from_secs(1);
/// The longest such wait.
const MAX_REPLACED_BACKOFF: Duration = Duration::from_secs(30);
/// A stream that lived this long (longer than [`MAX_REPLACED_BACKOFF`], so that two
/// local controllers of one node taking turns never do) forgives earlier replacements.
const LIVED_LONG: Duration = Duration::from_secs(60);

/// How long to wait before attaching again after the global controller replaced this
/// node's stream ([`crate::global::REPLACED`]): another local controller runs as this
/// node (the same certificate), and each attaching knocked the other off, every 100 ms
/// for good. Doubles from [`FIRST_REPLACED_BACKOFF`] to [`MAX_REPLACED_BACKOFF`]. A
/// local controller that restarts is not concerned: its old stream is gone, its new
/// one attaches at once.
#[derive(Default)]
struct Replacements {
    backoff: Duration,
}

impl Replacements {
    /// The wait after a stream that lived `lived` ended, `replaced` or not.
    fn after(&mut self, replaced: bool, lived: Duration) -> Duration {
        if lived >= LIVED_LONG {
            self.backoff = Duration::ZERO;
        }
        if !replaced {
            return Duration::ZERO;
        }
        self.backoff = (self.backoff * 2).clamp(FIRST_REPLACED_BACKOFF, MAX_REPLACED_BACKOFF);
        self.backoff
    }
}

/// Keeps one stream to the global controller, re-establishing it with backoff.
pub(super) async fn upstream_loop(local: Arc<Local>, globals: Globals) {
    let replacements = Mutex::new(Replacements::default());
    reconnecting(globals, |mut globals, channel| {
        let local = local.clone();
        let replacements = &replacements;
        async move {
            let (attached, wrapped) = attach(&local, &mut globals, channel, replacements).await;
            (globals, attached, wrapped)
        }
    })
    .await;
}

/// One stream on `channel`, until it ends (and the wait [`Replacements`] says after
/// it). Returns whether the global controller took it, and whether the list of globals
/// wrapped in moving on.
async fn attach(
    local: &Local,
    globals: &mut Globals,
    channel: Channel,
    replacements: &Mutex<Replacements>,
) -> (bool, bool) {
    let capacity = local.options.limits.max_connections + MAX_QUEUED;
    let (queue, receiver) = upstream_queue::bounded(capacity);
    let upstream = Arc::new(Upstream {
        queue,
        refused: Notify::new(),
        dropped: AtomicU64::new(0),
    });
    upstream.send(local_message::Body::Register(proto::Register {
        node: local.options.node.clone(),
        version: proto::VERSION,
    }));
    {
        // Announce every stage and start forwarding joins/leaves atomically, so none is
        // missed or announced twice.
        let stages = local.lock_stages();
        for entry in stages.values() {
            upstream.send(local_message::Body::StageJoined(proto::StageJoined {
                stage: Some(entry.info.clone()),
                announced: true,
            }));
        }
        *local.lock_upstream() = Some(upstream.clone());
    }
    let mut client = GlobalClient::new(channel);
    let mut wait = Duration::ZERO;
    let outcome = match client.attach(receiver).await {
        Ok(response) => {
            info!(global = %globals.url(), "attached to the global controller");
            let attached = Instant::now();
            let ended = follow(local, globals, response.into_inner(), &upstream).await;
            wait = padll_wire::sync::lock(replacements)
                .after(matches!(ended, Ended::Replaced(_)), attached.elapsed());
            match &ended {
                Ended::Replaced(why) => error!(
                    global = %globals.url(),
                    "the global controller ended this node's stream: {why}; is another \
                     local controller running as node {}? Attaching again in {wait:?}; \
                     stages keep their last rules",
                    padll_wire::quote(&local.options.node)
                ),
                Ended::Unread => warn!(
                    global = %globals.url(),
                    "lost the global controller: it did not read the {capacity} messages \
                     queued to it; stages keep their last rules"
                ),
                Ended::Lost | Ended::Left => warn!(
                    global = %globals.url(),
                    "lost the global controller; stages keep their last rules"
                ),
            }
            // A deposed leader is not a stream taken: reconnecting backs off as from
            // a refusal, or a local that reaches only it would retry every few ms.
            (ended != Ended::Left, globals.move_on())
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
    tokio::time::sleep(wait).await;
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
    /// It was given up: its queue was full.
    Unread,
    /// The global controller replaced it by another attachment of this node (the
    /// status's message says from where).
    Replaced(String),
}

/// Follows the global controller's messages and pushes usage on its schedule until the
/// stream ends or is left.
async fn follow(
    local: &Local,
    globals: &mut Globals,
    mut inbound: Streaming<GlobalMessage>,
    upstream: &Upstream,
) -> Ended {
    let mut session = Session::default();
    loop {
        tokio::select! {
            message = inbound.message() => {
                if let ControlFlow::Break(ended) = received(local, globals, &mut session, message) {
                    return ended;
                }
            }
            cycle = session.clock.next() => {
                let usage = usage_report(local, cycle, session.applied, &session.resources);
                upstream.send(local_message::Body::Usage(usage));
            }
            () = upstream.refused.notified() => return Ended::Unread,
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
        Err(status)
            if status.code() == Code::Aborted
                && status.message().starts_with(crate::global::REPLACED) =>
        {
            let why = padll_wire::control::short(status.message());
            return ControlFlow::Break(Ended::Replaced(why));
        }
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
    /// Sends `body` on the stream to the global controller, if there is one; none is
    /// once its queue is full, until the stream is opened again.
    pub(super) fn send_upstream(&self, body: local_message::Body) {
        let mut upstream = self.lock_upstream();
        if upstream.as_ref().is_some_and(|to| !to.send(body)) {
            *upstream = None;
        }
    }

    /// Offers advisory `body` to the stream to the global controller, if there is one;
    /// returns whether it was queued (never giving the stream up).
    pub(super) fn offer_upstream(&self, body: local_message::Body) -> bool {
        let upstream = self.lock_upstream().clone();
        upstream.is_some_and(|to| to.offer(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::{DefaultLimit, LocalLimits, LocalOptions};
    use crate::proto::{global_server, RelayDown, RelayUp, StandingReply, StandingRequest};
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio_stream::Stream;
    use tonic::{Request, Response};

    type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

    /// A stream's first message, and the stream.
    type Taken = (LocalMessage, Streaming<LocalMessage>);

    /// A global controller that takes each stream, reads its first message, and never
    /// reads the rest (nor answers).
    #[derive(Clone, Default)]
    struct Unread {
        streams: Arc<Mutex<Vec<Taken>>>,
    }

    #[tonic::async_trait]
    impl global_server::Global for Unread {
        type AttachStream = Boxed<GlobalMessage>;
        type RelayStream = Boxed<RelayDown>;

        async fn attach(
            &self,
            request: Request<Streaming<LocalMessage>>,
        ) -> Result<Response<Self::AttachStream>, Status> {
            let mut inbound = request.into_inner();
            let first = inbound.message().await?.expect("a first message");
            self.streams.lock().unwrap().push((first, inbound));
            Ok(Response::new(Box::pin(tokio_stream::pending())))
        }

        async fn relay(
            &self,
            _: Request<Streaming<RelayUp>>,
        ) -> Result<Response<Self::RelayStream>, Status> {
            Err(Status::unimplemented("relay"))
        }

        async fn standing(
            &self,
            _: Request<StandingRequest>,
        ) -> Result<Response<StandingReply>, Status> {
            Err(Status::unimplemented("standing"))
        }
    }

    /// A global controller that replaces every stream at once by another attachment of
    /// its node, as it does when two local controllers run as one node; it records when
    /// each stream came.
    #[derive(Clone, Default)]
    struct Replacing {
        attached: Arc<Mutex<Vec<std::time::Instant>>>,
    }

    #[tonic::async_trait]
    impl global_server::Global for Replacing {
        type AttachStream = Boxed<GlobalMessage>;
        type RelayStream = Boxed<RelayDown>;

        async fn attach(
            &self,
            request: Request<Streaming<LocalMessage>>,
        ) -> Result<Response<Self::AttachStream>, Status> {
            self.attached
                .lock()
                .unwrap()
                .push(std::time::Instant::now());
            let schedule = GlobalMessage {
                body: Some(global_message::Body::Schedule(proto::Schedule {
                    cycle: 1,
                    report_in_ms: 1000,
                    interval_ms: 1000,
                })),
            };
            let replaced = Status::aborted(format!(
                "{} for node 'n1' from 127.0.0.1:9",
                crate::global::REPLACED
            ));
            drop(request);
            Ok(Response::new(Box::pin(tokio_stream::iter([
                Ok(schedule),
                Err(replaced),
            ]))))
        }

        async fn relay(
            &self,
            _: Request<Streaming<RelayUp>>,
        ) -> Result<Response<Self::RelayStream>, Status> {
            Err(Status::unimplemented("relay"))
        }

        async fn standing(
            &self,
            _: Request<StandingRequest>,
        ) -> Result<Response<StandingReply>, Status> {
            Err(Status::unimplemented("standing"))
        }
    }

    fn local(url: &str) -> Arc<Local> {
        let options = LocalOptions {
            node: "n1".into(),
            socket: "/nonexistent".into(),
            global: url.into(),
            tls: None,
            report_interval: Duration::from_secs(1),
            limits: LocalLimits::default(),
            default_limit: DefaultLimit::Off,
        };
        let directories = crate::local::user_files::UserDirectories::disabled();
        Arc::new(Local::new(options, directories))
    }

    /// Two local controllers running as one node knocked each other off every 100 ms
    /// for good: one whose stream the global controller replaced backs off, 1 s
    /// doubling to 30 s, until a stream lives a minute; any other loss costs no wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_local_whose_stream_is_replaced_backs_off_ever_longer() {
        let mut replacements = Replacements::default();
        let short = Duration::from_millis(100);
        let waits: Vec<_> = (0..7).map(|_| replacements.after(true, short)).collect();
        let secs = Duration::from_secs;
        assert_eq!(
            waits,
            [
                secs(1),
                secs(2),
                secs(4),
                secs(8),
                secs(16),
                secs(30),
                secs(30)
            ]
        );
        assert_eq!(replacements.after(false, short), Duration::ZERO);
        assert_eq!(replacements.after(true, LIVED_LONG), secs(1));

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let global = Replacing::default();
        let server = tonic::transport::Server::builder()
            .add_service(global_server::GlobalServer::new(global.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        let server = tokio::spawn(server);
        let upstream = tokio::spawn(upstream_loop(
            local(&url),
            Globals::new(&url, None).unwrap(),
        ));
        let attached = || global.attached.lock().unwrap().clone();
        within("three streams", || attached().len() == 3).await;
        let at = attached();
        assert!(at[1] - at[0] >= secs(1), "{:?}", at[1] - at[0]);
        assert!(at[2] - at[1] >= secs(2), "{:?}", at[2] - at[1]);
        upstream.abort();
        server.abort();
    }

    /// Waits (30 s at most) until `done`.
    async fn within(what: &str, done: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(30), "no {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A global controller that takes the stream and stops reading it (pings still
    /// answered): the local controller's queue fills to its bound, not memory's, and it
    /// gives the stream up and registers again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_global_that_reads_nothing_is_left_once_the_queue_is_full() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let global = Unread::default();
        // HTTP/2's smallest windows: a few thousand messages fill them.
        let server = tonic::transport::Server::builder()
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(65_535)
            .add_service(global_server::GlobalServer::new(global.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        let server = tokio::spawn(server);
        let local = local(&url);
        let upstream = tokio::spawn(upstream_loop(
            local.clone(),
            Globals::new(&url, None).unwrap(),
        ));
        let streams = || global.streams.lock().unwrap().len();
        within("the first stream", || streams() == 1).await;

        // Leaves of stages the global never heard of, as fast as the local takes them,
        // until it gives the stream up: the windows, then the queue, fill.
        let bound = LocalLimits::default().max_connections + MAX_QUEUED;
        let mut sent = 0;
        while local.lock_upstream().is_some() {
            assert!(
                sent < 10 * bound,
                "{sent} messages queued to a global controller that reads none"
            );
            for _ in 0..1000 {
                local.send_upstream(local_message::Body::StageLeft(proto::StageLeft {
                    stage_id: sent as u64,
                }));
                sent += 1;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        within("a new stream", || streams() == 2).await;
        let first = global.streams.lock().unwrap()[1].0.clone();
        assert!(
            matches!(&first.body, Some(local_message::Body::Register(r)) if r.node == "n1"),
            "{first:?}"
        );
        upstream.abort();
        server.abort();
    }
}
