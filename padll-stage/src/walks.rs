//! Walks that change directory inside glibc: `nftw`/`nftw64` with `FTW_CHDIR`, and the
//! `fts` functions of a stream opened without `FTS_NOCHDIR`. glibc moves into each
//! directory with its own internal `fchdir`/`chdir`, which no hook sees, and hands the
//! program names relative to it (`path + ftw->base`, `fts_accpath`). The stage resolves
//! relative paths against the current directory it last saw
//! ([`refresh_current_dir`]), so these hooks have it read the directory again whenever
//! the program's own code runs during such a walk:
//!
//! - `nftw`/`nftw64` with `FTW_CHDIR`: the program's callback is called through
//!   [`trampoline`], which refreshes the current directory first when the entry's depth
//!   (`ftw->level`) is not the previous callback's: glibc enters or leaves a directory
//!   only between callbacks of different depths (one system call a directory, not one
//!   an entry); after the walk (glibc has gone back to where it started) it is
//!   refreshed once more. The program's
//!   function is kept in a thread-local while its walk runs (glibc calls it on the
//!   walk's own thread), the one it replaced saved in the hook's frame and put back
//!   after, so that a callback may start a walk of its own.
//! - `fts_read`, `fts_children`, `fts_close` (and their `fts64_` names): refreshed after
//!   the call, unless the stream's options (`fts_options`, which glibc also sets to
//!   `FTS_NOCHDIR` when it cannot keep its starting directory) say it never changes
//!   directory; after `fts_read` only when the entry's parent (`fts_parent`, the
//!   directory glibc is in for it) is not the previous entry's. `fts_open` and `fts_set`
//!   do not change directory.
//!
//! Not hooked: `ftw`/`ftw64`, which never change directory (they walk as `nftw` without
//! flags). The walk's own calls (its `lstat`s, `openat`s of directories) stay glibc's
//! internal calls, invisible to the stage. Other threads' relative calls during a walk
//! resolve against the directory glibc is in, as the kernel resolves them, from the
//! moment the walk's thread next runs the program's code (its callback, or the return
//! of an `fts` call). A callback that leaves its walk by `longjmp` leaves its function
//! as the thread's current one until the next walk with `FTW_CHDIR` replaces it.
//!
//! Each hook keeps the real call's result and `errno` (the refresh is
//! [`shielded`]); a program that never calls these pays nothing, and before
//! initialisation, with nothing registered or in a vfork child they are the real calls.

use crate::guard::shielded;
use crate::real::{Real, Unavailable};
use crate::resolve::refresh_current_dir;
use crate::vfork;
use libc::{c_char, c_int, c_void};
use std::cell::Cell;

/// `FTW_CHDIR` (`<ftw.h>`).
const FTW_CHDIR: c_int = 4;
/// `FTS_NOCHDIR` (`<fts.h>`).
const FTS_NOCHDIR: c_int = 0x0004;

/// A program's `nftw` (or `nftw64`) callback: path, its `stat` (`stat64`: the same
/// pointer), type flag, `struct FTW *`.
type Callback = unsafe extern "C" fn(*const c_char, *const c_void, c_int, *mut c_void) -> c_int;
type NftwFn = unsafe extern "C" fn(*const c_char, Option<Callback>, c_int, c_int) -> c_int;
type FtsReadFn = unsafe extern "C" fn(*mut Fts) -> *mut c_void;
type FtsChildrenFn = unsafe extern "C" fn(*mut Fts, c_int) -> *mut c_void;
type FtsCloseFn = unsafe extern "C" fn(*mut Fts) -> c_int;

/// glibc's `FTS` (`FTS64` has the same layout), up to the options: `<fts.h>`. Only
/// `options` is read; the fields before it place it.
#[repr(C)]
#[allow(dead_code)]
pub struct Fts {
    cur: *mut c_void,
    child: *mut c_void,
    array: *mut *mut c_void,
    dev: libc::dev_t,
    path: *mut c_char,
    rfd: c_int,
    pathlen: c_int,
    nitems: c_int,
    compar: *const c_void,
    options: c_int,
}

/// A real function whose hook is in this module.
pub(crate) struct WalkReal(Real);

static NFTW: WalkReal = WalkReal(Real::new(c"nftw"));
static NFTW64: WalkReal = WalkReal(Real::new(c"nftw64"));
static FTS_READ: WalkReal = WalkReal(Real::new(c"fts_read"));
static FTS64_READ: WalkReal = WalkReal(Real::new(c"fts64_read"));
static FTS_CHILDREN: WalkReal = WalkReal(Real::new(c"fts_children"));
static FTS64_CHILDREN: WalkReal = WalkReal(Real::new(c"fts64_children"));
static FTS_CLOSE: WalkReal = WalkReal(Real::new(c"fts_close"));
static FTS64_CLOSE: WalkReal = WalkReal(Real::new(c"fts64_close"));
#[cfg(target_arch = "x86_64")]
static NFTW_2_2_5: WalkReal = WalkReal(Real::versioned(c"nftw", c"GLIBC_2.2.5"));
#[cfg(target_arch = "x86_64")]
static NFTW64_2_2_5: WalkReal = WalkReal(Real::versioned(c"nftw64", c"GLIBC_2.2.5"));

