//! Which mountpoint each open file descriptor belongs to, so fd-based calls (`read`,
//! `fstat`, `*at` with a dirfd, …) can be classified (PADLL paper §III-A, "handling
//! FD-based operations").
//!
//! Lock-free and allocation-free to read. Places are one flat static array of atomics,
//! one `u16` per descriptor (2 MiB of zero-filled `.bss`: only the pages of descriptors
//! in use are ever touched), so classifying a descriptor is one bounds check and one
//! load. Directories also keep their path (in a [`PathSlot`], in chunks mapped on
//! demand) so that `openat(dirfd, "../x")` can be resolved; descriptors never seen read
//! as [`Place::Unrelated`].
//!
//! Nothing here calls `malloc` or `free`, which a hook run in a signal handler that
//! interrupted the allocator would wait on for ever (`open`, `close`, `dup` are
//! async-signal-safe): chunks come from a raw `mmap`, installed with a CAS, and paths
//! live in [`crate::path_pool`]'s slots.

use crate::path_pool::{self, Header, PooledPath};
use crate::paths::Place;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU16, AtomicUsize, Ordering};

const CHUNK_BITS: usize = 10;
const CHUNK_SIZE: usize = 1 << CHUNK_BITS;
const CHUNKS: usize = 1024;
/// Descriptors at or above this number are not tracked (they pass through unmanaged).
pub const MAX_TRACKED_FD: usize = CHUNK_SIZE * CHUNKS;

/// `Place::encode` of every descriptor (0 = unrelated or unknown).
static PLACES: [AtomicU16; MAX_TRACKED_FD] = [const { AtomicU16::new(0) }; MAX_TRACKED_FD];
/// One more than the highest descriptor ever recorded: `close_range(3, ~0U)` scans no
/// further (and touches no page of `PLACES` beyond it).
static HIGH_WATER: AtomicUsize = AtomicUsize::new(0);

struct Chunk {
    paths: [PathSlot; CHUNK_SIZE],
}

static PATHS: [AtomicPtr<Chunk>; CHUNKS] = [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS];
/// Some chunk of [`PATHS`] exists (a path was kept once): until then, forgetting a
/// managed descriptor need not look for its path. (A descriptor's path is recorded and
/// forgotten by threads that agree on the descriptor, so they agree on this flag.)
static PATHS_KEPT: AtomicBool = AtomicBool::new(false);

#[inline(always)]
fn index(fd: i32) -> Option<usize> {
    // One unsigned compare: negative descriptors wrap far above the limit.
    let fd = fd as u32 as usize;
    (fd < MAX_TRACKED_FD).then_some(fd)
}

fn split(fd: usize) -> (usize, usize) {
    (fd >> CHUNK_BITS, fd & (CHUNK_SIZE - 1))
}

#[inline]
fn chunk(index: usize) -> Option<&'static Chunk> {
    // SAFETY: chunks are never freed once published.
    unsafe { PATHS[index].load(Ordering::Acquire).as_ref() }
}

/// Chunk `index`, mapped (zeroed memory: every slot empty) if it was not yet; `None`
/// if the kernel refuses the memory.
fn chunk_or_create(index: usize) -> Option<&'static Chunk> {
    if let Some(chunk) = chunk(index) {
        return Some(chunk);
    }
    let bytes = std::mem::size_of::<Chunk>();
    let fresh = path_pool::map(bytes)?.cast::<Chunk>();
    match PATHS[index].compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => {
            PATHS_KEPT.store(true, Ordering::Relaxed);
            // SAFETY: just published, never unmapped; zeroed memory is a chunk of
            // empty slots (a null `AtomicPtr` is all zero bits), and a page-aligned
            // mapping is aligned for it.
            Some(unsafe { &*fresh })
        }
        Err(winner) => {
            path_pool::unmap(fresh.cast(), bytes);
            // SAFETY: published chunks are never unmapped.
            Some(unsafe { &*winner })
        }
    }
}

/// The encoded place of descriptor `fd` (0 for unknown descriptors): one compare and
/// one load.
#[inline(always)]
pub fn place_code(fd: i32) -> u16 {
    match index(fd) {
        Some(i) => PLACES[i].load(Ordering::Relaxed),
        None => 0,
    }
}

/// Where descriptor `fd` points (unknown descriptors are [`Place::Unrelated`]).
#[inline(always)]
pub fn place(fd: i32) -> Place {
    Place::decode(place_code(fd))
}

/// Records a new descriptor. `path` (normalised, absolute) is kept for directories so
/// that they can serve as the base of `*at` calls. Unrelated descriptors only clear a
/// stale entry. Never calls `malloc` or `free`; a path that cannot be kept (too long,
/// no memory) is looked up in `/proc/self/fd` when needed.
pub fn record(fd: i32, place: Place, path: Option<&[u8]>) {
    record_kept(fd, place, path.and_then(PooledPath::new));
}

