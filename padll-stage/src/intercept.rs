//! The logic shared by every hook (Darshan-style: the table in `hooks.rs` names each
//! entry point's operation, target and effect; everything else happens here).
//!
//! One intercepted call:
//! 1. not initialised or nothing registered → the real call, nothing else;
//! 2. find the target's [`Place`] (path → lexical resolution, fd → fd table);
//! 3. unmanaged → count it, call the real function, keep the fd table right;
//! 4. managed → wait in every channel that serves it, call the real function,
//!    settle the byte count, count it, record new descriptors.
//!
//! Invariants: `errno` after the hook is what the real call left; no panic escapes
//! (`guarded`); the stage's own I/O (inside [`StageIo`]) is never managed; steps 1–3
//! take no lock and allocate nothing except to remember a directory above a mountpoint.

use crate::fdtable::{self, PathSlot};
use crate::paths::{self, MountTable, PathBuffer, Place, PATH_CAPACITY};
use crate::{channels, errno, stats};
use libc::{c_char, c_int, c_uint, c_void, DIR, FILE};
use padll_wire::ops::Op;
use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU16, Ordering};

extern "C" {
    fn fileno_unlocked(stream: *mut FILE) -> c_int;
}

/// What a call operates on, and how to find where that is.
#[derive(Clone, Copy)]
pub enum Target {
    /// Nothing file-specific (`sync`).
    None,
    /// A path relative to the current directory.
    Path(*const c_char),
    /// A path relative to a directory descriptor (`*at`); empty or NULL = the fd.
    At(c_int, *const c_char),
    /// An open descriptor.
    Fd(c_int),
    /// A stdio stream.
    Stream(*mut FILE),
    /// A directory stream.
    Dir(*mut DIR),
    /// Two paths (rename, link): managed if either is.
    Paths(*const c_char, *const c_char),
    /// Two dirfd-relative paths.
    AtPaths(c_int, *const c_char, c_int, *const c_char),
    /// A copy between descriptors: a read of `from` and a write of `to`.
    Copy {
        /// Source descriptor.
        from: c_int,
        /// Destination descriptor.
        to: c_int,
    },
}

/// What a hook's table line says about one call.
#[derive(Clone, Copy)]
pub struct Call {
    /// The operation counted and throttled (`None`: the call only keeps the
    /// descriptor table right).
    pub op: Option<Op>,
    /// What it operates on.
    pub target: Target,
    /// What it does to the descriptor table or the current directory.
    pub effect: Effect,
    /// The bytes it asks to move (what byte channels charge before the call).
    pub requested: u64,
}

/// What a call does to the descriptor table or the current directory.
#[derive(Clone, Copy)]
pub enum Effect {
    /// Nothing.
    None,
    /// Returns a new descriptor for the target (open family, mkstemp).
    NewFd {
        /// The open flags (`O_DIRECTORY`/`O_PATH` opens keep their path).
        flags: c_int,
    },
    /// Creates a file if it does not exist, returning a new descriptor (`open` and
    /// `openat` with their mode, `creat`): as [`Effect::NewFd`], and the one place where
    /// [`crate::placement`] may make the call itself (only on entry points returning a
    /// descriptor).
    Create {
        /// The open flags.
        flags: c_int,
        /// The mode of a file created.
        mode: libc::mode_t,
    },
    /// Returns a stream on a new descriptor (fopen).
    NewStream,
    /// Returns a directory stream on a new descriptor (opendir).
    NewDirStream,
    /// Closes a descriptor.
    Close(c_int),
    /// Closes a range of descriptors (`close_range(first, last, flags)`).
    CloseRange(c_uint, c_uint, c_int),
    /// Closes a stream.
    CloseStream(*mut FILE),
    /// Closes a directory stream.
    CloseDirStream(*mut DIR),
    /// Returns a duplicate of a descriptor.
    Dup(c_int),
    /// Makes the second descriptor a duplicate of the first.
    DupTo(c_int, c_int),
    /// `fcntl(fd, cmd, …)`: duplicates for `F_DUPFD*`.
    Fcntl(c_int, c_int),
    /// Reopens a stream on the target (freopen).
    Reopen(*mut FILE),
    /// Changes the current directory.
    Chdir,
}

/// How a call went, for statistics and byte accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Account {
    /// The real call reported an error.
    pub failed: bool,
    /// Bytes it moved.
    pub bytes: u64,
}

/// Return types, as far as the effects need them.
pub trait Returned: Copy {
    /// The descriptor this value stands for, if it is one (fd, stream, dir stream).
    fn descriptor(&self) -> Option<c_int> {
        None
    }

    /// The value standing for a new descriptor `fd`, for entry points returning one.
    fn from_descriptor(_fd: c_int) -> Option<Self> {
        None
    }
}

