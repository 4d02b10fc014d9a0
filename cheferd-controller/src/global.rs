//! `cheferd global`: the global controller (PADLL paper §III-B).
//!
//! Local controllers attach over gRPC (one bidirectional stream each). Each pushes the
//! usage of its stages once per interval, in a slot [`report_lead`] before the global
//! tick (the global controller tells it when in a `Schedule`), so a cycle finds usage
//! already there instead of paying a Collect → Usage round trip per local controller.
//! Every `interval_ms` the control loop runs one cycle:
//!
//! 1. **collect** — wait (bounded) only for local controllers whose report for this
//!    cycle is due and has not arrived (none, in steady state); re-schedule those whose
//!    reports arrive outside their slot;
//! 2. **compute** — [`crate::plan::compute`]: a policy per resource over the jobs (stages
//!    with the same job id are one job, whatever their node);
//! 3. **enforce** — queue for each local controller the full rules of those of its
//!    stages whose rules changed (rules are declarative and stages keep them, so
//!    unchanged ones are not re-sent). `Applied` is not waited for: acks are tracked as
//!    they come, and a local controller that has not acknowledged by the next cycle is
//!    logged, shown in the snapshot, and sent all its stages' rules again;
//! 4. **sleep** until the next tick.
//!
//! The cycle latency is from the tick until the last `Enforce` is queued on its stream
//! (tonic encodes and writes it right after); the time until every `Applied` arrived is
//! recorded apart ([`Phases::acked`]).
//!
//! A stage that joins between cycles gets a provisional rule at once (1 % of `Max_R`
//! for a new job, its job's current share otherwise), so no one runs unthrottled until
//! the next cycle. A local controller that disappears leaves its stages running on their
//! last rules (fail-static), so they stay in the plan as *orphans* with their last usage
//! — their share is not handed to anyone else — until they re-register (matched by pid;
//! they keep their rules, so they get no provisional ones) or for [`ORPHAN_GRACE`]
//! (then they are presumed gone with their node).

use crate::config::{GlobalConfig, ScheduledRule};
use crate::outbox;
use crate::plan::{self, JobKey, JobShare, JobTerms, Share, StageUsage, StageView};
use crate::policy::PolicyRunner;
use crate::proto::{self, global_message, local_message, GlobalMessage, LocalMessage};
use crate::usage::Resource;
use padll_wire::ops::Class;
use prost::Message;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

/// Share of `Max_R` a stage of a brand-new job gets until the next cycle.
const PROVISIONAL_SHARE: f64 = 0.01;
/// Cycles kept for statistics.
const LATENCY_HISTORY: usize = 1000;
/// The latest a usage report is scheduled to arrive before the tick it is for.
const MAX_REPORT_LEAD: Duration = Duration::from_millis(100);
/// How long the stages of a detached local controller keep their place in the plan. A
/// restarted local controller re-attaches at once and its stages reconnect within their
/// 5 s backoff; a stage missing for longer is presumed gone with its node.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(30);

type Outbox = outbox::Sender<Result<GlobalMessage, Status>>;

struct Node {
    session: u64,
    outbox: Outbox,
    stages: BTreeMap<u64, StageRecord>,
    /// Its stream ended.
    detached: bool,
    /// The first cycle whose usage report is due under its current schedule (later
    /// cycles' reports follow one per interval).
    due: u64,
    /// The cycle its latest report was for, and when that arrived.
    reported: u64,
    reported_at: Option<Instant>,
    /// The cycle of the latest `Enforce` it has not acknowledged.
    unacked: Option<u64>,
    /// Stages of an ended stream of this node, by pid, that have not re-registered: they
    /// run on their last rules, so they keep their share (no rules can reach them).
    orphans: BTreeMap<u32, StageRecord>,
    /// When the stream that left the orphans ended.
    orphaned_at: Option<Instant>,
    /// The running collect waits for its report.
    pending: bool,
    bytes_in: u64,
    bytes_out: u64,
    /// Its stages per job (for `max_jobs_per_node`).
    jobs: HashMap<JobKey, usize>,
    /// Its report for the last cycle it was due was missing, and none came since.
    missed: bool,
}

/// A registered stage.
struct StageRecord {
    stage: proto::Stage,
    /// Its job id, interned.
    job: JobKey,
    /// Its last reported usage per resource (updated in place: reports of a stage
    /// name the same resources cycle after cycle).
    usage: Vec<(Resource, StageUsage)>,
    /// The rates (per configured resource, 0 = no rule) it was last sent; empty until
    /// it was sent any. While the views are current, [`State::sent`] has them instead
    /// (they are copied back before the views are rebuilt).
    sent: Vec<u64>,
    /// Its index in [`State::views`] (while those are current; `usize::MAX` for a
    /// record made since they were built).
    view: usize,
}

/// Durations of the phases of one cycle, and how many local controllers were sent
/// rules in it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    /// The cycle.
    pub cycle: u64,
    /// From the tick until every report due for this cycle arrived (or the deadline).
    pub collect: Duration,
    /// Planning, and encoding and queueing the rules.
    pub compute: Duration,
    /// The cycle latency: from the tick until the last `Enforce` was queued on its
    /// stream (collect + compute).
    pub latency: Duration,
    /// Local controllers sent an `Enforce`.
    pub enforced: usize,
    /// From the tick until every local controller sent an `Enforce` acknowledged it (or
    /// detached); `None` while some have not, and for cycles that sent none.
    pub acked: Option<Duration>,
}

