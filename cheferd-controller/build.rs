//! Compiles the gRPC protocol with protox (a pure-Rust protobuf compiler): no system
//! `protoc` is needed. Also probes what tests need (`has_root`: the permission check
//! runs `ctl` as another uid), see `scripts/test-tools.rs`, and records the git commit
//! for `cheferd --version` (`scripts/git-commit.rs`).

#[path = "../scripts/git-commit.rs"]
mod git_commit;
#[path = "../scripts/test-tools.rs"]
mod tools;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    git_commit::emit();
    tools::probe(&[
        tools::Need::Root,
        tools::Need::Program("setpriv"),
        tools::Need::Program("systemd-analyze"),
    ]);
    println!("cargo:rerun-if-changed=proto/cheferd.proto");
    let descriptors = protox::compile(["proto/cheferd.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
