//! A clock for tests that must not count what a loaded machine adds: a thread's own CPU
//! time, or the node-wide monotonic clock another process printed a time on
//! (`#[path = "../../scripts/test-clocks.rs"] mod clocks;` in a crate's `tests/util.rs`).

use std::time::Duration;

/// The time of `clock` now (`libc::CLOCK_MONOTONIC`, `libc::CLOCK_THREAD_CPUTIME_ID`, …).
pub fn now(clock: libc::clockid_t) -> Duration {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given.
    let read = unsafe { libc::clock_gettime(clock, &mut time) };
    assert_eq!(read, 0, "clock_gettime({clock})");
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}
