//! Per-operation and per-channel counters, cheap enough for every intercepted call.
//!
//! Counters live in a static array of shards. A thread finds its shard from its thread
//! pointer and claims it by writing that pointer into the shard's `owner` (one CAS, on
//! its first call). On x86-64 the claimed shard is then cached in an *initial-exec*
//! thread-local word (8 bytes of static TLS, allocated with the thread: no
//! `__tls_get_addr`, no allocation, async-signal-safe), so every later call finds it
//! with two loads; elsewhere (and before the claim) the shard is found by hashing the
//! thread pointer and checking the owner. The owner is then the only writer of the shard, so it counts with
//! plain increments (a relaxed load and store: no locked instruction, no cache line
//! shared with another thread) and the sums are still exact. A thread whose shard is
//! taken by another (live or exited) thread counts in a shared overflow shard with
//! atomic adds: exact too, only slower. Threads that reuse an exited thread's stack
//! (glibc caches them) have its thread pointer and continue its shard.
//!
//! The one inexact case: a signal handler that counts on the thread it interrupted,
//! between that thread's load and store, loses its increment.
//!
//! An owned shard also holds its thread's "doing the stage's own I/O" flag, which the
//! managed path reads with the counters instead of through a thread-local, and its
//! [credit](crate::credit) per channel, beside the channel's counters (one cache line
//! for the managed path's check and count); `credit.rs` has its rules.
//!
//! Service times of managed calls are counted the same way, in the fixed histogram
//! layout of [`padll_wire::latency`], per mountpoint and class of operation — for the
//! first [`TIMED_MOUNTS`] registered mountpoints only (most stages have one or two): a
//! shard holds 6 KiB of them, and a thread only touches the rows it counts in. An
//! operation a weighted channel of its mountpoint charges nothing (`close` weighed 0)
//! is not timed there: its calls cost the server nothing in the control plane's eyes,
//! and a fast free call would otherwise pull the class's median under the server's.

use crate::credit::Credit;
use crate::tsc;
use padll_wire::channel::SLOT_COUNT;
use padll_wire::latency::{bucket_of_f64, LatencyRow, BUCKETS};
use padll_wire::ops::{Class, Op};
pub use padll_wire::report::OpStats;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Number of owned shards.
pub const SHARDS: usize = 256;
/// Shards a thread tries to claim, from the one its thread pointer hashes to.
const PROBES: usize = 4;
/// Mountpoints (the first registered) whose managed calls' service times are counted.
pub const TIMED_MOUNTS: usize = 4;
const CLASSES: usize = Class::ALL.len();
/// Service-time counts of one shard: per class, per bucket, per timed mountpoint (the
/// mountpoint last: a count's address is then one scaled index from the bucket's).
type Latency = [[[AtomicU64; TIMED_MOUNTS]; BUCKETS]; CLASSES];
/// The same, summed over shards.
type LatencySums = [[[u64; TIMED_MOUNTS]; BUCKETS]; CLASSES];
/// Per operation, the mountpoints (a bit each) whose calls' service times are counted
/// now: once the time-stamp counter's rate is known, the first [`TIMED_MOUNTS`] less
/// those of [`FREE`]; none before.
static TIMED: [AtomicU64; Op::COUNT] = [const { AtomicU64::new(0) }; Op::COUNT];
/// Per operation, the mountpoints where a weighted channel charges it nothing.
static FREE: [AtomicU64; Op::COUNT] = [const { AtomicU64::new(0) }; Op::COUNT];
/// The time-stamp counter's rate is known: [`TIMED`] follows [`FREE`].
static TIMING: AtomicBool = AtomicBool::new(false);

/// Sets, per operation, the mountpoints where a weighted channel charges it nothing
/// (the channels' control path, on every change of the channels).
pub fn set_free(free: &[u64; Op::COUNT]) {
    for (op, mounts) in free.iter().enumerate() {
        FREE[op].store(*mounts, Ordering::SeqCst);
    }
    if TIMING.load(Ordering::SeqCst) {
        follow_free();
    }
}

