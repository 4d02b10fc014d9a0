//! AdapTBF token lending and borrowing (AdapTBF paper §III-C, eqs. 1–25).
//!
//! Every control interval `Δt` the resource has `T·Δt` tokens (`T` = `Max_R`). They are
//! allocated in three steps:
//!
//! 1. **Priority-based initial allocation** (§III-C1): `p_x = n_x / Σ n` from node counts
//!    (eq. 1), `α_x = T·p_x·Δt` (eq. 2).
//! 2. **Redistribution of surplus tokens** (§III-C2): utilization `u_x = d_x / α_x^{t−1}`
//!    (eq. 3), surplus `Ts_x = α_x − d_x` when positive (eqs. 4–5), distribution factor
//!    `DF_x` (eq. 6); the surplus is shared by `DF` (eq. 7) and lenders' records grow,
//!    borrowers' shrink (eq. 8).
//! 3. **Re-compensation** (§III-C3): lenders (`J+`, eq. 9) whose demand comes back reclaim
//!    tokens from borrowers (`J−`, eq. 10) with the reclaim coefficient `C` (eqs. 11–13),
//!    bounded by the borrowers' records (eq. 14), shared among lenders by `DF`
//!    (eqs. 15–20).
//!
//! Only **active** jobs take part (§III-C1: "allocates tokens only to active jobs …
//! those that have submitted RPC requests"): a job whose observed demand is zero gets no
//! tokens, counts in no priority (eq. 1), lends nothing (eqs. 4–8) and is in neither
//! `J+` nor `J−` (eqs. 9–10); its record and remainder wait unchanged until it is
//! active again. With no active job at all, no tokens are handed out.
//!
//! Tokens are integers: at each step every job's fractional part is carried as a
//! remainder `ρ_x` to its next step (eqs. 21–25) and the largest-remainder rule makes
//! each step distribute exactly its total (§III-C4); the tokens moved by that rule are
//! charged to the remainders, so `α_f + ρ` is exact and long-run shares are exact
//! within one token. Records are integers, so they always sum to exactly zero.
//!
//! ## State and departures
//! The state ([`AdaptbfState`]) keeps, per job, its record, remainder and last allocation
//! (`α^{t−1}`, needed by eq. 3). A job that is absent from a snapshot has left: its entry
//! is dropped and its record is **written off** against the jobs that remain — if it
//! left owing tokens (negative record), the lenders' positive records are reduced in
//! proportion to their size; if it left being owed (positive record), the borrowers'
//! debts are forgiven in proportion. Records therefore keep summing to zero over the
//! active jobs, and nobody reclaims tokens from a job that can no longer repay them.
//!
//! ## Clarifications of the paper (documented deviations)
//! * `d_x` is the job's observed demand in tokens: [`JobSnapshot::need`]`·Δt` (served
//!   plus held-back operations).
//! * `T·Δt` is floored: a cycle hands out `⌊Max_R·Δt⌋` whole tokens (eq. 2 sums to
//!   that). Carrying the fraction to the next cycle would hand out more than
//!   `Max_R·Δt` in some cycles. When `0 < Max_R·Δt < 1` (the floor would starve every
//!   job for ever) the cycle hands out one token worth `Max_R·Δt` operations, so the
//!   rates still add up to `Max_R`.
//! * Bounds (hostile inputs): a cycle hands out at most [`MAX_TOKENS`] (2⁵³) tokens, a
//!   demand `d_x` counts at most that many (so `u_x` and `DF_x`, eqs. 3 and 6, stay
//!   finite: an overflowing demand is the largest one, not NaN), and records are kept
//!   within `±`[`MAX_RECORD`] (2⁶⁰; the excess is written off like a departure's).
//!   States with records or allocations beyond them are refused.
//! * Eq. (1)'s node count is at least 1 (as the controller sends it): a job of size 0
//!   is weighted like a job of one node instead of getting nothing.
//! * A job seen for the first time — or idle in the previous cycle (`α^{t−1} = 0`) —
//!   has no meaningful `α^{t−1}`; its current initial allocation is used. Zero
//!   denominators count as one token.
//! * Eq. (13) writes `C_x^t` but sums over all of `J+`: it is one coefficient per step,
//!   computed as `Σ n_x·(…) / (2·Σn)` so that eq. (14)'s floor of a whole `C·α_RD` is
//!   exact. Eq. (14) is additionally bounded by the borrower's record after
//!   redistribution and by its allocation (a job cannot give back more than it holds),
//!   and the total reclaimed by the lenders' total record (no over-compensation); when
//!   that bound cuts, every borrower gives the same fraction of its `T_R^x`.
//! * Eqs. (19)–(20) are applied as printed: a lender gets its `DF` share of `T_R` even
//!   if that is more than its own record (which then turns negative).
//! * Eq. (24) as printed (`ρ = α − ⌊α + ρ_prev⌋`) drops `ρ_prev`; we carry
//!   `ρ = (α + ρ_prev) − α_f`. In the largest-remainder correction ("as we update the
//!   allocated tokens, we also adjust the remainder") a job given an extra token carries
//!   `ρ − 1`, one losing a token `ρ + 1`; leftover tokens go to the largest remainders,
//!   excess tokens are taken from the smallest (the jobs furthest above their share).
//!   So `ρ ∈ (−1, 1)`, and no credit is lost to rounding. A step never takes a job below
//!   zero tokens (the debt stays in its remainder), and `|ρ|` is capped at
//!   [`RHO_BOUND`] — reached only when the active set changes while jobs carry credit.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::util::clean;
use crate::{JobId, JobSnapshot, Policy, StateError};

