//! The interception table: one line per libc entry point, naming its operation, its
//! target, its effect on the descriptor table, the bytes it asks for and how to read
//! its result. The shared logic is [`crate::intercept::intercept`].
//!
//! Variadic entry points (`open`, `openat`, `fcntl`) are declared with their optional
//! argument spelled out: on the x86-64 and AArch64 Linux ABIs a variadic integer or
//! pointer argument travels exactly like a fixed one, and it is only read when the
//! flags say it is present (as libc does).
//!
//! Not visible from user space: static binaries, raw `syscall()`, io_uring, libaio,
//! and glibc's internal calls (e.g. the `lstat`s of `nftw` and `fts_read`, `realpath`,
//! `printf`-family flushes, the `getc` macros reading a stream's buffer directly, the
//! opens of `posix_spawn` file actions); the
//! directory changes of `nftw` and `fts` walks are followed by `walks.rs`. `fdopen`
//! creates no descriptor and touches no file: its stream is followed through its fd like
//! any other.

#![allow(non_snake_case)]

use crate::call::account::*;
use crate::call::{Account, Call, Effect, Target};
use crate::intercept::{admit_only, dispatch, intercept, intercept_resolved, intercept_rest};
use crate::real::{Real, Unavailable};
use libc::{
    c_char, c_int, c_uint, c_void, dev_t, gid_t, iovec, mode_t, off64_t, off_t, size_t, ssize_t,
    uid_t, DIR, FILE,
};
use padll_wire::ops::Op;

type Str = *const c_char;
type MutStr = *mut c_char;
type Buf = *mut c_void;
type ConstBuf = *const c_void;
type Stream = *mut FILE;
type DirStream = *mut DIR;
type Iov = *const iovec;
type Aio = *mut libc::aiocb;

/// What `creat` opens with.
const CREAT_FLAGS: c_int = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;

/// No operation: the entry point only keeps the descriptor table right.
const TRACK: Option<Op> = None;

macro_rules! hooks {
    ($(
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
            => $op:expr, $target:expr, $effect:expr, $requested:expr, $account:expr;
    )*) => {
        $(
            pub(crate) mod $name {
                use super::*;
                pub(crate) static REAL: Real = Real::with_fallback(
                    match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(name) => name,
                        Err(_) => panic!("symbol name"),
                    },
                    unresolved as *mut c_void,
                );
                pub(crate) type Signature = unsafe extern "C" fn($($ty),*) -> $ret;

                /// The table line's description of a call with these arguments (not
                /// every argument is in it; for some lines nothing in it is unsafe).
                ///
                /// # Safety
                /// The application's arguments: what the line reads of them (a stream,
                /// an iovec array, an aiocb), libc's `$name` reads too.
                #[inline(always)]
                #[allow(unused_variables, unused_unsafe)]
                pub(crate) unsafe fn line($($arg: $ty),*) -> Call {
                    // SAFETY: our caller's contract.
                    unsafe {
                        Call {
                            op: Option::<Op>::from($op),
                            target: $target,
                            effect: $effect,
                            requested: $requested as u64,
                        }
                    }
                }

                /// Calls the real function.
                ///
                /// # Safety
                /// The arguments must meet the real function's own contract (the hooks
                /// pass on the application's arguments unchanged).
                #[inline(always)]
                pub(crate) unsafe fn call($($arg: $ty),*) -> $ret {
                    // SAFETY: the entry is libc's definition of this very symbol
                    // (resolved by name), or `unresolved` below, so it has this
                    // signature; the arguments are our caller's, under the real
                    // function's contract, which `unresolved` shares.
                    unsafe { std::mem::transmute::<*mut c_void, Signature>(REAL.entry())($($arg),*) }
                }

                /// Resolves the real function first (a call before the constructor ran),
                /// or fails as [`Unavailable`] if libc has no such symbol: the entry
                /// [`call`] jumps to until then.
                ///
                /// # Safety
                /// As for [`call`].
                #[cold]
                #[inline(never)]
                unsafe extern "C" fn unresolved($($arg: $ty),*) -> $ret {
                    match REAL.address() {
                        // SAFETY: the address is libc's definition of this very symbol
                        // (resolved by name), so it has this signature; the arguments
                        // are our caller's, under the real function's contract.
                        Some(address) => unsafe { std::mem::transmute::<*mut c_void, Signature>(address)($($arg),*) },
                        None => <$ret as Unavailable>::unavailable(),
                    }
                }
            }

            #[doc = concat!("The exported `", stringify!($name), "` hook.")]
            ///
            /// # Safety
            #[doc = concat!("The contract of libc's `", stringify!($name), "`: called by the")]
            /// application (through the PLT) with the arguments the real function takes.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                /// Everything but the fast path, out of line: the hook's own body then
                /// keeps its arguments in registers and ends in a tail call.
                /// (`extern "C"` like the hook, so the hook can jump to it.)
                ///
                /// # Safety
                /// As for the hook: the application's arguments, unchanged, and the
                /// place codes [`dispatch`] found for its target.
                #[cold]
                #[inline(never)]
                unsafe extern "C" fn slow($($arg: $ty,)* found: u32) -> $ret {
                    // SAFETY: the application's arguments, passed on unchanged and valid
                    // for the duration of the hook: the table line's target and effect
                    // hold its pointers (what it reads of them — a path, an iovec array,
                    // an aiocb — libc's `$name` reads too), and the closures call the
                    // real function and `rest` with exactly those arguments.
                    unsafe {
                        intercept_resolved(
                            found,
                            $name::line($($arg),*),
                            $account,
                            move || $name::call($($arg),*),
                            move || rest($($arg,)* found),
                        )
                    }
                }

                /// What `slow` does not handle inline, out of line again (see
                /// [`intercept_rest`]). (`extern "C"` like the hook, so `slow` can jump
                /// to it.)
                ///
                /// # Safety
                /// As for `slow`.
                #[cold]
                #[inline(never)]
                unsafe extern "C" fn rest($($arg: $ty,)* found: u32) -> $ret {
                    // SAFETY: as in `slow`.
                    unsafe {
                        intercept_rest(found, $name::line($($arg),*), $account, move || {
                            $name::call($($arg),*)
                        })
                    }
                }
                // SAFETY: the application's arguments, passed on unchanged and valid for
                // the duration of the hook: the table line's target and effect hold its
                // pointers (what it reads of them — a path, an iovec array, an aiocb —
                // libc's `$name` reads too), and the closures call the real function /
                // `slow` with exactly those arguments.
                unsafe {
                    dispatch(
                        Option::<Op>::from($op),
                        $target,
                        $effect,
                        move || $name::call($($arg),*),
                        move |found| slow($($arg,)* found),
                    )
                }
            }
        )*

        /// Every real function behind a table entry, for eager resolution.
        pub(crate) static TABLE: &[&Real] = &[$(&$name::REAL,)* &MMAP.0, &MMAP64.0, &LIO_LISTIO.0, &LIO_LISTIO64.0, &EXIT.0, &EXIT_UPPER.0];
    };
}

use Effect as E;
use Op as O;
use Target as T;

