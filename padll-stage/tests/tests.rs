//! The integration tests of `padll-stage`, one binary of their own package (`cargo test
//! -p padll-stage-tests`; one module: `… control::`). Every module's tests run in one
//! process, concurrently: names of scratch directories are unique across modules.

mod cli;
mod control;
mod hostile_files;
mod imports;
mod node_files;
mod squatting;
mod util;
