//! The call model: what a hook's table line (`hooks.rs`) says about one call — its
//! operation, [`Target`] and [`Effect`] — and how its result is read ([`Returned`],
//! [`account`]).

use libc::{c_char, c_int, c_uint, c_void, DIR, FILE};
use padll_wire::ops::Op;

extern "C" {
    pub(crate) fn fileno_unlocked(stream: *mut FILE) -> c_int;
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
    /// placement (`placement.rs`) may make the call itself (only on entry points
    /// returning a descriptor).
    Create {
        /// The open flags.
        flags: c_int,
        /// The mode of a file created.
        mode: libc::mode_t,
    },
    /// Fills a pair of new descriptors (`pipe`, `socketpair`): the array the
    /// application passed.
    NewFds(*mut c_int),
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
    /// Receives a message (`recvmsg`) whose control data may carry descriptors
    /// (`SCM_RIGHTS`): the header the application passed.
    Receive(*mut libc::msghdr),
    /// Receives messages (`recvmmsg`) as [`Effect::Receive`]: the application's array.
    ReceiveMany(*mut libc::mmsghdr),
    /// Returns a copy of another process' descriptor (`pidfd_getfd`), on any file.
    Adopt,
    /// Detaches the process (`daemon`): inside libc, where no hook sees it, it changes to
    /// `/` unless told not to, and puts `/dev/null` on descriptors 0–2 unless
    /// `keeps_descriptors`.
    Daemon {
        /// `daemon`'s `noclose`: descriptors 0–2 are left as they are.
        keeps_descriptors: bool,
    },
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

    /// [`Self::descriptor`], or a negative number where there is none: for the
    /// descriptor table, which ignores negative numbers itself (for an `int`, the
    /// value as it is: no compare of its own).
    fn descriptor_or_negative(&self) -> c_int {
        self.descriptor().unwrap_or(-1)
    }

    /// The value standing for a new descriptor `fd`, for entry points returning one.
    fn from_descriptor(_fd: c_int) -> Option<Self> {
        None
    }

    /// How many messages a receiving call filled ([`Effect::Receive`]): `recvmsg`'s
    /// byte count (`ssize_t`) stands for one, `recvmmsg`'s `int` is their number.
    fn messages(&self) -> usize {
        0
    }
}

impl Returned for c_int {
    fn descriptor(&self) -> Option<c_int> {
        (*self >= 0).then_some(*self)
    }

    fn descriptor_or_negative(&self) -> c_int {
        *self
    }

    fn from_descriptor(fd: c_int) -> Option<c_int> {
        Some(fd)
    }

    fn messages(&self) -> usize {
        (*self).max(0) as usize
    }
}
impl Returned for isize {
    fn messages(&self) -> usize {
        usize::from(*self >= 0)
    }
}
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
            .then(|| unsafe { stream_fd(*self) })
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

/// True for a pointer no program can have data at: null, in the null page, or in the
/// kernel's half of the address space (`(char *) -1` and the like, which programs and
/// test suites pass to see `EFAULT`). The hooks read no such argument: the call passes
/// through and the kernel answers `EFAULT`, as without the stage. (A pointer into an
/// unmapped or `PROT_NONE` part of user space still faults in the stage, documented:
/// telling it apart would cost a system call per call.) One signed comparison, as cheap
/// as the test for null it replaces: the kernel's half is the negative one.
#[inline(always)]
pub(crate) fn unreadable<T>(p: *const T) -> bool {
    (p as isize) < NULL_PAGE
}

/// The null page's end: no mapping starts below it (`vm.mmap_min_addr` is at least
/// this).
const NULL_PAGE: isize = 4096;

/// A stream's descriptor, -1 for null or for a stream of no file (`open_memstream`,
/// `fmemopen`, `fopencookie`), with `errno` untouched: glibc's `fileno` sets `EBADF`
/// for those, which a hook must not leave behind.
///
/// # Safety
/// `stream` is null or an open stream (the application's argument).
#[inline(always)]
pub(crate) unsafe fn stream_fd(stream: *mut FILE) -> c_int {
    if stream.is_null() {
        return -1;
    }
    let errno = crate::errno::location();
    // SAFETY: the calling thread's errno slot, valid for its lifetime.
    let saved = unsafe { *errno };
    // SAFETY: the application's non-null, open stream, valid for the duration of the
    // hook; `fileno_unlocked` only reads it.
    let fd = unsafe { fileno_unlocked(stream) };
    if fd < 0 {
        // SAFETY: as above.
        unsafe { *errno = saved };
    }
    fd
}

/// A directory stream's descriptor, -1 for null.
///
/// # Safety
/// `dir` is null or an open directory stream (the application's argument).
pub(crate) unsafe fn dir_fd(dir: *mut DIR) -> c_int {
    if dir.is_null() {
        -1
    } else {
        // SAFETY: the application's non-null, open directory stream, valid for the
        // duration of the hook; `dirfd` only reads it.
        unsafe { libc::dirfd(dir) }
    }
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
