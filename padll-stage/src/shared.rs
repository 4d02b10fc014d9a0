//! Job-wide limits on a node: the buckets of the configured limits live in a segment of
//! shared memory that every process of the job on this node maps, so a limit binds the
//! job's processes together — MPI ranks, children, processes the batch script starts
//! later — instead of each process alone.
//!
//! **The segment** is the file `segment-<job>` in the uid's own directory
//! `/dev/shm/padll/<uid>/` when a root component made it, where no other user can put
//! anything, else `/dev/shm/padll-<uid>-<job>` (`padll_wire::node_files`). It is created
//! `0600` and checked on every attach: a regular file owned by this uid, private, of the expected size, with
//! the expected magic and layout version. Its blocks are reserved with `posix_fallocate`
//! when it is made, so a full `/dev/shm` fails the attach instead of a later store through
//! the mapping (`SIGBUS`). Each entry is a GCRA [`TokenBucket`] keyed by its limit
//! (mountpoint, selector, unit, rate, burst, costs): processes configured with the same limit
//! share a bucket, a process given a different limit gets a bucket of its own. A bucket's
//! whole state is atomics in the segment, its clock origin included (`CLOCK_MONOTONIC`
//! is one clock for every process of the node), and GCRA moves it with one CAS, so a
//! process that dies in the middle of a call leaves nothing half-written.
//!
//! **Who is attached** is kept by the kernel, with open-file-description (OFD) locks:
//! attaching holds an exclusive lock on byte 0 (so attaches are serialised); every
//! attached process holds a shared lock on byte 1 through its descriptor (close-on-exec;
//! a forked child takes its own, see [`after_fork_in_child`]). A process that can take
//! byte 1 exclusively is alone: the segment is left over from a finished job (or from a
//! reused job id), so its buckets are reset — a stale debt never delays a new job. The
//! last process to leave removes the file ([`leave`]); a job whose last process was
//! killed leaves it for the next job with the same id to reset.
//!
//! Anything unexpected (another owner, a group- or world-accessible mode, a wrong size or
//! magic while other processes use it, no `/dev/shm`) makes [`attach`] fail with a
//! message; the caller then keeps per-process buckets, each at a share of the limit
//! (`install_limits` in `lib.rs`), and says so in one line.

use crate::bucket::{Limit, TokenBucket};
use crate::stage_fds::{self, Identity, Slot};
use padll_wire::channel::ChannelSpec;
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// "PADLLJOB", little-endian.
const MAGIC: u64 = u64::from_le_bytes(*b"PADLLJOB");
/// Bumped whenever [`Segment`]'s layout changes.
const LAYOUT_VERSION: u64 = 1;
/// Distinct limits one job can hold on a node.
const ENTRIES: usize = 256;
/// How long an attach waits for another process' attach to finish.
const ATTACH_PATIENCE_MS: u32 = 2_000;
/// How long a process leaving waits for another's attach or leave to finish.
const LEAVE_PATIENCE_MS: u32 = 200;

/// The segment's layout. Plain atomics only: any process may read or write any field
/// at any time.
#[repr(C)]
struct Segment {
    magic: AtomicU64,
    version: AtomicU64,
    entries: AtomicU64,
    _pad: [u64; 13],
    entry: [Entry; ENTRIES],
}

/// One shared bucket: `key` is its limit's hash (never 0); 0 = free.
#[repr(C, align(128))]
struct Entry {
    key: AtomicU64,
    bucket: TokenBucket,
}

const SEGMENT_BYTES: usize = std::mem::size_of::<Segment>();

/// The attached segment: its descriptor (holding our byte-1 lock) and mapping.
struct Attached {
    path: CString,
    segment: &'static Segment,
}

/// Why the job's segment cannot be used: its path, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {kind}")]
pub struct SegmentError {
    /// The segment's path.
    pub path: String,
    /// What is wrong.
    pub kind: SegmentErrorKind,
}

