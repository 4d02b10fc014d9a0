//! A relay's stream (`Relay`): the `Attach` streams of the nodes attached to a relay
//! (`crate::relay`), many to a message each way. Each node inside is registered,
//! scheduled, sent rules and detached as a node of its own stream is; only its
//! messages travel together, and its report slot is its relay's, so that the relay
//! receives its nodes' reports together and passes them on in one message.

use super::admit::{register_name, GRPC_LOG};
use super::node::{NodeHandle, Outbox, Outgoing, RelayOutbox};
use super::Controller;
use crate::outbox;
use crate::proto::{self, global_message, RelayDown, RelayUp, Uplink};
use padll_wire::sync::lock;
use prost::Message;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio_stream::Stream;
use tonic::Status;

/// Nodes one relay stream may carry at once; a further `Register` is refused.
pub const MAX_LINKS: usize = 4096;

/// Messages a relay's queue holds at most: a few per node it carries (a cycle queues
/// up to a `Schedule` and an `Enforce` each).
const MAX_QUEUED: usize = 4 * MAX_LINKS;

/// The size a `RelayDown` is kept under (a single larger message goes alone): well
/// within the 4 MiB a gRPC client decodes by default.
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// A node attached through the relay, by its link.
struct Link {
    name: Box<str>,
    stream: NodeHandle,
}

/// The nodes a relay stream carries, by link.
type Links = Arc<Mutex<HashMap<u32, Link>>>;

/// One relay stream's side in the controller.
pub(crate) struct RelayStream {
    outbox: Arc<RelayOutbox>,
    links: Links,
}

impl Controller {
    /// Opens a relay stream: its queue (a session of its own for its nodes' report
    /// slots) and the stream of its messages, many to a `RelayDown`.
    pub(crate) fn open_relay(self: &Arc<Self>) -> (RelayStream, Downlinks) {
        let session = {
            let mut state = self.lock();
            state.next_session += 1;
            state.next_session - 1
        };
        let (queue, receiver) = outbox::bounded(MAX_QUEUED);
        let links = Links::default();
        let relay = RelayStream {
            outbox: Arc::new(RelayOutbox { session, queue }),
            links: links.clone(),
        };
        let downlinks = Downlinks {
            receiver,
            carried: None,
            controller: self.clone(),
            links,
        };
        (relay, downlinks)
    }

    /// What a message of a relay's stream does, link by link: registers a link's node
    /// (its first message), passes a message to its node, or detaches the node (its
    /// stream ended).
    pub(crate) fn relayed(&self, relay: &RelayStream, up: RelayUp) {
        let mut links = lock(&relay.links);
        for Uplink { link, message } in up.links {
            match (links.get(&link), message) {
                (Some(node), Some(message)) => self.handle(&node.name, node.stream, message),
                (Some(_), None) => {
                    if let Some(node) = links.remove(&link) {
                        self.detach_node(&node.name, node.stream);
                    }
                }
                (None, None) => {}
                (None, Some(first)) => {
                    let attached = if links.len() >= MAX_LINKS {
                        Err(Status::resource_exhausted(format!(
                            "the relay carries {MAX_LINKS} nodes already"
                        )))
                    } else {
                        self.attach_relayed(relay, link, first)
                    };
                    match attached {
                        Ok(node) => {
                            links.insert(link, node);
                        }
                        Err(status) => {
                            let _ = relay.outbox.queue.send((link, Err(status)));
                        }
                    }
                }
            }
        }
    }

    fn attach_relayed(
        &self,
        relay: &RelayStream,
        link: u32,
        first: proto::LocalMessage,
    ) -> Result<Link, Status> {
        let name = register_name(Some(first))?;
        self.leadership().admit()?;
        let outbox = Outbox::Relayed {
            link,
            relay: relay.outbox.clone(),
        };
        let stream = self.attach_node(&name, "a relay", outbox)?;
        Ok(Link {
            name: name.into(),
            stream,
        })
    }

    /// Detaches every node of a relay stream that ended.
    pub(crate) fn close_relay(&self, relay: RelayStream) {
        let links = std::mem::take(&mut *lock(&relay.links));
        if !links.is_empty() {
            crate::limited_warn!(
                GRPC_LOG,
                nodes = links.len(),
                "a relay's stream ended; the local controllers attached through it detach"
            );
        }
        for node in links.into_values() {
            self.detach_node(&node.name, node.stream);
        }
    }
}

