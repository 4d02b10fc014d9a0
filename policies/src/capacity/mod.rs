//! Delay-based capacity: a resource's `Max_R` set each control interval from the
//! latency its operations see, instead of a number the administrator guesses
//! (`max_rate = "auto"`).
//!
//! The administrator gives a latency target (the p50 and/or the p99 of the resource's
//! operations across all nodes), a floor and a ceiling. Each interval the global
//! controller hands [`CapacityEstimator::update`] what it observed during the interval
//! ([`Observation`]: the rate served, the latency quantiles, the number of samples, the
//! `Max_R` that was in force) and gets the `Max_R` for the next interval, which the QoS
//! policies share exactly as they share a fixed one.
//!
//! # The control law
//!
//! It follows Swift (Kumar et al., "Swift: Delay is Simple and Effective for Congestion
//! Control in the Datacenter", SIGCOMM 2020, §3): an explicit, administrator-given delay
//! target, and a multiplicative decrease proportional to the excess over it, bounded per
//! round trip (`max_mdf`). It does not learn a no-load latency as TCP Vegas and Netflix's
//! `VegasLimit` / `Gradient2Limit` do — "keep p50 at 2 ms" is what an administrator can
//! state, and the no-load latency of a shared file system is rarely observed. Swift's
//! additive increase is too slow for rates that span decades, so the step is a Newton
//! step on Gradient2's ratio `u = target / latency` (the target in place of its long-term
//! latency), which is nearly linear in the served rate `r` for a queueing server: with
//! a mean latency `b / (1 − r/μ)` (M/M/1), `u(r) = 1 + κ·(1 − r/C)`, where `C` is the rate
//! at the target and `κ = target/b − 1`. With `k = −r·du/dr` (the normalised slope):
//!
//! ```text
//! C_est = r · (1 + (u − 1) / k)                     Newton step to u = 1
//! next  = r + gain · (C_est − r)                    damping (gain 0.5)
//! u ≥ 1: next ∈ [min(Max_R, r·(1 + headroom)), r·(1 + headroom)]
//! u < 1: next ∈ [(1 − max_decrease)·min(r, Max_R), min(Max_R, r·(1 + headroom))]
//! Max_R' = clamp(next, floor, ceiling)
//! ```
//!
//! `Max_R` is the one in force during the observed interval.
//!
//! * **Latency signal.** `u = min(target_p50/p50, target_p99/p99)` over the targets that
//!   are set: the quantile furthest over its target decides. An interval without
//!   latency says nothing. One with fewer than `min_samples` samples holds `Max_R` and
//!   waits in a pool with the next ones until their samples add up, over at most 10
//!   intervals (older ones leave it): a file system too slow to complete `min_samples`
//!   calls an interval is still seen (it held `Max_R` at the ceiling forever). Only the
//!   parts' quantiles are known, not the pool's; each quantile of the pool lies between
//!   the parts' smallest and largest, so the pool's `u` is the value of that range
//!   closest to 1 (parts all over the target count as the least slow of them, parts on
//!   both sides as the target), its rate is the parts' mean, and it teaches the slope
//!   nothing. Pooling keeps the noise bound `min_samples` sets (see *Noise*), where
//!   acting on a short interval's quantile would not; the 10 intervals bound how stale
//!   a decision's samples are. A resource completing fewer than `min_samples` calls in
//!   10 intervals still holds its `Max_R`.
//! * **Slope.** `k` starts at `initial_slope` (2: cautious, a target three times the
//!   no-load latency) and stays within 0.1…10. `du/dr` is then fitted by least squares
//!   over the last 6 intervals that `Max_R` or the file system bound (served ≥ 90 % of
//!   `Max_R`, or less with the latency over the target), and blended geometrically into
//!   `k` when the fit is clear of the noise (served rates spread ≥ 5 %, slope ≥ 3
//!   standard errors): steady state and saturation leave `k` alone. An interval the jobs
//!   limited (served < 90 % of `Max_R`, latency under the target) empties the window,
//!   since the capacity may have moved meanwhile and two curves in one fit give a wrong
//!   slope. One the file system limited stays: it is the steep side of the curve. Were
//!   it dropped too, a steep curve (κ of 12 and more: a saturation rate within about
//!   8 % of the rate at the target) would keep `k` at 2 and `Max_R` alternating between
//!   about 0.85 and 1.25 × the capacity forever: each increase overshoots the
//!   saturation rate and the next interval is the file system's. Beyond κ = 10, the
//!   bound of `k`, the step overshoots by κ/10 and rings down; the properties are
//!   tested up to κ = 30. A window whose rates spread but show no clear negative
//!   slope, every interval under the target (the flat side of the curve), brings a `k`
//!   above `initial_slope` back toward it by the same blend: a `k` learned at a knee
//!   would otherwise make every later step small (a climb from the floor 4× slower).
//!   Over the target a flat or rising fit is two curves (a capacity that moved) and
//!   teaches nothing.
//! * **Delay.** `Max_R` set at the end of interval `n` is in force during `n + 1`. The
//!   step starts from the rate actually *served* in the observed interval (what produced
//!   that latency), not from the `Max_R` set since, so the delay does not make the loop
//!   overshoot.
//! * **Smoothing.** The damping halves the remaining error each interval; the decrease
//!   bound (Swift's `max_mdf`, 30 %) limits what one slow interval can take, and the next
//!   normal interval gives most of it back. A real capacity drop keeps the latency high,
//!   so `Max_R` keeps falling (≤ 30 % an interval) until the latency is back at target.
//!   A latency under the target never lowers `Max_R`, one over it never raises it.
//! * **No wind-up.** While demand is below `Max_R` the latency is low because there are
//!   few calls, not because the file system could take more: `Max_R` never exceeds
//!   `served × (1 + headroom)` (Gradient2's app-limited check), so a sudden demand meets
//!   a rate the file system recently carried, grown by at most 1.5× an interval.
//! * **Start.** The first `Max_R` is the ceiling: the resource behaves as with a static
//!   `max_rate = ceiling` until the first interval with samples.
//! * **Noise.** `Max_R` jitters by about `gain · noise(u) / κ` an interval: a flat curve
//!   (target close to the no-load latency) says little about the rate. Within ±10 % needs
//!   a latency noise under about `κ/40` (a p50 over `N` samples has a relative error of
//!   about `1.4/√N`).
//!
//! Units: rates in tokens/s of the resource (ops/s for metadata, bytes/s for data),
//! latencies in seconds.
//!
//! [`model`] is a simulated file system (a queueing latency curve, seeded noise) and the
//! closed loop around it, for tests and examples.