/// Makes [`TIMED`] follow [`FREE`]. Called by the control path and by the thread that
/// finds the counter's rate known; whichever stores last re-reads [`FREE`] after, so
/// the last value of [`FREE`] wins.
fn follow_free() {
    const FIRST: u64 = (1 << TIMED_MOUNTS) - 1;
    for (timed, free) in TIMED.iter().zip(&FREE) {
        loop {
            let seen = free.load(Ordering::SeqCst);
            timed.store(FIRST & !seen, Ordering::SeqCst);
            if free.load(Ordering::SeqCst) == seen {
                break;
            }
        }
    }
}

#[repr(C)]
struct OpCounters {
    passthrough: AtomicU64,
    managed: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    wait_ns: AtomicU64,
}

#[repr(C)]
struct ChannelCounters {
    admitted: AtomicU64,
    tokens: AtomicU64,
    credit: Credit,
}

#[repr(C, align(128))]
struct Shard {
    /// Thread pointer of the thread that counts here; 0 = free.
    owner: AtomicU64,
    /// The owner is doing the stage's own I/O (`guard::StageIo`).
    stage_io: AtomicBool,
    ops: [OpCounters; Op::COUNT],
    channels: [ChannelCounters; SLOT_COUNT],
    /// Last: the rows a thread never counts in stay on pages never touched.
    latency: Latency,
}

const fn empty_shard() -> Shard {
    Shard {
        owner: AtomicU64::new(0),
        stage_io: AtomicBool::new(false),
        ops: [const {
            OpCounters {
                passthrough: AtomicU64::new(0),
                managed: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                wait_ns: AtomicU64::new(0),
            }
        }; Op::COUNT],
        channels: [const {
            ChannelCounters {
                admitted: AtomicU64::new(0),
                tokens: AtomicU64::new(0),
                credit: Credit::new(),
            }
        }; SLOT_COUNT],
        latency: [const { [const { [const { AtomicU64::new(0) }; TIMED_MOUNTS] }; BUCKETS] };
            CLASSES],
    }
}

static OWNED: [Shard; SHARDS] = [const { empty_shard() }; SHARDS];
static OVERFLOW: Shard = empty_shard();

/// The calling thread's counters, and how to add to them.
#[derive(Clone, Copy)]
pub struct Counters {
    shard: &'static Shard,
    /// The calling thread owns the shard: no other thread writes it.
    owned: bool,
}

