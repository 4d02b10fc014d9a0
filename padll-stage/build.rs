//! Records the git commit for `padll --version` (`scripts/git-commit.rs`). It probes
//! nothing of the machine: the tools the tests drive are probed by the tests' own
//! package (`tests/build.rs`).

#[path = "../scripts/git-commit.rs"]
mod git_commit;

fn main() {
    git_commit::emit();
}
