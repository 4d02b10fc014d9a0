//! A lock-free token bucket (GCRA, the generic cell rate algorithm) that delays
//! requests instead of refusing them.
//!
//! One atomic word holds the *theoretical arrival time* (TAT): the instant at which the
//! bucket would be full again. A request of cost `c` reserves `c·T` of it (`T` = time per
//! token); it may start once the debt ahead of it is within the burst tolerance `τ`.
//! Reservations are taken in CAS order, so waiters are served FIFO and a request larger
//! than the burst is admitted when the bucket is full, then paid for by those after it
//! (no starvation).
//!
//! A reservation may also *lease* tokens for later (see `credit`): GCRA charges tokens
//! when they are reserved, so tokens reserved ahead are already paid for.
//!
//! Time is kept in units of 2⁻¹⁰ ns since the bucket's first configuration (range ≈ 208
//! days; `CLOCK_MONOTONIC` itself counts from boot, and compute nodes stay up longer),
//! and the time per token as a 48.16 fixed-point number of those units, so rates from
//! 1/s up to 2⁴⁸/s (256 TiB/s) are represented: `governor`'s u32 cells per period can't
//! express tens of GB/s counted in bytes.

use padll_wire::channel::ChannelSpec;
use std::sync::atomic::{AtomicU64, Ordering};

/// Sub-nanosecond resolution of the bucket clock (2⁻¹⁰ ns).
const UNIT_SHIFT: u32 = 10;
/// Fractional bits of the per-token interval.
const FRACTION_SHIFT: u32 = 16;
pub use padll_wire::channel::MAX_RATE;

/// Current monotonic time in nanoseconds.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer; CLOCK_MONOTONIC always exists (vDSO, no syscall).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// A rate and burst, validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    /// Tokens per second, 1..=[`MAX_RATE`].
    pub rate: u64,
    /// Bucket depth in tokens (≥ 1).
    pub burst: u64,
}

impl Limit {
    /// The limit `spec`'s bucket enforces, in its units ([`ChannelSpec::units_per_token`]).
    pub fn of(spec: &ChannelSpec) -> Limit {
        let units = spec.units_per_token();
        Limit {
            rate: spec.rate.saturating_mul(units),
            burst: spec.burst.saturating_mul(units),
        }
    }
}

/// Outcome of a reservation: how long the caller must wait before proceeding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Absolute time (ns, [`now_ns`] clock) at which the request may proceed.
    pub start_ns: u64,
    /// Tokens reserved beyond the cost (the lease asked for, or 0).
    pub leased: u64,
}

/// The bucket state: lock-free, shared by every thread using the channel — or, placed
/// in shared memory (`shared`), by every process of a job on the node. Plain atomics
/// with a fixed layout, so any bit pattern is a value and any process may change it.
#[repr(C)]
pub struct TokenBucket {
    /// Theoretical arrival time, in units.
    tat: AtomicU64,
    /// Time per token in units, 48.16 fixed point.
    interval: AtomicU64,
    /// Burst tolerance τ in units.
    tolerance: AtomicU64,
    /// The [`now_ns`] time that unit 0 stands for: set by the first configuration and
    /// never changed, so a TAT written under one origin is never read under another.
    origin: AtomicU64,
}

impl TokenBucket {
    /// A bucket that admits nothing until [`TokenBucket::configure`] is called.
    pub const fn new() -> TokenBucket {
        TokenBucket {
            tat: AtomicU64::new(0),
            interval: AtomicU64::new(0),
            tolerance: AtomicU64::new(0),
            origin: AtomicU64::new(0),
        }
    }

    /// Sets the rate and burst of a new bucket, full.
    pub fn configure(&self, limit: Limit) {
        self.configure_at(limit, now_ns());
    }

    /// Forgets the rate and the clock origin: the bucket admits nothing until it is
    /// configured again (a shared bucket being reset for a new job).
    pub fn clear(&self) {
        for word in [&self.tat, &self.interval, &self.tolerance, &self.origin] {
            word.store(0, Ordering::Relaxed);
        }
    }

    /// [`TokenBucket::configure`] at time `now_ns`.
    pub(crate) fn configure_at(&self, limit: Limit, now_ns: u64) {
        let _ = self
            .origin
            .compare_exchange(0, now_ns, Ordering::AcqRel, Ordering::Acquire);
        let (interval, tolerance) = parameters(limit);
        self.interval.store(interval, Ordering::Relaxed);
        self.tolerance.store(tolerance, Ordering::Relaxed);
        self.tat.store(self.units(now_ns), Ordering::Release);
    }

