//! The registry: local controllers (nodes) by name, their stages, and the *orphans* a
//! node's ended stream left (stages still running on their last rules, kept in the plan
//! with their share until they re-register or [`ORPHAN_GRACE`] passes); what each
//! message of a node's stream does to it.

use super::admit::GRPC_LOG;
use super::cache::{self, PlanCache};
use super::node::{Node, NodeHandle, Nodes, Outbox, Slot, StageRecord};
use super::service_times::ServiceTimes;
use super::{enforce, schedule, Controller, State};
use crate::bounds::stage_bytes;
use crate::config::{Resource, ResourceConfig};
use crate::plan::StageUsage;
use crate::policy::JobKey;
use crate::prefetch::prefetch;
use crate::proto::{self, global_message, local_message, GlobalMessage, LocalMessage};
use padll_wire::control::short;
use padll_wire::latency::BUCKETS;
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::time::Instant;
use tonic::Status;
use tracing::{debug, info, warn};

/// How long the stages of a detached local controller keep their place in the plan. A
/// restarted local controller re-attaches at once and its stages reconnect within their
/// 5 s backoff; a stage missing for longer is presumed gone with its node.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(30);

/// How the status that ends a stream replaced by its node's new one begins (`ABORTED`):
/// a local controller that reads it backs off (two running as one node knocked each
/// other off every 100 ms).
pub const REPLACED: &str = "replaced by another attachment";

impl Controller {
    /// Registers the node `name` whose stream, from `peer` (an address), queues to
    /// `outbox`, replacing its previous stream: that one is ended with a status saying
    /// so ([`REPLACED`]), its stages become orphans. Returns the handle this stream's
    /// messages find the node by (nothing, once the stream is replaced).
    pub(super) fn attach_node(
        &self,
        name: &str,
        peer: &str,
        outbox: Outbox,
    ) -> Result<NodeHandle, Status> {
        let mut state = self.lock();
        let max_nodes = state.config.limits.max_nodes;
        if !state.nodes.contains_key(name) && state.nodes.len() >= max_nodes {
            crate::limited_warn!(
                GRPC_LOG,
                node = %short(name),
                "refused a local controller: {max_nodes} nodes are registered (max_nodes)"
            );
            return Err(Status::resource_exhausted(format!(
                "{max_nodes} nodes are registered (max_nodes)"
            )));
        }
        let session = state.next_session;
        state.next_session += 1;
        let interval_ms = state.config.interval_ms;
        let registered = GlobalMessage {
            body: Some(global_message::Body::Registered(proto::Registered {
                version: proto::VERSION,
                interval_ms,
                resources: state
                    .config
                    .resources
                    .iter()
                    .map(|r| proto::Resource {
                        mount: r.resource.mount.clone(),
                        class: r.resource.class.name().to_string(),
                        max_rate: r.max_rate.tokens() as u64,
                        costs: r
                            .weights
                            .iter()
                            .map(|(op, cost)| (op.name().to_string(), cost))
                            .collect(),
                    })
                    .collect(),
                ..Default::default() // term and generation: stamped as sent (Leadership::stamp)
            })),
        };
        let _ = outbox.send(Ok(registered));
        let mut node = Node {
            name: name.into(),
            session,
            outbox,
            stages: BTreeMap::new(),
            detached: false,
            due: 0,
            reported: 0,
            reported_at: None,
            unacked: None,
            orphans: BTreeMap::new(),
            orphaned_at: None,
            pending: false,
            bytes_in: 0,
            bytes_out: 0,
            jobs: HashMap::new(),
            missed: false,
            report_at: None,
            stage_bytes: 0,
        };
        if let Some(mut previous) = state.nodes.remove(name) {
            if previous.detached {
                info!(node = %short(name), "re-attached; its stages re-register");
            } else {
                warn!(
                    node = %short(name),
                    from = peer,
                    "node re-attached; its previous stream is replaced"
                );
                // Its local controller is gone (a new one took over), or another runs
                // as this node: tell the latter why, which it tells its operator.
                let _ = previous.outbox.send(Err(Status::aborted(format!(
                    "{REPLACED} for node {} from {peer}",
                    padll_wire::quote(&short(name))
                ))));
                orphan_stages(&mut previous);
            }
            node.orphans = previous.orphans;
            node.orphaned_at = previous.orphaned_at;
            node.stage_bytes = previous.stage_bytes; // its stages are orphans now
            state.nodes.unsettled = true;
        }
        let now = Instant::now();
        let (cycle, report_in) = schedule::Ticks::of(&state).next_slot(now, node.slot_session());
        schedule::schedule(&mut node, cycle, now, report_in, interval_ms);
        let handle = state.nodes.insert(name, node);
        state.cache.invalidate();
        info!(node = %short(name), "local controller attached");
        Ok(handle)
    }

