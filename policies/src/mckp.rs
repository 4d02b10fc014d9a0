//! Multiple-Choice Knapsack utility maximisation (arbitration paper §3.1, eq. (1)) and
//! the paper's STATIC and SIZE baselines (§3.2).
//!
//! Each job (a *class*) offers options — a rate it could be given and the utility
//! (throughput) it would achieve with it. MCKP chooses **exactly one option per job** to
//! maximise the total utility subject to `Σ rate ≤ Max_R`, by the pseudo-polynomial
//! dynamic programme `O(W · Σ N_i)` the paper uses.
//!
//! Rates are real numbers, the DP needs integer weights: rates are measured in
//! *quanta* of `Max_R / resolution` (default resolution 1000; capacities at most the
//! resolution use quanta of 1, so integer problems such as Table 4 are solved exactly;
//! at most [`MAX_RESOLUTION`], and fewer quanta when jobs × quanta would pass
//! [`MAX_DP_CELLS`]).
//! Option rates are rounded **up** to whole quanta and the capacity **down**, so a
//! choice feasible for the DP is always feasible for real.

use crate::util::{cap_total, clean};
use crate::{JobSnapshot, Policy, RateOption};

/// Solve an integer MCKP: `classes[i]` lists `(weight, value)` options of class `i`;
/// choose one per class maximising the value with total weight `≤ capacity`.
/// Returns the chosen option index per class, or `None` if no choice fits. Only the
/// first 255 options of a class are considered (the choice table stores bytes).
///
/// Ties are broken towards the smaller total weight, then towards lower option indices,
/// so the result is deterministic.
pub fn solve(capacity: usize, classes: &[Vec<(usize, f64)>]) -> Option<Vec<usize>> {
    let w = capacity;
    const NONE: f64 = f64::NEG_INFINITY;
    // best[c]: max value of the classes so far with total weight exactly c.
    let mut best = vec![NONE; w + 1];
    best[0] = 0.0;
    let mut next = vec![NONE; w + 1];
    // choice[i * (w+1) + c]: option chosen for class i at total weight c.
    let mut choice = vec![u8::MAX; classes.len() * (w + 1)];
    for (i, opts) in classes.iter().enumerate() {
        next.iter_mut().for_each(|x| *x = NONE);
        let row = &mut choice[i * (w + 1)..(i + 1) * (w + 1)];
        for (o, &(ow, ov)) in opts.iter().enumerate().take(u8::MAX as usize) {
            if ow > w || !ov.is_finite() {
                continue;
            }
            for c in ow..=w {
                let prev = best[c - ow];
                if prev == NONE {
                    continue;
                }
                let v = prev + ov;
                if v > next[c] {
                    next[c] = v;
                    row[c] = o as u8;
                }
            }
        }
        std::mem::swap(&mut best, &mut next);
    }
    // Best total over all weights (smallest weight wins ties).
    let mut at = None;
    for (c, &v) in best.iter().enumerate() {
        if v != NONE && at.is_none_or(|a: usize| v > best[a]) {
            at = Some(c);
        }
    }
    let mut c = at?;
    let mut picks = vec![0; classes.len()];
    for i in (0..classes.len()).rev() {
        let o = choice[i * (w + 1) + c] as usize;
        picks[i] = o;
        c -= classes[i][o].0;
    }
    Some(picks)
}

/// The paper's STATIC policy (§3.2): application `a` with `C_a` compute nodes gets
/// `⌈C_a / R⌉` units, `R = C / F` (`C` compute nodes and `F` units in the machine).
/// Note: the sum may exceed `F` (the paper's definition does not prevent it).
pub fn static_units(sizes: &[u32], machine_nodes: u32, units: u32) -> Vec<u32> {
    let r = machine_nodes.max(1) as f64 / units.max(1) as f64;
    sizes
        .iter()
        .map(|&c| (c as f64 / r - 1e-9).ceil().max(0.0) as u32)
        .collect()
}

