//! What peers cause in the log, summarised so that no peer can make it grow at will
//! and an operator still sees the activity:
//!
//! - stages coming and going ([`Activity`]): a line for each while they are few (they
//!   share the limit of peer-caused lines, 20 per 5 s), and for every
//!   [`SUMMARY_PERIOD`] in which some were not logged one line counting them all;
//! - usage reports above what the stage's rules admit ([`OverReports`]): on a loaded
//!   node reports arrive late and bunched, so a small excess is routine and goes into
//!   one line per period, counted per job; only an excess that looks like an attack
//!   ([`ATTACK_RATIO`]) is warned about at once.

use crate::bounds::LogLimit;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tracing::info;

/// How often a summary line is logged, at most (each kind).
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(30);

/// A report adding more than this many times what the stage's rules admit is warned
/// about at once (rate-limited): late reports add a fraction more, a lying stage orders
/// of magnitude.
pub const ATTACK_RATIO: u64 = 4;

/// Jobs named in a summary of reports above the rules, at most (those with the most
/// tokens not counted).
const JOBS_NAMED: usize = 5;

/// What happened to a stage connection, as counted in the summary.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// A stage registered.
    Registered = 0,
    /// A registered stage left.
    Left,
    /// A connection or stage was refused.
    Rejected,
    /// A stage was closed (it did not read, or held too many bytes of partial lines).
    Closed,
}

/// Stage events counted over the current period, logged through a shared limit.
pub struct Activity {
    limit: &'static LogLimit,
    counts: [AtomicU64; 4],
    /// Whether an event's line was suppressed in this period.
    suppressed: AtomicBool,
}

/// One event of an [`Activity`], for `crate::limited_warn!`/`crate::limited_info!`.
pub struct Counted<'a> {
    activity: &'a Activity,
    event: Event,
}

impl Counted<'_> {
    /// Counts the event; whether its line may be logged ([`LogLimit::allow`]).
    pub fn allow(&self) -> Option<u64> {
        let activity = self.activity;
        activity.counts[self.event as usize].fetch_add(1, Ordering::Relaxed);
        let allowed = activity.limit.allow();
        if allowed.is_none() {
            activity.suppressed.store(true, Ordering::Relaxed);
        }
        allowed
    }
}

impl Activity {
    /// Events whose lines go through `limit`.
    pub const fn new(limit: &'static LogLimit) -> Activity {
        Activity {
            limit,
            counts: [const { AtomicU64::new(0) }; 4],
            suppressed: AtomicBool::new(false),
        }
    }

    /// `event`, to count and maybe log.
    pub fn on(&self, event: Event) -> Counted<'_> {
        Counted {
            activity: self,
            event,
        }
    }

    /// The summary of the period that ends now, if a line of it was suppressed; the
    /// counts start again.
    pub fn summary(&self) -> Option<String> {
        let [registered, left, rejected, closed] =
            self.counts.each_ref().map(|c| c.swap(0, Ordering::Relaxed));
        if !self.suppressed.swap(false, Ordering::Relaxed) {
            return None;
        }
        Some(format!(
            "in the last {} s: {registered} stages registered, {left} left, {rejected} \
             rejected, {closed} closed (not each one logged)",
            SUMMARY_PERIOD.as_secs()
        ))
    }
}

/// Reports above the rules over the current period, per job.
pub struct OverReports {
    jobs: Mutex<BTreeMap<String, Excess>>,
}

/// What one job's stages reported above their rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Excess {
    /// Resources of reports clamped.
    reports: u64,
    /// Tokens not counted.
    tokens: u64,
}

impl OverReports {
    /// None yet.
    pub const fn new() -> OverReports {
        OverReports {
            jobs: Mutex::new(BTreeMap::new()),
        }
    }