impl Counters {
    #[inline(always)]
    fn add(self, counter: &AtomicU64, n: u64) {
        if self.owned {
            counter.store(
                counter.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        } else {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts a call that passed straight through (target not under a mountpoint).
    #[inline(always)]
    pub fn passthrough(self, op: Op) {
        self.add(&self.shard.ops[op as usize].passthrough, 1);
    }

    /// Counts a managed call once it has completed.
    #[inline]
    pub fn managed(self, op: Op, failed: bool, bytes: u64) {
        let row = &self.shard.ops[op as usize];
        self.add(&row.managed, 1);
        if failed {
            self.add(&row.errors, 1);
        }
        if bytes != 0 {
            self.add(&row.bytes, bytes);
        }
    }

    /// Counts the service time of a managed call of `op` on mountpoint `mount` (below
    /// [`MAX_MOUNTS`](crate::channels::MAX_MOUNTS)): `ticks` of the time-stamp counter
    /// (`tsc`). Nothing is counted past the first [`TIMED_MOUNTS`], for an operation
    /// charged nothing there, nor while ticks cannot be converted into nanoseconds (the
    /// managed path's one bit test checks all three; out of line, the first call after
    /// the rate is measured opens the count).
    #[inline(always)]
    pub fn served(self, mount: u16, op: Op, ticks: u64) {
        let mount = mount as usize;
        if TIMED[op as usize].load(Ordering::Relaxed) & (1 << (mount % 64)) != 0 {
            // Signed: a counter that went back (never, where the kernel trusts it)
            // counts as no time rather than as centuries.
            let ns = ticks as i64 as f64 * tsc::ns_per_tick();
            let bucket = &self.shard.latency[op.class() as usize][bucket_of_f64(ns)];
            self.add(&bucket[mount % TIMED_MOUNTS], 1);
        } else {
            self.served_untimed(mount, op, ticks);
        }
    }

    /// [`Self::served`] of a call not timed now: past the first [`TIMED_MOUNTS`], of an
    /// operation charged nothing, or before the counter's rate is known.
    #[cold]
    #[inline(never)]
    fn served_untimed(self, mount: usize, op: Op, ticks: u64) {
        if mount < TIMED_MOUNTS && !TIMING.load(Ordering::Relaxed) && tsc::timing_ready() {
            TIMING.store(true, Ordering::SeqCst);
            follow_free();
            if TIMED[op as usize].load(Ordering::Relaxed) & (1 << mount) != 0 {
                self.served(mount as u16, op, ticks);
            }
        }
    }

    /// Counts time a managed call of `op` spent waiting (where it waited, out of line).
    #[inline]
    pub fn waited(self, op: Op, wait_ns: u64) {
        self.add(&self.shard.ops[op as usize].wait_ns, wait_ns);
    }

    /// Counts a request admitted by channel `slot`, costing `tokens`.
    #[inline]
    pub fn admitted(self, slot: usize, tokens: u64) {
        let row = &self.shard.channels[slot];
        self.add(&row.admitted, 1);
        self.add(&row.tokens, tokens);
    }

    /// Corrects the tokens counted by channel `slot` once a request's real size is
    /// known (negative: bytes refunded).
    #[inline]
    pub fn adjust_tokens(self, slot: usize, delta: i64) {
        self.add(&self.shard.channels[slot].tokens, delta as u64);
    }

    /// Pays a request of `cost` tokens in channel `slot` from the thread's credit and
    /// counts it admitted, if the credit pays ([`Credit::spend_at`], `stamp` being
    /// [`crate::tsc::ticks`]): the managed path's check and count, on one cache line.
    /// An overflow thread's rows are never leased into, so they never pay.
    #[inline(always)]
    pub fn paid_from_credit(self, slot: usize, generation: u64, cost: u64, stamp: u64) -> bool {
        let Some(row) = self.shard.channels.get(slot) else {
            return false;
        };
        let paid = row.credit.spend_at(generation, cost, stamp);
        if paid {
            self.add(&row.admitted, 1);
            self.add(&row.tokens, cost);
        }
        paid
    }

    /// The thread's credit in channel `slot`, to lease into: only a thread that owns its
    /// shard holds credit (it is then the row's only writer).
    #[inline]
    pub fn owned_credit(self, slot: usize) -> Option<&'static Credit> {
        let row = self.shard.channels.get(slot)?;
        self.owned.then_some(&row.credit)
    }

    /// The calling thread's stage-I/O flag, if it owns its shard.
    #[inline]
    pub fn stage_io(self) -> Option<bool> {
        self.owned
            .then(|| self.shard.stage_io.load(Ordering::Relaxed))
    }

    /// Sets the calling thread's stage-I/O flag, if it owns its shard.
    pub fn set_stage_io(self, on: bool) {
        if self.owned {
            self.shard.stage_io.store(on, Ordering::Relaxed);
        }
    }
}

/// The calling thread's counters.
#[inline(always)]
pub fn local() -> Counters {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let cached = cache::get();
        if cached as usize > VFORK_CHILD {
            return Counters {
                // SAFETY: the cache only ever holds a shard of `OWNED` (a static) this
                // thread owns, null or the vfork mark; it is neither here.
                shard: unsafe { &*cached },
                owned: true,
            };
        }
        find()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let tp = thread_pointer();
        let home = home_shard(tp);
        let shard = &OWNED[home];
        if shard.owner.load(Ordering::Relaxed) == tp {
            Counters { shard, owned: true }
        } else {
            claim(tp, home)
        }
    }
}

/// The calling thread's counters if it owns a shard it has found before (x86-64: its
/// cached shard, two loads; elsewhere: its home shard, if it owns it). Never claims,
/// never calls: for the hooks' fast path.
#[inline(always)]
pub fn cached() -> Option<Counters> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let cached = cache::get();
        (cached as usize > VFORK_CHILD).then(|| Counters {
            // SAFETY: the cache only ever holds a shard of `OWNED` (a static) this thread
            // owns, null or the vfork mark; it is neither here.
            shard: unsafe { &*cached },
            owned: true,
        })
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let tp = thread_pointer();
        let shard = &OWNED[home_shard(tp)];
        (shard.owner.load(Ordering::Relaxed) == tp).then_some(Counters { shard, owned: true })
    }
}

