//! The logic shared by every hook (Darshan-style: the table in `hooks.rs` names each
//! entry point's operation, target and effect, in the call model of `call.rs`;
//! everything else happens here).
//!
//! One intercepted call:
//! 1. not initialised, nothing registered, or a vfork child (`vfork.rs`) → the real
//!    call, nothing else;
//! 2. find where the target lies (`resolve.rs`: path → lexical resolution, fd → fd
//!    table);
//! 3. unmanaged → count it, call the real function, keep the fd table right
//!    (`effects.rs`);
//! 4. managed → wait in every channel that serves it, call the real function,
//!    count its service time, settle the byte count, count it, record new
//!    descriptors.
//!
//! Invariants: `errno` after the hook is what the real call left; no panic escapes
//! (`guard.rs`); the stage's own I/O (inside [`StageIo`](crate::guard::StageIo)) is never
//! managed; steps 1–3 take no lock and allocate nothing except to remember a directory
//! above a mountpoint.

use crate::call::{Account, Call, Effect, Returned, Target};
use crate::effects::{after_cold, after_managed, after_unrelated, before};
use crate::guard::{guarded, in_stage_io};
use crate::paths::Place;
use crate::resolve::{quick_resolve, resolve, Resolved, UNRELATED};
use crate::{channels, errno, fdtable, stats, tsc, vfork};
use padll_wire::ops::Op;

/// The fast path of every hook, inlined into it and specialised for its target and
/// effect: classifies the target where that is cheap (descriptors: one load; clean
/// paths: one fused read of the path and a compare of its first 16 bytes with each
/// mountpoint's) and, when it is unrelated, counts the call in the thread's cached
/// shard and calls `real`. Calls nothing that is not inlined but `real` and `slow`
/// (on x86-64 an fd hook needs no stack frame before its tail call to libc), cannot
/// panic, takes no lock, allocates nothing. Everything else — managed targets, unclean
/// paths, relative paths from a directory above a mountpoint, a thread's first call —
/// goes to `slow` (out of line: [`intercept_resolved`]), with the target's place when
/// it is already known.
///
/// # Safety
/// `target` and `effect` must hold the pointers the application passed, and `real`
/// must call the real function with the application's arguments.
#[inline(always)]
pub unsafe fn dispatch<R: Returned>(
    op: Option<Op>,
    target: Target,
    effect: Effect,
    real: impl FnOnce() -> R,
    slow: impl FnOnce(u32) -> R,
) -> R {
    let Some(mounts) = crate::active_mounts() else {
        return real();
    };
    if let Some(op) = op {
        // SAFETY: `target` holds the application's pointers, valid for the duration of
        // the hook (our caller's contract).
        let code = match unsafe { quick_resolve(mounts, target) } {
            Some(code) => code,
            None => return slow(Resolved::UNKNOWN),
        };
        if code != 0 {
            return slow(code);
        }
        match stats::cached() {
            Some(counters) => counters.passthrough(op),
            None => return slow(0),
        }
    } else if vfork::in_child() {
        // Calls with an operation get here only with a cached shard, which a vfork
        // child never has; these only keep the descriptor table right: the parent's.
        return real();
    }
    match (effect, target) {
        // The descriptor was just read as unrelated: nothing to forget.
        (Effect::Close(fd), Target::Fd(target_fd)) if fd == target_fd && op.is_some() => {}
        (Effect::CloseStream(a), Target::Stream(b)) if a == b && op.is_some() => {}
        (Effect::CloseDirStream(a), Target::Dir(b)) if a == b && op.is_some() => {}
        _ => before(effect),
    }
    let result = real();
    after_unrelated(effect, &result);
    result
}

/// The hook body: see the module documentation.
///
/// # Safety
/// `call`'s target and effect must hold the pointers the application passed, and
/// `real` must call the real function with the application's arguments.
#[inline(always)]
pub unsafe fn intercept<R: Returned>(
    call: Call,
    account: impl FnOnce(&R) -> Account,
    real: impl FnOnce() -> R,
) -> R {
    if !crate::is_active() {
        return real();
    }
    // SAFETY: our caller's contract, passed on unchanged.
    unsafe { intercept_rest(Resolved::UNKNOWN, call, account, real) }
}

/// [`intercept`] once the stage is known to be active (the hooks' `slow`, reached only
/// from [`dispatch`] after it found the mount table published, which happens after
/// `ACTIVE` is set, and `ACTIVE` is never cleared), when the fast path may already have
/// found where the target lies (`found`, else [`Resolved::UNKNOWN`]).
///
/// Inlined into each hook's `slow`, it holds only the common managed call (see
/// [`is_common`]) of a thread that owns its shard and is not doing the stage's own
/// I/O; everything else is `rest` (the hook's own out-of-line call of
/// [`intercept_rest`] with the same arguments), so that the common path keeps few
/// values alive across the real call and its target and effect stay constants.
///
/// # Safety
/// As for [`intercept`]; `rest` must call [`intercept_rest`] with the same arguments.
#[inline(always)]
pub unsafe fn intercept_resolved<R: Returned>(
    found: u32,
    call: Call,
    account: impl FnOnce(&R) -> Account,
    real: impl FnOnce() -> R,
    rest: impl FnOnce() -> R,
) -> R {
    if let (Some(op), Some(counters)) = (call.op, stats::cached()) {
        let (target, effect, resolved) = (call.target, call.effect, Resolved(found));
        let roles = Roles::of(op, target, resolved);
        if is_common(&roles, effect) && counters.stage_io() == Some(false) {
            return managed_with(
                counters,
                &roles,
                target,
                effect,
                resolved,
                call.requested,
                account,
                real,
            );
        }
    }
    rest()
}

