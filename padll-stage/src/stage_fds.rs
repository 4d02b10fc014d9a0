//! The descriptors the stage keeps open across calls — the job segment's lock
//! ([`crate::shared`]) and the controller's socket ([`crate::control`]) — live in the
//! program's descriptor table, beside its own. The program does not know they are
//! ours: a batch script replaces one (`exec 4>log`), a daemon or launcher closes them
//! all (`closefrom(3)`) and opens its own files on the same numbers. So:
//!
//! - each is moved out of the program's way when opened ([`move_high`]:
//!   `F_DUPFD_CLOEXEC` from a floor near the top of the descriptor limit, see [`floor`]),
//!   where shells and programs that pick numbers themselves do not go;
//! - each carries the identity of what it was opened on ([`Identity`]: `st_dev` and
//!   `st_ino`, which a socket has too), and is never used, locked, closed or reopened
//!   before the stage has checked that its number still names that object
//!   ([`Identity::holds`]). A number that does not is the program's now: it is
//!   forgotten, never closed ([`Held`]'s drop, [`close_if_ours`]), and the stage
//!   degrades: it leaves the job's segment in place at exit, reopens it by its path to
//!   claim buckets, and reconnects to the controller on a fresh number.
//!
//! The checks are on the paths that already do system calls on these descriptors
//! (`fork`, exit, the control thread, reconnects), never on an intercepted call. Raw
//! system calls only, no allocation: they run in the `fork` child handler and in `_exit`.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Descriptor limits above this are not used for the floor: every descriptor number up
/// to the one we take costs a slot in the table of the process (and of each `fork`).
const FLOOR_BASE_MAX: u64 = 1024;
/// A floor lower than this is too close to the numbers programs choose themselves
/// (bash's `exec 3>`…`exec 9>`): under such a descriptor limit, descriptors stay where
/// they were opened (the identity checks still keep the program's safe).
const FLOOR_MIN: u64 = 10;

/// The lowest number the stage moves its descriptors to: seven eighths of the soft
/// descriptor limit, counted up to 1024 (896 under the usual 1024 or more; 224 under
/// 256), so that a program that opens nearly as many files as it may still finds the
/// low numbers free, and the stage's numbers stay under the limit. `None` when the
/// limit is too low to keep out of the program's way (`FLOOR_MIN`) or unknown.
pub(crate) fn floor() -> Option<i32> {
    // SAFETY: rlimit is plain data; a raw prlimit64 of this process (pid 0), no hook,
    // async-signal-safe.
    let soft = unsafe {
        let mut limit: libc::rlimit64 = std::mem::zeroed();
        let got = libc::syscall(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_NOFILE,
            std::ptr::null::<libc::rlimit64>(),
            &mut limit,
        );
        if got != 0 {
            return None;
        }
        limit.rlim_cur
    };
    let base = soft.min(FLOOR_BASE_MAX);
    let floor = base - base / 8;
    (floor >= FLOOR_MIN).then_some(floor as i32)
}

/// Moves `fd` (a descriptor the stage just opened) to the lowest free number at or
/// above [`floor`], close-on-exec, and returns its new number; `fd` itself when it is
/// there already, the limit is too low, or no number above the floor is free (the
/// stage then keeps it where it is: nothing fails for it).
pub(crate) fn move_high(fd: RawFd) -> RawFd {
    let Some(floor) = floor() else {
        return fd;
    };
    if fd >= floor {
        return fd;
    }
    // SAFETY: raw fcntl and close of a descriptor the stage just opened; no hook.
    unsafe {
        let high = libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, floor) as RawFd;
        if high < 0 {
            return fd;
        }
        libc::syscall(libc::SYS_close, fd);
        high
    }
}

/// What a descriptor was opened on: its device and inode. A socket has an inode of its
/// own too, so a number the program reused for any other file, socket or pipe no
/// longer matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
}

impl Identity {
    /// The identity of what `fd` names now; `None` if it is not open.
    pub(crate) fn of(fd: RawFd) -> Option<Identity> {
        if fd < 0 {
            return None;
        }
        // SAFETY: an all-zero `stat` is valid plain data and a valid out-pointer; a raw
        // fstat (async-signal-safe, no hook) of a closed descriptor only fails.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            (libc::syscall(libc::SYS_fstat, fd, &mut st) == 0).then_some(Identity {
                dev: st.st_dev,
                ino: st.st_ino,
            })
        }
    }

    /// Whether `fd` still names this object (still the stage's).
    pub(crate) fn holds(self, fd: RawFd) -> bool {
        Identity::of(fd) == Some(self)
    }
}

/// Closes `fd` if it still names `identity`'s object (raw, async-signal-safe); else
/// leaves it to the program, whose it is now. `true` if closed.
pub(crate) fn close_if_ours(fd: RawFd, identity: Identity) -> bool {
    if !identity.holds(fd) {
        return false;
    }
    // SAFETY: checked to be our descriptor; a raw close, no hook.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    true
}

