//! The integration tests of `policies`, one binary (`cargo test -p policies --test
//! tests`; one module: `… --test tests sim::`). The modules that run the `policies`
//! binary need the `cli` feature (on by default).

mod adaptbf_reference;
mod capacity;
#[cfg(feature = "cli")]
mod cli;
#[cfg(feature = "cli")]
mod cli_place;
mod examples;
mod extremes;
mod placement;
mod properties;
#[cfg(feature = "cli")]
mod sim;
#[cfg(feature = "cli")]
mod util;
