//! `padll`: run a program under the PADLL stage, and read its statistics.
//!
//! * `padll run [--mount DIR]... [--limit SELECTOR=RATE]... [--job ID] [--stats FILE] [--controller SOCKET [--controller-uid UID]] -- PROGRAM ARGS…`
//!   validates everything, appends `libpadll.so` to `LD_PRELOAD`, sets the stage's
//!   environment and execs the program. Its children inherit both, so a whole batch
//!   script is controlled. The library is `--library`, else `PADLL_LIBRARY`, else the
//!   one beside this binary (a cargo target directory), else `../lib/padll/` from it
//!   (the installed layout).
//! * `padll stats FILE.json` prints the table of a JSON statistics file (or, with
//!   `--json`, its totals as one JSON object).
//! * `padll demo` shows a metadata loop with and without limits.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use padll_wire::config::LimitScope;
use padll_wire::exit::{EX_CANNOT_EXECUTE, EX_FAILURE, EX_NOT_FOUND, EX_USAGE};
use padll_wire::ops::Op;
use padll_wire::{config, quote, report};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

#[path = "../../../scripts/cli-docs.rs"]
mod cli_docs;
#[path = "../../../scripts/cli-errors.rs"]
mod cli_errors;

/// `padll --version`: the crate's version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PADLL_GIT_COMMIT"),
    ")"
);

/// The variable naming the stage library to preload (as `--library` does).
const LIBRARY_VARIABLE: &str = "PADLL_LIBRARY";

#[derive(Parser)]
#[command(
    name = "padll",
    version = VERSION,
    about = "Application-agnostic QoS for shared file systems: run programs under the PADLL stage"
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run PROGRAM with the stage preloaded (exec: PROGRAM replaces padll).
    Run(Box<RunArgs>),
    /// Print a JSON statistics file (PADLL_STATS=….json) as a table.
    Stats {
        /// The JSON-lines file written by the stage.
        file: PathBuf,
        /// Print one block per process instead of the job total.
        #[arg(long)]
        per_process: bool,
        /// Print JSON instead of a table: the job's totals as one object
        /// ({file, processes, ops, channels, latency}), or with --per-process every
        /// report.
        #[arg(long)]
        json: bool,
    },
    /// Demonstrate throttling: a metadata loop with and without limits.
    Demo {
        /// Seconds per run.
        #[arg(long, default_value_t = 2.0, allow_negative_numbers = true, value_parser = seconds)]
        seconds: f64,
    },
    /// Metadata loop used by the demo: stat + open/close under DIR, printing its rate.
    #[command(hide = true)]
    Mdloop {
        dir: PathBuf,
        #[arg(allow_negative_numbers = true, value_parser = seconds)]
        seconds: f64,
    },
    /// Write man pages or shell completions (used by scripts/install.sh).
    #[command(hide = true, subcommand)]
    Generate(cli_docs::Generate),
}

#[derive(Args, Clone, Default)]
struct RunArgs {
    /// Mountpoint to manage (repeatable).
    #[arg(long = "mount", value_name = "DIR", value_parser = Utf8)]
    mounts: Vec<String>,
    /// Limit, as SELECTOR=RATE: open=5000/s, metadata=2k, /scratch:data=100MiB/s (repeatable).
    #[arg(long = "limit", value_name = "SELECTOR=RATE", value_parser = Utf8)]
    limits: Vec<String>,
    /// Bucket depth as milliseconds of the rate (default 10, at most 60000).
    // Text, checked as the stage checks PADLL_BURST_MS (a negative number is a value
    // to refuse by name, not an unknown flag).
    #[arg(long, value_name = "MS", allow_negative_numbers = true, value_parser = Utf8)]
    burst_ms: Option<String>,
    /// Job id (default: from Slurm, PBS, LSF or Flux).
    #[arg(long, value_parser = Utf8)]
    job: Option<String>,
    /// Job size in nodes (default: SLURM_JOB_NUM_NODES, else 1).
    #[arg(long, value_name = "NODES", allow_negative_numbers = true, value_parser = Utf8)]
    job_size: Option<String>,
    /// User the job runs for.
    #[arg(long, value_parser = Utf8)]
    user: Option<String>,
    /// Account the job is charged to.
    #[arg(long, value_parser = Utf8)]
    account: Option<String>,
    /// Statistics file written at exit by every process (.json → JSON lines; %p → pid).
    #[arg(long, value_name = "FILE", value_parser = Utf8)]
    stats: Option<String>,
    /// TOML configuration file.
    #[arg(long, value_name = "FILE", value_parser = Utf8)]
    config: Option<String>,
    /// Unix socket of the node's local controller (`cheferd local`).
    #[arg(long, value_name = "SOCKET", value_parser = Utf8)]
    controller: Option<String>,
    /// The uid `cheferd local` runs as, if not root: rules are taken only from a
    /// controller running as root, this uid or the program's own uid.
    // Text, checked as the stage checks PADLL_CONTROLLER_UID.
    #[arg(long, value_name = "UID", allow_negative_numbers = true, value_parser = Utf8)]
    controller_uid: Option<String>,
    /// Stage log level: off, error (default), warn, info, debug.
    #[arg(long, value_parser = Utf8)]
    log: Option<String>,
    /// The stage library to preload (default: PADLL_LIBRARY, else found beside padll or
    /// in ../lib/padll/ from it).
    #[arg(long, value_name = "FILE")]
    library: Option<PathBuf>,
    /// Give each process its own limits (by default a limit binds all the job's
    /// processes on this node together).
    #[arg(long)]
    per_process: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    program: Vec<OsString>,
}

