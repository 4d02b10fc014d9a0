//! Cheferd, the PADLL control plane (PADLL paper §III-B): a local controller per
//! compute node ([`local`]) serving the stages of that node, and a global controller
//! ([`global`]) running the collect → compute → enforce → sleep loop over all of them.

pub mod admin;
#[cfg(feature = "lab")]
pub mod bench;
pub mod bounds;
pub mod config;
#[cfg(feature = "lab")]
pub mod demo;
pub mod global;
pub mod global_process;
mod identity;
mod lines;
pub mod local;
mod metrics;
mod outbox;
pub mod placement_history;
pub mod placement_service;
mod plan;
pub mod policy;
mod prefetch;
#[cfg(feature = "lab")]
pub mod relay;
pub mod replay;
pub mod standby;
mod supervise;
pub mod tls;
mod usage;

/// `cheferd --version` and the controllers' start lines: the crate's version and the
/// commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PADLL_GIT_COMMIT"),
    ")"
);

/// The gRPC protocol between local and global controllers (`proto/cheferd.proto`).
pub mod proto {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("cheferd.v1");

    /// The version of this protocol, exchanged in `Register` / `Registered`; a peer of
    /// another version is refused at `Register`, naming both. 5: usage names its
    /// resource by index into `Registered.resources`, as rules do (4 sent mount and class
    /// strings for every stage and resource in every report). 4: a node acknowledges an
    /// `Enforce` in its next `Usage` (`applied`), and `Registered`/`Enforce` carry the
    /// leader's term (a 3 node would look unacknowledged to a 4 global and be re-sent
    /// everything each cycle). 3: rules name their resource by index into
    /// `Registered.resources` (2 sent its mount and class in every rule); since 2, usage
    /// is pushed on a `Schedule` (1 answered `Collect` requests).
    pub const VERSION: u32 = 5;
}
