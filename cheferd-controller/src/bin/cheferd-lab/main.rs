//! `cheferd-lab`: the PADLL control plane's tools for operators and evaluation — the
//! demo, the control-cycle benchmark, the trace replayer and the policies' dry runs
//! (simulate, allocate, trace, place). Apart from the `cheferd` daemon, which carries
//! none of them (nor their plots and font). This file parses the command line and
//! dispatches; each tool is a module.

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

mod bench;
#[path = "../../../../scripts/cli-docs.rs"]
mod cli_docs;
#[path = "../common/mod.rs"]
mod common;
mod demo;
mod man_pages;
mod replay;

use common::{global_runtime, in_runtime, usage, Failure};

#[derive(Parser)]
#[command(
    name = "cheferd-lab",
    version = cheferd_controller::VERSION,
    about = "PADLL control plane tools: demo, benchmark, trace replayer, policy dry runs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Demonstrate the whole system: controllers, jobs under the stage, live rates, a plot.
    Demo(demo::DemoArgs),
    /// Benchmark the control cycle with simulated local controllers on loopback.
    Bench(bench::BenchArgs),
    /// The simulated local controllers of `bench`, in their own process (so the bench
    /// process's CPU time is the global controller's).
    #[command(hide = true)]
    BenchLocals(bench::BenchLocalsArgs),
    /// The relays of `bench --relays`, in their own process.
    #[command(hide = true)]
    BenchRelays(bench::BenchRelaysArgs),
    /// The plain TCP connections of `bench`'s transport floor, in their own process.
    #[command(hide = true)]
    BenchFloorLocals(bench::BenchFloorLocalsArgs),
    /// Replay a metadata trace (or a constant load) against a directory, printing the
    /// system calls made every second and their rate over the trace's span.
    Replay(replay::ReplayArgs),
    /// Replay PADLL's Table I scenarios in the simulator (same as `policies simulate`).
    Simulate(policies::cli::SimulateArgs),
    /// Dry run of one control cycle: a JSON snapshot on stdin, rates on stdout.
    Allocate(policies::cli::AllocateArgs),
    /// Generate a seeded metadata trace (padll-trace v1 CSV) for the replayer.
    Trace(policies::cli::TraceArgs),
    /// Dry run of one stripe-placement decision: targets and requests (JSON) on stdin,
    /// the chosen targets on stdout (same as `policies place`).
    Place(policies::cli::PlaceArgs),
    /// Write man pages or shell completions (used by scripts/install.sh).
    #[command(hide = true, subcommand)]
    Generate(cli_docs::Generate),
}

fn main() -> ExitCode {
    common::main(default_level, dispatch)
}

/// The benchmark prints its table alone; the other tools what goes wrong.
fn default_level(cli: &Cli) -> &'static str {
    match cli.command {
        Command::Bench(_)
        | Command::BenchLocals(_)
        | Command::BenchRelays(_)
        | Command::BenchFloorLocals(_) => "error",
        _ => "warn",
    }
}

/// Each subcommand's entry function. The demo and the simulated local controllers run
/// in an async runtime; the others are plain code (the bench makes a runtime per row).
fn dispatch(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Demo(args) => in_runtime(demo::run(args)),
        Command::Bench(args) => bench::run(args),
        Command::BenchLocals(args) => in_runtime(bench::run_locals(args)),
        // One worker, as `cheferd relay` runs.
        Command::BenchRelays(args) => global_runtime()?.block_on(bench::run_relays(args)),
        Command::BenchFloorLocals(args) => in_runtime(bench::run_floor_locals(args)),
        Command::Replay(args) => replay::run(args),
        Command::Simulate(args) => run_policies(policies::cli::Command::Simulate(args)),
        Command::Allocate(args) => run_policies(policies::cli::Command::Allocate(args)),
        Command::Trace(args) => run_policies(policies::cli::Command::Trace(args)),
        Command::Place(args) => run_policies(policies::cli::Command::Place(args)),
        Command::Generate(what) => {
            cli_docs::generate(&what, Cli::command(), &man_pages::EXTRAS).map_err(usage)
        }
    }
}

/// The `policies` subcommands (simulate, allocate, trace, place), shared with the
/// `policies` binary.
fn run_policies(command: policies::cli::Command) -> Result<(), Failure> {
    policies::cli::execute(
        &command,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
    )
    .map_err(policies::cli::Failure::into_kind)
}