/// A value of `padll run` as text, read from the bytes given: one that is not UTF-8 is
/// refused naming the flag and the value, as the stage refuses a variable that is not
/// (clap's own refusal names neither, and a path converted lossily names another file).
#[derive(Clone)]
struct Utf8;

impl clap::builder::TypedValueParser for Utf8 {
    type Value = String;

    fn parse_ref(
        &self,
        _: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<String, clap::Error> {
        let flag = arg.and_then(clap::Arg::get_long).unwrap_or_default();
        value.to_str().map(String::from).ok_or_else(|| {
            clap::Error::raw(
                ErrorKind::InvalidUtf8,
                format!(
                    "--{flag} {} is not UTF-8: only UTF-8 values can be used",
                    path_quoted(value)
                ),
            )
        })
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = match cli_command()
        .try_get_matches_from(&args)
        .and_then(|matches| Cli::from_arg_matches(&matches))
    {
        Ok(cli) => cli,
        Err(error) => return parse_failure(&error, &args),
    };
    let result = match cli.command {
        Commands::Run(args) => run(&args),
        Commands::Stats {
            file,
            per_process,
            json,
        } => stats(&file, per_process, json),
        Commands::Demo { seconds } => demo(seconds),
        Commands::Mdloop { dir, seconds } => mdloop(&dir, seconds),
        Commands::Generate(what) => {
            cli_docs::generate(&what, cli_command(), &man_pages::EXTRAS).map_err(usage)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("padll: {failure}");
            ExitCode::from(failure.kind.exit_code())
        }
    }
}

/// The command line's definition, with the selector reference after `run --help`.
fn cli_command() -> clap::Command {
    Cli::command().mut_subcommand("run", |run| run.after_help(run_help()))
}

/// A command line clap refused: help and version are printed as clap renders them;
/// errors become one line naming the problem (exit 2), with a hint when the program
/// was not put after `--`.
fn parse_failure(error: &clap::Error, args: &[OsString]) -> ExitCode {
    if let Some(code) = cli_errors::shown(error) {
        return ExitCode::from(code);
    }
    eprintln!("padll: {}", error_line(error, args));
    ExitCode::from(EX_USAGE)
}

/// clap's error as one line.
fn error_line(error: &clap::Error, args: &[OsString]) -> String {
    let in_run = args.get(1).is_some_and(|a| a == "run");
    let has_separator = args.iter().any(|a| a == "--");
    let invalid = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(value)) => Some(value.clone()),
        Some(ContextValue::Strings(values)) => values.first().cloned(),
        _ => None,
    };
    match (error.kind(), invalid) {
        (ErrorKind::UnknownArgument, Some(arg))
            if in_run && !has_separator && !arg.starts_with('-') =>
        {
            format!(
                "unexpected argument {}: the program must follow '--', as in \
                 'padll run --mount DIR -- {} ARGS…'",
                quote(&arg),
                padll_wire::escape(&arg)
            )
        }
        (ErrorKind::MissingRequiredArgument, Some(arg)) if in_run && arg.contains("PROGRAM") => {
            "no program given: the program must follow '--', as in \
             'padll run --mount DIR -- PROGRAM ARGS…'"
                .to_string()
        }
        _ => cli_errors::line(error, &cli_command(), args),
    }
}

