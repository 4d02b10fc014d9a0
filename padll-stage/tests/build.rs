//! Probes the tools some tests drive (`nm`, `python3`, `bash`, `setpriv`, root): a test
//! whose tool is missing is reported as ignored, naming it (see `scripts/test-tools.rs`).

#[path = "../../scripts/test-tools.rs"]
mod tools;

use tools::Need::{Program, Root};

fn main() {
    tools::probe(&[
        Program("nm"),
        Program("python3"),
        Program("bash"),
        Program("setpriv"),
        Root,
    ]);
}
