//! Paths the stage keeps (of directory descriptors, of descriptors above a mountpoint,
//! of the current directory), held in memory that no hook gets from `malloc`.
//!
//! `open`, `close`, `chdir`, `dup` are async-signal-safe: a signal handler may call
//! them while the thread it interrupted is inside `malloc`, holding the allocator's
//! arena lock. A hook that then called `malloc` or `free` (a `CString`, a `Box`) would
//! wait for that lock for ever. So a kept path lives in a fixed-size *slot* of a block
//! mapped with a raw `mmap` system call (async-signal-safe, no lock in user space):
//! slots are claimed from a lock-free free list (a Treiber stack whose head carries a
//! tag against ABA) or, when it is empty, from the never-used slots of the pool (an
//! atomic counter; a block is mapped the first time one of its slots is handed out and
//! installed with a CAS, a loser unmapping its own). A slot is given back to the free
//! list, never to the kernel. Every step is a load, a CAS or a system call: a handler
//! that interrupts a claim or a release on its own thread only makes that CAS fail and
//! retry, and nothing is held across `fork` (the child inherits the blocks, copied on
//! write).
//!
//! Two sizes: [`SMALL_BYTES`] bytes for most paths, [`PATH_CAPACITY`] for the rest, so
//! that a program with many directories open keeps about a quarter of a kilobyte each,
//! and pages are only touched as slots are first used. When the pool is exhausted (a
//! million slots of each size) or the kernel refuses a block, no path is kept and
//! readers fall back to the kernel's answer (`/proc/self/fd`, `getcwd`), as when a
//! slot is busy.

use crate::errno;
use crate::paths::PATH_CAPACITY;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Bytes of path a small slot holds.
pub const SMALL_BYTES: usize = 240;

/// What precedes the path in a slot.
#[repr(C, align(16))]
pub struct Header {
    /// While free: the next free slot's index + 1 (0: none). Read by concurrent
    /// claimers even after the slot left the list (their CAS then fails), so atomic.
    next: AtomicU32,
    /// This slot's index in its pool.
    index: u32,
    /// The path's length in bytes.
    len: u32,
    /// Which pool: 0 small, 1 large.
    class: u32,
}

const HEADER: usize = std::mem::size_of::<Header>();
const _: () = assert!(HEADER == 16);

const SLOTS_PER_BLOCK: usize = 256;
const MAX_BLOCKS: usize = 4096;

/// One size of slot.
struct Pool {
    /// Bytes per slot, header included (a multiple of 16: every slot is 16-aligned, so
    /// its address is even, as `fdtable::PathSlot` needs).
    slot_bytes: usize,
    /// Tag (high half) and the first free slot's index + 1 (low half; 0: none).
    free: AtomicU64,
    /// Slots ever handed out: those at and above are fresh.
    fresh: AtomicU32,
    blocks: [AtomicPtr<u8>; MAX_BLOCKS],
}

const fn round16(n: usize) -> usize {
    (n + 15) & !15
}

static POOLS: [Pool; 2] = [
    Pool::new(round16(HEADER + SMALL_BYTES)),
    Pool::new(round16(HEADER + PATH_CAPACITY)),
];

impl Pool {
    const fn new(slot_bytes: usize) -> Pool {
        Pool {
            slot_bytes,
            free: AtomicU64::new(0),
            fresh: AtomicU32::new(0),
            blocks: [const { AtomicPtr::new(ptr::null_mut()) }; MAX_BLOCKS],
        }
    }

    /// The header of slot `index`, whose block is mapped (the slot was handed out).
    fn header(&self, index: u32) -> NonNull<Header> {
        let (block, slot) = (
            index as usize / SLOTS_PER_BLOCK,
            index as usize % SLOTS_PER_BLOCK,
        );
        let base = self.blocks[block].load(Ordering::Acquire);
        debug_assert!(!base.is_null());
        // SAFETY: a slot's block is installed before the slot is first handed out and
        // never unmapped; `slot` is within the block.
        unsafe { NonNull::new_unchecked(base.add(slot * self.slot_bytes).cast()) }
    }

    /// The free-list link of slot `index` (handed out before). Only this field of a
    /// slot is ever read by a thread that does not own it, so no reference to the
    /// whole header is made here.
    fn next(&self, index: u32) -> &AtomicU32 {
        // SAFETY: a handed-out slot's header lies in a mapped block, never unmapped.
        unsafe { &*ptr::addr_of!((*self.header(index).as_ptr()).next) }
    }

    /// A free slot's index, if any is left and its block could be mapped.
    fn claim(&self) -> Option<u32> {
        let mut head = self.free.load(Ordering::Acquire);
        loop {
            let top = head as u32;
            if top == 0 {
                return self.claim_fresh();
            }
            // A slot on the list was handed out before: its block is mapped.
            let next = self.next(top - 1).load(Ordering::Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | u64::from(next);
            match self
                .free
                .compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(top - 1),
                Err(now) => head = now,
            }
        }
    }

