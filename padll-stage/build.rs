//! Probes the tools some integration tests drive (`nm`, `python3`, `bash`, `setpriv`, root): a test whose
//! tool is missing is reported as ignored, naming it (see `scripts/test-tools.rs`). Also
//! records the git commit for `padll --version` (`scripts/git-commit.rs`).

#[path = "../scripts/git-commit.rs"]
mod git_commit;
#[path = "../scripts/test-tools.rs"]
mod tools;

use tools::Need::{Program, Root};

fn main() {
    git_commit::emit();
    tools::probe(&[
        Program("nm"),
        Program("python3"),
        Program("bash"),
        Program("setpriv"),
        Root,
    ]);
}