/// What is wrong with the job's segment (see [`SegmentError`]).
#[derive(Debug, thiserror::Error)]
pub enum SegmentErrorKind {
    /// It cannot be opened or created.
    #[error("cannot open: {0}")]
    Open(std::io::Error),
    /// Removed and recreated under us at every try.
    #[error("it keeps being removed and recreated while attaching")]
    KeepsChanging,
    /// Not a file only the job's user can use: another user could change its buckets.
    #[error("{0}; not shared")]
    NotPrivate(#[from] NotPrivate),
    /// Its space cannot be reserved.
    #[error(
        "cannot reserve {SEGMENT_BYTES} bytes (is {} full?)",
        padll_wire::node_files::DIRECTORY
    )]
    Reserve,
    /// In use with another size.
    #[error("in use with {0} bytes, expected {SEGMENT_BYTES} (truncated or another version)")]
    Size(usize),
    /// In use with a header that is not this version's.
    #[error("in use but its header is not PADLL's (corrupt or another version)")]
    Header,
    /// Its shared lock cannot be taken.
    #[error("cannot hold it shared")]
    HoldShared,
    /// `mmap` failed.
    #[error("cannot map: {0}")]
    Map(std::io::Error),
    /// Every entry holds a limit.
    #[error("holds {ENTRIES} limits already")]
    Full,
    /// Another process held the attach lock for this many milliseconds.
    #[error("another process has held its attach lock for {0} ms")]
    LockHeld(u32),
    /// `fstat` failed.
    #[error("cannot stat: {0}")]
    Stat(std::io::Error),
    /// The program closed or replaced our descriptor of it, and it cannot be reopened
    /// (removed meanwhile).
    #[error("its descriptor was closed or replaced by the program, and it cannot be reopened")]
    Lost,
}

/// Why a file in `/dev/shm` (world-writable: anyone may plant one under a job's name)
/// is not the job's own.
#[derive(Debug, thiserror::Error)]
pub enum NotPrivate {
    /// A directory, FIFO, device…
    #[error("not a regular file")]
    NotRegular,
    /// Another user's file.
    #[error("owned by uid {found}, not by this job's uid {expected}")]
    Owner {
        /// Its owner.
        found: u32,
        /// The job's uid.
        expected: u32,
    },
    /// Open to others.
    #[error("mode {0:o} lets others in (expected 600)")]
    Mode(u32),
}

/// Whether a file of `mode` owned by `owner` is a regular file only `uid` can use.
pub(crate) fn check_private(mode: u32, owner: u32, uid: u32) -> Result<(), NotPrivate> {
    if mode & libc::S_IFMT != libc::S_IFREG {
        return Err(NotPrivate::NotRegular);
    }
    if owner != uid {
        return Err(NotPrivate::Owner {
            found: owner,
            expected: uid,
        });
    }
    if mode & 0o077 != 0 {
        return Err(NotPrivate::Mode(mode & 0o777));
    }
    Ok(())
}

static ATTACHED: OnceLock<Attached> = OnceLock::new();
/// The descriptor holding this process' lock (none before attaching and after
/// leaving) and the segment's identity; replaced in a forked child, and when the
/// program took it ([`lock_fd`]).
static LOCK: Slot = Slot::empty();

/// Maps this job's segment on the node (creating or resetting it as needed) and returns
/// the shared bucket of each limit in `specs`, in order. Buckets new to the segment are
/// configured (full); existing ones are joined as they are.
pub fn attach(
    uid: u32,
    job: &str,
    specs: &[ChannelSpec],
) -> Result<Vec<&'static TokenBucket>, SegmentError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(attached) = ATTACHED.get() {
        // Attached already (for the configured limits): claim these under byte 0 too.
        let error = |kind| SegmentError {
            path: attached.path.to_string_lossy().into_owned(),
            kind,
        };
        let fd = lock_fd(attached)
            .ok_or(SegmentErrorKind::Lost)
            .map_err(error)?;
        wait_for_lock(fd, 0, ATTACH_PATIENCE_MS).map_err(error)?;
        let buckets = claim(attached.segment, specs).map_err(error);
        unlock(fd, 0);
        return buckets;
    }
    open_and(uid, job, |segment| claim(segment, specs))
}

/// Counts this process among the job's on the node (attaches to its segment, without
/// claiming buckets), so that [`leave`] tells whether it is the last: for a job whose
/// files on the node go with its last process, even when it has no limits to share.
pub fn join(uid: u32, job: &str) -> Result<(), SegmentError> {
    if ATTACHED.get().is_some() {
        return Ok(());
    }
    open_and(uid, job, |_| Ok(()))
}