impl Controller {
    /// Feeds a relay stream's messages through what `Relay` does with them (each
    /// link's register check, attach, messages and detach, then the stream's end),
    /// without a network: for the fuzz targets (`fuzz/`).
    #[doc(hidden)]
    pub fn feed_relay(self: &Arc<Self>, batches: impl IntoIterator<Item = RelayUp>) {
        let (relay, downlinks) = self.open_relay();
        for up in batches {
            self.relayed(&relay, up);
        }
        self.close_relay(relay);
        drop(downlinks);
    }
}

/// A relay stream's messages, each `RelayDown` carrying every message queued when it
/// is sent (up to [`MAX_BATCH_BYTES`]), stamped as `Attach` stamps them: with the
/// leader's term, a `Schedule` with its wait counted from now.
pub struct Downlinks {
    receiver: outbox::Receiver<(u32, Outgoing)>,
    /// A downlink that did not fit the last `RelayDown`: the next one's first.
    carried: Option<proto::Downlink>,
    controller: Arc<Controller>,
    links: Links,
}

impl Downlinks {
    /// `message` for `link` as it leaves, or nothing (a follower sends no rules).
    fn stamped(&self, link: u32, message: Outgoing) -> Option<proto::Downlink> {
        match message {
            Ok(mut message) => {
                if let Some(global_message::Body::Schedule(schedule)) = &mut message.body {
                    let stream = lock(&self.links).get(&link).map(|node| node.stream);
                    if let Some(stream) = stream {
                        self.controller.as_sent(stream, schedule);
                    }
                }
                let message = self.controller.leadership().stamp(message)?;
                Some(proto::Downlink {
                    link,
                    message: Some(message),
                    ..Default::default()
                })
            }
            Err(status) => Some(proto::Downlink {
                link,
                message: None,
                code: status.code() as i32,
                reason: status.message().to_string(),
            }),
        }
    }
}

impl Stream for Downlinks {
    type Item = Result<RelayDown, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut links = Vec::new();
        let mut bytes = 0;
        let mut ended = false;
        if let Some(carried) = self.carried.take() {
            bytes += carried.encoded_len();
            links.push(carried);
        }
        loop {
            let (link, message) = match Pin::new(&mut self.receiver).poll_next(cx) {
                Poll::Ready(Some(item)) => item,
                Poll::Ready(None) => {
                    ended = true;
                    break;
                }
                Poll::Pending => break,
            };
            let Some(downlink) = self.stamped(link, message) else {
                continue;
            };
            let size = downlink.encoded_len();
            if !links.is_empty() && bytes + size > MAX_BATCH_BYTES {
                self.carried = Some(downlink);
                cx.waker().wake_by_ref();
                break;
            }
            bytes += size;
            links.push(downlink);
        }
        if links.is_empty() {
            return if ended {
                Poll::Ready(None)
            } else {
                Poll::Pending
            };
        }
        Poll::Ready(Some(Ok(RelayDown { links })))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::controller;
    use super::*;
    use crate::proto::{local_message, LocalMessage};
    use tonic::Code;

    fn register(node: &str) -> LocalMessage {
        LocalMessage {
            body: Some(local_message::Body::Register(proto::Register {
                node: node.into(),
                version: proto::VERSION,
            })),
        }
    }

    fn up(links: Vec<(u32, Option<LocalMessage>)>) -> RelayUp {
        RelayUp {
            links: links
                .into_iter()
                .map(|(link, message)| Uplink { link, message })
                .collect(),
        }
    }

