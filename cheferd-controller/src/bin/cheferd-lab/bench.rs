//! `cheferd-lab bench`: the control cycle's latency and cost with simulated local
//! controllers on loopback (`cheferd_controller::bench`).

use crate::common::{failed, global_runtime, usage, Failure};
use cheferd_controller::policy;
use clap::Args;
use padll_wire::flags::whole;

/// `cheferd-lab bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Numbers of local controllers to simulate.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=100_000usize))]
    locals: Vec<usize>,
    /// Stages (jobs) per local controller.
    #[arg(long, default_value_t = 4)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=1000usize))]
    stages: usize,
    /// Relays the local controllers attach through (`cheferd relay`, run in the
    /// simulated local controllers' process), 0 for none; the plain TCP floor is
    /// measured only without.
    #[arg(long, default_value_t = 0)]
    #[arg(allow_negative_numbers = true, value_parser = whole(0..=10_000usize))]
    relays: usize,
    /// Measured cycles per row.
    #[arg(long, default_value_t = 50)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=100_000usize))]
    cycles: usize,
    /// The control interval, ms.
    #[arg(long, default_value_t = cheferd_controller::bench::DEFAULT_INTERVAL.as_millis() as u64)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=60_000u64))]
    interval_ms: u64,
    /// Policy to run.
    #[arg(long, default_value = "psfa")]
    policy: String,
}

/// `cheferd-lab bench-locals`.
#[derive(Args)]
pub struct BenchLocalsArgs {
    /// The global controller.
    #[arg(long)]
    url: String,
    /// Local controllers to simulate.
    #[arg(long)]
    locals: usize,
    /// Stages (jobs) per local controller.
    #[arg(long)]
    stages: usize,
}

/// `cheferd-lab bench-relays`.
#[derive(Args)]
pub struct BenchRelaysArgs {
    /// The global controller.
    #[arg(long)]
    url: String,
    /// Relays to run.
    #[arg(long)]
    relays: usize,
    /// Local controllers that will attach to them (for the descriptor limit).
    #[arg(long)]
    locals: usize,
}

/// `cheferd-lab bench-floor-locals`.
#[derive(Args)]
pub struct BenchFloorLocalsArgs {
    /// The floor's listening address.
    #[arg(long)]
    address: String,
    /// Connections to open.
    #[arg(long, allow_negative_numbers = true, value_parser = whole(1..=100_000usize))]
    locals: usize,
    /// Bytes each connection writes per interval.
    #[arg(long, allow_negative_numbers = true, value_parser = whole(1..=1usize << 20))]
    report_bytes: usize,
    /// The control interval, ms.
    #[arg(long, allow_negative_numbers = true, value_parser = whole(1..=60_000u64))]
    interval_ms: u64,
}

/// Each row runs in a runtime of its own, so nothing of one row lingers in the next: the
/// global controller's (`global_runtime`), as `cheferd global` runs it; so does its
/// transport floor, after it (`cheferd_controller::bench::floor`).
pub fn run(args: BenchArgs) -> Result<(), Failure> {
    let BenchArgs {
        locals,
        stages,
        relays,
        cycles,
        interval_ms,
        policy: name,
    } = args;
    policy::check(&name).map_err(|e| usage(format!("--policy: {e}")))?;
    let interval = std::time::Duration::from_millis(interval_ms);
    let mut rows = Vec::new();
    for n in locals {
        let mut measured = global_runtime()?
            .block_on(cheferd_controller::bench::run(
                n, relays, stages, cycles, interval, &name,
            ))
            .map_err(failed)?;
        if relays == 0 {
            global_runtime()?
                .block_on(cheferd_controller::bench::floor::measure(&mut measured))
                .map_err(failed)?;
        }
        rows.extend(measured);
    }
    padll_wire::exit::print(&cheferd_controller::bench::table(&rows));
    Ok(())
}

/// The simulated local controllers, until killed.
pub async fn run_locals(args: BenchLocalsArgs) -> Result<(), Failure> {
    cheferd_controller::bench::run_locals(args.url, args.locals, args.stages)
        .await
        .map_err(failed)
}

/// The relays, until killed.
pub async fn run_relays(args: BenchRelaysArgs) -> Result<(), Failure> {
    cheferd_controller::bench::run_relays(args.url, args.relays, args.locals)
        .await
        .map_err(failed)
}

/// The transport floor's connections, until killed.
pub async fn run_floor_locals(args: BenchFloorLocalsArgs) -> Result<(), Failure> {
    let interval = std::time::Duration::from_millis(args.interval_ms);
    cheferd_controller::bench::floor::run_locals(
        args.address,
        args.locals,
        args.report_bytes,
        interval,
    )
    .await
    .map_err(failed)
}
