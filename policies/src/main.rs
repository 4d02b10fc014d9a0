//! `policies` binary: a thin wrapper over [`policies::cli::run`].

fn main() {
    std::process::exit(policies::cli::run(std::env::args_os()));
}
