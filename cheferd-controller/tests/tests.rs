//! The integration tests of `cheferd-controller`, one binary of their own package (`cargo
//! test -p cheferd-tests`; one module: `… end_to_end::`).
//!
//! Every module's tests run in one process, concurrently. Those that start controllers
//! and measure rates, or start Slurm or Prometheus, run [`util::alone`], the others
//! [`util::together`], so that a measurement never shares the two cores. Tests use
//! ports the kernel picks (`127.0.0.1:0`) or [`ports`] reserved for them, temporary
//! directories of their own, and job ids unique to the run ([`util::job_id`]), so two
//! runs on one machine never meet.

mod bench_scale;
mod cli;
mod control_lost;
mod ctl_json;
mod ctl_timeout;
mod demo;
mod end_to_end;
mod fail_closed;
mod file_cycles;
mod fuzz_corpus;
mod install;
mod node_default;
mod placement;
mod ports;
mod prometheus;
mod relay;
mod schedule_and_metrics;
mod services;
mod slurm;
mod spank_arguments;
mod spank_directory;
mod standby;
mod tidy;
mod trust;
mod trust_global;
mod trust_local;
mod util;
mod weights;
