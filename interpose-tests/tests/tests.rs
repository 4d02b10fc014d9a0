//! The integration tests of `interpose-tests`, one binary (`cargo test -p
//! interpose-tests --test tests`; one module: `… --test tests jobwide::`).
//!
//! Every module's tests run in one process, concurrently, so scratch directories and
//! job ids carry the test's own name. The job-wide tests, which measure rates to a few
//! percent, run [`util::alone`], every other test [`util::together`], so that those
//! measurements never share the two cores.

mod behaviour;
mod jobwide;
mod moosefs;
#[cfg(target_arch = "x86_64")]
mod old_versions;
mod placement;
mod programs;
mod signal_safety;
mod util;
mod vfork;
mod walks;