    /// Changes the rate and burst of a bucket in use: it keeps the tokens it holds, at
    /// most the new burst (a change adds no tokens, and a lowered rule never lets more
    /// through at once than its own depth), and the tokens it owes (its debt: requests
    /// admitted and reserved beyond what it held), now owed at the new rate — a raised
    /// rate pays them off sooner, a lowered one later. Requests waiting give their
    /// reservation back and reserve again at the new rate (`channels`), so a raised rate
    /// applies to them at once.
    pub fn reconfigure(&self, limit: Limit) {
        self.reconfigure_at(limit, now_ns());
    }

    /// [`TokenBucket::reconfigure`] at time `now_ns`.
    pub(crate) fn reconfigure_at(&self, limit: Limit, now_ns: u64) {
        let old_interval = self.interval.load(Ordering::Relaxed);
        if old_interval == 0 {
            return self.configure_at(limit, now_ns);
        }
        let old_tolerance = self.tolerance.load(Ordering::Relaxed);
        let (interval, tolerance) = parameters(limit);
        self.interval.store(interval, Ordering::Relaxed);
        self.tolerance.store(tolerance, Ordering::Relaxed);
        let now = self.units(now_ns);
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                // The bucket is *empty* at TAT = now + τ: [`Self::reserve`] still admits
                // one request at once there, and none beyond it. Short of it, the bucket
                // holds tokens; past it, it owes them. Either is time at the old rate,
                // converted to the new one: tokens held, at most the new depth; tokens
                // owed, all of them.
                let empty = now.saturating_add(old_tolerance);
                let new_empty = now.saturating_add(tolerance);
                Some(if tat > empty {
                    new_empty.saturating_add(rescale(tat - empty, interval, old_interval))
                } else {
                    let held = empty - tat.max(now);
                    new_empty - rescale(held, interval, old_interval).min(tolerance)
                })
            });
    }

    /// How long before `now_ns` the bucket was first configured (0 before that).
    pub fn age_ns(&self, now_ns: u64) -> u64 {
        let origin = self.origin.load(Ordering::Relaxed);
        if origin == 0 {
            0
        } else {
            now_ns.saturating_sub(origin)
        }
    }

    /// A [`now_ns`] time in bucket units.
    #[inline]
    fn units(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.origin.load(Ordering::Relaxed)) << UNIT_SHIFT
    }

    /// Reserves `cost` tokens at time `now_ns` and says when the request may start.
    /// A zero cost is admitted at once and reserves nothing.
    ///
    /// Extra tokens for the caller's next requests (credit, see `credit`) come in two
    /// ways, both charged here:
    /// - a *lease* of `lease` tokens, only if the bucket holds `cost + lease` now (the
    ///   larger reservation still ends within τ of now, so it starts at once and puts no
    ///   one in debt);
    /// - a *batch* of `batch` tokens, only if the request must wait anyway, behind no
    ///   more than two batches' worth of other requests: it then waits until the last of
    ///   them conforms, so one sleep admits `cost + batch` tokens and none is spent
    ///   before GCRA would have admitted it. (Behind a long queue — many waiting threads —
    ///   a batch would hold its early tokens idle while its thread sleeps for the last.)
    ///
    /// Otherwise exactly `cost` is reserved, so a limiting bucket stays FIFO and exact.
    pub fn reserve(&self, cost: u64, lease: u64, batch: u64, now_ns: u64) -> Reservation {
        if cost == 0 {
            return Reservation {
                start_ns: now_ns,
                leased: 0,
            };
        }
        let now = self.units(now_ns);
        let interval = self.interval.load(Ordering::Relaxed) as u128;
        let cost_price = price(cost, interval);
        let tolerance = self.tolerance.load(Ordering::Relaxed);
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let base = tat.max(now);
            // How far the queue ahead reaches beyond the tolerance (0: no wait).
            let queued = base.saturating_sub(now.saturating_add(tolerance));
            let leased_tat = base.saturating_add(price(cost.saturating_add(lease), interval));
            let batch_price = price(batch, interval);
            let (new_tat, leased, start) =
                if lease != 0 && leased_tat <= now.saturating_add(tolerance) {
                    (leased_tat, lease, now)
                } else if batch != 0 && queued != 0 && queued <= batch_price.saturating_mul(2) {
                    (
                        base.saturating_add(price(cost.saturating_add(batch), interval)),
                        batch,
                        base.saturating_add(batch_price) - tolerance,
                    )
                } else {
                    (
                        base.saturating_add(cost_price),
                        0,
                        base.saturating_sub(tolerance).max(now),
                    )
                };
            match self
                .tat
                .compare_exchange_weak(tat, new_tat, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Reservation {
                        start_ns: (start >> UNIT_SHIFT) + self.origin.load(Ordering::Relaxed),
                        leased,
                    };
                }
                Err(current) => tat = current,
            }
        }
    }

    /// Returns `cost` unused tokens (e.g. a read that returned fewer bytes than asked),
    /// never crediting beyond a full bucket.
    pub fn refund(&self, cost: u64, now_ns: u64) {
        let now = self.units(now_ns);
        let price = price(cost, self.interval.load(Ordering::Relaxed) as u128);
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                (tat > now).then(|| tat.saturating_sub(price).max(now))
            });
    }
}