struct State {
    config: GlobalConfig,
    policies: HashMap<Resource, PolicyRunner>,
    nodes: BTreeMap<String, Node>,
    /// Job ids interned to the planner's keys (never forgotten: policies keep state by
    /// key). `job_names[key]` is the id.
    job_keys: HashMap<String, JobKey>,
    job_names: Vec<String>,
    next_session: u64,
    cycle: u64,
    shares: Vec<Share>,
    /// The planner's view of every stage, in [`stage_views`] order, kept between cycles
    /// (rebuilding it cost ≈ 0.4 ms a cycle at 4 000 stages): usage reports update it in
    /// place; `None` once a stage or node came or went (rare), until the next cycle
    /// rebuilds it.
    views: Option<Vec<StageView>>,
    /// Where the views' usage of each resource is, resolved when they were built.
    layout: plan::Layout,
    /// What each stage was last sent, in view order, while the views are current.
    sent: Sent,
    /// The last cycles, oldest first.
    history: VecDeque<Phases>,
    /// Every cycle's latency since start, for the metrics endpoint.
    latency: crate::metrics::LatencyHistogram,
    /// The last cycle's tick, and the next one expected.
    tick: Option<Instant>,
    next_tick: Option<Instant>,
    /// The cycle whose reports the running collect waits for, and from how many nodes
    /// still.
    collecting: Option<u64>,
    awaiting: usize,
    /// Nodes sent the last cycle's `Enforce` that have not acknowledged it.
    unacked: usize,
}

impl State {
    fn intern(&mut self, job: &str) -> JobKey {
        if let Some(&key) = self.job_keys.get(job) {
            return key;
        }
        let key = self.job_names.len() as JobKey;
        self.job_names.push(job.to_string());
        self.job_keys.insert(job.to_string(), key);
        key
    }
}

/// The global controller: registry, policies and the control loop.
pub struct Controller {
    state: Mutex<State>,
    replies: Notify,
    started: Instant,
    /// The placement service (`[placement]`), if configured.
    placement: Option<crate::placement_service::PlacementService>,
}