    /// What a message of the `stream` of node `name` does.
    pub(super) fn handle(&self, name: &str, stream: NodeHandle, mut message: LocalMessage) {
        let size = message.encoded_len() as u64;
        // Placement reads its feed: chosen outside the state lock.
        let placed = match (&message.body, &self.placement) {
            (Some(local_message::Body::PlaceRequest(request)), Some(service)) => {
                Some((request.request, self.place(stream, service, request)))
            }
            (Some(local_message::Body::FileSizes(sizes)), _) => {
                return self.file_sizes(name, stream, size, sizes);
            }
            (Some(local_message::Body::PlaceRequest(request)), None) => {
                Some((request.request, Vec::new()))
            }
            _ => None,
        };
        let mut state = self.lock();
        if let Some((request, targets)) = placed {
            if let Some(node) = state.nodes.get_mut(stream) {
                node.bytes_in += size;
                let reply =
                    global_message::Body::PlaceReply(proto::PlaceReply { request, targets });
                let _ = node.outbox.send(Ok(GlobalMessage { body: Some(reply) }));
            }
            return;
        }
        let mut job = 0;
        // A stage announced as its local controller's stream (re)started — to this
        // global or to a new leader — still runs on its rules: it needs no provisional
        // ones (a new leader knows no orphans, and would cut every job to them).
        let mut provisional = None;
        if let Some(local_message::Body::StageJoined(proto::StageJoined {
            stage: Some(stage),
            announced,
        })) = &mut message.body
        {
            if let Err(why) = admit_stage(&state, stream, stage) {
                crate::limited_warn!(
                    GRPC_LOG,
                    node = %short(name),
                    stage = stage.stage_id,
                    "ignored a stage: {why}"
                );
                if let Some(node) = state.nodes.get_mut(stream) {
                    node.bytes_in += size;
                }
                return;
            }
            job = state.jobs.intern(&stage.job_id);
            if !*announced
                && !state
                    .nodes
                    .get(stream)
                    .is_some_and(|n| n.orphans.contains_key(&stage.pid))
            {
                provisional = Some(enforce::provisional_rates(&state, stage, job));
            }
        }
        let provisional = provisional.map(|rates| (cache::rules(&state.config, &rates), rates));
        let collecting = state.collecting;
        let last_cycle = state.cycle;
        let mut replied = false;
        let mut acked = false;
        let State {
            config,
            nodes,
            cache,
            service,
            ..
        } = &mut *state;
        let Some(node) = nodes.get_mut(stream) else {
            return;
        };
        node.bytes_in += size;
        match message.body {
            Some(local_message::Body::StageJoined(proto::StageJoined {
                stage: Some(stage),
                ..
            })) => {
                debug!(node = %short(name), stage = stage.stage_id, job = %short(&stage.job_id), "stage joined");
                let stage_id = stage.stage_id;
                // Its usage carries over, so the next split treats it as before; its rules
                // are sent again (the ones it runs on may predate the last ones planned).
                let usage = match node.orphans.remove(&stage.pid) {
                    Some(orphan) => {
                        node.stage_bytes -= stage_bytes(&orphan.stage);
                        orphan.usage
                    }
                    None => Vec::new(),
                };
                let mut sent = None;
                if let Some((rules, rates)) = provisional.filter(|(r, _)| !r.is_empty()) {
                    let enforce = GlobalMessage {
                        body: Some(global_message::Body::Enforce(proto::Enforce {
                            cycle: 0,
                            stages: vec![proto::StageRules { stage_id, rules }],
                            ..Default::default() // term and generation: stamped as sent (Leadership::stamp)
                        })),
                    };
                    if node.outbox.send(Ok(enforce)).is_ok() {
                        sent = Some(rates);
                    }
                }
                let record = StageRecord {
                    stage,
                    job,
                    usage,
                    slot: Slot::New(sent),
                };
                *node.jobs.entry(job).or_insert(0) += 1;
                node.stage_bytes += stage_bytes(&record.stage);
                if let Some(old) = node.stages.insert(stage_id, record) {
                    node.stage_bytes -= stage_bytes(&old.stage);
                    forget_job(&mut node.jobs, old.job);
                }
                cache.invalidate();
            }
            Some(local_message::Body::StageLeft(proto::StageLeft { stage_id })) => {
                if let Some(old) = node.stages.remove(&stage_id) {
                    node.stage_bytes -= stage_bytes(&old.stage);
                    forget_job(&mut node.jobs, old.job);
                }
                cache.invalidate();
            }
            Some(local_message::Body::Usage(usage)) if usage.cycle < node.reported => {
                // A report older than one already taken would put older rates over
                // newer ones: ignored whole.
                crate::limited_warn!(
                    GRPC_LOG,
                    node = %short(name),
                    "ignored a usage report's cycle {}: the node reported cycle {} before",
                    usage.cycle,
                    node.reported
                );
            }
            Some(local_message::Body::Usage(usage)) => {
                // Each stage's usage is kept in three places far apart in memory (its
                // record, its planner's view and the view's row of the layout): ask for
                // all of them first, so that their cache misses overlap.
                for stage in &usage.stages {
                    if let Some(record) = node.stages.get(&stage.stage_id) {
                        prefetch(record.usage.as_ptr());
                        cache.prefetch_usage(&record.slot);
                    }
                }
                for stage in &usage.stages {
                    if let Some(record) = node.stages.get_mut(&stage.stage_id) {
                        if let Err(why) = record_usage(
                            record,
                            &stage.resources,
                            &config.resources,
                            cache,
                            service,
                        ) {
                            crate::limited_warn!(
                                GRPC_LOG,
                                node = %short(name),
                                stage = stage.stage_id,
                                "ignored a usage report: {why}"
                            );
                        }
                    }
                }
                acked = node_acked(node, usage.applied, last_cycle);
                // Only a report for the cycle collected (or a later one) counts: one
                // for an older cycle that cleared `missed` had every cycle wait its
                // whole bound again for a node that never reports in time.
                let current = collecting.unwrap_or(last_cycle + 1);
                if usage.cycle >= current {
                    node.reported = usage.cycle;
                    node.reported_at = Some(Instant::now());
                    node.missed = false;
                    replied = std::mem::take(&mut node.pending);
                }
            }
            Some(local_message::Body::Applied(applied)) => {
                acked = node_acked(node, applied.cycle, last_cycle);
            }
            Some(local_message::Body::PlaceRequest(_) | local_message::Body::FileSizes(_)) => {} // before the lock
            Some(local_message::Body::Register(_)) => {
                warn!(node = %short(name), "ignored a second register")
            }
            Some(local_message::Body::StageJoined(proto::StageJoined { stage: None, .. }))
            | None => {
                warn!(node = %short(name), "ignored an empty message")
            }
        }
        if replied {
            schedule::answered(&mut state, &self.replies);
        }
        if acked {
            enforce::acked(&mut state);
        }
    }

