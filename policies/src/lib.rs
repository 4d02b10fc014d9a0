//! # policies — QoS control algorithms for shared HPC storage
//!
//! Every control algorithm that the PADLL control plane (Cheferd) can run, as pure
//! computations: given what every job used and asked for during the last control
//! interval, decide every job's rate for the next one. No I/O, no clocks, no
//! randomness: the same input always gives the same output, so every algorithm can be
//! tested exhaustively and evaluated in a simulator ([`sim`]) before it meets real jobs.
//!
//! One resource (e.g. the metadata operations per second of one mount point, or its
//! data bytes per second) has a capacity `Max_R` (PADLL §IV). Each cycle a [`Policy`]
//! receives a slice of [`JobSnapshot`]s and returns one rate per job, in the same order.
//! Policies that carry state across cycles (AdapTBF's lending records and remainders)
//! expose it as JSON ([`Policy::state`] / [`Policy::load_state`]) so that a dry run
//! (`policies allocate`) can be chained cycle after cycle.
//!
//! [`placement`] chooses the storage targets of new files' stripes (MCMF with Markov
//! prediction, round-robin, random; Paul et al. §III), with its own simulator.
//!
//! Policies are built by name with [`build`] (e.g. `"psfa"`, `"adaptbf"`,
//! `"themis:group,user,size"`); see [`registry`] for the full list.
//!
//! The I/O around them is behind features, on by default: `plot` (PNG/SVG plots,
//! plotters) and `cli` (the `policies` binary's commands, clap; implies `plot`). The
//! control plane's library use needs neither.

#![warn(missing_docs)]

pub mod adaptbf;
pub mod capacity;
#[cfg(feature = "cli")]
pub mod cli;
pub mod drf;
pub mod mckp;
pub mod placement;
#[cfg(feature = "plot")]
pub mod plot;
pub mod registry;
pub mod sharing;
pub mod sim;
pub mod statics;
pub mod themis;
pub mod trace;
mod util;

use serde::{Deserialize, Serialize};

pub use registry::{build, policy_names, SpecError, SpecErrorKind};

/// The largest priority (weight) a job may have, far above any real ratio between jobs:
/// `cheferd ctl set-job --priority`, `global.toml`'s `[[job]]` and [`JobSnapshot`]
/// refuse more, so that the policies' sums of weights stay finite and exact enough.
pub const MAX_PRIORITY: f64 = 1e6;

/// What a priority must be, as the refusals say it.
pub const PRIORITY_RANGE: &str = "must be from 0.000001 to 1000000";

/// Smallest priority: [`MAX_PRIORITY`]'s inverse, so that two jobs' weights relative to
/// the largest (water filling) never round to 0 (1e-318 beside 1e6 did, and the job got
/// nothing beside spare capacity).
pub const MIN_PRIORITY: f64 = 1.0 / MAX_PRIORITY;

/// Whether `priority` is a priority a job may have ([`MIN_PRIORITY`] to [`MAX_PRIORITY`]).
pub fn priority_ok(priority: f64) -> bool {
    (MIN_PRIORITY..=MAX_PRIORITY).contains(&priority)
}

/// Identifier of a job (e.g. the Slurm job id). Numeric so that a cycle over
/// 100 000 jobs does not hash strings.
pub type JobId = u64;

/// One option a job offers to the MCKP policy (arbitration paper §3.1): if the job is
/// given `rate`, it is expected to achieve `utility` (e.g. the throughput it would
/// reach, or the bandwidth the paper measured with that many I/O forwarders).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateOption {
    /// The rate (same unit as `Max_R`) the job would be given with this option.
    pub rate: f64,
    /// What the job achieves with that rate (any additive unit; MCKP maximises its sum).
    pub utility: f64,
}

/// What the control plane knows about one active job at the end of a control interval.
///
/// Rates are in the unit of the resource being shared (ops/s for metadata, bytes/s for
/// data). Only `id`, `demand` and `usage` are required in JSON; the rest default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSnapshot {
    /// Job identifier (stable across cycles; AdapTBF keys its records by it).
    pub id: JobId,
    /// Numeric user id of the job's owner (ThemisIO user-fair levels).
    #[serde(default)]
    pub user: u32,
    /// Numeric group / account id (ThemisIO group-fair levels).
    #[serde(default)]
    pub group: u32,
    /// Number of compute nodes (size-fair, AdapTBF priority eq. (1), MCKP baselines;
    /// size-fair and AdapTBF count 0 as 1, as the controller sends it).
    #[serde(default = "one_u32")]
    pub size: u32,
    /// Priority weight ([`MIN_PRIORITY`] to [`MAX_PRIORITY`]) used by priority-fair and as the weight of weighted
    /// max-min fairness. Defaults to 1.
    #[serde(default = "one_f64")]
    pub priority: f64,
    /// The job's QoS demand: its rate reservation / soft limit (PADLL §IV-B "demand").
    pub demand: f64,
    /// A static hard limit set by the administrator, if any (Priority uses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// Rate the job was actually served during the last interval (PADLL "usage").
    pub usage: f64,
    /// Rate the job tried to issue during the last interval: served operations plus the
    /// ones the stage held back. Defaults to `usage`. AdapTBF's observed I/O demand
    /// `d_x^t` (eq. 3) and ThemisIO's / DRF's need use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted: Option<f64>,
    /// DRF only: the job's demand on the second resource (e.g. data bytes/s) that it
    /// consumes together with this one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub data_demand: f64,
    /// MCKP only: the options the job offers (one is chosen). Empty: derived from
    /// `demand` (see [`mckp::default_options`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<RateOption>,
}