    /// Every `RelayDown` ready now.
    fn ready(downlinks: &mut Downlinks) -> Vec<RelayDown> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(down)) = Pin::new(&mut *downlinks).poll_next(&mut cx) {
            out.push(down.unwrap());
        }
        out
    }

    fn attached(controller: &Controller) -> Vec<(String, bool)> {
        let snapshot = controller.snapshot();
        snapshot
            .nodes
            .iter()
            .map(|n| (n.node.clone(), n.attached))
            .collect()
    }

    #[tokio::test]
    async fn a_relays_nodes_are_registered_in_one_report_slot_and_detached_with_it() {
        let controller = controller();
        let (relay, mut downlinks) = controller.open_relay();
        controller.relayed(
            &relay,
            up(vec![(7, Some(register("n1"))), (9, Some(register("n2")))]),
        );
        let downs = ready(&mut downlinks);
        assert_eq!(downs.len(), 1, "one RelayDown for both: {downs:?}");
        let mut schedules = HashMap::new();
        for downlink in &downs[0].links {
            let body = downlink.message.as_ref().and_then(|m| m.body.as_ref());
            match body {
                Some(global_message::Body::Registered(_)) => {}
                Some(global_message::Body::Schedule(schedule)) => {
                    schedules.insert(downlink.link, schedule.report_in_ms);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        // Both report in the relay's slot (the same wait, as both were sent at once).
        assert_eq!(schedules.len(), 2, "{downs:?}");
        assert_eq!(schedules[&7], schedules[&9], "{schedules:?}");
        // And again when the slots are spread anew, and when they are re-scheduled.
        for respread in [true, false] {
            {
                let mut state = controller.lock();
                let now = tokio::time::Instant::now();
                if respread {
                    state.spread = std::time::Duration::from_millis(1);
                    super::super::schedule::adapt_spread(&mut state, now);
                } else {
                    let tick = now + std::time::Duration::from_secs(1);
                    super::super::schedule::reschedule_off_slot(&mut state, 2, tick, now);
                }
            }
            let waits: Vec<_> = ready(&mut downlinks)
                .iter()
                .flat_map(|down| &down.links)
                .filter_map(|d| match d.message.as_ref()?.body.as_ref()? {
                    global_message::Body::Schedule(s) => Some(s.report_in_ms),
                    _ => None,
                })
                .collect();
            assert_eq!(waits.len(), 2, "re-spread {respread}: {waits:?}");
            assert_eq!(waits[0], waits[1], "re-spread {respread}: {waits:?}");
        }
        assert_eq!(
            attached(&controller),
            [("n1".into(), true), ("n2".into(), true)]
        );

        // A link's stream ends: its node detaches, the other stays.
        controller.relayed(&relay, up(vec![(7, None)]));
        assert_eq!(
            attached(&controller),
            [("n1".into(), false), ("n2".into(), true)]
        );
        // The relay's stream ends: every node it carried detaches.
        controller.close_relay(relay);
        assert_eq!(
            attached(&controller),
            [("n1".into(), false), ("n2".into(), false)]
        );
    }

    #[tokio::test]
    async fn a_link_that_does_not_register_first_is_ended_with_the_reason() {
        let controller = controller();
        let (relay, mut downlinks) = controller.open_relay();
        let usage = LocalMessage {
            body: Some(local_message::Body::Usage(proto::Usage::default())),
        };
        let old = LocalMessage {
            body: Some(local_message::Body::Register(proto::Register {
                node: "n1".into(),
                version: proto::VERSION - 1,
            })),
        };
        controller.relayed(
            &relay,
            up(vec![(1, Some(usage)), (2, Some(old)), (3, None)]),
        );
        let downs = ready(&mut downlinks);
        let ended: Vec<_> = downs
            .iter()
            .flat_map(|down| &down.links)
            .map(|d| (d.link, d.message.is_none(), Code::from(d.code)))
            .collect();
        assert_eq!(
            ended,
            [
                (1, true, Code::InvalidArgument),
                (2, true, Code::InvalidArgument)
            ]
        );
        assert!(attached(&controller).is_empty());
    }

    #[tokio::test]
    async fn a_relay_down_stays_under_its_size_but_carries_a_larger_message_alone() {
        let controller = controller();
        let (relay, mut downlinks) = controller.open_relay();
        let big = "x".repeat(MAX_BATCH_BYTES / 3);
        for link in 0..4 {
            let status = Err(Status::invalid_argument(big.clone()));
            relay.outbox.queue.send((link, status)).unwrap();
        }
        let huge = Err(Status::invalid_argument("y".repeat(2 * MAX_BATCH_BYTES)));
        relay.outbox.queue.send((4, huge)).unwrap();
        let sizes: Vec<_> = ready(&mut downlinks)
            .iter()
            .map(|down| (down.links.len(), down.encoded_len()))
            .collect();
        assert_eq!(sizes.len(), 3, "{sizes:?}");
        assert_eq!(sizes[0].0, 2);
        assert_eq!(sizes[1].0, 2);
        assert_eq!(sizes[2].0, 1);
        assert!(sizes[..2]
            .iter()
            .all(|&(_, bytes)| bytes <= MAX_BATCH_BYTES));
    }
}
