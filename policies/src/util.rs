//! Small numeric helpers shared by the policies.

/// A non-negative finite number, or 0 (inputs come from JSON and from measurements:
/// NaN, infinities and negative values must never propagate into a rate).
#[inline]
pub(crate) fn clean(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}

/// Like [`clean`] but keeps `+inf` (an uncapped demand).
#[inline]
pub(crate) fn clean_cap(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        0.0
    } else {
        x
    }
}

/// Weighted max-min fair share ("water filling") of `capacity` over jobs with `caps`
/// (what each job can use; `f64::INFINITY` for no cap) and `weights` (`> 0`).
///
/// Jobs are processed in order of increasing `cap / weight` — the classic progressive
/// filling behind PADLL's proportional sharing (§IV-B: "jobs are allocated with I/O
/// resources in order of increasing demands, where (1) no job gets a share larger than
/// its demand and (2) jobs with unsatisfied demands get equal shares"). The result is
/// the unique weighted max-min fair allocation: `x_i = min(cap_i, λ·w_i)` with `λ` the
/// largest level such that `Σ x_i ≤ capacity`.
///
/// `order` is scratch space (reused across calls to keep cycles allocation-free).
/// Returns the capacity left over (`> 0` only when every job is capped).
pub(crate) fn water_fill(
    capacity: f64,
    caps: &[f64],
    weights: &[f64],
    out: &mut [f64],
    order: &mut Vec<(f64, u32)>,
) -> f64 {
    debug_assert_eq!(caps.len(), weights.len());
    debug_assert_eq!(caps.len(), out.len());
    order.clear();
    // Weights relative to the largest: their sum cannot overflow (two weights of 1e308
    // would sum to inf, and every job's share to 0).
    let largest = weights.iter().copied().fold(0.0, f64::max);
    let unit = if largest.is_finite() && largest > 0.0 {
        largest
    } else {
        1.0
    };
    let weight = |i: usize| weights[i] / unit;
    for (i, &c) in caps.iter().enumerate() {
        if weights[i] > 0.0 {
            order.push((c / weight(i), i as u32));
        } else {
            out[i] = 0.0;
        }
    }
    order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    // The sort key is no longer needed: `order[k].0` becomes the weight of the jobs
    // `k..` (suffix sums; subtracting each satisfied job's weight from the total loses
    // small weights: `(1 + 1e17) − 1e17` is 0, and the level would drop to 0 with
    // capacity left).
    let mut suffix = 0.0;
    for e in order.iter_mut().rev() {
        suffix += weight(e.1 as usize);
        e.0 = suffix;
    }
    let mut left = capacity.max(0.0);
    let mut k = 0;
    while k < order.len() {
        let i = order[k].1 as usize;
        let total_w = order[k].0;
        let level = if total_w > 0.0 { left / total_w } else { 0.0 };
        if caps[i] / weight(i) <= level {
            out[i] = caps[i];
            left = (left - caps[i]).max(0.0);
            k += 1;
        } else {
            // Every remaining job is unsatisfied: they share `left` by weight.
            for &(_, j) in &order[k..] {
                let j = j as usize;
                out[j] = level * weight(j);
            }
            return 0.0;
        }
    }
    left
}

/// Distribute `amount` over the jobs in proportion to `weights`, adding to `out`. If all
/// weights are zero, `amount` is split equally. Does nothing for an empty slice.
pub(crate) fn add_proportional(amount: f64, weights: impl Fn(usize) -> f64, out: &mut [f64]) {
    let n = out.len();
    if n == 0 || amount <= 0.0 {
        return;
    }
    let mut total: f64 = (0..n).map(&weights).sum();
    // Weights whose sum overflows (usages near f64::MAX) are taken relative to the
    // largest: `w / inf` would give everybody 0 and lose `amount`.
    let mut unit = 1.0;
    if !total.is_finite() {
        let largest = (0..n).map(&weights).fold(0.0, f64::max);
        if largest.is_finite() {
            unit = largest;
            total = (0..n).map(|i| weights(i) / unit).sum();
        }
    }
    if total > 0.0 {
        for (i, o) in out.iter_mut().enumerate() {
            // The fraction first: `amount · w` overflows for w near f64::MAX.
            *o += amount * (weights(i) / unit / total);
        }
    } else {
        let each = amount / n as f64;
        for o in out.iter_mut() {
            *o += each;
        }
    }
}

/// Scale `out` down proportionally if it adds up to more than `cap` (guards the
/// `Σ rate ≤ Max_R` contract against rounding and against static limits that
/// over-subscribe the resource).
pub(crate) fn cap_total(cap: f64, out: &mut [f64]) {
    let mut total: f64 = out.iter().sum();
    if total > cap && total > 0.0 {
        if !total.is_finite() {
            // The sum overflowed (limits near f64::MAX): scale by the largest first, or
            // `cap / inf` would give every job 0.
            let largest = out.iter().copied().fold(0.0, f64::max);
            if largest.is_finite() {
                for o in out.iter_mut() {
                    *o /= largest;
                }
                total = out.iter().sum();
            }
        }
        let f = cap.max(0.0) / total;
        for o in out.iter_mut() {
            *o *= f;
        }
    }
}

/// One `f64` parameter of a policy spec (`"psfa:0.5"`): a finite number `≥ 0`, or
/// `None` (the caller names the parameter).
pub(crate) fn parse_param(value: &str) -> Option<f64> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}