/// Every real function behind this module's hooks, for eager resolution.
pub(crate) static REALS: &[&Real] = &[
    &NFTW.0,
    &NFTW64.0,
    &FTS_READ.0,
    &FTS64_READ.0,
    &FTS_CHILDREN.0,
    &FTS64_CHILDREN.0,
    &FTS_CLOSE.0,
    &FTS64_CLOSE.0,
    #[cfg(target_arch = "x86_64")]
    &NFTW_2_2_5.0,
    #[cfg(target_arch = "x86_64")]
    &NFTW64_2_2_5.0,
];

thread_local! {
    /// The program's callback of the walk with `FTW_CHDIR` running on this thread, and
    /// the depth of the entry its last call was for (-2 before the first: no depth).
    static CALLBACK: Cell<Option<(Callback, c_int)>> = const { Cell::new(None) };
    /// The parent (`fts_parent`) of the entry an `fts_read` on this thread last returned
    /// from a stream that changes directory; null when unknown.
    static FTS_PARENT: Cell<*mut c_void> = const { Cell::new(std::ptr::null_mut()) };
}

/// Depth of no entry, for [`CALLBACK`] before the walk's first callback.
const NO_LEVEL: c_int = -2;

/// glibc's `struct FTW` (`<ftw.h>`).
#[repr(C)]
struct Ftw {
    base: c_int,
    level: c_int,
}

/// glibc's `FTSENT` (`FTSENT64` has the same layout), up to its parent: `<fts.h>`.
#[repr(C)]
struct FtsEntry {
    cycle: *mut c_void,
    parent: *mut c_void,
}

/// Whether the stage follows directory changes now: initialised with mountpoints, and
/// not in a vfork child (whose directory is not the parent's, whose state it shares).
#[inline]
fn following() -> bool {
    crate::active_mounts().is_some() && !vfork::in_child()
}

/// Reads the current directory again, keeping `errno` and catching any panic.
fn follow_current_dir() {
    shielded(refresh_current_dir);
}

/// What glibc calls instead of the program's `nftw` callback: the current directory is
/// refreshed (glibc may have changed it since the program's code last ran), then the
/// program's function is called with glibc's arguments and its result returned.
///
/// # Safety
/// Called by glibc's `nftw` as the walk's callback, with the arguments it gives one.
unsafe extern "C" fn trampoline(
    path: *const c_char,
    status: *const c_void,
    kind: c_int,
    ftw: *mut c_void,
) -> c_int {
    // SAFETY: glibc's `struct FTW` for this entry (null only if glibc gave none).
    let level = (!ftw.is_null()).then(|| unsafe { (*ftw.cast::<Ftw>()).level });
    let current = CALLBACK.try_with(Cell::get).ok().flatten();
    if level.is_none() || current.is_none_or(|(_, last)| Some(last) != level) {
        follow_current_dir();
        if let (Some((callback, _)), Some(level)) = (current, level) {
            let _ = CALLBACK.try_with(|cell| cell.set(Some((callback, level))));
        }
    }
    match current {
        // SAFETY: the program's callback, set by the hook of the walk calling us on
        // this thread, called with the arguments glibc gave for it.
        Some((callback, _)) => unsafe { callback(path, status, kind, ftw) },
        // Not reached: the hook sets the callback before starting the walk.
        None => 0,
    }
}

/// The body of the `nftw` hooks.
///
/// # Safety
/// `real` is an `nftw` or `nftw64` of libc; the arguments are the application's.
unsafe fn walk(
    real: &WalkReal,
    path: *const c_char,
    callback: Option<Callback>,
    descriptors: c_int,
    flags: c_int,
) -> c_int {
    let Some(address) = real.0.address() else {
        return c_int::unavailable();
    };
    // SAFETY: libc's `nftw`/`nftw64` (resolved by name), which has this signature.
    let real = unsafe { std::mem::transmute::<*mut c_void, NftwFn>(address) };
    if flags & FTW_CHDIR == 0 || callback.is_none() || !following() {
        // SAFETY: the application's arguments, unchanged.
        return unsafe { real(path, callback, descriptors, flags) };
    }
    let ours = callback.map(|callback| (callback, NO_LEVEL));
    let Ok(outer) = CALLBACK.try_with(|current| current.replace(ours)) else {
        // No thread-local (the thread is ending): the walk as it is, followed after.
        // SAFETY: the application's arguments, unchanged.
        let result = unsafe { real(path, callback, descriptors, flags) };
        follow_current_dir();
        return result;
    };
    // SAFETY: the application's arguments but the callback, which is `trampoline`,
    // calling the application's with glibc's arguments.
    let result = unsafe { real(path, Some(trampoline), descriptors, flags) };
    let _ = CALLBACK.try_with(|current| current.set(outer));
    follow_current_dir();
    result
}

