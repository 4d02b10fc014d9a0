//! Turning a stage's cumulative counters into rates per resource.
//!
//! A *resource* is one mountpoint × class (`/scratch:metadata`, counted in ops/s, or
//! `/scratch:data`, counted in bytes/s): what the global controller shares out. A stage
//! reports cumulative tokens per channel and cumulative counts per operation; the rate of
//! a resource over the last report interval comes from the channel the control plane
//! installed for it, or — before it has one — from the operation counters of a stage
//! with a single mountpoint.

use padll_wire::channel::{ChannelInfo, Scope};
use padll_wire::ops::{Class, Op};
use padll_wire::report::OpStats;
use std::collections::HashMap;
use std::time::Instant;

/// One mountpoint × class.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource {
    /// The mountpoint, as the stages register it.
    pub mount: String,
    /// The class of operations.
    pub class: Class,
}

impl Resource {
    /// Parses `MOUNT:CLASS`.
    pub fn parse(text: &str) -> Result<Resource, String> {
        let (mount, class) = text.rsplit_once(':').ok_or_else(|| {
            format!("bad resource '{text}': expected MOUNT:CLASS, as in /scratch:metadata")
        })?;
        if !mount.starts_with('/') {
            return Err(format!(
                "bad resource '{text}': '{mount}' is not an absolute path"
            ));
        }
        let class = Class::from_name(class).ok_or_else(|| {
            format!("bad resource '{text}': '{class}' is not metadata, data, directory or xattr")
        })?;
        Ok(Resource {
            mount: padll_wire::config::normalize_mount(mount),
            class,
        })
    }

    /// Whether its tokens are bytes (data) or operations.
    pub fn counts_bytes(&self) -> bool {
        self.class == Class::Data
    }
}

impl serde::Serialize for Resource {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Resource {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Resource, D::Error> {
        let text = String::deserialize(deserializer)?;
        Resource::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.mount, self.class)
    }
}

/// Cumulative counters of one stage at one instant.
#[derive(Clone, Debug, Default)]
struct Sample {
    at: Option<Instant>,
    tokens: HashMap<Resource, u64>,
}

/// Rates of one stage over each control interval, from its successive usage reports.
///
/// Reports arrive every few hundred milliseconds and loads are bursty, so a rate is
/// taken between the reports that bracket two *collections* (one control interval),
/// not between two reports. Counters that restart (a channel replaced) are stitched so
/// the cumulative count never goes backwards.
#[derive(Debug, Default)]
pub struct UsageTracker {
    /// Raw counters of the last report (to detect restarts).
    raw: HashMap<Resource, u64>,
    /// Stitched cumulative counters, as of the last report.
    latest: Sample,
    /// The same, as of the last collection.
    collected: Sample,
    rates: HashMap<Resource, f64>,
    limits: HashMap<Resource, u64>,
}

impl UsageTracker {
    /// Records a report received `now`.
    pub fn record(
        &mut self,
        now: Instant,
        mountpoints: &[String],
        channels: &[ChannelInfo],
        ops: &[OpStats],
    ) {
        let mut readings = HashMap::new();
        self.limits.clear();
        for channel in channels {
            if let (Some(mount), Scope::Class(class)) = (&channel.spec.mount, channel.spec.scope) {
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
        for (resource, reading) in readings {
            let previous = self.raw.insert(resource.clone(), reading).unwrap_or(0);
            // A counter that went backwards restarted from zero.
            let delta = reading.checked_sub(previous).unwrap_or(reading);
            *self.latest.tokens.entry(resource).or_insert(0) += delta;
        }
        self.latest.at = Some(now);
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

    /// The stage's current limit for each resource, if it has one.
    pub fn limit(&self, resource: &Resource) -> Option<u64> {
        self.limits.get(resource).copied()
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
    fn resource_parsing() {
        assert_eq!(
            Resource::parse("/scratch/:data").unwrap().to_string(),
            "/scratch:data"
        );
        assert!(Resource::parse("scratch:data")
            .unwrap_err()
            .contains("'scratch'"));
        assert!(Resource::parse("/scratch:bogus")
            .unwrap_err()
            .contains("'bogus'"));
        assert!(Resource::parse("/scratch").is_err());
    }
}