pub mod model;

/// Intervals the slope is fitted over.
const SLOPE_WINDOW: usize = 6;
/// Blending weight of a new slope measurement into `k` (geometric mean for 0.5).
const SLOPE_BLEND: f64 = 0.5;
/// A fitted slope counts only if it is this many standard errors away from 0.
const SLOPE_MIN_T: f64 = 3.0;
/// ... and if the served rates of the window spread by this fraction of their mean.
const SLOPE_MIN_SPREAD: f64 = 0.05;
/// An interval is controlled by `Max_R` when it served at least this fraction of it.
const BINDING: f64 = 0.9;
/// Bounds of the normalised slope `k`.
const SLOPE_RANGE: (f64, f64) = (0.1, 10.0);
/// Intervals with fewer than `min_samples` samples are pooled over at most this many
/// intervals (the newest included).
const POOL_INTERVALS: u64 = 10;

/// What an administrator sets for one resource with `max_rate = "auto"`.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Target p50 latency of the resource's operations, seconds.
    pub target_p50: Option<f64>,
    /// Target p99 latency of the resource's operations, seconds.
    pub target_p99: Option<f64>,
    /// `Max_R` never goes below this (tokens/s, `> 0`).
    pub floor: f64,
    /// `Max_R` never goes above this (tokens/s, `≥ floor`); also the first `Max_R`.
    pub ceiling: f64,
    /// Fraction of the way to the estimated capacity moved each interval (`(0, 1]`).
    pub gain: f64,
    /// Largest fraction `Max_R` can lose in one interval (`(0, 1)`).
    pub max_decrease: f64,
    /// `Max_R` never grows past `served × (1 + headroom)` (`> 0`).
    pub headroom: f64,
    /// Initial normalised slope `k = −r·du/dr` of `u = target/latency` (`> 0`).
    pub initial_slope: f64,
    /// Latency samples that move `Max_R`: an interval with fewer leaves it unchanged
    /// and is pooled with the next ones (at most 10 intervals) until they add up.
    pub min_samples: u64,
}

