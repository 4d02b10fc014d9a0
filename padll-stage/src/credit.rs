//! A thread's *credit* in a channel: tokens charged to the channel's bucket ahead of the
//! thread's requests, which its next requests spend without touching the bucket. Every
//! rule about credit is here; the data lives where it is fastest to reach:
//!
//! - [`Credit`], one row per thread and channel, sits in the thread's statistics shard
//!   beside the channel's counters (`stats`): the managed path's credit check and its
//!   counting touch one cache line, and only the owning thread writes the row, so credit
//!   is spent with plain stores. The overflow shard's rows are never leased into
//!   (`stats::Counters::owned_credit`). A signal handler that spends credit on
//!   the thread it interrupted, between that thread's load and store, spends the same
//!   tokens twice (at most its own requests' cost).
//! - [`Terms`], one per channel, sits in the channel's slot (`channels`): how much a
//!   thread may lease or batch, and for how long.
//!
//! **Leases.** A bucket's CAS is the one write every thread shares, so when a bucket
//! holds plenty of tokens a thread reserves its cost plus a *lease* (burst/16 tokens, at
//! most 256 requests or 1 MiB) in that CAS and spends the lease from its credit, with no
//! shared write. This keeps the limit because GCRA charges tokens when they are
//! reserved: leased tokens advanced the TAT like any request, so they only move
//! consumption later in time. To bound that, credit expires τ/4 after it was leased
//! (τ = burst/rate): tokens consumed in any window W were then charged in W or up to τ/4
//! before it, so consumption ≤ rate·(W + τ/4) + burst + one request, i.e. at most a
//! quarter burst more than GCRA alone. A bucket that could not give the whole lease at
//! once (it is limiting, or nearly) reserves exactly the cost, so waiters stay FIFO and
//! exact.
//!
//! **Batches.** A thread that must wait anyway reserves tokens for its next requests
//! too and sleeps until the last of them conforms (one wake-up per batch, see
//! [`Terms::take`] and docs/stage-internals.md, "Throttled threads"); a batch's tokens are spent
//! no earlier than GCRA would admit them (they become credit when the thread wakes: a
//! signal handler on the sleeping thread cannot spend them, and takes its own cost
//! only, leaving the row to the thread), and within τ/4 of its thread's waking.
//!
//! Credit is tagged with the channel's generation, so a re-rate or removal voids it.
//! Expired or insufficient credit of the current generation goes back to the bucket when
//! the thread next takes from it, ends, or the process exits ([`Credit::give_back`]: a
//! refund only cancels debt, never fills a bucket beyond full; without it a thread that
//! did not spend its credit in time would lose it); counters count tokens when spent.