    /// The `stream` of node `name` ended: its stages become orphans, and what the
    /// running cycle waits for from it is owed no longer.
    pub(super) fn detach_node(&self, name: &str, stream: NodeHandle) {
        let mut state = self.lock();
        let last_cycle = state.cycle;
        let Some(node) = state.nodes.get_mut(stream) else {
            return;
        };
        node.detached = true;
        let owed = std::mem::take(&mut node.pending);
        let owed_ack = node.unacked.take().is_some_and(|cycle| cycle == last_cycle);
        warn!(
            node = %short(name),
            stages = node.stages.len(),
            "local controller detached; its stages keep their last rules and their share"
        );
        orphan_stages(node);
        state.nodes.unsettled = true;
        state.cache.invalidate();
        if owed {
            schedule::answered(&mut state, &self.replies);
        }
        if owed_ack {
            enforce::acked(&mut state);
        }
    }
}

/// Takes a node's acknowledgement of the `Enforce` of `cycle` (in a `Usage` or an
/// `Applied`); true if it acknowledges the one sent in `last_cycle`. Only the latest
/// `Enforce` counts: each carries the full rules of its stages, and one not
/// acknowledged in time is superseded by a re-send.
fn node_acked(node: &mut Node, cycle: u64, last_cycle: u64) -> bool {
    if node.unacked.is_some_and(|unacked| cycle >= unacked) {
        return node.unacked.take() == Some(last_cycle);
    }
    false
}

/// Moves a node's stages to its orphans (its stream ended or was replaced).
fn orphan_stages(node: &mut Node) {
    node.jobs.clear();
    for (_, record) in std::mem::take(&mut node.stages) {
        // Stages of one pid (a process that re-exec'd) leave one orphan.
        if let Some(displaced) = node.orphans.insert(record.stage.pid, record) {
            node.stage_bytes -= stage_bytes(&displaced.stage);
        }
    }
    node.orphaned_at.get_or_insert_with(Instant::now);
}

