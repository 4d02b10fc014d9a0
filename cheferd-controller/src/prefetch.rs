//! A cache prefetch hint for the global controller's walks over objects scattered on
//! the heap (thousands of nodes' stream queues and tasks, a report's stages' usage):
//! asking for them ahead of their use lets the cache misses overlap instead of
//! following one another.

/// How many steps ahead such a loop asks.
pub const AHEAD: usize = 8;

/// Hints that the cache line at `at` will be read soon; nothing elsewhere than on
/// x86-64. Whatever `at` is, it reads nothing the program sees and never faults.
#[inline(always)]
pub fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache: it has no effect the program can see and
    // does not fault, even for an address that is not mapped.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}
