//! A cheaper clock for two questions: has a thread's leased credit expired, and how
//! long did the file system take to serve a managed call?
//!
//! Credit (see `credit`) is spendable until `expires` (ns of `CLOCK_MONOTONIC`), and
//! invariant 12 needs that checked against real time on every spend. `clock_gettime`
//! is a call and a conversion per managed request (under valgrind a system call);
//! the time-stamp counter is one instruction. So when a lease is granted (out of line,
//! where the clock is read anyway) its expiry is also converted into a *tick
//! deadline*: a counter value that is certainly reached no later than `expires`. The
//! managed path then compares one `rdtsc` with it.
//!
//! Why a tick deadline never lets credit live longer than `expires`:
//! - ticks are used only if the kernel itself keeps time with the counter
//!   (`current_clocksource` is `tsc`): the kernel has then checked that the counter is
//!   invariant (constant rate, running in every power state) and synchronised across
//!   CPUs, so a thread that migrates reads no earlier value;
//! - the tick deadline counts from a counter value read *before* the clock read that
//!   the expiry counts from, at a rate measured against `CLOCK_MONOTONIC` over ≥ 10 ms
//!   (from a counter read after the clock to one read before it, so that a pause
//!   between the reads can only lower it) and then lowered by 1/64, and 1 µs is
//!   taken off (more than an unordered `rdtsc` can run ahead of the code around it):
//!   the deadline is reached at or before `expires`.
//!
//! Until the rate is measured (the first 10 ms after load) and where ticks are not
//! usable (another clock source, not x86-64), credit has no tick deadline (0: always
//! past), so the managed path's check fails and the out-of-line path spends the credit
//! after checking `expires` against `CLOCK_MONOTONIC` itself.
//!
//! Service times are tick differences converted at the rate measured in the same
//! calibration ([`ns_per_tick`]), not lowered (a deadline must come early; a service
//! time should be right). Until it is measured, or where ticks are not usable, no
//! service time is known and the managed path counts none (calls of a process' first
//! 10 ms are not timed); it measures the rate itself ([`timing_ready`]) on the first
//! managed call 10 ms after load, whether or not a channel serves the call.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Ticks per nanosecond, 32.32 fixed point, lowered by 1/64; 0 = not usable (yet).
static TICKS_PER_NS: AtomicU64 = AtomicU64::new(0);
/// Nanoseconds per tick as measured, the bits of an `f64`; 0 (0.0) = not usable (yet).
static NS_PER_TICK: AtomicU64 = AtomicU64::new(0);
/// Whether the kernel keeps time with the counter: unknown / yes / no.
static SOURCE: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const USABLE: u8 = 1;
const UNUSABLE: u8 = 2;
/// The counter and the clock read together at load (or at the first calibration).
static ORIGIN_TICKS: AtomicU64 = AtomicU64::new(0);
static ORIGIN_NS: AtomicU64 = AtomicU64::new(0);
/// How long the rate is measured over.
const CALIBRATION_NS: u64 = 10_000_000;
/// Taken off every deadline: more than `rdtsc` may run ahead of the code around it.
const SLACK_NS: u64 = 1_000;

/// The time-stamp counter (0 where there is none): the managed path's credit clock,
/// compared with [`deadline`]s.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: rdtsc is part of the x86-64 baseline and has no preconditions.
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    0
}

/// The counter and the clock read together, in the order that makes a pause between
/// the two reads lengthen the nanoseconds measured and never the ticks, so that it can
/// only lower the rate (a deadline earlier, never later): at the origin the clock
/// first, at the end the counter first.
#[derive(Clone, Copy, Debug)]
struct Reading {
    ticks: u64,
    ns: u64,
}

impl Reading {
    fn at_origin(clock: impl Fn() -> u64, counter: impl Fn() -> u64) -> Reading {
        let ns = clock();
        Reading {
            ticks: counter(),
            ns,
        }
    }

    fn at_end(clock: impl Fn() -> u64, counter: impl Fn() -> u64) -> Reading {
        let ticks = counter();
        Reading { ticks, ns: clock() }
    }
}

/// Records the origin of the rate measurement (the library constructor). The thread
/// whose clock reading is stored first (the constructor, or an early call racing it)
/// stores its counter reading too, so the pair is never two threads' halves.
pub fn start() {
    if cfg!(all(target_arch = "x86_64", not(miri))) && ORIGIN_NS.load(Ordering::Relaxed) == 0 {
        let origin = Reading::at_origin(crate::bucket::now_ns, ticks);
        let first = ORIGIN_NS.compare_exchange(0, origin.ns, Ordering::Relaxed, Ordering::Relaxed);
        if first.is_ok() {
            ORIGIN_TICKS.store(origin.ticks, Ordering::Release);
        }
    }
}

