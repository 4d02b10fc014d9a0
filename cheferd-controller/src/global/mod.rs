//! `cheferd global`: the global controller (PADLL paper §III-B).
//!
//! Local controllers attach over gRPC (one bidirectional stream each). Each pushes the
//! usage of its stages once per interval, in a slot a lead before the global tick (the
//! global controller tells it when in a `Schedule`), so a cycle finds usage already
//! there instead of paying a Collect → Usage round trip per local controller.
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
//! 4. **sleep** until the next tick (an interval after the last one, not after the
//!    wake-up for it: [`Controller::next_tick`]).
//!
//! The cycle latency is from the wake-up for the tick until the last `Enforce` is
//! queued on its stream (tonic encodes and writes it right after); the time until every
//! acknowledgement arrived (in the next `Usage`, or an `Applied`) is recorded apart
//! ([`Phases::acked`]).
//!
//! A stage that joins between cycles gets a provisional rule at once (1 % of `Max_R`
//! for a new job, its job's current share otherwise), so no one runs unthrottled until
//! the next cycle. A local controller that disappears leaves its stages running on their
//! last rules (fail-static), so they stay in the plan as *orphans* with their last usage
//! — their share is not handed to anyone else — until they re-register (matched by pid;
//! they keep their rules, so they get no provisional ones) or for [`ORPHAN_GRACE`]
//! (then they are presumed gone with their node).
//!
//! One concept per module: `service` (the gRPC endpoint), `admit` (who may open a
//! stream: certificate names, the first message), `relay` (a relay's stream:
//! many nodes' streams in one), `node` (the records of a node and its stages, found by
//! name or by stream), `registry` (what each message of a
//! stream does to them: nodes, stages, orphans), `jobs` (job-id interning and the terms
//! in force), `schedule` (report slots and the collect wait), `cache` (the planner's
//! views and the rates last sent, kept between cycles), `enforce` (the diff, acks and
//! re-sends), `admin` (administrative changes), `snapshot` (what the admin CLI and
//! metrics see), `latency` (every cycle's latency, for the metrics), `service_times`
//! (the file system's service times per resource, from the stages' reports) and
//! `capacity` (`max_rate = "auto"`: `Max_R` moved by those service times, before
//! compute).
//!
//! Time is tokio's clock ([`tokio::time::Instant`]): the system's in production, paused
//! and advanced by the tests of report slots, orphan grace and scheduled rules.

mod admin;
mod admit;
mod cache;
mod capacity;
mod durable;
mod enforce;
mod jobs;
mod latency;
mod leadership;
mod node;
mod registry;
mod relay;
mod schedule;
mod service;
mod service_times;
mod sizes;
mod snapshot;
mod term;
#[cfg(test)]
mod tests;

pub use admin::{Change, ChangeError, ChangeRefused};
pub(crate) use admit::registered;
pub use durable::{PolicyState, SavedJob};
pub use enforce::PROVISIONAL_SHARE;
pub use latency::{LatencyHistogram, LATENCY_BUCKETS};
pub(crate) use leadership::{utc, Role};
pub use leadership::{Leader, Leadership, LeadershipStatus, RoleName, LEADER_METADATA};
pub use registry::{ORPHAN_GRACE, REPLACED};
pub use relay::{MAX_BATCH_BYTES as MAX_RELAY_BATCH_BYTES, MAX_LINKS as MAX_RELAY_LINKS};
#[cfg(feature = "lab")]
pub(crate) use schedule::spread_window;
pub use service::{serve, ServeError, Service};
pub use service_times::ServiceSummary;
pub use snapshot::{
    AutoSnapshot, Metrics, NodeSnapshot, Phases, ResourceSnapshot, Snapshot, StageSnapshot,
};
pub use term::{Generation, LeaderTerm};

use crate::config::Resource;
use crate::config::{ConfigError, GlobalConfig};
use crate::plan::{self, Share};
use crate::policy::PolicyRunner;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::debug;

struct State {
    config: GlobalConfig,
    policies: HashMap<Resource, PolicyRunner>,
    nodes: node::Nodes,
    jobs: jobs::JobIds,
    next_session: u64,
    cycle: u64,
    shares: Vec<Share>,
    /// The planner's views of every stage and the rates each was last sent.
    cache: cache::PlanCache,
    /// The last cycles, oldest first.
    history: VecDeque<Phases>,
    /// Every cycle's latency since start, for the metrics endpoint.
    latency: LatencyHistogram,
    /// The file system's service times per resource, from the stages' reports.
    service: service_times::ServiceTimes,
    /// The `Max_R` of resources with `max_rate = "auto"`, moved by those service times.
    steering: capacity::Steering,
    /// When the last cycle started (its acknowledgements count from then), and the
    /// next tick expected.
    cycle_started: Option<Instant>,
    next_tick: Option<Instant>,
    /// The window the nodes' report slots spread over (`schedule::spread_window`).
    spread: Duration,
    /// The cycle whose reports the running collect waits for, and from how many nodes
    /// still.
    collecting: Option<u64>,
    awaiting: usize,
    /// Nodes sent the last cycle's `Enforce` that have not acknowledged it.
    unacked: usize,
    /// Policy states restored from the last leader wait for the nodes: no cycle plans
    /// until a stage is back (a policy planning without the jobs writes them off).
    restored: bool,
}

/// The global controller: registry, policies and the control loop.
pub struct Controller {
    state: Mutex<State>,
    replies: Notify,
    started: Instant,
    /// The placement service (`[placement]`), if configured.
    placement: Option<crate::placement_service::PlacementService>,
    /// Whether it leads (always, without a standby: `crate::standby`).
    leadership: Leadership,
}

