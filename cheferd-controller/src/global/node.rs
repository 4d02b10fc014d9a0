//! The registry's records: a local controller (node) with its stages and orphans,
//! where the rates each stage was last sent are kept, and the nodes, found by name or
//! by their stream's handle.

use crate::outbox;
use crate::plan::StageUsage;
use crate::policy::JobKey;
use crate::proto::{self, GlobalMessage};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::task::Waker;
use tokio::time::Instant;
use tonic::Status;

/// A message to a node's stream, or the status that ends it.
pub(super) type Outgoing = Result<GlobalMessage, Status>;

/// The queue to one node's stream: its own `Attach` stream's, or its share of the
/// `Relay` stream of the relay it is attached through (`super::relay`).
pub(super) enum Outbox {
    Direct(outbox::Sender<Outgoing>),
    Relayed { link: u32, relay: Arc<RelayOutbox> },
}

/// The queue of a relay's stream, which its nodes share: each message with the link
/// of the node it is for.
pub(super) struct RelayOutbox {
    /// The relay stream's session: its nodes' report slots are its (one place in the
    /// spread for all of them, so that the relay receives their reports together and
    /// passes them on in one message).
    pub(super) session: u64,
    pub(super) queue: outbox::Sender<(u32, Outgoing)>,
}

impl Outbox {
    /// Queues `message` and wakes the stream's task.
    pub(super) fn send(&self, message: Outgoing) -> Result<(), outbox::Closed> {
        match self {
            Outbox::Direct(queue) => queue.send(message),
            Outbox::Relayed { link, relay } => relay.queue.send((*link, message)),
        }
    }

    /// Queues `message` without waking the stream's task ([`outbox::Sender::queue`]).
    pub(super) fn queue(&self, message: Outgoing) -> Result<Option<Waker>, outbox::Closed> {
        match self {
            Outbox::Direct(queue) => queue.queue(message),
            Outbox::Relayed { link, relay } => relay.queue.queue((*link, message)),
        }
    }

    /// [`outbox::Sender::prefetch`].
    pub(super) fn prefetch(&self) {
        match self {
            Outbox::Direct(queue) => queue.prefetch(),
            Outbox::Relayed { relay, .. } => relay.queue.prefetch(),
        }
    }

    /// Whose place in the report slots' spread the node of stream `session` takes:
    /// its own, or its relay's.
    pub(super) fn slot_session(&self, session: u64) -> u64 {
        match self {
            Outbox::Direct(_) => session,
            Outbox::Relayed { relay, .. } => relay.session,
        }
    }
}

/// One local controller.
pub(super) struct Node {
    /// The name it registered with (its key in [`Nodes`]), for the log.
    pub(super) name: Box<str>,
    pub(super) session: u64,
    pub(super) outbox: Outbox,
    pub(super) stages: BTreeMap<u64, StageRecord>,
    /// Its stream ended.
    pub(super) detached: bool,
    /// The first cycle whose usage report is due under its current schedule (later
    /// cycles' reports follow one per interval).
    pub(super) due: u64,
    /// When its report for `due` is to arrive (to tell it as the `Schedule` leaves).
    pub(super) report_at: Option<Instant>,
    /// The cycle its latest report was for, and when that arrived.
    pub(super) reported: u64,
    pub(super) reported_at: Option<Instant>,
    /// The cycle of the latest `Enforce` it has not acknowledged.
    pub(super) unacked: Option<u64>,
    /// Stages of an ended stream of this node, by pid, that have not re-registered: they
    /// run on their last rules, so they keep their share (no rules can reach them).
    pub(super) orphans: BTreeMap<u32, StageRecord>,
    /// When the stream that left the orphans ended.
    pub(super) orphaned_at: Option<Instant>,
    /// The running collect waits for its report.
    pub(super) pending: bool,
    pub(super) bytes_in: u64,
    pub(super) bytes_out: u64,
    /// Its stages per job (for `max_jobs_per_node`).
    pub(super) jobs: HashMap<JobKey, usize>,
    /// Its report for the last cycle it was due was missing, and none came since.
    pub(super) missed: bool,
    /// What its stages and orphans hold of names and mountpoints
    /// ([`crate::bounds::stage_bytes`]), bounded by
    /// [`crate::bounds::MAX_STAGE_BYTES_PER_NODE`].
    pub(super) stage_bytes: usize,
}