/// A limit's time per token (48.16 fixed point) and burst tolerance, in units.
fn parameters(limit: Limit) -> (u64, u64) {
    let rate = limit.rate.clamp(1, MAX_RATE) as u128;
    let unit_per_sec = 1_000_000_000u128 << UNIT_SHIFT;
    let interval = (unit_per_sec << FRACTION_SHIFT) / rate;
    let tolerance = (limit.burst.max(1) as u128 * interval) >> FRACTION_SHIFT;
    (interval as u64, tolerance.min(u64::MAX as u128 / 4) as u64)
}

/// A span of `time` units at interval `from`, as the same tokens at interval `to`
/// (saturating, as [`price`]).
fn rescale(time: u64, to: u64, from: u64) -> u64 {
    (time as u128 * to as u128 / from.max(1) as u128).min(u64::MAX as u128 / 4) as u64
}

/// The time `cost` tokens take at `interval` (48.16 fixed point), in units.
#[inline]
fn price(cost: u64, interval: u128) -> u64 {
    ((cost as u128 * interval) >> FRACTION_SHIFT).min(u64::MAX as u128 / 4) as u64
}

impl Default for TokenBucket {
    fn default() -> Self {
        TokenBucket::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates back-to-back requests that start as soon as admitted and returns the
    /// time (ns) at which the n-th request starts.
    fn start_of_last(bucket: &TokenBucket, n: u64, cost: u64, t0: u64) -> u64 {
        let mut now = t0;
        for _ in 0..n {
            now = now.max(bucket.reserve(cost, 0, 0, now).start_ns);
        }
        now
    }

    #[test]
    fn admits_at_the_configured_rate() {
        for (rate, cost) in [
            (1u64, 1u64),
            (1000, 1),
            (5000, 1),
            (100 << 20, 4096),
            (1 << 40, 1 << 20),
        ] {
            let bucket = TokenBucket::new();
            bucket.configure(Limit { rate, burst: 1 });
            let t0 = now_ns();
            let n = 200;
            let elapsed = start_of_last(&bucket, n + 1, cost, t0) - t0;
            let expected = (n as f64 * cost as f64 / rate as f64) * 1e9;
            let error = (elapsed as f64 - expected).abs() / expected;
            assert!(
                error < 0.01,
                "rate {rate} cost {cost}: {elapsed} ns vs {expected} ns"
            );
        }
    }

    #[test]
    fn burst_is_free_then_rate_applies() {
        let bucket = TokenBucket::new();
        bucket.configure(Limit {
            rate: 100,
            burst: 10,
        });
        let t0 = now_ns();
        // The first 10 requests (the burst) and one more start immediately.
        for _ in 0..11 {
            assert_eq!(bucket.reserve(1, 0, 0, t0).start_ns, t0);
        }
        // The next one waits one interval (10 ms).
        let start = bucket.reserve(1, 0, 0, t0).start_ns;
        assert!((start - t0).abs_diff(10_000_000) < 1000, "{}", start - t0);
    }

    #[test]
    fn larger_than_burst_is_admitted_then_paid_for() {
        let bucket = TokenBucket::new();
        bucket.configure(Limit {
            rate: 1000,
            burst: 10,
        });
        let t0 = now_ns();
        assert_eq!(bucket.reserve(5000, 0, 0, t0).start_ns, t0);
        let next = bucket.reserve(1, 0, 0, t0).start_ns;
        // 5 s of debt minus the 10-token tolerance.
        assert!(
            (next - t0).abs_diff(4_990_000_000) < 10_000,
            "{}",
            next - t0
        );
    }

    #[test]
    fn leases_are_taken_only_from_tokens_the_bucket_holds() {
        let bucket = TokenBucket::new();
        bucket.configure(Limit {
            rate: 1000,
            burst: 100,
        });
        let t0 = now_ns();
        // Nine leases of 1 + 10 tokens fit in the 100-token burst and start at once.
        for _ in 0..9 {
            assert_eq!(
                bucket.reserve(1, 10, 0, t0),
                Reservation {
                    start_ns: t0,
                    leased: 10
                }
            );
        }
        // One token is left: no lease, the cost alone is reserved, as without leases
        // (this GCRA admits burst + 1 at once).
        for _ in 0..2 {
            assert_eq!(bucket.reserve(1, 10, 0, t0).leased, 0);
        }
        // The leased tokens were charged: the bucket is now limiting, so no lease, and
        // the next request waits one interval.
        let next = bucket.reserve(1, 10, 0, t0);
        assert_eq!(next.leased, 0);
        assert!(
            (next.start_ns - t0).abs_diff(1_000_000) < 1000,
            "{}",
            next.start_ns - t0
        );
    }

    #[test]
    fn a_batch_waits_until_its_last_token_conforms() {
        let bucket = TokenBucket::new();
        bucket.configure(Limit {
            rate: 1000,
            burst: 1,
        });
        let t0 = now_ns();
        // Not waiting: a batch is not taken (the bucket holds tokens now).
        assert_eq!(bucket.reserve(1, 0, 9, t0).leased, 0);
        assert_eq!(bucket.reserve(1, 0, 9, t0).leased, 0);
        // Waiting: 1 + 9 tokens reserved; the request starts when the ninth extra one
        // conforms (one interval after the last, 9 more intervals: 10 ms).
        let batch = bucket.reserve(1, 0, 9, t0);
        let second = bucket.reserve(1, 0, 9, t0);
        assert_eq!(second.leased, 9, "behind one batch: a batch");
        let third = bucket.reserve(1, 0, 9, t0);
        assert_eq!(third.leased, 0, "behind two batches: no batch");
        bucket.refund(11, t0);
        assert_eq!(batch.leased, 9);
        assert!(
            (batch.start_ns - t0).abs_diff(10_000_000) < 1000,
            "{}",
            batch.start_ns - t0
        );
        // They were charged: the next request waits behind all of them.
        let next = bucket.reserve(1, 0, 0, t0).start_ns;
        assert!((next - t0).abs_diff(11_000_000) < 1000, "{}", next - t0);
    }

    #[test]
    fn refund_returns_unused_tokens() {
        let bucket = TokenBucket::new();
        bucket.configure(Limit {
            rate: 1000,
            burst: 1,
        });
        let t0 = now_ns();
        bucket.reserve(1000, 0, 0, t0);
        bucket.refund(1000, t0);
        assert_eq!(bucket.reserve(1, 0, 0, t0).start_ns, t0);
    }

    #[test]
    fn a_rate_change_carries_the_debt_at_the_new_rate() {
        let t0 = 1_000_000_000;
        // Raised: 99 tokens owed at 1/s (100 admitted at once, the tolerance held one),
        // 99 s, are 99 µs at 1 M/s. The next request starts then, not at once (the debt
        // forgiven, each re-rate let one through) nor after 99 s (the old rate).
        let bucket = TokenBucket::new();
        bucket.configure_at(Limit { rate: 1, burst: 1 }, t0);
        assert_eq!(bucket.reserve(100, 0, 0, t0).start_ns, t0);
        bucket.reconfigure_at(
            Limit {
                rate: 1_000_000,
                burst: 1,
            },
            t0,
        );
        let next = bucket.reserve(1, 0, 0, t0).start_ns;
        assert!((next - t0).abs_diff(99_000) <= 1, "{}", next - t0);
        let after = bucket.reserve(1, 0, 0, t0).start_ns;
        assert!((after - t0).abs_diff(100_000) <= 1, "{}", after - t0);
        // Lowered: 1000 tokens owed at 1000/s (1 s) are 10 s at 100/s.
        let bucket = TokenBucket::new();
        bucket.configure_at(
            Limit {
                rate: 1000,
                burst: 10,
            },
            t0,
        );
        assert_eq!(bucket.reserve(1010, 0, 0, t0).start_ns, t0);
        bucket.reconfigure_at(
            Limit {
                rate: 100,
                burst: 10,
            },
            t0,
        );
        let next = bucket.reserve(1, 0, 0, t0).start_ns;
        assert!((next - t0).abs_diff(10_000_000_000) <= 1, "{}", next - t0);
        // Later, it is paid off at the new rate: one token per 10 ms.
        let t1 = t0 + 10_020_000_000;
        assert_eq!(admitted_at_once(&bucket, t1), 2);
        // Any number of changes back and forth leave it as it was.
        let bucket = TokenBucket::new();
        bucket.configure_at(Limit { rate: 10, burst: 1 }, t0);
        bucket.reserve(50, 0, 0, t0);
        for _ in 0..1000 {
            bucket.reconfigure_at(Limit { rate: 11, burst: 1 }, t0);
            bucket.reconfigure_at(Limit { rate: 10, burst: 1 }, t0);
        }
        let next = bucket.reserve(1, 0, 0, t0).start_ns;
        assert!((next - t0).abs_diff(4_900_000_000) < 1_000, "{}", next - t0);
    }

    /// Re-rated every 10 ms between 10/s and 11/s, burst 1, with 8 threads always
    /// waiting (each gives its reservation back at a change and reserves again, as
    /// `channels` does): the bucket admits its rate, ≈ 10.5/s — not a token per change
    /// (each change emptied the bucket, and `reserve` admits one at once when empty:
    /// 100/s), nor less and less (the waiters' reservations counted twice).
    #[test]
    fn waiters_through_many_rate_changes_get_the_rate() {
        let t0 = 1_000_000_000;
        let bucket = TokenBucket::new();
        let limit = |step: u64| Limit {
            rate: 10 + step % 2,
            burst: 1,
        };
        bucket.configure_at(limit(0), t0);
        let mut starts: Vec<u64> = (0..8)
            .map(|_| bucket.reserve(1, 0, 0, t0).start_ns)
            .collect();
        let mut admitted = 0;
        let seconds = 10;
        for ms in 0..seconds * 1000 {
            let now = t0 + ms * 1_000_000;
            if ms % 10 == 0 && ms != 0 {
                bucket.reconfigure_at(limit(ms / 10), now);
                for start in starts.iter_mut().filter(|start| **start > now) {
                    bucket.refund(1, now);
                    *start = bucket.reserve(1, 0, 0, now).start_ns;
                }
            }
            for start in starts.iter_mut() {
                while *start <= now {
                    admitted += 1;
                    *start = bucket.reserve(1, 0, 0, now).start_ns;
                }
            }
        }
        // 10.5/s, the burst and GCRA's one more, each thread's first request.
        assert!(
            (100..=11 * seconds + 2 + 8).contains(&admitted),
            "{admitted} admitted in {seconds} s"
        );
    }

    #[test]
    fn a_rate_change_with_a_huge_debt_saturates() {
        let t0 = 1_000_000_000;
        let bucket = TokenBucket::new();
        bucket.configure_at(Limit { rate: 1, burst: 1 }, t0);
        // The largest debt a reservation can make (its price is capped), then more.
        bucket.reserve(u64::MAX, 0, 0, t0);
        bucket.reserve(u64::MAX, 0, 0, t0);
        for rate in [1, MAX_RATE, 1, 1] {
            bucket.reconfigure_at(
                Limit {
                    rate,
                    burst: u64::MAX,
                },
                t0,
            );
        }
        // Still owed: the bucket's clock holds ≈ 208 days, a price at most a quarter.
        let month = 30 * 86_400 * 1_000_000_000u64;
        let next = bucket.reserve(1, 0, 0, t0).start_ns;
        assert!(next > t0 + month, "{next}");
        // A raised rate still pays it off at once.
        bucket.reconfigure_at(
            Limit {
                rate: MAX_RATE,
                burst: 1,
            },
            t0,
        );
        let next = bucket.reserve(1, 0, 0, t0).start_ns;
        assert!(next < t0 + 1_000_000_000, "{}", next - t0);
    }

    /// How many requests of one token start at `now` (the bucket is drained; the first
    /// that would wait is refunded).
    fn admitted_at_once(bucket: &TokenBucket, now: u64) -> u64 {
        let mut admitted = 0;
        while bucket.reserve(1, 0, 0, now).start_ns == now {
            admitted += 1;
        }
        bucket.refund(1, now);
        admitted
    }

    #[test]
    fn a_rate_change_keeps_the_tokens_held_up_to_the_new_depth() {
        let t0 = 1_000_000_000;
        let old = Limit {
            rate: 4000,
            burst: 40,
        };
        let new = Limit {
            rate: 2000,
            burst: 20,
        };
        // Full at the old depth: no more than the new depth passes at once.
        let bucket = TokenBucket::new();
        bucket.configure_at(old, t0);
        bucket.reconfigure_at(new, t0);
        assert_eq!(admitted_at_once(&bucket, t0), 21);
        // Drained under the old rule: a change adds no tokens (a refill let the new
        // depth through at once at every change).
        let bucket = TokenBucket::new();
        bucket.configure_at(old, t0);
        assert_eq!(admitted_at_once(&bucket, t0), 41);
        bucket.reconfigure_at(new, t0);
        assert_eq!(
            admitted_at_once(&bucket, t0),
            0,
            "none: it still owes GCRA's one beyond the burst"
        );
        // Then the new rate: 10 ms later, 20 more tokens, less the one owed, and GCRA's
        // own.
        assert_eq!(admitted_at_once(&bucket, t0 + 10_000_000), 20);
        // Partly held: kept as it is, whether the rate is lowered or raised.
        for (rate, burst) in [(2000, 20), (8000, 80)] {
            let bucket = TokenBucket::new();
            bucket.configure_at(old, t0);
            for _ in 0..30 {
                bucket.reserve(1, 0, 0, t0);
            }
            bucket.reconfigure_at(Limit { rate, burst }, t0);
            assert_eq!(admitted_at_once(&bucket, t0), 11, "{rate}/s");
        }
        // A bucket never configured is configured full.
        let bucket = TokenBucket::new();
        bucket.reconfigure_at(new, t0);
        assert_eq!(admitted_at_once(&bucket, t0), 21);
    }

    #[test]
    fn throttles_on_a_node_up_for_years() {
        // CLOCK_MONOTONIC counts from boot: 3 years of uptime is 2^56.7 ns, beyond the
        // 2^54 ns that 2^-10 ns units hold; the bucket counts from its own origin.
        let boot_plus_3_years = 3 * 365 * 86_400 * 1_000_000_000u64;
        let bucket = TokenBucket::new();
        bucket.configure_at(Limit { rate: 10, burst: 1 }, boot_plus_3_years);
        let t0 = boot_plus_3_years + 5_000;
        assert_eq!(bucket.reserve(1, 0, 0, t0).start_ns, t0);
        // One more fits in the burst tolerance; after it, one per 100 ms.
        let last = start_of_last(&bucket, 10, 1, t0);
        assert!(
            (last - t0).abs_diff(900_000_000) < 1_000_000,
            "last of 10 more started {} ms after the first",
            (last - t0) / 1_000_000
        );
    }

    #[test]
    fn zero_cost_is_free() {
        let bucket = TokenBucket::new();
        bucket.configure(Limit { rate: 1, burst: 1 });
        let t0 = now_ns();
        bucket.reserve(10, 0, 0, t0);
        assert_eq!(bucket.reserve(0, 0, 0, t0).start_ns, t0);
    }

    #[test]
    fn concurrent_reservations_are_all_counted() {
        let bucket: &'static TokenBucket = Box::leak(Box::new(TokenBucket::new()));
        bucket.configure(Limit {
            rate: 1_000_000,
            burst: 1,
        });
        let t0 = now_ns();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..10_000)
                        .map(|_| bucket.reserve(1, 0, 0, t0).start_ns)
                        .max()
                })
            })
            .collect();
        let last = threads
            .into_iter()
            .map(|t| t.join().unwrap().unwrap())
            .max()
            .unwrap();
        // 40 000 tokens at 1 M/s: the last one starts ~40 ms after t0.
        assert!((last - t0).abs_diff(40_000_000) < 100_000, "{}", last - t0);
    }
}