/// Most tokens a cycle hands out, and most a demand counts (2⁵³: every token count is
/// exact as an `f64`, and sums of them cannot overflow).
pub const MAX_TOKENS: i64 = 1 << 53;

/// Bound on a record `|r_x|` (2⁶⁰): a record moves by at most 2·[`MAX_TOKENS`] a cycle,
/// so arithmetic on records never overflows; beyond the bound the excess is written
/// off.
pub const MAX_RECORD: i64 = 1 << 60;

/// What AdapTBF remembers about one job between cycles.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobEntry {
    /// The job.
    pub id: JobId,
    /// Tokens lent (> 0) or borrowed (< 0) so far (`r_x`).
    pub record: i64,
    /// Fractional token carried to the next allocation step (`ρ_x`, in
    /// `[−RHO_BOUND, RHO_BOUND]`; negative: the job got a token ahead of its share).
    pub remainder: f64,
    /// Tokens allocated in the previous cycle (`α_x^{t−1}`; 0 if it was idle).
    pub allocated: u64,
}

/// AdapTBF's state across cycles (serialised by `policies allocate`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptbfState {
    /// One entry per job of the previous cycle, in that cycle's order.
    pub jobs: Vec<JobEntry>,
}

/// Per-job scratch of one cycle.
#[derive(Debug, Clone, Copy, Default)]
struct Work {
    id: JobId,
    /// Weight of eq. (1): the job's node count (1 each if no active job has nodes).
    n: f64,
    p: f64,
    d: f64,
    u: f64,
    df: f64,
    record: i64,
    record0: i64,
    rho: f64,
    prev: Option<u64>,
    alpha: i64,
    surplus: i64,
    share: i64,
    /// Submitted I/O during the last interval (§III-C1: only active jobs get tokens).
    active: bool,
}

/// The AdapTBF policy (see the module documentation).
#[derive(Debug, Clone)]
pub struct Adaptbf {
    /// Control interval `Δt` in seconds (tokens per cycle = `Max_R·Δt`).
    pub interval: f64,
    state: AdaptbfState,
    work: Vec<Work>,
    idx: Vec<u32>,
    raw: Vec<f64>,
    alloc: Vec<i64>,
    order: Vec<u32>,
}

impl Default for Adaptbf {
    fn default() -> Self {
        Adaptbf::new(1.0)
    }
}