/// Releases the share of orphans not seen again within [`ORPHAN_GRACE`] of `now`, and
/// forgets detached nodes left without any. Walks the nodes only while one may be
/// detached or hold orphans (a walk over 10 000 took milliseconds of every cycle).
pub(super) fn release_expired_orphans(nodes: &mut Nodes, cache: &mut PlanCache, now: Instant) {
    if !nodes.unsettled {
        return;
    }
    let count = nodes.len();
    let mut released = false;
    let mut unsettled = false;
    nodes.retain(|name, node| {
        if node
            .orphaned_at
            .is_some_and(|at| now.saturating_duration_since(at) >= ORPHAN_GRACE)
        {
            if !node.orphans.is_empty() {
                released = true;
                warn!(
                    node = %short(name),
                    stages = node.orphans.len(),
                    "stages gone for {ORPHAN_GRACE:?} are presumed ended; their share is released"
                );
            }
            for (_, orphan) in std::mem::take(&mut node.orphans) {
                node.stage_bytes -= stage_bytes(&orphan.stage);
            }
            node.orphaned_at = None;
        }
        let kept = !(node.detached && node.orphans.is_empty());
        unsettled |= kept && (node.detached || node.orphaned_at.is_some());
        kept
    });
    nodes.unsettled = unsettled;
    if released || nodes.len() != count {
        cache.invalidate();
    }
}

/// One stage of `job` left a node.
fn forget_job(jobs: &mut HashMap<JobKey, usize>, job: JobKey) {
    if let Some(count) = jobs.get_mut(&job) {
        *count -= 1;
        if *count == 0 {
            jobs.remove(&job);
        }
    }
}

/// Updates a stage's usage from a report, and its planner's view if current. Reports
/// name the same resources (by index into the configured ones) in the same order cycle
/// after cycle, so both are updated in place; anything else is rebuilt (and so are the
/// views, next cycle). A report that names a resource not configured, one resource
/// twice, or carries a rate or service times that cannot be, is refused whole.
fn record_usage(
    record: &mut StageRecord,
    reported: &[proto::ResourceUsage],
    configured: &[ResourceConfig],
    cache: &mut PlanCache,
    service: &mut ServiceTimes,
) -> Result<(), BadUsage> {
    for (i, u) in reported.iter().enumerate() {
        let Some(resource) = configured.get(u.resource as usize) else {
            return Err(BadUsage::Resource {
                index: u.resource,
                configured: configured.len(),
            });
        };
        let resource = || resource.resource.clone();
        // Rates are tokens per second: finite, not negative, within what a channel can do.
        if !(u.rate.is_finite() && u.rate >= 0.0 && u.rate <= MAX_REPORTED_RATE) {
            return Err(BadUsage::Rate {
                rate: u.rate,
                resource: resource(),
            });
        }
        if u.latency.len() > BUCKETS {
            return Err(BadUsage::Latency {
                buckets: u.latency.len(),
                resource: resource(),
            });
        }
        // At most one entry per configured resource, so the record cannot grow past them.
        if reported[..i].iter().any(|p| p.resource == u.resource) {
            return Err(BadUsage::Repeated(resource()));
        }
    }
    for u in reported {
        // Within the layout: checked above.
        let _ = service.add(u.resource as usize, &u.latency);
    }
    let usage_of = |u: &proto::ResourceUsage| StageUsage {
        rate: u.rate,
        limit: u.limit,
    };
    let usage = &mut record.usage;
    let same = usage.len() == reported.len()
        && usage
            .iter()
            .zip(reported)
            .all(|(&(r, _), u)| r == u.resource as usize);
    if same {
        for ((_, value), u) in usage.iter_mut().zip(reported) {
            *value = usage_of(u);
        }
        cache.update_usage(&record.slot, usage);
        return Ok(());
    }
    usage.clear();
    usage.extend(reported.iter().map(|u| (u.resource as usize, usage_of(u))));
    cache.invalidate();
    Ok(())
}

/// A usage report refused.
#[derive(Debug, thiserror::Error)]
enum BadUsage {
    /// A resource index past the table sent in `Registered`.
    #[error("resource {index} is not configured (the table has {configured} resources)")]
    Resource { index: u32, configured: usize },
    /// A rate that is no number of tokens per second.
    #[error(
        "rate {rate} of {resource} is not a number of tokens per second (0 to {MAX_REPORTED_RATE})"
    )]
    Rate { rate: f64, resource: Resource },
    /// Service times in more buckets than the layout has.
    #[error("service times of {resource} in {buckets} buckets (the layout has {BUCKETS})")]
    Latency { buckets: usize, resource: Resource },
    /// The same resource twice in one stage's report.
    #[error("{0} reported twice")]
    Repeated(Resource),
}