    #[cold]
    fn claim_fresh(&self) -> Option<u32> {
        let index = self
            .fresh
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                ((n as usize) < SLOTS_PER_BLOCK * MAX_BLOCKS).then_some(n + 1)
            })
            .ok()?;
        let block = &self.blocks[index as usize / SLOTS_PER_BLOCK];
        if block.load(Ordering::Acquire).is_null() {
            let bytes = self.slot_bytes * SLOTS_PER_BLOCK;
            let Some(mapped) = map(bytes) else {
                // The slot is lost (its block may be mapped by a later claim); the
                // kernel refused memory, paths are not kept meanwhile.
                return None;
            };
            if let Err(_winner) =
                block.compare_exchange(ptr::null_mut(), mapped, Ordering::AcqRel, Ordering::Acquire)
            {
                unmap(mapped, bytes);
            }
        }
        Some(index)
    }

    /// Puts slot `index` back on the free list.
    fn release(&self, index: u32) {
        let next = self.next(index);
        let mut head = self.free.load(Ordering::Relaxed);
        loop {
            next.store(head as u32, Ordering::Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | u64::from(index + 1);
            match self
                .free
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }
}

/// `bytes` of zeroed memory from a raw `mmap` (no hook, no allocator); `errno` kept.
pub(crate) fn map(bytes: usize) -> Option<*mut u8> {
    let saved = errno::get();
    // SAFETY: an anonymous private mapping at an address of the kernel's choice.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            ptr::null_mut::<u8>(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == -1 || p == 0 {
        errno::set(saved);
        return None;
    }
    Some(p as *mut u8)
}

/// Gives back a mapping of [`map`] that was never shared.
pub(crate) fn unmap(p: *mut u8, bytes: usize) {
    let saved = errno::get();
    // SAFETY: a mapping of `bytes` made by `map` and never published.
    unsafe { libc::syscall(libc::SYS_munmap, p, bytes) };
    errno::set(saved);
}

/// A path in a slot of the pool, given back when dropped.
pub struct PooledPath(NonNull<Header>);

impl PooledPath {
    /// A copy of `path` (at most [`PATH_CAPACITY`] bytes); `None` if too long or the
    /// pool has no slot left.
    pub fn new(path: &[u8]) -> Option<PooledPath> {
        let class = if path.len() <= SMALL_BYTES {
            0
        } else if path.len() <= PATH_CAPACITY {
            1
        } else {
            return None;
        };
        let pool = &POOLS[class];
        let index = pool.claim()?;
        let header = pool.header(index);
        // SAFETY: the slot is ours alone (claimed); only `next` is read by others, and
        // atomically; the path fits after the header (checked above).
        unsafe {
            let h = header.as_ptr();
            (*h).index = index;
            (*h).len = path.len() as u32;
            (*h).class = class as u32;
            ptr::copy_nonoverlapping(path.as_ptr(), h.cast::<u8>().add(HEADER), path.len());
        }
        Some(PooledPath(header))
    }

    /// The path's bytes.
    #[cfg(test)]
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: an owned slot, filled by `new`.
        unsafe { bytes_of(self.0.as_ptr()) }
    }

    /// Gives up ownership: the slot's header, for [`PooledPath::from_raw`]; 16-aligned.
    pub fn into_raw(self) -> *mut Header {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }

    /// Takes back a slot given up by [`PooledPath::into_raw`].
    ///
    /// # Safety
    /// `p` came from `into_raw` and is owned by the caller (taken back once).
    pub unsafe fn from_raw(p: *mut Header) -> PooledPath {
        // SAFETY: non-null: it came from `into_raw`.
        PooledPath(unsafe { NonNull::new_unchecked(p) })
    }
}

impl Drop for PooledPath {
    fn drop(&mut self) {
        // SAFETY: an owned slot, filled by `new`.
        let (class, index) = unsafe {
            let h = self.0.as_ptr();
            ((*h).class as usize, (*h).index)
        };
        POOLS[class].release(index);
    }
}

/// The bytes of the path in the slot `p`.
///
/// # Safety
/// `p` is a slot's header (from [`PooledPath::into_raw`]) that the caller owns for the
/// returned lifetime.
pub unsafe fn bytes_of<'a>(p: *const Header) -> &'a [u8] {
    // SAFETY: the caller owns the filled slot; its `len` bytes follow the header.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(HEADER), (*p).len as usize) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_every_length_are_kept_until_too_long() {
        for len in [0, 1, SMALL_BYTES, SMALL_BYTES + 1, PATH_CAPACITY] {
            let path = vec![b'x'; len];
            let kept = PooledPath::new(&path).unwrap();
            assert_eq!(kept.as_bytes(), &path[..]);
            assert_eq!(kept.0.as_ptr() as usize % 16, 0);
        }
        assert!(PooledPath::new(&vec![b'x'; PATH_CAPACITY + 1]).is_none());
    }

    #[test]
    fn released_slots_are_reused_before_fresh_ones() {
        let pool: &Pool = Box::leak(Box::new(Pool::new(32)));
        let claimed: Vec<_> = (0..3).map(|_| pool.claim().unwrap()).collect();
        assert_eq!(claimed, [0, 1, 2]);
        pool.release(1);
        pool.release(0);
        assert_eq!(pool.claim(), Some(0));
        assert_eq!(pool.claim(), Some(1));
        assert_eq!(pool.claim(), Some(3));
        // A second block is mapped when its first slot is handed out.
        for expected in 4..SLOTS_PER_BLOCK as u32 + 2 {
            assert_eq!(pool.claim(), Some(expected));
        }
        assert!(!pool.blocks[1].load(Ordering::Relaxed).is_null());
        assert!(pool.blocks[2].load(Ordering::Relaxed).is_null());
    }

    #[test]
    fn concurrent_claims_never_share_a_slot() {
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..20_000usize {
                        let len = (i * 37 + t as usize) % (SMALL_BYTES * 2);
                        let path = vec![b'a' + t; len];
                        let a = PooledPath::new(&path).unwrap();
                        let b = PooledPath::new(&path[..len / 2]).unwrap();
                        assert_eq!(a.as_bytes(), &path[..]);
                        assert_eq!(b.as_bytes(), &path[..len / 2]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