/// Whether an `fts` call on `stream` may change directory.
///
/// # Safety
/// `stream` is null or the application's open `FTS` stream.
unsafe fn changes_directory(stream: *mut Fts) -> bool {
    // SAFETY: the application's open stream (not null), which the real call reads too.
    !stream.is_null() && following() && unsafe { (*stream).options } & FTS_NOCHDIR == 0
}

/// The body of the `fts_read` hooks.
///
/// # Safety
/// `real` is an `fts_read` or `fts64_read` of libc; the argument is the application's.
unsafe fn read_stream(real: &WalkReal, stream: *mut Fts) -> *mut c_void {
    let Some(address) = real.0.address() else {
        return <*mut c_void>::unavailable();
    };
    // SAFETY: libc's `fts_read`/`fts64_read` (resolved by name), which has this
    // signature, with the application's argument.
    let result = unsafe { std::mem::transmute::<*mut c_void, FtsReadFn>(address)(stream) };
    // SAFETY: the application's stream, still open.
    if unsafe { changes_directory(stream) } {
        // SAFETY: the entry glibc just returned (not null), valid until the next call.
        let parent = (!result.is_null()).then(|| unsafe { (*result.cast::<FtsEntry>()).parent });
        let last = FTS_PARENT.try_with(|last| last.replace(parent.unwrap_or(std::ptr::null_mut())));
        if parent.is_none() || last.ok() != parent {
            follow_current_dir();
        }
    }
    result
}

/// Forgets the last `fts_read` entry's parent: the next one refreshes the directory.
fn forget_fts_parent() {
    let _ = FTS_PARENT.try_with(|last| last.set(std::ptr::null_mut()));
}

/// The body of the `fts_children` hooks.
///
/// # Safety
/// `real` is an `fts_children` or `fts64_children` of libc; the arguments are the
/// application's.
unsafe fn stream_children(real: &WalkReal, stream: *mut Fts, options: c_int) -> *mut c_void {
    let Some(address) = real.0.address() else {
        return <*mut c_void>::unavailable();
    };
    // SAFETY: libc's `fts_children`/`fts64_children` (resolved by name), which has this
    // signature, with the application's arguments.
    let result =
        unsafe { std::mem::transmute::<*mut c_void, FtsChildrenFn>(address)(stream, options) };
    // SAFETY: the application's stream, still open.
    if unsafe { changes_directory(stream) } {
        forget_fts_parent();
        follow_current_dir();
    }
    result
}

/// The body of the `fts_close` hooks (the stream is freed by the call: its options are
/// read before).
///
/// # Safety
/// `real` is an `fts_close` or `fts64_close` of libc; the argument is the application's.
unsafe fn close_stream(real: &WalkReal, stream: *mut Fts) -> c_int {
    let Some(address) = real.0.address() else {
        return c_int::unavailable();
    };
    // SAFETY: the application's stream, open until the call below.
    let follow = unsafe { changes_directory(stream) };
    // SAFETY: libc's `fts_close`/`fts64_close` (resolved by name), which has this
    // signature, with the application's argument.
    let result = unsafe { std::mem::transmute::<*mut c_void, FtsCloseFn>(address)(stream) };
    if follow {
        forget_fts_parent();
        follow_current_dir();
    }
    result
}

