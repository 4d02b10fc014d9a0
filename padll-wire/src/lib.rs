//! Types and parsers shared by `libpadll.so`, the `padll` CLI and (later) the
//! controllers. Nothing here intercepts anything: a binary can depend on this crate
//! without exporting the stage's hooks.

pub mod channel;
pub mod config;
pub mod control;
pub mod ops;
pub mod report;
