//! The queue of one stream to the global controller, bounded in messages and in bytes,
//! with room kept for what the node cannot do without.
//!
//! Two kinds of message go up:
//!
//! - **Essential** ones (`Register`, `StageJoined`, `StageLeft`, `Usage`): the global
//!   controller's picture of the node. One that does not fit means the global controller
//!   does not read the stream: it is given up and opened again ([`Sender::send`] fails).
//! - **Advisory** ones (`FileSizes`, `PlaceRequest`): advice, which a stage does without
//!   (a file is created as usual, a size is one sample of many). They take at most
//!   [`MAX_ADVISORY`] places and [`MAX_ADVISORY_BYTES`], and one that does not fit is
//!   dropped ([`Sender::offer`] returns `false`): a flood of them never costs the node its
//!   stream (they share the queue's places with essential ones, up to their own cap). A size joins a `FileSizes`
//!   of the same stage and mountpoint still unread (up to [`MAX_FILE_SIZES`]).
//!
//! Bytes: a `StageJoined` may be ~257 KiB (64 mountpoints of 4 KiB), so the count alone
//! would let the queue hold gigabytes. Essential messages other than joins are bounded
//! by [`MAX_QUEUED_BYTES`] (a stream past it is given up, as past the count). Joins are
//! bounded by the stages alive instead, so that the stream's first announcement of every
//! stage always fits: a stage's join still unread when it leaves is taken back with its
//! leave (neither goes up: the global controller never heard of the stage on this
//! stream), so the joins queued are at most the stream's announcement (one per stage
//! alive when it started) and one per stage alive now — no more than the stage table
//! itself holds, whatever stages come and go.

use crate::placement_history::MAX_FILE_SIZES;
use crate::proto::{local_message::Body, FileSizes, LocalMessage, StageJoined, StageLeft};
use padll_wire::sync::lock;
use prost::Message;
use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use tokio_stream::Stream;

/// Bytes of essential messages other than stages' joins queued at most.
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// Advisory messages queued at most.
pub const MAX_ADVISORY: usize = 1024;
/// Their bytes at most.
pub const MAX_ADVISORY_BYTES: usize = 4 << 20;

/// One place in the queue: a message and its encoded size, or a join taken back.
struct Slot {
    message: Option<LocalMessage>,
    bytes: usize,
}

struct Queue {
    slots: VecDeque<Slot>,
    /// The sequence number of `slots[0]` (each place has the next).
    first: u64,
    capacity: usize,
    /// Bytes of essential messages other than joins.
    bytes: usize,
    advisory: usize,
    advisory_bytes: usize,
    /// Joins of stages not announced with the stream, unread: stage id → place.
    joins: HashMap<u64, u64>,
    /// `FileSizes` unread with room for more: (stage id, mount) → place.
    sizes: HashMap<(u64, String), u64>,
    waker: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

/// What a message is, for the queue.
enum Kind {
    Join(u64),
    Announced,
    Advisory,
    Essential,
}

fn kind(message: &LocalMessage) -> Kind {
    match &message.body {
        Some(Body::StageJoined(StageJoined {
            stage: Some(stage),
            announced: false,
        })) => Kind::Join(stage.stage_id),
        Some(Body::StageJoined(_)) => Kind::Announced,
        Some(Body::FileSizes(_) | Body::PlaceRequest(_)) => Kind::Advisory,
        _ => Kind::Essential,
    }
}

impl Queue {
    /// The slot of place `seq`, if still queued.
    fn slot(&mut self, seq: u64) -> Option<&mut Slot> {
        let index = usize::try_from(seq.checked_sub(self.first)?).ok()?;
        self.slots.get_mut(index)
    }

    fn push(&mut self, message: LocalMessage, bytes: usize) -> (u64, Option<Waker>) {
        let seq = self.first + self.slots.len() as u64;
        self.slots.push_back(Slot {
            message: Some(message),
            bytes,
        });
        (seq, self.waker.take())
    }