impl Controller {
    /// A controller for `config` (its policies are built here; names were validated
    /// when the configuration was parsed).
    pub fn new(config: GlobalConfig) -> Result<Arc<Controller>, String> {
        let mut policies = HashMap::new();
        for r in &config.resources {
            policies.insert(
                r.resource.clone(),
                PolicyRunner::new(&r.policy).map_err(|e| format!("{}: {e}", r.resource))?,
            );
        }
        let placement = config
            .placement
            .clone()
            .map(crate::placement_service::PlacementService::new)
            .transpose()?;
        Ok(Arc::new(Controller {
            placement,
            state: Mutex::new(State {
                config,
                policies,
                nodes: BTreeMap::new(),
                job_keys: HashMap::new(),
                job_names: Vec::new(),
                next_session: 1,
                cycle: 0,
                shares: Vec::new(),
                views: None,
                layout: plan::Layout::default(),
                sent: Sent::default(),
                history: VecDeque::new(),
                latency: Default::default(),
                tick: None,
                next_tick: None,
                collecting: None,
                awaiting: 0,
                unacked: 0,
            }),
            replies: Notify::new(),
            started: Instant::now(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The control loop: runs cycles forever at the configured interval.
    pub async fn run_loop(self: Arc<Self>) {
        loop {
            let interval = Duration::from_millis(self.lock().config.interval_ms);
            let next = tokio::time::Instant::now() + interval;
            self.cycle().await;
            tokio::time::sleep_until(next).await;
        }
    }

    /// One collect → compute → enforce cycle, ticking now (the next tick is expected one
    /// interval later: reports are scheduled for it); returns its latency.
    pub async fn cycle(&self) -> Duration {
        let started = Instant::now();
        let (cycle, interval) = {
            let mut state = self.lock();
            let nodes = state.nodes.len();
            let mut released = false;
            state.nodes.retain(|name, node| {
                if node.orphaned_at.is_some_and(|at| at.elapsed() >= ORPHAN_GRACE) {
                    if !node.orphans.is_empty() {
                        released = true;
                        warn!(
                            node = %name,
                            stages = node.orphans.len(),
                            "stages gone for {ORPHAN_GRACE:?} are presumed ended; their share is released"
                        );
                    }
                    node.orphans.clear();
                    node.orphaned_at = None;
                }
                !(node.detached && node.orphans.is_empty())
            });
            if released || state.nodes.len() != nodes {
                state.views = None;
            }
            let interval = Duration::from_millis(state.config.interval_ms);
            state.cycle += 1;
            state.tick = Some(started);
            state.next_tick = Some(started + interval);
            let cycle = state.cycle;
            let mut awaiting = 0;
            for node in state.nodes.values_mut().filter(|n| !n.detached) {
                // A node that missed its last report (one that never reports, say) is
                // not waited for again until it reports: it cannot stall every cycle.
                node.pending = node.due <= cycle && node.reported < cycle && !node.missed;
                awaiting += node.pending as usize;
            }
            state.collecting = Some(cycle);
            state.awaiting = awaiting;
            (cycle, interval)
        };
        let deadline = tokio::time::Instant::now() + (interval / 2).min(Duration::from_millis(500));
        self.wait_for_replies(deadline).await;

        let collected = Instant::now();
        let mut state = self.lock();
        state.collecting = None;
        reschedule_off_slot(&mut state, cycle, started, interval);
        let elapsed = self.started.elapsed().as_secs_f64();
        let State {
            config,
            policies,
            nodes,
            job_keys,
            views,
            layout,
            sent,
            ..
        } = &mut *state;
        let terms = JobTerms {
            settings: job_settings(config, job_keys),
            limits: static_limits(config, job_keys, elapsed),
        };
        let views = views.get_or_insert_with(|| {
            let views = stage_views(nodes, sent, config.resources.len());
            *layout = plan::Layout::new(config, &views);
            views
        });
        let plan = plan::compute_with(config, &terms, policies, views, layout);
        let sent = enforce(config, nodes, &plan, sent, cycle);
        state.shares = plan.shares;
        state.unacked = sent;
        let latency = started.elapsed();
        if state.history.len() == LATENCY_HISTORY {
            state.history.pop_front();
        }
        state.latency.observe(latency);
        state.history.push_back(Phases {
            cycle,
            collect: collected - started,
            compute: latency - (collected - started),
            latency,
            enforced: sent,
            acked: None,
        });
        debug!(cycle, latency_us = latency.as_micros() as u64, "cycle done");
        latency
    }

    /// Waits until every awaited report arrived, or the deadline.
    async fn wait_for_replies(&self, deadline: tokio::time::Instant) {
        loop {
            let notified = self.replies.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().awaiting == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }

    /// Counts an awaited report (once per node and cycle).
    fn answered(state: &mut State, replies: &Notify) {
        state.awaiting = state.awaiting.saturating_sub(1);
        if state.awaiting == 0 {
            replies.notify_waiters();
        }
    }

    /// Counts an acknowledgement of the last cycle's `Enforce` (once per node); the last
    /// one dates the cycle's [`Phases::acked`].
    fn acked(state: &mut State) {
        state.unacked = state.unacked.saturating_sub(1);
        if state.unacked > 0 {
            return;
        }
        let since_tick = state.tick.map(|tick| tick.elapsed());
        let cycle = state.cycle;
        if let Some(last) = state.history.back_mut().filter(|p| p.cycle == cycle) {
            last.acked = since_tick;
        }
    }

    fn attach_node(&self, name: &str, outbox: Outbox) -> Result<u64, Status> {
        let mut state = self.lock();
        let max_nodes = state.config.limits.max_nodes;
        if !state.nodes.contains_key(name) && state.nodes.len() >= max_nodes {
            crate::limited_warn!(
                GRPC_LOG,
                node = %padll_wire::control::short(name),
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
                    })
                    .collect(),
            })),
        };
        let _ = outbox.send(Ok(registered));
        let mut node = Node {
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
        };
        if let Some(mut previous) = state.nodes.remove(name) {
            if previous.detached {
                info!(node = name, "re-attached; its stages re-register");
            } else {
                warn!(
                    node = name,
                    "node re-attached; its previous stream is replaced"
                );
                orphan_stages(&mut previous);
            }
            node.orphans = previous.orphans;
            node.orphaned_at = previous.orphaned_at;
        }
        let (cycle, report_in) = next_slot(&state, Instant::now());
        schedule(&mut node, cycle, report_in, interval_ms);
        state.nodes.insert(name.to_string(), node);
        state.views = None;
        info!(node = name, "local controller attached");
        Ok(session)
    }

    fn handle(&self, name: &str, session: u64, message: LocalMessage) {
        let size = message.encoded_len() as u64;
        // Placement reads its feed: chosen outside the state lock.
        let placed = match (&message.body, &self.placement) {
            (Some(local_message::Body::PlaceRequest(request)), Some(service)) => {
                Some((request.request, service.answer(request)))
            }
            (Some(local_message::Body::PlaceRequest(request)), None) => {
                Some((request.request, Vec::new()))
            }
            _ => None,
        };
        let mut state = self.lock();
        if let Some((request, targets)) = placed {
            if let Some(node) = state.nodes.get_mut(name).filter(|n| n.session == session) {
                node.bytes_in += size;
                let reply =
                    global_message::Body::PlaceReply(proto::PlaceReply { request, targets });
                let _ = node.outbox.send(Ok(GlobalMessage { body: Some(reply) }));
            }
            return;
        }
        let mut job = 0;
        // A stage re-registering after its local controller came back still runs on its
        // last rules: it needs no provisional ones.
        let mut provisional = None;
        if let Some(local_message::Body::StageJoined(proto::StageJoined { stage: Some(stage) })) =
            &message.body
        {
            if let Err(why) = admit_stage(&state, name, session, stage) {
                crate::limited_warn!(
                    GRPC_LOG,
                    node = %name,
                    stage = stage.stage_id,
                    "ignored a stage: {why}"
                );
                if let Some(node) = state.nodes.get_mut(name).filter(|n| n.session == session) {
                    node.bytes_in += size;
                }
                return;
            }
            job = state.intern(&stage.job_id);
            if !state
                .nodes
                .get(name)
                .is_some_and(|n| n.orphans.contains_key(&stage.pid))
            {
                provisional = Some(provisional_rates(&state, stage, job));
            }
        }
        let config = &state.config;
        let provisional = provisional.map(|rates| (rules(config, &rates), rates));
        let resources: Vec<Resource> = match &message.body {
            Some(local_message::Body::Usage(_)) => config
                .resources
                .iter()
                .map(|r| r.resource.clone())
                .collect(),
            _ => Vec::new(),
        };
        let collecting = state.collecting;
        let last_cycle = state.cycle;
        let mut replied = false;
        let mut acked = false;
        let State { nodes, views, .. } = &mut *state;
        let Some(node) = nodes.get_mut(name).filter(|n| n.session == session) else {
            return;
        };
        node.bytes_in += size;
        match message.body {
            Some(local_message::Body::StageJoined(proto::StageJoined { stage: Some(stage) })) => {
                debug!(node = name, stage = stage.stage_id, job = %stage.job_id, "stage joined");
                let stage_id = stage.stage_id;
                // Its usage carries over, so the next split treats it as before; its rules
                // are sent again (the ones it runs on may predate the last ones planned).
                let usage = node
                    .orphans
                    .remove(&stage.pid)
                    .map(|orphan| orphan.usage)
                    .unwrap_or_default();
                let mut record = StageRecord {
                    stage,
                    job,
                    usage,
                    sent: Vec::new(),
                    view: usize::MAX,
                };
                if let Some((rules, rates)) = provisional.filter(|(r, _)| !r.is_empty()) {
                    let enforce = GlobalMessage {
                        body: Some(global_message::Body::Enforce(proto::Enforce {
                            cycle: 0,
                            stages: vec![proto::StageRules { stage_id, rules }],
                        })),
                    };
                    if node.outbox.send(Ok(enforce)).is_ok() {
                        record.sent = rates;
                    }
                }
                *node.jobs.entry(job).or_insert(0) += 1;
                if let Some(old) = node.stages.insert(stage_id, record) {
                    forget_job(&mut node.jobs, old.job);
                }
                *views = None;
            }
            Some(local_message::Body::StageLeft(proto::StageLeft { stage_id })) => {
                if let Some(old) = node.stages.remove(&stage_id) {
                    forget_job(&mut node.jobs, old.job);
                }
                *views = None;
            }
            Some(local_message::Body::Usage(usage)) => {
                for stage in &usage.stages {
                    if let Some(record) = node.stages.get_mut(&stage.stage_id) {
                        if let Err(why) = record_usage(record, &stage.resources, &resources, views)
                        {
                            crate::limited_warn!(
                                GRPC_LOG,
                                node = %name,
                                stage = stage.stage_id,
                                "ignored a usage report: {why}"
                            );
                        }
                    }
                }
                node.reported = usage.cycle;
                node.reported_at = Some(Instant::now());
                node.missed = false;
                if node.pending && collecting.is_some_and(|cycle| usage.cycle >= cycle) {
                    node.pending = false;
                    replied = true;
                }
            }
            Some(local_message::Body::Applied(applied)) => {
                // Only the latest Enforce counts: each carries the full rules of its
                // stages, and one not acknowledged in time is superseded by a re-send.
                if node.unacked.is_some_and(|cycle| applied.cycle >= cycle) {
                    acked = node.unacked.take() == Some(last_cycle);
                }
            }
            Some(local_message::Body::PlaceRequest(_)) => {} // answered before the lock
            Some(local_message::Body::Register(_)) => {
                warn!(node = name, "ignored a second register")
            }
            Some(local_message::Body::StageJoined(proto::StageJoined { stage: None })) | None => {
                warn!(node = name, "ignored an empty message")
            }
        }
        if replied {
            Self::answered(&mut state, &self.replies);
        }
        if acked {
            Self::acked(&mut state);
        }
    }

    fn detach_node(&self, name: &str, session: u64) {
        let mut state = self.lock();
        let last_cycle = state.cycle;
        let Some(node) = state.nodes.get_mut(name).filter(|n| n.session == session) else {
            return;
        };
        node.detached = true;
        let owed = std::mem::take(&mut node.pending);
        let owed_ack = node.unacked.take().is_some_and(|cycle| cycle == last_cycle);
        warn!(
            node = name,
            stages = node.stages.len(),
            "local controller detached; its stages keep their last rules and their share"
        );
        orphan_stages(node);
        state.views = None;
        if owed {
            Self::answered(&mut state, &self.replies);
        }
        if owed_ack {
            Self::acked(&mut state);
        }
    }

    /// Feeds one stream's messages through what `Attach` does with them after the TLS
    /// check (the register check, attach, each message, detach), without a network:
    /// for the fuzz targets (`padll-wire/fuzz`). Returns the stream's refusal, if any.
    #[doc(hidden)]
    pub fn feed_stream(
        &self,
        messages: impl IntoIterator<Item = LocalMessage>,
    ) -> Result<(), Status> {
        let mut messages = messages.into_iter();
        let name = register_name(messages.next())?;
        let (outbox, receiver) = outbox::channel();
        let session = self.attach_node(&name, outbox)?;
        for message in messages {
            self.handle(&name, session, message);
        }
        self.detach_node(&name, session);
        drop(receiver);
        Ok(())
    }

    /// A consistent view of the registry and the last cycle, for the admin CLI and
    /// the metrics endpoint.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        let mut latencies: Vec<f64> = state
            .history
            .iter()
            .map(|p| p.latency.as_secs_f64() * 1e3)
            .collect();
        latencies.sort_by(f64::total_cmp);
        Snapshot {
            cycle: state.cycle,
            uptime_s: self.started.elapsed().as_secs_f64(),
            interval_ms: state.config.interval_ms,
            resources: state
                .config
                .resources
                .iter()
                .map(|r| ResourceSnapshot {
                    resource: r.resource.to_string(),
                    max_rate: r.max_rate,
                    policy: state
                        .policies
                        .get(&r.resource)
                        .map_or_else(|| r.policy.clone(), |p| p.name()),
                })
                .collect(),
            nodes: state
                .nodes
                .iter()
                .map(|(name, node)| NodeSnapshot {
                    node: name.clone(),
                    attached: !node.detached,
                    stages: node.stages.len(),
                    orphans: node.orphans.len(),
                    unacked_cycle: node.unacked,
                    bytes_in: node.bytes_in,
                    bytes_out: node.bytes_out,
                })
                .collect(),
            stages: state
                .nodes
                .iter()
                .flat_map(|(name, node)| {
                    node.stages.values().map(move |record| {
                        let s = &record.stage;
                        StageSnapshot {
                            node: name.clone(),
                            stage_id: s.stage_id,
                            job: s.job_id.clone(),
                            job_size: s.job_size,
                            pid: s.pid,
                            uid: s.uid,
                            name: s.stage_name.clone(),
                            mountpoints: s.mountpoints.clone(),
                            usage: record
                                .usage
                                .iter()
                                .map(|(r, v)| (r.to_string(), v.rate))
                                .collect(),
                        }
                    })
                })
                .collect(),
            shares: job_shares(&state),
            latency_ms_p50: percentile(&latencies, 0.5),
            latency_ms_p99: percentile(&latencies, 0.99),
            latency_ms_last: state
                .history
                .back()
                .map_or(0.0, |p| p.latency.as_secs_f64() * 1e3),
        }
    }

    /// What the metrics endpoint shows: the snapshot and every cycle's latency.
    pub fn metrics(&self) -> (Snapshot, crate::metrics::LatencyHistogram) {
        let latency = self.lock().latency.clone();
        (self.snapshot(), latency)
    }

    /// The phases of the last `cycles` cycles (at most the last 1000), oldest first.
    pub fn phases(&self, cycles: usize) -> Vec<Phases> {
        let state = self.lock();
        let skip = state.history.len().saturating_sub(cycles);
        state.history.iter().skip(skip).copied().collect()
    }

    /// The configuration in force (for `ctl dump`).
    pub fn config(&self) -> GlobalConfig {
        self.lock().config.clone()
    }

    /// Applies an administrative change (validated first; nothing changes on error).
    pub fn change(&self, change: Change) -> Result<String, String> {
        let mut state = self.lock();
        let find = |state: &State, name: &str| -> Result<Resource, String> {
            let resource = Resource::parse(name)?;
            if state
                .config
                .resources
                .iter()
                .any(|r| r.resource == resource)
            {
                Ok(resource)
            } else {
                Err(format!("'{name}' is not a configured resource"))
            }
        };
        match change {
            Change::Policy { resource, policy } => {
                let resource = find(&state, &resource)?;
                let runner = PolicyRunner::new(&policy)?;
                state.policies.insert(resource.clone(), runner);
                for r in state
                    .config
                    .resources
                    .iter_mut()
                    .filter(|r| r.resource == resource)
                {
                    r.policy = policy.clone();
                }
                Ok(format!("{resource}: policy {policy}"))
            }
            Change::MaxRate { resource, rate } => {
                let resource = find(&state, &resource)?;
                let value = crate::config::rate_of("max_rate", &rate, &resource)?;
                for r in state
                    .config
                    .resources
                    .iter_mut()
                    .filter(|r| r.resource == resource)
                {
                    r.max_rate = value;
                }
                Ok(format!("{resource}: Max_R {value}"))
            }
            Change::Job {
                job,
                priority,
                resource,
                demand,
                limit,
            } => {
                // A typo must not silently configure a job that will never run.
                let known = state.config.jobs.contains_key(&job)
                    || state
                        .nodes
                        .values()
                        .any(|n| n.stages.values().any(|s| s.stage.job_id == job));
                if !known {
                    return Err(format!(
                        "unknown job '{job}': it is neither configured nor running (add it to the configuration file to set it before it starts)"
                    ));
                }
                let mut settings = state.config.job(&job);
                if let Some(p) = priority {
                    if !(p > 0.0 && p.is_finite()) {
                        return Err(format!("priority {p} must be positive"));
                    }
                    settings.priority = p;
                }
                if demand.is_some() || limit.is_some() {
                    let name = resource.ok_or("--resource is needed with --demand or --limit")?;
                    let r = find(&state, &name)?;
                    if let Some(d) = demand {
                        settings
                            .demand
                            .insert(r.clone(), crate::config::rate_of("demand", &d, &r)?);
                    }
                    match limit.as_deref() {
                        Some("none") => {
                            settings.limit.remove(&r);
                        }
                        Some(l) => {
                            let value = crate::config::rate_of("limit", l, &r)?;
                            settings.limit.insert(r, value);
                        }
                        None => {}
                    }
                }
                state.config.jobs.insert(job.clone(), settings);
                Ok(format!("job {job} updated"))
            }
        }
    }
}

/// An administrative change.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
#[serde(tag = "change", rename_all = "snake_case", deny_unknown_fields)]
pub enum Change {
    /// Switch a resource's policy (its state starts afresh).
    Policy {
        /// `MOUNT:CLASS`.
        resource: String,
        /// Policy name.
        policy: String,
    },
    /// Change a resource's capacity.
    MaxRate {
        /// `MOUNT:CLASS`.
        resource: String,
        /// A rate (`110k`, `20GiB/s`).
        rate: String,
    },
    /// Change a job's priority, or its demand / static limit on a resource.
    Job {
        /// Job id.
        job: String,
        /// New priority.
        priority: Option<f64>,
        /// The resource for `demand` / `limit`.
        resource: Option<String>,
        /// New demand.
        demand: Option<String>,
        /// New static limit, or `none`.
        limit: Option<String>,
    },
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Each interned job's configured settings, by key.
fn job_settings<'a>(
    config: &'a GlobalConfig,
    keys: &HashMap<String, JobKey>,
) -> Vec<Option<&'a crate::config::JobConfig>> {
    let mut settings = Vec::new();
    for (job, terms) in &config.jobs {
        // A configured job no stage ever ran has no key, and nothing to plan.
        if let Some(&key) = keys.get(job) {
            let key = key as usize;
            if settings.len() <= key {
                settings.resize(key + 1, None);
            }
            settings[key] = Some(terms);
        }
    }
    settings
}