impl Settings {
    /// Settings with the given targets (seconds), floor and ceiling (tokens/s) and the
    /// default gains: `gain` 0.5, `max_decrease` 0.3, `headroom` 0.5, `initial_slope`
    /// 2, `min_samples` 20. Not validated yet (see [`Settings::validate`]).
    pub fn new(target_p50: Option<f64>, target_p99: Option<f64>, floor: f64, ceiling: f64) -> Self {
        Settings {
            target_p50,
            target_p99,
            floor,
            ceiling,
            gain: 0.5,
            max_decrease: 0.3,
            headroom: 0.5,
            initial_slope: 2.0,
            min_samples: 20,
        }
    }

    /// `Ok` if every number is usable, else the first bad one, named by its
    /// configuration key.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.target_p50.is_none() && self.target_p99.is_none() {
            return Err(SettingsError::NoTarget);
        }
        let positive = |key: &'static str, value: f64, scale: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                Err(SettingsError::Bad {
                    key,
                    expected: "a finite number > 0",
                    value: value * scale,
                })
            }
        };
        if let Some(t) = self.target_p50 {
            positive("target_p50_ms", t, 1e3)?;
        }
        if let Some(t) = self.target_p99 {
            positive("target_p99_ms", t, 1e3)?;
        }
        positive("floor", self.floor, 1.0)?;
        positive("ceiling", self.ceiling, 1.0)?;
        if self.floor > self.ceiling {
            return Err(SettingsError::FloorAboveCeiling {
                floor: self.floor,
                ceiling: self.ceiling,
            });
        }
        let fraction = |key: &'static str, value: f64, max_inclusive: bool| {
            let ok = value > 0.0 && (value < 1.0 || (max_inclusive && value == 1.0));
            if ok {
                Ok(())
            } else {
                Err(SettingsError::Bad {
                    key,
                    expected: if max_inclusive {
                        "a number in (0, 1]"
                    } else {
                        "a number in (0, 1)"
                    },
                    value,
                })
            }
        };
        fraction("gain", self.gain, true)?;
        fraction("max_decrease", self.max_decrease, false)?;
        positive("headroom", self.headroom, 1.0)?;
        positive("initial_slope", self.initial_slope, 1.0)?;
        Ok(())
    }
}

/// A [`Settings`] value that [`Settings::validate`] refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingsError {
    /// Neither `target_p50_ms` nor `target_p99_ms` is set.
    #[error("max_rate = \"auto\" needs target_p50_ms or target_p99_ms (or both)")]
    NoTarget,
    /// A number out of its range (value in the unit of its key: ms for targets).
    #[error("{key} must be {expected}, got {value}")]
    Bad {
        /// The configuration key.
        key: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it was.
        value: f64,
    },
    /// `floor > ceiling`.
    #[error("floor must be ≤ ceiling, got floor {floor} > ceiling {ceiling}")]
    FloorAboveCeiling {
        /// The floor.
        floor: f64,
        /// The ceiling.
        ceiling: f64,
    },
}

/// What the global controller knows about one resource after one control interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Rate the resource served during the interval: the sum of every job's usage
    /// (tokens/s).
    pub served: f64,
    /// Median latency of the interval's operations across all nodes (seconds), `None`
    /// without samples.
    pub p50: Option<f64>,
    /// 99th-percentile latency (seconds), `None` without samples.
    pub p99: Option<f64>,
    /// Number of latency samples behind `p50` / `p99`.
    pub samples: u64,
    /// The `Max_R` that was in force during the interval (tokens/s).
    pub max_rate: f64,
}

/// The state of one resource's `max_rate = "auto"`, carried between intervals.
#[derive(Debug, Clone)]
pub struct CapacityEstimator {
    settings: Settings,
    max_rate: f64,
    slope: f64,
    /// `(served, u)` of the last intervals that had a latency signal, oldest first.
    history: Vec<(f64, f64)>,
    /// Intervals taken so far (numbers the pooled ones).
    intervals: u64,
    /// The recent intervals short of `min_samples`, oldest first, until they add up.
    pool: Vec<Part>,
}

