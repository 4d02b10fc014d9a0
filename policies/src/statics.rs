//! Static control algorithms (PADLL §IV-A): fixed per-job limits that ignore usage.
//!
//! They are the baselines of the PADLL evaluation (Table I, Figs. 7–9): they keep the
//! file system under `Max_R` but neither reuse leftover rate (under-provisioning) nor
//! take back rate a job does not use (over-provisioning).

use crate::util::{cap_total, clean};
use crate::{JobSnapshot, Policy};

/// No control at all (the evaluation's *Baseline*): every job may go as fast as it
/// wants. Rates are `f64::INFINITY`, so this is the one policy that does **not** honour
/// `Σ rate ≤ Max_R` — it exists for the simulator's comparison.
#[derive(Debug, Clone, Default)]
pub struct Baseline;

impl Policy for Baseline {
    fn name(&self) -> String {
        "baseline".into()
    }
    fn allocate_into(&mut self, _max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        out.clear();
        out.resize(jobs.len(), f64::INFINITY);
    }
}

/// Uniform rate distribution (PADLL §IV-A "Uniform"): every job gets the same fixed
/// limit `Max_R / slots`, regardless of its size, duration or load.
///
/// `slots` is the number of jobs the administrator provisions for (the paper uses 4,
/// i.e. 27.5 kops/s each with `Max_R` = 110 kops/s). Without it, or if more jobs are
/// active than slots, the active job count is used so that `Σ rate ≤ Max_R` holds.
#[derive(Debug, Clone, Default)]
pub struct Uniform {
    /// Number of provisioned job slots (`None`: the number of active jobs).
    pub slots: Option<usize>,
}

impl Policy for Uniform {
    fn name(&self) -> String {
        match self.slots {
            Some(s) => format!("uniform:{s}"),
            None => "uniform".into(),
        }
    }
    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        out.clear();
        let n = jobs.len().max(self.slots.unwrap_or(0)).max(1);
        out.resize(jobs.len(), clean(max_rate) / n as f64);
    }
}

/// Priority-based rate distribution (PADLL §IV-A "Priority"): each job keeps a fixed
/// limit chosen by its priority — its static `limit`, or if none its `demand` (Table I's
/// per-job rates). Jobs with higher priority get a larger share. If the fixed limits of
/// the active jobs add up to more than `Max_R`, they are scaled down proportionally so
/// the capacity is never exceeded.
#[derive(Debug, Clone, Default)]
pub struct Priority;

impl Policy for Priority {
    fn name(&self) -> String {
        "priority".into()
    }
    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        out.clear();
        out.extend(jobs.iter().map(|j| clean(j.limit.unwrap_or(j.demand))));
        cap_total(clean(max_rate), out);
    }
}