impl Adaptbf {
    /// AdapTBF with a control interval of `interval` seconds.
    pub fn new(interval: f64) -> Self {
        Adaptbf {
            interval: if interval.is_finite() && interval > 0.0 {
                interval
            } else {
                1.0
            },
            state: AdaptbfState::default(),
            work: Vec::new(),
            idx: Vec::new(),
            raw: Vec::new(),
            alloc: Vec::new(),
            order: Vec::new(),
        }
    }

    /// The state after the last cycle.
    pub fn current_state(&self) -> &AdaptbfState {
        &self.state
    }

    /// Load the previous state into `self.work` and write off departed jobs' records.
    fn load_work(&mut self, jobs: &[JobSnapshot]) {
        self.work.clear();
        let prev = &self.state.jobs;
        let aligned = prev.len() >= jobs.len() && jobs.iter().zip(prev).all(|(j, e)| j.id == e.id);
        let map: Option<HashMap<JobId, usize>> = if aligned {
            None
        } else {
            Some(prev.iter().enumerate().map(|(i, e)| (e.id, i)).collect())
        };

        for (k, j) in jobs.iter().enumerate() {
            let entry = match &map {
                None => Some(&prev[k]),
                Some(m) => m.get(&j.id).map(|&i| &prev[i]),
            };
            let mut w = Work {
                id: j.id,
                ..Work::default()
            };
            if let Some(e) = entry {
                w.record = e.record;
                w.rho = if e.remainder.is_finite() && e.remainder.abs() <= RHO_BOUND {
                    e.remainder
                } else {
                    0.0
                };
                // A job that got nothing last cycle (idle then) has no meaningful
                // α^{t−1}: it is treated like a new job (see the module docs).
                w.prev = (e.allocated > 0).then_some(e.allocated);
            }
            self.work.push(w);
        }
        // Departed jobs (in the previous state, absent now): write their records off
        // against the remaining jobs (a no-op when nobody left owing or being owed).
        self.write_off();
    }

    /// Bring the remaining jobs' records back to a zero sum (departed jobs took the
    /// difference with them).
    fn write_off(&mut self) {
        let remaining: i128 = self.work.iter().map(|w| i128::from(w.record)).sum();
        if remaining == 0 {
            return;
        }
        let sign = remaining.signum() as i64;
        let remaining = i64::try_from(remaining).unwrap_or(sign * i64::MAX);
        // remaining > 0: lenders lose `remaining` in proportion to their records;
        // remaining < 0: borrowers are forgiven `|remaining|` in proportion.
        self.idx.clear();
        self.raw.clear();
        for (i, w) in self.work.iter().enumerate() {
            if w.record.signum() == sign {
                self.idx.push(i as u32);
                self.raw.push(w.record.unsigned_abs() as f64);
            }
        }
        split_whole(
            remaining.saturating_abs(),
            &self.idx,
            &self.raw,
            &self.work,
            &mut self.alloc,
        );
        for (&i, &amount) in self.idx.iter().zip(&self.alloc) {
            let w = &mut self.work[i as usize];
            w.record -= sign * amount.min(w.record.saturating_abs());
        }
    }
}

/// Bound on a carried remainder `|ρ_x|`. With the bookkeeping of [`apportion`]
/// (`α_f + ρ_new = α_raw + ρ_prev`, exactly) remainders stay in `(−1, 1)` while the set
/// of jobs of a step does not change; the bound only guards against drift when jobs go
/// idle, come back, join or leave with credit (and against bad state files).
pub const RHO_BOUND: f64 = 1.0;