/// Opens and attaches the job's segment, doing `with` under byte 0.
fn open_and<T>(
    uid: u32,
    job: &str,
    with: impl FnOnce(&'static Segment) -> Result<T, SegmentErrorKind>,
) -> Result<T, SegmentError> {
    let path = segment_path(uid, job);
    let error = |kind| SegmentError {
        path: path.to_string_lossy().into_owned(),
        kind,
    };
    let attached = open_segment(&path, uid).map_err(error)?;
    let done = with(attached.segment).map_err(error);
    // Only while the number is still ours (invariant 14): the program's threads run
    // while the control thread attaches.
    if let Some((fd, identity)) = LOCK.get() {
        if identity.holds(fd) {
            unlock(fd, 0);
        }
    }
    let done = done?;
    let _ = ATTACHED.set(attached);
    Ok(done)
}

/// The shared bucket of each limit in `specs`, in order (byte 0 held).
fn claim(
    segment: &'static Segment,
    specs: &[ChannelSpec],
) -> Result<Vec<&'static TokenBucket>, SegmentErrorKind> {
    specs.iter().map(|spec| segment.bucket_for(spec)).collect()
}

/// The job's segment (`padll_wire::node_files::segment`: where it is now), for the raw
/// calls.
fn segment_path(uid: u32, job: &str) -> CString {
    CString::new(padll_wire::node_files::segment(uid, job)).expect("no NUL in a job file's name")
}

/// Opens, checks, locks and maps the segment. On success byte 0 is still locked
/// (exclusive, released by the caller once its buckets are claimed) and byte 1 is held
/// shared for the life of the descriptor.
fn open_segment(path: &CString, uid: u32) -> Result<Attached, SegmentErrorKind> {
    // A file removed by its last user between our open and our lock is not the
    // segment any more: start again (twice at most; a third race is no accident).
    for _ in 0..3 {
        // SAFETY: NUL-terminated path; O_NONBLOCK so a FIFO planted here cannot hang us.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR
                    | libc::O_CREAT
                    | libc::O_NOFOLLOW
                    | libc::O_CLOEXEC
                    | libc::O_NONBLOCK,
                0o600,
            )
        };
        if fd < 0 {
            return Err(SegmentErrorKind::Open(std::io::Error::last_os_error()));
        }
        match lock_and_map(fd, path, uid) {
            Ok(Some(segment)) => {
                // Out of the program's way (the locks belong to the open file
                // description, which the copy keeps).
                let fd = stage_fds::move_high(fd);
                let Some(identity) = Identity::of(fd) else {
                    close(fd);
                    return Err(SegmentErrorKind::Stat(std::io::Error::last_os_error()));
                };
                LOCK.store(fd, identity);
                return Ok(Attached {
                    path: path.clone(),
                    segment,
                });
            }
            Ok(None) => close(fd),
            Err(e) => {
                close(fd);
                return Err(e);
            }
        }
    }
    Err(SegmentErrorKind::KeepsChanging)
}

/// `Ok(None)`: the file at `path` is no longer `fd`'s (removed meanwhile); retry.
fn lock_and_map(
    fd: i32,
    path: &CString,
    uid: u32,
) -> Result<Option<&'static Segment>, SegmentErrorKind> {
    let meta = fstat(fd)?;
    check_private(meta.st_mode, meta.st_uid, uid)?;
    wait_for_lock(fd, 0, ATTACH_PATIENCE_MS)?;
    // SAFETY: NUL-terminated path, valid out-pointer.
    let current = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::stat(path.as_ptr(), &mut st) == 0).then_some(st)
    };
    if !current.is_some_and(|st| st.st_dev == meta.st_dev && st.st_ino == meta.st_ino) {
        unlock(fd, 0);
        return Ok(None);
    }
    let result = map_locked(fd);
    if result.is_err() {
        unlock(fd, 0);
    }
    result.map(Some)
}

