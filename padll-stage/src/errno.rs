//! `errno` access: hooks save it before their own work and restore it, so callers see
//! exactly what the real call left.

/// The calling thread's `errno`.
#[inline]
pub fn get() -> i32 {
    // SAFETY: __errno_location always returns the thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno`.
#[inline]
pub fn set(value: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = value }
}

/// The calling thread's `errno` slot, for hooks that save and restore it more than once
/// (one call instead of one per access).
#[inline]
pub fn location() -> *mut i32 {
    // SAFETY: as above.
    unsafe { libc::__errno_location() }
}
