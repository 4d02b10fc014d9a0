//! Turns for the tests of one test binary (`#[path = "../../scripts/test-turns.rs"] mod
//! turns;` in a crate's `tests/util.rs`): every test of a crate runs in one process,
//! concurrently, so those that measure rates take the two cores for themselves.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static TURNS: RwLock<()> = RwLock::new(());

/// Tests that measure rates (or start controllers, Slurm, Prometheus) run alone: sharing
/// the two cores with any other test would distort what they measure.
pub fn alone() -> RwLockWriteGuard<'static, ()> {
    // A test that failed while holding its turn must not fail every later one.
    TURNS
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every other test runs together with the rest, never with one that runs [`alone`].
pub fn together() -> RwLockReadGuard<'static, ()> {
    TURNS
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