/// With byte 0 held: join the segment, or (re)make it when no one else is attached.
fn map_locked(fd: i32) -> Result<&'static Segment, SegmentErrorKind> {
    let alone = lock(fd, 1, libc::F_WRLCK);
    let size = fstat(fd)?.st_size as usize;
    if alone {
        if size != SEGMENT_BYTES {
            // New, or left truncated or resized: make it afresh.
            // SAFETY: our descriptor; sizes are the segment's.
            let made = unsafe {
                libc::ftruncate(fd, 0) == 0
                    && libc::posix_fallocate(fd, 0, SEGMENT_BYTES as libc::off_t) == 0
            };
            if !made {
                return Err(SegmentErrorKind::Reserve);
            }
        }
        let segment = map(fd)?;
        segment.reset();
        // Downgrade to shared: atomic for OFD locks, and byte 0 keeps attaches out.
        lock(fd, 1, libc::F_RDLCK);
        return Ok(segment);
    }
    if size != SEGMENT_BYTES {
        return Err(SegmentErrorKind::Size(size));
    }
    let segment = map(fd)?;
    if !segment.is_valid() {
        return Err(SegmentErrorKind::Header);
    }
    if !lock(fd, 1, libc::F_RDLCK) {
        return Err(SegmentErrorKind::HoldShared);
    }
    Ok(segment)
}

fn map(fd: i32) -> Result<&'static Segment, SegmentErrorKind> {
    // SAFETY: a shared mapping of our descriptor, never unmapped (it lives as long as
    // the process, and its buckets are referenced from the channel table).
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SEGMENT_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(SegmentErrorKind::Map(std::io::Error::last_os_error()));
    }
    // SAFETY: page-aligned, SEGMENT_BYTES long, and Segment is atomics only (any bit
    // pattern is a valid value).
    Ok(unsafe { &*base.cast::<Segment>() })
}

impl Segment {
    fn is_valid(&self) -> bool {
        self.magic.load(Ordering::Acquire) == MAGIC
            && self.version.load(Ordering::Relaxed) == LAYOUT_VERSION
            && self.entries.load(Ordering::Relaxed) == ENTRIES as u64
    }

    /// Empties every entry and writes the header (magic last). Only while alone.
    fn reset(&self) {
        self.magic.store(0, Ordering::Release);
        for entry in &self.entry {
            entry.key.store(0, Ordering::Relaxed);
            entry.bucket.clear();
        }
        self.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        self.entries.store(ENTRIES as u64, Ordering::Relaxed);
        self.magic.store(MAGIC, Ordering::Release);
    }

    /// The entry for `spec`, claimed and configured if new. Byte 0 is held, so no one
    /// else claims meanwhile. Open addressing from the key's hash: after a reset the
    /// same limit lands on the same entry.
    fn bucket_for(
        &'static self,
        spec: &ChannelSpec,
    ) -> Result<&'static TokenBucket, SegmentErrorKind> {
        let key = limit_key(spec);
        let home = key as usize % ENTRIES;
        for probe in 0..ENTRIES {
            let entry = &self.entry[(home + probe) % ENTRIES];
            match entry.key.load(Ordering::Acquire) {
                k if k == key => return Ok(&entry.bucket),
                0 => {
                    entry.bucket.configure(Limit::of(spec));
                    entry.key.store(key, Ordering::Release);
                    return Ok(&entry.bucket);
                }
                _ => {}
            }
        }
        Err(SegmentErrorKind::Full)
    }
}

/// A limit's identity in the segment (never 0). A weighted limit's costs are part of it:
/// its bucket counts thousandths of a token, and requests are charged by them, so
/// processes given other costs (or none) must not share it. Without costs, the key is
/// what it was before weights existed.
fn limit_key(spec: &ChannelSpec) -> u64 {
    let mut text = format!(
        "{}|{}|{:?}|{}|{}",
        spec.mount.as_deref().unwrap_or(""),
        spec.scope.name(),
        spec.unit,
        spec.rate,
        spec.burst
    );
    for (op, cost) in spec.costs.iter() {
        text.push_str(&format!("|{op}={cost}"));
    }
    padll_wire::fnv1a(text.as_bytes()) | 1
}