    /// Forgets what a message leaving the queue at place `seq` counted.
    fn uncount(&mut self, seq: u64, message: &LocalMessage, bytes: usize) {
        match kind(message) {
            Kind::Join(stage) => {
                if self.joins.get(&stage) == Some(&seq) {
                    self.joins.remove(&stage);
                }
            }
            Kind::Announced => {}
            Kind::Advisory => {
                self.advisory -= 1;
                self.advisory_bytes -= bytes;
                if let Some(Body::FileSizes(sizes)) = &message.body {
                    let key = (sizes.stage_id, sizes.mount.clone());
                    if self.sizes.get(&key) == Some(&seq) {
                        self.sizes.remove(&key);
                    }
                }
            }
            Kind::Essential => self.bytes -= bytes,
        }
    }
}

/// The sending side. Dropping it ends the stream once it is drained.
pub struct Sender(Arc<Mutex<Queue>>);

/// The receiving side, a stream of the messages queued (joins taken back skipped).
pub struct Receiver(Arc<Mutex<Queue>>);

/// An essential message did not fit (or the stream is gone): the global controller does
/// not read the stream.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

/// A new queue of up to `capacity` messages.
pub fn bounded(capacity: usize) -> (Sender, Receiver) {
    let queue = Arc::new(Mutex::new(Queue {
        slots: VecDeque::new(),
        first: 0,
        capacity,
        bytes: 0,
        advisory: 0,
        advisory_bytes: 0,
        joins: HashMap::new(),
        sizes: HashMap::new(),
        waker: None,
        sender_gone: false,
        receiver_gone: false,
    }));
    (Sender(queue.clone()), Receiver(queue))
}

impl Sender {
    /// Queues an essential message; a leave takes back its stage's join if it is still
    /// unread (and is not queued itself). `Err` once it does not fit.
    pub fn send(&self, message: LocalMessage) -> Result<(), Full> {
        if matches!(kind(&message), Kind::Advisory) {
            // Advice is counted as advice whichever way it comes, and never costs the
            // stream.
            self.offer(message);
            return Ok(());
        }
        let waker = {
            let mut queue = lock(&self.0);
            if queue.receiver_gone {
                return Err(Full);
            }
            if let Some(Body::StageLeft(StageLeft { stage_id })) = &message.body {
                if let Some(seq) = queue.joins.remove(stage_id) {
                    if let Some(slot) = queue.slot(seq) {
                        slot.message = None;
                    }
                    // Places taken back at the end are given back (a stage that came and
                    // went at once costs none); others are skipped when read.
                    while queue
                        .slots
                        .back()
                        .is_some_and(|slot| slot.message.is_none())
                    {
                        queue.slots.pop_back();
                    }
                    return Ok(());
                }
            }
            if queue.slots.len() >= queue.capacity {
                return Err(Full);
            }
            let bytes = message.encoded_len();
            match kind(&message) {
                Kind::Join(stage) => {
                    let (seq, waker) = queue.push(message, bytes);
                    queue.joins.insert(stage, seq);
                    waker
                }
                Kind::Announced => queue.push(message, bytes).1,
                Kind::Advisory | Kind::Essential => {
                    // (Advisory: offered above, never here.)
                    if queue.bytes + bytes > MAX_QUEUED_BYTES {
                        return Err(Full);
                    }
                    queue.bytes += bytes;
                    queue.push(message, bytes).1
                }
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    /// Queues an advisory message if there is room for advice; `false` if it was
    /// dropped. Never gives the stream up.
    pub fn offer(&self, message: LocalMessage) -> bool {
        let waker = {
            let mut queue = lock(&self.0);
            if queue.receiver_gone {
                return false;
            }
            if let Some(Body::FileSizes(FileSizes {
                stage_id,
                mount,
                bytes: sizes,
            })) = &message.body
            {
                if let Some(joined) = queue.join_sizes(*stage_id, mount, sizes) {
                    return joined;
                }
            }
            let bytes = message.encoded_len();
            if queue.advisory >= MAX_ADVISORY
                || queue.advisory_bytes + bytes > MAX_ADVISORY_BYTES
                || queue.slots.len() >= queue.capacity
            {
                return false;
            }
            queue.advisory += 1;
            queue.advisory_bytes += bytes;
            let key = match &message.body {
                Some(Body::FileSizes(sizes)) if sizes.bytes.len() < MAX_FILE_SIZES => {
                    Some((sizes.stage_id, sizes.mount.clone()))
                }
                _ => None,
            };
            let (seq, waker) = queue.push(message, bytes);
            if let Some(key) = key {
                queue.sizes.insert(key, seq);
            }
            waker
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }
}

impl Queue {
    /// Adds `sizes` to the unread `FileSizes` of `stage` and `mount` if there is one
    /// with room: `Some(whether they were kept)`; `None` if there is none.
    fn join_sizes(&mut self, stage: u64, mount: &str, sizes: &[u64]) -> Option<bool> {
        let key = (stage, mount.to_string());
        let seq = *self.sizes.get(&key)?;
        let budget = MAX_ADVISORY_BYTES.saturating_sub(self.advisory_bytes);
        let slot = self.slot(seq)?;
        let Some(Body::FileSizes(queued)) = slot.message.as_mut().and_then(|m| m.body.as_mut())
        else {
            return None;
        };
        if queued.bytes.len() + sizes.len() > MAX_FILE_SIZES {
            self.sizes.remove(&key);
            return None;
        }
        let before = queued.encoded_len();
        queued.bytes.extend_from_slice(sizes);
        let grown = queued.encoded_len().saturating_sub(before);
        if grown > budget {
            queued.bytes.truncate(queued.bytes.len() - sizes.len());
            return Some(false);
        }
        let full = queued.bytes.len() >= MAX_FILE_SIZES;
        slot.bytes += grown;
        self.advisory_bytes += grown;
        if full {
            self.sizes.remove(&key);
        }
        Some(true)
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let waker = {
            let mut queue = lock(&self.0);
            queue.sender_gone = true;
            queue.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Stream for Receiver {
    type Item = LocalMessage;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LocalMessage>> {
        let mut queue = lock(&self.0);
        while let Some(slot) = queue.slots.pop_front() {
            let seq = queue.first;
            queue.first += 1;
            if let Some(message) = slot.message {
                queue.uncount(seq, &message, slot.bytes);
                return Poll::Ready(Some(message));
            }
        }
        if queue.sender_gone {
            return Poll::Ready(None);
        }
        match &mut queue.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let slots = {
            let mut queue = lock(&self.0);
            queue.receiver_gone = true;
            queue.waker = None;
            queue.joins.clear();
            queue.sizes.clear();
            std::mem::take(&mut queue.slots)
        };
        drop(slots);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{self, PlaceRequest, Stage};
    use tokio_stream::StreamExt;

    fn message(body: Body) -> LocalMessage {
        LocalMessage { body: Some(body) }
    }

    fn join(stage_id: u64, mount_bytes: usize) -> LocalMessage {
        message(Body::StageJoined(StageJoined {
            stage: Some(Stage {
                stage_id,
                mountpoints: vec!["/".repeat(mount_bytes); 1],
                ..Stage::default()
            }),
            announced: false,
        }))
    }

    fn left(stage_id: u64) -> LocalMessage {
        message(Body::StageLeft(StageLeft { stage_id }))
    }

    fn size(stage_id: u64, mount: &str, bytes: u64) -> LocalMessage {
        message(Body::FileSizes(FileSizes {
            stage_id,
            mount: mount.into(),
            bytes: vec![bytes],
        }))
    }

    fn drain(receiver: &mut Receiver) -> Vec<LocalMessage> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(m)) = Pin::new(&mut *receiver).poll_next(&mut cx) {
            out.push(m);
        }
        out
    }

    /// A flood of advice past its room is dropped, never refused as a full queue; room
    /// stays for the essential messages.
    #[test]
    fn advice_past_its_room_is_dropped_and_essentials_still_fit() {
        let (sender, mut receiver) = bounded(4096 + 8192);
        let mut kept = 0;
        for i in 0..100_000u64 {
            let place = message(Body::PlaceRequest(PlaceRequest {
                request: i,
                mount: "/scratch".into(),
                stripes: 1,
                stage_id: i,
            }));
            kept += usize::from(sender.offer(place));
            // Sizes of ever new stages: none joins another.
            kept += usize::from(sender.offer(size(1_000_000 + i, "/scratch", 4096)));
        }
        assert_eq!(kept, MAX_ADVISORY);
        for stage in 0..4096 {
            assert_eq!(sender.send(join(stage, 10)), Ok(()));
        }
        for stage in 0..4096 {
            assert_eq!(sender.send(left(1_000_000 + stage)), Ok(()));
        }
        assert_eq!(drain(&mut receiver).len(), MAX_ADVISORY + 2 * 4096);
        // Read: room again.
        assert!(sender.offer(size(7, "/scratch", 1)));
    }

    /// Sizes of one stage and mountpoint go up together while unread, up to the most a
    /// message may carry.
    #[test]
    fn sizes_unread_are_batched() {
        let (sender, mut receiver) = bounded(100);
        for i in 0..(MAX_FILE_SIZES as u64 * 2 + 1) {
            assert!(sender.offer(size(1, "/scratch", i)));
        }
        assert!(sender.offer(size(1, "/other", 5)));
        let read = drain(&mut receiver);
        let counts: Vec<usize> = read
            .iter()
            .map(|m| match &m.body {
                Some(Body::FileSizes(s)) => s.bytes.len(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(counts, [MAX_FILE_SIZES, MAX_FILE_SIZES, 1, 1]);
        assert!(sender.offer(size(1, "/scratch", 9)));
        assert_eq!(drain(&mut receiver).len(), 1, "a new message once read");
    }

    /// Stages of 64 KiB registrations coming and going, unread: their joins are taken
    /// back with their leaves, so the queue holds no more than the stages alive; leaves
    /// of stages whose joins were read are small, and bounded in bytes too.
    #[test]
    fn a_join_and_its_leave_unread_cancel_out() {
        let (sender, mut receiver) = bounded(100);
        assert_eq!(sender.send(join(1, 64 << 10)), Ok(()));
        for stage in 2..1_000_000 {
            assert_eq!(sender.send(join(stage, 64 << 10)), Ok(()));
            assert_eq!(sender.send(left(stage)), Ok(()));
        }
        let read = drain(&mut receiver);
        assert_eq!(read.len(), 1, "only the stage alive");
        assert!(matches!(kind(&read[0]), Kind::Join(1)));
        // Its join read: its leave goes up.
        assert_eq!(sender.send(left(1)), Ok(()));
        assert!(matches!(
            drain(&mut receiver)[..],
            [LocalMessage {
                body: Some(Body::StageLeft(StageLeft { stage_id: 1 }))
            }]
        ));
        // Essential messages past the bytes: the stream is given up.
        let big = message(Body::Register(proto::Register {
            node: "n".repeat(MAX_QUEUED_BYTES / 4),
            version: 1,
        }));
        assert!(big.encoded_len() < MAX_QUEUED_BYTES);
        let mut sent = 0;
        while sender.send(big.clone()).is_ok() {
            sent += 1;
            assert!(sent < 100);
        }
        assert!(sent >= 1);
        drop(receiver);
        assert_eq!(sender.send(left(5)), Err(Full));
    }

    #[tokio::test]
    async fn the_stream_ends_with_the_sender() {
        let (sender, receiver) = bounded(10);
        sender.send(left(1)).unwrap();
        drop(sender);
        assert_eq!(receiver.collect::<Vec<_>>().await.len(), 1);
    }
}
