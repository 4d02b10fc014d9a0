//! Compiles the gRPC protocol with protox (a pure-Rust protobuf compiler): no system
//! `protoc` is needed. Also probes what tests need (`has_root`: the permission check
//! runs `ctl` as another uid; `has_prometheus`, `has_promtool`: the dashboard's queries
//! run against a real Prometheus; Slurm, munge, `slurm/spank.h` and `cc`:
//! `tests/slurm.rs`; `systemd-analyze`: the units; `has_bash`: the fail-closed tests run
//! a job's processes from a shell; `has_etcd`: `tests/standby.rs` starts a real etcd;
//! `has_groff`: the man pages are formatted), see `scripts/test-tools.rs`, and records
//! the git commit for `cheferd --version` (`scripts/git-commit.rs`).

#[path = "../scripts/git-commit.rs"]
mod git_commit;
#[path = "../scripts/test-tools.rs"]
mod tools;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    git_commit::emit();
    tools::probe(&[
        tools::Need::Root,
        tools::Need::Program("setpriv"),
        tools::Need::Program("prometheus"),
        tools::Need::Program("promtool"),
        tools::Need::Program("slurmctld"),
        tools::Need::Program("slurmd"),
        tools::Need::Program("sbatch"),
        tools::Need::Program("munged"),
        tools::Need::Program("cc"),
        tools::Need::File("spank.h", "/usr/include/slurm/spank.h"),
        tools::Need::Program("systemd-analyze"),
        tools::Need::Program("bash"),
        tools::Need::Program("etcd"),
        tools::Need::Program("groff"),
    ]);
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
