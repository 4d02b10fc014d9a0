//! `cheferd-lab demo`: the whole system on one machine (`cheferd_controller::demo`).

use crate::common::{failed, usage, Failure};
use cheferd_controller::{demo, policy};
use clap::Args;
use padll_wire::config::{parse_rate, Rate};
use padll_wire::flags::whole;
use std::path::PathBuf;

/// `cheferd-lab demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Seconds of load per job (1–3600).
    #[arg(long, default_value_t = 40)]
    #[arg(allow_negative_numbers = true, value_parser = whole(demo::SECONDS))]
    seconds: usize,
    /// Seconds between two jobs joining (0–600).
    #[arg(long, default_value_t = 8)]
    #[arg(allow_negative_numbers = true, value_parser = whole(demo::STAGGER))]
    stagger: usize,
    /// Number of jobs (1–4).
    #[arg(long, default_value_t = 4)]
    #[arg(allow_negative_numbers = true, value_parser = whole(demo::JOBS))]
    jobs: usize,
    /// Max_R of the scratch directory's metadata (ops/s, 100 to 1M).
    #[arg(long, default_value = "6000", allow_negative_numbers = true)]
    max_rate: String,
    /// Policy.
    #[arg(long, default_value = "psfa")]
    policy: String,
    /// Directory for rates.csv, rates.png and rates.svg [default: $TMPDIR/cheferd-demo-PID,
    /// printed at the end].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Runs the demo with the stage beside this executable.
pub async fn run(args: DemoArgs) -> Result<(), Failure> {
    policy::check(&args.policy).map_err(|e| usage(format!("--policy: {e}")))?;
    // The demo shares its scratch directory's metadata operations.
    let max_rate = match parse_rate(&args.max_rate) {
        Ok(Rate::Ops(n)) if demo::MAX_RATE.contains(&n) => n as f64,
        Ok(Rate::Ops(_)) => {
            return Err(usage(format!(
                "--max-rate '{}': must be from {} to {} ops/s",
                args.max_rate,
                demo::MAX_RATE.start(),
                demo::MAX_RATE.end()
            )))
        }
        Ok(Rate::Bytes(_)) => {
            return Err(usage(format!(
                "--max-rate: '{}' is a rate of bytes, but the demo shares metadata operations",
                args.max_rate
            )))
        }
        Err(e) => return Err(usage(format!("--max-rate: {e}"))),
    };
    let options = demo::DemoOptions {
        seconds: args.seconds,
        stagger: args.stagger,
        jobs: args.jobs,
        max_rate,
        policy: args.policy,
        out: args.out,
    };
    let (exe, library) = stage_library()?;
    let result = demo::run(&options, &exe, &library).await;
    if let Some(code) = result
        .as_ref()
        .err()
        .and_then(demo::DemoError::signal_exit_code)
    {
        // Cleaned up already; the exit code a shell gives a death by the signal, as a
        // script that runs the demo expects of Ctrl-C.
        eprintln!("cheferd-lab: {}", result.unwrap_err());
        std::process::exit(code.into());
    }
    result.map_err(failed)
}

/// This executable and the stage beside it. When the stage is missing and we run under
/// cargo (`cargo run … demo`), it is built first, so one command is enough.
fn stage_library() -> Result<(PathBuf, PathBuf), Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| failed(format!("cannot locate this executable: {e}")))?;
    let dir = exe
        .parent()
        .unwrap_or(std::path::Path::new("/"))
        .to_path_buf();
    if let Ok(library) = padll_wire::find_stage_library(&dir) {
        return Ok((exe, library));
    }
    let expected = dir.join(padll_wire::STAGE_LIBRARY);
    let cargo = std::env::var_os("CARGO").ok_or_else(|| {
        failed(format!(
            "{} not found: build it with `cargo build --release` (the whole workspace)",
            expected.display()
        ))
    })?;
    eprintln!("cheferd: building the stage (libpadll.so)…");
    let mut build = std::process::Command::new(cargo);
    build.args(["build", "-p", "padll-stage"]);
    if dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build
        .status()
        .map_err(|e| failed(format!("cannot run cargo: {e}")))?;
    match padll_wire::locate_stage_library(&dir) {
        Some(library) if status.success() => Ok((exe, library)),
        _ => Err(failed(format!("could not build {}", expected.display()))),
    }
}
