//! Channels (PADLL paper §III-A, Fig. 5): each owns a token bucket and serves the
//! requests its selector matches — a mountpoint (or every mountpoint) and an operation,
//! a class of operations, or all of them.
//!
//! The data path reads two static tables and takes no lock: `ROUTES[mount][op]` packs
//! the (up to four) channels a request must pass, and each channel's slot holds its
//! bucket and counters. Adding, removing or re-rating a channel (configuration at
//! start-up, later the control plane) rewrites those atomics under a control-path mutex;
//! the next request on every thread sees the change. A request already waiting notices
//! through the slot's generation and re-reserves at the new rate.

use crate::bucket::{self, Limit, TokenBucket};
use crate::stats;
use padll_wire::channel::{ChannelId, ChannelInfo, ChannelSpec, Unit};
use padll_wire::ops::Op;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Most channels a stage can hold.
pub const MAX_CHANNELS: usize = 255;
/// Most channels that can apply to one (mountpoint, operation) pair.
pub const MAX_CHANNELS_PER_REQUEST: usize = 4;
/// Most mountpoints that can carry channels.
pub const MAX_MOUNTS: usize = 64;
/// Longest single sleep while waiting for tokens, so a waiter notices rate changes.
const WAIT_SLICE_NS: u64 = 20_000_000;

/// One channel. Its counters are kept per thread in [`stats`] (a shared counter would
/// be one more contended cache line per request); `counted_before` holds the totals
/// when the slot was (re)used, which [`list`] subtracts.
#[repr(align(128))]
struct Slot {
    /// Bumped on every change, so waiters re-check.
    generation: AtomicU64,
    in_use: AtomicBool,
    counts_bytes: AtomicBool,
    /// The most bytes charged before a call (the burst); a larger request pays the
    /// rest once it returns. Byte counts asked for can be huge (`cat` and `cp` call
    /// `copy_file_range` with `SSIZE_MAX`): charged whole, they would block the
    /// channel for ever, and a copy's second charge (its read) would never start.
    byte_charge_cap: AtomicU64,
    bucket: TokenBucket,
    counted_before: [AtomicU64; 2],
}

static SLOTS: [Slot; MAX_CHANNELS] = [const {
    Slot {
        generation: AtomicU64::new(0),
        in_use: AtomicBool::new(false),
        counts_bytes: AtomicBool::new(false),
        byte_charge_cap: AtomicU64::new(u64::MAX),
        bucket: TokenBucket::new(),
        counted_before: [const { AtomicU64::new(0) }; 2],
    }
}; MAX_CHANNELS];

/// `ROUTES[mount][op]`: up to four channel slot numbers + 1, one per byte.
static ROUTES: [[AtomicU32; Op::COUNT]; MAX_MOUNTS] =
    [const { [const { AtomicU32::new(0) }; Op::COUNT] }; MAX_MOUNTS];

