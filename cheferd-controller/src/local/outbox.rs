//! The queue of messages to one stage, bounded: a stage that does not read its socket is
//! closed rather than buffered for.
//!
//! Lines are encoded as they are queued and counted against the stage's own caps
//! ([`MAX_MESSAGES`], [`MAX_BYTES`]) and the byte budgets of its uid and of the node.
//! Rules are declarative, so a `set_rules` replaces one still queued: a stage that is
//! stopped (a suspended job) holds one rule set, however often its rules change. What
//! else is queued answers the stage's own requests (`placed`): a queue over a cap is a
//! stage that asks without reading, and it is closed at once. The writing task gives up
//! on a stage whose socket takes nothing for [`WRITE_STALL`] (the kernel's buffer is
//! full): it is closed too.

use crate::bounds::Budget;
use padll_wire::control::{self, ControlMessage};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{watch, Notify};

/// Messages queued to one stage, at most.
pub const MAX_MESSAGES: usize = 256;
/// Bytes queued to one stage, at most (a full rule set is ≈ 30 KiB, a `placed` with the
/// most stripes ≈ 10 KiB).
pub const MAX_BYTES: usize = 1 << 20;
/// Bytes queued to all the stages of one uid, at most.
pub const MAX_BYTES_PER_UID: usize = 16 << 20;
/// Bytes queued to all the stages of the node, at most.
pub const MAX_BYTES_PER_NODE: usize = 64 << 20;
/// How long a write to a stage may wait for its socket to take anything.
pub const WRITE_STALL: Duration = Duration::from_secs(10);

/// Why a stage's outbox was closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Closed {
    /// Its queue holds as many messages as it may.
    #[error("it does not read its socket ({MAX_MESSAGES} messages queued)")]
    Messages,
    /// Its queue holds as many bytes as it may.
    #[error("it does not read its socket ({MAX_BYTES} bytes queued)")]
    Bytes,
    /// The queues of its uid, or of the node, hold as many bytes as they may.
    #[error("it does not read its socket (its uid's or the node's queues are full)")]
    Budget,
    /// Its socket took nothing for [`WRITE_STALL`].
    #[error("it does not read its socket (a write waited {} s)", WRITE_STALL.as_secs())]
    Stalled,
    /// The socket is closed, or the stage left.
    #[error("the connection ended")]
    Ended,
}

/// A line queued, and whether it is a rule set (replaced by a newer one).
struct Queued {
    line: String,
    rules: bool,
}

#[derive(Default)]
struct Queue {
    lines: VecDeque<Queued>,
    bytes: usize,
}

/// The queue of messages to one stage.
pub struct Outbox {
    queue: Mutex<Queue>,
    /// Wakes the writing task.
    queued: Notify,
    closed: watch::Sender<Option<Closed>>,
    /// Its uid's and the node's byte budgets.
    budgets: [Arc<Budget>; 2],
}

