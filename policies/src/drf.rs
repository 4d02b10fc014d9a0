//! Dominant Resource Fairness (Ghodsi et al., NSDI'11) across the two resources a job
//! consumes together on one file system: metadata operations/s (`Max_R`) and data
//! bytes/s (`max_data_rate`). PADLL mentions DRF as a policy its control plane can host;
//! none of the reference papers implements it.
//!
//! Each job asks for the vector `(demand, data_demand)` and is given a fraction
//! `f_j ∈ [0, 1]` of it (it consumes both resources in that ratio). Its *dominant share*
//! is `f_j · max(demand/Max_R, data_demand/max_data_rate)`. DRF is the weighted max-min
//! fair allocation of dominant shares (weights = `priority`): progressive filling raises
//! every job's dominant share at the same pace until its demand is met (`f_j = 1`) or a
//! resource it uses is saturated. It is computed exactly, event by event, in
//! `O(n log n)`. Properties: no job gets more than its demand on either resource, no
//! resource is over-subscribed, and the allocation is Pareto-efficient.

use crate::sharing::weight;
use crate::util::{clean, clean_cap};
use crate::{JobSnapshot, Policy};

/// The DRF policy. Rates for the first resource come out of [`Policy::allocate`]; the
/// second resource's rates are in [`Drf::data_rates`] (and in `extra_outputs`).
#[derive(Debug, Clone)]
pub struct Drf {
    /// Capacity of the second resource (data bytes/s). Infinite: DRF reduces to
    /// weighted max-min over the metadata demands.
    pub max_data_rate: f64,
    data: Vec<f64>,
    events: Vec<(f64, u32)>,
    frozen: Vec<bool>,
}

impl Drf {
    /// DRF with the given capacity for the data resource.
    pub fn new(max_data_rate: f64) -> Self {
        Drf {
            max_data_rate: clean_cap(max_data_rate),
            data: Vec::new(),
            events: Vec::new(),
            frozen: Vec::new(),
        }
    }

    /// Data-resource rates of the last cycle (one per job).
    pub fn data_rates(&self) -> &[f64] {
        &self.data
    }
}

impl Default for Drf {
    fn default() -> Self {
        Drf::new(f64::INFINITY)
    }
}

impl Policy for Drf {
    fn name(&self) -> String {
        if self.max_data_rate.is_infinite() {
            "drf".into()
        } else {
            format!("drf:{}", self.max_data_rate)
        }
    }

    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        let cap = [clean(max_rate), self.max_data_rate];
        let n = jobs.len();
        let demand = |j: &JobSnapshot| [clean(j.demand), clean(j.data_demand)];
        // Dominant share per unit fraction: δ_j = max_r d_jr / cap_r.
        let delta = |j: &JobSnapshot| {
            let d = demand(j);
            let mut m = 0.0f64;
            for r in 0..2 {
                if d[r] > 0.0 {
                    m = m.max(if cap[r] > 0.0 {
                        d[r] / cap[r]
                    } else {
                        f64::INFINITY
                    });
                }
            }
            m
        };
        // f_j(s) = s · w_j / δ_j while unfrozen; job j is satisfied at s_j = δ_j / w_j.
        let mut f = vec![0.0; n];
        self.frozen.clear();
        self.frozen.resize(n, false);
        self.events.clear();
        let mut slope = [0.0f64; 2]; // d(usage_r)/ds of the unfrozen jobs
        for (i, j) in jobs.iter().enumerate() {
            let dl = delta(j);
            if dl == 0.0 || !dl.is_finite() {
                // Zero dominant share: the job only asks for uncapped resources (it gets
                // its whole demand) or for nothing. Infinite: it needs a resource with
                // no capacity and gets nothing.
                if dl == 0.0 {
                    f[i] = 1.0;
                }
                self.frozen[i] = true;
                continue;
            }
            let w = weight(j.priority);
            self.events.push((dl / w, i as u32));
            let d = demand(j);
            for r in 0..2 {
                slope[r] += w / dl * d[r];
            }
        }
        self.events
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut s = 0.0f64;
        let mut used = [0.0f64; 2];
        let mut k = 0;
        loop {
            // Next saturation level per resource.
            let mut sat = f64::INFINITY;
            let mut sat_r = usize::MAX;
            for r in 0..2 {
                if slope[r] > 0.0 && cap[r].is_finite() {
                    let at = s + ((cap[r] - used[r]).max(0.0)) / slope[r];
                    if at < sat {
                        sat = at;
                        sat_r = r;
                    }
                }
            }
            // Skip events of jobs already frozen by a saturation.
            while k < self.events.len() && self.frozen[self.events[k].1 as usize] {
                k += 1;
            }
            let next_cap = self.events.get(k).map_or(f64::INFINITY, |e| e.0);
            if next_cap.is_infinite() && sat.is_infinite() {
                break;
            }
            if next_cap <= sat {
                // Job reaches its demand.
                let i = self.events[k].1 as usize;
                for r in 0..2 {
                    used[r] += slope[r] * (next_cap - s);
                }
                s = next_cap;
                let j = &jobs[i];
                let (w, dl, d) = (weight(j.priority), delta(j), demand(j));
                for r in 0..2 {
                    slope[r] = (slope[r] - w / dl * d[r]).max(0.0);
                }
                f[i] = 1.0;
                self.frozen[i] = true;
                k += 1;
            } else {
                // Resource `sat_r` saturates: freeze every unfrozen job that uses it.
                for r in 0..2 {
                    used[r] += slope[r] * (sat - s);
                }
                s = sat;
                for (i, j) in jobs.iter().enumerate() {
                    if !self.frozen[i] && demand(j)[sat_r] > 0.0 {
                        let (w, dl, d) = (weight(j.priority), delta(j), demand(j));
                        f[i] = (s * w / dl).min(1.0);
                        self.frozen[i] = true;
                        for r in 0..2 {
                            slope[r] = (slope[r] - w / dl * d[r]).max(0.0);
                        }
                    }
                }
                slope[sat_r] = 0.0;
            }
        }
        out.clear();
        out.extend(jobs.iter().zip(&f).map(|(j, &f)| f * clean(j.demand)));
        self.data.clear();
        self.data
            .extend(jobs.iter().zip(&f).map(|(j, &f)| f * clean(j.data_demand)));
        // Guard against accumulated rounding.
        crate::util::cap_total(cap[0], out);
        if cap[1].is_finite() {
            crate::util::cap_total(cap[1], &mut self.data);
        }
    }

    fn extra_outputs(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "data_rates": self.data }))
    }
}
