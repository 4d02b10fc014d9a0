//! Markov-chain prediction of the next write sizes (Paul et al. §III-B, Algorithm 1).
//!
//! * `assignStates`: the write sizes seen so far are modelled as a normal distribution
//!   `N(μ, σ)` and the curve is cut into five segments of equal area (0.2 each): state
//!   0 for `|R − μ| ≤ 0.25σ`, ±1 up to `0.85σ`, ±2 beyond ([`state_of`]; `Φ(0.253) −
//!   Φ(−0.253) ≈ 0.2`, `Φ(0.842) − Φ(0.253) ≈ 0.2`).
//! * `trainModel`: an order-`m` chain counts, for every context of `m` consecutive
//!   states in the history, which state followed it ("every request that arrives is
//!   stored as a key with value as the requests that follow"). Counting is done on the
//!   fly over the history, so nothing of size `5^m` is allocated and any order 1–8 costs
//!   `O(n·m)` per predicted request for a history of `n` requests.
//! * `predictModel`: the next state is the one that most often followed the last `m`
//!   states; ties go to the one seen most recently (dynamic learning favours recent
//!   behaviour). Further predictions extend the context with the predicted states.
//!   A context never seen before backs off to order `m − 1`, …, 0 (the most frequent
//!   state) — the paper does not say what an unseen context predicts.
//! * `statesToPrediction`: state 0 → `μ`, ±1 → `μ ± 0.5σ`, ±2 → `μ ± 1.7σ`
//!   ([`value_of`]; the paper's quantised values of the five regions).
//!
//! The paper chooses the training length (≤ 16 requests) by mean square error; here the
//! caller passes the history it wants the chain trained on (the simulator keeps the last
//! [`DEFAULT_WINDOW`] requests of each application).

/// History length the simulator and `policies place` keep per application.
pub const DEFAULT_WINDOW: usize = 256;

/// Highest order accepted (the paper's Table II goes to 8).
pub const MAX_ORDER: usize = 8;

/// Mean and (population) standard deviation of `xs` (`(0, 0)` if empty).
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mu = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mu) * (x - mu)).sum::<f64>() / n;
    (mu, var.max(0.0).sqrt())
}

/// Algorithm 1, `assignStates`, for one request size `r`: a state in `-2..=2`.
pub fn state_of(r: f64, mu: f64, sd: f64) -> i8 {
    if (mu - 0.25 * sd..=mu + 0.25 * sd).contains(&r) {
        0
    } else if r >= mu - 0.85 * sd && r < mu - 0.25 * sd {
        -1
    } else if r > mu + 0.25 * sd && r <= mu + 0.85 * sd {
        1
    } else if r < mu - 0.85 * sd {
        -2
    } else {
        2
    }
}

/// Algorithm 1, `statesToPrediction`, for one state.
pub fn value_of(state: i8, mu: f64, sd: f64) -> f64 {
    match state {
        0 => mu,
        -1 => mu - 0.5 * sd,
        1 => mu + 0.5 * sd,
        -2 => mu - 1.7 * sd,
        _ => mu + 1.7 * sd,
    }
}

/// The states of every size in `xs` under `N(mu, sd)`.
pub fn states(xs: &[f64], mu: f64, sd: f64) -> Vec<i8> {
    xs.iter().map(|&x| state_of(x, mu, sd)).collect()
}

/// The state that most often followed the last `order` states of `seq` (ties: the most
/// recent), backing off to shorter contexts when this one was never followed. `None`
/// only for an empty sequence.
pub fn next_state(seq: &[i8], order: usize) -> Option<i8> {
    if seq.is_empty() {
        return None;
    }
    for m in (0..=order.min(seq.len())).rev() {
        let ctx = &seq[seq.len() - m..];
        let mut count = [0u32; 5];
        let mut last = [0usize; 5];
        // Every position i where seq[i-m..i] == ctx and i < len: seq[i] followed it.
        for i in m..seq.len() {
            if &seq[i - m..i] == ctx {
                let s = (seq[i] + 2) as usize;
                count[s] += 1;
                last[s] = i + 1;
            }
        }
        if count.iter().any(|&c| c > 0) {
            let best = (0..5)
                .max_by(|&a, &b| count[a].cmp(&count[b]).then(last[a].cmp(&last[b])))
                .expect("five states");
            return Some(best as i8 - 2);
        }
    }
    None
}