/// One interval with fewer than `min_samples` samples, waiting in the pool.
#[derive(Debug, Clone, Copy)]
struct Part {
    interval: u64,
    served: f64,
    samples: u64,
    p50: Option<f64>,
    p99: Option<f64>,
}

impl CapacityEstimator {
    /// An estimator starting at `Max_R = ceiling`, or the error naming the bad setting.
    pub fn new(settings: Settings) -> Result<Self, SettingsError> {
        settings.validate()?;
        Ok(CapacityEstimator {
            max_rate: settings.ceiling,
            slope: settings.initial_slope,
            history: Vec::with_capacity(SLOPE_WINDOW),
            intervals: 0,
            pool: Vec::new(),
            settings,
        })
    }

    /// The current `Max_R` (tokens/s): the last one [`CapacityEstimator::update`]
    /// returned, or the ceiling before the first.
    pub fn max_rate(&self) -> f64 {
        self.max_rate
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Take one interval's observation; return the `Max_R` for the next interval
    /// (tokens/s, within `[floor, ceiling]`). Non-finite or negative numbers in the
    /// observation count as no signal.
    pub fn update(&mut self, obs: &Observation) -> f64 {
        self.intervals += 1;
        let in_force = if obs.max_rate.is_finite() && obs.max_rate > 0.0 {
            obs.max_rate
        } else {
            self.max_rate
        };
        let Some((served, u, pooled)) = self.signal(obs) else {
            return self.max_rate;
        };
        // A pooled `u` is a bound, not a measurement: it moves Max_R, not the fit.
        if !pooled {
            self.learn_slope(served, u, in_force);
        }
        let s = &self.settings;

        let estimate = served * (1.0 + (u - 1.0) / self.slope);
        let next = served + s.gain * (estimate - served);
        // Never past what was used plus headroom (no wind-up); a latency under the
        // target never lowers Max_R below that, one over it never raises it and takes
        // at most `max_decrease` of the operating point.
        let used_cap = served * (1.0 + s.headroom);
        let (low, high) = if u >= 1.0 {
            (in_force.min(used_cap), used_cap)
        } else {
            (
                (1.0 - s.max_decrease) * served.min(in_force),
                in_force.min(used_cap),
            )
        };
        self.max_rate = next.clamp(low, high).clamp(s.floor, s.ceiling);
        self.max_rate
    }

    /// The served rate and `u` the step starts from, and whether they come from a pool
    /// of intervals; `None` while the interval (with the pool) says nothing.
    fn signal(&mut self, obs: &Observation) -> Option<(f64, f64, bool)> {
        let served = obs.served;
        if obs.samples == 0 || !(served.is_finite() && served > 0.0) {
            return None;
        }
        let u = self.gradient(obs.p50, obs.p99)?;
        if obs.samples >= self.settings.min_samples {
            self.pool.clear();
            return Some((served, u, false));
        }
        let oldest = self.intervals.saturating_sub(POOL_INTERVALS - 1);
        self.pool.retain(|part| part.interval >= oldest);
        self.pool.push(Part {
            interval: self.intervals,
            served,
            samples: obs.samples,
            p50: obs.p50,
            p99: obs.p99,
        });
        let samples = (self.pool.iter()).fold(0u64, |sum, part| sum.saturating_add(part.samples));
        if samples < self.settings.min_samples {
            return None;
        }
        let parts = std::mem::take(&mut self.pool);
        let n = parts.len() as f64;
        let served = parts.iter().map(|part| part.served / n).sum::<f64>();
        // Each quantile of the pooled samples lies between the parts' smallest and
        // largest: `u` is bounded by the ratios at those, and the value taken is the
        // one of the bounds closest to 1 (no more excess nor room than is proved).
        let bounds = |target: Option<f64>, quantile: fn(&Part) -> Option<f64>| {
            let target = target?;
            let measured = parts
                .iter()
                .filter_map(quantile)
                .filter(|m| m.is_finite() && *m > 0.0);
            let (least, most) = measured.fold(None, |acc: Option<(f64, f64)>, m| {
                Some(acc.map_or((m, m), |(a, b)| (a.min(m), b.max(m))))
            })?;
            Some((target / most, target / least))
        };
        let (low, high) = match (
            bounds(self.settings.target_p50, |part| part.p50),
            bounds(self.settings.target_p99, |part| part.p99),
        ) {
            (Some(a), Some(b)) => (a.0.min(b.0), a.1.min(b.1)),
            (a, b) => a.or(b)?,
        };
        let u = 1.0f64.clamp(low, high);
        u.is_finite().then_some((served, u, true))
    }

    /// `u = target / latency` of the quantile furthest over its target, or `None`
    /// without a usable latency.
    fn gradient(&self, p50: Option<f64>, p99: Option<f64>) -> Option<f64> {
        let ratio = |target: Option<f64>, measured: Option<f64>| match (target, measured) {
            (Some(t), Some(m)) if m.is_finite() && m > 0.0 => Some(t / m),
            _ => None,
        };
        let p50 = ratio(self.settings.target_p50, p50);
        let p99 = ratio(self.settings.target_p99, p99);
        let u = match (p50, p99) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        u.filter(|u| u.is_finite())
    }

    /// Fit `u` against the served rate over the last intervals (least squares) and
    /// blend the slope into `k` when the fit determines it, or `initial_slope` when a
    /// flat fit shows a larger `k` stale.
    fn learn_slope(&mut self, served: f64, u: f64, in_force: f64) {
        // An interval the jobs limited (under Max_R with the latency under the target)
        // may sit on another curve (the capacity can change meanwhile), and mixing two
        // curves makes a wrong slope. One the file system limited (under Max_R with the
        // latency over the target: it served what it could) is the steep part of the
        // curve the fit needs: without it a target far above the no-load latency never
        // binds three intervals in a row and `k` stays at its first guess.
        if served < BINDING * in_force && u >= 1.0 {
            self.history.clear();
            return;
        }
        if self.history.len() == SLOPE_WINDOW {
            self.history.remove(0);
        }
        self.history.push((served, u));
        let k = match fit(&self.history) {
            Fit::Slope(slope) => (-slope * served).clamp(SLOPE_RANGE.0, SLOPE_RANGE.1),
            // Rates spread enough to show a steep slope and none shows, all under the
            // target: a `k` above the first guess was learned elsewhere on the curve (a
            // knee) and would make every step small; it returns toward the guess. (Over
            // the target, a flat or rising fit is two curves: a capacity that moved.)
            Fit::Flat
                if self.slope > self.settings.initial_slope
                    && self.history.iter().all(|&(_, u)| u >= 1.0) =>
            {
                self.settings.initial_slope
            }
            Fit::Flat | Fit::Undetermined => return,
        };
        self.slope = self.slope.powf(1.0 - SLOPE_BLEND) * k.powf(SLOPE_BLEND);
    }
}

/// What a window of `(r, u)` says about the slope `du/dr`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fit {
    /// Fewer than 3 points, or rates too close together to say anything.
    Undetermined,
    /// The rates spread, but no negative slope stands clear of the noise.
    Flat,
    /// A negative least-squares slope, clear of the noise.
    Slope(f64),
}

/// The least-squares slope `du/dr` of `points` (`(r, u)`) if it is negative, the rates
/// spread enough and it stands clear of the noise; [`Fit::Flat`] if only the first
/// two hold.
fn fit(points: &[(f64, f64)]) -> Fit {
    let n = points.len() as f64;
    if points.len() < 3 {
        return Fit::Undetermined;
    }
    let mean_r = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_u = points.iter().map(|p| p.1).sum::<f64>() / n;
    let srr: f64 = points.iter().map(|p| (p.0 - mean_r).powi(2)).sum();
    let sru: f64 = points.iter().map(|p| (p.0 - mean_r) * (p.1 - mean_u)).sum();
    if (srr / n).sqrt() < SLOPE_MIN_SPREAD * mean_r {
        return Fit::Undetermined;
    }
    let slope = sru / srr;
    let residuals: f64 = points
        .iter()
        .map(|p| (p.1 - mean_u - slope * (p.0 - mean_r)).powi(2))
        .sum();
    let standard_error = (residuals / (n - 2.0) / srr).sqrt();
    if slope < 0.0 && -slope >= SLOPE_MIN_T * standard_error {
        Fit::Slope(slope)
    } else {
        Fit::Flat
    }
}