/// A descriptor number and its [`Identity`] in atomics, for the paths that may not
/// take a lock (the `fork` child handler, `_exit`). One writer at a time (the thread
/// that opened it, or the child handler).
pub(crate) struct Slot {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl Slot {
    pub(crate) const fn empty() -> Slot {
        Slot {
            fd: AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
        }
    }

    /// Records `fd`, opened on `identity`.
    pub(crate) fn store(&self, fd: RawFd, identity: Identity) {
        self.dev.store(identity.dev, Ordering::Relaxed);
        self.ino.store(identity.ino, Ordering::Relaxed);
        self.fd.store(fd, Ordering::Release);
    }

    /// The descriptor and its identity, if any.
    pub(crate) fn get(&self) -> Option<(RawFd, Identity)> {
        let fd = self.fd.load(Ordering::Acquire);
        (fd >= 0).then(|| (fd, self.identity()))
    }

    /// Empties the slot, returning what it held (once: a second take finds nothing).
    pub(crate) fn take(&self) -> Option<(RawFd, Identity)> {
        let fd = self.fd.swap(-1, Ordering::AcqRel);
        (fd >= 0).then(|| (fd, self.identity()))
    }

    /// The identity last stored (kept after [`Slot::take`]: what to look for when
    /// reopening).
    pub(crate) fn identity(&self) -> Identity {
        Identity {
            dev: self.dev.load(Ordering::Relaxed),
            ino: self.ino.load(Ordering::Relaxed),
        }
    }
}

/// A descriptor the stage holds as an object (`UnixStream`): moved out of the program's
/// way, usable only while it is still ours ([`Held::get`]), and closed on drop only if
/// it is ([`close_if_ours`]); otherwise forgotten.
#[derive(Debug)]
pub(crate) struct Held<T: IntoRawFd + From<OwnedFd>> {
    inner: Option<T>,
    fd: RawFd,
    identity: Identity,
}

impl<T: IntoRawFd + From<OwnedFd>> Held<T> {
    /// Takes `inner` (just opened), moved out of the program's way ([`move_high`]).
    pub(crate) fn adopt(inner: T) -> std::io::Result<Held<T>> {
        let fd = move_high(inner.into_raw_fd());
        // SAFETY: ours: just opened, or its copy above the floor.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let identity = Identity::of(fd).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Held {
            inner: Some(T::from(owned)),
            fd,
            identity,
        })
    }

    /// The object, if its descriptor is still ours; an error naming the descriptor if
    /// the program took it (closed it, or put a file of its own on its number).
    pub(crate) fn get(&self) -> std::io::Result<&T> {
        match &self.inner {
            Some(inner) if self.identity.holds(self.fd) => Ok(inner),
            _ => Err(std::io::Error::other(format!(
                "its descriptor {} was closed or replaced by the program",
                self.fd
            ))),
        }
    }

    /// Its descriptor's number.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd
    }

    /// What its descriptor was opened on.
    pub(crate) fn identity(&self) -> Identity {
        self.identity
    }
}

impl<T: IntoRawFd + From<OwnedFd>> Drop for Held<T> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            // Either way the object lets go of the number without closing it.
            let fd = inner.into_raw_fd();
            close_if_ours(fd, self.identity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn descriptors_move_above_the_floor_close_on_exec() {
        let floor = floor().expect("a descriptor limit of at least 12 in tests");
        let (a, _b) = UnixStream::pair().unwrap();
        let low = a.as_raw_fd();
        let held = Held::adopt(a).unwrap();
        assert!(held.fd() >= floor, "{} below the floor {floor}", held.fd());
        // SAFETY: a raw fcntl of our descriptor.
        let flags = unsafe { libc::fcntl(held.fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        assert!(
            Identity::of(low) != Some(held.identity()),
            "the low number is freed"
        );
        assert!(held.get().is_ok());
    }

    #[test]
    fn a_descriptor_the_program_took_is_forgotten_not_closed() {
        let (a, _b) = UnixStream::pair().unwrap();
        let held = Held::adopt(a).unwrap();
        let number = held.fd();
        // The program puts a file of its own on the stage's number (`exec N>file`).
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        // SAFETY: dup2 of our file onto a number this test owns.
        assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), number) }, number);
        let program = Identity::of(number).unwrap();
        assert!(
            held.get().is_err(),
            "the stage must not use the program's file"
        );
        drop(held);
        assert_eq!(
            Identity::of(number),
            Some(program),
            "the program's file was closed"
        );
        // SAFETY: the program's copy, closed by the program.
        unsafe { libc::close(number) };
        // A slot forgets the same way.
        let (c, _d) = UnixStream::pair().unwrap();
        let c = c.into_raw_fd();
        let slot = Slot::empty();
        slot.store(c, Identity::of(c).unwrap());
        // SAFETY: as above.
        assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), c) }, c);
        let (fd, identity) = slot.take().unwrap();
        assert!(!close_if_ours(fd, identity));
        assert_eq!(Identity::of(c), Some(program));
        assert!(slot.take().is_none());
        // SAFETY: as above.
        unsafe { libc::close(c) };
    }
}