/// The end of `padll run --help`: the selector vocabulary, the defaults and the
/// variables the stage reads.
fn run_help() -> String {
    use padll_wire::ops::Class;
    let ops: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
    let classes: Vec<String> = Class::ALL
        .iter()
        .map(|c| {
            let members: Vec<&str> = Op::ALL
                .iter()
                .filter(|o| o.class() == *c)
                .map(|o| o.name())
                .collect();
            format!("    {:<10} {}", c.name(), members.join(" "))
        })
        .collect();
    format!(
        "\
Selectors (--limit SELECTOR=RATE):
  all          every operation
  a class (the operations it covers):
{classes}
  an operation:
    {ops}
  scoped to one mountpoint: /scratch:metadata=5k, /scratch:write=100MiB/s
Rates: 5000/s, 2k, 1.5M count requests; a unit with B counts bytes (100MiB/s, 10GB/s),
for the selectors whose calls move bytes only: {byte_selectors}.
A fraction per second is dropped (open=1.5 is 1/s; below 1/s is refused).
Up to four channels may apply to one request; it waits in each.

Limits bind the job: all its processes on this node (ranks, children, later steps of
a batch script) share each limit, through /dev/shm/padll/<uid>/segment-<job> (where
root made that directory, else /dev/shm/padll-<uid>-<job>). --per-process gives every
process its own.

Defaults: --burst-ms {burst} (bucket depth: {burst} ms of the rate; at most {max_burst}), --log error,
--job run-<pid of padll run> unless a batch system (Slurm, PBS, LSF, Flux) names one.

Variables (set by the flags above; read by the stage in every process; flags win):
  PADLL_MOUNTS      :-separated mountpoints                    (--mount)
  PADLL_RULES       ,-separated SELECTOR=RATE limits           (--limit)
  PADLL_BURST_MS    bucket depth in ms of the rate             (--burst-ms)
  PADLL_LIMIT_SCOPE job: a limit binds the job's processes on this node together
                    (default with a job id); process: each its own  (--per-process)
  PADLL_JOB_ID      job id (else SLURM_JOB_ID, PBS_JOBID, LSB_JOBID, FLUX_JOB_ID)  (--job)
  PADLL_JOB_SIZE    nodes of the job (else SLURM_JOB_NUM_NODES) (--job-size)
  PADLL_USER        user (else SLURM_JOB_USER, USER)           (--user)
  PADLL_ACCOUNT     account (else SLURM_JOB_ACCOUNT, …)        (--account)
  PADLL_STATS       statistics file; .json → JSON lines; %p %j %h  (--stats)
  PADLL_CONTROLLER  local controller's Unix socket             (--controller)
  PADLL_CONTROLLER_UID  uid cheferd local runs as, if not root (rules from any
                    other uid but the job's own are refused)  (--controller-uid)
  PADLL_DEFAULT_LIMIT  limits when the controller gives none at start and the
                    job has no last rules on this node; 0 = unthrottled
  PADLL_PLACEMENT   MOUNT[=STRIPES],…: new files on these Lustre mounts get their
                    OSTs from the controller (PADLL_PLACEMENT_WAIT_MS, default 50)
  PADLL_LOG         off, error, warn, info, debug              (--log)
  PADLL_CONFIG      TOML file with the same settings           (--config)
Read by padll itself:
  PADLL_LIBRARY     the stage library to preload               (--library)
",
        classes = classes.join("\n"),
        ops = ops.join(" "),
        burst = config::DEFAULT_BURST_MS,
        max_burst = config::MAX_BURST_MS,
        byte_selectors = config::byte_selectors(),
    )
}

/// Why `padll` failed.
type Failure = padll_wire::exit::Failure<Kind>;

/// The kinds of failure, each with its exit code.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Bad flags, values or configuration: nothing was started.
    Usage,
    /// Something failed at run time.
    Failed,
    /// The program to run does not exist.
    ProgramNotFound,
    /// The program to run exists but cannot be executed.
    ProgramNotExecutable,
}

impl Kind {
    /// The one mapping of failures to exit codes (the shell's for a program it cannot
    /// run, so `padll run` is transparent to scripts).
    fn exit_code(self) -> u8 {
        match self {
            Kind::Usage => EX_USAGE,
            Kind::Failed => EX_FAILURE,
            Kind::ProgramNotFound => EX_NOT_FOUND,
            Kind::ProgramNotExecutable => EX_CANNOT_EXECUTE,
        }
    }
}

/// A path as a one-line message echoes it ([`quote`]: its bytes as they are).
fn path_quoted(path: &(impl AsRef<OsStr> + ?Sized)) -> String {
    quote(path.as_ref().as_bytes()).to_string()
}

