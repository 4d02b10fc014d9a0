//! What the admin CLI and the metrics endpoint see: a consistent snapshot of the
//! registry and the last cycle, and the phases of the last cycles.

use super::service_times::ServiceSummary;
use super::{Controller, State};
use crate::config::GlobalConfig;
use crate::plan::{JobShare, Share};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Cycles kept for statistics.
const LATENCY_HISTORY: usize = 1000;

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

/// Appends a cycle's phases to `history`, dropping the oldest past [`LATENCY_HISTORY`].
pub(super) fn record(history: &mut VecDeque<Phases>, phases: Phases) {
    if history.len() == LATENCY_HISTORY {
        history.pop_front();
    }
    history.push_back(phases);
}

impl Controller {
    /// The protocol bytes exchanged with the nodes registered, both ways: the sum of
    /// what [`Controller::snapshot`] shows per node, without building it (which takes
    /// milliseconds under the state lock at 10 000 nodes).
    pub(crate) fn protocol_bytes(&self) -> u64 {
        self.lock()
            .nodes
            .values()
            .map(|node| node.bytes_in + node.bytes_out)
            .sum()
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
        let resources = &state.config.resources;
        Snapshot {
            cycle: state.cycle,
            uptime_s: self.started.elapsed().as_secs_f64(),
            interval_ms: state.config.interval_ms,
            resources: state
                .config
                .resources
                .iter()
                .enumerate()
                .map(|(i, r)| ResourceSnapshot {
                    resource: r.resource.to_string(),
                    max_rate: r.max_rate.tokens(),
                    policy: state
                        .policies
                        .get(&r.resource)
                        .map_or_else(|| r.policy.clone(), |p| p.name()),
                    service: state
                        .service
                        .last(i)
                        .map(ServiceSummary::of)
                        .unwrap_or_default(),
                    auto: r
                        .auto
                        .as_ref()
                        .filter(|_| state.steering.steers(i))
                        .map(|auto| AutoSnapshot {
                            target_p50_ms: auto.target_p50_ms,
                            target_p99_ms: auto.target_p99_ms,
                            floor: auto.floor.tokens(),
                            ceiling: auto.ceiling.tokens(),
                        }),
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
                                .map(|&(r, v)| (resources[r].resource.to_string(), v.rate))
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
            leadership: self.leadership.status(),
        }
    }

    /// What the metrics endpoint shows: the snapshot, every cycle's latency and each
    /// resource's service times since start (in the order of the snapshot's resources).
    pub fn metrics(&self) -> Metrics {
        let (cycle_latency, service_times) = {
            let state = self.lock();
            let service_times = (0..state.config.resources.len())
                .map(|i| state.service.total(i).cloned().unwrap_or_default())
                .collect();
            (state.latency.clone(), service_times)
        };
        Metrics {
            snapshot: self.snapshot(),
            cycle_latency,
            service_times,
        }
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
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The last cycle's shares with names, resource by resource, jobs by id.
fn job_shares(state: &State) -> Vec<JobShare> {
    let mut shares: Vec<(&Share, &str)> = state
        .shares
        .iter()
        .filter_map(|s| Some((s, state.jobs.name_of(s.job)?)))
        .collect();
    shares.sort_by(|a, b| (a.0.resource, a.1).cmp(&(b.0.resource, b.1)));
    shares
        .into_iter()
        .map(|(s, job)| s.named(job, &state.config.resources[s.resource].resource))
        .collect()
}

/// What the metrics endpoint shows.
pub struct Metrics {
    /// The registry and the last cycle.
    pub snapshot: Snapshot,
    /// Every cycle's latency since start.
    pub cycle_latency: super::latency::LatencyHistogram,
    /// Each resource's service times since start, in the snapshot's order.
    pub service_times: Vec<padll_wire::latency::Histogram>,
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
    /// Who leads (with a standby, `crate::standby`) and whether this controller
    /// controls now.
    #[serde(default)]
    pub leadership: super::leadership::LeadershipStatus,
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
    /// The file system's service times of its calls over the last interval, all
    /// stages together.
    #[serde(default)]
    pub service: ServiceSummary,
    /// While `max_rate = "auto"` steers its `Max_R`: the targets and bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoSnapshot>,
}

/// What steers a resource's `Max_R` under `max_rate = "auto"`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct AutoSnapshot {
    /// The median service time held, ms.
    pub target_p50_ms: Option<f64>,
    /// The 99th percentile held, ms.
    pub target_p99_ms: Option<f64>,
    /// The lowest `Max_R`.
    pub floor: f64,
    /// The highest `Max_R`.
    pub ceiling: f64,
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
    /// Its mountpoints of configured resources (the global controller keeps no other).
    pub mountpoints: Vec<String>,
    /// Usage per resource.
    pub usage: BTreeMap<String, f64>,
}
