//! Service-time histograms: how long the file system took to serve managed calls.
//!
//! One fixed log-scale layout everywhere (the stage's per-thread counters, its reports,
//! the local controller's per-interval differences, the global's per-resource
//! distributions, the Prometheus buckets), so histograms from any process on any node
//! merge by adding counts. Bucket 0 holds everything below 1.024 µs; above, every
//! power of two of nanoseconds is split in two halves (a bucket is at most 1.5 × as
//! wide as its lower bound: a quantile read from it, interpolated, is off by well under
//! that); the last bucket is open-ended (≥ 2^33 ns, ~8.6 s).

use crate::ops::Class;
use serde::{Deserialize, Serialize};

/// Buckets in the layout.
pub const BUCKETS: usize = 48;

/// The first bucket's upper bound is `2^FIRST_OCTAVE` ns (1.024 µs).
const FIRST_OCTAVE: u32 = 10;

/// The bucket counting a service time of `ns` nanoseconds.
#[inline(always)]
pub fn bucket_of(ns: u64) -> usize {
    // Exact: every bucket bound is a float, and only times far in the last bucket
    // (above 2^53 ns) round.
    bucket_of_f64(ns as f64)
}

/// [`bucket_of`] for a time in floating point, as the stage measures it (a tick count
/// times nanoseconds per tick): a dozen instructions, no branch. A negative time or
/// NaN counts in bucket 0.
#[inline(always)]
pub fn bucket_of_f64(ns: f64) -> usize {
    // A time in bucket 0 reads as 768 ns: the upper half of the octave below the first
    // bound (a compare the compiler makes one `maxsd`).
    let floor = (3u64 << (FIRST_OCTAVE - 2)) as f64;
    let ns = if ns > floor { ns } else { floor };
    // A positive double's bits from the 51st up: its biased exponent twice, plus the
    // mantissa's top bit (1 in an octave's upper half). 768 ns gives bucket 0.
    let halves = (ns.to_bits() >> 51) as usize;
    let floor_halves = 2 * (1023 + FIRST_OCTAVE as usize - 1) + 1;
    halves.wrapping_sub(floor_halves).min(BUCKETS - 1)
}

/// The smallest service time (ns) counted in bucket `index`.
pub fn lower_bound_ns(index: usize) -> u64 {
    if index == 0 {
        return 0;
    }
    let octave = FIRST_OCTAVE + (index as u32 - 1) / 2;
    let half = (index as u64 - 1) % 2;
    (1u64 << octave) + half * (1u64 << (octave - 1))
}

/// The first service time (ns) above bucket `index`; `None` for the last, open-ended one.
pub fn upper_bound_ns(index: usize) -> Option<u64> {
    (index + 1 < BUCKETS).then(|| lower_bound_ns(index + 1))
}

/// Counts per bucket: cumulative in a stage's reports, per interval once differenced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    counts: [u64; BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; BUCKETS],
        }
    }
}

impl Histogram {
    /// A histogram from reported counts (at most [`BUCKETS`]; missing ones are 0).
    pub fn from_counts(counts: &[u64]) -> Result<Histogram, TooManyBuckets> {
        if counts.len() > BUCKETS {
            return Err(TooManyBuckets(counts.len()));
        }
        let mut histogram = Histogram::default();
        histogram.counts[..counts.len()].copy_from_slice(counts);
        Ok(histogram)
    }

    /// The counts, trailing empty buckets left out (what a report carries).
    pub fn counts(&self) -> &[u64] {
        let used = self
            .counts
            .iter()
            .rposition(|&c| c != 0)
            .map_or(0, |i| i + 1);
        &self.counts[..used]
    }

    /// Adds one service time.
    pub fn record(&mut self, ns: u64) {
        self.counts[bucket_of(ns)] += 1;
    }

    /// Adds every count of `other` (saturating: a hostile report cannot wrap a sum).
    pub fn merge(&mut self, other: &Histogram) {
        for (sum, count) in self.counts.iter_mut().zip(other.counts.iter()) {
            *sum = sum.saturating_add(*count);
        }
    }

    /// What was counted since `earlier` (both cumulative). A count that went back (a
    /// forked child starting its own count, a stage reporting again from 0) is read as
    /// counted from 0.
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let mut delta = Histogram::default();
        for (i, out) in delta.counts.iter_mut().enumerate() {
            let (now, then) = (self.counts[i], earlier.counts[i]);
            *out = if now >= then { now - then } else { now };
        }
        delta
    }

    /// Scales every count down so that they sum to at most `total` (keeping the shape):
    /// a report's samples weighed by what they can stand for.
    pub fn scale_to_at_most(&mut self, total: u64) {
        let sum = self.total();
        if sum <= total {
            return;
        }
        let factor = total as f64 / sum as f64;
        for count in &mut self.counts {
            *count = (*count as f64 * factor).floor() as u64;
        }
    }

    /// Calls counted.
    pub fn total(&self) -> u64 {
        self.counts
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(*c))
    }

    /// The `q`-quantile (0 < q ≤ 1) of the service times, in seconds, interpolated
    /// linearly inside its bucket (the last, open-ended bucket gives its lower bound);
    /// `None` when nothing was counted.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total == 0 || !(q > 0.0 && q <= 1.0) {
            return None;
        }
        let rank = q * total as f64;
        let mut below = 0.0;
        for (i, &count) in self.counts.iter().enumerate() {
            let through = below + count as f64;
            if count != 0 && through >= rank {
                let lower = lower_bound_ns(i) as f64;
                let ns = match upper_bound_ns(i) {
                    Some(upper) => lower + (upper as f64 - lower) * (rank - below) / count as f64,
                    None => lower,
                };
                return Some(ns * 1e-9);
            }
            below = through;
        }
        None
    }
}