macro_rules! exported {
    ($(#[$attr:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $body:ident($real:ident)) => {
        #[doc = concat!("The exported `", stringify!($name), "` hook.")]
        ///
        /// # Safety
        #[doc = concat!("The contract of libc's `", stringify!($name), "`.")]
        $(#[$attr])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the real function of this very symbol and the application's
            // arguments, unchanged.
            unsafe { $body(&$real, $($arg),*) }
        }
    };
}

exported!(fn nftw(path: *const c_char, callback: Option<Callback>, descriptors: c_int, flags: c_int) -> c_int = walk(NFTW));
exported!(fn nftw64(path: *const c_char, callback: Option<Callback>, descriptors: c_int, flags: c_int) -> c_int = walk(NFTW64));
exported!(fn fts_read(stream: *mut Fts) -> *mut c_void = read_stream(FTS_READ));
exported!(fn fts64_read(stream: *mut Fts) -> *mut c_void = read_stream(FTS64_READ));
exported!(fn fts_children(stream: *mut Fts, options: c_int) -> *mut c_void = stream_children(FTS_CHILDREN));
exported!(fn fts64_children(stream: *mut Fts, options: c_int) -> *mut c_void = stream_children(FTS64_CHILDREN));
exported!(fn fts_close(stream: *mut Fts) -> c_int = close_stream(FTS_CLOSE));
exported!(fn fts64_close(stream: *mut Fts) -> c_int = close_stream(FTS64_CLOSE));

// The first `nftw` (glibc 2.1 to 2.3.2) ignores flags it does not know, where the
// current one refuses them: programs linked then bind to it (`nftw@GLIBC_2.2.5` on
// x86-64), and reach it through these hooks (see `hooks.rs`, "Versioned entry points").
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".symver nftw, nftw@@GLIBC_2.3.3",
    ".symver padll_nftw_2_2_5, nftw@GLIBC_2.2.5",
    ".symver nftw64, nftw64@@GLIBC_2.3.3",
    ".symver padll_nftw64_2_2_5, nftw64@GLIBC_2.2.5",
);

exported!(#[cfg(target_arch = "x86_64")] fn padll_nftw_2_2_5(path: *const c_char, callback: Option<Callback>, descriptors: c_int, flags: c_int) -> c_int = walk(NFTW_2_2_5));
exported!(#[cfg(target_arch = "x86_64")] fn padll_nftw64_2_2_5(path: *const c_char, callback: Option<Callback>, descriptors: c_int, flags: c_int) -> c_int = walk(NFTW64_2_2_5));

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn fts_open(
            paths: *const *const c_char,
            options: c_int,
            compare: *const c_void,
        ) -> *mut Fts;
    }

    /// The options as glibc keeps them, read through [`Fts`]: its layout is glibc's.
    fn options_of(options: c_int) -> c_int {
        let roots = [c"/".as_ptr(), std::ptr::null()];
        // SAFETY: a null-terminated array of NUL-terminated paths, no comparison.
        let stream = unsafe { fts_open(roots.as_ptr(), options, std::ptr::null()) };
        assert!(!stream.is_null());
        // SAFETY: the stream just opened, closed once after reading it.
        unsafe {
            let kept = (*stream).options;
            assert_eq!(fts_close(stream), 0);
            kept
        }
    }

    #[test]
    fn the_streams_options_are_read_where_glibc_keeps_them() {
        const FTS_PHYSICAL: c_int = 0x0010;
        const FTS_LOGICAL: c_int = 0x0002;
        assert_eq!(options_of(FTS_PHYSICAL) & FTS_NOCHDIR, 0);
        assert_ne!(options_of(FTS_PHYSICAL | FTS_NOCHDIR) & FTS_NOCHDIR, 0);
        // A logical walk never changes directory: glibc says so in the options.
        assert_ne!(options_of(FTS_LOGICAL) & FTS_NOCHDIR, 0);
        assert_eq!(options_of(FTS_PHYSICAL) & 0xff, FTS_PHYSICAL);
    }

    static CALLED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

    unsafe extern "C" fn first(
        _: *const c_char,
        _: *const c_void,
        kind: c_int,
        _: *mut c_void,
    ) -> c_int {
        CALLED.store(kind, std::sync::atomic::Ordering::Relaxed);
        1
    }

    unsafe extern "C" fn second(
        _: *const c_char,
        _: *const c_void,
        kind: c_int,
        _: *mut c_void,
    ) -> c_int {
        CALLED.store(-kind, std::sync::atomic::Ordering::Relaxed);
        2
    }

    #[test]
    fn the_trampoline_calls_the_walks_own_callback() {
        let call = |kind| {
            // SAFETY: the callbacks read none of their pointer arguments.
            unsafe {
                trampoline(
                    std::ptr::null(),
                    std::ptr::null(),
                    kind,
                    std::ptr::null_mut(),
                )
            }
        };
        let outer = CALLBACK.with(|current| current.replace(Some((first as Callback, NO_LEVEL))));
        assert_eq!(call(3), 1);
        assert_eq!(CALLED.load(std::sync::atomic::Ordering::Relaxed), 3);
        // A nested walk's callback, then the outer one again.
        let inner = CALLBACK.with(|current| current.replace(Some((second as Callback, NO_LEVEL))));
        assert_eq!(call(4), 2);
        assert_eq!(CALLED.load(std::sync::atomic::Ordering::Relaxed), -4);
        CALLBACK.with(|current| current.set(inner));
        assert_eq!(call(5), 1);
        assert_eq!(CALLED.load(std::sync::atomic::Ordering::Relaxed), 5);
        CALLBACK.with(|current| current.set(outer));
    }
}