/// A tick count reached no later than `expires_ns`, given `now_ticks` read before the
/// clock returned `now_ns`; 0 (already passed) if ticks are not usable (yet).
pub fn deadline(now_ticks: u64, now_ns: u64, expires_ns: u64) -> u64 {
    let mut rate = TICKS_PER_NS.load(Ordering::Relaxed);
    if rate == 0 {
        rate = calibrate();
        if rate == 0 {
            return 0;
        }
    }
    let span = expires_ns.saturating_sub(now_ns).saturating_sub(SLACK_NS);
    let ticks = (span as u128 * rate as u128) >> 32;
    now_ticks.saturating_add(ticks.min(u64::MAX as u128) as u64)
}

/// Nanoseconds per tick, to convert a difference of two [`ticks`] read by one thread:
/// 0 until [`timing_ready`].
#[inline(always)]
pub fn ns_per_tick() -> f64 {
    f64::from_bits(NS_PER_TICK.load(Ordering::Relaxed))
}

/// Whether tick differences can be converted into nanoseconds ([`ns_per_tick`]), after
/// measuring the rate if it is not yet (out of line from the managed path, which
/// needs `errno` kept: the measurement's system calls may set it; it cannot panic).
#[cold]
#[inline(never)]
pub fn timing_ready() -> bool {
    if !cfg!(all(target_arch = "x86_64", not(miri))) {
        return false;
    }
    if NS_PER_TICK.load(Ordering::Relaxed) == 0 {
        let saved = crate::errno::get();
        calibrate();
        crate::errno::set(saved);
    }
    NS_PER_TICK.load(Ordering::Relaxed) != 0
}

/// Measures the rate once ≥ [`CALIBRATION_NS`] have passed since the origin; 0 before
/// that, or if ticks are not usable.
#[cold]
#[inline(never)]
fn calibrate() -> u64 {
    match SOURCE.load(Ordering::Relaxed) {
        UNUSABLE => return 0,
        USABLE => {}
        _ => {
            let usable = cfg!(all(target_arch = "x86_64", not(miri))) && kernel_uses_tsc();
            SOURCE.store(if usable { USABLE } else { UNUSABLE }, Ordering::Relaxed);
            if !usable {
                return 0;
            }
        }
    }
    let origin_ticks = ORIGIN_TICKS.load(Ordering::Acquire);
    if origin_ticks == 0 {
        start();
        return 0;
    }
    let origin_ns = ORIGIN_NS.load(Ordering::Relaxed);
    let Reading { ticks, ns: now } = Reading::at_end(crate::bucket::now_ns, ticks);
    let elapsed = now.saturating_sub(origin_ns);
    if elapsed < CALIBRATION_NS || ticks <= origin_ticks {
        return 0;
    }
    let ns_per_tick = elapsed as f64 / (ticks - origin_ticks) as f64;
    NS_PER_TICK.store(ns_per_tick.to_bits(), Ordering::Relaxed);
    let rate = ((ticks - origin_ticks) as u128) << 32;
    let rate = rate / elapsed as u128;
    let rate = (rate - rate / 64).min(u64::MAX as u128) as u64;
    TICKS_PER_NS.store(rate, Ordering::Relaxed);
    rate
}

/// The kernel's clock source is the time-stamp counter (raw system calls: no hook).
fn kernel_uses_tsc() -> bool {
    let path = b"/sys/devices/system/clocksource/clocksource0/current_clocksource\0";
    // SAFETY: NUL-terminated path, valid buffer; raw syscalls bypass every hook.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return false;
        }
        let mut buf = [0u8; 16];
        let len = libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len());
        libc::syscall(libc::SYS_close, fd);
        len == 4 && &buf[..4] == b"tsc\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_between_the_two_reads_only_lowers_the_rate() {
        // A fake time source at 3 ticks a nanosecond, the thread paused for 1 ms after
        // one of the four reads.
        for paused_after in 0..4 {
            let (now, reads) = (std::cell::Cell::new(1_000_000u64), std::cell::Cell::new(0));
            let read = |scale: u64| {
                let value = now.get() * scale;
                if reads.replace(reads.get() + 1) == paused_after {
                    now.set(now.get() + 1_000_000);
                }
                value
            };
            let (clock, counter) = (|| read(1), || read(3));
            let origin = Reading::at_origin(clock, counter);
            now.set(now.get() + CALIBRATION_NS);
            let end = Reading::at_end(clock, counter);
            let rate = (end.ticks - origin.ticks) as f64 / (end.ns - origin.ns) as f64;
            assert!(
                rate <= 3.0,
                "paused after read {paused_after}: {rate} ticks/ns at 3 ({origin:?}, {end:?})"
            );
        }
    }

    #[test]
    fn deadlines_come_no_later_than_the_expiry() {
        start();
        std::thread::sleep(std::time::Duration::from_millis(12));
        let ticks_before = ticks();
        let now = crate::bucket::now_ns();
        let expires = now + 2_000_000;
        let deadline = deadline(ticks_before, now, expires);
        if deadline == 0 {
            return; // ticks not usable here: the clock is read instead
        }
        // Every tick read after the clock passed the expiry has reached the deadline.
        loop {
            let clock = crate::bucket::now_ns();
            let ticks = ticks();
            assert!(
                clock < expires || ticks >= deadline,
                "deadline after the expiry"
            );
            if ticks >= deadline {
                break;
            }
        }
    }
}
