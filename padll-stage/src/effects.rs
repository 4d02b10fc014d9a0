//! What calls do to the descriptor table and the current directory ([`Effect`]):
//! descriptors about to be closed are forgotten before the call; after it, new
//! descriptors are recorded (with their place, and their path when they can be the base
//! of `*at` calls), duplicates take their original's place and `chdir` is followed.

use crate::call::{dir_fd, stream_fd, Effect, Returned, Target};
use crate::errno;
use crate::fdtable;
use crate::guard::{guarded, shielded};
use crate::paths::{PathBuffer, Place};
use crate::placed_files;
use crate::resolve::{full_path, refresh_current_dir};
use libc::{c_int, c_uint};
use std::ffi::CStr;

/// [`after`] on the managed path: a new descriptor of a managed file that keeps no
/// path is one store in the fd table (no allocation, `errno` untouched); the rest is
/// out of line and [`shielded`].
#[inline(always)]
pub(crate) fn after_managed<R: Returned>(effect: Effect, target: Target, place: Place, result: &R) {
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
pub(crate) fn after_cold<R: Returned>(effect: Effect, target: Target, place: Place, result: &R) {
    shielded(|| after(effect, target, place, result));
}

/// Effects that must happen before the call: forget descriptors about to be closed
/// (afterwards, another thread may already have reused the number).
#[inline(always)]
pub(crate) fn before(effect: Effect) {
    // SAFETY: stream pointers are the application's, about to be closed by libc.
    unsafe {
        match effect {
            Effect::Close(fd) => fdtable::forget(fd),
            Effect::CloseRange(first, last, flags)
                if closes_for_every_thread(first, last, flags) =>
            {
                placed_files::closing_range(first, last);
                fdtable::forget_range(first, last)
            }
            Effect::CloseStream(stream) | Effect::Reopen(stream) if !stream.is_null() => {
                let fd = stream_fd(stream);
                placed_files::closing(fd);
                fdtable::forget(fd)
            }
            Effect::DupTo(old, new) if old != new => placed_files::closing(new),
            Effect::CloseDirStream(dir) => fdtable::forget(dir_fd(dir)),
            _ => {}
        }
    }
}

/// Whether `close_range(first, last, flags)` closes the descriptors for every thread
/// of the process. Not when the kernel refuses it (`first > last`, a flag it does not
/// know), not with `CLOSE_RANGE_CLOEXEC` (which only marks them), and with
/// `CLOSE_RANGE_UNSHARE` only in a process of one thread: it closes them in a copy of
/// the table that the calling thread alone then uses, and other threads keep them open.
/// Nor when the kernel has no `close_range` (before Linux 5.9, e.g. RHEL 8's 4.18) or a
/// seccomp filter refuses it: the call fails with `ENOSYS` (or `EPERM`) and closes
/// nothing, and the program falls back to closing one by one, or keeps them open.
fn closes_for_every_thread(first: c_uint, last: c_uint, flags: c_int) -> bool {
    first <= last
        && match flags as c_uint {
            0 => true,
            libc::CLOSE_RANGE_UNSHARE => crate::guard::shielded(single_threaded).unwrap_or(false),
            _ => false,
        }
        && crate::guard::shielded(kernel_closes_ranges).unwrap_or(false)
}

/// Whether this process may call `close_range`: asked of the kernel each time (a
/// seccomp filter may come later; the calls are rare) with a range it refuses as
/// `EINVAL` when it has the call, a raw system call no hook sees.
fn kernel_closes_ranges() -> bool {
    // SAFETY: `close_range(1, 0, 0)` closes nothing (first > last); `errno` is kept by
    // our caller's shield.
    let refused = unsafe { libc::syscall(libc::SYS_close_range, 1, 0, 0) };
    refused == -1 && crate::errno::get() == libc::EINVAL
}

/// Whether the process has one thread: the 20th field of `/proc/self/stat`, read with
/// raw system calls (no hook sees them; nothing is allocated).
fn single_threaded() -> bool {
    let mut text = [0u8; 1024];
    // SAFETY: a NUL-terminated path; raw system calls on a descriptor made here and a
    // buffer of the length given.
    let read = unsafe {
        let fd = libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/proc/self/stat".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return false;
        }
        let read = libc::syscall(libc::SYS_read, fd, text.as_mut_ptr(), text.len());
        libc::syscall(libc::SYS_close, fd);
        read
    };
    let Ok(length) = usize::try_from(read) else {
        return false;
    };
    // The fields after the command's closing parenthesis start at the 3rd.
    let Some(end_of_command) = text[..length].iter().rposition(|b| *b == b')') else {
        return false;
    };
    text[end_of_command + 1..length]
        .split(|b| *b == b' ')
        .filter(|field| !field.is_empty())
        .nth(17)
        == Some(b"1")
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
        | Effect::Reopen(_) => fdtable::forget(result.descriptor_or_negative()),
        Effect::NewFds(fds) => forget_pair(fds, result),
        Effect::Receive(header) => received(header, 0, result.messages()),
        Effect::ReceiveMany(headers) => received(
            headers.cast(),
            std::mem::size_of::<libc::mmsghdr>(),
            result.messages(),
        ),
        Effect::Adopt => {
            let fd = result.descriptor_or_negative();
            if fd >= 0 {
                shielded(|| adopt(fd));
            }
        }
        Effect::None
        | Effect::Close(_)
        | Effect::CloseRange(..)
        | Effect::CloseStream(_)
        | Effect::CloseDirStream(_) => {}
        Effect::Dup(_)
        | Effect::DupTo(..)
        | Effect::Fcntl(..)
        | Effect::Chdir
        | Effect::Daemon { .. } => {
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
                duplicate(old, new);
            }
        }
        Effect::DupTo(old, new) => {
            if result.descriptor() == Some(new) && old != new {
                duplicate(old, new);
            }
        }
        Effect::Fcntl(fd, cmd) => {
            if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
                if let Some(new) = result.descriptor() {
                    duplicate(fd, new);
                }
            }
        }
        Effect::Chdir => {
            if result.descriptor() == Some(0) {
                guarded(refresh_current_dir);
            }
        }
        Effect::Daemon { keeps_descriptors } => {
            // Even a failed `daemon` may have changed directory before it failed.
            guarded(refresh_current_dir);
            if result.descriptor() == Some(0) && !keeps_descriptors {
                for fd in 0..=2 {
                    fdtable::forget(fd);
                }
            }
        }
        Effect::NewFds(fds) => forget_pair(fds, result),
        // Descriptors from elsewhere are of no mountpoint's call.
        // Calls without a target: `after_unrelated` handles them (calling it here would
        // make the two recursive, and no hook could inline it any more).
        Effect::Receive(_) | Effect::ReceiveMany(_) | Effect::Adopt => {}
        Effect::None
        | Effect::Close(_)
        | Effect::CloseRange(..)
        | Effect::CloseStream(_)
        | Effect::CloseDirStream(_) => {}
    }
}

