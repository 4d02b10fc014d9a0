//! The integration tests of `padll-stage`, one binary (`cargo test -p padll-stage --test
//! tests`; one module: `… --test tests control::`). Every module's tests run in one
//! process, concurrently: names of scratch directories are unique across modules.

mod cli;
mod control;
mod hostile_files;
mod imports;
mod node_files;
mod squatting;
mod util;
