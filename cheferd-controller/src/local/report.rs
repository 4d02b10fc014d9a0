//! When and what usage is pushed to the global controller: the report clock the global
//! controller schedules, and the usage of every stage over the interval that ends.

use super::rules::TableResource;
use super::Local;
use crate::config::Resource;
use crate::proto;
use std::time::Duration;

/// When to push the next usage report, as the global controller scheduled it.
#[derive(Default)]
pub struct ReportClock {
    /// The next report: when, and for which cycle; `None` until scheduled.
    next: Option<(tokio::time::Instant, u64)>,
    interval: Duration,
}

impl ReportClock {
    /// Follows a (new) schedule from the global controller.
    pub fn schedule(&mut self, schedule: &proto::Schedule) {
        // A zero interval would report in a busy loop.
        self.interval = Duration::from_millis(schedule.interval_ms.max(1));
        self.next = Some((
            tokio::time::Instant::now() + Duration::from_millis(schedule.report_in_ms),
            schedule.cycle,
        ));
    }

    /// Waits for the next report's time (forever if none is scheduled); returns the
    /// cycle it is for and schedules the following one an interval later. The slots
    /// stay on the global controller's ticks even if this task runs late; slots it
    /// missed altogether are skipped (their reports would carry no new usage).
    pub async fn next(&mut self) -> u64 {
        let Some((at, cycle)) = self.next else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(at).await;
        let (mut next, mut next_cycle) = (at + self.interval, cycle + 1);
        let now = tokio::time::Instant::now();
        while next <= now {
            next += self.interval;
            next_cycle += 1;
        }
        self.next = Some((next, next_cycle));
        cycle
    }
}

/// The usage of every stage over the control interval that ends now, with the
/// acknowledgement of the latest `Enforce` applied, to push upstream. Each resource is named by its index
/// in the stream's resource table (`Registered`); usage of a resource not in it is left
/// out (the global controller plans only the resources it has).
pub(super) fn usage_report(
    local: &Local,
    cycle: u64,
    applied: u64,
    table: &[Option<TableResource>],
) -> proto::Usage {
    let index = |resource: &Resource| {
        table
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.resource == *resource))
    };
    let mut stages = local.lock_stages();
    proto::Usage {
        cycle,
        applied,
        stages: stages
            .values_mut()
            .map(|entry| {
                let rates = entry.usage.collect().clone();
                let mut latency = entry.usage.collect_latency();
                proto::StageUsage {
                    stage_id: entry.info.stage_id,
                    resources: rates
                        .iter()
                        .filter_map(|(resource, rate)| {
                            Some(proto::ResourceUsage {
                                resource: index(resource)? as u32,
                                rate: *rate,
                                limit: entry.usage.limit(resource).unwrap_or(0),
                                latency: latency
                                    .remove(resource)
                                    .map_or_else(Vec::new, |h| h.counts().to_vec()),
                            })
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}