/// Split `total` whole tokens over the jobs `idx` in proportion to `weights`, by the
/// plain largest-remainder rule (ties: lower job id first), into `alloc`. For the
/// bookkeeping steps (write-offs, a capped reclaim), which carry no remainders.
fn split_whole(total: i64, idx: &[u32], weights: &[f64], work: &[Work], alloc: &mut Vec<i64>) {
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| total as f64 * w / sum).collect();
    alloc.clear();
    alloc.extend(
        exact
            .iter()
            .map(|e| clean(e.floor()).min(total as f64) as i64),
    );
    let given: i128 = alloc.iter().map(|&a| i128::from(a)).sum();
    let short = (i128::from(total) - given).clamp(0, idx.len() as i128);
    let mut order: Vec<usize> = (0..idx.len()).collect();
    let fraction = |k: usize| exact[k] - exact[k].floor();
    let id = |k: usize| work[idx[k] as usize].id;
    order.sort_by(|&a, &b| fraction(b).total_cmp(&fraction(a)).then(id(a).cmp(&id(b))));
    for &k in order.iter().take(short as usize) {
        alloc[k] += 1;
    }
}

/// Apportion `total` integer tokens over the jobs listed in `idx` with real shares
/// `raw` (same order, summing to `total`), carrying each job's remainder (AdapTBF
/// eqs. 23–25) and correcting with the largest-remainder rule (§III-C4) so that the
/// integer results sum to exactly `total`. Results go to `alloc[k]` for `idx[k]`.
///
/// §III-C4: "As we update the allocated tokens, we also adjust the remainder": a job
/// given an extra token carries `ρ − 1`, a job losing one carries `ρ + 1`, so
/// `α_f + ρ` always equals `α_raw + ρ_prev` and no job loses or gains credit through
/// rounding. Over a fixed set of jobs `Σ ρ` is then invariant (zero from a fresh
/// start), every `ρ` stays in `(−1, 1)`, and a job's cumulative tokens differ from its
/// cumulative raw share by less than one token, however long it runs.
fn apportion(
    total: i64,
    idx: &[u32],
    raw: &[f64],
    work: &mut [Work],
    alloc: &mut Vec<i64>,
    order: &mut Vec<u32>,
) {
    alloc.clear();
    let mut sum = 0i64;
    for (&i, &r) in idx.iter().zip(raw) {
        let w = &mut work[i as usize];
        // eq. (23): α^f = ⌊α + ρ_prev⌋ (never below zero: a job cannot give back
        // tokens it was not allocated in this step; the debt stays in ρ)
        let v = clean(r) + w.rho;
        let a = v.floor().max(0.0);
        // eqs. (24)–(25): ρ = (α + ρ_prev) − α^f
        w.rho = v - a;
        alloc.push(a as i64);
        sum += a as i64;
    }
    let mut diff = total - sum;
    // Largest remainder first (§III-C4). Leftover tokens go to the largest remainders;
    // excess tokens are taken from the smallest (most negative) remainders, i.e. from
    // the jobs furthest above their exact share (ties: lower job id first). Only the
    // top |diff| jobs are needed: a selection (O(n)) instead of a full sort.
    while diff != 0 && !idx.is_empty() {
        order.clear();
        // Candidates: anyone for a missing token; holders of a token for an excess one.
        order.extend((0..idx.len() as u32).filter(|&k| diff > 0 || alloc[k as usize] > 0));
        if order.is_empty() {
            break; // cannot happen with consistent inputs; never loop forever
        }
        let n = order.len() as i64;
        if diff.abs() >= n {
            // At least one token for every candidate: hand them out (or take them back)
            // in one pass, `q` each — what `q` single-token passes would do (a demand
            // of 2⁵³ tokens must not take 2⁵³ / n passes). Taking stops at the smallest
            // holding, so nobody goes below zero.
            let mut q = diff.abs() / n;
            if diff < 0 {
                q = order.iter().map(|&k| alloc[k as usize]).fold(q, i64::min);
            }
            let step = diff.signum() * q;
            for &k in order.iter() {
                alloc[k as usize] += step;
                work[idx[k as usize] as usize].rho -= step as f64;
            }
            diff -= step * n;
            continue;
        }
        let m = diff.unsigned_abs() as usize;
        if m < order.len() {
            let w: &[Work] = work;
            let give = diff > 0;
            order.select_nth_unstable_by(m - 1, |a, b| {
                let (wa, wb) = (&w[idx[*a as usize] as usize], &w[idx[*b as usize] as usize]);
                let by_rho = if give {
                    wb.rho.total_cmp(&wa.rho)
                } else {
                    wa.rho.total_cmp(&wb.rho)
                };
                by_rho.then(wa.id.cmp(&wb.id))
            });
        }
        for &k in &order[..m] {
            let k = k as usize;
            let w = &mut work[idx[k] as usize];
            if diff > 0 {
                alloc[k] += 1;
                w.rho -= 1.0;
            } else {
                alloc[k] -= 1;
                w.rho += 1.0;
            }
        }
        diff -= diff.signum() * m as i64;
    }
    for &i in idx {
        let w = &mut work[i as usize];
        w.rho = w.rho.clamp(-RHO_BOUND, RHO_BOUND);
    }
}