fn usage(message: String) -> Failure {
    Failure::new(Kind::Usage, message)
}

/// Longest run of the demo's loop, in seconds.
const MAX_SECONDS: f64 = 3600.0;

/// A number of seconds for the demo's loop: more than 0, at most [`MAX_SECONDS`].
fn seconds(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && *s <= MAX_SECONDS)
        .ok_or_else(|| format!("a number of seconds, more than 0 and at most {MAX_SECONDS}"))
}

/// The stage's environment for these arguments, validated exactly as the stage will
/// read it.
fn stage_environment(args: &RunArgs) -> Result<Vec<(&'static str, String)>, Failure> {
    // The stage reads an empty variable as unset (and blank limits as none): an empty
    // value would silently mean no limit, controller or statistics.
    let texts = (args.limits.iter().map(|limit| ("--limit", limit)))
        .chain(
            args.controller
                .iter()
                .map(|socket| ("--controller", socket)),
        )
        .chain(args.stats.iter().map(|file| ("--stats", file)))
        .chain(args.user.iter().map(|user| ("--user", user)))
        .chain(args.account.iter().map(|account| ("--account", account)));
    for (flag, value) in texts {
        if value.trim().is_empty() {
            return Err(usage(format!(
                "{flag} {}: the value is empty (leave {flag} out to set nothing)",
                quote(value)
            )));
        }
    }
    let mut env = Vec::new();
    for mount in &args.mounts {
        if !mount.starts_with('/') {
            return Err(usage(format!(
                "--mount {} is not an absolute path",
                quote(mount)
            )));
        }
        if mount.contains(':') {
            return Err(usage(format!(
                "--mount {} contains ':', which separates mountpoints",
                quote(mount)
            )));
        }
    }
    if !args.mounts.is_empty() {
        env.push(("PADLL_MOUNTS", args.mounts.join(":")));
    }
    if let Some(bad) = args.limits.iter().find(|l| l.contains(',')) {
        return Err(usage(format!(
            "--limit {} contains ',': give one limit per --limit",
            quote(bad)
        )));
    }
    if !args.limits.is_empty() {
        env.push(("PADLL_RULES", args.limits.join(",")));
    }
    let optional = [
        ("PADLL_BURST_MS", args.burst_ms.clone()),
        ("PADLL_JOB_ID", args.job.clone().or_else(default_job_id)),
        ("PADLL_JOB_SIZE", args.job_size.clone()),
        ("PADLL_USER", args.user.clone()),
        ("PADLL_ACCOUNT", args.account.clone()),
        ("PADLL_STATS", args.stats.clone()),
        ("PADLL_CONFIG", args.config.clone()),
        ("PADLL_LOG", args.log.clone()),
        ("PADLL_CONTROLLER", args.controller.clone()),
        ("PADLL_CONTROLLER_UID", args.controller_uid.clone()),
        (
            "PADLL_LIMIT_SCOPE",
            args.per_process
                .then(|| LimitScope::Process.name().to_string()),
        ),
    ];
    env.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));

    let overrides: HashMap<&str, &String> = env.iter().map(|(k, v)| (*k, v)).collect();
    let loaded = config::load_os(&|name| {
        overrides
            .get(name)
            .map(OsString::from)
            .or_else(|| std::env::var_os(name))
    })
    .map_err(|e| {
        // A value padll put in the environment from a flag is named by the flag.
        let variable = e.origin.variable();
        let name = match FLAGS.iter().find(|(var, _)| *var == variable) {
            Some((_, flag)) if overrides.contains_key(variable) => flag,
            _ => variable,
        };
        usage(e.describe(name))
    })?;
    if let Some(path) = &loaded.stats_path {
        check_stats_path(path, &loaded.identity, &stats_origin(args))?;
    }
    if loaded.mounts.is_empty() {
        // The stage manages nothing without a mountpoint: a limit or a controller
        // would silently do nothing.
        let what = match (args.limits.first(), &args.controller) {
            (Some(limit), _) => Some(format!("--limit {}", quote(limit))),
            (None, _) if !loaded.limits.is_empty() => Some(format!(
                "the limit {} (PADLL_RULES or --config)",
                quote(&loaded.limits[0].to_string())
            )),
            (None, Some(socket)) => Some(format!("--controller {}", quote(socket))),
            (None, None) => None,
        };
        if let Some(what) = what {
            return Err(usage(format!(
                "{what} would throttle nothing: no mountpoint is managed \
                 (give --mount DIR, or PADLL_MOUNTS, or mounts in --config)"
            )));
        }
    }
    Ok(env)
}

