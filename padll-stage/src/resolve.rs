//! Where a call's target lies ([`Resolved`]): a descriptor's place from the fd table,
//! a path's by lexical resolution against the mount table (a relative path from the
//! current directory, followed here, or from a directory descriptor).

use crate::call::{dir_fd, stream_fd, unreadable, Target};
use crate::channels::MAX_MOUNTS;
use crate::fdtable::{self, PathSlot};
use crate::guard::shielded;
use crate::path_pool::PooledPath;
use crate::paths::{self, MountTable, PathBuffer, Place, PATH_CAPACITY};
use libc::{c_char, c_int};
use std::ffi::CStr;
use std::sync::atomic::{AtomicU16, Ordering};

/// Where a call's target lies: the main place's [`Place::encode`] in the low half of
/// one word, the source's (of a copy) in the high half. Kept encoded: the managed path
/// only needs "unrelated?" (the word is 0) and the mountpoint indices (code − 2).
#[derive(Clone, Copy)]
pub struct Resolved(pub(crate) u32);

/// A target unrelated to every mountpoint.
pub(crate) const UNRELATED: Resolved = Resolved(0);

impl Resolved {
    /// The word for "not resolved yet": [`Place::Ancestor`] in both halves, which
    /// needs the full resolution anyway (only a copy between two directories above
    /// mountpoints resolves so), so that the managed path's one test for a mountpoint
    /// in either half also tells that the target is known.
    pub const UNKNOWN: u32 = 0x0001_0001;

    #[inline(always)]
    pub(crate) fn new(main: Place, source: Place) -> Resolved {
        Resolved(main.encode() as u32 | (source.encode() as u32) << 16)
    }

    #[inline(always)]
    pub(crate) fn main(self) -> Place {
        Place::decode(self.0 as u16)
    }

    /// The main place's mountpoint index, if managed.
    #[inline(always)]
    pub(crate) fn main_mount(self) -> Option<u16> {
        mount_of(self.0 as u16)
    }

    /// The source's mountpoint index, if managed.
    #[inline(always)]
    pub(crate) fn source_mount(self) -> Option<u16> {
        mount_of((self.0 >> 16) as u16)
    }

    #[inline(always)]
    pub(crate) fn is_unrelated(self) -> bool {
        self.0 == 0
    }
}

/// The mountpoint index of an encoded place, if managed: one compare that also tells
/// the compiler the index is below [`MAX_MOUNTS`] (no table of more is ever published:
/// `channels::set_mounts`), so that the managed path's lookups by it need no bounds
/// check of their own. The codes of unrelated and ancestor places wrap far above it.
#[inline(always)]
fn mount_of(code: u16) -> Option<u16> {
    let mount = code.wrapping_sub(2);
    (usize::from(mount) < MAX_MOUNTS).then_some(mount)
}

/// Where `target` lies, when that is cheap to find (for the hooks' fast path,
/// `intercept::dispatch`), encoded as in a [`Resolved`] word (0 = unrelated); `None`
/// otherwise. Descriptor places are passed on as the fd table stores them, never
/// decoded here.
///
/// # Safety
/// `target`'s pointers are [`unreadable`] or the application's (NUL-terminated paths, open
/// streams and directory streams), valid for the duration of the call.
#[inline(always)]
pub(crate) unsafe fn quick_resolve(mounts: &MountTable, target: Target) -> Option<u32> {
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
/// `path` is [`unreadable`] or the application's NUL-terminated path, valid for the duration of
/// the call.
#[inline(always)]
unsafe fn quick_path(mounts: &MountTable, dirfd: c_int, path: *const c_char) -> Option<Place> {
    if unreadable(path) {
        // Null names the directory descriptor itself (resolved in full); any other
        // such pointer is the kernel's to refuse.
        return (!path.is_null()).then_some(Place::Unrelated);
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

#[inline(always)]
pub(crate) fn resolve(target: Target) -> Resolved {
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

/// Classifies `path` relative to `dirfd` (`AT_FDCWD` = the current directory). The
/// common cases (clean absolute path; clean relative path from an unrelated or managed
/// base) touch no buffer; the rest is resolved in full, out of line.
///
/// # Safety
/// `path` is [`unreadable`] or the application's NUL-terminated path, valid for the duration of
/// the call.
#[inline(always)]
unsafe fn place_of_path(dirfd: c_int, path: *const c_char) -> Place {
    if path.is_null() {
        return base_place(dirfd);
    }
    if unreadable(path) {
        return Place::Unrelated;
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
    // Shielded: finding the current directory or a descriptor's path may fail in the
    // kernel (a deleted directory, a path too long), which sets `errno`.
    shielded(|| place_of_unclean_path(dirfd, bytes)).unwrap_or(Place::Unrelated)
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
pub(crate) fn full_path(dirfd: c_int, path: &[u8], buf: &mut PathBuffer) -> bool {
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
/// kept only when it matters (the directory is, or is above, a mountpoint), in the
/// path pool: `chdir` is async-signal-safe, so this calls neither `malloc` nor `free`.
pub fn refresh_current_dir() {
    let mut buf = PathBuffer::new();
    let place = if current_dir_into(&mut buf) {
        crate::mounts().place_of(buf.as_bytes())
    } else {
        Place::Unrelated
    };
    let path = (place != Place::Unrelated)
        .then(|| PooledPath::new(buf.as_bytes()))
        .flatten();
    CWD_PATH.set(path);
    CWD_PLACE.store(place.encode(), Ordering::Relaxed);
}