impl Adaptbf {
    /// [`apportion`] `total` over `self.idx` with shares `self.raw` into `self.alloc`.
    fn apportion(&mut self, total: i64) {
        apportion(
            total,
            &self.idx,
            &self.raw,
            &mut self.work,
            &mut self.alloc,
            &mut self.order,
        );
    }
}

impl Policy for Adaptbf {
    fn name(&self) -> String {
        if self.interval == 1.0 {
            "adaptbf".into()
        } else {
            format!("adaptbf:{}", self.interval)
        }
    }

    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        let dt = self.interval;
        // ⌊Max_R·Δt⌋ tokens of one operation each; below one token, one token worth
        // Max_R·Δt operations (see the module docs).
        let quota = clean(max_rate) * dt;
        let (total, token) = if quota > 0.0 && quota < 1.0 {
            (1, quota)
        } else {
            (quota.min(MAX_TOKENS as f64).floor() as i64, 1.0)
        };
        self.load_work(jobs);

        // §III-C1: "allocates tokens only to active jobs … those that have submitted RPC
        // requests … during the observation period". A job that issued nothing is not in
        // J_i^Δt: it gets no tokens, takes no part in the priorities (eq. 1), lends
        // nothing (eqs. 4–8) and is neither in J+ nor J− (eqs. 9–10). Its record and
        // remainder are kept unchanged until it is active again.
        let mut n_active = 0usize;
        let mut nodes = 0.0;
        for (w, j) in self.work.iter_mut().zip(jobs) {
            // Saturated: a demand of more tokens than a cycle can ever hand out is just
            // the largest demand (an overflow to inf made DF = inf/inf = NaN).
            w.d = (clean(j.need()) * dt / token).min(MAX_TOKENS as f64);
            w.active = w.d > 0.0;
            w.record0 = w.record;
            if w.active {
                n_active += 1;
                nodes += j.size.max(1) as f64;
            }
        }

        // ---- Step 1: priority-based initial allocation ----
        // eq. (1): p_x = n_x / Σ_{J_i^Δt} n (equal weights if no active job has nodes)
        let nodes_known = nodes > 0.0;
        if !nodes_known {
            nodes = n_active as f64;
        }
        for (w, j) in self.work.iter_mut().zip(jobs) {
            w.n = match (w.active, nodes_known) {
                (false, _) => 0.0,
                (true, true) => j.size.max(1) as f64,
                (true, false) => 1.0,
            };
            w.p = if w.active { w.n / nodes } else { 0.0 };
        }
        // eq. (2): α_x = T · p_x · Δt   (integer, with remainders)
        self.idx.clear();
        self.raw.clear();
        for (i, w) in self.work.iter().enumerate() {
            if w.active {
                self.idx.push(i as u32);
                self.raw.push(total as f64 * w.p);
            }
        }
        if n_active > 0 {
            self.apportion(total);
        }
        for (&i, &a) in self.idx.iter().zip(&self.alloc) {
            self.work[i as usize].alpha = a;
        }

