//! Compiles the gRPC protocol with protox (a pure-Rust protobuf compiler): no system
//! `protoc` is needed. Also records the git commit for `cheferd --version`
//! (`scripts/git-commit.rs`). It probes nothing of the machine: the tools the tests
//! drive are probed by the tests' own package (`tests/build.rs`).

#[path = "../scripts/git-commit.rs"]
mod git_commit;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    git_commit::emit();
    println!("cargo:rerun-if-changed=proto/cheferd.proto");
    let descriptors = protox::compile(["proto/cheferd.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    // The subset of etcd's v3 API the standby global controller calls (client only).
    println!("cargo:rerun-if-changed=proto/etcd");
    let etcd = protox::compile(["v3election.proto"], ["proto/etcd"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(etcd)?;
    Ok(())
}
