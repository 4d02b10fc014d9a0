//! Turning a stage's cumulative counters into rates per resource.
//!
//! A *resource* ([`Resource`]) is one mountpoint × class (`/scratch:metadata`, counted
//! in ops/s, or `/scratch:data`, counted in bytes/s): what the global controller shares
//! out. A stage
//! reports cumulative tokens per channel and cumulative counts per operation; the rate of
//! a resource over the last report interval comes from the channel the control plane
//! installed for it, or — before it has one — from the operation counters of a stage
//! with a single mountpoint.

use crate::config::Resource;
use padll_wire::channel::{ChannelInfo, Scope, Unit};
use padll_wire::latency::{Histogram, LatencyRow};
use padll_wire::ops::{Class, Op};
use padll_wire::report::OpStats;
use std::collections::HashMap;
use std::time::Instant;

/// Before the control plane gave a stage a rule for a resource, it cannot have used
/// more than this per second of it (ops/s; [`PRE_RULE_BYTES`] for data): what it
/// reports above is clamped.
pub const PRE_RULE_OPS: u64 = 1_000_000;
/// The same for data resources, bytes/s (16 GiB/s).
pub const PRE_RULE_BYTES: u64 = 16 << 30;

/// Cumulative counters of one stage at one instant.
#[derive(Clone, Debug, Default)]
struct Sample {
    at: Option<Instant>,
    tokens: HashMap<Resource, u64>,
}

/// Rates of one stage over each control interval, from its successive usage reports.
///
/// Reports cannot lie past physics: the tokens reports add for a resource are clamped
/// to what the rule the stage was given could have admitted (a bucket: rate × elapsed +
/// burst over any span of reports, with the higher rate while a rule changed), and
/// before any rule to [`PRE_RULE_OPS`] / [`PRE_RULE_BYTES`]
/// per second.
/// Channels whose unit does not fit their class (bytes for metadata, requests for
/// data) are ignored.
///
/// Reports arrive every few hundred milliseconds and loads are bursty, so a rate is
/// taken between the reports that bracket two *collections* (one control interval),
/// not between two reports. Counters that restart (a channel replaced) are stitched so
/// the cumulative count never goes backwards.
#[derive(Debug, Default)]
pub struct UsageTracker {
    /// When the stage registered (the first report's counters run from about then).
    since: Option<Instant>,
    /// The rules the control plane gave the stage: rate and burst per resource, and the
    /// highest rate in force since the last report.
    given: HashMap<Resource, Given>,
    /// Tokens each resource's bucket of [`UsageTracker::refill`] holds.
    available: HashMap<Resource, f64>,
    /// Raw counters of the last report (to detect restarts).
    raw: HashMap<Resource, u64>,
    /// Stitched cumulative counters, as of the last report.
    latest: Sample,
    /// The same, as of the last collection.
    collected: Sample,
    rates: HashMap<Resource, f64>,
    limits: HashMap<Resource, u64>,
    /// Tokens the last report counted per resource, and the seconds it spans: what
    /// bounds the service times it reports.
    counted: HashMap<Resource, u64>,
    counted_seconds: f64,
    /// Cumulative service times as last reported, per resource.
    latency_raw: HashMap<Resource, Histogram>,
    /// Service times reported since the last [`UsageTracker::collect_latency`].
    latency_pending: HashMap<Resource, Histogram>,
}

/// A rule given to the stage.
#[derive(Clone, Copy, Debug)]
struct Given {
    rate: u64,
    burst: u64,
    /// The highest rate in force since the last report (rules may have changed in
    /// between; tokens admitted at the old rate are genuine).
    peak_rate: u64,
    peak_burst: u64,
}

impl UsageTracker {
    /// A tracker for a stage that registered at `since`.
    pub fn new(since: Instant) -> UsageTracker {
        UsageTracker {
            since: Some(since),
            ..UsageTracker::default()
        }
    }

    /// The rules the stage was just given (rate and burst per resource): the whole set,
    /// resources not named have no rule any more.
    pub fn set_rules(&mut self, rules: impl IntoIterator<Item = (Resource, u64, u64)>) {
        let mut given = HashMap::new();
        for (resource, rate, burst) in rules {
            let (peak_rate, peak_burst) = match self.given.get(&resource) {
                Some(old) => (old.peak_rate.max(rate), old.peak_burst.max(burst)),
                // A resource without a rule until now ran at the pre-rule cap.
                None => (pre_rule_cap(&resource), pre_rule_cap(&resource) / 10),
            };
            given.insert(
                resource,
                Given {
                    rate,
                    burst,
                    peak_rate,
                    peak_burst,
                },
            );
        }
        self.given = given;
    }