/// The paper's SIZE policy (§3.2): `round(F · s_a / Σ s)` units, proportional to size
/// among the running applications.
pub fn size_units(sizes: &[u32], units: u32) -> Vec<u32> {
    let total: f64 = sizes.iter().map(|&s| s as f64).sum();
    sizes
        .iter()
        .map(|&s| {
            if total > 0.0 {
                (units as f64 * s as f64 / total).round() as u32
            } else {
                0
            }
        })
        .collect()
}

/// Options derived for a job that offers none: rate levels `k/4 · demand`
/// (`k = 0..=4`), each worth the throughput the job would achieve with it,
/// `min(level, need)`.
pub fn default_options(j: &JobSnapshot, out: &mut Vec<RateOption>) {
    default_options_within(j, f64::INFINITY, out);
}

/// [`default_options`] with the demand capped at `max_rate` first (a level above
/// `Max_R` can never be chosen: a job demanding 10³⁰⁸ of 1 000 would be offered
/// nothing but 0).
pub fn default_options_within(j: &JobSnapshot, max_rate: f64, out: &mut Vec<RateOption>) {
    out.clear();
    let d = clean(j.demand).min(clean(max_rate).max(0.0));
    let need = clean(j.need());
    for k in 0..=4 {
        // d/4 first: d·k overflows to inf for d near f64::MAX.
        let rate = d / 4.0 * k as f64;
        out.push(RateOption {
            rate,
            utility: rate.min(need),
        });
    }
}

/// Default DP resolution (quanta per `Max_R`).
pub const DEFAULT_RESOLUTION: usize = 1000;

/// Largest DP resolution `mckp:RESOLUTION` accepts (the DP keeps `resolution + 1`
/// values and one byte per job and quantum).
pub const MAX_RESOLUTION: usize = 100_000;

/// Most cells of the DP's choice table (one byte each, 64 MiB): with more jobs than
/// `MAX_DP_CELLS / (resolution + 1)` the cycle uses fewer, coarser quanta (options are
/// still rounded up, so the choice stays feasible).
pub const MAX_DP_CELLS: usize = 1 << 26;

/// The MCKP policy: maximise the total utility of the chosen options within `Max_R`.
///
/// Jobs that offer no options get [`default_options`]. If even the cheapest options do
/// not fit (over-subscribed minimum), every job gets its cheapest option scaled down
/// proportionally so that the total is `Max_R`.
#[derive(Debug, Clone)]
pub struct Mckp {
    /// Number of quanta `Max_R` is divided into for the DP.
    pub resolution: usize,
    classes: Vec<Vec<(usize, f64)>>,
    opts: Vec<RateOption>,
}

impl Mckp {
    /// MCKP with the given DP resolution (1 to [`MAX_RESOLUTION`]).
    pub fn new(resolution: usize) -> Self {
        Mckp {
            resolution: resolution.clamp(1, MAX_RESOLUTION),
            classes: Vec::new(),
            opts: Vec::new(),
        }
    }
}

impl Default for Mckp {
    fn default() -> Self {
        Mckp::new(DEFAULT_RESOLUTION)
    }
}

