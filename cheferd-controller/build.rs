//! Compiles the gRPC protocol with protox (a pure-Rust protobuf compiler): no system
//! `protoc` is needed. Also probes what tests need (`has_root`: the permission check
//! runs `ctl` as another uid; `has_bash`: the fail-closed tests run a job's processes
//! from a shell), see `scripts/test-tools.rs`.

#[path = "../scripts/test-tools.rs"]
mod tools;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tools::probe(&[
        tools::Need::Root,
        tools::Need::Program("setpriv"),
        tools::Need::Program("bash"),
    ]);
    println!("cargo:rerun-if-changed=proto/cheferd.proto");
    let descriptors = protox::compile(["proto/cheferd.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