hooks! {
    // name(arguments) -> return        => operation, target, effect, bytes requested, result;
    // ---- open family -------------------------------------------------------------------
    fn open(path: Str, flags: c_int, mode: mode_t) -> c_int => O::Open, T::Path(path), E::Create { flags, mode }, 0, status;
    fn open64(path: Str, flags: c_int, mode: mode_t) -> c_int => O::Open, T::Path(path), E::Create { flags, mode }, 0, status;
    fn openat(dirfd: c_int, path: Str, flags: c_int, mode: mode_t) -> c_int => O::Open, T::At(dirfd, path), E::Create { flags, mode }, 0, status;
    fn openat64(dirfd: c_int, path: Str, flags: c_int, mode: mode_t) -> c_int => O::Open, T::At(dirfd, path), E::Create { flags, mode }, 0, status;
    fn __open_2(path: Str, flags: c_int) -> c_int => O::Open, T::Path(path), E::NewFd { flags }, 0, status;
    fn __open64_2(path: Str, flags: c_int) -> c_int => O::Open, T::Path(path), E::NewFd { flags }, 0, status;
    fn __openat_2(dirfd: c_int, path: Str, flags: c_int) -> c_int => O::Open, T::At(dirfd, path), E::NewFd { flags }, 0, status;
    fn __openat64_2(dirfd: c_int, path: Str, flags: c_int) -> c_int => O::Open, T::At(dirfd, path), E::NewFd { flags }, 0, status;
    fn creat(path: Str, mode: mode_t) -> c_int => O::Open, T::Path(path), E::Create { flags: CREAT_FLAGS, mode }, 0, status;
    fn creat64(path: Str, mode: mode_t) -> c_int => O::Open, T::Path(path), E::Create { flags: CREAT_FLAGS, mode }, 0, status;
    fn mkstemp(template: MutStr) -> c_int => O::Open, T::Path(template), E::NewFd { flags: 0 }, 0, status;
    fn mkstemp64(template: MutStr) -> c_int => O::Open, T::Path(template), E::NewFd { flags: 0 }, 0, status;
    fn mkostemp(template: MutStr, flags: c_int) -> c_int => O::Open, T::Path(template), E::NewFd { flags }, 0, status;
    fn mkostemp64(template: MutStr, flags: c_int) -> c_int => O::Open, T::Path(template), E::NewFd { flags }, 0, status;
    fn mkstemps(template: MutStr, suffix: c_int) -> c_int => O::Open, T::Path(template), E::NewFd { flags: 0 }, 0, status;
    fn mkstemps64(template: MutStr, suffix: c_int) -> c_int => O::Open, T::Path(template), E::NewFd { flags: 0 }, 0, status;
    fn mkostemps(template: MutStr, suffix: c_int, flags: c_int) -> c_int => O::Open, T::Path(template), E::NewFd { flags }, 0, status;
    fn mkostemps64(template: MutStr, suffix: c_int, flags: c_int) -> c_int => O::Open, T::Path(template), E::NewFd { flags }, 0, status;
    fn close(fd: c_int) -> c_int => O::Close, T::Fd(fd), E::Close(fd), 0, status;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int => TRACK, T::None, E::CloseRange(first, last, flags), 0, status;
    fn closefrom(first: c_int) -> () => TRACK, T::None, E::CloseRange(first.max(0) as c_uint, c_uint::MAX, 0), 0, nothing;
    fn dup(fd: c_int) -> c_int => TRACK, T::None, E::Dup(fd), 0, status;
    fn dup2(fd: c_int, new: c_int) -> c_int => TRACK, T::None, E::DupTo(fd, new), 0, status;
    fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int => TRACK, T::None, E::DupTo(fd, new), 0, status;
    fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int => fcntl_op(cmd), T::Fd(fd), E::Fcntl(fd, cmd), 0, status;
    fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int => fcntl_op(cmd), T::Fd(fd), E::Fcntl(fd, cmd), 0, status;
    fn open_by_handle_at(mount_fd: c_int, handle: Buf, flags: c_int) -> c_int => O::Open, T::Fd(mount_fd), E::NewFd { flags }, 0, status;
    // ---- descriptors of no file: their number may be one a close no hook saw (a raw
    // system call) left in the table, which they must not inherit --------------------
    fn pipe(fds: *mut c_int) -> c_int => TRACK, T::None, E::NewFds(fds), 0, status;
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int => TRACK, T::None, E::NewFds(fds), 0, status;
    fn socketpair(domain: c_int, kind: c_int, protocol: c_int, fds: *mut c_int) -> c_int => TRACK, T::None, E::NewFds(fds), 0, status;
    fn socket(domain: c_int, kind: c_int, protocol: c_int) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    fn accept(fd: c_int, address: *mut libc::sockaddr, length: *mut libc::socklen_t) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    fn accept4(fd: c_int, address: *mut libc::sockaddr, length: *mut libc::socklen_t, flags: c_int) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    // ---- descriptors from another process: recorded by what they are open on ---------
    fn recvmsg(fd: c_int, message: *mut libc::msghdr, flags: c_int) -> ssize_t => TRACK, T::None, E::Receive(message), 0, transfer;
    fn recvmmsg(fd: c_int, messages: *mut libc::mmsghdr, count: c_uint, flags: c_int, timeout: *mut libc::timespec) -> c_int => TRACK, T::None, E::ReceiveMany(messages), 0, status;
    fn pidfd_getfd(pidfd: c_int, target: c_int, flags: c_uint) -> c_int => TRACK, T::None, E::Adopt, 0, status;
    fn eventfd(initial: c_uint, flags: c_int) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    fn epoll_create(size: c_int) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    fn epoll_create1(flags: c_int) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    fn memfd_create(name: Str, flags: c_uint) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    fn timerfd_create(clock: c_int, flags: c_int) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    fn signalfd(fd: c_int, mask: *const libc::sigset_t, flags: c_int) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    fn inotify_init() -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;
    fn inotify_init1(flags: c_int) -> c_int => TRACK, T::None, E::NewFd { flags: 0 }, 0, status;

    // ---- data ----------------------------------------------------------------------------
    fn read(fd: c_int, buf: Buf, count: size_t) -> ssize_t => O::Read, T::Fd(fd), E::None, count, transfer;
    fn write(fd: c_int, buf: ConstBuf, count: size_t) -> ssize_t => O::Write, T::Fd(fd), E::None, count, transfer;
    fn pread(fd: c_int, buf: Buf, count: size_t, offset: off_t) -> ssize_t => O::Read, T::Fd(fd), E::None, count, transfer;
    fn pwrite(fd: c_int, buf: ConstBuf, count: size_t, offset: off_t) -> ssize_t => O::Write, T::Fd(fd), E::None, count, transfer;
    fn pread64(fd: c_int, buf: Buf, count: size_t, offset: off64_t) -> ssize_t => O::Read, T::Fd(fd), E::None, count, transfer;
    fn pwrite64(fd: c_int, buf: ConstBuf, count: size_t, offset: off64_t) -> ssize_t => O::Write, T::Fd(fd), E::None, count, transfer;
    fn __read_chk(fd: c_int, buf: Buf, count: size_t, buflen: size_t) -> ssize_t => O::Read, T::Fd(fd), E::None, count, transfer;
    fn __pread_chk(fd: c_int, buf: Buf, count: size_t, offset: off_t, buflen: size_t) -> ssize_t => O::Read, T::Fd(fd), E::None, count, transfer;
    fn __pread64_chk(fd: c_int, buf: Buf, count: size_t, offset: off64_t, buflen: size_t) -> ssize_t => O::Read, T::Fd(fd), E::None, count, transfer;
    fn readv(fd: c_int, iov: Iov, count: c_int) -> ssize_t => O::Read, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn writev(fd: c_int, iov: Iov, count: c_int) -> ssize_t => O::Write, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn preadv(fd: c_int, iov: Iov, count: c_int, offset: off_t) -> ssize_t => O::Read, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn pwritev(fd: c_int, iov: Iov, count: c_int, offset: off_t) -> ssize_t => O::Write, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn preadv64(fd: c_int, iov: Iov, count: c_int, offset: off64_t) -> ssize_t => O::Read, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn pwritev64(fd: c_int, iov: Iov, count: c_int, offset: off64_t) -> ssize_t => O::Write, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn preadv2(fd: c_int, iov: Iov, count: c_int, offset: off_t, flags: c_int) -> ssize_t => O::Read, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn pwritev2(fd: c_int, iov: Iov, count: c_int, offset: off_t, flags: c_int) -> ssize_t => O::Write, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn preadv64v2(fd: c_int, iov: Iov, count: c_int, offset: off64_t, flags: c_int) -> ssize_t => O::Read, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn pwritev64v2(fd: c_int, iov: Iov, count: c_int, offset: off64_t, flags: c_int) -> ssize_t => O::Write, T::Fd(fd), E::None, iov_bytes(iov, count), transfer;
    fn copy_file_range(from: c_int, from_offset: *mut off64_t, to: c_int, to_offset: *mut off64_t, len: size_t, flags: c_uint) -> ssize_t => O::Write, T::Copy { from, to }, E::None, len, transfer;
    fn sendfile(to: c_int, from: c_int, offset: *mut off_t, count: size_t) -> ssize_t => O::Write, T::Copy { from, to }, E::None, count, transfer;
    fn sendfile64(to: c_int, from: c_int, offset: *mut off64_t, count: size_t) -> ssize_t => O::Write, T::Copy { from, to }, E::None, count, transfer;
    fn splice(from: c_int, from_offset: *mut off64_t, to: c_int, to_offset: *mut off64_t, len: size_t, flags: c_uint) -> ssize_t => O::Write, T::Copy { from, to }, E::None, len, transfer;
    fn aio_read(cb: Aio) -> c_int => O::Read, T::Fd(aio_fd(cb)), E::None, aio_len(cb), submitted(aio_len(cb));
    fn aio_write(cb: Aio) -> c_int => O::Write, T::Fd(aio_fd(cb)), E::None, aio_len(cb), submitted(aio_len(cb));
    fn aio_read64(cb: Aio) -> c_int => O::Read, T::Fd(aio_fd(cb)), E::None, aio_len(cb), submitted(aio_len(cb));
    fn aio_write64(cb: Aio) -> c_int => O::Write, T::Fd(aio_fd(cb)), E::None, aio_len(cb), submitted(aio_len(cb));
    fn aio_fsync(op: c_int, cb: Aio) -> c_int => O::Sync, T::Fd(aio_fd(cb)), E::None, 0, status;
    fn aio_fsync64(op: c_int, cb: Aio) -> c_int => O::Sync, T::Fd(aio_fd(cb)), E::None, 0, status;
    fn readahead(fd: c_int, offset: off64_t, count: size_t) -> ssize_t => O::Read, T::Fd(fd), E::None, count, prefetched(count);
    fn fsync(fd: c_int) -> c_int => O::Sync, T::Fd(fd), E::None, 0, status;
    fn sync_file_range(fd: c_int, offset: off64_t, len: off64_t, flags: c_uint) -> c_int => O::Sync, T::Fd(fd), E::None, 0, status;
    fn fdatasync(fd: c_int) -> c_int => O::Sync, T::Fd(fd), E::None, 0, status;
    fn syncfs(fd: c_int) -> c_int => O::Sync, T::Fd(fd), E::None, 0, status;
    fn sync() -> () => O::Sync, T::None, E::None, 0, nothing;
    fn truncate(path: Str, len: off_t) -> c_int => O::Truncate, T::Path(path), E::None, 0, status;
    fn truncate64(path: Str, len: off64_t) -> c_int => O::Truncate, T::Path(path), E::None, 0, status;
    fn ftruncate(fd: c_int, len: off_t) -> c_int => O::Truncate, T::Fd(fd), E::None, 0, status;
    fn ftruncate64(fd: c_int, len: off64_t) -> c_int => O::Truncate, T::Fd(fd), E::None, 0, status;
    fn fallocate(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int => O::Allocate, T::Fd(fd), E::None, 0, status;
    fn fallocate64(fd: c_int, mode: c_int, offset: off64_t, len: off64_t) -> c_int => O::Allocate, T::Fd(fd), E::None, 0, status;
    fn posix_fallocate(fd: c_int, offset: off_t, len: off_t) -> c_int => O::Allocate, T::Fd(fd), E::None, 0, error_number;
    fn posix_fallocate64(fd: c_int, offset: off64_t, len: off64_t) -> c_int => O::Allocate, T::Fd(fd), E::None, 0, error_number;

    // ---- stdio (glibc's stdio calls the kernel internally: hooking read/open never sees it)
    fn fopen(path: Str, mode: Str) -> Stream => O::Open, T::Path(path), E::NewStream, 0, handle;
    fn fopen64(path: Str, mode: Str) -> Stream => O::Open, T::Path(path), E::NewStream, 0, handle;
    fn freopen(path: Str, mode: Str, stream: Stream) -> Stream => O::Open, reopen_target(path, stream), E::Reopen(stream), 0, handle;
    fn freopen64(path: Str, mode: Str, stream: Stream) -> Stream => O::Open, reopen_target(path, stream), E::Reopen(stream), 0, handle;
    fn fclose(stream: Stream) -> c_int => O::Close, T::Stream(stream), E::CloseStream(stream), 0, status;
    fn fread(buf: Buf, size: size_t, n: size_t, stream: Stream) -> size_t => O::Read, T::Stream(stream), E::None, size.saturating_mul(n), items(size);
    fn fread_unlocked(buf: Buf, size: size_t, n: size_t, stream: Stream) -> size_t => O::Read, T::Stream(stream), E::None, size.saturating_mul(n), items(size);
    fn __fread_chk(buf: Buf, buflen: size_t, size: size_t, n: size_t, stream: Stream) -> size_t => O::Read, T::Stream(stream), E::None, size.saturating_mul(n), items(size);
    fn __fread_unlocked_chk(buf: Buf, buflen: size_t, size: size_t, n: size_t, stream: Stream) -> size_t => O::Read, T::Stream(stream), E::None, size.saturating_mul(n), items(size);
    fn fwrite(buf: ConstBuf, size: size_t, n: size_t, stream: Stream) -> size_t => O::Write, T::Stream(stream), E::None, size.saturating_mul(n), items(size);
    fn fwrite_unlocked(buf: ConstBuf, size: size_t, n: size_t, stream: Stream) -> size_t => O::Write, T::Stream(stream), E::None, size.saturating_mul(n), items(size);
    fn fgets(s: MutStr, n: c_int, stream: Stream) -> MutStr => O::Read, T::Stream(stream), E::None, n.max(0), line;
    fn fgets_unlocked(s: MutStr, n: c_int, stream: Stream) -> MutStr => O::Read, T::Stream(stream), E::None, n.max(0), line;
    fn __fgets_chk(s: MutStr, size: size_t, n: c_int, stream: Stream) -> MutStr => O::Read, T::Stream(stream), E::None, n.max(0), line;
    fn __fgets_unlocked_chk(s: MutStr, size: size_t, n: c_int, stream: Stream) -> MutStr => O::Read, T::Stream(stream), E::None, n.max(0), line;
    fn fputs(s: Str, stream: Stream) -> c_int => O::Write, T::Stream(stream), E::None, c_strlen(s), put(c_strlen(s));
    fn fputs_unlocked(s: Str, stream: Stream) -> c_int => O::Write, T::Stream(stream), E::None, c_strlen(s), put(c_strlen(s));
    fn fgetc(stream: Stream) -> c_int => O::Read, T::Stream(stream), E::None, 1, char_in;
    fn getc(stream: Stream) -> c_int => O::Read, T::Stream(stream), E::None, 1, char_in;
    fn fgetc_unlocked(stream: Stream) -> c_int => O::Read, T::Stream(stream), E::None, 1, char_in;
    fn getc_unlocked(stream: Stream) -> c_int => O::Read, T::Stream(stream), E::None, 1, char_in;
    fn _IO_getc(stream: Stream) -> c_int => O::Read, T::Stream(stream), E::None, 1, char_in;
    fn fputc(c: c_int, stream: Stream) -> c_int => O::Write, T::Stream(stream), E::None, 1, put(1);
    fn putc(c: c_int, stream: Stream) -> c_int => O::Write, T::Stream(stream), E::None, 1, put(1);
    fn fputc_unlocked(c: c_int, stream: Stream) -> c_int => O::Write, T::Stream(stream), E::None, 1, put(1);
    fn putc_unlocked(c: c_int, stream: Stream) -> c_int => O::Write, T::Stream(stream), E::None, 1, put(1);
    fn _IO_putc(c: c_int, stream: Stream) -> c_int => O::Write, T::Stream(stream), E::None, 1, put(1);
    fn getline(line: *mut MutStr, n: *mut size_t, stream: Stream) -> ssize_t => O::Read, T::Stream(stream), E::None, 0, delimited(stream);
    fn getdelim(line: *mut MutStr, n: *mut size_t, delim: c_int, stream: Stream) -> ssize_t => O::Read, T::Stream(stream), E::None, 0, delimited(stream);
    fn __getdelim(line: *mut MutStr, n: *mut size_t, delim: c_int, stream: Stream) -> ssize_t => O::Read, T::Stream(stream), E::None, 0, delimited(stream);
    fn fflush(stream: Stream) -> c_int => flush_op(stream), T::Stream(stream), E::None, 0, status;
    fn fflush_unlocked(stream: Stream) -> c_int => flush_op(stream), T::Stream(stream), E::None, 0, status;

    // ---- metadata ------------------------------------------------------------------------
    fn stat(path: Str, buf: *mut libc::stat) -> c_int => O::Getattr, T::Path(path), E::None, 0, status;
    fn lstat(path: Str, buf: *mut libc::stat) -> c_int => O::Getattr, T::Path(path), E::None, 0, status;
    fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int => O::Getattr, T::Fd(fd), E::None, 0, status;
    fn fstatat(dirfd: c_int, path: Str, buf: *mut libc::stat, flags: c_int) -> c_int => O::Getattr, T::At(dirfd, path), E::None, 0, status;
    fn stat64(path: Str, buf: *mut libc::stat64) -> c_int => O::Getattr, T::Path(path), E::None, 0, status;
    fn lstat64(path: Str, buf: *mut libc::stat64) -> c_int => O::Getattr, T::Path(path), E::None, 0, status;
    fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int => O::Getattr, T::Fd(fd), E::None, 0, status;
    fn fstatat64(dirfd: c_int, path: Str, buf: *mut libc::stat64, flags: c_int) -> c_int => O::Getattr, T::At(dirfd, path), E::None, 0, status;
    fn statx(dirfd: c_int, path: Str, flags: c_int, mask: c_uint, buf: Buf) -> c_int => O::Getattr, T::At(dirfd, path), E::None, 0, status;
    fn __xstat(ver: c_int, path: Str, buf: *mut libc::stat) -> c_int => O::Getattr, T::Path(path), E::None, 0, status;
    fn __lxstat(ver: c_int, path: Str, buf: *mut libc::stat) -> c_int => O::Getattr, T::Path(path), E::None, 0, status;
    fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int => O::Getattr, T::Fd(fd), E::None, 0, status;
    fn __fxstatat(ver: c_int, dirfd: c_int, path: Str, buf: *mut libc::stat, flags: c_int) -> c_int => O::Getattr, T::At(dirfd, path), E::None, 0, status;
    fn __xstat64(ver: c_int, path: Str, buf: *mut libc::stat64) -> c_int => O::Getattr, T::Path(path), E::None, 0, status;
    fn __lxstat64(ver: c_int, path: Str, buf: *mut libc::stat64) -> c_int => O::Getattr, T::Path(path), E::None, 0, status;
    fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int => O::Getattr, T::Fd(fd), E::None, 0, status;
    fn __fxstatat64(ver: c_int, dirfd: c_int, path: Str, buf: *mut libc::stat64, flags: c_int) -> c_int => O::Getattr, T::At(dirfd, path), E::None, 0, status;
    fn access(path: Str, mode: c_int) -> c_int => O::Access, T::Path(path), E::None, 0, status;
    fn faccessat(dirfd: c_int, path: Str, mode: c_int, flags: c_int) -> c_int => O::Access, T::At(dirfd, path), E::None, 0, status;
    fn euidaccess(path: Str, mode: c_int) -> c_int => O::Access, T::Path(path), E::None, 0, status;
    fn eaccess(path: Str, mode: c_int) -> c_int => O::Access, T::Path(path), E::None, 0, status;
    fn mkdir(path: Str, mode: mode_t) -> c_int => O::Mkdir, T::Path(path), E::None, 0, status;
    fn mkdirat(dirfd: c_int, path: Str, mode: mode_t) -> c_int => O::Mkdir, T::At(dirfd, path), E::None, 0, status;
    fn mkdtemp(template: MutStr) -> MutStr => O::Mkdir, T::Path(template), E::None, 0, handle;
    fn rmdir(path: Str) -> c_int => O::Rmdir, T::Path(path), E::None, 0, status;
    fn unlink(path: Str) -> c_int => O::Unlink, T::Path(path), E::None, 0, status;
    fn unlinkat(dirfd: c_int, path: Str, flags: c_int) -> c_int => unlinkat_op(flags), T::At(dirfd, path), E::None, 0, status;
    fn rename(old: Str, new: Str) -> c_int => O::Rename, T::Paths(old, new), E::None, 0, status;
    fn renameat(old_dir: c_int, old: Str, new_dir: c_int, new: Str) -> c_int => O::Rename, T::AtPaths(old_dir, old, new_dir, new), E::None, 0, status;
    fn renameat2(old_dir: c_int, old: Str, new_dir: c_int, new: Str, flags: c_uint) -> c_int => O::Rename, T::AtPaths(old_dir, old, new_dir, new), E::None, 0, status;
    fn link(old: Str, new: Str) -> c_int => O::Link, T::Paths(old, new), E::None, 0, status;
    fn linkat(old_dir: c_int, old: Str, new_dir: c_int, new: Str, flags: c_int) -> c_int => O::Link, T::AtPaths(old_dir, old, new_dir, new), E::None, 0, status;
    fn symlink(target: Str, path: Str) -> c_int => O::Symlink, T::Path(path), E::None, 0, status;
    fn symlinkat(target: Str, dirfd: c_int, path: Str) -> c_int => O::Symlink, T::At(dirfd, path), E::None, 0, status;
    fn readlink(path: Str, buf: MutStr, size: size_t) -> ssize_t => O::Readlink, T::Path(path), E::None, 0, failed_if_negative;
    fn readlinkat(dirfd: c_int, path: Str, buf: MutStr, size: size_t) -> ssize_t => O::Readlink, T::At(dirfd, path), E::None, 0, failed_if_negative;
    fn __readlink_chk(path: Str, buf: MutStr, size: size_t, buflen: size_t) -> ssize_t => O::Readlink, T::Path(path), E::None, 0, failed_if_negative;
    fn __readlinkat_chk(dirfd: c_int, path: Str, buf: MutStr, size: size_t, buflen: size_t) -> ssize_t => O::Readlink, T::At(dirfd, path), E::None, 0, failed_if_negative;
    fn chmod(path: Str, mode: mode_t) -> c_int => O::Setattr, T::Path(path), E::None, 0, status;
    fn fchmod(fd: c_int, mode: mode_t) -> c_int => O::Setattr, T::Fd(fd), E::None, 0, status;
    fn fchmodat(dirfd: c_int, path: Str, mode: mode_t, flags: c_int) -> c_int => O::Setattr, T::At(dirfd, path), E::None, 0, status;
    fn chown(path: Str, uid: uid_t, gid: gid_t) -> c_int => O::Setattr, T::Path(path), E::None, 0, status;
    fn lchown(path: Str, uid: uid_t, gid: gid_t) -> c_int => O::Setattr, T::Path(path), E::None, 0, status;
    fn lchmod(path: Str, mode: mode_t) -> c_int => O::Setattr, T::Path(path), E::None, 0, status;
    fn fchown(fd: c_int, uid: uid_t, gid: gid_t) -> c_int => O::Setattr, T::Fd(fd), E::None, 0, status;
    fn fchownat(dirfd: c_int, path: Str, uid: uid_t, gid: gid_t, flags: c_int) -> c_int => O::Setattr, T::At(dirfd, path), E::None, 0, status;
    fn utime(path: Str, times: ConstBuf) -> c_int => O::Setattr, T::Path(path), E::None, 0, status;
    fn utimes(path: Str, times: ConstBuf) -> c_int => O::Setattr, T::Path(path), E::None, 0, status;
    fn lutimes(path: Str, times: ConstBuf) -> c_int => O::Setattr, T::Path(path), E::None, 0, status;
    fn futimes(fd: c_int, times: ConstBuf) -> c_int => O::Setattr, T::Fd(fd), E::None, 0, status;
    fn futimesat(dirfd: c_int, path: Str, times: ConstBuf) -> c_int => O::Setattr, T::At(dirfd, path), E::None, 0, status;
    fn utimensat(dirfd: c_int, path: Str, times: ConstBuf, flags: c_int) -> c_int => O::Setattr, T::At(dirfd, path), E::None, 0, status;
    fn futimens(fd: c_int, times: ConstBuf) -> c_int => O::Setattr, T::Fd(fd), E::None, 0, status;
    fn mknod(path: Str, mode: mode_t, dev: dev_t) -> c_int => O::Mknod, T::Path(path), E::None, 0, status;
    fn mknodat(dirfd: c_int, path: Str, mode: mode_t, dev: dev_t) -> c_int => O::Mknod, T::At(dirfd, path), E::None, 0, status;
    fn mkfifo(path: Str, mode: mode_t) -> c_int => O::Mknod, T::Path(path), E::None, 0, status;
    fn mkfifoat(dirfd: c_int, path: Str, mode: mode_t) -> c_int => O::Mknod, T::At(dirfd, path), E::None, 0, status;
    fn __xmknod(ver: c_int, path: Str, mode: mode_t, dev: *mut dev_t) -> c_int => O::Mknod, T::Path(path), E::None, 0, status;
    fn __xmknodat(ver: c_int, dirfd: c_int, path: Str, mode: mode_t, dev: *mut dev_t) -> c_int => O::Mknod, T::At(dirfd, path), E::None, 0, status;
    fn statfs(path: Str, buf: Buf) -> c_int => O::Statfs, T::Path(path), E::None, 0, status;
    fn statfs64(path: Str, buf: Buf) -> c_int => O::Statfs, T::Path(path), E::None, 0, status;
    fn fstatfs(fd: c_int, buf: Buf) -> c_int => O::Statfs, T::Fd(fd), E::None, 0, status;
    fn fstatfs64(fd: c_int, buf: Buf) -> c_int => O::Statfs, T::Fd(fd), E::None, 0, status;
    fn statvfs(path: Str, buf: Buf) -> c_int => O::Statfs, T::Path(path), E::None, 0, status;
    fn statvfs64(path: Str, buf: Buf) -> c_int => O::Statfs, T::Path(path), E::None, 0, status;
    fn fstatvfs(fd: c_int, buf: Buf) -> c_int => O::Statfs, T::Fd(fd), E::None, 0, status;
    fn fstatvfs64(fd: c_int, buf: Buf) -> c_int => O::Statfs, T::Fd(fd), E::None, 0, status;
    fn realpath(path: Str, resolved: MutStr) -> MutStr => O::Getattr, T::Path(path), E::None, 0, handle;
    fn __realpath_chk(path: Str, resolved: MutStr, len: size_t) -> MutStr => O::Getattr, T::Path(path), E::None, 0, handle;
    fn canonicalize_file_name(path: Str) -> MutStr => O::Getattr, T::Path(path), E::None, 0, handle;
    fn name_to_handle_at(dirfd: c_int, path: Str, handle: Buf, mount_id: *mut c_int, flags: c_int) -> c_int => O::Getattr, T::At(dirfd, path), E::None, 0, status;
    fn flock(fd: c_int, operation: c_int) -> c_int => O::Lock, T::Fd(fd), E::None, 0, status;
    fn lockf(fd: c_int, cmd: c_int, len: off_t) -> c_int => O::Lock, T::Fd(fd), E::None, 0, status;
    fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int => O::Lock, T::Fd(fd), E::None, 0, status;
    fn chdir(path: Str) -> c_int => O::Chdir, T::Path(path), E::Chdir, 0, status;
    fn daemon(nochdir: c_int, noclose: c_int) -> c_int => TRACK, T::None, E::Daemon { keeps_descriptors: noclose != 0 }, 0, status;
    fn fchdir(fd: c_int) -> c_int => O::Chdir, T::Fd(fd), E::Chdir, 0, status;

    // ---- directories ---------------------------------------------------------------------
    fn opendir(path: Str) -> DirStream => O::Opendir, T::Path(path), E::NewDirStream, 0, handle;
    fn fdopendir(fd: c_int) -> DirStream => O::Opendir, T::Fd(fd), E::None, 0, handle;
    fn readdir(dir: DirStream) -> *mut libc::dirent => O::Readdir, T::Dir(dir), E::None, 0, listing;
    fn readdir64(dir: DirStream) -> *mut libc::dirent64 => O::Readdir, T::Dir(dir), E::None, 0, listing;
    fn readdir_r(dir: DirStream, entry: *mut libc::dirent, found: *mut *mut libc::dirent) -> c_int => O::Readdir, T::Dir(dir), E::None, 0, error_number;
    fn readdir64_r(dir: DirStream, entry: *mut libc::dirent64, found: *mut *mut libc::dirent64) -> c_int => O::Readdir, T::Dir(dir), E::None, 0, error_number;
    fn getdents64(fd: c_int, entries: Buf, size: size_t) -> ssize_t => O::Readdir, T::Fd(fd), E::None, 0, failed_if_negative;
    fn getdirentries(fd: c_int, entries: MutStr, size: size_t, base: *mut off_t) -> ssize_t => O::Readdir, T::Fd(fd), E::None, 0, failed_if_negative;
    fn getdirentries64(fd: c_int, entries: MutStr, size: size_t, base: *mut off64_t) -> ssize_t => O::Readdir, T::Fd(fd), E::None, 0, failed_if_negative;
    fn closedir(dir: DirStream) -> c_int => O::Closedir, T::Dir(dir), E::CloseDirStream(dir), 0, status;
    fn scandir(path: Str, list: Buf, filter: ConstBuf, compare: ConstBuf) -> c_int => O::Readdir, T::Path(path), E::None, 0, status;
    fn scandir64(path: Str, list: Buf, filter: ConstBuf, compare: ConstBuf) -> c_int => O::Readdir, T::Path(path), E::None, 0, status;
    fn glob(pattern: Str, flags: c_int, on_error: ConstBuf, found: Buf) -> c_int => O::Readdir, T::Path(pattern), E::None, 0, error_number;
    fn glob64(pattern: Str, flags: c_int, on_error: ConstBuf, found: Buf) -> c_int => O::Readdir, T::Path(pattern), E::None, 0, error_number;
    fn scandirat(dirfd: c_int, path: Str, list: Buf, filter: ConstBuf, compare: ConstBuf) -> c_int => O::Readdir, T::At(dirfd, path), E::None, 0, status;
    fn scandirat64(dirfd: c_int, path: Str, list: Buf, filter: ConstBuf, compare: ConstBuf) -> c_int => O::Readdir, T::At(dirfd, path), E::None, 0, status;

    // ---- extended attributes -------------------------------------------------------------
    fn getxattr(path: Str, name: Str, value: Buf, size: size_t) -> ssize_t => O::Getxattr, T::Path(path), E::None, 0, failed_if_negative;
    fn lgetxattr(path: Str, name: Str, value: Buf, size: size_t) -> ssize_t => O::Getxattr, T::Path(path), E::None, 0, failed_if_negative;
    fn fgetxattr(fd: c_int, name: Str, value: Buf, size: size_t) -> ssize_t => O::Getxattr, T::Fd(fd), E::None, 0, failed_if_negative;
    fn setxattr(path: Str, name: Str, value: ConstBuf, size: size_t, flags: c_int) -> c_int => O::Setxattr, T::Path(path), E::None, 0, status;
    fn lsetxattr(path: Str, name: Str, value: ConstBuf, size: size_t, flags: c_int) -> c_int => O::Setxattr, T::Path(path), E::None, 0, status;
    fn fsetxattr(fd: c_int, name: Str, value: ConstBuf, size: size_t, flags: c_int) -> c_int => O::Setxattr, T::Fd(fd), E::None, 0, status;
    fn listxattr(path: Str, list: MutStr, size: size_t) -> ssize_t => O::Listxattr, T::Path(path), E::None, 0, failed_if_negative;
    fn llistxattr(path: Str, list: MutStr, size: size_t) -> ssize_t => O::Listxattr, T::Path(path), E::None, 0, failed_if_negative;
    fn flistxattr(fd: c_int, list: MutStr, size: size_t) -> ssize_t => O::Listxattr, T::Fd(fd), E::None, 0, failed_if_negative;
    fn removexattr(path: Str, name: Str) -> c_int => O::Removexattr, T::Path(path), E::None, 0, status;
    fn lremovexattr(path: Str, name: Str) -> c_int => O::Removexattr, T::Path(path), E::None, 0, status;
    fn fremovexattr(fd: c_int, name: Str) -> c_int => O::Removexattr, T::Fd(fd), E::None, 0, status;
}

/// A metadata call returning a length (`readlink`, `getxattr`): negative = failure,
/// and the length is not data traffic.
fn failed_if_negative(result: &ssize_t) -> Account {
    Account {
        failed: *result < 0,
        bytes: 0,
    }
}

/// `fcntl` commands that take or query a lock reach the file system's lock manager;
/// the others only touch the descriptor.
fn fcntl_op(cmd: c_int) -> Option<Op> {
    matches!(
        cmd,
        libc::F_GETLK
            | libc::F_SETLK
            | libc::F_SETLKW
            | libc::F_OFD_GETLK
            | libc::F_OFD_SETLK
            | libc::F_OFD_SETLKW
    )
    .then_some(Op::Lock)
}

extern "C" {
    /// glibc: bytes in a stream's output buffer (reads two pointers; no lock).
    fn __fpending(stream: Stream) -> size_t;
    /// glibc: a stream's end-of-file flag (reads it; no lock).
    fn feof_unlocked(stream: Stream) -> c_int;
}

/// `fflush` is a write only when the stream has output waiting: shells call it after
/// every builtin with nothing buffered. Its bytes were counted by the `fputs`/`fwrite`
/// that buffered them (bytes `printf` buffered are not seen). `fflush(NULL)` flushes
/// every stream and is not attributed to any.
///
/// # Safety
/// `stream` is null or a stream the application passed to `fflush` (open, as the call
/// requires).
unsafe fn flush_op(stream: Stream) -> Option<Op> {
    // SAFETY: the application's non-null stream, valid for the duration of the hook.
    (!stream.is_null() && unsafe { __fpending(stream) } > 0).then_some(Op::Write)
}

/// `getline`/`getdelim`: -1 at the end of the stream is no failure (as for `fgets`);
/// any other -1 is.
fn delimited(stream: Stream) -> impl FnOnce(&ssize_t) -> Account {
    move |result| Account {
        // SAFETY: the application's stream, which the call just read (and so is open);
        // `feof_unlocked` reads one flag.
        failed: *result < 0 && unsafe { feof_unlocked(stream) } == 0,
        bytes: (*result).max(0) as u64,
    }
}

/// The exported `remove`, as glibc's: `unlink`, then `rmdir` if the path is a directory
/// (`EISDIR`), each through its own hook, so that removing a directory is counted (and
/// limited) as the `rmdir` it is, beside the refused `unlink` the file system saw too.
///
/// # Safety
/// The contract of libc's `remove`.
#[no_mangle]
pub unsafe extern "C" fn remove(path: Str) -> c_int {
    // SAFETY: the application's argument, passed on as `remove` does.
    unsafe {
        if unlink(path) == 0 {
            0
        } else if crate::errno::get() != libc::EISDIR {
            -1
        } else if rmdir(path) == 0 {
            0
        } else {
            -1
        }
    }
}

fn unlinkat_op(flags: c_int) -> Op {
    if flags & libc::AT_REMOVEDIR != 0 {
        Op::Rmdir
    } else {
        Op::Unlink
    }
}

/// `freopen(NULL, mode, stream)` reopens the stream's own file.
fn reopen_target(path: Str, stream: Stream) -> Target {
    if path.is_null() {
        Target::Stream(stream)
    } else {
        Target::Path(path)
    }
}

/// Total length of an iovec array (bounded by `IOV_MAX`, like the kernel).
///
/// # Safety
/// `iov` is [`unreadable`](crate::call::unreadable) or the application's iovec array
/// of `count` entries.
unsafe fn iov_bytes(iov: Iov, count: c_int) -> u64 {
    if crate::call::unreadable(iov) || !(0..=libc::UIO_MAXIOV).contains(&count) {
        return 0;
    }
    // SAFETY: the application's iovec array of `count` entries (0..=IOV_MAX),
    // which the real call reads too; valid for the duration of the hook.
    unsafe { std::slice::from_raw_parts(iov, count as usize) }
        .iter()
        .fold(0u64, |sum, v| sum.saturating_add(v.iov_len as u64))
}

/// Length of a C string, 0 for null.
///
/// # Safety
/// `s` is null or the application's NUL-terminated string.
unsafe fn c_strlen(s: Str) -> usize {
    if s.is_null() {
        0
    } else {
        // SAFETY: the application's non-null string argument (`fputs`), NUL-terminated
        // as the real call requires, valid for the duration of the hook.
        unsafe { libc::strlen(s) }
    }
}

/// The descriptor of an AIO request, -1 for null.
///
/// # Safety
/// `cb` is null or the application's control block.
unsafe fn aio_fd(cb: Aio) -> c_int {
    if cb.is_null() {
        -1
    } else {
        // SAFETY: the application's non-null control block, which the real call reads
        // too; valid for the duration of the hook.
        unsafe { (*cb).aio_fildes }
    }
}

/// The length of an AIO request, 0 for null.
///
/// # Safety
/// `cb` is null or the application's control block.
unsafe fn aio_len(cb: Aio) -> usize {
    if cb.is_null() {
        0
    } else {
        // SAFETY: the application's non-null control block, which the real call reads
        // too; valid for the duration of the hook.
        unsafe { (*cb).aio_nbytes }
    }
}

// ---- hand-written hooks: calls that must never reach `dlsym`, and list submissions ------

/// A real function whose hook is written by hand below.
pub(crate) struct HandReal(pub(crate) Real);

static MMAP: HandReal = HandReal(Real::new(c"mmap"));
static MMAP64: HandReal = HandReal(Real::new(c"mmap64"));
static LIO_LISTIO: HandReal = HandReal(Real::new(c"lio_listio"));
static LIO_LISTIO64: HandReal = HandReal(Real::new(c"lio_listio64"));
static EXIT: HandReal = HandReal(Real::new(c"_exit"));
static EXIT_UPPER: HandReal = HandReal(Real::new(c"_Exit"));

type MmapFn = unsafe extern "C" fn(Buf, size_t, c_int, c_int, c_int, off_t) -> Buf;

/// Calls the real `mmap`, or the raw system call when it is not resolved yet (an
/// allocator mapping memory before our constructor ran must not enter `dlsym`).
///
/// # Safety
/// `real` is `mmap`'s or `mmap64`'s entry, and the arguments are the application's
/// (the contract of `mmap`).
unsafe fn real_mmap(
    real: &Real,
    addr: Buf,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> Buf {
    match real.resolved() {
        // SAFETY: the address is libc's `mmap`/`mmap64` (resolved by name; both have
        // this signature on 64-bit Linux), called with the application's arguments.
        Some(address) => unsafe {
            std::mem::transmute::<*mut c_void, MmapFn>(address)(addr, len, prot, flags, fd, offset)
        },
        // SAFETY: the raw system call with the application's arguments, as libc's
        // `mmap` would make it.
        None => unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, offset) as Buf },
    }
}

