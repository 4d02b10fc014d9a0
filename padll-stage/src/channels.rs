//! Channels (PADLL paper §III-A, Fig. 5): each owns a token bucket and serves the
//! requests its selector matches — a mountpoint (or every mountpoint) and an operation,
//! a class of operations, or all of them.
//!
//! The data path reads two static tables and takes no lock: `ROUTES[op][mount]` packs
//! the (up to four) channels a request must pass, and each channel's slot holds its
//! bucket and counters. Adding, removing or re-rating a channel (configuration at
//! start-up, later the control plane) rewrites those atomics under a control-path mutex;
//! the next request on every thread sees the change. A request already waiting notices
//! through the slot's generation, gives its reservation back and re-reserves at the new
//! rate (a request that moved more bytes than it was charged, paying the rest after its
//! call, waits the same way).
//!
//! A request channel the control plane weighs (its spec has costs) charges each request
//! its operation's cost, counting thousandths of a token (`ChannelSpec::units_per_token`);
//! an operation it charges nothing is not routed through it.
//!
//! A thread that takes from a bucket may reserve tokens for its next requests too (a
//! lease, or a batch when it must wait): its *credit*, whose rules are in `credit.rs`.

use crate::bucket::{self, Limit, TokenBucket};
use crate::credit::{Credit, Terms};
use crate::{stats, tsc};
use padll_wire::channel::{ChannelId, ChannelInfo, ChannelSpec, LimitScope, Unit, SLOT_COUNT};
pub use padll_wire::channel::{MAX_CHANNELS, MAX_CHANNELS_PER_REQUEST, MAX_MOUNTS};
use padll_wire::ops::Op;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// One channel. Its counters are kept per thread in [`stats`] (a shared counter would
/// be one more contended cache line per request); `counted_before` holds the totals
/// when the slot was (re)used, which [`list`] subtracts.
#[repr(align(128))]
struct Slot {
    /// Bumped on every change, so waiters re-check and stale credit is void.
    generation: AtomicU64,
    /// Bumped after `generation`: the word waiters sleep on (a futex), so a change
    /// wakes them at once.
    changes: AtomicU32,
    in_use: AtomicBool,
    counts_bytes: AtomicBool,
    /// What a request of each operation costs in this channel's bucket units: one token
    /// in a request channel, the operation's thousandths of a token in a weighted one
    /// (`ChannelSpec::units_per_token`); unused in a byte channel.
    unit_costs: [AtomicU32; Op::COUNT],
    /// The most bytes charged before a call (the burst); a larger request pays the
    /// rest once it returns. Byte counts asked for can be huge (`cat` and `cp` call
    /// `copy_file_range` with `SSIZE_MAX`): charged whole, they would block the
    /// channel for ever, and a copy's second charge (its read) would never start.
    byte_charge_cap: AtomicU64,
    /// How much credit a thread may take ahead from the bucket, and for how long.
    terms: Terms,
    /// This process' own bucket, used while `shared` is null.
    own_bucket: TokenBucket,
    /// The job's bucket in the node's shared segment (`shared.rs`), or null.
    shared: AtomicPtr<TokenBucket>,
    counted_before: [AtomicU64; 2],
}

static SLOTS: [Slot; SLOT_COUNT] = [const {
    Slot {
        generation: AtomicU64::new(0),
        changes: AtomicU32::new(0),
        in_use: AtomicBool::new(false),
        counts_bytes: AtomicBool::new(false),
        unit_costs: [const { AtomicU32::new(1) }; Op::COUNT],
        byte_charge_cap: AtomicU64::new(u64::MAX),
        terms: Terms::new(),
        own_bucket: TokenBucket::new(),
        shared: AtomicPtr::new(std::ptr::null_mut()),
        counted_before: [const { AtomicU64::new(0) }; 2],
    }
}; SLOT_COUNT];

/// `ROUTES[op][mount]`: the channels a request passes, as slot numbers + 1, one per
/// byte — those counting requests in the low half, those counting bytes in the high
/// half (four at most in all) — so the managed path learns from one load what each
/// channel charges and which need settling. Indexed by operation first: a hook's
/// operation is a constant, so its row's address is too.
static ROUTES: [[AtomicU64; MAX_MOUNTS]; Op::COUNT] =
    [const { [const { AtomicU64::new(0) }; MAX_MOUNTS] }; Op::COUNT];

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
    padll_wire::sync::lock(&REGISTRY)
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

/// Why a channel cannot be added or re-rated: each names the value at fault.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// More mountpoints than the route table has columns.
    #[error("at most {MAX_MOUNTS} mountpoints are supported, got {0}")]
    TooManyMounts(usize),
    /// A channel names a mountpoint the stage does not manage.
    #[error("{} is not a registered mountpoint", padll_wire::quote(.0))]
    UnknownMount(String),
    /// Every slot is in use.
    #[error("too many channels (at most {MAX_CHANNELS})")]
    NoFreeSlot,
    /// No channel has this id.
    #[error("no channel {0}")]
    NoChannel(u8),
    /// A rate of 0 or above [`ChannelSpec::max_rate`] (a weighted channel counts
    /// thousandths of a token: its rate is at most a thousandth of an unweighted one's).
    #[error("rate {} of {} is outside 1..={}", .0.rate, padll_wire::quote(&.0.to_string()), .0.max_rate())]
    Rate(ChannelSpec),
    /// A burst of 0.
    #[error("burst of {} must be at least 1", padll_wire::quote(&.0.to_string()))]
    Burst(ChannelSpec),
    /// A request would pass more channels than a route holds.
    #[error("more than {MAX_CHANNELS_PER_REQUEST} channels would apply to '{op}' on {}", padll_wire::quote(.mount))]
    TooManyPerRequest {
        /// The operation.
        op: Op,
        /// The mountpoint.
        mount: String,
    },
}

/// Declares the registered mountpoints (index = position), so specs can name them.
pub fn set_mounts(mounts: &[String]) -> Result<(), ChannelError> {
    if mounts.len() > MAX_MOUNTS {
        return Err(ChannelError::TooManyMounts(mounts.len()));
    }
    registry().mounts = mounts.to_vec();
    Ok(())
}

/// Adds a channel with a bucket of this process' own and routes matching requests
/// through it from the next request on.
pub fn add(spec: ChannelSpec) -> Result<ChannelId, ChannelError> {
    let mut reg = registry();
    let added = change(&mut reg, &[], &[], &[(spec, None)])?;
    Ok(added[0])
}

/// Removes a channel; requests waiting in it are released. False if it did not exist.
pub fn remove(id: ChannelId) -> bool {
    let mut reg = registry();
    let index = id.0 as usize;
    if reg.specs.get(index).is_none_or(|s| s.is_none()) {
        return false;
    }
    // Routes can only shrink here, so the change cannot fail.
    change(&mut reg, &[index], &[], &[]).is_ok()
}

/// Changes a channel's rate and burst; effective for the next request on every thread
/// and for requests already waiting. A channel sharing the job's bucket leaves it for
/// a bucket of its own: a rate given to one process (by the control plane) is that
/// process' rate. The change lets nothing through beyond the new burst: the bucket keeps
/// the tokens it holds, at most the new burst, and still owes its debt, at the new rate
/// ([`TokenBucket::reconfigure`]); credit leased before or while it changes is void after
/// it.
pub fn set_limit(id: ChannelId, rate: u64, burst: u64) -> Result<(), ChannelError> {
    let mut reg = registry();
    let index = id.0 as usize;
    let Some(Some(spec)) = reg.specs.get(index) else {
        return Err(ChannelError::NoChannel(id.0));
    };
    let updated = ChannelSpec {
        rate,
        burst,
        ..spec.clone()
    };
    change(&mut reg, &[], &[(index, updated)], &[]).map(|_| ())
}