/// Static limits in force `elapsed` seconds after start, by job key and resource index:
/// the configuration's, then the scheduled rules that have come due, in time order.
fn static_limits(
    config: &GlobalConfig,
    keys: &HashMap<String, JobKey>,
    elapsed: f64,
) -> HashMap<(JobKey, usize), f64> {
    // Limits of jobs no stage ever ran, or of unconfigured resources, apply to nothing.
    let key = |job: &str, resource: &Resource| {
        let index = config
            .resources
            .iter()
            .position(|r| &r.resource == resource)?;
        Some((*keys.get(job)?, index))
    };
    let mut limits = HashMap::new();
    for (job, settings) in &config.jobs {
        for (resource, limit) in &settings.limit {
            if let Some(key) = key(job, resource) {
                limits.insert(key, *limit);
            }
        }
    }
    for ScheduledRule {
        job,
        resource,
        limit,
        ..
    } in config.rules.iter().filter(|r| r.at <= elapsed)
    {
        let Some(key) = key(job, resource) else {
            continue;
        };
        match limit {
            Some(l) => limits.insert(key, *l),
            None => limits.remove(&key),
        };
    }
    limits
}

/// Moves a node's stages to its orphans (its stream ended or was replaced).
fn orphan_stages(node: &mut Node) {
    node.jobs.clear();
    for (_, record) in std::mem::take(&mut node.stages) {
        node.orphans.insert(record.stage.pid, record);
    }
    node.orphaned_at.get_or_insert_with(Instant::now);
}