/// The body of the `mmap` hooks.
///
/// # Safety
/// As for [`real_mmap`].
unsafe fn hooked_mmap(
    real: &Real,
    addr: Buf,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> Buf {
    if fd < 0 || flags & libc::MAP_ANONYMOUS != 0 {
        // SAFETY: our caller's contract (`mmap`'s entry, the application's arguments).
        return unsafe { real_mmap(real, addr, len, prot, flags, fd, offset) };
    }
    // Counted, not throttled per page: a byte channel is charged nothing here.
    // SAFETY: the target is a plain descriptor (no pointer), and the closure calls the
    // real `mmap` with the application's arguments, unchanged.
    unsafe {
        intercept(
            Call {
                op: Some(Op::Mmap),
                target: Target::Fd(fd),
                effect: Effect::None,
                requested: 0,
            },
            mapped(len),
            || real_mmap(real, addr, len, prot, flags, fd, offset),
        )
    }
}

/// The exported `mmap` hook.
///
/// # Safety
/// The contract of libc's `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: Buf,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> Buf {
    // SAFETY: `mmap`'s own entry and the application's arguments, unchanged.
    unsafe { hooked_mmap(&MMAP.0, addr, len, prot, flags, fd, offset) }
}

/// The exported `mmap64` hook.
///
/// # Safety
/// The contract of libc's `mmap64`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: Buf,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off64_t,
) -> Buf {
    // SAFETY: `mmap64`'s own entry and the application's arguments, unchanged.
    unsafe { hooked_mmap(&MMAP64.0, addr, len, prot, flags, fd, offset) }
}

