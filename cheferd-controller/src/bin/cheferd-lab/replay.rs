//! `cheferd-lab replay`: a metadata trace (or a constant load) replayed against a
//! directory (`cheferd_controller::replay`).

use crate::common::{failed, usage, Failure, MAX_COUNT};
use clap::Args;
use padll_wire::flags::whole;
use std::path::PathBuf;

/// Upper bound of seconds flags, far above any real use: about 11 days (`--rate` holds
/// one row a second).
const MAX_SECONDS: usize = 1_000_000;

/// `cheferd-lab replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// A `padll-trace v1` file (`policies trace` writes them).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "rate",
        required_unless_present = "rate"
    )]
    trace: Option<PathBuf>,
    /// Which job of the trace (1-based).
    #[arg(long, default_value_t = 1)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_COUNT))]
    job: usize,
    /// Multiply the trace's counts by this (e.g. 0.02 to fit a small machine).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    scale: f64,
    /// Replay at most this many seconds of the trace.
    #[arg(long)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_SECONDS))]
    max_seconds: Option<usize>,
    /// Instead of a trace: this many operations per second…
    #[arg(long)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=100_000_000u64))]
    rate: Option<u64>,
    /// …for this many seconds.
    #[arg(long, default_value_t = 10)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_SECONDS))]
    seconds: usize,
    /// Directory to work in (on the file system under test).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=1024usize))]
    threads: usize,
    /// Trace seconds per wall-clock second.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    speed: f64,
}

/// The replayer runs without the async runtime: it is plain threads doing file I/O,
/// usually under the stage.
pub fn run(args: ReplayArgs) -> Result<(), Failure> {
    let ReplayArgs {
        trace,
        job,
        scale,
        max_seconds,
        rate,
        seconds,
        dir,
        threads,
        speed,
    } = args;
    if !(scale > 0.0 && scale.is_finite()) {
        return Err(usage(format!("--scale {scale} must be positive")));
    }
    if !(speed > 0.0 && speed.is_finite()) {
        return Err(usage(format!("--speed {speed} must be positive")));
    }
    if !dir.is_dir() {
        return Err(usage(format!("--dir {} is not a directory", dir.display())));
    }
    let seconds = match (trace, rate) {
        (Some(path), _) => {
            cheferd_controller::replay::ReplayOptions::from_trace(&path, job, scale, max_seconds)
                .map_err(usage)?
        }
        (None, Some(rate)) => cheferd_controller::replay::ReplayOptions::constant(rate, seconds),
        (None, None) => return Err(usage("give --trace FILE or --rate N")),
    };
    let options = cheferd_controller::replay::ReplayOptions {
        seconds,
        dir,
        threads,
        speed,
    };
    cheferd_controller::replay::run(&options, &mut std::io::stdout().lock())
        .map(|_| ())
        .map_err(failed)
}