    /// A stage of `job` reported `reported` tokens of a resource where its rules admit
    /// `allowed` (and `allowed` were counted). Whether it looks like an attack (to be
    /// warned about at once).
    pub fn record(&self, job: &str, reported: u64, allowed: u64) -> bool {
        let mut jobs = padll_wire::sync::lock(&self.jobs);
        let excess = jobs.entry(job.to_string()).or_default();
        excess.reports += 1;
        excess.tokens = excess
            .tokens
            .saturating_add(reported.saturating_sub(allowed));
        reported / allowed.max(1) >= ATTACK_RATIO
    }

    /// The summary of the period that ends now, if there were such reports; the counts
    /// start again.
    pub fn summary(&self) -> Option<String> {
        let jobs = std::mem::take(&mut *padll_wire::sync::lock(&self.jobs));
        if jobs.is_empty() {
            return None;
        }
        let reports: u64 = jobs.values().map(|e| e.reports).sum();
        let mut ranked: Vec<(String, Excess)> = jobs.into_iter().collect();
        ranked.sort_by(|a, b| b.1.tokens.cmp(&a.1.tokens).then_with(|| a.0.cmp(&b.0)));
        let named: Vec<String> = ranked
            .iter()
            .take(JOBS_NAMED)
            .map(|(job, e)| {
                format!(
                    "job '{}': {} reports, {} tokens",
                    padll_wire::control::short(job),
                    e.reports,
                    e.tokens
                )
            })
            .collect();
        let others = match ranked.len().saturating_sub(JOBS_NAMED) {
            0 => String::new(),
            n => format!(" and {n} more jobs"),
        };
        Some(format!(
            "in the last {} s stages reported more than their rules admit {reports} times, \
             the excess not counted: {}{others}",
            SUMMARY_PERIOD.as_secs(),
            named.join(", ")
        ))
    }
}

/// Logs the summaries every [`SUMMARY_PERIOD`].
pub async fn summary_loop(activity: &Activity, over_reports: &OverReports) {
    loop {
        tokio::time::sleep(SUMMARY_PERIOD).await;
        if let Some(line) = activity.summary() {
            info!("{line}");
        }
        if let Some(line) = over_reports.summary() {
            info!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_summarised_only_when_lines_were_suppressed() {
        static LIMIT: LogLimit = LogLimit::new(3, Duration::from_secs(3600));
        let activity = Activity::new(&LIMIT);
        assert!(activity.on(Event::Registered).allow().is_some());
        assert!(activity.on(Event::Left).allow().is_some());
        assert_eq!(activity.summary(), None, "every line was logged");
        let logged = (0..1000)
            .map(|i| match i % 4 {
                0 => Event::Registered,
                1 => Event::Left,
                2 => Event::Rejected,
                _ => Event::Closed,
            })
            .filter(|event| activity.on(*event).allow().is_some())
            .count();
        assert_eq!(logged, 1, "the limit's third line");
        let summary = activity.summary().expect("lines were suppressed");
        assert!(
            summary.contains("250 stages registered, 250 left, 250 rejected, 250 closed"),
            "{summary}"
        );
        assert_eq!(activity.summary(), None, "a new period");
    }

    #[test]
    fn reports_above_the_rules_are_counted_per_job() {
        let over = OverReports::new();
        assert_eq!(over.summary(), None);
        for _ in 0..40 {
            assert!(!over.record("late", 110, 100), "10 % more: routine");
        }
        assert!(over.record("liar", 100_000_000, 220), "an attack");
        for job in 0..10 {
            over.record(&format!("j{job}"), 2, 1);
        }
        let summary = over.summary().expect("reports were clamped");
        assert!(
            summary.contains("more than their rules admit 51 times"),
            "{summary}"
        );
        assert!(
            summary.contains(
                "the excess not counted: job 'liar': 1 reports, 99999780 tokens, \
                 job 'late': 40 reports, 400 tokens, job 'j0'"
            ),
            "{summary}"
        );
        assert!(summary.contains("and 7 more jobs"), "{summary}");
        assert_eq!(over.summary(), None, "a new period");
    }
}