type LioFn = unsafe extern "C" fn(c_int, *const Aio, c_int, *mut libc::sigevent) -> c_int;

/// The body of the `lio_listio` hooks: admits each read and write in the list, then
/// submits it.
///
/// # Safety
/// `real` is `lio_listio`'s or `lio_listio64`'s entry, and the arguments are the
/// application's (the contract of `lio_listio`: `list` holds `count` pointers, each
/// null or a valid control block).
unsafe fn hooked_lio_listio(
    real: &Real,
    mode: c_int,
    list: *const Aio,
    count: c_int,
    event: *mut libc::sigevent,
) -> c_int {
    if !list.is_null() && count > 0 {
        // SAFETY: the application's non-null list of `count` (> 0) entries, which the
        // real call reads too; valid for the duration of the hook.
        for &cb in unsafe { std::slice::from_raw_parts(list, count as usize) } {
            if cb.is_null() {
                continue;
            }
            // SAFETY: a non-null control block of the application's list, which the
            // real call reads too; valid for the duration of the hook.
            let op = match unsafe { (*cb).aio_lio_opcode } {
                libc::LIO_READ => Op::Read,
                libc::LIO_WRITE => Op::Write,
                _ => continue,
            };
            // SAFETY: `cb` as above; the target is a plain descriptor (no pointer).
            unsafe { admit_only(op, Target::Fd((*cb).aio_fildes), (*cb).aio_nbytes as u64) };
        }
    }
    match real.address() {
        // SAFETY: the address is libc's `lio_listio`/`lio_listio64` (resolved by name;
        // both have this signature), called with the application's arguments.
        Some(address) => unsafe {
            std::mem::transmute::<*mut c_void, LioFn>(address)(mode, list, count, event)
        },
        None => c_int::unavailable(),
    }
}

