//! The registry's records: a local controller (node) with its stages and orphans, and
//! where the rates each stage was last sent are kept.

use crate::outbox;
use crate::plan::StageUsage;
use crate::policy::JobKey;
use crate::proto::{self, GlobalMessage};
use std::collections::{BTreeMap, HashMap};
use tokio::time::Instant;
use tonic::Status;

/// The queue to one node's stream.
pub(super) type Outbox = outbox::Sender<Result<GlobalMessage, Status>>;

/// One local controller.
pub(super) struct Node {
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
