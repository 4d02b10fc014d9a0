//! Probes the real programs the tests run under the stage: a test whose tool is missing
//! is reported as ignored, naming it; under `CI=true` it runs (and fails). See
//! `scripts/test-tools.rs`.

#[path = "../scripts/test-tools.rs"]
mod tools;

use tools::Need::{File, Program, Root};

fn main() {
    tools::probe(&[
        Program("bash"),
        Program("tar"),
        Program("python3"),
        Program("sqlite3"),
        Program("rsync"),
        Program("fio"),
        Program("git"),
        Program("stress-ng"),
        Program("dbench"),
        Program("cc"),
        Program("rustc"),
        Program("setpriv"),
        Root,
        File("libjemalloc", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
        tools::MOOSEFS,
    ]);
}
