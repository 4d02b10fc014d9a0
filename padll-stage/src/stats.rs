//! Per-operation statistics, cheap enough for the unmanaged fast path.
//!
//! Counters live in a static array of shards; a thread picks its shard by hashing its
//! thread pointer (one register read: no thread-local lookup, which costs a call to
//! `__tls_get_addr` in a shared library). Managed calls count with atomic adds, so
//! their numbers are exact. Passed-through calls, the hot path, count with a relaxed
//! load + store (a plain increment): if two threads hash to the same shard and count
//! the same operation within the same few nanoseconds, one increment can be lost, so
//! the `passthrough` column is exact for one thread and very nearly so for many.

use padll_wire::ops::Op;
pub use padll_wire::report::OpStats;
use std::sync::atomic::{AtomicU64, Ordering};

/// Number of counter shards.
pub const SHARDS: usize = 256;

#[derive(Default)]
#[repr(C)]
struct OpCounters {
    calls: AtomicU64,
    managed: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    wait_ns: AtomicU64,
}

#[repr(align(128))]
struct Shard([OpCounters; Op::COUNT]);

static COUNTERS: [Shard; SHARDS] = [const {
    Shard(
        [const {
            OpCounters {
                calls: AtomicU64::new(0),
                managed: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                wait_ns: AtomicU64::new(0),
            }
        }; Op::COUNT],
    )
}; SHARDS];

/// The calling thread's shard: a hash of its thread pointer.
#[inline(always)]
fn counters(op: Op) -> &'static OpCounters {
    let shard = (thread_pointer().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SHARDS;
    &COUNTERS[shard].0[op as usize]
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the TCB self-pointer at %fs:0 (x86-64 TLS ABI); no side effects.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    tp
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the thread pointer register; no side effects.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags))
    };
    tp
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline(always)]
fn thread_pointer() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// A plain increment (see the module documentation).
#[inline(always)]
fn bump(counter: &AtomicU64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

/// Counts a call that passed straight through (target not under a mountpoint).
#[inline]
pub fn count_passthrough(op: Op) {
    bump(&counters(op).calls);
}

/// Counts a managed call once it has completed.
#[inline]
pub fn count_managed(op: Op, failed: bool, bytes: u64, wait_ns: u64) {
    let c = counters(op);
    c.calls.fetch_add(1, Ordering::Relaxed);
    c.managed.fetch_add(1, Ordering::Relaxed);
    if failed {
        c.errors.fetch_add(1, Ordering::Relaxed);
    }
    if bytes != 0 {
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    if wait_ns != 0 {
        c.wait_ns.fetch_add(wait_ns, Ordering::Relaxed);
    }
}

/// Zeroes every counter (the child of a `fork` starts its own account).
pub fn reset() {
    for shard in &COUNTERS {
        for c in &shard.0 {
            for counter in [&c.calls, &c.managed, &c.errors, &c.bytes, &c.wait_ns] {
                counter.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// Sums the shards into one row per operation type that was called at least once.
pub fn snapshot() -> Vec<OpStats> {
    Op::ALL
        .iter()
        .filter_map(|&op| {
            let mut row = OpStats {
                op: op.name().to_string(),
                ..OpStats::default()
            };
            for shard in &COUNTERS {
                let c = &shard.0[op as usize];
                row.calls += c.calls.load(Ordering::Relaxed);
                row.managed += c.managed.load(Ordering::Relaxed);
                row.errors += c.errors.load(Ordering::Relaxed);
                row.bytes += c.bytes.load(Ordering::Relaxed);
                row.wait_ns += c.wait_ns.load(Ordering::Relaxed);
            }
            row.passthrough = row.calls.saturating_sub(row.managed);
            (row.calls > 0).then_some(row)
        })
        .collect()
}