/// The descriptor holding this process' lock, checked to be still ours (the
/// segment's identity), for claiming buckets under byte 0. When the program closed or
/// replaced it (`closefrom(3)`, `exec N>log`), it is forgotten without being closed and
/// the segment reopened by its path, if it is still the file we mapped. `None` before
/// attaching, after [`leave`], or when the segment cannot be reopened.
///
/// The process stays counted as attached all the same: the mapping keeps the open file
/// description it was made from, with its lock on byte 1, until the process ends.
fn lock_fd(attached: &Attached) -> Option<i32> {
    let (fd, identity) = LOCK.get()?;
    if identity.holds(fd) {
        return Some(fd);
    }
    // The number is the program's now: forget it (only ours to change).
    LOCK.take();
    // SAFETY: NUL-terminated path alive across the call; raw syscalls bypass the hooks.
    // O_NONBLOCK: a FIFO planted meanwhile cannot hang us.
    let own = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            attached.path.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    } as i32;
    if own < 0 {
        return None;
    }
    if !identity.holds(own) {
        // Removed and made anew by another job's process: not ours to claim in.
        close(own);
        return None;
    }
    let own = stage_fds::move_high(own);
    LOCK.store(own, identity);
    Some(own)
}

/// In a forked child: take a lock of our own (a new open file description of the same
/// file), so the parent leaving first never sees the segment unused while the child
/// still uses it. The inherited descriptor is used (reopened through `/proc/self/fd`,
/// then closed) only if it is still the segment: a program that put a file of its own
/// on its number keeps it in every child. Such a child takes no lock of its own (and so
/// never removes the segment): the mapping it inherited keeps the parent's lock, so it
/// counts as attached while it lives. Raw system calls only: this runs in the `fork`
/// handler (one thread).
pub fn after_fork_in_child() {
    let Some((inherited, identity)) = LOCK.get() else {
        return;
    };
    if !identity.holds(inherited) {
        // The program's descriptor now: left alone.
        LOCK.take();
        return;
    }
    let link = crate::fdtable::proc_self_fd(inherited);
    // SAFETY: NUL-terminated name; raw syscalls are async-signal-safe and bypass hooks.
    let own = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            link.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC,
        )
    } as i32;
    if own >= 0 && identity.holds(own) && lock(own, 1, libc::F_RDLCK) {
        // Our copy of the parent's descriptor: closing it leaves the parent's lock
        // (checked above; the child has one thread, nothing changed it since).
        stage_fds::close_if_ours(inherited, identity);
        LOCK.store(stage_fds::move_high(own), identity);
    } else if own >= 0 {
        // SAFETY: the descriptor we just opened.
        unsafe { libc::syscall(libc::SYS_close, own) };
    }
}

/// At exit: the last process attached removes the segment (while holding byte 0, so no
/// attach is half-way) and says so (`true`). Waits at most [`LEAVE_PATIENCE_MS`] for
/// byte 0: processes of a job often end together, and each must see whether it is the
/// last.
///
/// Its descriptor is checked first: one the program closed or replaced (its number may
/// now be the program's file) is forgotten, never locked or closed, and the segment is
/// left as it is. This process cannot tell whether it is the last then (its mapping
/// holds its lock until it ends): the job's other processes go on using the segment,
/// and if none is left, the next job with the same id resets it or the epilog removes
/// it.
///
/// Once only (a second leave could remove a segment the job made anew meanwhile), and
/// with atomics and raw system calls only: it may run in `_exit`, in a signal handler.
pub fn leave() -> bool {
    // Taken out: no second leave, and no fork handler takes a lock of its own after it.
    let (Some(attached), Some((fd, identity))) = (ATTACHED.get(), LOCK.take()) else {
        return false;
    };
    if !identity.holds(fd) || wait_for_lock(fd, 0, LEAVE_PATIENCE_MS).is_err() {
        return false;
    }
    let last = lock(fd, 1, libc::F_WRLCK);
    if last {
        // SAFETY: `attached.path` is the segment's NUL-terminated CString, alive across the
        // call; a raw call, no hook.
        unsafe {
            libc::syscall(
                libc::SYS_unlinkat,
                libc::AT_FDCWD,
                attached.path.as_ptr(),
                0,
            )
        };
    }
    // Not the last: stop counting as attached now, so that whichever process of the
    // job leaves last sees it is (our descriptor closes only after the destructors).
    unlock(fd, 1);
    unlock(fd, 0);
    last
}

