//! Probes the real programs the tests run under the stage: a test whose tool is missing
//! is reported as ignored, naming it; under `CI=true` it runs (and fails). See
//! `build-support/tools.rs`.

#[path = "../build-support/tools.rs"]
mod tools;

use tools::Need::{File, Program};

fn main() {
    tools::probe(&[
        Program("bash"),
        Program("tar"),
        Program("python3"),
        Program("sqlite3"),
        Program("rsync"),
        Program("fio"),
        Program("stress-ng"),
        Program("dbench"),
        Program("cc"),
        Program("rustc"),
        File("libjemalloc", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    ]);
}