impl Controller {
    /// A controller for `config` (its policies are built here; names were validated
    /// when the configuration was parsed).
    pub fn new(config: GlobalConfig) -> Result<Arc<Controller>, ConfigError> {
        let mut policies = HashMap::new();
        for r in &config.resources {
            let runner = PolicyRunner::new(&r.policy).map_err(|error| ConfigError::Policy {
                key: r.resource.to_string(),
                error: Box::new(error),
            })?;
            policies.insert(r.resource.clone(), runner);
        }
        let placement = config
            .placement
            .clone()
            .map(crate::placement_service::PlacementService::new)
            .transpose()?;
        let resources = config.resources.len();
        let interval = Duration::from_millis(config.interval_ms);
        let steering = capacity::Steering::new(&config).map_err(|error| ConfigError::Auto {
            key: "resource".into(),
            error,
        })?;
        Ok(Arc::new(Controller {
            placement,
            state: Mutex::new(State {
                config,
                policies,
                nodes: node::Nodes::default(),
                jobs: jobs::JobIds::default(),
                next_session: 1,
                cycle: 0,
                shares: Vec::new(),
                cache: cache::PlanCache::default(),
                history: VecDeque::new(),
                latency: Default::default(),
                service: service_times::ServiceTimes::new(resources),
                steering,
                cycle_started: None,
                next_tick: None,
                spread: schedule::spread_window(interval, 0, Duration::ZERO),
                collecting: None,
                awaiting: 0,
                unacked: 0,
                restored: false,
            }),
            replies: Notify::new(),
            started: Instant::now(),
            leadership: Default::default(),
        }))
    }

    /// Whether it leads, and in which term (`crate::standby`).
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// The control interval.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.lock().config.interval_ms)
    }

    /// The state. A panic while it was held may have left it half-changed, so no one
    /// goes on with it: the next to lock it panics too, and once that is the control
    /// loop its supervisor ends the process (`crate::supervise`).
    fn lock(&self) -> MutexGuard<'_, State> {
        padll_wire::sync::lock_or_panic(&self.state, "the global controller's state")
    }

    /// The control loop: runs cycles forever, one per tick ([`Controller::next_tick`]).
    pub async fn run_loop(self: Arc<Self>) {
        let mut tick = Instant::now();
        loop {
            self.cycle_at(tick).await;
            tick = self.next_tick(tick);
            tokio::time::sleep_until(tick).await;
        }
    }

    /// The tick after `tick`: an interval later, even when the wake-up for `tick` came
    /// late (counted from the wake-up, the ticks drifted by each one's lateness, and
    /// every node's report slot with them); now if that is past (a cycle overran).
    pub fn next_tick(&self, tick: Instant) -> Instant {
        (tick + self.interval()).max(Instant::now())
    }

    /// One collect → compute → enforce cycle, ticking now; returns its latency (the
    /// tests' shorthand: the control loops tick on their grid, `cycle_at`).
    #[cfg(test)]
    pub(crate) async fn cycle(&self) -> Duration {
        self.cycle_at(Instant::now()).await
    }

    /// One collect → compute → enforce cycle for `tick` (now or just past): reports are
    /// judged by their slots before it, and the next tick is expected one interval
    /// later (reports are scheduled for it). Returns its latency, counted from when it
    /// starts (as its phases and acknowledgements are).
    pub async fn cycle_at(&self, tick: Instant) -> Duration {
        let started = Instant::now();
        let (cycle, interval) = {
            let mut state = self.lock();
            let State { nodes, cache, .. } = &mut *state;
            registry::release_expired_orphans(nodes, cache, started);
            let interval = Duration::from_millis(state.config.interval_ms);
            state.cycle += 1;
            state.cycle_started = Some(started);
            state.next_tick = Some(tick + interval);
            let cycle = state.cycle;
            schedule::start_collect(&mut state, cycle);
            (cycle, interval)
        };
        let deadline = Instant::now() + (interval / 2).min(Duration::from_millis(500));
        self.wait_for_replies(deadline).await;

        let collected = Instant::now();
        let mut state = self.lock();
        state.collecting = None;
        schedule::reschedule_off_slot(&mut state, cycle, tick, collected);
        schedule::adapt_spread(&mut state, collected);
        state.service.close_interval();
        let elapsed = self.started.elapsed().as_secs_f64();
        let State {
            config,
            policies,
            nodes,
            jobs,
            cache,
            service,
            steering,
            restored,
            ..
        } = &mut *state;
        // Jobs are gone only if stages went, which has the views rebuilt.
        let stages_changed = !cache.is_current();
        let (views, layout) = cache.views(config, nodes);
        steering.steer(config, service, |i| layout.served(i));
        let terms = jobs.terms(config, elapsed);
        *restored &= views.is_empty();
        let plan = if *restored {
            plan::Plan::default()
        } else {
            plan::compute(config, &terms, policies, views, layout)
        };
        if stages_changed && !*restored {
            // Planned without the jobs gone, whose keys can now go to new jobs.
            jobs.release_all_but(views.iter().map(|view| view.job));
        }
        let sent = enforce::enforce(config, nodes, &plan, cache, cycle);
        state.shares = plan.shares;
        state.unacked = sent;
        let latency = started.elapsed();
        state.latency.observe(latency);
        snapshot::record(
            &mut state.history,
            Phases {
                cycle,
                collect: collected - started,
                compute: latency - (collected - started),
                latency,
                enforced: sent,
                acked: None,
            },
        );
        debug!(cycle, latency_us = latency.as_micros() as u64, "cycle done");
        latency
    }
}