impl Returned for c_int {
    fn descriptor(&self) -> Option<c_int> {
        (*self >= 0).then_some(*self)
    }

    fn from_descriptor(fd: c_int) -> Option<c_int> {
        Some(fd)
    }
}
impl Returned for isize {}
impl Returned for usize {}
impl Returned for () {}
impl Returned for *mut c_void {}
impl Returned for *mut c_char {}
impl Returned for *mut libc::dirent {}
impl Returned for *mut libc::dirent64 {}
impl Returned for *mut FILE {
    fn descriptor(&self) -> Option<c_int> {
        // SAFETY: a non-null stream just returned by libc.
        (!self.is_null())
            .then(|| unsafe { fileno_unlocked(*self) })
            .filter(|fd| *fd >= 0)
    }
}
impl Returned for *mut DIR {
    fn descriptor(&self) -> Option<c_int> {
        // SAFETY: a non-null directory stream just returned by libc.
        (!self.is_null())
            .then(|| unsafe { libc::dirfd(*self) })
            .filter(|fd| *fd >= 0)
    }
}

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
fn in_stage_io(counters: stats::Counters) -> bool {
    counters
        .stage_io()
        .unwrap_or_else(|| IN_STAGE.try_with(Cell::get).unwrap_or(true))
}

/// Runs stage logic so that a panic in it never crosses into the application.
#[inline(always)]
fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// Where a call's target lies: the main place's [`Place::encode`] in the low half of
/// one word, the source's (of a copy) in the high half. Kept encoded: the managed path
/// only needs "unrelated?" (the word is 0) and the mountpoint indices (code − 2).
#[derive(Clone, Copy)]
pub struct Resolved(u32);

const UNRELATED: Resolved = Resolved(0);

impl Resolved {
    /// The word for "not resolved yet" (no place encodes as `u16::MAX`: mountpoint
    /// indices stay below `u16::MAX - 2`).
    pub const UNKNOWN: u32 = u32::MAX;

    #[inline(always)]
    fn new(main: Place, source: Place) -> Resolved {
        Resolved(main.encode() as u32 | (source.encode() as u32) << 16)
    }

    #[inline(always)]
    fn main(self) -> Place {
        Place::decode(self.0 as u16)
    }

    /// The main place's mountpoint index, if managed.
    #[inline(always)]
    fn main_mount(self) -> Option<u16> {
        (self.0 as u16).checked_sub(2)
    }

    /// The source's mountpoint index, if managed.
    #[inline(always)]
    fn source_mount(self) -> Option<u16> {
        ((self.0 >> 16) as u16).checked_sub(2)
    }

    #[inline(always)]
    fn is_unrelated(self) -> bool {
        self.0 == 0
    }
}

/// The fast path of every hook, inlined into it and specialised for its target and
/// effect: classifies the target where that is cheap (descriptors: one load; clean
/// paths: one fused read of the path and a compare of its first 16 bytes with each
/// mountpoint's) and, when it is unrelated, counts the call in the thread's cached
/// shard and calls `real`. Calls nothing that is not inlined but `real` and `slow`
/// (on x86-64 an fd hook needs no stack frame before its tail call to libc), cannot
/// panic, takes no lock, allocates nothing. Everything else — managed targets, unclean
/// paths, relative paths from a directory above a mountpoint, a thread's first call —
/// goes to `slow` (out of line: [`intercept_resolved`]), with the target's place when
/// it is already known.
///
/// # Safety
/// `target` and `effect` must hold the pointers the application passed, and `real`
/// must call the real function with the application's arguments.
#[inline(always)]
pub unsafe fn dispatch<R: Returned>(
    op: Option<Op>,
    target: Target,
    effect: Effect,
    real: impl FnOnce() -> R,
    slow: impl FnOnce(u32) -> R,
) -> R {
    let Some(mounts) = crate::active_mounts() else {
        return real();
    };
    if let Some(op) = op {
        // SAFETY: `target` holds the application's pointers, valid for the duration of
        // the hook (our caller's contract).
        let code = match unsafe { quick_resolve(mounts, target) } {
            Some(code) => code,
            None => return slow(Resolved::UNKNOWN),
        };
        if code != 0 {
            return slow(code);
        }
        match stats::cached() {
            Some(counters) => counters.passthrough(op),
            None => return slow(0),
        }
    }
    match (effect, target) {
        // The descriptor was just read as unrelated: nothing to forget.
        (Effect::Close(fd), Target::Fd(target_fd)) if fd == target_fd && op.is_some() => {}
        (Effect::CloseStream(a), Target::Stream(b)) if a == b && op.is_some() => {}
        (Effect::CloseDirStream(a), Target::Dir(b)) if a == b && op.is_some() => {}
        _ => before(effect),
    }
    let result = real();
    after_unrelated(effect, &result);
    result
}

