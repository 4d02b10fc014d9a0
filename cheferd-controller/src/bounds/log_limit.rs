//! Rate-limited logging of what peers cause ([`LogLimit`], `limited_warn!`,
//! `limited_info!`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A log rate limit: at most `per_window` lines per `window`; the first line allowed
/// after some were suppressed says how many.
pub struct LogLimit {
    per_window: u64,
    window: Duration,
    /// Start of the current window (none yet) and lines logged in it.
    state: Mutex<(Option<Instant>, u64)>,
    suppressed: AtomicU64,
}

impl LogLimit {
    /// At most `per_window` lines per `window`.
    pub const fn new(per_window: u64, window: Duration) -> LogLimit {
        LogLimit {
            per_window,
            window,
            state: Mutex::new((None, 0)),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged now: `Some(n)` with the number suppressed since the
    /// last one logged, `None` to suppress this one.
    pub fn allow(&self) -> Option<u64> {
        let mut state = padll_wire::sync::lock(&self.state);
        let now = Instant::now();
        if state
            .0
            .is_none_or(|start| now.duration_since(start) >= self.window)
        {
            *state = (Some(now), 0);
        }
        if state.1 < self.per_window {
            state.1 += 1;
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Logs an event at `level` through `limit`: nothing while it suppresses, then the
/// count of lines suppressed with the first one let through.
#[macro_export]
macro_rules! limited_event {
    ($level:expr, $limit:expr, $($arg:tt)+) => {
        if let Some(suppressed) = $limit.allow() {
            if suppressed > 0 {
                tracing::event!($level, suppressed, $($arg)+);
            } else {
                tracing::event!($level, $($arg)+);
            }
        }
    };
}

/// Logs a warning about a peer's misbehaviour through `limit` (rate-limited; peers'
/// text must already be cut with `padll_wire::control::short`).
#[macro_export]
macro_rules! limited_warn {
    ($limit:expr, $($arg:tt)+) => {
        $crate::limited_event!(tracing::Level::WARN, $limit, $($arg)+)
    };
}

/// Logs an info line about peers' activity through `limit`, as [`limited_warn!`] does
/// a warning.
#[macro_export]
macro_rules! limited_info {
    ($limit:expr, $($arg:tt)+) => {
        $crate::limited_event!(tracing::Level::INFO, $limit, $($arg)+)
    };
}