/// The planner's view of every stage, in the order [`enforce`] walks too: node by node,
/// its live stages then its orphans (in the plan, but unreachable). Notes each record's
/// index in it.
/// `sent` is brought back into the records (for those it has: from the previous views),
/// then made anew from them for the new views.
fn stage_views(
    nodes: &mut BTreeMap<String, Node>,
    sent: &mut Sent,
    resources: usize,
) -> Vec<StageView> {
    let mut views = Vec::new();
    let previous = std::mem::take(sent);
    for (index, node) in nodes.values_mut().enumerate() {
        for record in node.stages.values_mut().chain(node.orphans.values_mut()) {
            if let Some(rates) = previous.rates_of(record.view, resources) {
                record.sent.clear();
                if rates.first() != Some(&NOT_SENT) {
                    record.sent.extend_from_slice(rates);
                }
            }
            sent.ids.push(record.stage.stage_id);
            if record.sent.len() == resources {
                sent.rates.extend_from_slice(&record.sent);
            } else {
                sent.rates.extend(std::iter::repeat_n(NOT_SENT, resources));
            }
            record.view = views.len();
            views.push(StageView {
                node: index,
                job: record.job,
                uid: record.stage.uid,
                gid: record.stage.gid,
                job_size: record.stage.job_size,
                mountpoints: record.stage.mountpoints.clone(),
                usage: record.usage.clone(),
            });
        }
    }
    views
}