/// The hook body: see the module documentation.
///
/// # Safety
/// `call`'s target and effect must hold the pointers the application passed, and
/// `real` must call the real function with the application's arguments.
#[inline(always)]
pub unsafe fn intercept<R: Returned>(
    call: Call,
    account: impl FnOnce(&R) -> Account,
    real: impl FnOnce() -> R,
) -> R {
    if !crate::is_active() {
        return real();
    }
    // SAFETY: our caller's contract, passed on unchanged.
    unsafe { intercept_rest(Resolved::UNKNOWN, call, account, real) }
}

/// [`intercept`] once the stage is known to be active (the hooks' `slow`, reached only
/// from [`dispatch`] after it found the mount table published, which happens after
/// `ACTIVE` is set, and `ACTIVE` is never cleared), when the fast path may already have
/// found where the target lies (`found`, else [`Resolved::UNKNOWN`]).
///
/// Inlined into each hook's `slow`, it holds only the common managed call (see
/// [`is_common`]) of a thread that owns its shard and is not doing the stage's own
/// I/O; everything else is `rest` (the hook's own out-of-line call of
/// [`intercept_rest`] with the same arguments), so that the common path keeps few
/// values alive across the real call and its target and effect stay constants.
///
/// # Safety
/// As for [`intercept`]; `rest` must call [`intercept_rest`] with the same arguments.
#[inline(always)]
pub unsafe fn intercept_resolved<R: Returned>(
    found: u32,
    call: Call,
    account: impl FnOnce(&R) -> Account,
    real: impl FnOnce() -> R,
    rest: impl FnOnce() -> R,
) -> R {
    if let (Some(op), Some(counters)) = (call.op, stats::cached()) {
        if is_common(found, call.effect) && counters.stage_io() == Some(false) {
            let (target, effect, resolved) = (call.target, call.effect, Resolved(found));
            return tracked_with(
                counters,
                op,
                target,
                effect,
                resolved,
                call.requested,
                account,
                real,
            );
        }
    }
    rest()
}

/// A call the hooks' `slow` handles inline: its target (or a copy's source) is managed
/// and its effect needs at most one store in the descriptor table (no path to
/// remember, nothing to duplicate, no directory change).
#[inline(always)]
fn is_common(found: u32, effect: Effect) -> bool {
    if found == Resolved::UNKNOWN {
        return false;
    }
    let resolved = Resolved(found);
    let main_managed = resolved.main_mount().is_some();
    if !main_managed && resolved.source_mount().is_none() {
        return false;
    }
    match effect {
        Effect::None
        | Effect::Close(_)
        | Effect::CloseRange(..)
        | Effect::CloseStream(_)
        | Effect::CloseDirStream(_) => true,
        // A creating call's placement (`placement::create`) is one bit test unless the
        // mountpoint has it, and then shielded.
        Effect::NewFd { flags } | Effect::Create { flags, .. } => {
            main_managed && flags & (libc::O_DIRECTORY | libc::O_PATH) == 0
        }
        Effect::NewStream => main_managed,
        _ => false,
    }
}

/// [`intercept_resolved`] for every call that is not [`is_common`]: resolving the
/// target in full, unrelated targets, directories above a mountpoint, effects that
/// remember paths, a thread's first call, the stage's own I/O.
///
/// # Safety
/// As for [`intercept`].
#[inline(always)]
pub unsafe fn intercept_rest<R: Returned>(
    found: u32,
    call: Call,
    account: impl FnOnce(&R) -> Account,
    real: impl FnOnce() -> R,
) -> R {
    let Call {
        op,
        target,
        effect,
        requested,
    } = call;
    let resolved = match op {
        Some(_) if found != Resolved::UNKNOWN => Resolved(found),
        Some(_) => resolve(target),
        None => UNRELATED,
    };
    match op {
        Some(op) if !resolved.is_unrelated() => {
            let counters = stats::local();
            if in_stage_io(counters) {
                return real();
            }
            tracked_with(
                counters, op, target, effect, resolved, requested, account, real,
            )
        }
        _ => {
            if let Some(op) = op {
                stats::local().passthrough(op);
            }
            before(effect);
            let result = real();
            after_unrelated(effect, &result);
            result
        }
    }
}