use crate::bucket::{Reservation, TokenBucket};
use crate::tsc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Largest lease of a request channel, in tokens (scaled to a weighted channel's
/// thousandths): 256 requests per shared CAS is enough to make the CAS cheap next to
/// the call.
const MAX_LEASE_REQUESTS: u64 = 256;
/// Largest lease of a byte channel: 256 reads of 4 KiB.
const MAX_LEASE_BYTES: u64 = 1 << 20;
/// Smaller leases (burst < 128 tokens: low rates, where accuracy matters most and the
/// CAS is no bottleneck) are not taken; in tokens, scaled like [`MAX_LEASE_REQUESTS`].
const MIN_LEASE: u64 = 8;
/// How much of a channel's rate one sleep may admit for a thread (its batch, see `take`):
/// a 128th of the time the bucket has been in use (the job's time on the node, for a
/// job-wide bucket), from 32 ms up to 128 ms. A sleep and wake-up cost a thread 30–100 µs
/// of CPU on the 2-core VM this was measured on (a bare `nanosleep` ≈ 6 µs; the rest is
/// the cold caches its next calls find), so at 1 000 ops/s a thread sleeping once per 32
/// requests spent 1–3 µs per request on sleeping alone, once per 128 requests under 1 µs.
/// A batch is also what a job may be short of when it stops (a process sleeps for its
/// batch's last token, and may need only its first), about one or two spans in all,
/// so the span grows with the run: whenever a job stops it has lost about 1 % of its
/// run, or 30–60 ms in its first four seconds.
const BATCH_SPAN_MIN_NS: u64 = 32_000_000;
/// See [`BATCH_SPAN_MIN_NS`].
const BATCH_SPAN_MAX_NS: u64 = 128_000_000;
/// See [`BATCH_SPAN_MIN_NS`]: a batch spans at most the bucket's age divided by this.
const BATCH_SPAN_AGE_DIVISOR: u64 = 128;

/// The batch span of a bucket in use for `age_ns` (see [`BATCH_SPAN_MIN_NS`]).
fn batch_span_ns(age_ns: u64) -> u64 {
    (age_ns / BATCH_SPAN_AGE_DIVISOR).clamp(BATCH_SPAN_MIN_NS, BATCH_SPAN_MAX_NS)
}

/// One thread's credit in one channel. Only its thread writes it.
#[repr(C)]
#[derive(Default)]
pub struct Credit {
    /// Leased tokens not yet spent, valid while the channel's generation is
    /// `generation` and before `expires` (ns).
    tokens: AtomicU64,
    generation: AtomicU64,
    expires: AtomicU64,
    /// Until when the managed path may spend the credit: a time-stamp counter value
    /// reached no later than `expires` ([`crate::tsc::deadline`]; 0 = never).
    deadline: AtomicU64,
    /// Tokens of the last lease or batch (what `tokens` started from).
    granted: AtomicU64,
    /// Whether the row's thread is asleep for a batch (between [`Terms::take`] and
    /// [`Terms::relet_after_waking`]): only a signal handler on that thread takes
    /// meanwhile, and it must leave the row to the thread.
    asleep: AtomicBool,
    /// The thread's time per request in this channel (moving average, ns; 0 = unknown).
    call_ns: AtomicU64,
}

impl Credit {
    /// No credit, and no pace measured yet.
    pub const fn new() -> Credit {
        Credit {
            tokens: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            expires: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            asleep: AtomicBool::new(false),
            call_ns: AtomicU64::new(0),
        }
    }

    /// Spends `cost` tokens if the credit holds that many, leased under `generation` and
    /// unexpired at `now` (ns). A row never leased into has expired.
    #[inline]
    fn spend(&self, generation: u64, cost: u64, now: u64) -> bool {
        let tokens = self.tokens.load(Ordering::Relaxed);
        if tokens < cost
            || self.expires.load(Ordering::Relaxed) <= now
            || self.generation.load(Ordering::Relaxed) != generation
        {
            return false;
        }
        self.tokens.store(tokens - cost, Ordering::Relaxed);
        true
    }

    /// [`Self::spend`] for the managed path: `stamp` is [`crate::tsc::ticks`], compared
    /// with the credit's tick deadline. Loads and one plain store; cannot panic.
    #[inline(always)]
    pub fn spend_at(&self, generation: u64, cost: u64, stamp: u64) -> bool {
        let tokens = self.tokens.load(Ordering::Relaxed);
        let until = self.deadline.load(Ordering::Relaxed);
        if tokens < cost || until <= stamp || self.generation.load(Ordering::Relaxed) != generation
        {
            return false;
        }
        self.tokens.store(tokens - cost, Ordering::Relaxed);
        true
    }

    /// Replaces the credit (what is left of the old one is dropped: too little, expired
    /// or stale); `tokens` may be 0: the grant's time is still what [`Self::next_batch`]
    /// measures the thread's pace from. Stored amount first: a signal handler that sees a
    /// torn lease sees an older generation or an earlier expiry, never more.
    fn lease(&self, generation: u64, tokens: u64, expires: u64, until: u64) {
        self.tokens.store(tokens, Ordering::Relaxed);
        self.granted.store(tokens, Ordering::Relaxed);
        self.generation.store(generation, Ordering::Relaxed);
        self.expires.store(expires, Ordering::Relaxed);
        self.deadline.store(until, Ordering::Relaxed);
    }

    /// How many tokens the thread should reserve ahead if its request of `cost` must
    /// wait: as many as it is expected to spend within half the credit's lifetime `ttl`,
    /// at most `max`. Called at `now`, when its credit could not pay: the requests it
    /// made since its last grant and the time they took update its average time per
    /// request (so a thread whose calls are slow — a loaded file system — gets no batch
    /// and wastes no tokens, and a fast one gets a full batch).
    fn next_batch(&self, cost: u64, now: u64, ttl: u64, max: u64) -> u64 {
        let expires = self.expires.load(Ordering::Relaxed);
        let mut call_ns = self.call_ns.load(Ordering::Relaxed);
        if expires != 0 {
            let granted = self.granted.load(Ordering::Relaxed);
            let spent = granted.saturating_sub(self.tokens.load(Ordering::Relaxed));
            let calls = spent / cost.max(1) + 1;
            let sample = now.saturating_sub(expires.saturating_sub(ttl)) / calls;
            call_ns = if call_ns == 0 {
                sample.max(1)
            } else {
                (call_ns - call_ns / 8 + sample / 8).max(1)
            };
            self.call_ns.store(call_ns, Ordering::Relaxed);
        }
        if call_ns == 0 {
            return 0;
        }
        (ttl / 2 / call_ns).saturating_mul(cost).min(max)
    }

    /// Whether the row's thread is asleep for a batch: a call that finds it so is a
    /// signal handler's, on that thread.
    pub fn asleep(&self) -> bool {
        self.asleep.load(Ordering::Relaxed)
    }

    /// Gives the unspent credit back to `bucket` at `now` if it was charged under
    /// `generation` (spendable or expired: either way those tokens were charged and will
    /// not be spent), so it is not lost to the job.
    pub fn give_back(&self, bucket: &TokenBucket, generation: u64, now: u64) {
        let tokens = self.tokens.load(Ordering::Relaxed);
        if tokens == 0 || self.generation.load(Ordering::Relaxed) != generation {
            return;
        }
        self.tokens.store(0, Ordering::Relaxed);
        bucket.refund(tokens, now);
    }

    /// Forgets the credit and the pace (a forked child starts its own account). Writes
    /// only what is not zero yet, so untouched pages stay unallocated.
    pub fn reset(&self) {
        for word in [
            &self.tokens,
            &self.generation,
            &self.expires,
            &self.deadline,
            &self.granted,
            &self.call_ns,
        ] {
            if word.load(Ordering::Relaxed) != 0 {
                word.store(0, Ordering::Relaxed);
            }
        }
        if self.asleep() {
            self.asleep.store(false, Ordering::Relaxed);
        }
    }

    /// The unspent tokens, whatever their validity.
    #[cfg(test)]
    pub fn unspent(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }
}

/// How much credit a channel lends, and for how long; set from its rate and burst.
#[derive(Default)]
pub struct Terms {
    /// Tokens a thread leases beyond its cost when the bucket holds them (0 = none).
    lease: AtomicU64,
    /// How long credit stays spendable (τ/4, ns).
    ttl_ns: AtomicU64,
    /// Tokens per second, for the size of a batch ([`Terms::max_batch`]).
    rate: AtomicU64,
    /// Most tokens a batch holds whatever its span (a lease's cap).
    batch_cap: AtomicU64,
}

impl Terms {
    /// No lease, no batch.
    pub const fn new() -> Terms {
        Terms {
            lease: AtomicU64::new(0),
            ttl_ns: AtomicU64::new(0),
            rate: AtomicU64::new(0),
            batch_cap: AtomicU64::new(0),
        }
    }

    /// Sets the lease size and lifetime, and the batch size, that follow from a
    /// channel's `rate` and `burst` in its bucket's units (bytes if `counts_bytes`,
    /// else `units_per_token` per request token: a weighted channel's thousandths).
    pub fn configure(&self, rate: u64, burst: u64, counts_bytes: bool, units_per_token: u64) {
        let cap = if counts_bytes {
            MAX_LEASE_BYTES
        } else {
            MAX_LEASE_REQUESTS * units_per_token
        };
        let lease = (burst / 16).min(cap);
        let min_lease = MIN_LEASE * units_per_token;
        let tau_ns = burst as u128 * 1_000_000_000 / rate.max(1) as u128;
        self.rate.store(rate, Ordering::Relaxed);
        self.batch_cap.store(cap, Ordering::Relaxed);
        self.lease
            .store(if lease < min_lease { 0 } else { lease }, Ordering::Relaxed);
        self.ttl_ns
            .store((tau_ns / 4).min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Takes `cost` tokens at `now` for a thread — from its `credit` if that holds
    /// enough, else from `bucket` — and says when the request may start. A thread with a
    /// credit row (`None`: it cannot hold credit) also reserves tokens for its next
    /// requests: a lease if the bucket can spare them now, or, if it must wait anyway, a
    /// batch (its sleep then admits them all: one wake-up per batch instead of one per
    /// request). `generation` was read before the bucket, so credit taken across a
    /// re-rate carries the old one and is void. `ticks` is a [`tsc::ticks`] value read
    /// before `now`: the credit's tick deadline counts from it.
    #[inline]
    pub fn take(
        &self,
        bucket: &TokenBucket,
        credit: Option<&Credit>,
        generation: u64,
        cost: u64,
        now: u64,
        ticks: u64,
    ) -> Reservation {
        let Some(credit) = credit else {
            return bucket.reserve(cost, 0, 0, now);
        };
        if credit.spend(generation, cost, now) {
            return Reservation {
                start_ns: now,
                leased: 0,
            };
        }
        let ttl = self.ttl_ns.load(Ordering::Relaxed);
        if credit.asleep() {
            // A signal handler on a thread asleep for its batch: it takes its own cost
            // only (a batch or lease of its own would be overwritten, unspent, when the
            // thread wakes), and leaves the row to the thread.
            return bucket.reserve(cost, 0, 0, now);
        }
        let batch = credit.next_batch(cost, now, ttl, self.max_batch(bucket, now));
        // What is left of the last grant (too little, or expired: a thread woken late
        // on a loaded machine) goes back to the bucket, so it is not lost to the job.
        credit.give_back(bucket, generation, now);
        let lease = self.lease.load(Ordering::Relaxed);
        let reservation = bucket.reserve(cost, lease, batch, now);
        let expires = reservation.start_ns.max(now).saturating_add(ttl);
        let until = tsc::deadline(ticks, now, expires);
        // A batch becomes spendable when its thread wakes ([`Self::relet_after_waking`]),
        // not while it sleeps: a signal handler on that thread would spend tokens that
        // do not conform yet, and the waking would hand them out again.
        let asleep = reservation.start_ns > now;
        credit.lease(
            generation,
            if asleep { 0 } else { reservation.leased },
            expires,
            until,
        );
        credit.asleep.store(asleep, Ordering::Relaxed);
        if reservation.leased != 0 {
            crate::return_credit_at_thread_exit();
        }
        reservation
    }

    /// The most tokens a thread that must wait at `now` in `bucket` may reserve ahead:
    /// the rate over the batch span the bucket's age allows ([`BATCH_SPAN_MIN_NS`]), at
    /// most a lease's cap.
    pub(crate) fn max_batch(&self, bucket: &TokenBucket, now: u64) -> u64 {
        let span = batch_span_ns(bucket.age_ns(now));
        let tokens = self.rate.load(Ordering::Relaxed) as u128 * span as u128 / 1_000_000_000;
        tokens.min(self.batch_cap.load(Ordering::Relaxed) as u128) as u64
    }

    /// Makes the `tokens` a thread reserved with the request it just waited for (its
    /// batch, or none) spendable for τ/4 from now, when it woke, rather than from when
    /// the last of them conformed: a thread woken late (a loaded machine) would
    /// otherwise find its batch expired, give it back and sleep again. The tokens are
    /// still spent no earlier than they conform, only later. Its pace is measured from
    /// now too: counted from the reservation's start, the timer's lateness (tens of µs)
    /// would read as the time of its calls, and a thread given no batch once (its first
    /// wait, behind another process's batch) would then ask for batches too small to
    /// be granted behind it, and sleep once per call.
    /// `ticks` is a [`tsc::ticks`] value read before `now`, as for [`Self::take`].
    pub fn relet_after_waking(
        &self,
        credit: &Credit,
        generation: u64,
        tokens: u64,
        now: u64,
        ticks: u64,
    ) {
        let expires = now.saturating_add(self.ttl_ns.load(Ordering::Relaxed));
        let until = tsc::deadline(ticks, now, expires);
        credit.lease(generation, tokens, expires, until);
        credit.asleep.store(false, Ordering::Relaxed);
    }

    /// The lease size (tokens beyond a request's cost; 0 = none).
    #[cfg(test)]
    pub fn lease(&self) -> u64 {
        self.lease.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::Limit;

    #[test]
    fn credit_pays_while_valid_and_goes_back_to_its_bucket() {
        let now = 1_000_000_000;
        let bucket = TokenBucket::new();
        bucket.configure_at(
            Limit {
                rate: 1000,
                burst: 10,
            },
            now,
        );
        // GCRA admits a request whose start is within τ: 11 tokens empty the bucket.
        assert_eq!(bucket.reserve(11, 0, 0, now).start_ns, now);
        let credit = Credit::new();
        credit.lease(7, 5, now + 1_000, 0);
        assert!(credit.spend(7, 2, now));
        assert_eq!(credit.unspent(), 3);
        assert!(!credit.spend(7, 4, now), "more than it holds");
        assert!(!credit.spend(8, 1, now), "leased under another generation");
        assert!(!credit.spend(7, 1, now + 1_000), "expired");
        assert!(
            !credit.spend_at(7, 1, 1),
            "no tick deadline: the managed path cannot"
        );

        credit.give_back(&bucket, 8, now);
        assert_eq!(
            credit.unspent(),
            3,
            "voided by a re-rate: nothing to give back"
        );
        credit.give_back(&bucket, 7, now);
        assert_eq!(credit.unspent(), 0);
        for _ in 0..3 {
            assert_eq!(bucket.reserve(1, 0, 0, now).start_ns, now, "given back");
        }
        assert!(bucket.reserve(1, 0, 0, now).start_ns > now, "empty again");
    }

    /// A signal handler on a thread asleep for its batch must find nothing to spend:
    /// the batch's tokens do not conform yet, and the thread gets them when it wakes.
    #[test]
    fn a_batch_is_spendable_only_once_its_thread_wakes() {
        let t0 = 1_000_000_000;
        let bucket = TokenBucket::new();
        let limit = Limit {
            rate: 1000,
            burst: 10,
        };
        bucket.configure_at(limit, t0);
        let terms = Terms::new();
        terms.configure(limit.rate, limit.burst, false, 1);
        let credit = Credit::new();
        // One request every 100 µs (ten times the rate): the bucket empties, and the
        // thread's pace earns it a batch when it must wait.
        let waiting = (0..100)
            .map(|k| {
                let now = t0 + k * 100_000;
                (now, terms.take(&bucket, Some(&credit), 7, 1, now, 0))
            })
            .find(|(now, reservation)| reservation.start_ns > *now);
        let Some((now, reservation)) = waiting else {
            panic!("a bucket of 1000/s took 100 requests in 10 ms without a wait");
        };
        assert!(
            reservation.leased > 0,
            "a thread this fast waits for a batch"
        );
        assert_eq!(credit.unspent(), 0, "nothing spendable while it sleeps");
        assert!(!credit.spend(7, 1, now), "a handler's request is not paid");
        // The handler takes its own token, after the batch, and no batch of its own.
        let handler = terms.take(&bucket, Some(&credit), 7, 1, now + 1_000, 0);
        assert_eq!(handler.leased, 0, "a handler reserves no batch of its own");
        assert!(
            handler.start_ns > reservation.start_ns,
            "after the thread's batch"
        );
        assert!(credit.asleep(), "the row is still the sleeping thread's");

        let woken = reservation.start_ns + 50_000;
        terms.relet_after_waking(&credit, 7, reservation.leased, woken, 0);
        assert_eq!(credit.unspent(), reservation.leased);
        assert!(!credit.asleep());
        assert!(credit.spend(7, 1, woken), "paid once awake");
    }

    #[test]
    fn a_batch_spans_a_128th_of_the_run_from_32_to_128_ms() {
        const S: u64 = 1_000_000_000;
        assert_eq!(batch_span_ns(0), 32_000_000);
        assert_eq!(batch_span_ns(4 * S), 32_000_000);
        assert_eq!(batch_span_ns(8 * S), 62_500_000);
        assert_eq!(batch_span_ns(16 * S), 125_000_000);
        assert_eq!(batch_span_ns(3600 * S), 128_000_000);
        assert_eq!(batch_span_ns(u64::MAX), 128_000_000);
    }
}