/// The exported `lio_listio` hook.
///
/// # Safety
/// The contract of libc's `lio_listio`.
#[no_mangle]
pub unsafe extern "C" fn lio_listio(
    mode: c_int,
    list: *const Aio,
    count: c_int,
    event: *mut libc::sigevent,
) -> c_int {
    // SAFETY: `lio_listio`'s own entry and the application's arguments, unchanged.
    unsafe { hooked_lio_listio(&LIO_LISTIO.0, mode, list, count, event) }
}

/// The exported `lio_listio64` hook.
///
/// # Safety
/// The contract of libc's `lio_listio64`.
#[no_mangle]
pub unsafe extern "C" fn lio_listio64(
    mode: c_int,
    list: *const Aio,
    count: c_int,
    event: *mut libc::sigevent,
) -> c_int {
    // SAFETY: `lio_listio64`'s own entry and the application's arguments, unchanged.
    unsafe { hooked_lio_listio(&LIO_LISTIO64.0, mode, list, count, event) }
}

/// The body of the `_exit` hooks: a process ending without its destructors still
/// leaves its job ([`crate::leave_job_without_destructors`]), then ends as libc's
/// `_exit` ends it (or by the raw system call, before the constructor ran).
///
/// # Safety
/// `real` is `_exit`'s or `_Exit`'s entry.
unsafe fn hooked_exit(real: &Real, status: c_int) -> ! {
    let _ = std::panic::catch_unwind(crate::leave_job_without_destructors);
    if let Some(address) = real.resolved() {
        // SAFETY: the address is libc's `_exit`/`_Exit` (resolved by name), which has
        // this signature.
        unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> !>(address)(status)
        }
    }
    loop {
        // SAFETY: ends the process, as libc's `_exit` does.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// The exported `_exit` hook.
///
/// # Safety
/// The contract of libc's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    // SAFETY: `_exit`'s own entry.
    unsafe { hooked_exit(&EXIT.0, status) }
}

