//! What the file system took to serve the managed calls of every stage, merged per
//! configured resource: the interval being reported, the last complete one (what
//! `ctl` shows and `max_rate = "auto"` steers by) and everything since start (the
//! metrics' histograms). Histograms use `padll_wire::latency`'s layout, so merging is
//! adding counts.

use padll_wire::latency::{Histogram, TooManyBuckets};
use serde::{Deserialize, Serialize};

/// Service-time histograms, one per configured resource (by index).
#[derive(Clone, Debug, Default)]
pub struct ServiceTimes {
    /// Reports for the interval the next cycle closes.
    current: Vec<Histogram>,
    /// The last interval a cycle closed.
    last: Vec<Histogram>,
    /// Every interval since start.
    total: Vec<Histogram>,
}

impl ServiceTimes {
    /// Empty histograms for `resources` resources.
    pub fn new(resources: usize) -> ServiceTimes {
        ServiceTimes {
            current: vec![Histogram::default(); resources],
            last: vec![Histogram::default(); resources],
            total: vec![Histogram::default(); resources],
        }
    }

    /// Adds a stage's service times of `resource` over the interval (as reported:
    /// counts per bucket).
    pub fn add(&mut self, resource: usize, counts: &[u64]) -> Result<(), TooManyBuckets> {
        if counts.is_empty() {
            return Ok(());
        }
        let histogram = Histogram::from_counts(counts)?;
        if let Some(current) = self.current.get_mut(resource) {
            current.merge(&histogram);
        }
        Ok(())
    }

    /// Ends the interval being reported: it becomes the last one, and counts since start.
    pub fn close_interval(&mut self) {
        for ((current, last), total) in self
            .current
            .iter_mut()
            .zip(&mut self.last)
            .zip(&mut self.total)
        {
            total.merge(current);
            *last = std::mem::take(current);
        }
    }

    /// The last complete interval's service times of `resource`.
    pub fn last(&self, resource: usize) -> Option<&Histogram> {
        self.last.get(resource)
    }

    /// The service times of `resource` since start.
    pub fn total(&self, resource: usize) -> Option<&Histogram> {
        self.total.get(resource)
    }
}

/// A resource's service times over one interval, as `ctl` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceSummary {
    /// Calls measured.
    pub calls: u64,
    /// Median service time, ms (`None`: no call measured).
    pub p50_ms: Option<f64>,
    /// 99th percentile, ms.
    pub p99_ms: Option<f64>,
}

impl ServiceSummary {
    /// The summary of `histogram`.
    pub fn of(histogram: &Histogram) -> ServiceSummary {
        let ms = |q| histogram.quantile(q).map(|seconds| seconds * 1e3);
        ServiceSummary {
            calls: histogram.total(),
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_close_into_last_and_total() {
        let mut times = ServiceTimes::new(2);
        times.add(0, &[0, 4]).unwrap();
        times.add(0, &[0, 0, 6]).unwrap();
        times.add(7, &[1]).unwrap(); // no such resource: nothing
        assert!(times.add(1, &[1; 49]).is_err());
        assert_eq!(times.last(0).unwrap().total(), 0);
        times.close_interval();
        assert_eq!(times.last(0).unwrap().counts(), &[0, 4, 6]);
        assert_eq!(times.last(1).unwrap().total(), 0);
        times.add(0, &[0, 1]).unwrap();
        times.close_interval();
        assert_eq!(times.last(0).unwrap().counts(), &[0, 1]);
        assert_eq!(times.total(0).unwrap().counts(), &[0, 5, 6]);
        let summary = ServiceSummary::of(times.total(0).unwrap());
        assert_eq!(summary.calls, 11);
        let p50 = summary.p50_ms.unwrap();
        assert!((0.0015..0.002).contains(&p50), "{p50}");
        assert_eq!(ServiceSummary::of(&Histogram::default()).p50_ms, None);
    }
}