/// Reported counts with more buckets than the layout has (their number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} latency buckets (the layout has {BUCKETS})")]
pub struct TooManyBuckets(pub usize);

/// One resource's service times in a stage's report: cumulative counts per bucket
/// (trailing empty buckets left out) of its managed calls on `mount` of `class`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyRow {
    /// The mountpoint, as registered.
    pub mount: String,
    /// The class of the calls.
    #[serde(with = "crate::channel::class_name")]
    pub class: Class,
    /// Cumulative counts per bucket, at most [`BUCKETS`].
    pub counts: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_line_in_order() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1023), 0);
        assert_eq!(bucket_of(1024), 1);
        assert_eq!(bucket_of(1535), 1);
        assert_eq!(bucket_of(1536), 2);
        assert_eq!(bucket_of(2048), 3);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(767), 0);
        assert_eq!(bucket_of(768), 0);
        assert_eq!(bucket_of_f64(-5.0), 0);
        assert_eq!(bucket_of_f64(f64::NAN), 0);
        assert_eq!(bucket_of_f64(f64::INFINITY), BUCKETS - 1);
        assert_eq!(bucket_of_f64(1535.9), 1);
        for i in 0..BUCKETS {
            let lower = lower_bound_ns(i);
            assert_eq!(bucket_of(lower), i, "lower bound of {i}");
            if let Some(upper) = upper_bound_ns(i) {
                assert!(upper > lower);
                assert_eq!(bucket_of(upper - 1), i, "last value of {i}");
                // Never wider than half its lower bound (past the first buckets).
                if i > 0 {
                    assert!(upper - lower <= lower / 2 + 1, "bucket {i}");
                }
            }
        }
        // The open-ended bucket starts past 8 s: any service time that matters is resolved.
        assert_eq!(lower_bound_ns(BUCKETS - 1), 1 << 33);
    }

    #[test]
    fn quantiles_come_from_the_counted_times() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), None);
        for _ in 0..900 {
            h.record(100_000); // 100 µs
        }
        for _ in 0..100 {
            h.record(5_000_000); // 5 ms
        }
        let p50 = h.quantile(0.5).unwrap();
        assert!((65e-6..=131e-6).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99).unwrap();
        assert!((4.1e-3..=6.3e-3).contains(&p99), "{p99}");
        assert_eq!(h.quantile(0.0), None);
        assert_eq!(h.quantile(f64::NAN), None);
    }

    #[test]
    fn differences_and_merges() {
        let mut earlier = Histogram::default();
        earlier.record(2_000);
        let mut now = earlier.clone();
        now.record(2_000);
        now.record(1_000_000);
        let delta = now.since(&earlier);
        assert_eq!(delta.total(), 2);
        // A counter that went back starts over.
        assert_eq!(earlier.since(&now).total(), 1);
        let mut sum = delta.clone();
        sum.merge(&delta);
        assert_eq!(sum.total(), 4);
        let round = Histogram::from_counts(now.counts()).unwrap();
        assert_eq!(round, now);
        assert_eq!(
            Histogram::from_counts(&[1; BUCKETS + 1]),
            Err(TooManyBuckets(BUCKETS + 1))
        );
        let mut scaled = now.clone();
        scaled.scale_to_at_most(1);
        assert!(scaled.total() <= 1);
        let mut full = Histogram::from_counts(&[u64::MAX; BUCKETS]).unwrap();
        full.merge(&now);
        assert_eq!(full.total(), u64::MAX);
    }

    #[test]
    fn rows_read_as_written_and_unknown_classes_are_refused() {
        let row = LatencyRow {
            mount: "/scratch".into(),
            class: Class::Metadata,
            counts: vec![0, 3, 1],
        };
        let line = serde_json::to_string(&row).unwrap();
        assert_eq!(
            line,
            r#"{"mount":"/scratch","class":"metadata","counts":[0,3,1]}"#
        );
        assert_eq!(serde_json::from_str::<LatencyRow>(&line).unwrap(), row);
        let bad = line.replace("metadata", "bogus");
        assert!(serde_json::from_str::<LatencyRow>(&bad).is_err());
    }
}