impl Node {
    /// Where its report slot is in the spread: its session's place, or its relay's.
    pub(super) fn slot_session(&self) -> u64 {
        self.outbox.slot_session(self.session)
    }
}

/// A registered stage.
pub(super) struct StageRecord {
    pub(super) stage: proto::Stage,
    /// Its job id, interned.
    pub(super) job: JobKey,
    /// Its last reported usage per resource, by index into the configured resources
    /// (updated in place: reports of a stage name the same resources cycle after cycle).
    pub(super) usage: Vec<(usize, StageUsage)>,
    /// Where the rates it was last sent are.
    pub(super) slot: Slot,
}

/// Where the rates a stage was last sent are kept: in exactly one place at a time.
#[derive(Debug)]
pub(super) enum Slot {
    /// Not in the cache (the stage joined since it was built), with the rates it was
    /// sent outside a cycle (its provisional rule), if any.
    New(Option<Vec<u64>>),
    /// Its index in the cache (as last built, current or not).
    Cached(usize),
}

/// How a stream finds its node without looking its name up: the slot the node was put
/// in, and the stream's session. A slot is reused once its node is gone, sessions never
/// are, so the handle of a replaced or ended stream finds nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct NodeHandle {
    slot: usize,
    pub(super) session: u64,
}

/// The nodes, in slots their streams reach directly ([`NodeHandle`]), found by name
/// through a name index. The cycle walks them in slot order ([`Nodes::values_mut`]):
/// one pass over the slots, where a walk in name order reached each node at random
/// (2.5 ms of a 10 000-node cycle for the report slots alone on a VM whose memory
/// is slow).
#[derive(Default)]
pub(super) struct Nodes {
    slots: Vec<Option<Node>>,
    /// Slots freed by a node removed, to reuse.
    free: Vec<usize>,
    by_name: BTreeMap<String, usize>,
    /// Some node may be detached or hold orphans: only then does a cycle walk them all
    /// to release what expired (`registry::release_expired_orphans`).
    pub(super) unsettled: bool,
}

impl Nodes {
    pub(super) fn len(&self) -> usize {
        self.by_name.len()
    }

    pub(super) fn contains_key(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The node of `handle`'s stream, if that stream is still its node's.
    pub(super) fn get(&self, handle: NodeHandle) -> Option<&Node> {
        let node = self.slots.get(handle.slot)?.as_ref()?;
        (node.session == handle.session).then_some(node)
    }

    /// [`Nodes::get`], to change.
    pub(super) fn get_mut(&mut self, handle: NodeHandle) -> Option<&mut Node> {
        let node = self.slots.get_mut(handle.slot)?.as_mut()?;
        (node.session == handle.session).then_some(node)
    }

    /// Adds `node` as `name` (which has none) and returns its stream's handle.
    pub(super) fn insert(&mut self, name: &str, node: Node) -> NodeHandle {
        let session = node.session;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(node);
                slot
            }
            None => {
                self.slots.push(Some(node));
                self.slots.len() - 1
            }
        };
        self.by_name.insert(name.to_string(), slot);
        NodeHandle { slot, session }
    }

    pub(super) fn remove(&mut self, name: &str) -> Option<Node> {
        let slot = self.by_name.remove(name)?;
        self.free.push(slot);
        self.slots[slot].take()
    }

    /// Keeps the nodes `keep` is true for, in name order.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&str, &mut Node) -> bool) {
        let Nodes {
            slots,
            free,
            by_name,
            ..
        } = self;
        by_name.retain(|name, &mut slot| {
            let kept = slots[slot].as_mut().is_some_and(|node| keep(name, node));
            if !kept {
                slots[slot] = None;
                free.push(slot);
            }
            kept
        });
    }

    /// The nodes by name, in name order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &Node)> {
        self.by_name
            .iter()
            .filter_map(|(name, &slot)| Some((name, self.slots[slot].as_ref()?)))
    }

    /// The nodes in the order of their slots, not of their names: one pass over the
    /// slots, without the name index. The planner's views and the enforce step both
    /// walk them so (they must agree); the order is the slots', stable until a node is
    /// added or removed, which invalidates the views.
    pub(super) fn values(&self) -> impl Iterator<Item = &Node> {
        self.slots.iter().flatten()
    }

    /// [`Nodes::values`], to change.
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Node> {
        self.slots.iter_mut().flatten()
    }
}
