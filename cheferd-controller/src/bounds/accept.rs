//! Accept loops that back off while descriptors or memory run out, and the
//! descriptor limit raised to its hard limit.

use std::io;
use std::time::Duration;
use tracing::warn;

/// Whether an accept error means the process (or system) ran out of something that
/// only time frees (descriptors, memory): the accept loop must then sleep, not spin.
pub fn is_exhaustion(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Backoff of an accept loop: after an error, how long to sleep (doubling from 10 ms
/// to 1 s while errors go on); logs one line per burst of errors and, when accepting
/// works again, one line with how many failed.
#[derive(Default)]
pub struct AcceptBackoff {
    failures: u64,
    delay: Duration,
}

impl AcceptBackoff {
    /// An accept failed: logs (first failure of a burst only) and returns how long to
    /// sleep before trying again.
    pub fn failed(&mut self, what: &str, error: &io::Error) -> Duration {
        if self.failures == 0 {
            warn!("{what}: accept failed ({error}); backing off until it works again");
        }
        self.failures += 1;
        self.delay = if is_exhaustion(error) {
            (self.delay * 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
        } else {
            Duration::from_millis(10)
        };
        self.delay
    }

    /// An accept worked.
    pub fn succeeded(&mut self, what: &str) {
        if self.failures > 0 {
            warn!(
                "{what}: accepting again after {} failed attempts",
                self.failures
            );
            self.failures = 0;
            self.delay = Duration::ZERO;
        }
    }
}

/// Raises the soft limit on open descriptors to the hard limit; returns the limit now
/// in force.
pub fn raise_nofile() -> u64 {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
        limit.rlim_cur as u64
    }
}