/// [`record`] with the path already in a slot of the pool.
fn record_kept(fd: i32, place: Place, path: Option<PooledPath>) {
    let Some(i) = index(fd) else { return };
    if place == Place::Unrelated {
        forget(fd);
        return;
    }
    raise_high_water(i);
    let (c, slot) = split(i);
    match path {
        Some(path) => {
            if let Some(chunk) = chunk_or_create(c) {
                chunk.paths[slot].set(Some(path));
            }
        }
        None => {
            if let Some(chunk) = chunk(c) {
                chunk.paths[slot].set(None);
            }
        }
    }
    PLACES[i].store(place.encode(), Ordering::Relaxed);
}

/// [`record`] without a path, for the managed path: a bounds check, a load of the
/// descriptor's old place, a load of the high water mark, one store. No allocation, no
/// panic, `errno` untouched. A descriptor with no place has no path either (a path is
/// only kept beside a place, and forgotten with it); one that still has a place was
/// closed without our seeing it, and its stale path is given back out of line (atomics
/// only).
#[inline(always)]
pub fn record_place(fd: i32, place: Place) {
    let Some(i) = index(fd) else { return };
    if PLACES[i].load(Ordering::Relaxed) == 0 {
        raise_high_water(i);
    } else {
        forget_known(i);
    }
    PLACES[i].store(place.encode(), Ordering::Relaxed);
}

/// Raises [`HIGH_WATER`] above `i` if it is not already: a shared atomic
/// read-modify-write only the first time a descriptor number is reached.
#[inline(always)]
fn raise_high_water(i: usize) {
    if HIGH_WATER.load(Ordering::Relaxed) <= i {
        HIGH_WATER.fetch_max(i + 1, Ordering::Relaxed);
    }
}

/// Forgets a descriptor (before it is closed, so a concurrent open that reuses the
/// number is not clobbered afterwards); a negative number is none.
#[inline]
pub fn forget(fd: i32) {
    let Some(i) = index(fd) else { return };
    if PLACES[i].load(Ordering::Relaxed) != 0 {
        forget_known(i);
    }
}

/// [`forget`] for the managed path, of a descriptor known to have a place (closing a
/// managed file): a bounds check and one store, and a look for its path only once
/// some path was kept.
#[inline(always)]
pub fn forget_placed(fd: i32) {
    let Some(i) = index(fd) else { return };
    if PATHS_KEPT.load(Ordering::Relaxed) {
        forget_known(i);
    } else {
        PLACES[i].store(0, Ordering::Relaxed);
    }
}

#[cold]
#[inline(never)]
fn forget_known(i: usize) {
    PLACES[i].store(0, Ordering::Relaxed);
    let (c, slot) = split(i);
    if let Some(chunk) = chunk(c) {
        chunk.paths[slot].set(None);
    }
}

/// Forgets every descriptor in `first..=last` (for `close_range`).
pub fn forget_range(first: u32, last: u32) {
    let end = (last as usize)
        .saturating_add(1)
        .min(HIGH_WATER.load(Ordering::Relaxed));
    let first = (first as usize).min(end);
    for (i, place) in PLACES[first..end].iter().enumerate() {
        if place.load(Ordering::Relaxed) != 0 {
            forget_known(first + i);
        }
    }
}

/// Makes `new` describe the same file as `old` (dup family, `F_DUPFD`).
pub fn duplicate(old: i32, new: i32) {
    let place = place(old);
    if place == Place::Unrelated {
        forget(new);
        return;
    }
    let path = with_path(old, PooledPath::new).flatten();
    record_kept(new, place, path);
}

/// Runs `f` on the path recorded for `fd`, if any and if not being read concurrently.
pub fn with_path<R>(fd: i32, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    let (c, i) = split(index(fd)?);
    chunk(c)?.paths[i].with(f)
}

/// An owned, replaceable path readable without locks and without use-after-free: a
/// reader *takes* the path (putting its own busy marker in its place), reads it and
/// puts it back unless the marker is gone; a writer swaps in a new path and gives back
/// what it took out. A reader that finds the slot busy gets `None` and uses a slower
/// fallback (`/proc/self/fd`, `getcwd`). Paths are [`PooledPath`]s: no step calls
/// `malloc` or `free`.
///
/// Each reader's marker is its own (an address on its stack with the low bit set, which
/// no path has): with one marker for all, a reader could put back a path that a
/// writer had replaced meanwhile, when a second reader had taken the new one.
pub struct PathSlot(AtomicPtr<Header>);

/// Whether `p` is a reader's busy marker (paths are 16-aligned slots of the pool).
fn is_marker(p: *mut Header) -> bool {
    p as usize & 1 != 0
}

impl PathSlot {
    /// An empty slot.
    pub const fn empty() -> PathSlot {
        PathSlot(AtomicPtr::new(ptr::null_mut()))
    }

    /// Replaces the stored path.
    #[inline]
    pub fn set(&self, path: Option<PooledPath>) {
        if self.0.load(Ordering::Relaxed).is_null() && path.is_none() {
            return;
        }
        let new = path.map_or(ptr::null_mut(), PooledPath::into_raw);
        give_back(self.0.swap(new, Ordering::AcqRel));
    }