/// Where `target` lies, when that is cheap to find (see [`dispatch`]), encoded as in a
/// [`Resolved`] word (0 = unrelated); `None` otherwise. Descriptor places are passed on
/// as the fd table stores them, never decoded here.
///
/// # Safety
/// `target`'s pointers are null or the application's (NUL-terminated paths, open
/// streams and directory streams), valid for the duration of the call.
#[inline(always)]
unsafe fn quick_resolve(mounts: &MountTable, target: Target) -> Option<u32> {
    // SAFETY: `path` is one of `target`'s paths: null or the application's path
    // argument, valid for the duration of the hook.
    let path = |dirfd, path| Some(unsafe { quick_path(mounts, dirfd, path) }?.encode() as u32);
    // SAFETY: `a` is one of `target`'s paths, as above.
    let either = |dir_a, a, dir_b, b| match unsafe { quick_path(mounts, dir_a, a) }? {
        first @ Place::Managed(_) => Some(first.encode() as u32),
        _ => path(dir_b, b),
    };
    match target {
        Target::None => Some(0),
        Target::Path(p) => path(libc::AT_FDCWD, p),
        Target::At(dirfd, p) => path(dirfd, p),
        Target::Fd(fd) => Some(fdtable::place_code(fd) as u32),
        // SAFETY: null or the application's open stream, valid for the duration of the hook.
        Target::Stream(stream) => Some(fdtable::place_code(unsafe { stream_fd(stream) }) as u32),
        // SAFETY: null or the application's open directory stream, valid for the
        // duration of the hook.
        Target::Dir(dir) => Some(fdtable::place_code(unsafe { dir_fd(dir) }) as u32),
        Target::Paths(a, b) => either(libc::AT_FDCWD, a, libc::AT_FDCWD, b),
        Target::AtPaths(dir_a, a, dir_b, b) => either(dir_a, a, dir_b, b),
        Target::Copy { from, to } => {
            Some(fdtable::place_code(to) as u32 | (fdtable::place_code(from) as u32) << 16)
        }
    }
}

/// [`place_of_path`] for the cheap cases: a clean path, absolute and unrelated on its
/// first bytes, or relative to an unrelated (or, without nested mountpoints, managed)
/// directory.
///
/// # Safety
/// `path` is null or the application's NUL-terminated path, valid for the duration of
/// the call.
#[inline(always)]
unsafe fn quick_path(mounts: &MountTable, dirfd: c_int, path: *const c_char) -> Option<Place> {
    if path.is_null() {
        return None;
    }
    // SAFETY: the application's non-null path argument, NUL-terminated and valid for
    // the duration of the hook: its first byte is readable.
    if unsafe { *path } == b'/' as c_char {
        // SAFETY: the application's path: NUL-terminated, starting with `/`
        // (quick_absolute's contract).
        return unsafe { mounts.quick_absolute(path.cast()) };
    }
    // SAFETY: the application's path, NUL-terminated (scan's contract).
    if unsafe { paths::scan(path.cast()) }? == 0 {
        return None;
    }
    match base_place(dirfd) {
        Place::Unrelated => Some(Place::Unrelated),
        Place::Managed(m) if !mounts.has_nested() => Some(Place::Managed(m)),
        _ => None,
    }
}

/// Calls whose target is managed, or a directory above a mountpoint (whose new
/// descriptor must remember its path), counted in `counters` (the calling thread's,
/// not doing the stage's own I/O). Inlined into each hook's out-of-line `slow`, so the
/// operation, target kind and effect are constants there.
///
/// The common case — a thread that owns its counter shard, every channel paid from the
/// thread's leased credit, no byte count to settle, no path to remember — runs only
/// code that cannot panic and does not touch `errno` (bounded table lookups, plain
/// loads and stores in the thread's shard, one `rdtsc`): it needs neither a panic
/// guard nor an `errno` save. Everything else (reserving in a bucket, waiting, settling a byte
/// count, allocating a path, a thread's first call) is out of line and [`shielded`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tracked_with<R: Returned>(
    counters: stats::Counters,
    op: Op,
    target: Target,
    effect: Effect,
    resolved: Resolved,
    requested: u64,
    account: impl FnOnce(&R) -> Account,
    real: impl FnOnce() -> R,
) -> R {
    // A copy is a read of its source and a write of its destination; only a copy has
    // a source (a constant for every other hook).
    let (main, main_op, source, source_op) = match target {
        Target::Copy { .. } => (
            resolved.main_mount(),
            Op::Write,
            resolved.source_mount(),
            Op::Read,
        ),
        _ => (resolved.main_mount(), op, None, op),
    };
    if main.is_none() && source.is_none() {
        // A directory above a mountpoint: counted as passing through; a new descriptor
        // remembers its path.
        counters.passthrough(op);
        before(effect);
        let result = real();
        if !matches!(
            effect,
            Effect::None
                | Effect::Close(_)
                | Effect::CloseRange(..)
                | Effect::CloseStream(_)
                | Effect::CloseDirStream(_)
        ) {
            after_cold(effect, target, resolved.main(), &result);
        }
        return result;
    }
    let main_admission = match main {
        Some(mount) => channels::admit(counters, mount, main_op, requested),
        None => channels::Admission::NONE,
    };
    let source_admission = match source {
        Some(mount) => channels::admit(counters, mount, source_op, requested),
        None => channels::Admission::NONE,
    };
    match effect {
        // The descriptor closing is the call's managed target.
        Effect::Close(fd) => fdtable::forget_placed(fd),
        _ => before(effect),
    }

    let result = match effect {
        Effect::Create { flags, mode } => {
            match crate::placement::create(resolved.main(), target, flags, mode) {
                Some(fd) => R::from_descriptor(fd).unwrap_or_else(real),
                None => real(),
            }
        }
        _ => real(),
    };

    let outcome = account(&result);
    if main.is_some() {
        channels::settle(counters, main_op, main_admission, requested, outcome.bytes);
        counters.managed(main_op, outcome.failed, outcome.bytes);
    }
    if source.is_some() {
        channels::settle(
            counters,
            source_op,
            source_admission,
            requested,
            outcome.bytes,
        );
        counters.managed(source_op, outcome.failed, outcome.bytes);
    }
    after_managed(effect, target, resolved.main(), &result);
    result
}