/// Marks rates never sent (no rate is this high).
const NOT_SENT: u64 = u64::MAX;

/// The rates every stage was last sent and its id, in view order: the check of which
/// rules changed reads these two flat vectors instead of every stage's record (most of
/// a cycle's cache misses at 1 000 local controllers).
#[derive(Default)]
struct Sent {
    /// `rates[view * resources..]`: one per configured resource, or all [`NOT_SENT`].
    rates: Vec<u64>,
    /// The stage ids.
    ids: Vec<u64>,
}

impl Sent {
    fn rates_of(&self, view: usize, resources: usize) -> Option<&[u64]> {
        if view >= self.ids.len() {
            return None;
        }
        Some(&self.rates[view * resources..(view + 1) * resources])
    }
}

/// Sends each attached node the rules of those of its live stages whose rates changed
/// since they were last sent — of all its live stages if it did not acknowledge the
/// last ones; returns how many nodes were sent an `Enforce`.
fn enforce(
    config: &GlobalConfig,
    nodes: &mut BTreeMap<String, Node>,
    plan: &plan::Plan,
    sent: &mut Sent,
    cycle: u64,
) -> usize {
    let resources = config.resources.len();
    let mut index = 0;
    // Every message is built before any is queued: a queued message wakes the task
    // that encodes and writes it, whose work on the other core slowed the building of
    // the rest down.
    let mut messages = Vec::with_capacity(nodes.len());
    for (name, node) in nodes.iter_mut() {
        let live = index..index + node.stages.len();
        index = live.end + node.orphans.len();
        let range = live.start * resources..live.end * resources;
        if let Some(unacked) = node.unacked.take() {
            // Rules may have been lost with it (a stalled stream): the declarative
            // full set again costs little and cannot do harm.
            warn!(
                node = %name,
                cycle = unacked,
                "no acknowledgement of its rules within a cycle; sending them all again"
            );
            sent.rates[range.clone()].fill(NOT_SENT);
        }
        if sent.rates[range.clone()] == plan.rates[range] {
            continue;
        }
        let mut changed = Vec::with_capacity(live.len());
        for i in live {
            let rates = plan.stage_rates(i, resources);
            let last = &mut sent.rates[i * resources..(i + 1) * resources];
            if last != rates {
                last.copy_from_slice(rates);
                changed.push(proto::StageRules {
                    stage_id: sent.ids[i],
                    rules: rules(config, rates),
                });
            }
        }
        if changed.is_empty() || node.detached {
            continue;
        }
        let enforce = GlobalMessage {
            body: Some(global_message::Body::Enforce(proto::Enforce {
                cycle,
                stages: changed,
            })),
        };
        node.bytes_out += enforce.encoded_len() as u64;
        messages.push((node, enforce));
    }
    // Likewise, all are queued before any stream's task is woken.
    let mut wakers = Vec::with_capacity(messages.len());
    let mut sent = 0;
    for (node, enforce) in messages {
        if let Ok(waker) = node.outbox.queue(Ok(enforce)) {
            wakers.extend(waker);
            node.unacked = Some(cycle);
            sent += 1;
        }
    }
    for waker in wakers {
        waker.wake();
    }
    sent
}

/// How long before a tick the usage reports for it are scheduled to arrive: time for
/// them to be received, and no older than needed.
fn report_lead(interval: Duration) -> Duration {
    (interval / 4).min(MAX_REPORT_LEAD)
}

/// The first report slot (a lead before a tick) that a node told now can still make:
/// the cycle of that tick and the time until the slot.
fn next_slot(state: &State, now: Instant) -> (u64, Duration) {
    let interval = Duration::from_millis(state.config.interval_ms);
    let lead = report_lead(interval);
    let Some(mut tick) = state.next_tick else {
        // No cycle has run: the first one is about to, unscheduled; report for the
        // one after it (re-scheduled onto its slot after the first cycles if early).
        return (state.cycle + 2, interval - lead);
    };
    let mut cycle = state.cycle + 1;
    // Half a lead for the schedule to reach the node and the report to come back.
    while tick < now + lead + lead / 2 {
        tick += interval;
        cycle += 1;
    }
    (cycle, tick - lead - now)
}

/// Tells a node when to report, starting with `cycle`'s report in `report_in`.
fn schedule(node: &mut Node, cycle: u64, report_in: Duration, interval_ms: u64) {
    node.due = cycle;
    let schedule = GlobalMessage {
        body: Some(global_message::Body::Schedule(proto::Schedule {
            cycle,
            report_in_ms: report_in.as_millis() as u64,
            interval_ms,
        })),
    };
    node.bytes_out += schedule.encoded_len() as u64;
    let _ = node.outbox.send(Ok(schedule));
}