/// The highest usage rate a report may carry (a channel's maximum rate).
const MAX_REPORTED_RATE: f64 = padll_wire::channel::MAX_RATE as f64;

/// Whether a node may register one more stage: its fields fit, and the node stays
/// within `max_stages_per_node`, `max_jobs_per_node` and
/// [`MAX_STAGE_BYTES_PER_NODE`](crate::bounds::MAX_STAGE_BYTES_PER_NODE). Of the
/// stage's mountpoints, only those the global controller uses are kept
/// ([`keep_used_mountpoints`]).
fn admit_stage(
    state: &State,
    stream: NodeHandle,
    stage: &mut proto::Stage,
) -> Result<(), StageRefused> {
    crate::bounds::check_stage(stage)?;
    if crate::bounds::has_control(&stage.job_id) {
        return Err(StageRefused::JobId);
    }
    keep_used_mountpoints(stage, &state.config.resources);
    let Some(node) = state.nodes.get(stream) else {
        return Ok(()); // dropped later: the stream was replaced
    };
    // What it replaces (the same stage again, or the orphan it is) frees its bytes.
    let freed: usize = node
        .stages
        .get(&stage.stage_id)
        .into_iter()
        .chain(node.orphans.get(&stage.pid))
        .map(|record| stage_bytes(&record.stage))
        .sum();
    let bytes = stage_bytes(stage);
    if node.stage_bytes - freed + bytes > crate::bounds::MAX_STAGE_BYTES_PER_NODE {
        return Err(StageRefused::Bytes {
            held: node.stage_bytes,
            bytes,
        });
    }
    let limits = &state.config.limits;
    if node.stages.contains_key(&stage.stage_id) {
        return Ok(());
    }
    // Orphans count: they hold their place until they re-register (which frees it).
    let held = node.stages.len() + node.orphans.len();
    if held >= limits.max_stages_per_node && !node.orphans.contains_key(&stage.pid) {
        return Err(StageRefused::Stages(held));
    }
    let known = state.jobs.key(&stage.job_id);
    let in_node = known.is_some_and(|key| node.jobs.contains_key(&key));
    if !in_node && node.jobs.len() >= limits.max_jobs_per_node {
        return Err(StageRefused::Jobs(node.jobs.len()));
    }
    Ok(())
}

/// Why a node's new stage is ignored.
#[derive(Debug, thiserror::Error)]
enum StageRefused {
    /// Its fields are too large.
    #[error(transparent)]
    TooLarge(#[from] crate::bounds::StageTooLarge),
    /// Its job id holds control characters (a local controller refuses such a stage:
    /// the id would forge log lines and reach an administrator's terminal).
    #[error("its job id contains control characters")]
    JobId,
    /// The node's stages hold `held` bytes of names and mountpoints; this one's `bytes`
    /// would take them past the budget.
    #[error(
        "its {bytes} bytes of names and mountpoints would take the node's stages past {} \
         bytes (they hold {held})",
        crate::bounds::MAX_STAGE_BYTES_PER_NODE
    )]
    Bytes { held: usize, bytes: usize },
    /// The node holds `max_stages_per_node` stages (this many).
    #[error("the node has {0} stages (max_stages_per_node)")]
    Stages(usize),
    /// The node has stages of `max_jobs_per_node` jobs (this many).
    #[error("the node has stages of {0} jobs (max_jobs_per_node)")]
    Jobs(usize),
}

/// Keeps of `stage`'s mountpoints only those of configured resources, each once: the
/// global controller compares them with nothing else, and keeps a stage's record for as
/// long as it runs (64 mountpoints of 4 KiB a stage, 4096 stages of one node, held a
/// gibibyte). Which resources there are is fixed for the controller's life (`ctl`
/// changes their policy and rate only), so none dropped is needed later.
fn keep_used_mountpoints(stage: &mut proto::Stage, resources: &[ResourceConfig]) {
    let mut used: Vec<String> = Vec::new();
    for mount in std::mem::take(&mut stage.mountpoints) {
        if !used.contains(&mount) && resources.iter().any(|r| r.resource.mount == mount) {
            used.push(mount);
        }
    }
    stage.mountpoints = used;
}