/// [`after`] on the managed path: a new descriptor of a managed file that keeps no
/// path is one store in the fd table (no allocation, `errno` untouched); the rest is
/// out of line and [`shielded`].
#[inline(always)]
fn after_managed<R: Returned>(effect: Effect, target: Target, place: Place, result: &R) {
    match effect {
        Effect::None
        | Effect::Close(_)
        | Effect::CloseRange(..)
        | Effect::CloseStream(_)
        | Effect::CloseDirStream(_) => {}
        Effect::NewFd { flags } | Effect::Create { flags, .. }
            if flags & (libc::O_DIRECTORY | libc::O_PATH) == 0
                && matches!(place, Place::Managed(_)) =>
        {
            if let Some(fd) = result.descriptor() {
                fdtable::record_place(fd, place);
            }
        }
        Effect::NewStream if matches!(place, Place::Managed(_)) => {
            if let Some(fd) = result.descriptor() {
                fdtable::record_place(fd, place);
            }
        }
        _ => after_cold(effect, target, place, result),
    }
}

#[cold]
#[inline(never)]
fn after_cold<R: Returned>(effect: Effect, target: Target, place: Place, result: &R) {
    shielded(|| after(effect, target, place, result));
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

/// Admits a request without calling anything (`lio_listio` entries), counting it as
/// managed; unmanaged requests are not counted here.
///
/// # Safety
/// As for [`intercept`].
pub unsafe fn admit_only(op: Op, target: Target, bytes: u64) {
    let counters = stats::local();
    if !crate::is_active() || in_stage_io(counters) {
        return;
    }
    let saved = errno::get();
    guarded(|| {
        if let Some(mount) = resolve(target).main_mount() {
            channels::admit(counters, mount, op, bytes);
            counters.managed(op, false, bytes);
        }
    });
    errno::set(saved);
}

#[inline(always)]
fn resolve(target: Target) -> Resolved {
    let single = |main| Resolved::new(main, Place::Unrelated);
    // SAFETY: (all arms) the pointers are the application's arguments to this call
    // (null, or paths and streams valid for the duration of the hook): every `Target`
    // built with pointers comes from a hook's table line.
    unsafe {
        match target {
            Target::None => UNRELATED,
            Target::Path(path) => single(place_of_path(libc::AT_FDCWD, path)),
            Target::At(dirfd, path) => single(place_of_path(dirfd, path)),
            Target::Fd(fd) => single(fdtable::place(fd)),
            Target::Stream(stream) => single(fdtable::place(stream_fd(stream))),
            Target::Dir(dir) => single(fdtable::place(dir_fd(dir))),
            Target::Paths(a, b) => single(either(place_of_path(libc::AT_FDCWD, a), || {
                place_of_path(libc::AT_FDCWD, b)
            })),
            Target::AtPaths(dir_a, a, dir_b, b) => {
                single(either(place_of_path(dir_a, a), || place_of_path(dir_b, b)))
            }
            Target::Copy { from, to } => Resolved::new(fdtable::place(to), fdtable::place(from)),
        }
    }
}

fn either(first: Place, second: impl FnOnce() -> Place) -> Place {
    match first {
        Place::Managed(_) => first,
        _ => second(),
    }
}

/// A stream's descriptor, -1 for null.
///
/// # Safety
/// `stream` is null or an open stream (the application's argument).
unsafe fn stream_fd(stream: *mut FILE) -> c_int {
    if stream.is_null() {
        -1
    } else {
        // SAFETY: the application's non-null, open stream, valid for the duration of
        // the hook; `fileno_unlocked` only reads it.
        unsafe { fileno_unlocked(stream) }
    }
}

/// A directory stream's descriptor, -1 for null.
///
/// # Safety
/// `dir` is null or an open directory stream (the application's argument).
unsafe fn dir_fd(dir: *mut DIR) -> c_int {
    if dir.is_null() {
        -1
    } else {
        // SAFETY: the application's non-null, open directory stream, valid for the
        // duration of the hook; `dirfd` only reads it.
        unsafe { libc::dirfd(dir) }
    }
}

/// Classifies `path` relative to `dirfd` (`AT_FDCWD` = the current directory). The
/// common cases (clean absolute path; clean relative path from an unrelated or managed
/// base) touch no buffer; the rest is resolved in full, out of line.
///
/// # Safety
/// `path` is null or the application's NUL-terminated path, valid for the duration of
/// the call.
#[inline(always)]
unsafe fn place_of_path(dirfd: c_int, path: *const c_char) -> Place {
    if path.is_null() {
        return base_place(dirfd);
    }
    let mounts = crate::mounts();
    // SAFETY: the application's non-null path argument, NUL-terminated (scan's
    // contract), valid for the duration of the hook.
    if let Some(len) = unsafe { paths::scan(path.cast()) } {
        // SAFETY: `len` (not 0) is the path's length before its NUL, so its first byte
        // and its `len` bytes are the application's, valid for the duration of the hook.
        if len != 0 && unsafe { *path } == b'/' as c_char {
            // SAFETY: as just above: `len` readable bytes of the application's path.
            let bytes = unsafe { std::slice::from_raw_parts(path.cast::<u8>(), len) };
            return mounts.place_of(bytes);
        }
    }
    // SAFETY: the application's non-null, NUL-terminated path argument, valid (and not
    // written by us) for the duration of the hook, which outlives `bytes`.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    let Some(&first) = bytes.first() else {
        return base_place(dirfd);
    };
    if paths::is_clean(bytes) {
        if first == b'/' {
            return mounts.place_of(bytes);
        }
        match base_place(dirfd) {
            Place::Unrelated => return Place::Unrelated,
            Place::Managed(m) if !mounts.has_nested() => return Place::Managed(m),
            _ => {}
        }
    }
    guarded(|| place_of_unclean_path(dirfd, bytes)).unwrap_or(Place::Unrelated)
}