/// Tries an OFD lock of `kind` on byte `byte`; true if held.
fn lock(fd: i32, byte: i64, kind: i32) -> bool {
    // SAFETY: flock is plain data; all-zero is a valid value.
    let mut request: libc::flock = unsafe { std::mem::zeroed() };
    request.l_type = kind as i16;
    request.l_whence = libc::SEEK_SET as i16;
    request.l_start = byte;
    request.l_len = 1;
    // SAFETY: a valid flock for F_OFD_SETLK (l_pid must be 0); raw syscall, no hook.
    unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_OFD_SETLK, &request) == 0 }
}

fn unlock(fd: i32, byte: i64) {
    if fd >= 0 {
        lock(fd, byte, libc::F_UNLCK);
    }
}

/// Takes byte `byte` exclusively, waiting (in 1 ms steps, at most `patience_ms`) for
/// another process' attach or leave to end.
fn wait_for_lock(fd: i32, byte: i64, patience_ms: u32) -> Result<(), SegmentErrorKind> {
    for _ in 0..patience_ms {
        if lock(fd, byte, libc::F_WRLCK) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(SegmentErrorKind::LockHeld(patience_ms))
}

fn fstat(fd: i32) -> Result<libc::stat, SegmentErrorKind> {
    // SAFETY: an all-zero `stat` is valid plain data, and `st` is a valid out-pointer of its
    // size; fstat on a bad descriptor only fails.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) == 0 {
            Ok(st)
        } else {
            Err(SegmentErrorKind::Stat(std::io::Error::last_os_error()))
        }
    }
}

fn close(fd: i32) {
    // SAFETY: a descriptor we opened.
    unsafe { libc::close(fd) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use padll_wire::channel::{Costs, Scope, Unit};
    use padll_wire::ops::{Class, Op};

    /// A metadata limit of 300 tokens/s with a burst of 3.
    fn plain() -> ChannelSpec {
        ChannelSpec {
            mount: Some("/scratch".into()),
            scope: Scope::Class(Class::Metadata),
            rate: 300,
            unit: Unit::Requests,
            burst: 3,
            costs: Default::default(),
        }
    }

    /// [`plain`] with an open costing `open` thousandths of a token.
    fn weighted(open: u32) -> ChannelSpec {
        ChannelSpec {
            costs: Costs::new([(Op::Open, open), (Op::Close, 0)]).unwrap(),
            ..plain()
        }
    }

    #[test]
    fn limits_of_other_costs_do_not_share_a_bucket() {
        let plain = plain();
        // Without costs the key is the one stages before weights computed.
        assert_eq!(
            limit_key(&plain),
            padll_wire::fnv1a(b"/scratch|metadata|Requests|300|3") | 1
        );
        let keys = [
            limit_key(&plain),
            limit_key(&weighted(3000)),
            limit_key(&weighted(2000)),
        ];
        assert!(keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2]);
        assert_eq!(limit_key(&weighted(3000)), keys[1]);
    }

    #[test]
    fn a_weighted_limit_is_shared_in_thousandths() {
        // SAFETY: geteuid takes no arguments and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let job = format!("test-weighted-{}", std::process::id());
        let buckets = attach(uid, &job, &[weighted(3000), plain()]).unwrap();
        let now = crate::bucket::now_ns();
        // 300 tokens/s with a burst of 3, in thousandths: two opens of 3 tokens at once
        // (the burst, and GCRA's one more), the third 10 ms later.
        for _ in 0..2 {
            assert_eq!(buckets[0].reserve(3000, 0, 0, now).start_ns, now);
        }
        let third = buckets[0].reserve(3000, 0, 0, now).start_ns - now;
        assert!(third.abs_diff(10_000_000) < 10_000, "{third} ns");
        // The unweighted limit's bucket is another, counting tokens.
        assert_eq!(buckets[1].reserve(3, 0, 0, now).start_ns, now);
        assert!(leave(), "the only process of the job removes its segment");
    }
}