        // ---- Step 2: redistribution of surplus tokens ----
        let mut ts = 0i64;
        let mut df_sum = 0.0;
        for w in self.work.iter_mut().filter(|w| w.active) {
            // eq. (3): u_x = d_x / α_x^{t−1}. A job outside J_i of the previous period was
            // allocated nothing ("only to active jobs", §III-C1), so d/α^{t−1} is
            // undefined; it is measured against the allocation it has now. (Counting
            // α^{t−1} = 0 as one token would make u = d: its DF, eq. 6, would scale with
            // its raw demand and the token unit, and a job back from idle would take
            // most of the surplus (eq. 7) and of T_R (eq. 19) just for having been idle.)
            let prev = w.prev.map(|a| a as i64).unwrap_or(w.alpha).max(1);
            w.u = w.d / prev as f64;
            // eq. (4): Ts_x = α_x − d_x if α_x > d_x (whole tokens)
            w.surplus = if (w.alpha as f64) > w.d {
                (w.alpha as f64 - w.d).floor() as i64
            } else {
                0
            };
            ts += w.surplus; // eq. (5)
                             // eq. (6): distribution factor
            w.df = if w.u > 1.0 {
                w.u + w.u * w.p
            } else {
                w.u * w.p
            };
            df_sum += w.df;
        }
        if ts > 0 {
            if df_sum > 0.0 {
                self.raw.clear();
                let work = &self.work;
                self.raw.extend(
                    self.idx
                        .iter()
                        .map(|&i| work[i as usize].df / df_sum * ts as f64),
                );
                self.apportion(ts);
                for (&i, &g) in self.idx.iter().zip(&self.alloc) {
                    self.work[i as usize].share = g;
                }
            } else {
                // Nobody can use the surplus: every job keeps its own.
                for w in self.work.iter_mut().filter(|w| w.active) {
                    w.share = w.surplus;
                }
            }
            for w in self.work.iter_mut().filter(|w| w.active) {
                w.alpha = w.alpha - w.surplus + w.share; // eq. (7)
                w.record = w.record + w.surplus - w.share; // eq. (8)
            }
        }