/// Removes every channel.
pub fn clear() {
    let mut reg = registry();
    let in_use = in_use(&reg);
    // Routes can only shrink here, so the change cannot fail.
    let _ = change(&mut reg, &in_use, &[], &[]);
}

/// Makes the channel set exactly `channels` (each with the job's bucket it waits in, or
/// `None` for a bucket of this process' own), all or nothing: every channel in force
/// is replaced, in one hold of the registry (a `fork` sees the old set or the new one).
pub fn install(
    channels: &[(ChannelSpec, Option<&'static TokenBucket>)],
) -> Result<(), ChannelError> {
    let mut reg = registry();
    let in_use = in_use(&reg);
    change(&mut reg, &in_use, &[], channels).map(|_| ())
}

/// Whether [`install`] would take `specs`, changing nothing: the same checks
/// (mountpoints, rates, how many channels, at most four per request), so that a set it
/// would refuse is refused before anything is made for it (the job's segment).
pub fn check(specs: &[ChannelSpec]) -> Result<(), ChannelError> {
    let reg = registry();
    check_specs(&reg.mounts, specs)?;
    if specs.len() > MAX_CHANNELS {
        return Err(ChannelError::NoFreeSlot);
    }
    let set: Vec<_> = specs.iter().cloned().map(Some).collect();
    compute_routes(&set, &reg.mounts).map(|_| ())
}

/// Whether each of `specs` names a registered mountpoint (or none) and has its rate and
/// burst in range.
fn check_specs<'a>(
    mounts: &[String],
    specs: impl IntoIterator<Item = &'a ChannelSpec>,
) -> Result<(), ChannelError> {
    for spec in specs {
        if let Some(mount) = spec.mount.as_ref().filter(|m| !mounts.contains(m)) {
            return Err(ChannelError::UnknownMount(mount.clone()));
        }
        validate(spec)?;
    }
    Ok(())
}

/// Makes the channel set exactly `rules`, all or nothing and in one hold of the
/// registry (a `fork` sees the old set or the new one): a channel in force that
/// matches a rule (same mountpoint, scope, unit and costs) is re-rated in place, so its
/// waiters and counters carry on; the rest are added or removed. A channel given other
/// costs is replaced: its bucket and counters are in other units (or charge other
/// amounts) from then on.
pub fn update(rules: &[ChannelSpec]) -> Result<(), ChannelError> {
    let same = |a: &ChannelSpec, b: &ChannelSpec| {
        a.mount == b.mount && a.scope == b.scope && a.unit == b.unit && a.costs == b.costs
    };
    let mut reg = registry();
    let mut remove = Vec::new();
    let mut rerate = Vec::new();
    let mut add = Vec::new();
    for (index, spec) in reg.specs.iter().enumerate() {
        if let Some(spec) = spec {
            if !rules.iter().any(|rule| same(rule, spec)) {
                remove.push(index);
            }
        }
    }
    for rule in rules {
        let current = reg.specs.iter().enumerate().find_map(|(index, spec)| {
            spec.as_ref()
                .filter(|spec| same(rule, spec))
                .map(|spec| (index, spec))
        });
        match current {
            Some((_, spec)) if spec.rate == rule.rate && spec.burst == rule.burst => {}
            Some((index, _)) => rerate.push((index, rule.clone())),
            None => add.push((rule.clone(), None)),
        }
    }
    change(&mut reg, &remove, &rerate, &add).map(|_| ())
}

/// The slots of every channel in force.
fn in_use(reg: &Registry) -> Vec<usize> {
    (0..reg.specs.len())
        .filter(|i| reg.specs[*i].is_some())
        .collect()
}

/// Removes the channels of slots `remove`, re-rates `rerate` (slot, its spec with the
/// new rate and burst) and adds `add` (each waiting in the job's bucket given, or one
/// of its own), all or nothing: the whole new set is checked first (mountpoints,
/// rates, free slots, at most four channels per request), so an error changes
/// nothing. The routes are published once, for the whole set. Returns the added
/// channels' ids.
fn change(
    reg: &mut Registry,
    remove: &[usize],
    rerate: &[(usize, ChannelSpec)],
    add: &[(ChannelSpec, Option<&'static TokenBucket>)],
) -> Result<Vec<ChannelId>, ChannelError> {
    check_specs(
        &reg.mounts,
        rerate
            .iter()
            .map(|(_, s)| s)
            .chain(add.iter().map(|(s, _)| s)),
    )?;
    let mut specs = reg.specs.clone();
    for index in remove {
        specs[*index] = None;
    }
    for (index, spec) in rerate {
        specs[*index] = Some(spec.clone());
    }
    // New channels take slots free before this change first: a slot freed by it is
    // reused only when no other is left (requests still routed to it would meet the
    // new channel until the routes are published).
    let was_free = |i: &usize| reg.specs.get(*i).is_none_or(|s| s.is_none());
    let free = (0..MAX_CHANNELS)
        .filter(was_free)
        .chain(remove.iter().copied())
        .take(add.len())
        .collect::<Vec<_>>();
    if free.len() < add.len() {
        return Err(ChannelError::NoFreeSlot);
    }
    let needed = free.iter().max().map_or(0, |last| last + 1);
    if specs.len() < needed {
        specs.resize(needed, None);
    }
    for (index, (spec, _)) in free.iter().zip(add) {
        specs[*index] = Some(spec.clone());
    }
    let (routes, charged_nothing) = compute_routes(&specs, &reg.mounts)?;

    reg.specs = specs;
    for (index, spec) in rerate {
        let slot = &SLOTS[*index];
        // Credit of the old rule is void before the bucket changes (it would be spent on
        // top of the new burst), and credit leased while it changes is void after.
        slot.generation.fetch_add(1, Ordering::AcqRel);
        slot.rerate(spec);
        slot.changed();
    }
    for (index, (spec, shared)) in free.iter().zip(add) {
        let slot = &SLOTS[*index];
        slot.counts_bytes
            .store(spec.unit == Unit::Bytes, Ordering::Relaxed);
        slot.set_unit_costs(spec);
        slot.configure(spec, *shared);
        let (admitted, tokens) = stats::channel_totals(*index);
        slot.counted_before[0].store(admitted, Ordering::Relaxed);
        slot.counted_before[1].store(tokens, Ordering::Relaxed);
        slot.in_use.store(true, Ordering::Release);
        slot.changed();
    }
    publish_routes(&routes);
    stats::set_free(&charged_nothing);
    for index in remove.iter().filter(|i| !free.contains(i)) {
        let slot = &SLOTS[*index];
        slot.in_use.store(false, Ordering::Release);
        slot.shared.store(std::ptr::null_mut(), Ordering::Release);
        slot.changed();
    }
    Ok(free.iter().map(|i| ChannelId(*i as u8)).collect())
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
            // Whole tokens: a weighted channel counts thousandths.
            let tokens =
                tokens.wrapping_sub(before[1].load(Ordering::Relaxed)) / spec.units_per_token();
            Some(ChannelInfo {
                id: ChannelId(i as u8),
                spec,
                admitted: admitted.wrapping_sub(before[0].load(Ordering::Relaxed)),
                tokens,
                binds: if SLOTS[i].shared.load(Ordering::Relaxed).is_null() {
                    LimitScope::Process
                } else {
                    LimitScope::Job
                },
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

/// Whether `spec`'s rate and burst are in range.
pub(crate) fn validate(spec: &ChannelSpec) -> Result<(), ChannelError> {
    if spec.rate == 0 || spec.rate > spec.max_rate() {
        return Err(ChannelError::Rate(spec.clone()));
    }
    if spec.burst == 0 {
        return Err(ChannelError::Burst(spec.clone()));
    }
    Ok(())
}

/// Every route of the channels `specs` (by slot) over `mounts`, and per operation the
/// mountpoints (a bit each) where a weighted channel charges it nothing; fails if some
/// request would need more than four channels.
fn compute_routes(
    specs: &[Option<ChannelSpec>],
    mounts: &[String],
) -> Result<(Vec<[u64; Op::COUNT]>, [u64; Op::COUNT]), ChannelError> {
    let mut routes = vec![[0u64; Op::COUNT]; mounts.len()];
    let mut charged_nothing = [0u64; Op::COUNT];
    for (mount_index, mount_name) in mounts.iter().enumerate() {
        for op in Op::ALL {
            let mut requests = 0u32;
            let mut bytes = 0u32;
            let mut count = 0;
            let mut request_count = 0;
            let mut byte_count = 0;
            for (slot, spec) in specs.iter().enumerate() {
                let Some(spec) = spec else { continue };
                let mount_matches = spec.mount.as_ref().is_none_or(|m| m == mount_name);
                if !mount_matches || !spec.scope.covers(*op) {
                    continue;
                }
                // An operation a weighted channel charges nothing passes it freely: it
                // is not routed through it at all.
                if spec.units_per_token() != 1 && spec.costs.of(*op) == 0 {
                    charged_nothing[*op as usize] |= 1u64 << mount_index;
                    continue;
                }
                if count == MAX_CHANNELS_PER_REQUEST {
                    return Err(ChannelError::TooManyPerRequest {
                        op: *op,
                        mount: mount_name.clone(),
                    });
                }
                count += 1;
                if spec.unit == Unit::Bytes {
                    bytes |= (slot as u32 + 1) << (8 * byte_count);
                    byte_count += 1;
                } else {
                    requests |= (slot as u32 + 1) << (8 * request_count);
                    request_count += 1;
                }
            }
            routes[mount_index][*op as usize] = requests as u64 | (bytes as u64) << 32;
        }
    }
    Ok((routes, charged_nothing))
}

fn publish_routes(routes: &[[u64; Op::COUNT]]) {
    for (mount, row) in routes.iter().enumerate() {
        for (op, packed) in row.iter().enumerate() {
            ROUTES[op][mount].store(*packed, Ordering::Release);
        }
    }
}

#[inline(always)]
fn route(mount: u16, op: Op) -> u64 {
    match ROUTES[op as usize].get(mount as usize) {
        Some(word) => word.load(Ordering::Acquire),
        None => 0,
    }
}

/// What [`admit`] did, for [`settle`]: which byte-counting channels charged the
/// request before the call, and when the admission ended. Two words, so that it stays
/// in registers across the call.
#[derive(Clone, Copy, Debug, Default)]
pub struct Admission {
    /// The byte-counting channels passed (slot number + 1 per byte, as in the high half
    /// of a `ROUTES` word) in the low half; [`CAPPED`] if one of them charged less than
    /// the bytes requested (its burst capped the charge), so that even a call that
    /// moved exactly that many needs settling.
    byte_channels: u64,
    /// [`tsc::ticks`] when the request was admitted: its service time starts there.
    pub stamp: u64,
}

/// [`Admission::byte_channels`]: a byte channel's charge was capped.
const CAPPED: u64 = 1 << 32;

impl Admission {
    /// Nothing admitted (no channel, or not managed).
    pub const NONE: Admission = Admission {
        byte_channels: 0,
        stamp: 0,
    };

    /// The byte channels passed, packed as in a route.
    #[inline(always)]
    fn byte_route(self) -> u32 {
        self.byte_channels as u32
    }
}

/// Passes a request of operation `op` through every channel that serves it, sleeping
/// until each admits it (the time is counted as the operation's wait). `bytes` is the
/// request's size for byte-counting channels; `counters` are the calling thread's. The
/// clock is read once unless the request waits or a channel's credit does not pay,
/// and also when no channel serves the request (its service time is measured too).
///
/// Inlined into the hooks' managed path: channels whose cost the thread's leased
/// credit pays are passed with loads and plain stores in the thread's shard (no call,
/// no panic, `errno` untouched); from the first one it does not pay, the rest is
/// [`admit_rest`], out of line (so the inlined loops keep nothing alive across a call).
#[inline(always)]
pub fn admit(counters: stats::Counters, mount: u16, op: Op, bytes: u64) -> Admission {
    let word = route(mount, op);
    // The credit check's clock (one `rdtsc` against tick deadlines: `tsc`), and where
    // the call's service time starts.
    let stamp = tsc::ticks();
    let mut admission = Admission {
        byte_channels: word >> 32,
        stamp,
    };
    let mut requests = word as u32;
    while requests != 0 {
        let index = slot_index(requests);
        if !paid_from_credit(counters, index, request_cost(index, op), stamp) {
            return admit_rest(
                counters,
                op,
                requests,
                admission.byte_route(),
                bytes,
                admission,
            );
        }
        requests >>= 8;
    }
    let mut byte_channels = admission.byte_route();
    while byte_channels != 0 {
        let index = slot_index(byte_channels);
        let cost = byte_cost(index, bytes, &mut admission);
        if !paid_from_credit(counters, index, cost, stamp) {
            return admit_rest(counters, op, 0, byte_channels, bytes, admission);
        }
        byte_channels >>= 8;
    }
    admission
}

/// The slot named by the low byte of a packed route (slot number + 1). A byte of 0,
/// never in a route, would index the unused last slot: no bounds check is needed.
#[inline(always)]
fn slot_index(packed: u32) -> usize {
    (packed as u8).wrapping_sub(1) as usize
}

/// What a request of `op` costs in request channel `index`, in its bucket's units.
#[inline(always)]
fn request_cost(index: usize, op: Op) -> u64 {
    SLOTS[index].unit_costs[op as usize].load(Ordering::Relaxed) as u64
}

/// What a request of `bytes` bytes costs in byte channel `index` before the call: the
/// bytes up to its charge cap (`admission` notes whether the cap cut them).
#[inline(always)]
fn byte_cost(index: usize, bytes: u64, admission: &mut Admission) -> u64 {
    let cap = SLOTS[index].byte_charge_cap.load(Ordering::Relaxed);
    if bytes > cap {
        admission.byte_channels |= CAPPED;
    }
    bytes.min(cap)
}

/// [`stats::Counters::paid_from_credit`] under channel `index`'s current generation.
#[inline(always)]
fn paid_from_credit(counters: stats::Counters, index: usize, cost: u64, stamp: u64) -> bool {
    let generation = SLOTS[index].generation.load(Ordering::Acquire);
    counters.paid_from_credit(index, generation, cost, stamp)
}

/// [`admit`] from the first channel the thread's credit did not pay (`requests` and
/// `byte_channels`: the request and byte channels left, packed as in a route): each is
/// passed from credit if it pays, else by [`pass_reserving`], which may wait (then the
/// time is counted as `op`'s wait and the clock is read again); the admission's stamp
/// is read when the last channel passed.
#[cold]
#[inline(never)]
fn admit_rest(
    counters: stats::Counters,
    op: Op,
    mut requests: u32,
    mut byte_channels: u32,
    bytes: u64,
    mut admission: Admission,
) -> Admission {
    let mut stamp = tsc::ticks();
    let mut pass = |index: usize, cost: u64| {
        if paid_from_credit(counters, index, cost, stamp) {
            return;
        }
        let generation = SLOTS[index].generation.load(Ordering::Acquire);
        let wait = pass_reserving(counters, index, op, bytes, generation, cost);
        if wait != 0 {
            counters.waited(op, wait);
            stamp = tsc::ticks();
        }
    };
    while requests != 0 {
        let index = slot_index(requests);
        pass(index, request_cost(index, op));
        requests >>= 8;
    }
    while byte_channels != 0 {
        let index = slot_index(byte_channels);
        let cost = byte_cost(index, bytes, &mut admission);
        pass(index, cost);
        byte_channels >>= 8;
    }
    admission.stamp = tsc::ticks();
    admission
}

/// The rest of passing one channel when the managed path's credit check failed
/// (`generation` was read before the check): nothing if the channel was removed
/// meanwhile; else read the clock, take `cost` (from credit if it is still good by the
/// clock, else reserving in the bucket and leasing or batching for later requests),
/// then wait if the reservation starts later. Returns the time spent waiting. `errno`
/// is kept and a panic means "admitted".
#[cold]
#[inline(never)]
fn pass_reserving(
    counters: stats::Counters,
    index: usize,
    op: Op,
    bytes: u64,
    generation: u64,
    cost: u64,
) -> u64 {
    crate::guard::shielded(|| {
        let slot = &SLOTS[index];
        if !slot.in_use.load(Ordering::Acquire) {
            return 0;
        }
        let ticks = tsc::ticks();
        let now = bucket::now_ns();
        // A signal handler on a thread asleep for its batch: the thread's row is the
        // thread's to relet when it wakes.
        let handler = counters.owned_credit(index).is_some_and(Credit::asleep);
        let bucket = slot.bucket();
        let reservation = slot.take(bucket, counters, index, generation, cost, now, ticks);
        if reservation.start_ns <= now {
            counters.admitted(index, cost);
            return 0;
        }
        let reserved = Reserved {
            bucket,
            tokens: cost.saturating_add(reservation.leased),
            start_ns: reservation.start_ns,
        };
        let waited = wait(counters, index, op, bytes, generation, reserved, now);
        if !handler {
            slot.relet_after_waking(counters, index, generation, reservation.leased);
        }
        waited
    })
    .unwrap_or(0)
}

impl Slot {
    /// Publishes a change (added, re-rated, removed) and wakes every waiter.
    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.changes.fetch_add(1, Ordering::AcqRel);
        // SAFETY: FUTEX_WAKE on our own aligned word; the result needs no handling.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.changes.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            )
        };
    }

    /// The bucket requests wait in: the job's shared one, else this process' own.
    #[inline(always)]
    fn bucket(&self) -> &TokenBucket {
        let shared = self.shared.load(Ordering::Acquire);
        if shared.is_null() {
            &self.own_bucket
        } else {
            // SAFETY: shared buckets live in a mapping that is never unmapped.
            unsafe { &*shared }
        }
    }

    /// Sets the cost of each operation's request in a new channel of `spec`, in its
    /// bucket's units.
    fn set_unit_costs(&self, spec: &ChannelSpec) {
        let weighted = spec.units_per_token() != 1;
        for op in Op::ALL {
            let cost = if weighted { spec.costs.of(*op) } else { 1 };
            self.unit_costs[*op as usize].store(cost, Ordering::Relaxed);
        }
    }

    /// Sets the rate and burst of a new channel of `spec`, and the credit terms that
    /// follow from them; requests then wait in `shared` (as it is) or in this process'
    /// own bucket (full).
    fn configure(&self, spec: &ChannelSpec, shared: Option<&'static TokenBucket>) {
        let limit = self.set_terms(spec);
        // Its own bucket is made anew even while it waits in the job's: a re-rate moves
        // it there (`rerate`), and a re-rate carries debt — not the debt of the slot's
        // previous channel.
        self.own_bucket.configure(limit);
        let shared = shared.map_or(std::ptr::null_mut(), |bucket| {
            bucket as *const TokenBucket as *mut _
        });
        self.shared.store(shared, Ordering::Release);
    }

    /// Changes the rate and burst of a channel in use to `spec`'s: its requests then
    /// wait in this process' own bucket, which keeps the tokens it holds up to the new
    /// burst, and owes at the new rate what it owed ([`TokenBucket::reconfigure`]).
    fn rerate(&self, spec: &ChannelSpec) {
        let limit = self.set_terms(spec);
        self.own_bucket.reconfigure(limit);
        self.shared.store(std::ptr::null_mut(), Ordering::Release);
    }

    /// Sets the credit terms and byte charge cap of `spec`, and returns its bucket's
    /// limit.
    fn set_terms(&self, spec: &ChannelSpec) -> Limit {
        let limit = Limit::of(spec);
        self.terms.configure(
            limit.rate,
            limit.burst,
            self.counts_bytes.load(Ordering::Relaxed),
            spec.units_per_token(),
        );
        self.byte_charge_cap.store(limit.burst, Ordering::Relaxed);
        limit
    }

    /// What a request of `op` and `bytes` bytes is charged in this channel before the
    /// call, in its bucket's units.
    #[inline]
    fn cost(&self, op: Op, bytes: u64) -> u64 {
        if self.counts_bytes.load(Ordering::Relaxed) {
            self.byte_charge(bytes)
        } else {
            self.unit_costs[op as usize].load(Ordering::Relaxed) as u64
        }
    }

    /// What a request of `bytes` bytes is charged in this byte channel before the call.
    #[inline]
    fn byte_charge(&self, bytes: u64) -> u64 {
        bytes.min(self.byte_charge_cap.load(Ordering::Relaxed))
    }

    /// Takes `cost` tokens at `now` for the calling thread, from its credit or `bucket`,
    /// the channel's ([`Terms::take`]).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn take(
        &self,
        bucket: &TokenBucket,
        counters: stats::Counters,
        index: usize,
        generation: u64,
        cost: u64,
        now: u64,
        ticks: u64,
    ) -> bucket::Reservation {
        let credit = counters.owned_credit(index);
        self.terms
            .take(bucket, credit, generation, cost, now, ticks)
    }

    /// Makes the `leased` tokens the calling thread reserved with the request it waited
    /// for spendable, now that it woke ([`Terms::relet_after_waking`]).
    fn relet_after_waking(
        &self,
        counters: stats::Counters,
        index: usize,
        generation: u64,
        leased: u64,
    ) {
        if let Some(credit) = counters.owned_credit(index) {
            let ticks = tsc::ticks();
            let now = bucket::now_ns();
            self.terms
                .relet_after_waking(credit, generation, leased, now, ticks);
        }
    }

    /// The most tokens a thread that must wait at `now` may reserve ahead.
    #[cfg(test)]
    fn max_batch(&self, now: u64) -> u64 {
        self.terms.max_batch(self.bucket(), now)
    }
}

/// Gives `counters`' unspent, still valid credit back to the buckets: a thread or process
/// that ends before spending its lease or batch would otherwise waste tokens that were
/// charged (a job of many short-lived threads or processes would run below its limit).
/// A refund only cancels debt, never fills a bucket beyond full.
pub fn return_credit(counters: stats::Counters) {
    let now = bucket::now_ns();
    for (index, slot) in SLOTS.iter().enumerate() {
        if let (true, Some(credit)) = (
            slot.in_use.load(Ordering::Acquire),
            counters.owned_credit(index),
        ) {
            let generation = slot.generation.load(Ordering::Acquire);
            credit.give_back(slot.bucket(), generation, now);
        }
    }
}

/// Sleeps until admitted; re-reserves if the channel changes meanwhile.
#[cold]
fn wait(
    counters: stats::Counters,
    index: usize,
    op: Op,
    bytes: u64,
    generation: u64,
    reserved: Reserved,
    entered: u64,
) -> u64 {
    let slot = &SLOTS[index];
    let (now, admitted) = sleep_until_start(slot, generation, reserved, || slot.cost(op, bytes));
    if admitted {
        counters.admitted(index, slot.cost(op, bytes));
    }
    now.saturating_sub(entered)
}

/// A reservation a request waits for: the bucket it was taken in, the tokens it holds
/// there (the cost, and any batch reserved with it) and when it may start.
struct Reserved<'a> {
    bucket: &'a TokenBucket,
    tokens: u64,
    start_ns: u64,
}

/// Sleeps until `reserved`, taken under `generation`, may start. If the channel changes
/// meanwhile, it gives the reservation back (a re-rate carries it over as debt, at the
/// new rate, like the rest of the bucket's) and reserves `cost()` again under the new
/// terms, so a raised rate applies at once and a lowered one is not evaded — or, once
/// the channel is removed, it stops waiting. Every wait for tokens goes through here.
/// Returns the time it stopped waiting and whether it was admitted (false: the channel
/// was removed).
fn sleep_until_start<'a>(
    slot: &'a Slot,
    mut generation: u64,
    mut reserved: Reserved<'a>,
    cost: impl Fn() -> u64,
) -> (u64, bool) {
    loop {
        // `changes` before `generation`: a change after this read wakes the sleep below.
        let seen = slot.changes.load(Ordering::Acquire);
        let current = slot.generation.load(Ordering::Acquire);
        if current != generation {
            // Re-rated or removed while we slept: start over under the new settings.
            if !slot.in_use.load(Ordering::Acquire) {
                return (bucket::now_ns(), false);
            }
            generation = current;
            let now = bucket::now_ns();
            // Given back first: reserving again on top of it would pay it twice. (A
            // channel that left the job's bucket gives it back there.)
            reserved.bucket.refund(reserved.tokens, now);
            reserved.bucket = slot.bucket();
            reserved.tokens = cost();
            reserved.start_ns = reserved.bucket.reserve(reserved.tokens, 0, 0, now).start_ns;
        }
        let now = bucket::now_ns();
        if now >= reserved.start_ns {
            return (now, true);
        }
        slot.sleep_until(seen, reserved.start_ns);
    }
}

/// Settles a data request of operation `op` and `requested` bytes once its real size
/// is known: returns unused bytes to the byte-counting channels that charged it, or
/// takes (and waits for, counted as `op`'s wait) the extra — including what was above
/// a channel's charge cap. Whether the charge came from the bucket or from credit, it
/// was charged to the bucket, so a refund goes there. Nothing to do (no byte channel,
/// or every one charged exactly what moved) costs two compares.
#[inline(always)]
pub fn settle(counters: stats::Counters, op: Op, admission: Admission, requested: u64, moved: u64) {
    if admission.byte_channels == 0 || (admission.byte_channels & CAPPED == 0 && moved == requested)
    {
        return;
    }
    settle_shielded(counters, op, admission.byte_route(), requested, moved);
}

/// [`settle_bytes`] keeping `errno`; a panic means "settled".
#[cold]
#[inline(never)]
fn settle_shielded(counters: stats::Counters, op: Op, packed: u32, requested: u64, moved: u64) {
    let waited =
        crate::guard::shielded(|| settle_bytes(counters, packed, requested, moved)).unwrap_or(0);
    if waited != 0 {
        counters.waited(op, waited);
    }
}

fn settle_bytes(counters: stats::Counters, mut packed: u32, requested: u64, moved: u64) -> u64 {
    let mut waited = 0;
    while packed != 0 {
        let index = (packed & 0xff) as usize - 1;
        let slot = &SLOTS[index];
        if slot.counts_bytes.load(Ordering::Relaxed) && slot.in_use.load(Ordering::Acquire) {
            let charged = slot.byte_charge(requested);
            match moved.cmp(&charged) {
                std::cmp::Ordering::Less => {
                    slot.bucket().refund(charged - moved, bucket::now_ns());
                    counters.adjust_tokens(index, -((charged - moved) as i64));
                }
                std::cmp::Ordering::Greater => {
                    waited += pass_bytes_only(counters, index, moved - charged)
                }
                std::cmp::Ordering::Equal => {}
            }
        }
        packed >>= 8;
    }
    waited
}

/// Takes `bytes` more in byte channel `index` for a call that moved more than it was
/// charged before it, and waits for them ([`sleep_until_start`]). Returns the wait.
fn pass_bytes_only(counters: stats::Counters, index: usize, bytes: u64) -> u64 {
    let slot = &SLOTS[index];
    let ticks = tsc::ticks();
    let entered = bucket::now_ns();
    let generation = slot.generation.load(Ordering::Acquire);
    let handler = counters.owned_credit(index).is_some_and(Credit::asleep);
    let bucket = slot.bucket();
    let reservation = slot.take(bucket, counters, index, generation, bytes, entered, ticks);
    counters.adjust_tokens(index, bytes as i64);
    // As any wait: a re-rate or removal meanwhile applies to it too (it would otherwise
    // sleep to the old rate's deadline).
    let reserved = Reserved {
        bucket,
        tokens: bytes.saturating_add(reservation.leased),
        start_ns: reservation.start_ns,
    };
    let (now, _) = sleep_until_start(slot, generation, reserved, || bytes);
    let waited = now.saturating_sub(entered);
    if reservation.start_ns > entered && !handler {
        slot.relet_after_waking(counters, index, generation, reservation.leased);
    }
    waited
}

impl Slot {
    /// Sleeps until the monotonic clock reaches `deadline_ns` or the channel changes
    /// after `changes` read `seen` — one sleep per wait, however long (a futex wait
    /// with an absolute `CLOCK_MONOTONIC` deadline). A signal handler may run meanwhile:
    /// the caller's loop resumes the wait (the intercepted call is not failed). The
    /// caller restores `errno`, which this sets.
    fn sleep_until(&self, seen: u32, deadline_ns: u64) {
        let ts = libc::timespec {
            tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: our own aligned word and a valid timespec; FUTEX_WAIT_BITSET takes an
        // absolute CLOCK_MONOTONIC deadline.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.changes.as_ptr(),
                libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG,
                seen,
                &ts,
                std::ptr::null::<u32>(),
                libc::FUTEX_BITSET_MATCH_ANY,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use padll_wire::channel::{Costs, Scope};
    use padll_wire::ops::Class;

    /// True when some channel serves `op` on `mount`.
    fn has_route(mount: u16, op: Op) -> bool {
        route(mount, op) != 0
    }

    /// Channel tables are process-wide: tests take turns.
    fn tables() -> MutexGuard<'static, ()> {
        static TABLES: Mutex<()> = Mutex::new(());
        padll_wire::sync::lock(&TABLES)
    }

    #[test]
    fn channel_lifecycle() {
        let _tables = tables();
        set_mounts(&["/scratch".into(), "/data".into()]).unwrap();
        let spec = |mount: Option<&str>, scope, rate| ChannelSpec {
            mount: mount.map(str::to_string),
            scope,
            rate,
            unit: Unit::Requests,
            burst: 1,
            costs: Default::default(),
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

        admit(stats::local(), 0, Op::Open, 0);
        let infos = list();
        assert_eq!(infos.len(), 2);
        assert!(infos.iter().all(|c| c.admitted == 1));

        // Unknown mount and bad rates are rejected with the value named.
        let err = add(spec(Some("/nope"), Scope::All, 1)).unwrap_err();
        assert_eq!(err.to_string(), "'/nope' is not a registered mountpoint");
        let err = add(spec(None, Scope::All, 0)).unwrap_err();
        assert!(err.to_string().starts_with("rate 0 of '"), "{err}");

        // A slow channel delays; raising its rate releases a waiter promptly.
        set_limit(meta, 1, 1).unwrap();
        admit(stats::local(), 0, Op::Getattr, 0); // uses the burst
        let waiter = std::thread::spawn(|| waited(|| admit(stats::local(), 0, Op::Getattr, 0)));
        std::thread::sleep(std::time::Duration::from_millis(50));
        set_limit(meta, 1_000_000, 1).unwrap();
        let waited = waiter.join().unwrap();
        assert!(waited < 900_000_000, "waiter was not released: {waited} ns");

        // Five channels on one request are refused.
        let extra: Vec<_> = (0..2)
            .map(|_| add(spec(None, Scope::All, 10)).unwrap())
            .collect();
        let err = add(spec(None, Scope::All, 10)).unwrap_err();
        assert!(err.to_string().starts_with("more than 4 channels"), "{err}");

        assert!(remove(open));
        assert!(!remove(open));
        for id in extra {
            remove(id);
        }
        clear();
        assert!(list().is_empty());
        assert!(!has_route(0, Op::Open));
    }

    /// How long `f` took (ns): at least the time it waited.
    fn waited<T>(f: impl FnOnce() -> T) -> u64 {
        let start = bucket::now_ns();
        f();
        bucket::now_ns() - start
    }

    fn getattr_channel(rate: u64, burst: u64) -> ChannelId {
        set_mounts(&["/scratch".into()]).unwrap();
        add(ChannelSpec {
            mount: None,
            scope: Scope::Op(Op::Getattr),
            rate,
            unit: Unit::Requests,
            burst,
            costs: Default::default(),
        })
        .unwrap()
    }

    #[test]
    fn leases_are_spent_expire_and_die_with_a_rerate() {
        let _tables = tables();
        let id = getattr_channel(1_000_000, 10_000);
        let index = id.0 as usize;
        let credit = || {
            stats::local()
                .owned_credit(index)
                .map_or(0, Credit::unspent)
        };
        let stat = || waited(|| admit(stats::local(), 0, Op::Getattr, 0));
        // Leases on a clock passed in (a loaded machine may pause a thread longer than
        // a lease lives): a request at `t + ms` milliseconds.
        let t = bucket::now_ns();
        let generation = SLOTS[index].generation.load(Ordering::Acquire);
        let take_at = |ms: u64| {
            let now = t + ms * 1_000_000;
            let slot = &SLOTS[index];
            let start = slot.take(slot.bucket(), stats::local(), index, generation, 1, now, 0);
            assert!(start.start_ns <= now, "a request with a full bucket waited");
        };

        // A full bucket leases 256 more tokens with the first request; the next one is
        // paid from credit.
        take_at(0);
        assert_eq!(credit(), 256);
        take_at(1);
        assert_eq!(credit(), 255);

        // Credit expires τ/4 = 2.5 ms after its lease: dropped, and a new lease taken.
        take_at(3);
        assert_eq!(credit(), 256);

        // A re-rate voids credit: at 1000/s with a burst of 1 the third request waits
        // ~1 ms instead of spending the old credit (no lease: too small; a waiting
        // request may reserve a batch, what it spends in τ/8 = 125 µs at its pace).
        set_limit(id, 1000, 1).unwrap();
        let waited: u64 = (0..3).map(|_| stat()).sum();
        assert!(
            waited > 500_000,
            "stale credit was spent: waited {waited} ns"
        );
        assert!(credit() <= 16, "credit {}", credit());

        // A limiting bucket leases nothing (62 tokens at this burst): the request waits,
        // and what it reserves beyond its cost is a batch (≤ a lease's cap, 256).
        // (200 ms of debt: a thread descheduled meanwhile still finds it unpaid.)
        set_limit(id, 100_000, 1_000).unwrap();
        SLOTS[index]
            .bucket()
            .reserve(20_000, 0, 0, bucket::now_ns());
        assert!(stat() > 5_000_000);
        assert!(credit() <= 256, "credit {}", credit());

        // Only the requests admitted are counted, not the tokens leased for them.
        let info = list().into_iter().find(|c| c.id == id).unwrap();
        assert_eq!((info.admitted, info.tokens), (4, 4));
        clear();
    }

    #[test]
    fn many_threads_with_leases_stay_within_the_limit() {
        let _tables = tables();
        let (rate, burst, threads) = (50_000u64, 500u64, 4);
        let t0 = bucket::now_ns();
        let id = getattr_channel(rate, burst);
        assert_eq!(SLOTS[id.0 as usize].terms.lease(), 31);
        let deadline = t0 + 500_000_000;
        let counts: Vec<_> = (0..threads)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut admitted = 0u64;
                    loop {
                        admit(stats::local(), 0, Op::Getattr, 0);
                        if bucket::now_ns() > deadline {
                            return admitted;
                        }
                        admitted += 1;
                    }
                })
            })
            .collect();
        let admitted: u64 = counts.into_iter().map(|t| t.join().unwrap()).sum();
        // GCRA: rate·window + burst + one request per thread; credit is spent at most
        // τ/4 after its lease or batch wake-up, and a batch's tokens no earlier than
        // they conform: ≤ rate·τ/4 + one batch more (invariant 12).
        let window = (deadline - t0) as f64 / 1e9;
        let batch = SLOTS[id.0 as usize].max_batch(deadline) as f64;
        let bound = rate as f64 * window + burst as f64 * 1.25 + batch + threads as f64;
        assert!(
            (admitted as f64) <= bound,
            "{admitted} admitted, bound {bound}"
        );
        clear();
    }

    #[test]
    fn a_lowered_rate_lets_no_credit_of_the_old_one_through() {
        let _tables = tables();
        // At 1 M/s with a 10 000-token burst every thread leases 256 tokens ahead.
        let id = getattr_channel(1_000_000, 10_000);
        let threads = 4;
        let changed_at = std::sync::Arc::new(AtomicU64::new(u64::MAX));
        let counts: Vec<_> = (0..threads)
            .map(|_| {
                let changed_at = changed_at.clone();
                std::thread::spawn(move || {
                    let mut after = 0u64;
                    loop {
                        admit(stats::local(), 0, Op::Getattr, 0);
                        let now = bucket::now_ns();
                        let since = changed_at.load(Ordering::Acquire);
                        if now >= since.saturating_add(300_000_000) {
                            return after;
                        }
                        after += u64::from(now >= since);
                    }
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (rate, burst) = (1000u64, 1u64);
        set_limit(id, rate, burst).unwrap();
        let t0 = bucket::now_ns();
        changed_at.store(t0, Ordering::Release);
        let admitted: u64 = counts.into_iter().map(|t| t.join().unwrap()).sum();
        // What the new rule admits over the 300 ms (as in the test above: credit spent
        // up to τ/4 after its grant, one batch more) and one request per thread admitted
        // before the change but counted after; the old credit (4 × 256) is not.
        let window = 0.3;
        let batch = SLOTS[id.0 as usize].max_batch(t0 + 300_000_000) as f64;
        let bound = rate as f64 * window + burst as f64 * 1.25 + batch + 2.0 * threads as f64;
        assert!(
            (admitted as f64) <= bound,
            "{admitted} admitted in the 300 ms after the change, bound {bound}"
        );
        clear();
    }

    /// A thread's request of `cost` at `now` on a clock passed in: it takes its tokens
    /// and, if it must wait, wakes when the request may start, with its batch (as
    /// [`pass_reserving`] does). Returns when the request starts.
    fn take_waking(
        slot: &Slot,
        counters: stats::Counters,
        index: usize,
        generation: u64,
        cost: u64,
        now: u64,
    ) -> u64 {
        let reservation = slot.take(slot.bucket(), counters, index, generation, cost, now, 0);
        if reservation.start_ns <= now {
            return now;
        }
        if let Some(credit) = counters.owned_credit(index) {
            let woken = reservation.start_ns;
            slot.terms
                .relet_after_waking(credit, generation, reservation.leased, woken, 0);
        }
        reservation.start_ns
    }

    #[test]
    fn a_thread_gets_its_rate_on_a_clock_passed_in() {
        let _tables = tables();
        let (rate, burst) = (50_000u64, 500u64);
        let id = getattr_channel(rate, burst);
        let index = id.0 as usize;
        let slot = &SLOTS[index];
        let generation = slot.generation.load(Ordering::Acquire);
        let counters = stats::local();
        // One simulated second of requests 1 µs apart (far faster than the rate), each
        // starting when the bucket or its credit admits it.
        let t0 = bucket::now_ns();
        let end = t0 + 1_000_000_000;
        let (mut now, mut admitted) = (t0, 0u64);
        while now < end {
            now = take_waking(slot, counters, index, generation, 1, now);
            admitted += 1;
            now += 1_000;
        }
        // Leases and batches neither raise the rate (invariant 12) nor lose tokens.
        let batch = slot.max_batch(end);
        let bound = rate + burst + burst / 4 + batch;
        assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
        assert!(
            admitted >= rate,
            "{admitted} admitted in one second at {rate}/s"
        );
        clear();
    }

    /// A metadata channel on every mountpoint charging opens 3 tokens, closes none and
    /// stats half a token.
    fn weighted_metadata_channel(rate: u64, burst: u64) -> ChannelSpec {
        ChannelSpec {
            mount: None,
            scope: Scope::Class(Class::Metadata),
            rate,
            unit: Unit::Requests,
            burst,
            costs: Costs::new([(Op::Open, 3000), (Op::Close, 0), (Op::Getattr, 500)]).unwrap(),
        }
    }

    #[test]
    fn a_weighted_channel_charges_each_operation_its_cost() {
        let _tables = tables();
        set_mounts(&["/scratch".into()]).unwrap();
        let weighted = add(weighted_metadata_channel(1_000_000, 10_000)).unwrap();
        let plain = add(ChannelSpec {
            costs: Default::default(),
            ..weighted_metadata_channel(1_000_000, 10_000)
        })
        .unwrap();
        let (weighted_slot, plain_slot) = (&SLOTS[weighted.0 as usize], &SLOTS[plain.0 as usize]);
        // The weighted bucket counts thousandths, so do its costs and its credit terms.
        for op in [Op::Open, Op::Getattr, Op::Mkdir] {
            assert_eq!(plain_slot.cost(op, 0), 1, "{op}");
        }
        assert_eq!(weighted_slot.cost(Op::Open, 0), 3000);
        assert_eq!(weighted_slot.cost(Op::Getattr, 0), 500);
        assert_eq!(
            weighted_slot.cost(Op::Mkdir, 0),
            1000,
            "not named: one token"
        );
        assert_eq!(plain_slot.terms.lease(), 256);
        assert_eq!(weighted_slot.terms.lease(), 256 * 1000);
        // A close costs nothing: only the unweighted channel is on its route.
        assert_eq!(route(0, Op::Close) & 0xffff_ffff, plain.0 as u64 + 1);
        assert_ne!(route(0, Op::Open) & 0xff00, 0, "open passes both");

        let counters = stats::local();
        let (opens, stats_made) = (10, 7);
        for _ in 0..opens {
            admit(counters, 0, Op::Open, 0);
            admit(counters, 0, Op::Close, 0);
        }
        for _ in 0..stats_made {
            admit(counters, 0, Op::Getattr, 0);
        }
        let info = |id| list().into_iter().find(|c| c.id == id).unwrap();
        // Whole tokens, rounded down: 3 × 10 + 0.5 × 7 = 33.5.
        assert_eq!((info(weighted).admitted, info(weighted).tokens), (17, 33));
        assert_eq!((info(plain).admitted, info(plain).tokens), (27, 27));
        clear();
    }

    #[test]
    fn an_operation_a_weighted_channel_charges_nothing_is_not_timed_there() {
        let _tables = tables();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while !tsc::timing_ready() {
            if std::time::Instant::now() > deadline {
                return; // nothing is timed here (stats' tests check that)
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        set_mounts(&["/scratch".into()]).unwrap();
        add(weighted_metadata_channel(1_000_000, 10_000)).unwrap();
        let timed = || -> u64 {
            stats::latency_rows(&["/scratch".to_string()])
                .iter()
                .filter(|row| row.class == Class::Metadata)
                .flat_map(|row| row.counts.iter())
                .sum()
        };
        let before = timed();
        let counters = stats::local();
        counters.served(0, Op::Close, 1000);
        assert_eq!(
            timed(),
            before,
            "a close costs nothing: its time is not the server's"
        );
        counters.served(0, Op::Open, 1000);
        assert_eq!(timed(), before + 1);
        clear();
        counters.served(0, Op::Close, 1000);
        assert_eq!(timed(), before + 2, "with no weights, a close is timed");
    }

    #[test]
    fn a_weighted_channel_admits_its_rate_over_each_request_cost() {
        let _tables = tables();
        set_mounts(&["/scratch".into()]).unwrap();
        // 300 tokens/s of opens costing 3 tokens each: 100 opens/s.
        let (rate, burst) = (300u64, 3u64);
        let id = add(weighted_metadata_channel(rate, burst)).unwrap();
        let index = id.0 as usize;
        let slot = &SLOTS[index];
        let generation = slot.generation.load(Ordering::Acquire);
        let counters = stats::local();
        let cost = slot.cost(Op::Open, 0);
        // One simulated second of opens 1 µs apart, each starting when admitted.
        let t0 = bucket::now_ns();
        let end = t0 + 1_000_000_000;
        let (mut now, mut admitted) = (t0, 0u64);
        while now < end {
            now = take_waking(slot, counters, index, generation, cost, now);
            admitted += 1;
            now += 1_000;
        }
        // The burst (one open) at once, one more (GCRA's own), then 100 a second.
        let bound = (rate + burst + burst / 4) * 1000 / cost + slot.max_batch(end) / cost + 1;
        assert!(
            admitted <= bound,
            "{admitted} opens admitted, bound {bound}"
        );
        assert!(admitted >= 99, "{admitted} opens admitted in one second");
        clear();
    }

    #[test]
    fn a_weighted_rate_is_at_most_a_thousandth_of_the_largest() {
        let _tables = tables();
        set_mounts(&["/scratch".into()]).unwrap();
        let largest = bucket::MAX_RATE / 1000;
        let id = add(weighted_metadata_channel(largest, 1)).unwrap();
        let err = set_limit(id, largest + 1, 1).unwrap_err();
        let refused = weighted_metadata_channel(largest + 1, 1);
        assert!(refused
            .to_string()
            .ends_with(" weighing open=3, close=0, getattr=0.5"));
        assert_eq!(
            err.to_string(),
            format!(
                "rate {} of '{refused}' is outside 1..={largest}",
                largest + 1
            )
        );
        clear();
        let unweighted = ChannelSpec {
            costs: Default::default(),
            ..weighted_metadata_channel(largest + 1, 1)
        };
        assert!(add(unweighted).is_ok());
        clear();
    }

    #[test]
    fn rules_given_other_costs_replace_their_channel() {
        let _tables = tables();
        set_mounts(&["/scratch".into()]).unwrap();
        let counters = stats::local();
        let tokens = || list()[0].tokens;
        crate::control::apply(&[weighted_metadata_channel(1_000_000, 10_000)]).unwrap();
        admit(counters, 0, Op::Open, 0);
        assert_eq!(tokens(), 3);
        // Same selector and costs, another rate: re-rated in place, counters carry on.
        crate::control::apply(&[weighted_metadata_channel(500_000, 10_000)]).unwrap();
        admit(counters, 0, Op::Open, 0);
        assert_eq!((list().len(), tokens()), (1, 6));
        // Other costs: a new channel, counting from zero in its own units.
        let cheaper = ChannelSpec {
            costs: Costs::new([(Op::Open, 2000)]).unwrap(),
            ..weighted_metadata_channel(500_000, 10_000)
        };
        crate::control::apply(std::slice::from_ref(&cheaper)).unwrap();
        admit(counters, 0, Op::Open, 0);
        admit(counters, 0, Op::Close, 0);
        assert_eq!(list()[0].spec, cheaper);
        assert_eq!((list().len(), tokens()), (1, 3), "an open 2, a close 1");
        // No costs: whole tokens again.
        let unweighted = ChannelSpec {
            costs: Default::default(),
            ..cheaper
        };
        crate::control::apply(std::slice::from_ref(&unweighted)).unwrap();
        admit(counters, 0, Op::Open, 0);
        assert_eq!((list()[0].spec.costs.is_empty(), tokens()), (true, 1));
        clear();
    }

    /// A request channel of `scope` at `rate` on every mountpoint.
    fn rule(scope: Scope, rate: u64, costs: Costs) -> ChannelSpec {
        ChannelSpec {
            mount: None,
            scope,
            rate,
            unit: Unit::Requests,
            burst: 10,
            costs,
        }
    }

    #[test]
    fn a_rule_set_refused_by_the_channel_table_changes_nothing() {
        let _tables = tables();
        set_mounts(&["/scratch".into()]).unwrap();
        let old = rule(Scope::Op(Op::Open), 1000, Costs::default());
        crate::control::apply(std::slice::from_ref(&old)).unwrap();
        // Five channels on `getattr`: the fifth is refused by the routes, once the
        // other four are known.
        let weighted = || Costs::new([(Op::Getattr, 2000)]).unwrap();
        let five = [
            rule(Scope::All, 1000, Costs::default()),
            rule(Scope::All, 1000, weighted()),
            rule(Scope::Class(Class::Metadata), 1000, Costs::default()),
            rule(Scope::Class(Class::Metadata), 1000, weighted()),
            rule(Scope::Op(Op::Getattr), 1000, Costs::default()),
        ];
        let refused = crate::control::apply(&five).unwrap_err();
        assert!(
            refused.to_string().contains("more than 4 channels"),
            "{refused}"
        );
        let in_force: Vec<ChannelSpec> = list().into_iter().map(|c| c.spec).collect();
        assert_eq!(
            in_force,
            std::slice::from_ref(&old),
            "refused, yet the rules changed"
        );
        assert!(has_route(0, Op::Open) && !has_route(0, Op::Getattr));
        // Nor does an installation (the fallback's, the start's) that cannot be made.
        let with_own_buckets: Vec<_> = five.iter().map(|s| (s.clone(), None)).collect();
        assert!(install(&with_own_buckets).is_err());
        let in_force: Vec<ChannelSpec> = list().into_iter().map(|c| c.spec).collect();
        assert_eq!(in_force, [old]);
        clear();
    }

    /// A `fork` while the control thread replaces the rules gives the child the old set
    /// or the new one, never a part (the fork handlers wait for the registry, which an
    /// update holds from start to end).
    #[test]
    fn a_fork_during_a_rules_update_sees_a_whole_set() {
        let _tables = tables();
        set_mounts(&["/scratch".into()]).unwrap();
        let a = rule(Scope::Op(Op::Getattr), 1000, Costs::default());
        let b = rule(Scope::Op(Op::Open), 1000, Costs::default());
        crate::control::apply(std::slice::from_ref(&a)).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let updater = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    crate::control::apply(std::slice::from_ref(&b)).unwrap();
                    crate::control::apply(std::slice::from_ref(&a)).unwrap();
                }
            })
        };
        let mut partial = 0;
        for _ in 0..300 {
            // What `pthread_atfork` runs around the stage's `fork`s.
            crate::before_fork();
            // SAFETY: the child only reads the channel list and exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                crate::after_fork_in_child();
                let channels = list().len() as i32;
                // SAFETY: ends the child without running the parent's destructors.
                unsafe { libc::_exit(channels) };
            }
            crate::after_fork_in_parent();
            let mut status = 0;
            // SAFETY: our own child; a valid status pointer.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            if libc::WEXITSTATUS(status) != 1 {
                partial += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        updater.join().unwrap();
        clear();
        assert_eq!(
            partial, 0,
            "children that started with a part of a rule set"
        );
    }

    #[test]
    fn byte_channels_settle_with_leased_credit() {
        let _tables = tables();
        set_mounts(&["/scratch".into()]).unwrap();
        let id = add(ChannelSpec {
            mount: None,
            scope: Scope::Op(Op::Read),
            rate: 1 << 30,
            unit: Unit::Bytes,
            burst: 10 << 20,
            costs: Default::default(),
        })
        .unwrap();
        let index = id.0 as usize;
        let counters = stats::local();
        // A 4 KiB read leases 640 KiB (burst/16) more; it returns 100 bytes, and the
        // rest goes back to the bucket.
        let admission = admit(counters, 0, Op::Read, 4096);
        assert_eq!(
            counters.owned_credit(index).map_or(0, Credit::unspent),
            640 << 10
        );
        settle(counters, Op::Read, admission, 4096, 100);
        // A read of unknown size that moved 5000 bytes pays them from credit.
        let admission = admit(counters, 0, Op::Read, 0);
        settle(counters, Op::Read, admission, 0, 5000);
        assert_eq!(
            counters.owned_credit(index).map_or(0, Credit::unspent),
            (640 << 10) - 5000
        );
        let info = list().into_iter().find(|c| c.id == id).unwrap();
        assert_eq!((info.admitted, info.tokens), (2, 5100));
        clear();
    }

    /// A data call that moved more than it was charged pays the rest after the call
    /// (`settle`): that wait, too, ends when the channel is re-rated to a rate that
    /// admits it, or removed — it does not sleep to the old rate's deadline.
    #[test]
    fn bytes_paid_after_the_call_follow_a_rerate_or_removal() {
        let _tables = tables();
        set_mounts(&["/scratch".into()]).unwrap();
        for removed in [false, true] {
            let id = add(ChannelSpec {
                mount: Some("/scratch".into()),
                scope: Scope::Class(Class::Data),
                rate: 2000,
                unit: Unit::Bytes,
                burst: 20,
                costs: Default::default(),
            })
            .unwrap();
            let index = id.0 as usize;
            // Another thread read 100 000 bytes: 50 s of debt at 2000 B/s.
            SLOTS[index]
                .bucket()
                .reserve(100_000, 0, 0, bucket::now_ns());
            // A FIFO read charged its burst (20 bytes) moved 64 KiB: it owes the rest,
            // behind that debt.
            let settling = std::thread::spawn(move || {
                let admission = Admission {
                    byte_channels: (index as u64 + 1) | CAPPED,
                    stamp: 0,
                };
                waited(|| settle(stats::local(), Op::Read, admission, 65_536, 65_536))
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            if removed {
                assert!(remove(id));
            } else {
                set_limit(id, 1_000_000_000, 10_000_000).unwrap();
            }
            // ≈ 0.2 s; 50 s if it slept to the old deadline (generous: a loaded machine).
            let waited = settling.join().unwrap();
            assert!(
                waited < 20_000_000_000,
                "removed: {removed}: the settlement waited {} ms",
                waited / 1_000_000
            );
            clear();
        }
    }

    /// Re-rated 100 times a second between 10/s and 11/s (burst 1) while 8 threads
    /// loop on a metadata call: the channel admits its rate. Each change used to
    /// release a token (100/s); the waiters must also give their reservations back
    /// when they reserve again, or the debt the change carries counts them twice and
    /// grows without end (nothing admitted).
    #[test]
    fn waiters_through_many_rate_changes_get_the_rate() {
        let _tables = tables();
        let id = getattr_channel(10, 1);
        let window = 3_000_000_000;
        let deadline = bucket::now_ns() + window;
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut admitted = 0u64;
                    loop {
                        admit(stats::local(), 0, Op::Getattr, 0);
                        if bucket::now_ns() > deadline {
                            return admitted;
                        }
                        admitted += 1;
                    }
                })
            })
            .collect();
        let mut changes = 0;
        while bucket::now_ns() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            changes += 1;
            set_limit(id, 10 + changes % 2, 1).unwrap();
        }
        // Releases the threads waiting beyond the window.
        clear();
        let admitted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        // ≈ 10.5/s · 3 s, the burst and GCRA's one more, each thread's first request.
        assert!(
            (15..=11 * 3 + 2 + 8 + 2).contains(&admitted),
            "{admitted} admitted in 3 s through {changes} changes"
        );
    }
}