/// The exported `_Exit` hook.
///
/// # Safety
/// The contract of libc's `_Exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: `_Exit`'s own entry.
    unsafe { hooked_exit(&EXIT_UPPER.0, status) }
}

// ---- versioned entry points ---------------------------------------------------------------
//
// glibc keeps a function's old behaviour under its first symbol version for programs
// linked before the change: `glob` before 2.27 calls `gl_stat` where the new one calls
// `gl_lstat`, which old programs using `GLOB_ALTDIRFUNC` may leave unset (the new one
// then crashes them); `realpath` before 2.3 refuses a null buffer. An unversioned hook
// binds both kinds of callers and would take them all to the default version, so on
// x86-64 the library exports these under both versions (the version nodes are in the
// version script `build.rs` writes): the table's hook as the default version, and the
// hook below as the old one, calling libc's old function.

/// The real functions behind the old-version hooks, resolved with the table's.
#[cfg(target_arch = "x86_64")]
pub(crate) static OLD_VERSIONS: &[&Real] = &[&GLOB_2_2_5.0, &GLOB64_2_2_5.0, &REALPATH_2_2_5.0];
#[cfg(not(target_arch = "x86_64"))]
pub(crate) static OLD_VERSIONS: &[&Real] = &[];

#[cfg(target_arch = "x86_64")]
static GLOB_2_2_5: HandReal = HandReal(Real::versioned(c"glob", c"GLIBC_2.2.5"));
#[cfg(target_arch = "x86_64")]
static GLOB64_2_2_5: HandReal = HandReal(Real::versioned(c"glob64", c"GLIBC_2.2.5"));
#[cfg(target_arch = "x86_64")]
static REALPATH_2_2_5: HandReal = HandReal(Real::versioned(c"realpath", c"GLIBC_2.2.5"));

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".symver glob, glob@@GLIBC_2.27",
    ".symver padll_glob_2_2_5, glob@GLIBC_2.2.5",
    ".symver glob64, glob64@@GLIBC_2.27",
    ".symver padll_glob64_2_2_5, glob64@GLIBC_2.2.5",
    ".symver realpath, realpath@@GLIBC_2.3",
    ".symver padll_realpath_2_2_5, realpath@GLIBC_2.2.5",
);

