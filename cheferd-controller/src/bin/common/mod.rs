//! What the two binaries of the control plane share: `cheferd` (the daemon: controllers,
//! `ctl`, `certs`) and `cheferd-lab` (the operator's tools: demo, bench, replayer, the
//! policies' dry runs). Their `main`, the failure kinds and their exit codes, the runtime.
//! Included by both with `#[path = "../common/mod.rs"] mod common;`.

#[path = "../../../../scripts/cli-errors.rs"]
mod cli_errors;

use cheferd_controller::admin::CtlErrorKind;
use clap::Parser;
use padll_wire::exit::{EX_FAILURE, EX_NOPERM, EX_UNAVAILABLE, EX_USAGE};
use std::process::ExitCode;

/// Upper bound of count flags, far above any real use: a value beyond (a typo, a unit
/// mistaken) is refused at parsing rather than tried.
pub const MAX_COUNT: usize = 1_000_000;

/// Parses the command line (a refusal is [`parse_failure`]'s), logs to stderr at the
/// command's `default_level` unless `RUST_LOG` says otherwise, and runs `dispatch`: its
/// failure is one line on stderr, prefixed with the program's name, and its exit code.
pub fn main<C: Parser>(
    default_level: fn(&C) -> &'static str,
    dispatch: fn(C) -> Result<(), Failure>,
) -> ExitCode {
    let program = C::command().get_name().to_string();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match C::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => return parse_failure(&C::command(), &args, &error),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level(&cli))),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{program}: {failure}");
            ExitCode::from(failure.kind.exit_code())
        }
    }
}

/// The commands that were `cheferd`'s before the operator's tools left the daemon.
const LAB_COMMANDS: [&str; 7] = [
    "demo", "bench", "replay", "simulate", "allocate", "trace", "place",
];

/// Clap's refusal of the command line, as one line (exit 2): a refused value names the
/// flag and the value, a tool asked of `cheferd` names `cheferd-lab`, the rest (unknown
/// flags and subcommands, missing arguments) as `padll`'s (`scripts/cli-errors.rs`).
/// Help and version are printed as clap renders them (exit 0).
fn parse_failure(
    command: &clap::Command,
    args: &[std::ffi::OsString],
    error: &clap::Error,
) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if let Some(code) = cli_errors::shown(error) {
        return ExitCode::from(code);
    }
    let program = command.get_name();
    let (arg, value) = (
        error.get(ContextKind::InvalidArg),
        error.get(ContextKind::InvalidValue),
    );
    let line = match (error.kind(), arg, value, std::error::Error::source(error)) {
        (
            ErrorKind::ValueValidation,
            Some(ContextValue::String(arg)),
            Some(ContextValue::String(value)),
            Some(reason),
        ) => {
            // `--jobs <JOBS>`: the flag; a positional argument is its `<NAME>`.
            let flag = arg.split(' ').next().unwrap_or(arg);
            format!("{flag} '{}': {reason}", padll_wire::control::short(value))
        }
        (ErrorKind::InvalidSubcommand, ..) if program == "cheferd" => match moved_to_lab(error) {
            Some(command) => {
                format!("'{command}' is a command of cheferd-lab: cheferd-lab {command} …")
            }
            None => cli_errors::line(error, command, args),
        },
        _ => cli_errors::line(error, command, args),
    };
    eprintln!("{program}: {line}");
    ExitCode::from(EX_USAGE)
}

/// The command of an unknown-subcommand refusal, if it is one of `cheferd-lab`'s.
fn moved_to_lab(error: &clap::Error) -> Option<&str> {
    match error.get(clap::error::ContextKind::InvalidSubcommand) {
        Some(clap::error::ContextValue::String(command)) => LAB_COMMANDS
            .contains(&command.as_str())
            .then_some(command.as_str()),
        _ => None,
    }
}

/// Why a command failed.
pub type Failure = padll_wire::exit::Failure<Kind>;

/// The kinds of failure, each with its exit code.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Bad flags, values or configuration: nothing was started.
    Usage,
    /// Something failed at run time.
    Failed,
    /// The global controller cannot be reached or did not answer (`ctl`).
    Unavailable,
    /// The global controller refused a change from this user (`ctl`).
    NoPermission,
}

impl Kind {
    /// The one mapping of failures to exit codes.
    fn exit_code(self) -> u8 {
        match self {
            Kind::Usage => EX_USAGE,
            Kind::Failed => EX_FAILURE,
            Kind::Unavailable => EX_UNAVAILABLE,
            Kind::NoPermission => EX_NOPERM,
        }
    }
}

/// Bad usage: `error` (a message or a library's typed error) is the one line shown.
pub fn usage(error: impl std::fmt::Display) -> Failure {
    Failure::new(Kind::Usage, error.to_string())
}

/// A run-time failure: `error` is the one line shown.
pub fn failed(error: impl std::fmt::Display) -> Failure {
    Failure::new(Kind::Failed, error.to_string())
}

impl From<CtlErrorKind> for Kind {
    fn from(kind: CtlErrorKind) -> Kind {
        match kind {
            CtlErrorKind::Unavailable => Kind::Unavailable,
            CtlErrorKind::PermissionDenied => Kind::NoPermission,
            CtlErrorKind::Usage => Kind::Usage,
            CtlErrorKind::Refused => Kind::Failed,
        }
    }
}

#[cfg(feature = "lab")]
impl From<policies::cli::FailureKind> for Kind {
    fn from(kind: policies::cli::FailureKind) -> Kind {
        match kind {
            policies::cli::FailureKind::Usage => Kind::Usage,
            policies::cli::FailureKind::Io => Kind::Failed,
        }
    }
}

/// A runtime for the local controller and the tools: two worker threads.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    runtime_with(2)
}

/// A runtime for the global controller: one worker thread. Its work is tens of
/// thousands of short events a second (a report in, an `Enforce` out, per node) and
/// one cycle: a second worker mostly woke to take single events from the first, paying
/// thread wake-ups and moving nodes' state between cores — at 10 000 nodes it cost
/// ≈ 2 points of a core more (docs/benchmarks.md). A placement decision (≤ 5 ms at
/// 1 000 targets) holds the worker while it runs.
pub fn global_runtime() -> Result<tokio::runtime::Runtime, Failure> {
    runtime_with(1)
}

fn runtime_with(workers: usize) -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| failed(format!("cannot start the runtime: {e}")))
}

/// Runs `task` to its end in a runtime of its own.
pub fn in_runtime(
    task: impl std::future::Future<Output = Result<(), Failure>>,
) -> Result<(), Failure> {
    runtime()?.block_on(task)
}