/// The calling thread's counters when its shard is not cached yet (first call, or every
/// call of a thread that counts in the overflow shard).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[cold]
#[inline(never)]
fn find() -> Counters {
    let tp = thread_pointer();
    let counters = claim(tp, home_shard(tp));
    if counters.owned {
        cache::set(counters.shard);
    }
    counters
}

/// The cache word of a thread whose vfork child runs (`crate::vfork`): no shard, so
/// the child's hooks all leave the fast path, where they find the mark first (and so
/// never reach [`local`], which would cache a shard again). Shards are 128-byte
/// aligned: no shard is here.
const VFORK_CHILD: usize = 1;

/// Marks the calling thread's cache for its vfork child; returns the word it held.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn enter_vfork_child() -> u64 {
    let word = cache::get();
    cache::set(VFORK_CHILD as *const Shard);
    word as u64
}

/// Puts back what [`enter_vfork_child`] returned, once the vfork child has left.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn leave_vfork_child(word: u64) {
    cache::set(word as *const Shard);
}

/// Whether the calling thread is a vfork child that has not left yet.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(crate) fn in_vfork_child() -> bool {
    cache::get() as usize == VFORK_CHILD
}

/// The calling thread's claimed shard, in one word of initial-exec TLS.
///
/// Rust's `thread_local!` in a shared library uses the general-dynamic model: a call to
/// `__tls_get_addr`, which may allocate on a thread's first access (so not
/// async-signal-safe). An initial-exec variable lives in the static TLS block that
/// glibc allocates with every thread (and, for a library loaded after start-up, in the
/// block's reserved surplus): reading it is `mov reg, [rip + sym@gottpoff]` and
/// `mov reg, fs:[reg]`. The variable is defined in assembly (`.tbss`, zero-initialised:
/// a new thread, or a thread reusing a cached stack, starts with no shard and claims
/// one; a reused stack has the old thread pointer and finds the old shard). It is
/// hidden, so it is never exported from `libpadll.so`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod cache {
    use super::Shard;

    std::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 3",
        ".globl __padll_stage_shard",
        ".hidden __padll_stage_shard",
        ".type __padll_stage_shard, @object",
        ".size __padll_stage_shard, 8",
        "__padll_stage_shard:",
        ".zero 8",
        ".popsection",
    );

    /// The calling thread's cached shard, or null.
    #[inline(always)]
    pub(super) fn get() -> *const Shard {
        let shard: *const Shard;
        // SAFETY: reads the calling thread's own TLS word; no side effects.
        unsafe {
            std::arch::asm!(
                "mov {s}, qword ptr [rip + __padll_stage_shard@GOTTPOFF]",
                "mov {s}, qword ptr fs:[{s}]",
                s = out(reg) shard,
                options(nostack, readonly, preserves_flags),
            )
        };
        shard
    }

    /// Caches `shard` (or clears the cache with null) for the calling thread.
    #[inline]
    pub(super) fn set(shard: *const Shard) {
        // SAFETY: writes the calling thread's own TLS word.
        unsafe {
            std::arch::asm!(
                "mov {t}, qword ptr [rip + __padll_stage_shard@GOTTPOFF]",
                "mov qword ptr fs:[{t}], {s}",
                t = out(reg) _,
                s = in(reg) shard,
                options(nostack, preserves_flags),
            )
        };
    }
}

