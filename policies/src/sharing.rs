//! Dynamic proportional-sharing algorithms of PADLL (§IV-B): *PSharing* (max-min fair
//! share over demands, leftover distributed in proportion to demands) and *PSFA*
//! (proportional sharing without false resource allocation, Algorithm 1).

use crate::util::{add_proportional, clean, water_fill};
use crate::{JobSnapshot, Policy};

/// Proportional sharing (PADLL §IV-B, "Proportional sharing").
///
/// 1. Max-min fair share over the demands: jobs are served in order of increasing
///    demand, no job gets more than its demand, and "jobs with unsatisfied demands get
///    equal shares" (§IV-B) — whatever their `priority`. The extension
///    `psharing:weighted` ([`PSharing::weighted`]) gives unsatisfied jobs shares in
///    proportion to `priority` instead (weighted max-min); it must be asked for by name,
///    a `priority` field set for another policy does not switch it on.
/// 2. Whatever is left (all demands met) is distributed across the active jobs "in a
///    proportional manner" — in proportion to their demands (equally if all are 0).
///
/// The result always adds up to exactly `Max_R` (work conserving in allocation) and
/// gives every job at least `min(demand, max-min fair share)`. Because usage is
/// ignored, a job with a volatile load may hold rate it does not use: the *false
/// resource allocation* that PSFA fixes.
#[derive(Debug, Clone, Default)]
pub struct PSharing {
    /// Weighted max-min by `priority` (`psharing:weighted`); `false`: the paper's
    /// equal shares.
    pub weighted: bool,
    caps: Vec<f64>,
    weights: Vec<f64>,
    order: Vec<(f64, u32)>,
}

impl PSharing {
    /// The extension `psharing:weighted`: unsatisfied jobs share in proportion to their
    /// `priority` (weighted max-min fairness) instead of equally.
    pub fn weighted() -> Self {
        PSharing {
            weighted: true,
            ..PSharing::default()
        }
    }
}

impl Policy for PSharing {
    fn name(&self) -> String {
        if self.weighted {
            "psharing:weighted".into()
        } else {
            "psharing".into()
        }
    }
    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        let max_rate = clean(max_rate);
        self.caps.clear();
        self.caps.extend(jobs.iter().map(|j| clean(j.demand)));
        self.weights.clear();
        // §IV-B: equal shares; by priority only when asked for (`psharing:weighted`).
        let weighted = self.weighted;
        self.weights.extend(
            jobs.iter()
                .map(|j| if weighted { weight(j.priority) } else { 1.0 }),
        );
        out.clear();
        out.resize(jobs.len(), 0.0);
        let left = water_fill(max_rate, &self.caps, &self.weights, out, &mut self.order);
        let caps = &self.caps;
        add_proportional(left, |i| caps[i], out);
    }
}

/// A usable weight: priorities that are not positive numbers count as 1.
pub(crate) fn weight(p: f64) -> f64 {
    if p.is_finite() && p > 0.0 {
        p
    } else {
        1.0
    }
}

/// PSFA — proportional sharing without false resource allocation (PADLL §IV-B,
/// Algorithm 1), implemented line by line.
///
/// Jobs are processed in order of increasing demand (ties by input position). For job
/// `i`, `fair_share = left_R / (Active − i)` (line 3); if `usage_i ≤ demand_i` the job
/// gets `min(usage_i + (demand_i − usage_i)·ε, fair_share)` (lines 5–7, the ε threshold
/// absorbs volatile load), otherwise `min(demand_i, fair_share)` (lines 8–9);
/// `left_R` shrinks accordingly (line 10). The leftover is then given out in proportion
/// to each job's share of the total usage (lines 11–14).
///
/// Deviation: Algorithm 1 assumes `usage_i > 0`. When every job used nothing, the
/// usage proportions are undefined; the leftover is then split in proportion to the
/// demands (equally if those are all 0) so that the rate is not lost.
#[derive(Debug, Clone)]
pub struct Psfa {
    /// The ε of Algorithm 1, in `[0, 1]`: the fraction of the unused part of its demand
    /// that a job keeps as headroom.
    pub epsilon: f64,
    order: Vec<(f64, u32)>,
}

/// Default ε: the paper leaves it configurable without giving the value it used.
pub const DEFAULT_EPSILON: f64 = 0.5;

impl Psfa {
    /// PSFA with the given ε (clamped into `[0, 1]`).
    pub fn new(epsilon: f64) -> Self {
        Psfa {
            epsilon: if epsilon.is_nan() {
                DEFAULT_EPSILON
            } else {
                epsilon.clamp(0.0, 1.0)
            },
            order: Vec::new(),
        }
    }
}

impl Default for Psfa {
    fn default() -> Self {
        Psfa::new(DEFAULT_EPSILON)
    }
}

impl Policy for Psfa {
    fn name(&self) -> String {
        format!("psfa:{}", self.epsilon)
    }
    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        out.clear();
        out.resize(jobs.len(), 0.0);
        // Process in order of increasing demand.
        self.order.clear();
        self.order.extend(
            jobs.iter()
                .enumerate()
                .map(|(i, j)| (clean(j.demand), i as u32)),
        );
        self.order
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let active = jobs.len();
        // Alg. 1 line 2: left_R ← Max_R
        let mut left = clean(max_rate);
        for (k, &(demand, i)) in self.order.iter().enumerate() {
            let i = i as usize;
            let usage = clean(jobs[i].usage);
            // line 3: fair_share ← left_R / (Active − i)
            let fair_share = left / (active - k) as f64;
            let rate = if usage <= demand {
                // lines 5–7: threshold_i ← (demand_i − usage_i)·ε
                let threshold = (demand - usage) * self.epsilon;
                (usage + threshold).min(fair_share)
            } else {
                // lines 8–9
                demand.min(fair_share)
            };
            out[i] = rate;
            // line 10: left_R ← left_R − rate_i
            left = (left - rate).max(0.0);
        }
        // lines 11–14: distribute left_R by usage proportion.
        let total_usage: f64 = jobs.iter().map(|j| clean(j.usage)).sum();
        if total_usage > 0.0 {
            add_proportional(left, |i| clean(jobs[i].usage), out);
        } else {
            add_proportional(left, |i| clean(jobs[i].demand), out);
        }
    }
}