type GlobFn = unsafe extern "C" fn(Str, c_int, ConstBuf, Buf) -> c_int;

/// A `glob` of the old version: the table's accounting, libc's old function.
///
/// # Safety
/// `real` is an old version of `glob` or `glob64`; the arguments are the application's.
#[cfg(target_arch = "x86_64")]
unsafe fn old_glob(
    real: &Real,
    pattern: Str,
    flags: c_int,
    on_error: ConstBuf,
    found: Buf,
) -> c_int {
    let call = Call {
        op: Some(Op::Readdir),
        target: Target::Path(pattern),
        effect: Effect::None,
        requested: 0,
    };
    // SAFETY: the application's pattern (the target), and the closure calls libc's
    // function of this signature with the application's arguments, unchanged.
    unsafe {
        intercept(call, error_number, || match real.address() {
            Some(address) => {
                std::mem::transmute::<*mut c_void, GlobFn>(address)(pattern, flags, on_error, found)
            }
            None => c_int::unavailable(),
        })
    }
}

/// `glob@GLIBC_2.2.5`.
///
/// # Safety
/// The contract of libc's `glob`.
#[cfg(target_arch = "x86_64")]
#[no_mangle]
pub unsafe extern "C" fn padll_glob_2_2_5(
    pattern: Str,
    flags: c_int,
    on_error: ConstBuf,
    found: Buf,
) -> c_int {
    // SAFETY: the old `glob` and the application's arguments, unchanged.
    unsafe { old_glob(&GLOB_2_2_5.0, pattern, flags, on_error, found) }
}