/// Where the statistics file was named, for an error about it.
fn stats_origin(args: &RunArgs) -> String {
    let from_environment = std::env::var_os("PADLL_STATS").is_some_and(|v| !v.is_empty());
    match (&args.stats, &args.config) {
        (Some(_), _) => "--stats".into(),
        (None, _) if from_environment => "PADLL_STATS".into(),
        (None, Some(config)) => format!("--config {}: stats", path_quoted(config)),
        (None, None) => "PADLL_CONFIG: stats".into(),
    }
}

/// The statistics file `path` names for the program (`%p`, `%j`, `%h` expanded) must
/// be one its processes can write at exit: in an existing directory, and not something
/// other than a regular file. Otherwise they would be lost at the end of the run.
fn check_stats_path(path: &str, identity: &config::Identity, origin: &str) -> Result<(), Failure> {
    let expanded = report::expand_path(path, identity);
    let named = if expanded == path {
        quote(path).to_string()
    } else {
        format!("{} ({})", quote(path), quote(&expanded))
    };
    let file = Path::new(&expanded);
    let directory = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let problem = match std::fs::metadata(directory) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "the directory {} does not exist",
            path_quoted(directory)
        )),
        Err(e) => Some(format!("the directory {}: {e}", path_quoted(directory))),
        Ok(meta) if !meta.is_dir() => {
            Some(format!("{} is not a directory", path_quoted(directory)))
        }
        Ok(_) => match std::fs::metadata(file) {
            Ok(meta) if meta.is_dir() => Some("it is a directory".to_string()),
            Ok(meta) if !meta.is_file() => Some("it is not a regular file".to_string()),
            _ => None,
        },
    };
    match problem {
        Some(problem) => Err(usage(format!(
            "{origin} {named}: {problem}; no statistics could be written"
        ))),
        None => Ok(()),
    }
}

/// Mountpoints that do not exist (yet): a likely typo, but legal (calls under one are
/// managed once it is created).
fn missing_mounts(args: &RunArgs) -> Vec<String> {
    args.mounts
        .iter()
        .filter(|m| !Path::new(m).exists())
        .map(|m| {
            format!(
                "warning: --mount {} does not exist; calls under it are managed once it does",
                quote(m)
            )
        })
        .collect()
}

/// Without a batch system's job id, every process of one `padll run` shares
/// `run-<pid of padll run>` as its job, instead of each being a job of its own.
fn default_job_id() -> Option<String> {
    let known = [
        "PADLL_JOB_ID",
        "SLURM_JOB_ID",
        "PBS_JOBID",
        "LSB_JOBID",
        "FLUX_JOB_ID",
    ];
    (!known.iter().any(|v| std::env::var_os(v).is_some()))
        .then(|| config::run_job_id(std::process::id()))
}

/// The flags `padll run` turns into the stage's variables, as its errors name them.
const FLAGS: [(&str, &str); 11] = [
    ("PADLL_RULES", "--limit"),
    ("PADLL_MOUNTS", "--mount"),
    ("PADLL_CONFIG", "--config"),
    ("PADLL_LOG", "--log"),
    ("PADLL_BURST_MS", "--burst-ms"),
    ("PADLL_JOB_ID", "--job"),
    ("PADLL_JOB_SIZE", "--job-size"),
    ("PADLL_USER", "--user"),
    ("PADLL_ACCOUNT", "--account"),
    ("PADLL_CONTROLLER", "--controller"),
    ("PADLL_CONTROLLER_UID", "--controller-uid"),
];

/// The stage library to preload: `explicit` (`--library`), else `PADLL_LIBRARY`, else
/// found from this binary's directory; an error names the value or where it looked.
fn stage_library(explicit: Option<&Path>) -> Result<PathBuf, Failure> {
    let from_env = std::env::var_os(LIBRARY_VARIABLE).map(PathBuf::from);
    let library = match (explicit, from_env) {
        (Some(path), _) => given_library("--library", path)?,
        (None, Some(path)) => given_library(LIBRARY_VARIABLE, &path)?,
        (None, None) => {
            let exe = std::env::current_exe().map_err(|e| Failure {
                kind: Kind::Failed,
                message: format!("cannot locate this executable: {e}"),
            })?;
            let dir = exe.parent().unwrap_or(Path::new("/"));
            padll_wire::find_stage_library(dir).map_err(|looked| {
                let looked: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
                Failure {
                    kind: Kind::Failed,
                    message: format!(
                        "{} not found (looked in {}); give its path with --library or {LIBRARY_VARIABLE}",
                        padll_wire::STAGE_LIBRARY,
                        looked.join(", ")
                    ),
                }
            })?
        }
    };
    // The dynamic loader splits LD_PRELOAD at spaces and colons.
    if library.to_string_lossy().contains([' ', ':']) {
        return Err(usage(format!(
            "the stage library {} cannot be preloaded: LD_PRELOAD cannot hold a path with a space or ':'",
            path_quoted(&library)
        )));
    }
    Ok(library)
}