#[inline(never)]
fn place_of_unclean_path(dirfd: c_int, bytes: &[u8]) -> Place {
    let mut buf = PathBuffer::new();
    if full_path(dirfd, bytes, &mut buf) {
        crate::mounts().place_of(buf.as_bytes())
    } else {
        Place::Unrelated
    }
}

#[inline(always)]
fn base_place(dirfd: c_int) -> Place {
    if dirfd == libc::AT_FDCWD {
        Place::decode(CWD_PLACE.load(Ordering::Relaxed))
    } else {
        fdtable::place(dirfd)
    }
}

/// Writes the normalised absolute form of `path` (relative to `dirfd`) into `buf`.
fn full_path(dirfd: c_int, path: &[u8], buf: &mut PathBuffer) -> bool {
    if path.first() == Some(&b'/') {
        return buf.push_normalized(path);
    }
    let base_ok = if dirfd == libc::AT_FDCWD {
        CWD_PATH
            .with(|p| buf.push_normalized(p))
            .unwrap_or_else(|| current_dir_into(buf))
    } else {
        fdtable::with_path(dirfd, |p| buf.push_normalized(p))
            .unwrap_or_else(|| descriptor_path_into(dirfd, buf))
    };
    base_ok && buf.push_normalized(path)
}

/// The current directory, straight from the kernel (no hook involved).
fn current_dir_into(buf: &mut PathBuffer) -> bool {
    let mut raw = [0u8; PATH_CAPACITY];
    // SAFETY: valid buffer; the raw syscall bypasses every hook.
    let len = unsafe { libc::syscall(libc::SYS_getcwd, raw.as_mut_ptr(), raw.len()) };
    len > 1 && raw[0] == b'/' && buf.push_normalized(&raw[..len as usize - 1])
}

/// The path of an open descriptor from `/proc/self/fd` (no hook involved).
fn descriptor_path_into(fd: c_int, buf: &mut PathBuffer) -> bool {
    let link = fdtable::proc_self_fd(fd);
    let mut raw = [0u8; PATH_CAPACITY];
    // SAFETY: NUL-terminated link name and a valid buffer; raw syscall, no hook.
    let len = unsafe {
        libc::syscall(
            libc::SYS_readlinkat,
            libc::AT_FDCWD,
            link.as_ptr(),
            raw.as_mut_ptr(),
            raw.len(),
        )
    };
    len > 0 && raw[0] == b'/' && buf.push_normalized(&raw[..len as usize])
}