    /// The most tokens of `resource` the stage can have used in the `seconds` since its
    /// previous report: a bucket refilled at the rule's rate, as deep as twice its burst
    /// (a request larger than the burst is admitted whole; leases add a quarter burst)
    /// plus 100 ms of the rate (reports are not taken at the instant tokens are).
    /// Returns the bucket's depth and the tokens it could have given (before spending).
    fn refill(&mut self, resource: &Resource, seconds: f64) -> (f64, f64) {
        let (rate, burst) = match self.given.get(resource) {
            Some(g) => (g.peak_rate, g.peak_burst),
            None => {
                let cap = pre_rule_cap(resource);
                (cap, cap / 10)
            }
        };
        let depth = 2.0 * burst as f64 + 0.1 * rate as f64 + 1.0;
        let available = self.available.entry(resource.clone()).or_insert(depth);
        // What was stored (at most `depth`) plus what flowed in meanwhile.
        *available = available.min(depth) + rate as f64 * seconds;
        (depth, *available)
    }

    /// Records a report received `now`. Returns the resources whose reported tokens
    /// were clamped: (resource, tokens reported, tokens counted).
    pub fn record(
        &mut self,
        now: Instant,
        mountpoints: &[String],
        channels: &[ChannelInfo],
        ops: &[OpStats],
    ) -> Vec<(Resource, u64, u64)> {
        let mut readings = HashMap::new();
        self.limits.clear();
        for channel in channels {
            if let (Some(mount), Scope::Class(class)) = (&channel.spec.mount, channel.spec.scope) {
                // A mountpoint the stage did not register would be a new key kept for
                // as long as the stage lives: a stage could grow the controller at will.
                if (channel.spec.unit == Unit::Bytes) != (class == Class::Data)
                    || !mountpoints.contains(mount)
                {
                    continue;
                }
                let resource = Resource {
                    mount: mount.clone(),
                    class,
                };
                self.limits.insert(resource.clone(), channel.spec.rate);
                readings.insert(resource, channel.tokens);
            }
        }
        // Before the control plane installed channels: per-operation counters, which can
        // be attributed to a mountpoint only when the stage has one.
        if let [mount] = mountpoints {
            for class in Class::ALL {
                let resource = Resource {
                    mount: mount.clone(),
                    class,
                };
                readings.entry(resource).or_insert_with(|| {
                    ops.iter()
                        .filter(|row| Op::from_name(&row.op).is_some_and(|op| op.class() == class))
                        .map(|row| {
                            if class == Class::Data {
                                row.bytes
                            } else {
                                row.managed
                            }
                        })
                        .sum()
                });
            }
        }
        let since = self.latest.at.or(self.since).unwrap_or(now);
        let seconds = now.saturating_duration_since(since).as_secs_f64();
        let mut clamped = Vec::new();
        self.counted.clear();
        self.counted_seconds = seconds;
        for (resource, reading) in readings {
            let previous = self.raw.insert(resource.clone(), reading).unwrap_or(0);
            // A counter that went backwards restarted from zero.
            let mut delta = reading.checked_sub(previous).unwrap_or(reading);
            let (depth, available) = self.refill(&resource, seconds);
            let allowed = available.max(0.0) as u64;
            if delta > allowed {
                clamped.push((resource.clone(), delta, allowed));
                delta = allowed;
            }
            if let Some(left) = self.available.get_mut(&resource) {
                *left = (*left - delta as f64).min(depth);
            }
            self.counted.insert(resource.clone(), delta);
            let total = self.latest.tokens.entry(resource).or_insert(0);
            *total = total.saturating_add(delta);
        }
        self.latest.at = Some(now);
        // Rules changed before this report are the only ones in force from now on.
        for given in self.given.values_mut() {
            given.peak_rate = given.rate;
            given.peak_burst = given.burst;
        }
        // The limit reported upstream is the one given, not the one the stage claims.
        for (resource, given) in &self.given {
            self.limits.insert(resource.clone(), given.rate);
        }
        clamped
    }

    /// Closes a control interval: the rate of each resource since the previous call (the
    /// previous rates if no report arrived in between).
    pub fn collect(&mut self) -> &HashMap<Resource, f64> {
        if let (Some(from), Some(to)) = (self.collected.at, self.latest.at) {
            let seconds = to.duration_since(from).as_secs_f64();
            if seconds > 0.0 {
                self.rates = self
                    .latest
                    .tokens
                    .iter()
                    .map(|(resource, now)| {
                        let before = self.collected.tokens.get(resource).copied().unwrap_or(0);
                        (
                            resource.clone(),
                            now.saturating_sub(before) as f64 / seconds,
                        )
                    })
                    .collect();
            }
        }
        if self.latest.at.is_some() && self.latest.at != self.collected.at {
            self.collected = self.latest.clone();
        }
        &self.rates
    }

