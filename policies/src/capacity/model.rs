//! A simulated file system and the closed loop around a [`CapacityEstimator`], for
//! tests and examples: no processes, a simulated clock of control intervals.
//!
//! The file system is a single queue (M/M/1): served at most at its service rate `μ`,
//! an operation's latency is exponential with mean `b / (1 − ρ)` (`b` the no-load
//! latency, `ρ` = served / `μ`), capped at `100·b` once saturated (a real server's queue
//! is bounded by its clients). So `p50 = ln 2 · mean` and `p99 = ln 100 · mean`, each
//! multiplied by seeded log-normal noise. Its *capacity* for a target is the rate at
//! which the latency equals the target.
//!
//! [`ClosedLoop`] runs one interval at a time: the jobs offer `min(demand, Max_R)`
//! where `Max_R` is the one the estimator set at the end of the previous interval (the
//! one-interval enforcement delay), optionally mixed with the `Max_R` before it for a
//! fraction `lag` of the interval (local controllers that pick the new rate up late).

use super::{CapacityEstimator, Observation};
use crate::trace::Rng;

/// Mean latency of a saturated file system, in multiples of the no-load latency.
const SATURATED_LATENCY: f64 = 100.0;

/// `p50` and `p99` of an exponential latency, as multiples of its mean.
const P50_OF_MEAN: f64 = std::f64::consts::LN_2;
const P99_OF_MEAN: f64 = 4.605_170_185_988_091; // ln 100

/// A simulated file system: an M/M/1 latency curve with seeded noise.
#[derive(Debug, Clone)]
pub struct SimulatedFs {
    service_rate: f64,
    base_latency: f64,
    noise: f64,
    rng: Rng,
}

/// What the file system did during one interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Served {
    /// Rate served (tokens/s).
    pub rate: f64,
    /// Median latency (seconds).
    pub p50: f64,
    /// 99th-percentile latency (seconds).
    pub p99: f64,
    /// Operations served (latency samples).
    pub samples: u64,
}

impl SimulatedFs {
    /// A file system whose p50 equals `target_p50` (seconds) at `capacity` (tokens/s),
    /// where the target is `1 + kappa` times the no-load p50; `noise` is the standard
    /// deviation of the log of each measured quantile, `seed` seeds it.
    pub fn with_capacity(
        capacity: f64,
        target_p50: f64,
        kappa: f64,
        noise: f64,
        seed: u64,
    ) -> Self {
        let base_latency = target_p50 / ((1.0 + kappa) * P50_OF_MEAN);
        let mut fs = SimulatedFs {
            service_rate: 0.0,
            base_latency,
            noise,
            rng: Rng::new(seed),
        };
        fs.set_capacity(capacity, target_p50);
        fs
    }

    /// Change the service rate so that the p50 equals `target_p50` at `capacity` (the
    /// no-load latency stays).
    pub fn set_capacity(&mut self, capacity: f64, target_p50: f64) {
        self.service_rate = capacity / (1.0 - self.base_latency * P50_OF_MEAN / target_p50);
    }

    /// The rate (tokens/s) at which the p50 equals `target_p50`, and/or the p99 equals
    /// `target_p99` (the smaller of the two), without noise.
    pub fn capacity(&self, target_p50: Option<f64>, target_p99: Option<f64>) -> f64 {
        let at = |target: f64, of_mean: f64| {
            (self.service_rate * (1.0 - self.base_latency * of_mean / target)).max(0.0)
        };
        let p50 = target_p50.map_or(f64::INFINITY, |t| at(t, P50_OF_MEAN));
        let p99 = target_p99.map_or(f64::INFINITY, |t| at(t, P99_OF_MEAN));
        p50.min(p99)
    }

    /// Serve `offered` tokens/s for `seconds`.
    pub fn serve(&mut self, offered: f64, seconds: f64) -> Served {
        let rate = offered.clamp(0.0, self.service_rate);
        let load = rate / self.service_rate;
        let mean = (self.base_latency / (1.0 - load)).min(SATURATED_LATENCY * self.base_latency);
        let p50 = mean * P50_OF_MEAN * self.noise_factor();
        let p99 = mean * P99_OF_MEAN * self.noise_factor();
        Served {
            rate,
            p50,
            p99,
            samples: (rate * seconds).round() as u64,
        }
    }

    /// `exp(noise · N(0, 1))` (Box–Muller).
    fn noise_factor(&mut self) -> f64 {
        if self.noise == 0.0 {
            return 1.0;
        }
        let u1 = 1.0 - self.rng.uniform(); // (0, 1]: ln is finite
        let u2 = self.rng.uniform();
        let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        (self.noise * normal).exp()
    }
}

/// One interval of a [`ClosedLoop`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// The `Max_R` in force during the interval.
    pub max_rate: f64,
    /// What the file system did.
    pub served: Served,
    /// The `Max_R` the estimator set for the next interval.
    pub next_max_rate: f64,
}

/// A [`CapacityEstimator`] controlling a [`SimulatedFs`], one interval per call.
#[derive(Debug, Clone)]
pub struct ClosedLoop {
    /// The file system.
    pub fs: SimulatedFs,
    /// The estimator.
    pub estimator: CapacityEstimator,
    /// Length of an interval, seconds.
    pub interval: f64,
    /// Fraction of each interval still run under the previous `Max_R` (`[0, 1)`).
    pub lag: f64,
    previous: f64,
}

impl ClosedLoop {
    /// A loop of 1 s intervals without lag.
    pub fn new(fs: SimulatedFs, estimator: CapacityEstimator) -> Self {
        let previous = estimator.max_rate();
        ClosedLoop {
            fs,
            estimator,
            interval: 1.0,
            lag: 0.0,
            previous,
        }
    }

    /// Run one interval in which the jobs would issue `demand` tokens/s unthrottled.
    pub fn run(&mut self, demand: f64) -> Interval {
        let max_rate = self.estimator.max_rate();
        let enforced = self.lag * self.previous + (1.0 - self.lag) * max_rate;
        let served = self.fs.serve(demand.min(enforced), self.interval);
        let next_max_rate = self.estimator.update(&Observation {
            served: served.rate,
            p50: Some(served.p50),
            p99: Some(served.p99),
            samples: served.samples,
            max_rate,
        });
        self.previous = max_rate;
        Interval {
            max_rate,
            served,
            next_max_rate,
        }
    }
}