/// A library path the user gave (`what` names the flag or variable), made absolute so
/// that children which change directory still find it.
fn given_library(what: &str, path: &Path) -> Result<PathBuf, Failure> {
    let bad = |reason: String| usage(format!("{what} {}: {reason}", path_quoted(path)));
    let absolute = path.canonicalize().map_err(|e| bad(e.to_string()))?;
    if !absolute.is_file() {
        return Err(bad("not a regular file".into()));
    }
    Ok(absolute)
}

/// `LD_PRELOAD` with `library` appended, byte for byte: a path or an earlier preload
/// that is not UTF-8 is kept as it is (converted, it would name another file).
fn preload_value(library: &Path) -> OsString {
    let library = library.as_os_str();
    match std::env::var_os("LD_PRELOAD") {
        Some(current)
            if (current.as_bytes().split(|b| matches!(b, b' ' | b':')))
                .any(|p| p == library.as_bytes()) =>
        {
            current
        }
        Some(mut current) if !current.as_bytes().trim_ascii().is_empty() => {
            current.push(":");
            current.push(library);
            current
        }
        _ => library.to_owned(),
    }
}

fn run(args: &RunArgs) -> Result<(), Failure> {
    let env = stage_environment(args)?;
    let library = stage_library(args.library.as_deref())?;
    for warning in missing_mounts(args) {
        eprintln!("padll: {warning}");
    }
    let (program, rest) = args
        .program
        .split_first()
        .ok_or_else(|| usage("no program given".into()))?;
    let error = Command::new(program)
        .args(rest)
        .envs(env)
        .env("LD_PRELOAD", preload_value(&library))
        .exec();
    Err(Failure {
        kind: if error.kind() == std::io::ErrorKind::NotFound {
            Kind::ProgramNotFound
        } else {
            Kind::ProgramNotExecutable
        },
        message: format!("cannot run {}: {error}", path_quoted(program)),
    })
}

fn encode<T: serde::Serialize>(value: &T) -> Result<String, Failure> {
    serde_json::to_string_pretty(value)
        .map(|mut text| {
            text.push('\n');
            text
        })
        .map_err(|e| usage(format!("cannot encode: {e}")))
}

/// Prints to stdout; a reader that went away (`padll stats … | head`) is not an error.
fn emit(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// `padll stats --json`: the job's totals.
#[derive(serde::Serialize)]
struct JobTotals<'a> {
    file: String,
    processes: usize,
    ops: &'a [report::OpStats],
    channels: &'a [report::ChannelTotal],
    latency: &'a [padll_wire::latency::LatencyRow],
}

/// Largest statistics file `padll stats` reads (a report is a few KiB per process).
const MAX_STATS_BYTES: u64 = 1 << 30;

/// The reports of a statistics file; an error says what the file is, if it is no
/// statistics file.
fn read_reports(file: &Path) -> Result<Vec<report::Report>, Failure> {
    use config::ReadError;
    let name = path_quoted(file);
    let text = config::read_text_file(file, MAX_STATS_BYTES).map_err(|e| match e {
        ReadError::Directory | ReadError::NotRegular | ReadError::NotUtf8 => {
            usage(format!("{name} is not a statistics file: {e}"))
        }
        ReadError::Io(_) | ReadError::TooLarge { .. } | ReadError::Grew(_) => {
            usage(format!("cannot read {name}: {e}"))
        }
    })?;
    let reports = report::parse(&text).map_err(|e| usage(format!("{name} {e}")))?;
    if reports.is_empty() {
        return Err(usage(format!(
            "{name} holds no statistics: it is empty (no process wrote to it)"
        )));
    }
    Ok(reports)
}

