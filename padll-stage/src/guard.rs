//! The guards around the stage's own work on the application's threads: [`StageIo`]
//! marks the stage's own I/O (which no hook manages), [`guarded`] keeps a panic from
//! crossing into the application, and [`shielded`] keeps `errno` too.

use crate::{errno, stats};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static IN_STAGE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as doing the stage's own I/O (config, statistics, logs):
/// while it lives, every hook on this thread goes straight through. The flag is kept
/// in the thread's statistics shard when it owns one (read by the managed path without
/// a thread-local lookup) and always in a thread-local (for threads that do not).
pub struct StageIo {
    outer: bool,
}

impl StageIo {
    /// Enters the stage's own I/O.
    pub fn enter() -> StageIo {
        let outer = IN_STAGE.try_with(|f| f.replace(true)).unwrap_or(true);
        stats::local().set_stage_io(true);
        StageIo { outer }
    }
}

impl Drop for StageIo {
    fn drop(&mut self) {
        let _ = IN_STAGE.try_with(|f| f.set(self.outer));
        stats::local().set_stage_io(self.outer);
    }
}

#[inline]
pub(crate) fn in_stage_io(counters: stats::Counters) -> bool {
    counters
        .stage_io()
        .unwrap_or_else(|| IN_STAGE.try_with(Cell::get).unwrap_or(true))
}

/// Runs stage logic so that a panic in it never crosses into the application.
#[inline(always)]
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// Runs cold stage work (reserving and waiting in a bucket, settling a byte count,
/// remembering a path) so that neither a panic nor a change of `errno` escapes: a
/// caught panic yields `None` (the call passes through), and `errno` is restored.
#[inline(never)]
pub(crate) fn shielded<T>(f: impl FnOnce() -> T) -> Option<T> {
    let errno = errno::location();
    // SAFETY: the calling thread's errno slot (`__errno_location`: valid, aligned, for
    // the thread's lifetime).
    let saved = unsafe { *errno };
    let result = guarded(f);
    // SAFETY: the same slot, on the same thread.
    unsafe { *errno = saved };
    result
}