impl Outbox {
    /// An outbox counting its bytes in `uid` and `node` too.
    pub fn new(uid: Arc<Budget>, node: Arc<Budget>) -> Arc<Outbox> {
        Arc::new(Outbox {
            queue: Mutex::default(),
            queued: Notify::new(),
            closed: watch::Sender::new(None),
            budgets: [uid, node],
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        padll_wire::sync::lock(&self.queue)
    }

    /// Queues `message`; a queue over a cap closes the outbox (the error says why).
    pub fn send(&self, message: &ControlMessage) -> Result<(), Closed> {
        if let Some(why) = self.closed.borrow().clone() {
            return Err(why);
        }
        let rules = matches!(message, ControlMessage::SetRules { .. });
        let line = control::encode(message);
        let mut queue = self.lock();
        if rules {
            if let Some(at) = queue.lines.iter().position(|q| q.rules) {
                let replaced = queue.lines.remove(at).map_or(0, |q| q.line.len());
                queue.bytes -= replaced;
                self.give(replaced);
            }
        }
        let over = if queue.lines.len() >= MAX_MESSAGES {
            Some(Closed::Messages)
        } else if queue.bytes + line.len() > MAX_BYTES {
            Some(Closed::Bytes)
        } else if !self.take(line.len()) {
            Some(Closed::Budget)
        } else {
            None
        };
        if let Some(why) = over {
            drop(queue);
            self.close(why.clone());
            return Err(why);
        }
        queue.bytes += line.len();
        queue.lines.push_back(Queued { line, rules });
        drop(queue);
        self.queued.notify_one();
        Ok(())
    }

    /// Closes the outbox (the first reason given stays): what is queued is dropped, the
    /// writing task ends and [`Outbox::closed`] returns.
    pub fn close(&self, why: Closed) {
        let first = self.closed.send_if_modified(|closed| {
            let first = closed.is_none();
            if first {
                *closed = Some(why);
            }
            first
        });
        if first {
            self.drain();
            self.queued.notify_one();
        }
    }

    /// Waits until the outbox is closed; returns why.
    pub async fn closed(&self) -> Closed {
        let mut closed = self.closed.subscribe();
        let why = closed.wait_for(Option::is_some).await;
        why.ok()
            .and_then(|why| why.clone())
            .unwrap_or(Closed::Ended)
    }

    /// The next line to write, or `None` once closed.
    async fn next(&self) -> Option<String> {
        loop {
            if self.closed.borrow().is_some() {
                return None;
            }
            if let Some(queued) = {
                let mut queue = self.lock();
                let popped = queue.lines.pop_front();
                if let Some(q) = &popped {
                    queue.bytes -= q.line.len();
                }
                popped
            } {
                self.give(queued.line.len());
                return Some(queued.line);
            }
            self.queued.notified().await;
        }
    }

    /// Writes what is queued to the stage until the outbox closes, or closes it when the
    /// socket fails or takes nothing for `stall` ([`WRITE_STALL`]).
    pub async fn write_to(self: Arc<Self>, mut socket: OwnedWriteHalf, stall: Duration) {
        while let Some(line) = self.next().await {
            let written = tokio::select! {
                written = tokio::time::timeout(stall, socket.write_all(line.as_bytes())) => written,
                _ = self.closed() => return,
            };
            match written {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return self.close(Closed::Ended),
                Err(_) => return self.close(Closed::Stalled),
            }
        }
    }

    fn take(&self, bytes: usize) -> bool {
        let [uid, node] = &self.budgets;
        if !uid.take(bytes) {
            return false;
        }
        if !node.take(bytes) {
            uid.give(bytes);
            return false;
        }
        true
    }

    fn give(&self, bytes: usize) {
        self.budgets.iter().for_each(|budget| budget.give(bytes));
    }

    fn drain(&self) {
        let bytes = std::mem::take(&mut *self.lock()).bytes;
        self.give(bytes);
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(seq: u64) -> ControlMessage {
        ControlMessage::SetRules {
            seq,
            rules: Vec::new(),
        }
    }

    fn placed(id: u64) -> ControlMessage {
        ControlMessage::Placed {
            id,
            targets: Vec::new(),
        }
    }

    fn budgets(uid: usize, node: usize) -> (Arc<Budget>, Arc<Budget>) {
        (Budget::new(uid), Budget::new(node))
    }

    #[tokio::test]
    async fn a_newer_rule_set_replaces_a_queued_one() {
        let (uid, node) = budgets(1 << 20, 1 << 20);
        let outbox = Outbox::new(uid.clone(), node);
        for seq in 1..=1000 {
            outbox.send(&rules(seq)).unwrap();
        }
        outbox.send(&placed(7)).unwrap();
        outbox.send(&rules(1001)).unwrap();
        assert_eq!(
            uid.used(),
            control::encode(&rules(1001)).len() + control::encode(&placed(7)).len()
        );
        assert_eq!(outbox.next().await, Some(control::encode(&placed(7))));
        assert_eq!(outbox.next().await, Some(control::encode(&rules(1001))));
        assert_eq!(uid.used(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_closes_the_outbox_and_gives_its_bytes_back() {
        let (uid, node) = budgets(1 << 20, 1 << 20);
        let outbox = Outbox::new(uid.clone(), node.clone());
        for id in 0..MAX_MESSAGES as u64 {
            outbox.send(&placed(id)).unwrap();
        }
        assert!(uid.used() > 0);
        assert_eq!(outbox.send(&placed(0)), Err(Closed::Messages));
        assert_eq!(
            outbox.send(&rules(1)),
            Err(Closed::Messages),
            "closed for good"
        );
        assert_eq!(outbox.closed().await, Closed::Messages);
        assert_eq!(outbox.next().await, None, "the writer ends");
        assert_eq!((uid.used(), node.used()), (0, 0));
    }

    #[tokio::test]
    async fn the_uid_budget_is_shared_by_its_stages() {
        let line = control::encode(&placed(1)).len();
        let (uid, node) = budgets(3 * line, 1 << 20);
        let (first, second) = (
            Outbox::new(uid.clone(), node.clone()),
            Outbox::new(uid.clone(), node.clone()),
        );
        first.send(&placed(1)).unwrap();
        first.send(&placed(1)).unwrap();
        second.send(&placed(1)).unwrap();
        assert_eq!(second.send(&placed(1)), Err(Closed::Budget));
        assert_eq!(uid.used(), 2 * line, "the closed one's bytes are back");
        drop(first);
        assert_eq!((uid.used(), node.used()), (0, 0));
    }

    #[tokio::test]
    async fn a_stage_that_does_not_read_is_closed_after_the_write_stall() {
        let (reader, writer) = tokio::net::UnixStream::pair().unwrap();
        let (uid, node) = budgets(64 << 20, 64 << 20);
        let outbox = Outbox::new(uid, node);
        let stall = Duration::from_millis(300);
        let writing = tokio::spawn(outbox.clone().write_to(writer.into_split().1, stall));
        // 640 KB, more than the kernel buffers and less than the queue takes; nothing is
        // read.
        let big = ControlMessage::Placed {
            id: 1,
            targets: vec![1_000_000; 2000],
        };
        for _ in 0..40 {
            outbox.send(&big).unwrap();
            tokio::task::yield_now().await;
        }
        assert_eq!(outbox.closed().await, Closed::Stalled);
        writing.await.unwrap();
        drop(reader);
    }
}
