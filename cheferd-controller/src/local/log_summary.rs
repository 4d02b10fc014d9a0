//! What peers cause in the log, summarised so that no peer can make it grow at will
//! and an operator still sees the activity: stages coming and going ([`Activity`]) get
//! a line each while they are few (they share the limit of peer-caused lines, 20 per
//! 5 s), and for every [`SUMMARY_PERIOD`] in which some were not logged one line counts
//! them all.

use crate::bounds::LogLimit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tracing::info;

/// How often a summary line is logged, at most (each kind).
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(30);

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

/// One event of an [`Activity`], for `limited_warn!`/`limited_info!`.
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

/// Logs an info line through a limit (as `crate::limited_warn!` does a warning).
macro_rules! limited_info {
    ($limit:expr, $($arg:tt)+) => {
        if let Some(suppressed) = $limit.allow() {
            if suppressed > 0 {
                tracing::info!(suppressed, $($arg)+);
            } else {
                tracing::info!($($arg)+);
            }
        }
    };
}
pub(super) use limited_info;

/// Logs the summaries every [`SUMMARY_PERIOD`].
pub async fn summary_loop(activity: &Activity) {
    loop {
        tokio::time::sleep(SUMMARY_PERIOD).await;
        if let Some(line) = activity.summary() {
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
}
