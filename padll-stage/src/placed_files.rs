//! The final size of each file this process created placed ([`crate::placement`]), for
//! the control plane's prediction of the next files' sizes (paper 004 §III-B). The
//! descriptors of such a file are tracked: the one its creation returned and their
//! duplicates (`dup`, `dup2`, `dup3`, `fcntl(F_DUPFD…)`). When the last of them closes
//! (`close`, `close_range`, `fclose` of a stream on it, or `dup2`/`dup3` over it), the
//! file's size (`fstat`, a raw system call, just before the close) goes to the
//! controller as a `file_size` message.
//!
//! "Last close" is this process's: a `fork`ed child forgets the table (its closes
//! report nothing; the parent's report when it closes its own copies); files still open
//! when the process exits report their size from the stage's destructor (not after
//! `_exit`, which runs none, nor at `exec`); descriptors passed to other processes are
//! not followed; data still in a stdio buffer at `fclose` (a stream `fdopen`ed on a
//! placed descriptor) is not counted (the size is taken before the call); and at most
//! [`MAX_DESCRIPTORS`] descriptors of placed files are tracked at once (a file created
//! beyond them reports nothing). A `dup2`/`dup3` over a tracked descriptor counts as
//! its close even if the call then fails. Every other close costs one atomic load and a
//! branch while no placed file is open ([`OPEN`] is zero); the work is out of line and
//! [`shielded`] (no panic out, `errno` kept), and never changes the close's result.

use crate::guard::shielded;
use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

/// Descriptors of placed files tracked at once.
pub const MAX_DESCRIPTORS: usize = 64;

/// Tracked descriptors (entries in use).
static OPEN: AtomicUsize = AtomicUsize::new(0);
/// Each entry's descriptor, or `FREE`.
static FDS: [AtomicI32; MAX_DESCRIPTORS] = [const { AtomicI32::new(FREE) }; MAX_DESCRIPTORS];
/// Each entry's file (`file << 16 | mountpoint index`): entries of one file share it.
static FILES: [AtomicU64; MAX_DESCRIPTORS] = [const { AtomicU64::new(0) }; MAX_DESCRIPTORS];
/// Numbers files.
static NEXT_FILE: AtomicU64 = AtomicU64::new(1);
/// Held while the table changes (a few loads and stores, no call: a spin lock).
static BUSY: AtomicBool = AtomicBool::new(false);

const FREE: c_int = -1;

/// Runs `change` on the table alone.
fn locked<R>(change: impl FnOnce() -> R) -> R {
    while BUSY
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    let result = change();
    BUSY.store(false, Ordering::Release);
    result
}

/// The entry of descriptor `fd`.
fn entry_of(fd: c_int) -> Option<usize> {
    FDS.iter().position(|e| e.load(Ordering::Relaxed) == fd)
}

/// Tracks `file` (a [`FILES`] value) under descriptor `fd`, if the table has room.
fn track(fd: c_int, file: u64) {
    if let Some(free) = entry_of(FREE) {
        FILES[free].store(file, Ordering::Relaxed);
        FDS[free].store(fd, Ordering::Relaxed);
        OPEN.fetch_add(1, Ordering::Relaxed);
    }
}

/// `fd`, just returned by a placed creation on mountpoint `mount`, starts a file.
pub(crate) fn created(fd: c_int, mount: u16) {
    let file = NEXT_FILE.fetch_add(1, Ordering::Relaxed) << 16 | u64::from(mount);
    locked(|| track(fd, file));
}

/// `old` was duplicated as `new` (the call succeeded).
#[inline(always)]
pub(crate) fn duplicated(old: c_int, new: c_int) {
    if OPEN.load(Ordering::Relaxed) != 0 {
        shielded(|| duplicated_cold(old, new));
    }
}

#[cold]
#[inline(never)]
fn duplicated_cold(old: c_int, new: c_int) {
    locked(|| {
        if let Some(at) = entry_of(old) {
            track(new, FILES[at].load(Ordering::Relaxed));
        }
    });
}

/// `fd` is about to be closed.
#[inline(always)]
pub(crate) fn closing(fd: c_int) {
    if OPEN.load(Ordering::Relaxed) != 0 {
        shielded(|| closing_cold(fd));
    }
}

/// Every descriptor in `first..=last` is about to be closed (`close_range`).
#[inline(always)]
pub(crate) fn closing_range(first: u32, last: u32) {
    if OPEN.load(Ordering::Relaxed) != 0 {
        shielded(|| {
            for entry in &FDS {
                let fd = entry.load(Ordering::Relaxed);
                if fd != FREE && (first..=last).contains(&(fd as u32)) {
                    closing_cold(fd);
                }
            }
        });
    }
}

/// At exit: reports the size of every file still open, once each.
pub(crate) fn report_open() {
    let open: Vec<(c_int, u64)> = locked(|| {
        let mut open: Vec<(c_int, u64)> = Vec::new();
        for (entry, file) in FDS.iter().zip(&FILES) {
            let (fd, file) = (
                entry.swap(FREE, Ordering::Relaxed),
                file.load(Ordering::Relaxed),
            );
            if fd != FREE && !open.iter().any(|&(_, f)| f == file) {
                open.push((fd, file));
            }
        }
        OPEN.store(0, Ordering::Relaxed);
        open
    });
    for (fd, file) in open {
        report(fd, file);
    }
}

#[cold]
#[inline(never)]
fn closing_cold(fd: c_int) {
    // A negative number (`dup2(fd, -1)`, a stream without a descriptor) names no entry:
    // it must not match a free one.
    if fd < 0 {
        return;
    }
    let last = locked(|| {
        let at = entry_of(fd)?;
        let file = FILES[at].load(Ordering::Relaxed);
        FDS[at].store(FREE, Ordering::Relaxed);
        OPEN.fetch_sub(1, Ordering::Relaxed);
        let others = FDS
            .iter()
            .zip(&FILES)
            .any(|(f, of)| f.load(Ordering::Relaxed) != FREE && of.load(Ordering::Relaxed) == file);
        (!others).then_some(file)
    });
    if let Some(file) = last {
        report(fd, file);
    }
}

/// Sends the size of `file`, open as `fd`, to the controller.
fn report(fd: c_int, file: u64) {
    // SAFETY: a zeroed `stat` is valid plain data; `fd` is still open (before its
    // close, or at exit); a raw system call, no hook.
    let (found, st) = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::syscall(libc::SYS_fstat, fd, &mut st), st)
    };
    if found == 0 {
        let mount = (file & 0xffff) as usize;
        if let Some(name) = crate::mountpoints().get(mount) {
            crate::control::report_file_size(name, st.st_size.max(0) as u64);
        }
    }
}

/// In a `fork`ed child: the parent's files are the parent's to report.
pub(crate) fn forget_all() {
    for entry in &FDS {
        entry.store(FREE, Ordering::Relaxed);
    }
    OPEN.store(0, Ordering::Relaxed);
    BUSY.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Closing a negative number (a failing `dup2(fd, -1)`, `fclose` of a stream without
    /// a descriptor) leaves the placed file tracked until its own close.
    #[test]
    fn a_negative_descriptor_closes_nothing() {
        created(900, 0);
        closing(-1);
        assert_eq!(OPEN.load(Ordering::Relaxed), 1);
        assert!(entry_of(900).is_some());
        duplicated(900, 901);
        closing(900);
        assert_eq!(OPEN.load(Ordering::Relaxed), 1);
        closing(901);
        assert_eq!(OPEN.load(Ordering::Relaxed), 0);
        assert!(entry_of(900).is_none() && entry_of(901).is_none());
    }
}