    /// Runs `f` on the stored path; `None` if empty or busy.
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        // An aligned local: its address + 1 is odd, and no other live reader's.
        let anchor = 0u64;
        let marker = std::ptr::from_ref(&anchor)
            .cast::<Header>()
            .cast_mut()
            .wrapping_byte_add(1);
        debug_assert!(is_marker(marker));
        let mut taken = self.0.load(Ordering::Acquire);
        loop {
            if taken.is_null() || is_marker(taken) {
                return None;
            }
            match self
                .0
                .compare_exchange_weak(taken, marker, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => taken = now,
            }
        }
        // SAFETY: we own `taken` (a slot's header) until we put it back or give it back.
        let result = f(unsafe { path_pool::bytes_of(taken) });
        if self
            .0
            .compare_exchange(marker, taken, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            // A writer replaced the path while we read; ours is stale and ours to give
            // back.
            give_back(taken);
        }
        Some(result)
    }
}

/// Returns a path taken out of a [`PathSlot`] to the pool (nothing for none or a
/// marker).
fn give_back(p: *mut Header) {
    if !p.is_null() && !is_marker(p) {
        // SAFETY: every path in a slot came from `PooledPath::into_raw`, and was taken
        // out of it (by a swap or a reader's CAS) by the caller alone.
        drop(unsafe { PooledPath::from_raw(p) });
    }
}

/// `/proc/self/fd/<fd>` as a NUL-terminated name, built without allocating (usable in a
/// `fork` handler).
pub(crate) fn proc_self_fd(fd: i32) -> [u8; 26] {
    let mut link = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 10];
    let (mut n, mut count) = (fd.max(0) as u32, 0);
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..count {
        link[14 + i] = digits[count - 1 - i];
    }
    link
}

#[cfg(test)]
mod tests {
    use super::*;

    // Descriptor numbers far from the ones the test process really uses.
    const BASE: i32 = 500_000;

    /// A reader holds the old path while the slot is given a new one, which a second
    /// reader takes; the first must not put the old one back.
    #[test]
    fn overlapping_readers_never_put_back_a_replaced_path() {
        use std::sync::mpsc::channel;
        let slot: &'static PathSlot = Box::leak(Box::new(PathSlot::empty()));
        slot.set(PooledPath::new(b"/mnt/a/old-dir"));
        // A reader that says what it holds, then waits to be let go.
        let reader = || {
            let (held, holding) = channel();
            let (release, released) = channel::<()>();
            let thread = std::thread::spawn(move || {
                slot.with(|p| {
                    held.send(p.to_vec()).unwrap();
                    released.recv().unwrap();
                })
            });
            (holding.recv().unwrap(), release, thread)
        };
        let (first_held, release_first, first) = reader();
        assert_eq!(first_held, b"/mnt/a/old-dir");
        // The descriptor is closed and its number reused by another directory.
        slot.set(PooledPath::new(b"/other/new-dir"));
        let (second_held, release_second, second) = reader();
        assert_eq!(second_held, b"/other/new-dir");
        release_first.send(()).unwrap();
        first.join().unwrap();
        release_second.send(()).unwrap();
        second.join().unwrap();
        assert_eq!(
            slot.with(<[u8]>::to_vec).as_deref(),
            Some(&b"/other/new-dir"[..])
        );
    }

    #[test]
    fn record_duplicate_forget() {
        assert_eq!(place(BASE), Place::Unrelated);
        record(BASE, Place::Managed(3), Some(b"/scratch/dir"));
        assert_eq!(place(BASE), Place::Managed(3));
        duplicate(BASE, BASE + 1);
        assert_eq!(place(BASE + 1), Place::Managed(3));
        assert_eq!(
            with_path(BASE + 1, |p| p.to_vec()).as_deref(),
            Some(&b"/scratch/dir"[..])
        );
        forget_range(BASE as u32, BASE as u32 + 1);
        assert_eq!(place(BASE), Place::Unrelated);
        assert_eq!(place(BASE + 1), Place::Unrelated);
        assert_eq!(with_path(BASE, |p| p.to_vec()), None);
    }

    #[test]
    fn out_of_range_descriptors_are_unrelated() {
        record(-1, Place::Managed(0), None);
        record(MAX_TRACKED_FD as i32, Place::Managed(0), None);
        assert_eq!(place(-1), Place::Unrelated);
        assert_eq!(place(MAX_TRACKED_FD as i32), Place::Unrelated);
    }

    #[test]
    fn path_slot_survives_concurrent_readers_and_writers() {
        let slot: &'static PathSlot = Box::leak(Box::new(PathSlot::empty()));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        if t == 0 {
                            slot.set(PooledPath::new(format!("/scratch/{i}").as_bytes()));
                        } else if let Some(len) = slot.with(|p| p.len()) {
                            assert!(len >= 9);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