/// Algorithm 1 end to end: the next `horizon` write sizes after `history`, predicted by
/// an order-`order` chain (1 ≤ order ≤ 8; 0 predicts the mean).
///
/// * Empty unless `history` is longer than `order`: "the training sequence of requests
///   is a list of any length longer than the order of Markov chain" (§III-B), so an
///   application with no past (or too short a one) has no predicted requests.
/// * A prediction is never below the smallest size in `history`: `μ − 1.7σ` (state −2)
///   is negative for a history of a few large and many small sizes, and a size cannot
///   be. State −2 is only predicted if it was seen, i.e. if the smallest size is below
///   `μ − 0.85σ`, so the raised value stays in state −2.
pub fn predict(history: &[f64], order: usize, horizon: usize) -> Vec<f64> {
    if history.len() <= order || horizon == 0 {
        return Vec::new();
    }
    let (mu, sd) = mean_sd(history);
    if order == 0 || sd == 0.0 {
        return vec![mu; horizon];
    }
    let smallest = history.iter().copied().fold(f64::INFINITY, f64::min);
    let mut seq = states(history, mu, sd);
    let mut out = Vec::with_capacity(horizon);
    for _ in 0..horizon {
        let s = next_state(&seq, order.min(MAX_ORDER)).unwrap_or(0);
        seq.push(s);
        out.push(value_of(s, mu, sd).max(smallest));
    }
    out
}

/// Table II's accuracy: the share (%) of requests whose state the chain predicted
/// correctly one step ahead, each prediction trained on the `window` requests before
/// it (states under that window's `μ, σ`), over `sizes[window..]`.
pub fn accuracy(sizes: &[f64], order: usize, window: usize) -> f64 {
    let window = window.max(order + 1);
    if sizes.len() <= window {
        return 0.0;
    }
    let mut hits = 0usize;
    for i in window..sizes.len() {
        let hist = &sizes[i - window..i];
        let (mu, sd) = mean_sd(hist);
        let seq = states(hist, mu, sd);
        let p = next_state(&seq, order).unwrap_or(0);
        if p == state_of(sizes[i], mu, sd) {
            hits += 1;
        }
    }
    100.0 * hits as f64 / (sizes.len() - window) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_equal_area_segments() {
        assert_eq!(state_of(10.0, 10.0, 1.0), 0);
        assert_eq!(state_of(10.25, 10.0, 1.0), 0);
        assert_eq!(state_of(10.5, 10.0, 1.0), 1);
        assert_eq!(state_of(9.5, 10.0, 1.0), -1);
        assert_eq!(state_of(11.0, 10.0, 1.0), 2);
        assert_eq!(state_of(9.0, 10.0, 1.0), -2);
        assert_eq!(value_of(2, 10.0, 1.0), 11.7);
        assert_eq!(value_of(-1, 10.0, 1.0), 9.5);
    }

    #[test]
    fn order_three_learns_a_pattern_order_one_cannot() {
        // Period 4: after `1` comes either `1` or `2` — ambiguous at order 1.
        let pat = [1.0, 1.0, 5.0, 3.0];
        let h: Vec<f64> = (0..40).map(|i| pat[i % 4]).collect();
        assert!(accuracy(&h, 3, 16) > accuracy(&h, 1, 16));
        assert_eq!(accuracy(&h, 3, 16), 100.0);
        let p = predict(&h, 3, 4);
        let (mu, sd) = mean_sd(&h);
        let s: Vec<i8> = p.iter().map(|&x| state_of(x, mu, sd)).collect();
        assert_eq!(s, states(&pat, mu, sd));
    }
}