/// A pair of new descriptors (`pipe`, `socketpair`: 0 returned) is no file of a
/// mountpoint, whatever their numbers were before a close no hook saw.
fn forget_pair<R: Returned>(fds: *mut c_int, result: &R) {
    if result.descriptor() == Some(0) && !fds.is_null() {
        // SAFETY: the application's array of two descriptors, which the real call
        // just filled (it returned 0).
        let (a, b) = unsafe { (*fds, *fds.add(1)) };
        fdtable::forget(a);
        fdtable::forget(b);
    }
}

/// The descriptors `count` received message headers from `first` (`stride` bytes apart)
/// carry, recorded. Only messages with control data can carry any: one load for the
/// rest (a socket's hot path in MPI programs).
#[inline(always)]
fn received(first: *mut libc::msghdr, stride: usize, count: usize) {
    if count > 0 && !crate::call::unreadable(first) {
        // SAFETY: the application's header, just filled by the real call.
        if unsafe { (*first).msg_controllen } > 0 || count > 1 {
            shielded(|| adopt_received(first, stride, count));
        }
    }
}

/// Records every descriptor the first `count` message headers from `first` (`stride`
/// bytes apart) received in `SCM_RIGHTS` control messages, by what each is open on.
fn adopt_received(first: *mut libc::msghdr, stride: usize, count: usize) {
    for i in 0..count {
        let header = first
            .cast::<u8>()
            .wrapping_add(i * stride)
            .cast::<libc::msghdr>();
        // SAFETY: the application's headers, the first `count` filled by the real call,
        // their control buffers of the lengths the kernel wrote back; the control
        // messages are walked with libc's own macros, within those lengths.
        unsafe {
            if (*header).msg_controllen == 0 || crate::call::unreadable((*header).msg_control) {
                continue;
            }
            let mut control = libc::CMSG_FIRSTHDR(header);
            while !control.is_null() {
                if (*control).cmsg_level == libc::SOL_SOCKET
                    && (*control).cmsg_type == libc::SCM_RIGHTS
                {
                    let data = libc::CMSG_DATA(control).cast::<c_int>();
                    let bytes = (*control).cmsg_len as usize
                        - (data as usize - control as usize).min((*control).cmsg_len as usize);
                    for k in 0..bytes / std::mem::size_of::<c_int>() {
                        adopt(data.add(k).read_unaligned());
                    }
                }
                control = libc::CMSG_NXTHDR(header, control);
            }
        }
    }
}

/// Records descriptor `fd`, which came from elsewhere (another process, or before the
/// stage started), by the path the kernel names for it (`/proc/self/fd/N`), or forgets a
/// stale entry of its number. Raw system calls and the stack only (no hook sees them,
/// nothing is allocated); `errno` may change (callers shield it).
pub(crate) fn adopt(fd: c_int) {
    if fd < 0 {
        return;
    }
    // `/proc/self/fd/` and the number's decimal digits (at most 10), NUL-terminated.
    const PREFIX: &[u8] = b"/proc/self/fd/";
    let mut link = [0u8; PREFIX.len() + 11];
    link[..PREFIX.len()].copy_from_slice(PREFIX);
    let digits = fd.checked_ilog10().unwrap_or(0) as usize + 1;
    let mut rest = fd as u32;
    for slot in link[PREFIX.len()..PREFIX.len() + digits].iter_mut().rev() {
        *slot = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    let mut target = [0u8; libc::PATH_MAX as usize];
    // SAFETY: a NUL-terminated name and a buffer of the length given.
    let length = unsafe {
        libc::syscall(
            libc::SYS_readlinkat,
            libc::AT_FDCWD,
            link.as_ptr(),
            target.as_mut_ptr(),
            target.len(),
        )
    };
    if let Ok(length @ 1..) = usize::try_from(length) {
        let mut normalized = PathBuffer::new();
        if length < target.len()
            && target[0] == b'/'
            && normalized.push_normalized(&target[..length])
        {
            let place = crate::mounts().place_of(normalized.as_bytes());
            if place != Place::Unrelated {
                fdtable::record(fd, place, Some(normalized.as_bytes()));
                return;
            }
        }
    }
    fdtable::forget(fd);
}

/// `new` is a duplicate of `old`: same place, same placed file.
fn duplicate(old: c_int, new: c_int) {
    fdtable::duplicate(old, new);
    placed_files::duplicated(old, new);
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