fn stats(file: &Path, per_process: bool, json: bool) -> Result<(), Failure> {
    let reports = read_reports(file)?;
    match (per_process, json) {
        (true, false) => emit(&report::table(&reports)),
        (true, true) => emit(&encode(&reports)?),
        (false, json) => {
            let ops = report::total(&reports);
            let channels = report::channel_totals(&reports);
            let latency = report::latency_totals(&reports);
            if json {
                let totals = JobTotals {
                    file: file.display().to_string(),
                    processes: reports.len(),
                    ops: &ops,
                    channels: &channels,
                    latency: &latency,
                };
                emit(&encode(&totals)?);
            } else {
                let mut out = format!(
                    "padll statistics: {} process(es) in {} (job total)\n",
                    reports.len(),
                    file.display()
                );
                report::write_ops(&mut out, &ops);
                report::write_channel_totals(&mut out, &channels);
                report::write_latency(&mut out, &latency);
                emit(&out);
            }
        }
    }
    Ok(())
}

/// What the demo's loop runs under.
#[derive(Clone, Copy)]
enum DemoRun {
    /// Without the stage.
    NotPreloaded,
    /// Under the stage, its calls managed by a limit that never binds.
    Managed,
    /// Under this limit.
    Limited(&'static str),
}

/// The demo: the same metadata loop (this binary's `mdloop`, run under the stage) with
/// no limit, a `getattr` limit and a metadata-class limit. Each row shows the rate of
/// the operations its limit covers next to the limit, and the loop's whole rate.
fn demo(seconds: f64) -> Result<(), Failure> {
    let library = stage_library(None)?;
    let exe = std::env::current_exe().map_err(|e| usage(e.to_string()))?;
    let scratch = std::env::temp_dir().join(format!("padll-demo-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .map_err(|e| usage(format!("cannot create {}: {e}", scratch.display())))?;
    let mount = scratch.display().to_string();
    println!(
        "PADLL stage demo: a loop of stat (getattr), open and close on {mount}, {seconds} s per run\n"
    );
    println!(
        "{:<26} {:<20} {:>13} {:>11} {:>10}",
        "limit", "limit covers", "covered ops/s", "limit ops/s", "all ops/s"
    );
    let runs = [
        DemoRun::NotPreloaded,
        DemoRun::Managed,
        DemoRun::Limited("getattr=2000/s"),
        DemoRun::Limited("metadata=1000/s"),
    ];
    for run in runs {
        let mut command = Command::new(&exe);
        command.args(["mdloop", &mount, &seconds.to_string()]);
        let rule = match run {
            DemoRun::NotPreloaded => None,
            DemoRun::Managed => Some("all=1G/s"),
            DemoRun::Limited(rule) => Some(rule),
        };
        if let Some(rule) = rule {
            command
                .env("LD_PRELOAD", preload_value(&library))
                .env("PADLL_MOUNTS", &mount)
                .env("PADLL_RULES", rule);
        }
        let output = command
            .output()
            .map_err(|e| usage(format!("cannot run the loop: {e}")))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let rate = text
            .trim()
            .parse::<f64>()
            .map_err(|_| usage(format!("the loop printed {}", quote(text.as_ref()))))?;
        let row = match run {
            DemoRun::NotPreloaded => ["none (not preloaded)", "-", "-", "-"].map(String::from),
            DemoRun::Managed => ["none (preloaded, managed)", "-", "-", "-"].map(String::from),
            DemoRun::Limited(rule) => {
                let spec = config::parse_rule(rule, config::DEFAULT_BURST_MS)
                    .map_err(|e| usage(e.to_string()))?;
                let covered: Vec<&str> = MDLOOP_OPS
                    .iter()
                    .filter(|op| spec.scope.covers(**op))
                    .map(|op| op.name())
                    .collect();
                let share = covered.len() as f64 / MDLOOP_OPS.len() as f64;
                [
                    rule.to_string(),
                    covered.join(", "),
                    format!("{:.0}", rate * share),
                    spec.rate.to_string(),
                ]
            }
        };
        let [label, covers, covered, limit] = row;
        println!("{label:<26} {covers:<20} {covered:>13} {limit:>11} {rate:>10.0}");
    }
    let _ = std::fs::remove_dir_all(&scratch);
    println!("\nA limit holds the operations it covers to its rate; the others run free.");
    Ok(())
}

/// The operations of one round of `mdloop`, once each.
const MDLOOP_OPS: [Op; 3] = [Op::Getattr, Op::Open, Op::Close];

/// Runs `stat(file)` then `open`+`close` in a loop for `seconds` and prints the rate of
/// metadata operations it achieved.
fn mdloop(dir: &Path, seconds: f64) -> Result<(), Failure> {
    let file = dir.join("demo-file");
    std::fs::write(&file, b"padll")
        .map_err(|e| usage(format!("cannot create {}: {e}", file.display())))?;
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(seconds);
    let mut operations = 0u64;
    while start.elapsed() < deadline {
        std::fs::metadata(&file).map_err(|e| usage(e.to_string()))?;
        drop(std::fs::File::open(&file).map_err(|e| usage(e.to_string()))?);
        operations += MDLOOP_OPS.len() as u64;
    }
    println!("{:.1}", operations as f64 / start.elapsed().as_secs_f64());
    Ok(())
}

/// What the man pages say beyond the command line (`padll generate man DIR`): exit
/// status, files, examples, and the `padll.toml(5)` page.
mod man_pages {
    use super::cli_docs::{ConfigPage, Extras, Page};

    /// `Kind::exit_code`.
    const EXIT_STATUS: &[(&str, &str)] = &[
        ("0", "Success."),
        (
            "1",
            "A failure at run time (e.g. a file that cannot be read).",
        ),
        (
            "2",
            "Bad usage: a flag, a value or the configuration is wrong (the message names it).",
        ),
    ];

    /// `padll run` becomes the program: its status is the program's.
    const RUN_EXIT_STATUS: &[(&str, &str)] = &[
        ("any", "Once the program runs, its own exit status: padll run replaces itself with it."),
        ("1", "The stage library was not found (the message says where padll looked)."),
        ("2", "Bad usage: a flag, a value or the configuration is wrong (the message names it); the program was not started."),
        ("126", "The program exists but cannot be executed (as the shell says it)."),
        ("127", "The program was not found (as the shell says it)."),
    ];

    const PAGES: &[Page] = &[
        Page {
            name: "padll",
            exit_status: None,
            files: &[],
            examples: &[
                ("Limit a program's metadata operations under /scratch to 5000 per second:", "padll run --mount /scratch --limit metadata=5000/s -- ./app"),
                ("What every process of the job did:", "padll stats /tmp/padll-run-4242.json"),
            ],
        },
        Page {
            name: "padll-run",
            exit_status: Some(RUN_EXIT_STATUS),
            files: &[
                ("PREFIX/lib/padll/libpadll.so", "The stage, found from padll's own directory (--library or PADLL_LIBRARY name another)."),
                ("/dev/shm/padll/UID/segment-JOB", "The job's shared token buckets on this node (0600); the job's last process removes it. Flat as /dev/shm/padll-UID-JOB where no root component made the user's directory /dev/shm/padll/UID (0700)."),
                ("/dev/shm/padll/UID/rules-JOB", "With a controller: the job's last rules on this node, used by its processes that start while the controller is down; a Slurm job's stays for the epilog to remove. Flat as /dev/shm/padll-rules-UID-JOB without the user's directory."),
                ("/etc/cheferd/padll.toml", "A site's stage configuration, when PADLL_CONFIG or --config names it; see padll.toml(5)."),
            ],
            examples: &[
                ("Hold all of a job's processes on this node to 5000 metadata operations per second:", "padll run --mount /scratch --limit metadata=5000/s -- ./app"),
                ("Limit writes under /scratch to 500 MiB/s and keep statistics per job:", "padll run --mount /scratch --limit /scratch:write=500MiB/s --stats /tmp/padll-%j.json -- ./app"),
                ("A batch script whose every process takes its rules from the node's local controller:", "padll run --mount /scratch --controller /run/cheferd/local.sock -- ./job.sh"),
                ("The same, with the local controller running as user cheferd (not root):", "padll run --mount /scratch --controller /run/cheferd/local.sock --controller-uid \"$(id -u cheferd)\" -- ./job.sh"),
            ],
        },
        Page {
            name: "padll-stats",
            exit_status: None,
            files: &[],
            examples: &[
                ("The job's totals:", "padll stats /tmp/padll-run-4242.json"),
                ("Every process's report as JSON:", "padll stats --per-process --json /tmp/padll-run-4242.json"),
            ],
        },
        Page {
            name: "padll-demo",
            exit_status: None,
            files: &[],
            examples: &[("A metadata loop without and with limits, one second each:", "padll demo --seconds 1")],
        },
    ];

    const CONFIG_PAGES: &[ConfigPage] = &[ConfigPage {
        file: "padll.toml",
        summary: "configuration of the PADLL stage (PADLL_CONFIG, padll run --config)",
        sections: &["`padll.toml` (the stage)", "Rates"],
        see_also: "padll-run(1), global.toml(5)",
    }];

    /// The `padll` binary's man page extras.
    pub const EXTRAS: Extras = Extras {
        exit_status: EXIT_STATUS,
        pages: PAGES,
        config_pages: CONFIG_PAGES,
    };
}