/// A call the hooks' `slow` handles inline: its target (or a copy's source) is managed
/// and its effect needs at most one store in the descriptor table (no path to
/// remember, nothing to duplicate, no directory change).
/// (`roles` of a target not resolved yet, [`Resolved::UNKNOWN`], name no mountpoint.)
#[inline(always)]
fn is_common(roles: &Roles, effect: Effect) -> bool {
    let main_managed = roles.main.is_some();
    if !main_managed && roles.source.is_none() {
        return false;
    }
    match effect {
        Effect::None
        | Effect::Close(_)
        | Effect::CloseRange(..)
        | Effect::CloseStream(_)
        | Effect::CloseDirStream(_) => true,
        // A creating call's placement (`placement::create`) is one bit test unless the
        // mountpoint has it, and then shielded.
        Effect::NewFd { flags } | Effect::Create { flags, .. } => {
            main_managed && flags & (libc::O_DIRECTORY | libc::O_PATH) == 0
        }
        Effect::NewStream => main_managed,
        _ => false,
    }
}

/// [`intercept_resolved`] for every call that is not [`is_common`]: resolving the
/// target in full, unrelated targets, directories above a mountpoint, effects that
/// remember paths, a thread's first call, the stage's own I/O.
///
/// # Safety
/// As for [`intercept`].
#[inline(always)]
pub unsafe fn intercept_rest<R: Returned>(
    found: u32,
    call: Call,
    account: impl FnOnce(&R) -> Account,
    real: impl FnOnce() -> R,
) -> R {
    if vfork::in_child() {
        // Every bit of the stage's state is the parent's (see `vfork.rs`).
        return real();
    }
    let Call {
        op,
        target,
        effect,
        requested,
    } = call;
    let resolved = match op {
        Some(_) if found != Resolved::UNKNOWN => Resolved(found),
        Some(_) => resolve(target),
        None => UNRELATED,
    };
    match op {
        Some(op) if !resolved.is_unrelated() => {
            let counters = stats::local();
            if in_stage_io(counters) {
                return real();
            }
            tracked_with(
                counters, op, target, effect, resolved, requested, account, real,
            )
        }
        _ => {
            if let Some(op) = op {
                stats::local().passthrough(op);
            }
            before(effect);
            let result = real();
            after_unrelated(effect, &result);
            result
        }
    }
}

/// Calls whose target is managed, or a directory above a mountpoint (whose new
/// descriptor must remember its path), counted in `counters` (the calling thread's,
/// not doing the stage's own I/O). Inlined into each hook's out-of-line `slow`, so the
/// operation, target kind and effect are constants there.
///
/// The common case — a thread that owns its counter shard, every channel paid from the
/// thread's leased credit, no byte count to settle, no path to remember — runs only
/// code that cannot panic and does not touch `errno` (bounded table lookups, plain
/// loads and stores in the thread's shard, one `rdtsc` before and one after the real
/// call, whose difference is counted as its service time): it needs neither a panic
/// guard nor an `errno` save. Everything else (reserving in a bucket, waiting, settling a byte
/// count, allocating a path, a thread's first call) is out of line and [`shielded`](crate::guard::shielded).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tracked_with<R: Returned>(
    counters: stats::Counters,
    op: Op,
    target: Target,
    effect: Effect,
    resolved: Resolved,
    requested: u64,
    account: impl FnOnce(&R) -> Account,
    real: impl FnOnce() -> R,
) -> R {
    let roles = Roles::of(op, target, resolved);
    if roles.main.is_none() && roles.source.is_none() {
        // A directory above a mountpoint: counted as passing through; a new descriptor
        // remembers its path.
        counters.passthrough(op);
        before(effect);
        let result = real();
        if !matches!(
            effect,
            Effect::None
                | Effect::Close(_)
                | Effect::CloseRange(..)
                | Effect::CloseStream(_)
                | Effect::CloseDirStream(_)
        ) {
            after_cold(effect, target, resolved.main(), &result);
        }
        return result;
    }
    managed_with(
        counters, &roles, target, effect, resolved, requested, account, real,
    )
}

