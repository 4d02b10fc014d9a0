//! Compiles the gRPC protocol with protox (a pure-Rust protobuf compiler): no system
//! `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cheferd.proto");
    let descriptors = protox::compile(["proto/cheferd.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