#[inline(always)]
fn home_shard(tp: u64) -> usize {
    (tp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SHARDS
}

/// Finds or claims the calling thread's shard (first call of a thread, or its home
/// shard was taken).
#[cold]
#[inline(never)]
fn claim(tp: u64, home: usize) -> Counters {
    for probe in 0..PROBES {
        let shard = &OWNED[(home + probe) % SHARDS];
        let owner = shard.owner.load(Ordering::Relaxed);
        if owner == tp
            || (owner == 0
                && shard
                    .owner
                    .compare_exchange(0, tp, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok())
        {
            return Counters { shard, owned: true };
        }
    }
    Counters {
        shard: &OVERFLOW,
        owned: false,
    }
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

/// Requests admitted and tokens taken by channel `slot` since the process (or the
/// forked child) started: cumulative, wrapping.
pub fn channel_totals(slot: usize) -> (u64, u64) {
    used_shards().fold((0u64, 0u64), |(admitted, tokens), shard| {
        let row = &shard.channels[slot];
        (
            admitted.wrapping_add(row.admitted.load(Ordering::Relaxed)),
            tokens.wrapping_add(row.tokens.load(Ordering::Relaxed)),
        )
    })
}

/// The counters of every thread that ever counted (at process exit, to return the
/// credit of threads still alive).
pub fn every_thread() -> impl Iterator<Item = Counters> {
    OWNED
        .iter()
        .filter(|shard| shard.owner.load(Ordering::Relaxed) != 0)
        .map(|shard| Counters { shard, owned: true })
}

/// The shards that may hold counts: those claimed since the last reset (only their
/// owners count in them) and the overflow shard. Reading only these, a report or a
/// `fork` costs a few shards' worth of work, not all 256 (6 MiB of reads).
fn used_shards() -> impl Iterator<Item = &'static Shard> {
    OWNED
        .iter()
        .filter(|shard| shard.owner.load(Ordering::Relaxed) != 0)
        .chain(std::iter::once(&OVERFLOW))
}

/// Zeroes every counter and credit and frees every shard: the child of a `fork` starts
/// its own account, and of the parent's threads only the forking one exists in it (its
/// credit is dropped, not carried over; its cached shard is forgotten, so it claims one
/// again). Untouched counters are not written, so that their pages stay unallocated.
pub fn reset() {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    cache::set(std::ptr::null());
    for shard in used_shards() {
        shard.clear();
    }
}

impl Shard {
    /// Zeroes the shard's counters and credit, writing only those that are not zero,
    /// and frees it.
    fn clear(&self) {
        let zero = |counter: &AtomicU64| {
            if counter.load(Ordering::Relaxed) != 0 {
                counter.store(0, Ordering::Relaxed);
            }
        };
        zero(&self.owner);
        if self.stage_io.load(Ordering::Relaxed) {
            self.stage_io.store(false, Ordering::Relaxed);
        }
        for c in &self.ops {
            for counter in [&c.passthrough, &c.managed, &c.errors, &c.bytes, &c.wait_ns] {
                zero(counter);
            }
        }
        for c in &self.channels {
            zero(&c.admitted);
            zero(&c.tokens);
            c.credit.reset();
        }
        self.latency.iter().flatten().flatten().for_each(zero);
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
            for shard in used_shards() {
                let c = &shard.ops[op as usize];
                row.passthrough += c.passthrough.load(Ordering::Relaxed);
                row.managed += c.managed.load(Ordering::Relaxed);
                row.errors += c.errors.load(Ordering::Relaxed);
                row.bytes += c.bytes.load(Ordering::Relaxed);
                row.wait_ns += c.wait_ns.load(Ordering::Relaxed);
            }
            row.calls = row.passthrough + row.managed;
            (row.calls > 0).then_some(row)
        })
        .collect()
}

/// The service times counted since the process (or the forked child) started: one row
/// per timed mountpoint (named as in `mounts`, the registered mountpoints in order) and
/// class that counted any, its trailing empty buckets left out.
pub fn latency_rows(mounts: &[String]) -> Vec<LatencyRow> {
    let mut sums: LatencySums = [[[0; TIMED_MOUNTS]; BUCKETS]; CLASSES];
    for shard in used_shards() {
        add_latency(shard, &mut sums);
    }
    let mut rows = Vec::new();
    for (mount_index, mount) in mounts.iter().enumerate().take(TIMED_MOUNTS) {
        for (class, buckets) in Class::ALL.into_iter().zip(&sums) {
            let counts: Vec<u64> = buckets.iter().map(|mounts| mounts[mount_index]).collect();
            if let Some(last) = counts.iter().rposition(|&c| c != 0) {
                rows.push(LatencyRow {
                    mount: mount.clone(),
                    class,
                    counts: counts[..=last].to_vec(),
                });
            }
        }
    }
    rows
}

/// Adds `shard`'s service-time counts to `sums` (wrapping, like every counter).
fn add_latency(shard: &Shard, sums: &mut LatencySums) {
    let counters = shard.latency.iter().flatten().flatten();
    for (sum, counter) in sums.iter_mut().flatten().flatten().zip(counters) {
        *sum = sum.wrapping_add(counter.load(Ordering::Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use padll_wire::latency::bucket_of;

    fn managed_reads() -> u64 {
        snapshot()
            .iter()
            .find(|row| row.op == Op::Read.name())
            .map_or(0, |row| row.managed)
    }

    /// Whether the time-stamp counter's rate gets known (it is measured 10 ms after
    /// the first try; never where ticks are not usable).
    fn timing_gets_ready() -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            if tsc::timing_ready() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        false
    }

    fn latency_of(shard: &Shard) -> LatencySums {
        let mut sums = [[[0; TIMED_MOUNTS]; BUCKETS]; CLASSES];
        add_latency(shard, &mut sums);
        sums
    }

    #[test]
    fn service_times_land_in_their_mountpoint_class_and_bucket() {
        let ready = timing_gets_ready();
        // A shard of the test's own, counted in as a thread's owned shard is.
        let shard: &'static Shard = Box::leak(Box::new(empty_shard()));
        let counters = Counters { shard, owned: true };
        let ticks = |ns: f64| (ns / tsc::ns_per_tick()) as u64;
        if !ready {
            // Ticks are not usable here: nothing is timed.
            counters.served(0, Op::Read, 1_000_000);
            assert_eq!(latency_of(shard), [[[0; TIMED_MOUNTS]; BUCKETS]; CLASSES]);
            return;
        }
        for _ in 0..3 {
            counters.served(1, Op::Read, ticks(5e6));
        }
        counters.served(0, Op::Open, ticks(110e3));
        counters.served(0, Op::Open, ticks(20e9));
        // Past the timed mountpoints: not counted.
        counters.served(TIMED_MOUNTS as u16, Op::Open, ticks(110e3));
        let sums = latency_of(shard);
        let data = Class::Data as usize;
        let metadata = Class::Metadata as usize;
        assert_eq!(sums[data][bucket_of(5_000_000)][1], 3);
        assert_eq!(sums[metadata][bucket_of(110_000)][0], 1);
        assert_eq!(
            sums[metadata][BUCKETS - 1][0],
            1,
            "20 s: the open-ended bucket"
        );
        let total: u64 = sums.iter().flatten().flatten().sum();
        assert_eq!(total, 5);

        // The child of a fork starts from nothing.
        shard.owner.store(1, Ordering::Relaxed);
        shard.clear();
        assert_eq!(latency_of(shard), [[[0; TIMED_MOUNTS]; BUCKETS]; CLASSES]);
        assert_eq!(shard.owner.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn latency_rows_name_the_mountpoint_and_leave_out_empty_buckets() {
        if !timing_gets_ready() {
            return; // nothing is timed here (the test above checks that)
        }
        // Mountpoint 3, read by no other test: counted by this thread's own shard.
        let mounts: Vec<String> = (0..TIMED_MOUNTS).map(|i| format!("/m{i}")).collect();
        let rows_of_m3 = || {
            latency_rows(&mounts)
                .into_iter()
                .filter(|row| row.mount == "/m3")
                .collect::<Vec<_>>()
        };
        assert!(rows_of_m3().is_empty());
        let ticks = (2_000.0 / tsc::ns_per_tick()) as u64;
        local().served(3, Op::Getxattr, ticks);
        local().served(3, Op::Getxattr, ticks);
        let rows = rows_of_m3();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].class, Class::Xattr);
        let mut expected = vec![0; bucket_of(2_000) + 1];
        expected[bucket_of(2_000)] = 2;
        assert_eq!(rows[0].counts, expected);
    }

    #[test]
    fn counts_from_many_threads_are_exact() {
        let before = managed_reads();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..10_000 {
                        local().managed(Op::Read, false, 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(managed_reads() - before, 80_000);
    }
}