/// Control-path registry: the spec of each slot in use and the mount names.
struct Registry {
    specs: Vec<Option<ChannelSpec>>,
    mounts: Vec<String>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    specs: Vec::new(),
    mounts: Vec::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

thread_local! {
    /// The registry guard held by the thread calling `fork`, between the prepare and
    /// the parent/child handlers.
    static HELD_FOR_FORK: RefCell<Option<MutexGuard<'static, Registry>>> = const { RefCell::new(None) };
}

/// Takes the registry lock before `fork`, so no other thread holds it at that instant
/// (a child would otherwise inherit it locked, forever).
pub fn hold_registry_for_fork() {
    let guard = registry();
    let _ = HELD_FOR_FORK.try_with(|held| *held.borrow_mut() = Some(guard));
}

/// Releases the lock taken by [`hold_registry_for_fork`] (in parent and child).
pub fn release_registry_after_fork() {
    let _ = HELD_FOR_FORK.try_with(|held| held.borrow_mut().take());
}

/// Declares the registered mountpoints (index = position), so specs can name them.
pub fn set_mounts(mounts: &[String]) -> Result<(), String> {
    if mounts.len() > MAX_MOUNTS {
        return Err(format!(
            "at most {MAX_MOUNTS} mountpoints are supported, got {}",
            mounts.len()
        ));
    }
    registry().mounts = mounts.to_vec();
    Ok(())
}

/// Adds a channel and routes matching requests through it from the next request on.
pub fn add(spec: ChannelSpec) -> Result<ChannelId, String> {
    let mut reg = registry();
    if let Some(mount) = &spec.mount {
        if !reg.mounts.contains(mount) {
            return Err(format!("'{mount}' is not a registered mountpoint"));
        }
    }
    validate(&spec)?;
    let free = (0..MAX_CHANNELS)
        .find(|i| reg.specs.get(*i).is_none_or(|s| s.is_none()))
        .ok_or_else(|| format!("too many channels (at most {MAX_CHANNELS})"))?;
    if reg.specs.len() <= free {
        reg.specs.resize(free + 1, None);
    }
    reg.specs[free] = Some(spec.clone());
    if let Err(e) = rebuild_routes(&reg) {
        reg.specs[free] = None;
        return Err(e);
    }
    let slot = &SLOTS[free];
    slot.counts_bytes
        .store(spec.unit == Unit::Bytes, Ordering::Relaxed);
    slot.byte_charge_cap.store(spec.burst, Ordering::Relaxed);
    slot.bucket.configure(Limit {
        rate: spec.rate,
        burst: spec.burst,
    });
    let (admitted, tokens) = stats::channel_totals(free);
    slot.counted_before[0].store(admitted, Ordering::Relaxed);
    slot.counted_before[1].store(tokens, Ordering::Relaxed);
    slot.in_use.store(true, Ordering::Release);
    slot.generation.fetch_add(1, Ordering::AcqRel);
    publish_routes(&reg);
    Ok(ChannelId(free as u8))
}

/// Removes a channel; requests waiting in it are released. False if it did not exist.
pub fn remove(id: ChannelId) -> bool {
    let mut reg = registry();
    let index = id.0 as usize;
    if reg.specs.get(index).is_none_or(|s| s.is_none()) {
        return false;
    }
    reg.specs[index] = None;
    // Routes can only shrink here, so rebuilding cannot fail.
    let _ = rebuild_routes(&reg);
    publish_routes(&reg);
    SLOTS[index].in_use.store(false, Ordering::Release);
    SLOTS[index].generation.fetch_add(1, Ordering::AcqRel);
    true
}

/// Changes a channel's rate and burst; effective for the next request on every thread
/// and for requests already waiting.
pub fn set_limit(id: ChannelId, rate: u64, burst: u64) -> Result<(), String> {
    let mut reg = registry();
    let index = id.0 as usize;
    let Some(Some(spec)) = reg.specs.get_mut(index) else {
        return Err(format!("no channel {}", id.0));
    };
    let mut updated = spec.clone();
    updated.rate = rate;
    updated.burst = burst;
    validate(&updated)?;
    *spec = updated;
    SLOTS[index].bucket.configure(Limit { rate, burst });
    SLOTS[index].byte_charge_cap.store(burst, Ordering::Relaxed);
    SLOTS[index].generation.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Removes every channel.
pub fn clear() {
    let ids: Vec<ChannelId> = list().into_iter().map(|c| c.id).collect();
    for id in ids {
        remove(id);
    }
}

/// Every channel with its counters.
pub fn list() -> Vec<ChannelInfo> {
    let reg = registry();
    reg.specs
        .iter()
        .enumerate()
        .filter_map(|(i, spec)| {
            let spec = spec.clone()?;
            let (admitted, tokens) = stats::channel_totals(i);
            let before = &SLOTS[i].counted_before;
            Some(ChannelInfo {
                id: ChannelId(i as u8),
                spec,
                admitted: admitted.wrapping_sub(before[0].load(Ordering::Relaxed)),
                tokens: tokens.wrapping_sub(before[1].load(Ordering::Relaxed)),
            })
        })
        .collect()
}

/// Zeroes channel counters (a forked child starts its own account; [`stats::reset`]
/// zeroes the totals).
pub fn reset_counters() {
    for slot in &SLOTS {
        for before in &slot.counted_before {
            before.store(0, Ordering::Relaxed);
        }
    }
}

fn validate(spec: &ChannelSpec) -> Result<(), String> {
    if spec.rate == 0 || spec.rate > bucket::MAX_RATE {
        return Err(format!(
            "rate {} of '{spec}' is outside 1..={}",
            spec.rate,
            bucket::MAX_RATE
        ));
    }
    if spec.burst == 0 {
        return Err(format!("burst of '{spec}' must be at least 1"));
    }
    Ok(())
}

/// Computes every route; fails if some request would need more than four channels.
fn rebuild_routes(reg: &Registry) -> Result<(), String> {
    compute_routes(reg).map(|_| ())
}

fn compute_routes(reg: &Registry) -> Result<Vec<[u32; Op::COUNT]>, String> {
    let mut routes = vec![[0u32; Op::COUNT]; reg.mounts.len()];
    for (mount_index, mount_name) in reg.mounts.iter().enumerate() {
        for op in Op::ALL {
            let mut packed = 0u32;
            let mut count = 0;
            for (slot, spec) in reg.specs.iter().enumerate() {
                let Some(spec) = spec else { continue };
                let mount_matches = spec.mount.as_ref().is_none_or(|m| m == mount_name);
                if mount_matches && spec.scope.covers(*op) {
                    if count == MAX_CHANNELS_PER_REQUEST {
                        return Err(format!(
                            "more than {MAX_CHANNELS_PER_REQUEST} channels would apply to '{op}' on {mount_name}"
                        ));
                    }
                    packed |= (slot as u32 + 1) << (8 * count);
                    count += 1;
                }
            }
            routes[mount_index][*op as usize] = packed;
        }
    }
    Ok(routes)
}

fn publish_routes(reg: &Registry) {
    let Ok(routes) = compute_routes(reg) else {
        return;
    };
    for (mount, row) in routes.iter().enumerate() {
        for (op, packed) in row.iter().enumerate() {
            ROUTES[mount][op].store(*packed, Ordering::Release);
        }
    }
}

/// True when some channel serves `op` on `mount`.
#[inline]
pub fn has_route(mount: u16, op: Op) -> bool {
    route(mount, op) != 0
}

#[inline]
fn route(mount: u16, op: Op) -> u32 {
    match ROUTES.get(mount as usize) {
        Some(row) => row[op as usize].load(Ordering::Acquire),
        None => 0,
    }
}

/// Passes a request through every channel that serves it, sleeping until each admits
/// it. `bytes` is the request's size for byte-counting channels. Returns the time
/// spent waiting, in nanoseconds. The clock is read once unless the request waits.
pub fn admit(mount: u16, op: Op, bytes: u64) -> u64 {
    let mut packed = route(mount, op);
    if packed == 0 {
        return 0;
    }
    let mut now = bucket::now_ns();
    let mut waited = 0;
    while packed != 0 {
        let slot = (packed & 0xff) as usize - 1;
        let wait = pass(slot, bytes, now);
        if wait != 0 {
            waited += wait;
            now = bucket::now_ns();
        }
        packed >>= 8;
    }
    waited
}

/// Passes one channel at time `now`; returns the time spent waiting.
#[inline]
fn pass(index: usize, bytes: u64, now: u64) -> u64 {
    let slot = &SLOTS[index];
    if !slot.in_use.load(Ordering::Acquire) {
        return 0;
    }
    let generation = slot.generation.load(Ordering::Acquire);
    let cost = slot.cost(bytes);
    let start = slot.bucket.reserve(cost, now).start_ns;
    if start <= now {
        stats::local().admitted(index, cost);
        return 0;
    }
    wait(index, bytes, generation, start, now)
}

impl Slot {
    /// Tokens a request of `bytes` bytes is charged in this channel before the call.
    #[inline]
    fn cost(&self, bytes: u64) -> u64 {
        if self.counts_bytes.load(Ordering::Relaxed) {
            bytes.min(self.byte_charge_cap.load(Ordering::Relaxed))
        } else {
            1
        }
    }
}

/// Sleeps until admitted; re-reserves if the channel changes meanwhile.
#[cold]
fn wait(index: usize, bytes: u64, mut generation: u64, mut start: u64, entered: u64) -> u64 {
    let slot = &SLOTS[index];
    loop {
        let now = bucket::now_ns();
        if now >= start {
            stats::local().admitted(index, slot.cost(bytes));
            return now.saturating_sub(entered);
        }
        sleep_until(start.min(now + WAIT_SLICE_NS));
        let current = slot.generation.load(Ordering::Acquire);
        if current != generation {
            // Re-rated or removed while we slept: start over under the new settings.
            if !slot.in_use.load(Ordering::Acquire) {
                return bucket::now_ns().saturating_sub(entered);
            }
            generation = current;
            start = slot
                .bucket
                .reserve(slot.cost(bytes), bucket::now_ns())
                .start_ns;
        }
    }
}

/// Settles a data request of `requested` bytes once its real size is known: returns
/// unused bytes to byte-counting channels, or takes (and waits for) the extra —
/// including what was above a channel's charge cap.
#[inline]
pub fn settle(mount: u16, op: Op, requested: u64, moved: u64) -> u64 {
    let mut packed = route(mount, op);
    let mut waited = 0;
    while packed != 0 {
        let index = (packed & 0xff) as usize - 1;
        let slot = &SLOTS[index];
        if slot.counts_bytes.load(Ordering::Relaxed) && slot.in_use.load(Ordering::Acquire) {
            let charged = slot.cost(requested);
            match moved.cmp(&charged) {
                std::cmp::Ordering::Less => {
                    slot.bucket.refund(charged - moved, bucket::now_ns());
                    stats::local().adjust_tokens(index, -((charged - moved) as i64));
                }
                std::cmp::Ordering::Greater => waited += pass_bytes_only(index, moved - charged),
                std::cmp::Ordering::Equal => {}
            }
        }
        packed >>= 8;
    }
    waited
}

fn pass_bytes_only(index: usize, bytes: u64) -> u64 {
    let entered = bucket::now_ns();
    let start = SLOTS[index].bucket.reserve(bytes, entered).start_ns;
    stats::local().adjust_tokens(index, bytes as i64);
    while bucket::now_ns() < start {
        sleep_until(start.min(bucket::now_ns() + WAIT_SLICE_NS));
    }
    bucket::now_ns().saturating_sub(entered)
}

/// Sleeps until the monotonic clock reaches `deadline_ns`. A signal handler may run
/// meanwhile; the wait resumes after it (the intercepted call is not failed).
fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: valid timespec; clock_nanosleep reports errors by return value, not errno.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use padll_wire::channel::Scope;
    use padll_wire::ops::Class;

    // Channel tables are process-wide: one test drives them all, in order.
    #[test]
    fn channel_lifecycle() {
        set_mounts(&["/scratch".into(), "/data".into()]).unwrap();
        let spec = |mount: Option<&str>, scope, rate| ChannelSpec {
            mount: mount.map(str::to_string),
            scope,
            rate,
            unit: Unit::Requests,
            burst: 1,
        };
        let meta = add(spec(
            Some("/scratch"),
            Scope::Class(Class::Metadata),
            1_000_000,
        ))
        .unwrap();
        let open = add(spec(None, Scope::Op(Op::Open), 1_000_000)).unwrap();
        assert!(has_route(0, Op::Open));
        assert!(has_route(0, Op::Getattr));
        assert!(has_route(1, Op::Open));
        assert!(!has_route(1, Op::Getattr));
        assert!(!has_route(0, Op::Read));
        assert_eq!(
            route(0, Op::Open) & 0xff00,
            0x0200,
            "open passes two channels"
        );

        admit(0, Op::Open, 0);
        let infos = list();
        assert_eq!(infos.len(), 2);
        assert!(infos.iter().all(|c| c.admitted == 1));

        // Unknown mount and bad rates are rejected with the value named.
        let err = add(spec(Some("/nope"), Scope::All, 1)).unwrap_err();
        assert!(err.contains("/nope"), "{err}");
        assert!(add(spec(None, Scope::All, 0))
            .unwrap_err()
            .contains("rate 0"));

        // A slow channel delays; raising its rate releases a waiter promptly.
        set_limit(meta, 1, 1).unwrap();
        admit(0, Op::Getattr, 0); // uses the burst
        let waiter = std::thread::spawn(|| admit(0, Op::Getattr, 0));
        std::thread::sleep(std::time::Duration::from_millis(50));
        set_limit(meta, 1_000_000, 1).unwrap();
        let waited = waiter.join().unwrap();
        assert!(waited < 900_000_000, "waiter was not released: {waited} ns");

        // Five channels on one request are refused.
        let extra: Vec<_> = (0..2)
            .map(|_| add(spec(None, Scope::All, 10)).unwrap())
            .collect();
        assert!(add(spec(None, Scope::All, 10))
            .unwrap_err()
            .contains("more than 4"));

        assert!(remove(open));
        assert!(!remove(open));
        for id in extra {
            remove(id);
        }
        clear();
        assert!(list().is_empty());
        assert!(!has_route(0, Op::Open));
    }
}
