//! The relay's stream to the global controller (the leader, of several): every local
//! controller's messages gathered into `RelayUp`s, the global controller's handed to
//! each; re-established with backoff when it breaks.

use super::Relay;
use crate::outbox;
use crate::proto::{global_client::GlobalClient, RelayDown, RelayUp, Uplink};
use crate::standby::follow::{reconnecting, Globals};
use padll_wire::sync::lock;
use prost::Message;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tracing::{info, warn};

/// How long a `RelayUp` waits, from its first message, for more: the reports of a
/// relay's nodes are due at the same moment (their slot is the relay's) and arrive
/// within a few milliseconds, so that they go on together.
pub const GATHER: Duration = Duration::from_millis(2);

/// Messages queued to the global controller at most (a few per local controller).
const MAX_QUEUED: usize = 4 * super::MAX_LINKS;

/// The largest `RelayDown` taken from the global controller (which keeps them under
/// 1 MiB, or one message).
const MAX_DOWN_BYTES: usize = 8 << 20;

/// Keeps one stream to the global controller, re-establishing it with backoff.
pub(super) async fn keep(relay: Arc<Relay>, globals: Globals) -> Infallible {
    reconnecting(globals, |mut globals, channel| {
        let relay = relay.clone();
        async move {
            let (taken, wrapped) = stream(&relay, &mut globals, channel).await;
            (globals, taken, wrapped)
        }
    })
    .await
}

/// One stream on `channel`, until it ends. Returns whether the global controller took
/// it, and whether the list of globals wrapped in moving on.
async fn stream(relay: &Relay, globals: &mut Globals, channel: Channel) -> (bool, bool) {
    let (queue, receiver) = outbox::bounded(MAX_QUEUED);
    let mut client = GlobalClient::new(channel).max_decoding_message_size(MAX_DOWN_BYTES);
    let mut inbound = match client.relay(Gathered::new(receiver)).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            warn!(
                global = %globals.url(),
                "the global controller refused the relay's stream: {}",
                status.message()
            );
            return (false, globals.refused(&status));
        }
    };
    info!(global = %globals.url(), "relaying to the global controller");
    lock(&relay.state).upstream = Some(Arc::new(queue));
    while let Ok(Some(down)) = inbound.message().await {
        relay.deliver(down);
    }
    warn!(
        global = %globals.url(),
        "lost the global controller; the local controllers attached here re-attach"
    );
    relay.lose_upstream();
    (true, globals.move_on())
}

impl Relay {
    /// Hands each message of `down` to its local controller's stream (or ends that
    /// stream with the global controller's status).
    fn deliver(&self, down: RelayDown) {
        let received = Instant::now();
        let mut links = lock(&self.state);
        for downlink in down.links {
            let Some(queue) = links.downstream.get(&downlink.link) else {
                continue;
            };
            match downlink.message {
                Some(message) => {
                    let _ = queue.send((received, Ok(message)));
                }
                None => {
                    let status = Status::new(Code::from(downlink.code), downlink.reason);
                    let _ = queue.send((received, Err(status)));
                    links.downstream.remove(&downlink.link);
                }
            }
        }
    }

    /// Ends every local controller's stream: its stream inside the relay's is gone.
    fn lose_upstream(&self) {
        let mut links = lock(&self.state);
        links.upstream = None;
        let now = Instant::now();
        for (_, queue) in links.downstream.drain() {
            let status = Status::unavailable("the relay lost the global controller");
            let _ = queue.send((now, Err(status)));
        }
    }
}

/// The queued messages as `RelayUp`s: from the first, [`GATHER`] later, every message
/// queued by then (up to [`crate::global::MAX_RELAY_BATCH_BYTES`]).
struct Gathered {
    receiver: outbox::Receiver<Uplink>,
    /// The first message of the next `RelayUp`.
    first: Option<Uplink>,
    /// Until when the next `RelayUp` gathers.
    gathering: Option<Pin<Box<Sleep>>>,
}

impl Gathered {
    fn new(receiver: outbox::Receiver<Uplink>) -> Gathered {
        Gathered {
            receiver,
            first: None,
            gathering: None,
        }
    }
}

impl Stream for Gathered {
    type Item = RelayUp;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RelayUp>> {
        let first = match self.first.take() {
            Some(first) => first,
            None => match ready!(Pin::new(&mut self.receiver).poll_next(cx)) {
                Some(first) => {
                    self.gathering = Some(Box::pin(tokio::time::sleep(GATHER)));
                    first
                }
                None => return Poll::Ready(None),
            },
        };
        if let Some(gathering) = &mut self.gathering {
            if gathering.as_mut().poll(cx).is_pending() {
                self.first = Some(first);
                return Poll::Pending;
            }
            self.gathering = None;
        }
        let mut bytes = first.encoded_len();
        let mut links = vec![first];
        while let Poll::Ready(Some(uplink)) = Pin::new(&mut self.receiver).poll_next(cx) {
            let size = uplink.encoded_len();
            if bytes + size > crate::global::MAX_RELAY_BATCH_BYTES {
                // The next one starts at once: it waited already.
                self.first = Some(uplink);
                cx.waker().wake_by_ref();
                break;
            }
            bytes += size;
            links.push(uplink);
        }
        Poll::Ready(Some(RelayUp { links }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{local_message, LocalMessage, Usage};
    use tokio_stream::StreamExt;

    fn uplink(link: u32, stages: usize) -> Uplink {
        let usage = Usage {
            stages: vec![Default::default(); stages],
            ..Default::default()
        };
        Uplink {
            link,
            message: Some(LocalMessage {
                body: Some(local_message::Body::Usage(usage)),
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn messages_within_the_gathering_time_go_on_together_and_under_the_size() {
        let (queue, receiver) = outbox::bounded(MAX_QUEUED);
        let mut gathered = Gathered::new(receiver);
        queue.send(uplink(1, 1)).unwrap();
        let first = tokio::spawn(async move {
            let up = gathered.next().await;
            (up, gathered)
        });
        tokio::time::sleep(GATHER / 2).await;
        queue.send(uplink(2, 1)).unwrap();
        let (up, mut gathered) = first.await.unwrap();
        let links: Vec<u32> = up.unwrap().links.iter().map(|u| u.link).collect();
        assert_eq!(links, [1, 2]);

        // An empty stage encodes in 2 bytes: three reports of ≈ 0.4 MiB fill two RelayUps.
        let stages = crate::global::MAX_RELAY_BATCH_BYTES / 5;
        for link in 3..6 {
            queue.send(uplink(link, stages)).unwrap();
        }
        let sizes =
            [gathered.next().await, gathered.next().await].map(|up| up.unwrap().links.len());
        assert_eq!(sizes, [2, 1]);
        drop(queue);
        assert!(gathered.next().await.is_none());
    }
}