    /// Records the service times of a report (after [`UsageTracker::record`] of the same
    /// report): what each resource's calls took since the previous report, kept until
    /// [`UsageTracker::collect_latency`]. Rows of a mountpoint the stage did not
    /// register, repeated rows and rows with more buckets than the layout are ignored.
    /// A report's new samples of a resource weigh at most what its calls could be: the
    /// tokens the report counted (a little more, as calls admitted in one report may
    /// complete in the next), for data (counted in bytes) [`PRE_RULE_OPS`] a second: a
    /// stage cannot outvote the others' service times with samples of calls it never
    /// made.
    pub fn record_latency(&mut self, mountpoints: &[String], rows: &[LatencyRow]) {
        let mut seen = Vec::new();
        for row in rows {
            let resource = Resource {
                mount: row.mount.clone(),
                class: row.class,
            };
            if !mountpoints.contains(&row.mount) || seen.contains(&resource) {
                continue;
            }
            let Ok(now) = Histogram::from_counts(&row.counts) else {
                continue;
            };
            let before = self.latency_raw.insert(resource.clone(), now.clone());
            let mut delta = now.since(&before.unwrap_or_default());
            let calls = if resource.counts_bytes() {
                PRE_RULE_OPS as f64 * self.counted_seconds
            } else {
                let counted = self.counted.get(&resource).copied().unwrap_or(0) as f64;
                counted * 1.125
            };
            delta.scale_to_at_most(calls as u64 + 64);
            self.latency_pending
                .entry(resource.clone())
                .or_default()
                .merge(&delta);
            seen.push(resource);
        }
    }

    /// The service times reported since the previous call, per resource (empty
    /// histograms left out).
    pub fn collect_latency(&mut self) -> HashMap<Resource, Histogram> {
        let mut pending = std::mem::take(&mut self.latency_pending);
        pending.retain(|_, histogram| histogram.total() > 0);
        pending
    }

    /// The stage's current limit for each resource, if it has one.
    pub fn limit(&self, resource: &Resource) -> Option<u64> {
        self.limits.get(resource).copied()
    }
}