static CWD_PLACE: AtomicU16 = AtomicU16::new(0);
static CWD_PATH: PathSlot = PathSlot::empty();

/// Re-reads the current directory (at start-up, after `chdir`/`fchdir`). Its path is
/// kept only when it matters (the directory is, or is above, a mountpoint).
pub fn refresh_current_dir() {
    let mut buf = PathBuffer::new();
    let place = if current_dir_into(&mut buf) {
        crate::mounts().place_of(buf.as_bytes())
    } else {
        Place::Unrelated
    };
    let path = (place != Place::Unrelated)
        .then(|| CString::new(buf.as_bytes()).ok())
        .flatten();
    CWD_PATH.set(path);
    CWD_PLACE.store(place.encode(), Ordering::Relaxed);
}

/// Effects that must happen before the call: forget descriptors about to be closed
/// (afterwards, another thread may already have reused the number).
#[inline(always)]
fn before(effect: Effect) {
    // SAFETY: stream pointers are the application's, about to be closed by libc.
    unsafe {
        match effect {
            Effect::Close(fd) => fdtable::forget(fd),
            Effect::CloseRange(first, last, flags)
                if flags as c_uint & libc::CLOSE_RANGE_CLOEXEC == 0 =>
            {
                fdtable::forget_range(first, last)
            }
            Effect::CloseStream(stream) | Effect::Reopen(stream) if !stream.is_null() => {
                fdtable::forget(fileno_unlocked(stream))
            }
            Effect::CloseDirStream(dir) => fdtable::forget(dir_fd(dir)),
            _ => {}
        }
    }
}

/// [`after`] for a call whose target is unrelated to every mountpoint: new descriptors
/// only clear stale entries (no allocation, `errno` untouched).
#[inline(always)]
pub fn after_unrelated<R: Returned>(effect: Effect, result: &R) {
    match effect {
        Effect::NewFd { .. }
        | Effect::Create { .. }
        | Effect::NewStream
        | Effect::NewDirStream
        | Effect::Reopen(_) => {
            if let Some(fd) = result.descriptor() {
                fdtable::forget(fd);
            }
        }
        Effect::None
        | Effect::Close(_)
        | Effect::CloseRange(..)
        | Effect::CloseStream(_)
        | Effect::CloseDirStream(_) => {}
        Effect::Dup(_) | Effect::DupTo(..) | Effect::Fcntl(..) | Effect::Chdir => {
            let saved = errno::get();
            after(effect, Target::None, Place::Unrelated, result);
            errno::set(saved);
        }
    }
}

/// Effects that need the call's result: record new descriptors, follow `chdir`.
fn after<R: Returned>(effect: Effect, target: Target, place: Place, result: &R) {
    match effect {
        Effect::NewFd { flags } | Effect::Create { flags, .. } => {
            if let Some(fd) = result.descriptor() {
                let keeps_path = flags & (libc::O_DIRECTORY | libc::O_PATH) != 0;
                record(fd, place, target, keeps_path);
            }
        }
        Effect::NewStream | Effect::Reopen(_) => {
            if let Some(fd) = result.descriptor() {
                record(fd, place, target, false);
            }
        }
        Effect::NewDirStream => {
            if let Some(fd) = result.descriptor() {
                record(fd, place, target, true);
            }
        }
        Effect::Dup(old) => {
            if let Some(new) = result.descriptor() {
                fdtable::duplicate(old, new);
            }
        }
        Effect::DupTo(old, new) => {
            if result.descriptor() == Some(new) && old != new {
                fdtable::duplicate(old, new);
            }
        }
        Effect::Fcntl(fd, cmd) => {
            if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
                if let Some(new) = result.descriptor() {
                    fdtable::duplicate(fd, new);
                }
            }
        }
        Effect::Chdir => {
            if result.descriptor() == Some(0) {
                guarded(refresh_current_dir);
            }
        }
        Effect::None
        | Effect::Close(_)
        | Effect::CloseRange(..)
        | Effect::CloseStream(_)
        | Effect::CloseDirStream(_) => {}
    }
}

/// Records a new descriptor; directories (and anything above a mountpoint) keep their
/// normalised path so they can be the base of `*at` calls.
fn record(fd: c_int, place: Place, target: Target, is_directory: bool) {
    if place == Place::Unrelated || !(is_directory || place == Place::Ancestor) {
        fdtable::record(fd, place, None);
        return;
    }
    let (dirfd, path) = match target {
        Target::Path(p) => (libc::AT_FDCWD, p),
        Target::At(d, p) => (d, p),
        _ => {
            fdtable::record(fd, place, None);
            return;
        }
    };
    let mut buf = PathBuffer::new();
    let bytes = if path.is_null() {
        &b""[..]
    } else {
        // SAFETY: the application's non-null, NUL-terminated path argument, still
        // valid during the hook (which outlives `bytes`).
        unsafe { CStr::from_ptr(path) }.to_bytes()
    };
    let known = !bytes.is_empty() && full_path(dirfd, bytes, &mut buf);
    fdtable::record(fd, place, known.then(|| buf.as_bytes()));
}