        // ---- Step 3: re-compensation for borrowed tokens ----
        // eqs. (9)–(10): active, sign kept before and after redistribution
        let lender = |w: &Work| w.active && w.record0 > 0 && w.record > 0;
        let borrower = |w: &Work| w.active && w.record0 < 0 && w.record < 0;
        // eq. (13) times 2·Σn: C = Σ_{J+} n_x·(max(1, u_x) + max(0, 1 − ū_x)) / (2·Σn).
        // Node counts are whole numbers, so C·α_RD below is computed exactly whenever
        // the utilization terms are (a lender with u ≤ 1 and ū ≥ 1 adds exactly n_x),
        // and eq. (14)'s floor does not lose a token to rounding when C·α_RD is whole
        // (with `Σ p_x·(…)/2` first, 15 came out as 14.999… and floored to 14).
        let mut c_nodes = 0.0;
        let mut lenders_record = 0i128;
        let mut lenders_df = 0.0;
        let mut n_lenders = 0usize;
        for w in self.work.iter().filter(|w| lender(w)) {
            // eq. (12): ū = d_x / α_{x,RD}
            let ubar = if w.alpha > 0 {
                w.d / w.alpha as f64
            } else if w.d > 0.0 {
                f64::INFINITY
            } else {
                0.0
            };
            c_nodes += w.n * (w.u.max(1.0) + (1.0 - ubar).max(0.0));
            lenders_record += i128::from(w.record);
            lenders_df += w.df;
            n_lenders += 1;
        }
        if n_lenders > 0 && c_nodes > 0.0 {
            // eq. (14): T_R^x = min(|r_x|, ⌊C · α_{x,RD}⌋), also ≤ |r_RD| and ≤ α_RD
            self.idx.clear();
            self.raw.clear();
            let mut asked = 0i64;
            for (i, w) in self.work.iter().enumerate().filter(|(_, w)| borrower(w)) {
                let by_c = (c_nodes * w.alpha as f64 / (2.0 * nodes))
                    .floor()
                    .min(i64::MAX as f64 / 4.0) as i64;
                let take = by_c
                    .min(w.record0.abs())
                    .min(w.record.abs())
                    .min(w.alpha)
                    .max(0);
                self.idx.push(i as u32);
                self.raw.push(take as f64);
                asked += take;
            }
            // No over-compensation: the lenders get back at most what they are owed in
            // total. If the borrowers would give more, every borrower gives the same
            // fraction of its T_R^x (eq. 14 is one rule for all of J−, not first come
            // first served in snapshot order).
            if i128::from(asked) > lenders_record {
                split_whole(
                    lenders_record as i64, // < asked
                    &self.idx,
                    &self.raw,
                    &self.work,
                    &mut self.alloc,
                );
            } else {
                self.alloc.clear();
                self.alloc.extend(self.raw.iter().map(|&t| t as i64));
            }
            let mut tr = 0i64;
            for (&i, &take) in self.idx.iter().zip(&self.alloc) {
                let w = &mut self.work[i as usize];
                w.alpha -= take; // eq. (15)
                w.record += take; // eq. (16)
                tr += take; // eq. (17)
            }
            if tr > 0 {
                // eqs. (18)–(20): shared among J+ by RF = DF
                self.idx.clear();
                self.raw.clear();
                for (i, w) in self.work.iter().enumerate() {
                    if lender(w) {
                        self.idx.push(i as u32);
                        let share = if lenders_df > 0.0 {
                            w.df / lenders_df
                        } else {
                            1.0 / n_lenders as f64
                        };
                        self.raw.push(share * tr as f64);
                    }
                }
                self.apportion(tr);
                for (&i, &g) in self.idx.iter().zip(&self.alloc) {
                    let w = &mut self.work[i as usize];
                    w.alpha += g; // eq. (19)
                    w.record -= g; // eq. (20)
                }
            }
        }

        // Records stay within ±MAX_RECORD; what is cut is written off as for a
        // departure, so they still sum to zero.
        let mut cut = false;
        for w in self.work.iter_mut() {
            if w.record.unsigned_abs() > MAX_RECORD as u64 {
                w.record = w.record.clamp(-MAX_RECORD, MAX_RECORD);
                cut = true;
            }
        }
        if cut {
            self.write_off();
        }

        // ---- Output and state ----
        out.clear();
        out.extend(self.work.iter().map(|w| w.alpha.max(0) as f64 * token / dt));
        self.state.jobs.clear();
        self.state.jobs.extend(self.work.iter().map(|w| JobEntry {
            id: w.id,
            record: w.record,
            remainder: w.rho,
            allocated: w.alpha.max(0) as u64,
        }));
    }

    fn state(&self) -> serde_json::Value {
        serde_json::to_value(&self.state).unwrap_or(serde_json::Value::Null)
    }

    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), crate::StateError> {
        if state.is_null() {
            self.state = AdaptbfState::default();
            return Ok(());
        }
        let loaded: AdaptbfState = serde_json::from_value(state.clone())?;
        for e in &loaded.jobs {
            let bad = |what: &str, value: &dyn std::fmt::Display, expected: &str| {
                Err(StateError::Invalid(format!(
                    "job {}: bad {what} {value} (expected {expected})",
                    e.id
                )))
            };
            if e.record.unsigned_abs() > MAX_RECORD as u64 {
                return bad("record", &e.record, "|record| ≤ 2^60");
            }
            if e.allocated > MAX_TOKENS as u64 {
                return bad("allocated", &e.allocated, "≤ 2^53 tokens");
            }
            if !(e.remainder.is_finite() && e.remainder.abs() <= RHO_BOUND) {
                return bad("remainder", &e.remainder, "a number in [-1, 1]");
            }
        }
        self.state = loaded;
        Ok(())
    }

    fn set_interval(&mut self, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            self.interval = seconds;
        }
    }
}