/// Tokens per second a stage may use of a resource it has no rule for.
fn pre_rule_cap(resource: &Resource) -> u64 {
    if resource.counts_bytes() {
        PRE_RULE_BYTES
    } else {
        PRE_RULE_OPS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use padll_wire::channel::{ChannelId, ChannelSpec, Unit};
    use std::time::Duration;

    fn channel(tokens: u64) -> ChannelInfo {
        ChannelInfo {
            id: ChannelId(0),
            spec: ChannelSpec {
                mount: Some("/scratch".into()),
                scope: Scope::Class(Class::Metadata),
                rate: 100,
                unit: Unit::Requests,
                burst: 1,
                costs: Default::default(),
            },
            admitted: tokens,
            tokens,
            binds: padll_wire::channel::LimitScope::Process,
        }
    }

    fn ops(opens: u64) -> Vec<OpStats> {
        vec![OpStats {
            op: "open".into(),
            calls: opens,
            managed: opens,
            ..OpStats::default()
        }]
    }

    #[test]
    fn rates_span_control_intervals_and_survive_counter_restarts() {
        let mounts = vec!["/scratch".to_string()];
        let metadata = Resource::parse("/scratch:metadata").unwrap();
        let mut tracker = UsageTracker::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        tracker.record(at(0), &mounts, &[], &ops(100));
        assert!(tracker.collect().is_empty());
        // A burst then silence within one interval: the rate is the interval's average.
        tracker.record(at(250), &mounts, &[], &ops(400));
        tracker.record(at(500), &mounts, &[], &ops(400));
        tracker.record(at(1000), &mounts, &[], &ops(400));
        assert_eq!(tracker.collect()[&metadata], 300.0);
        // The channel appears (its counter starts at 0): counting carries on.
        tracker.record(at(1500), &mounts, &[channel(50)], &ops(500));
        tracker.record(at(2000), &mounts, &[channel(150)], &ops(600));
        assert_eq!(tracker.collect()[&metadata], 150.0);
        assert_eq!(tracker.limit(&metadata), Some(100));
        // No report since: the last rates stand.
        assert_eq!(tracker.collect()[&metadata], 150.0);
    }

    #[test]
    fn reports_cannot_lie_past_physics() {
        let mounts = vec!["/scratch".to_string()];
        let metadata = Resource::parse("/scratch:metadata").unwrap();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut tracker = UsageTracker::new(t0);
        // Before any rule: the pre-rule cap (1 M ops/s), a bucket 300 000 deep.
        let clamped = tracker.record(at(250), &mounts, &[channel(100_000_000)], &[]);
        assert_eq!(clamped.len(), 1);
        assert_eq!(clamped[0].2, 550_001);
        // Given 100 ops/s with a burst of 1: the bucket is 13 deep, refilled 100/s, so
        // 1e8 per report counts as 100/s over time.
        tracker.set_rules([(metadata.clone(), 100, 1)]);
        tracker.record(at(500), &mounts, &[channel(100_000_000)], &[]);
        tracker.collect();
        for (i, ms) in (750..=10_500).step_by(250).enumerate() {
            let reported = 100_000_000 * (i as u64 + 2);
            assert_eq!(
                tracker
                    .record(at(ms), &mounts, &[channel(reported)], &[])
                    .len(),
                1
            );
        }
        let rate = tracker.collect()[&metadata];
        assert!((100.0..=102.0).contains(&rate), "{rate}");
        assert_eq!(tracker.limit(&metadata), Some(100));
        // Honest reports are counted as they are.
        let last = 100_000_000 * 41;
        for (i, ms) in (11_500..=15_500).step_by(1000).enumerate() {
            let honest = last + 100 * (i as u64 + 1);
            assert!(tracker
                .record(at(ms), &mounts, &[channel(honest)], &[])
                .is_empty());
        }
        assert_eq!(tracker.collect()[&metadata], 100.0);
        // A bytes channel cannot stand for a metadata resource.
        let mut bytes = channel(400_000_000);
        bytes.spec.unit = Unit::Bytes;
        tracker.record(at(16_500), &mounts, &[bytes], &[]);
        assert_eq!(tracker.collect()[&metadata], 0.0);
    }

    #[test]
    fn channels_of_mountpoints_the_stage_did_not_register_are_not_kept() {
        let mounts = vec!["/scratch".to_string()];
        let t0 = Instant::now();
        let mut tracker = UsageTracker::new(t0);
        // Each report names a thousand new mountpoints: none is remembered.
        for report in 0..10u64 {
            let foreign: Vec<ChannelInfo> = (0..1000)
                .map(|i| {
                    let mut c = channel(5);
                    c.spec.mount = Some(format!("/m{report}-{i}"));
                    c
                })
                .collect();
            tracker.record(
                t0 + Duration::from_millis(250 * (report + 1)),
                &mounts,
                &foreign,
                &ops(1),
            );
        }
        assert_eq!(tracker.raw.len(), Class::ALL.len());
        assert_eq!(tracker.available.len(), Class::ALL.len());
        assert!(tracker.collect().keys().all(|r| r.mount == "/scratch"));
        assert_eq!(
            tracker.limit(&Resource::parse("/m0-0:metadata").unwrap()),
            None
        );
    }

    #[test]
    fn service_times_are_differenced_and_weigh_no_more_than_the_calls() {
        let mounts = vec!["/scratch".to_string()];
        let metadata = Resource::parse("/scratch:metadata").unwrap();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let row = |mount: &str, counts: Vec<u64>| LatencyRow {
            mount: mount.into(),
            class: Class::Metadata,
            counts,
        };
        let mut tracker = UsageTracker::new(t0);
        tracker.record(at(250), &mounts, &[], &ops(100));
        tracker.record_latency(&mounts, &[row("/scratch", vec![0, 60, 40])]);
        tracker.record(at(500), &mounts, &[], &ops(200));
        // A second row for the same resource and a foreign mountpoint are ignored.
        tracker.record_latency(
            &mounts,
            &[
                row("/scratch", vec![0, 110, 90]),
                row("/scratch", vec![0, 1_000_000]),
                row("/home", vec![5]),
            ],
        );
        let collected = tracker.collect_latency();
        assert_eq!(collected.len(), 1);
        assert_eq!(collected[&metadata].counts(), &[0, 110, 90]);
        assert!(tracker.collect_latency().is_empty());
        // 100 calls counted, a million samples claimed: they weigh ~100 calls.
        tracker.record(at(750), &mounts, &[], &ops(300));
        tracker.record_latency(&mounts, &[row("/scratch", vec![0, 1_000_110, 90])]);
        let total = tracker.collect_latency()[&metadata].total();
        assert!((100..=200).contains(&total), "{total}");
    }
}
