//! `policies` binary: a thin wrapper over [`policies::cli::run`].

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(policies::cli::run(std::env::args_os()))
}
