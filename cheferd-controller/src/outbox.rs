//! The queue of messages to one local controller's stream: an unbounded channel whose
//! sender can queue a message without waking the receiving task yet.
//!
//! A cycle queues up to one `Enforce` per local controller. Each wake-up of a stream's
//! task set it running on the other core (encoding and writing it) while the rest were
//! still being queued, and that work slowed the queueing of the rest down (by hundreds
//! of µs at 1 000 local controllers). The cycle queues them all first, then wakes
//! their tasks.

use padll_wire::sync::lock;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use tokio_stream::Stream;

struct Queue<T> {
    items: VecDeque<T>,
    capacity: usize,
    waker: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

type Shared<T> = Arc<Mutex<Queue<T>>>;

/// Messages a queue holds at most: a peer that does not read its stream (a hostile
/// client) cannot make the controller buffer without bound. Rules are declarative, so
/// a message refused here is superseded by the next cycle's.
pub const MAX_QUEUED: usize = 8192;

/// The sending side (one per channel). Dropping it ends the stream once it is drained.
pub struct Sender<T>(Shared<T>);

/// The receiving side, a stream of the messages sent.
pub struct Receiver<T>(Shared<T>);

/// The receiving end is gone, or its queue is full (the message was not queued).
#[derive(Debug)]
pub struct Closed;

/// A new channel that holds up to [`MAX_QUEUED`] messages.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    bounded(MAX_QUEUED)
}

/// A new channel that holds up to `capacity` messages.
pub fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Mutex::new(Queue {
        items: VecDeque::new(),
        capacity,
        waker: None,
        sender_gone: false,
        receiver_gone: false,
    }));
    (Sender(shared.clone()), Receiver(shared))
}

impl<T> Sender<T> {
    /// Queues `item` and wakes the receiving task.
    pub fn send(&self, item: T) -> Result<(), Closed> {
        if let Some(waker) = self.queue(item)? {
            waker.wake();
        }
        Ok(())
    }

    /// Queues `item` without waking the receiving task: the caller must wake the waker
    /// returned (if any) once it is done queueing.
    pub fn queue(&self, item: T) -> Result<Option<Waker>, Closed> {
        let mut queue = lock(&self.0);
        if queue.receiver_gone || queue.items.len() >= queue.capacity {
            return Err(Closed);
        }
        queue.items.push_back(item);
        Ok(queue.waker.take())
    }

    /// Asks the CPU to bring the queue into cache ([`crate::prefetch`]), for a loop
    /// that queues to thousands of streams.
    pub fn prefetch(&self) {
        crate::prefetch::prefetch(Arc::as_ptr(&self.0));
    }
}

impl<T> Drop for Sender<T> {
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

impl<T> Stream for Receiver<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut queue = lock(&self.0);
        if let Some(item) = queue.items.pop_front() {
            return Poll::Ready(Some(item));
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

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let items = {
            let mut queue = lock(&self.0);
            queue.receiver_gone = true;
            queue.waker = None;
            std::mem::take(&mut queue.items)
        };
        drop(items);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn queued_items_arrive_once_woken_and_the_stream_ends_with_the_sender() {
        let (sender, mut receiver) = channel();
        sender.send(1).unwrap();
        assert_eq!(receiver.next().await, Some(1));
        let task = tokio::spawn(async move { receiver.collect::<Vec<i32>>().await });
        tokio::task::yield_now().await;
        let mut wakers = Vec::new();
        for i in 2..5 {
            wakers.extend(sender.queue(i).unwrap());
        }
        wakers.into_iter().for_each(Waker::wake);
        drop(sender);
        assert_eq!(task.await.unwrap(), vec![2, 3, 4]);
        let (sender, receiver) = channel::<i32>();
        drop(receiver);
        assert!(sender.send(1).is_err());
    }
}