/// `glob64@GLIBC_2.2.5`.
///
/// # Safety
/// The contract of libc's `glob64`.
#[cfg(target_arch = "x86_64")]
#[no_mangle]
pub unsafe extern "C" fn padll_glob64_2_2_5(
    pattern: Str,
    flags: c_int,
    on_error: ConstBuf,
    found: Buf,
) -> c_int {
    // SAFETY: the old `glob64` and the application's arguments, unchanged.
    unsafe { old_glob(&GLOB64_2_2_5.0, pattern, flags, on_error, found) }
}

type RealpathFn = unsafe extern "C" fn(Str, MutStr) -> MutStr;

/// `realpath@GLIBC_2.2.5`: the table's accounting, libc's old function.
///
/// # Safety
/// The contract of libc's `realpath`.
#[cfg(target_arch = "x86_64")]
#[no_mangle]
pub unsafe extern "C" fn padll_realpath_2_2_5(path: Str, resolved: MutStr) -> MutStr {
    let call = Call {
        op: Some(Op::Getattr),
        target: Target::Path(path),
        effect: Effect::None,
        requested: 0,
    };
    // SAFETY: the application's path (the target), and the closure calls libc's old
    // `realpath` with the application's arguments, unchanged.
    unsafe {
        intercept(call, handle, || match REALPATH_2_2_5.0.address() {
            Some(address) => {
                std::mem::transmute::<*mut c_void, RealpathFn>(address)(path, resolved)
            }
            None => MutStr::unavailable(),
        })
    }
}