/// Re-schedules the nodes whose report for `cycle` missed its slot: it came after the
/// tick (the cycle waited for it), not at all, or more than half an interval early
/// (its usage would be stale). Clocks of different machines drift, and a node's
/// first slot may be a guess.
fn reschedule_off_slot(state: &mut State, cycle: u64, tick: Instant, interval: Duration) {
    let now = Instant::now();
    let (next, report_in) = next_slot(state, now);
    let interval_ms = state.config.interval_ms;
    for (name, node) in state.nodes.iter_mut() {
        if node.detached || node.due > cycle {
            continue;
        }
        let in_slot = node.reported >= cycle
            && node
                .reported_at
                .is_some_and(|at| at <= tick && tick - at <= interval / 2);
        node.missed = node.reported < cycle;
        if !in_slot {
            debug!(node = %name, cycle, "usage report off its slot; re-scheduled");
            schedule(node, next, report_in, interval_ms);
        }
        node.pending = false;
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
/// name the same resources in the same order cycle after cycle, so both are updated in
/// place; anything else is rebuilt (and so are the views, next cycle).
fn record_usage(
    record: &mut StageRecord,
    reported: &[proto::ResourceUsage],
    configured: &[Resource],
    views: &mut Option<Vec<StageView>>,
) -> Result<(), String> {
    // Rates are tokens per second: finite, not negative, within what a channel can do.
    if let Some(bad) = reported
        .iter()
        .find(|u| !(u.rate.is_finite() && u.rate >= 0.0 && u.rate <= MAX_REPORTED_RATE))
    {
        return Err(format!(
            "rate {} of {}:{} is not a number of tokens per second (0 to {MAX_REPORTED_RATE})",
            bad.rate,
            padll_wire::control::short(&bad.mount),
            padll_wire::control::short(&bad.class)
        ));
    }
    // Only configured resources are kept (a report cannot make the record grow).
    let reported: Vec<&proto::ResourceUsage> = reported
        .iter()
        .filter(|u| {
            configured
                .iter()
                .any(|r| r.mount == u.mount && r.class.name() == u.class)
        })
        .collect();
    let reported = &reported[..];
    let usage = &mut record.usage;
    let same = usage.len() == reported.len()
        && usage
            .iter()
            .zip(reported)
            .all(|((r, _), u)| r.mount == u.mount && r.class.name() == u.class);
    if same {
        for ((_, value), u) in usage.iter_mut().zip(reported) {
            *value = StageUsage {
                rate: u.rate,
                limit: u.limit,
            };
        }
        if let Some(view) = views.as_mut().and_then(|v| v.get_mut(record.view)) {
            for ((_, value), (_, u)) in view.usage.iter_mut().zip(usage.iter()) {
                *value = *u;
            }
        }
        return Ok(());
    }
    usage.clear();
    usage.extend(reported.iter().filter_map(|r| {
        Some((
            Resource {
                mount: r.mount.clone(),
                class: Class::from_name(&r.class)?,
            },
            StageUsage {
                rate: r.rate,
                limit: r.limit,
            },
        ))
    }));
    *views = None;
    Ok(())
}

/// The highest usage rate a report may carry (a channel's maximum rate).
const MAX_REPORTED_RATE: f64 = padll_wire::channel::MAX_RATE as f64;

/// Warnings caused by what gRPC peers sent: at most 20 lines per 5 s.
static GRPC_LOG: crate::bounds::LogLimit = crate::bounds::LogLimit::new(20, Duration::from_secs(5));

/// Whether a node may register one more stage: its fields fit, and the node stays
/// within `max_stages_per_node` and `max_jobs_per_node`.
fn admit_stage(
    state: &State,
    name: &str,
    session: u64,
    stage: &proto::Stage,
) -> Result<(), String> {
    crate::bounds::check_stage(stage)?;
    let Some(node) = state.nodes.get(name).filter(|n| n.session == session) else {
        return Ok(()); // dropped later: the stream was replaced
    };
    let limits = &state.config.limits;
    if node.stages.contains_key(&stage.stage_id) {
        return Ok(());
    }
    // Orphans count: they hold their place until they re-register (which frees it).
    let held = node.stages.len() + node.orphans.len();
    if held >= limits.max_stages_per_node && !node.orphans.contains_key(&stage.pid) {
        return Err(format!("the node has {held} stages (max_stages_per_node)"));
    }
    let known = state.job_keys.get(&stage.job_id);
    let in_node = known.is_some_and(|key| node.jobs.contains_key(key));
    if !in_node && node.jobs.len() >= limits.max_jobs_per_node {
        return Err(format!(
            "the node has stages of {} jobs (max_jobs_per_node)",
            node.jobs.len()
        ));
    }
    Ok(())
}

/// A stage's rules from its rates (one per configured resource, 0 = none). A rule names
/// its resource by index into the table the node was sent in `Registered`: copying
/// mount and class strings into every rule was most of the cost of an `Enforce`.
fn rules(config: &GlobalConfig, rates: &[u64]) -> Vec<proto::Rule> {
    config
        .resources
        .iter()
        .zip(rates)
        .enumerate()
        .filter(|(_, (_, &rate))| rate > 0)
        .map(|(index, (r, &rate))| proto::Rule {
            resource: index as u32,
            rate,
            bytes: r.resource.counts_bytes(),
            burst: ((rate as u128 * config.burst_ms as u128) / 1000).max(1) as u64,
        })
        .collect()
}

/// Rates (per configured resource, 0 = none) for a stage that just joined: its job's
/// current share split over its stages, or a small provisional share for a job not yet
/// planned.
fn provisional_rates(state: &State, stage: &proto::Stage, job: JobKey) -> Vec<u64> {
    state
        .config
        .resources
        .iter()
        .enumerate()
        .map(|(index, r)| {
            if !stage.mountpoints.contains(&r.resource.mount) {
                return 0;
            }
            let existing = state
                .shares
                .iter()
                .find(|s| s.job == job && s.resource == index);
            let rate = match existing {
                Some(share) => share.assigned / (share.stages as f64 + 1.0),
                None => r.max_rate * PROVISIONAL_SHARE,
            };
            rate.round()
                .clamp(1.0, padll_wire::channel::MAX_RATE as f64) as u64
        })
        .collect()
}

/// The last cycle's shares with names, resource by resource, jobs by id.
fn job_shares(state: &State) -> Vec<JobShare> {
    let mut shares: Vec<(&Share, &str)> = state
        .shares
        .iter()
        .map(|s| (s, state.job_names[s.job as usize].as_str()))
        .collect();
    shares.sort_by(|a, b| (a.0.resource, a.1).cmp(&(b.0.resource, b.1)));
    shares
        .into_iter()
        .map(|(s, job)| s.named(job, &state.config.resources[s.resource].resource))
        .collect()
}

/// The registry and last cycle, as the admin CLI and metrics see them.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// Cycles run.
    pub cycle: u64,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Loop period.
    pub interval_ms: u64,
    /// Resources with their capacity and policy.
    pub resources: Vec<ResourceSnapshot>,
    /// Attached local controllers.
    pub nodes: Vec<NodeSnapshot>,
    /// Registered stages.
    pub stages: Vec<StageSnapshot>,
    /// Every job's share of every resource in the last cycle.
    pub shares: Vec<JobShare>,
    /// Median cycle latency (last 1000 cycles), ms.
    pub latency_ms_p50: f64,
    /// 99th-percentile cycle latency, ms.
    pub latency_ms_p99: f64,
    /// Last cycle's latency, ms.
    pub latency_ms_last: f64,
}

/// One resource.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct ResourceSnapshot {
    /// `MOUNT:CLASS`.
    pub resource: String,
    /// Capacity.
    pub max_rate: f64,
    /// Policy.
    pub policy: String,
}