fn one_u32() -> u32 {
    1
}
fn one_f64() -> f64 {
    1.0
}
fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl JobSnapshot {
    /// A job with the given id, demand and usage and every other field at its default.
    pub fn new(id: JobId, demand: f64, usage: f64) -> Self {
        JobSnapshot {
            id,
            user: 0,
            group: 0,
            size: 1,
            priority: 1.0,
            demand,
            limit: None,
            usage,
            wanted: None,
            data_demand: 0.0,
            options: Vec::new(),
        }
    }

    /// The rate the job tried to issue: `wanted`, or `usage` if the stage did not say.
    pub fn need(&self) -> f64 {
        self.wanted.unwrap_or(self.usage).max(self.usage).max(0.0)
    }

    /// `Ok` if every number is usable: rates, demands, limits and option values finite
    /// and `≥ 0`, `priority` from [`MIN_PRIORITY`] to [`MAX_PRIORITY`]. Otherwise a message naming the job and
    /// the field (`job 3: bad demand -5 (expected a finite number ≥ 0)`).
    ///
    /// The policies themselves treat a bad number as 0 (they never propagate NaN or a
    /// negative rate); input boundaries such as `policies allocate` reject it instead,
    /// since a negative demand is a mistake, not a request for nothing.
    pub fn validate(&self) -> Result<(), JobError> {
        let bad = |field: String, value: f64, expected| {
            Err(JobError {
                job: self.id,
                field,
                value,
                expected,
            })
        };
        let rate = |field: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                bad(field.to_string(), v, "a finite number ≥ 0")
            }
        };
        rate("demand", self.demand)?;
        rate("usage", self.usage)?;
        if let Some(w) = self.wanted {
            rate("wanted", w)?;
        }
        if let Some(l) = self.limit {
            rate("limit", l)?;
        }
        rate("data_demand", self.data_demand)?;
        if !priority_ok(self.priority) {
            return bad(
                "priority".into(),
                self.priority,
                "a number > 0 and ≤ 1000000",
            );
        }
        for (k, o) in self.options.iter().enumerate() {
            rate(&format!("options[{k}].rate"), o.rate)?;
            rate(&format!("options[{k}].utility"), o.utility)?;
        }
        Ok(())
    }
}

/// A job's number that [`JobSnapshot::validate`] refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("job {job}: bad {field} {value} (expected {expected})")]
pub struct JobError {
    /// The job.
    pub job: JobId,
    /// The field (`demand`, `options[2].rate`).
    pub field: String,
    /// Its value.
    pub value: f64,
    /// What it must be.
    pub expected: &'static str,
}

/// A state [`Policy::load_state`] refused.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A state given to a policy that keeps none (its name).
    #[error("policy {0} keeps no state")]
    Stateless(String),
    /// Not the policy's state.
    #[error("state: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The policy's state, with a value out of its range (the message names it).
    #[error("{0}")]
    Invalid(String),
}

/// A control algorithm: one call per control cycle.
///
/// Contract (checked by the property tests in `tests/properties.rs`): the returned vector
/// has one entry per job, in input order; every rate is finite and `>= 0`; the sum is at
/// most `max_rate` (up to floating-point rounding); and the result depends only on the
/// input and the policy's state.
pub trait Policy: Send {
    /// The name this policy was built from (e.g. `"psfa:0.5"`).
    fn name(&self) -> String;

    /// Compute one rate per job into `out` (cleared first; its allocation is reused).
    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>);

    /// Compute one rate per job (convenience wrapper over [`Policy::allocate_into`]).
    fn allocate(&mut self, max_rate: f64, jobs: &[JobSnapshot]) -> Vec<f64> {
        let mut out = Vec::with_capacity(jobs.len());
        self.allocate_into(max_rate, jobs, &mut out);
        out
    }

    /// The state carried to the next cycle, as JSON (`null` for stateless policies).
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Restore a state produced by [`Policy::state`] (a `null` state resets it).
    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), StateError> {
        if state.is_null() {
            Ok(())
        } else {
            Err(StateError::Stateless(self.name()))
        }
    }

    /// Tell the policy the length of the control interval, in seconds (AdapTBF converts
    /// rates to tokens per interval with it). Ignored by the others.
    fn set_interval(&mut self, _seconds: f64) {}

    /// Extra per-job outputs beyond the rate (DRF's second-resource rates), as JSON
    /// keyed by name; `None` for single-resource policies.
    fn extra_outputs(&self) -> Option<serde_json::Value> {
        None
    }
}