/// [`tracked_with`] for a target (or a copy's source) known to be managed (`roles`
/// names a mountpoint): what the hooks' `slow` inlines after [`is_common`]. It takes
/// the roles that were checked rather than finding them again, so that the compiler
/// knows which are managed and builds no code for the others.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn managed_with<R: Returned>(
    counters: stats::Counters,
    roles: &Roles,
    target: Target,
    effect: Effect,
    resolved: Resolved,
    requested: u64,
    account: impl FnOnce(&R) -> Account,
    real: impl FnOnce() -> R,
) -> R {
    let &Roles {
        main,
        main_op,
        source,
        source_op,
    } = roles;
    let main_place = main.map_or(resolved.main(), Place::Managed);
    let main_admission = match main {
        Some(mount) => channels::admit(counters, mount, main_op, requested),
        None => channels::Admission::NONE,
    };
    let source_admission = match source {
        Some(mount) => channels::admit(counters, mount, source_op, requested),
        None => channels::Admission::NONE,
    };
    match effect {
        // The descriptor closing is the call's managed target.
        Effect::Close(fd) => {
            crate::placed_files::closing(fd);
            fdtable::forget_placed(fd)
        }
        _ => before(effect),
    }

    let result = match effect {
        Effect::Create { flags, mode } => {
            match crate::placement::create(main_place, target, flags, mode) {
                Some(fd) => R::from_descriptor(fd).unwrap_or_else(real),
                None => real(),
            }
        }
        _ => real(),
    };
    let served = tsc::ticks();

    // The service time: from the last admission (a copy's source is admitted after its
    // destination) to the call's return.
    let admitted = match source {
        Some(_) => source_admission.stamp,
        None => main_admission.stamp,
    };
    let ticks = served.wrapping_sub(admitted);
    if let Some(mount) = main {
        counters.served(mount, main_op, ticks);
    }
    if let Some(mount) = source {
        counters.served(mount, source_op, ticks);
    }
    let outcome = account(&result);
    if main.is_some() {
        channels::settle(counters, main_op, main_admission, requested, outcome.bytes);
        counters.managed(main_op, outcome.failed, outcome.bytes);
    }
    if source.is_some() {
        channels::settle(
            counters,
            source_op,
            source_admission,
            requested,
            outcome.bytes,
        );
        counters.managed(source_op, outcome.failed, outcome.bytes);
    }
    after_managed(effect, target, main_place, &result);
    result
}

/// The managed mountpoints of a call and what it counts in each.
struct Roles {
    main: Option<u16>,
    main_op: Op,
    source: Option<u16>,
    source_op: Op,
}

impl Roles {
    /// A copy is a read of its source and a write of its destination; only a copy has
    /// a source (a constant for every other hook).
    #[inline(always)]
    fn of(op: Op, target: Target, resolved: Resolved) -> Roles {
        let main = resolved.main_mount();
        match target {
            Target::Copy { .. } => Roles {
                main,
                main_op: Op::Write,
                source: resolved.source_mount(),
                source_op: Op::Read,
            },
            _ => Roles {
                main,
                main_op: op,
                source: None,
                source_op: op,
            },
        }
    }
}

/// Admits a request without calling anything (`lio_listio` entries), counting it as
/// managed; unmanaged requests are not counted here.
///
/// # Safety
/// As for [`intercept`].
pub unsafe fn admit_only(op: Op, target: Target, bytes: u64) {
    if vfork::in_child() {
        return;
    }
    let counters = stats::local();
    if !crate::is_active() || in_stage_io(counters) {
        return;
    }
    let saved = errno::get();
    guarded(|| {
        if let Some(mount) = resolve(target).main_mount() {
            channels::admit(counters, mount, op, bytes);
            counters.managed(op, false, bytes);
        }
    });
    errno::set(saved);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every managed call that needs at most one store in the descriptor table stays on
    /// the inline common path; a creating `open` (placement made it an `Effect::Create`)
    /// once fell out of it, +60 instructions per managed open.
    #[test]
    fn managed_opens_and_creations_are_common() {
        // Where a call on a path, or a copy between two descriptors, is found to lie.
        let path_at = |found| Roles::of(Op::Open, Target::Path(std::ptr::null()), Resolved(found));
        let copy_at = |found| Roles::of(Op::Read, Target::Copy { from: 3, to: 4 }, Resolved(found));
        let managed = Resolved::new(Place::Managed(0), Place::Unrelated).0;
        let common = |effect| is_common(&path_at(managed), effect);
        assert!(common(Effect::NewFd {
            flags: libc::O_RDONLY
        }));
        for flags in [
            libc::O_RDONLY,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        ] {
            assert!(
                common(Effect::Create { flags, mode: 0o644 }),
                "flags {flags:#o}"
            );
        }
        assert!(common(Effect::Close(3)));
        // A directory's descriptor keeps its path: not common.
        assert!(!common(Effect::Create {
            flags: libc::O_DIRECTORY,
            mode: 0
        }));
        for roles in [path_at, copy_at] {
            assert!(!is_common(&roles(Resolved::UNKNOWN), Effect::Close(3)));
            assert!(!is_common(&roles(UNRELATED.0), Effect::Close(3)));
            let above = Resolved::new(Place::Ancestor, Place::Ancestor).0;
            assert!(!is_common(&roles(above), Effect::None));
        }
        // A copy from a managed file is common; a path call's target has no source.
        let from_managed = Resolved::new(Place::Unrelated, Place::Managed(1)).0;
        assert!(is_common(&copy_at(from_managed), Effect::None));
        assert!(!is_common(&path_at(from_managed), Effect::None));
    }
}