/// One local controller.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct NodeSnapshot {
    /// Node name.
    pub node: String,
    /// Whether its stream is up.
    pub attached: bool,
    /// Stages it serves.
    pub stages: usize,
    /// Stages of its previous stream that have not re-registered (they keep their last
    /// rules and their share).
    pub orphans: usize,
    /// The cycle of the rules it was sent and has not acknowledged (it is sent them all
    /// again next cycle).
    #[serde(default)]
    pub unacked_cycle: Option<u64>,
    /// Protocol bytes received from it since it attached.
    pub bytes_in: u64,
    /// Protocol bytes sent to it since it attached.
    pub bytes_out: u64,
}

/// One stage.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct StageSnapshot {
    /// Its node.
    pub node: String,
    /// Its id at the node.
    pub stage_id: u64,
    /// Job id.
    pub job: String,
    /// The job's size in nodes, as its local controller resolved it (the scheduler's).
    #[serde(default)]
    pub job_size: u32,
    /// Process id (from `SO_PEERCRED`).
    pub pid: u32,
    /// User id (from `SO_PEERCRED`).
    pub uid: u32,
    /// Program name.
    pub name: String,
    /// Mountpoints.
    pub mountpoints: Vec<String>,
    /// Usage per resource.
    pub usage: BTreeMap<String, f64>,
}

/// The gRPC service.
pub struct Service {
    /// The controller it serves.
    pub controller: Arc<Controller>,
    /// Whether a node's identity comes from its TLS client certificate (always with
    /// TLS); without, the name in `Register` is taken on trust (`--insecure-plaintext`).
    pub authenticate: bool,
}

#[tonic::async_trait]
impl proto::global_server::Global for Service {
    type AttachStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<GlobalMessage, Status>> + Send>>;

    async fn attach(
        &self,
        request: Request<Streaming<LocalMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        // The node names the client's certificate speaks for (verified against the
        // site CA in the handshake).
        let certified = if self.authenticate {
            let Some(certs) = request.peer_certs().filter(|c| !c.is_empty()) else {
                return Err(Status::unauthenticated(
                    "a node certificate is required (mutual TLS)",
                ));
            };
            Some(crate::tls::node_names(&certs[0]).map_err(Status::unauthenticated)?)
        } else {
            None
        };
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no register message within 10 s"))??;
        let name = register_name(first)?;
        if let Some(names) = certified.filter(|names| !names.contains(&name)) {
            let short = |n: &str| padll_wire::control::short(n).to_string();
            crate::limited_warn!(
                GRPC_LOG,
                "refused a local controller: its certificate is for node '{}', it registered as '{}'",
                short(&names[0]),
                short(&name)
            );
            return Err(Status::permission_denied(format!(
                "the client certificate is for node '{}'; it cannot register as '{}'",
                short(&names[0]),
                short(&name)
            )));
        }
        let (outbox, receiver) = outbox::channel();
        let controller = self.controller.clone();
        let session = controller.attach_node(&name, outbox)?;
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(message)) => controller.handle(&name, session, message),
                    Ok(None) => break,
                    Err(status) => {
                        debug!(node = %name, "stream error: {status}");
                        break;
                    }
                }
            }
            controller.detach_node(&name, session);
        });
        Ok(Response::new(Box::pin(receiver)))
    }
}

/// The node name of a stream's first message: a `Register` of this protocol version
/// with a name of 1 to [`crate::bounds::MAX_NAME_BYTES`] bytes.
fn register_name(first: Option<LocalMessage>) -> Result<String, Status> {
    match first.and_then(|m| m.body) {
        Some(local_message::Body::Register(proto::Register { node, version }))
            if version == proto::VERSION && node.len() > crate::bounds::MAX_NAME_BYTES =>
        {
            Err(Status::invalid_argument(format!(
                "node name of {} bytes exceeds {}",
                node.len(),
                crate::bounds::MAX_NAME_BYTES
            )))
        }
        Some(local_message::Body::Register(proto::Register { node, version }))
            if version == proto::VERSION && !node.is_empty() =>
        {
            Ok(node)
        }
        Some(local_message::Body::Register(proto::Register { version, .. })) => {
            Err(Status::invalid_argument(format!(
                "protocol version {version} (or empty node name) not supported; expected {}",
                proto::VERSION
            )))
        }
        _ => Err(Status::invalid_argument(
            "the first message must be register",
        )),
    }
}

/// Serves the gRPC endpoint on an already-bound listener (so callers can bind port 0):
/// with mutual TLS when `tls` is given (a node's identity is then its certificate's),
/// plaintext otherwise.
pub async fn serve(
    controller: Arc<Controller>,
    listener: tokio::net::TcpListener,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> Result<(), String> {
    let incoming = crate::bounds::Incoming::new(listener);
    let authenticate = tls.is_some();
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| format!("TLS configuration: {e}"))?;
    }
    builder
        .add_service(proto::global_server::GlobalServer::new(Service {
            controller,
            authenticate,
        }))
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| format!("gRPC server failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_scheduled_a_lead_before_a_tick_they_can_make() {
        let config = GlobalConfig {
            interval_ms: 1000,
            ..GlobalConfig::default()
        };
        let controller = Controller::new(config).unwrap();
        let mut state = controller.lock();
        let now = Instant::now();
        let ms = Duration::from_millis;
        // No cycle yet: the report for the one after the first, an interval less a lead
        // from now.
        assert_eq!(next_slot(&state, now), (2, ms(900)));
        state.cycle = 7;
        state.next_tick = Some(now + ms(500));
        assert_eq!(next_slot(&state, now), (8, ms(400)));
        // The next tick's slot is too close to make: the following tick's.
        state.next_tick = Some(now + ms(120));
        assert_eq!(next_slot(&state, now), (9, ms(1020)));
        assert_eq!(report_lead(ms(200)), ms(50));
    }
}
