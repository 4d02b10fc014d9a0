//! Per-operation statistics, cheap enough for the unmanaged fast path.
//!
//! Counters live in a static array of per-thread shards: each thread gets its own
//! shard (round-robin beyond [`SHARDS`] threads) and bumps it with a relaxed
//! load + store, not an atomic read-modify-write, so counting costs about as much as
//! a plain increment and threads never share a cache line. Two threads that share a
//! shard (more than `SHARDS` live threads) may, rarely, lose an increment: statistics
//! are exact up to that many threads and approximate beyond.

use padll_wire::ops::Op;
pub use padll_wire::report::OpStats;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Number of counter shards (threads that count exactly).
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

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

#[inline]
fn counters(op: Op) -> &'static OpCounters {
    let shard = MY_SHARD
        .try_with(|s| {
            let mut index = s.get();
            if index == usize::MAX {
                index = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
                s.set(index);
            }
            index
        })
        .unwrap_or(0);
    &COUNTERS[shard].0[op as usize]
}

#[inline(always)]
fn bump(counter: &AtomicU64, by: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

/// Counts a call that passed straight through (target not under a mountpoint).
#[inline]
pub fn count_passthrough(op: Op) {
    bump(&counters(op).calls, 1);
}

/// Counts a managed call once it has completed.
#[inline]
pub fn count_managed(op: Op, failed: bool, bytes: u64, wait_ns: u64) {
    let c = counters(op);
    bump(&c.calls, 1);
    bump(&c.managed, 1);
    if failed {
        bump(&c.errors, 1);
    }
    bump(&c.bytes, bytes);
    bump(&c.wait_ns, wait_ns);
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