/// Account builders used by the hook table.
pub mod account {
    use super::Account;
    use libc::{c_char, c_int, c_void};

    /// An `int` status: negative = failure.
    pub fn status(result: &c_int) -> Account {
        Account {
            failed: *result < 0,
            bytes: 0,
        }
    }

    /// A POSIX error-number return (`posix_fallocate`): non-zero = failure.
    pub fn error_number(result: &c_int) -> Account {
        Account {
            failed: *result != 0,
            bytes: 0,
        }
    }

    /// A byte count (`read`, `write`, …): negative = failure.
    pub fn transfer(result: &isize) -> Account {
        Account {
            failed: *result < 0,
            bytes: (*result).max(0) as u64,
        }
    }

    /// A handle return (`fopen`, `opendir`, `mkdtemp`): NULL = failure.
    pub fn handle<T>(result: &*mut T) -> Account {
        Account {
            failed: result.is_null(),
            bytes: 0,
        }
    }

    /// A listing step (`readdir`): NULL may just mean the end.
    pub fn listing<T>(_: &*mut T) -> Account {
        Account::default()
    }

    /// Nothing to report (`sync`).
    pub fn nothing(_: &()) -> Account {
        Account::default()
    }

    /// `fread`/`fwrite`: items of `size` bytes.
    pub fn items(size: usize) -> impl FnOnce(&usize) -> Account {
        move |items| Account {
            failed: false,
            bytes: (*items as u64).saturating_mul(size as u64),
        }
    }

    /// `fgets`: the line read, if any.
    pub fn line(result: &*mut c_char) -> Account {
        Account {
            failed: false,
            bytes: if result.is_null() {
                0
            } else {
                // SAFETY: `fgets` returns NULL or the application's buffer, which it
                // has just NUL-terminated.
                unsafe { libc::strlen(*result) as u64 }
            },
        }
    }

    /// `fgetc`: one byte unless EOF.
    pub fn char_in(result: &c_int) -> Account {
        Account {
            failed: false,
            bytes: (*result != libc::EOF) as u64,
        }
    }

    /// `fputc`/`fputs`: EOF = failure, else `len` bytes.
    pub fn put(len: usize) -> impl FnOnce(&c_int) -> Account {
        move |result| Account {
            failed: *result == libc::EOF,
            bytes: if *result == libc::EOF { 0 } else { len as u64 },
        }
    }

    /// `readahead`: `len` bytes asked of the file system unless it failed.
    pub fn prefetched(len: usize) -> impl FnOnce(&isize) -> Account {
        move |result| Account {
            failed: *result < 0,
            bytes: if *result < 0 { 0 } else { len as u64 },
        }
    }

    /// A submitted request of `len` bytes (aio): negative = failure.
    pub fn submitted(len: usize) -> impl FnOnce(&c_int) -> Account {
        move |result| Account {
            failed: *result < 0,
            bytes: if *result < 0 { 0 } else { len as u64 },
        }
    }

    /// `mmap`: `MAP_FAILED` = failure, else `len` bytes mapped.
    pub fn mapped(len: usize) -> impl FnOnce(&*mut c_void) -> Account {
        move |result| Account {
            failed: *result == libc::MAP_FAILED,
            bytes: if *result == libc::MAP_FAILED {
                0
            } else {
                len as u64
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every managed call that needs at most one store in the descriptor table stays on
    /// the inline common path; a creating `open` (placement made it an `Effect::Create`)
    /// once fell out of it, +60 instructions per managed open.
    #[test]
    fn managed_opens_and_creations_are_common() {
        let managed = Resolved::new(Place::Managed(0), Place::Unrelated).0;
        let common = |effect| is_common(managed, effect);
        assert!(common(Effect::NewFd {
            flags: libc::O_RDONLY
        }));
        for flags in [
            libc::O_RDONLY,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        ] {
            assert!(
                common(Effect::Create { flags, mode: 0o644 }),
                "flags {flags:#o}"
            );
        }
        assert!(common(Effect::Close(3)));
        // A directory's descriptor keeps its path: not common.
        assert!(!common(Effect::Create {
            flags: libc::O_DIRECTORY,
            mode: 0
        }));
        assert!(!is_common(Resolved::UNKNOWN, Effect::Close(3)));
        assert!(!is_common(UNRELATED.0, Effect::Close(3)));
    }
}