impl Policy for Mckp {
    fn name(&self) -> String {
        if self.resolution == DEFAULT_RESOLUTION {
            "mckp".into()
        } else {
            format!("mckp:{}", self.resolution)
        }
    }

    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        let max_rate = clean(max_rate);
        // Within the memory budget of the choice table (jobs × (resolution + 1) bytes).
        let resolution = self
            .resolution
            .min((MAX_DP_CELLS / jobs.len().max(1)).saturating_sub(1))
            .max(1);
        // Whole operations while Max_R is a whole number of them within the resolution
        // (whole options then fit exactly); else Max_R in `resolution` units, so that no
        // fraction of it — all of a Max_R below one — is lost to the units.
        let quantum = if max_rate <= resolution as f64 && max_rate.fract() == 0.0 {
            1.0
        } else {
            max_rate / resolution as f64
        };
        let capacity = (max_rate / quantum + 1e-9).floor() as usize;
        self.classes.resize_with(jobs.len(), Vec::new);
        let mut rates: Vec<Vec<f64>> = Vec::with_capacity(jobs.len());
        for (j, class) in jobs.iter().zip(self.classes.iter_mut()) {
            if j.options.is_empty() {
                default_options_within(j, max_rate, &mut self.opts);
            } else {
                self.opts.clear();
                self.opts.extend_from_slice(&j.options);
            }
            class.clear();
            let mut r = Vec::with_capacity(self.opts.len());
            for o in &self.opts {
                // An option whose rate is no finite number is dropped: counted as 0 it
                // would be free and still bring its utility.
                if !(o.rate.is_finite() && o.utility.is_finite()) {
                    continue;
                }
                let rate = clean(o.rate);
                let units = (rate / quantum - 1e-9).ceil().max(0.0);
                class.push((
                    units.min(usize::MAX as f64 / 4.0) as usize,
                    clean(o.utility),
                ));
                r.push(rate);
            }
            rates.push(r);
        }
        out.clear();
        match solve(capacity, &self.classes[..jobs.len()]) {
            Some(picks) => out.extend(picks.iter().zip(&rates).map(|(&p, r)| r[p])),
            None => {
                out.extend(
                    rates
                        .iter()
                        .map(|r| r.iter().copied().fold(f64::INFINITY, f64::min)),
                );
                for o in out.iter_mut() {
                    if !o.is_finite() {
                        *o = 0.0;
                    }
                }
            }
        }
        cap_total(max_rate, out);
    }
}

/// A rate-control version of the paper's STATIC / SIZE baselines: `Max_R` is divided
/// into `units` equal parts (the paper's I/O forwarding nodes) and each job is given
/// [`static_units`] (with `machine_nodes`) or [`size_units`] of them. Totals above
/// `Max_R` (possible with STATIC's ceiling, and with SIZE's rounding) are scaled down.
#[derive(Debug, Clone)]
pub struct UnitBaseline {
    /// `Some(C)`: STATIC with `C` compute nodes in the machine; `None`: SIZE.
    pub machine_nodes: Option<u32>,
    /// Number of units `Max_R` is divided into.
    pub units: u32,
    sizes: Vec<u32>,
}

impl UnitBaseline {
    /// The STATIC baseline.
    pub fn fixed(machine_nodes: u32, units: u32) -> Self {
        UnitBaseline {
            machine_nodes: Some(machine_nodes),
            units: units.max(1),
            sizes: Vec::new(),
        }
    }
    /// The SIZE baseline.
    pub fn size(units: u32) -> Self {
        UnitBaseline {
            machine_nodes: None,
            units: units.max(1),
            sizes: Vec::new(),
        }
    }
}

impl Policy for UnitBaseline {
    fn name(&self) -> String {
        match self.machine_nodes {
            Some(c) => format!("mckp-static:{c},{}", self.units),
            None => format!("mckp-size:{}", self.units),
        }
    }
    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        let max_rate = clean(max_rate);
        self.sizes.clear();
        self.sizes.extend(jobs.iter().map(|j| j.size));
        let units = match self.machine_nodes {
            Some(c) => static_units(&self.sizes, c, self.units),
            None => size_units(&self.sizes, self.units),
        };
        // Scaled down in units, then converted: `u · unit` overflows to inf for
        // Max_R near f64::MAX (and `cap / inf` gave everybody 0).
        let given: f64 = units.iter().map(|&u| u as f64).sum();
        let scale = if given > self.units as f64 {
            self.units as f64 / given
        } else {
            1.0
        };
        let unit = max_rate / self.units as f64;
        out.clear();
        out.extend(units.iter().map(|&u| u as f64 * scale * unit));
        cap_total(max_rate, out);
    }
}
