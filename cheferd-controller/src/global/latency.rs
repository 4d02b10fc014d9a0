//! The cycle latencies of every cycle since start, as the metrics endpoint shows them
//! (a Prometheus histogram, [`crate::metrics`]).

use std::time::Duration;

/// Upper bounds (seconds) of the cycle latency histogram's buckets: from a cycle with
/// nothing to wait for (≈ 100 µs) past the collect deadline (≤ 500 ms); slower cycles
/// fall in `+Inf`.
pub const LATENCY_BUCKETS: [f64; 13] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The cycle latencies of every cycle since start, as a Prometheus histogram.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyHistogram {
    /// Observations per bucket of [`LATENCY_BUCKETS`] (not cumulative), and above the
    /// last bound in the extra last slot.
    counts: [u64; LATENCY_BUCKETS.len() + 1],
    /// Sum of all observations, seconds.
    sum: f64,
}

impl LatencyHistogram {
    /// Records one cycle's latency.
    pub fn observe(&mut self, latency: Duration) {
        let seconds = latency.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[bucket] += 1;
        self.sum += seconds;
    }

    /// Cycles observed.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Observations per bucket of [`LATENCY_BUCKETS`] (not cumulative), then above the
    /// last bound.
    pub fn counts(&self) -> [u64; LATENCY_BUCKETS.len() + 1] {
        self.counts
    }

    /// Sum of all observations, seconds.
    pub fn sum(&self) -> f64 {
        self.sum
    }
}
