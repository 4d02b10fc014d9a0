//! `padll`: run a program under the PADLL stage, and read its statistics.
//!
//! * `padll run [--mount DIR]... [--limit SELECTOR=RATE]... [--job ID] [--stats FILE] -- PROGRAM ARGS…`
//!   validates everything, appends `libpadll.so` (found beside this binary) to
//!   `LD_PRELOAD`, sets the stage's environment and execs the program. Its children
//!   inherit both, so a whole batch script is controlled.
//! * `padll stats FILE.json` prints the table of a JSON statistics file.
//! * `padll demo` shows a metadata loop with and without limits.

use clap::{Args, Parser, Subcommand};
use padll_wire::{config, report};
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "padll",
    version,
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
    },
    /// Demonstrate throttling: a metadata loop with and without limits.
    Demo {
        /// Seconds per run.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// Metadata loop used by the demo: stat + open/close under DIR, printing its rate.
    #[command(hide = true)]
    Mdloop { dir: PathBuf, seconds: f64 },
}

#[derive(Args, Clone, Default)]
struct RunArgs {
    /// Mountpoint to manage (repeatable).
    #[arg(long = "mount", value_name = "DIR")]
    mounts: Vec<String>,
    /// Limit, as SELECTOR=RATE: open=5000/s, metadata=2k, /scratch:data=100MiB/s (repeatable).
    #[arg(long = "limit", value_name = "SELECTOR=RATE")]
    limits: Vec<String>,
    /// Bucket depth as milliseconds of the rate.
    #[arg(long, value_name = "MS")]
    burst_ms: Option<u64>,
    /// Job id (default: from Slurm, PBS, LSF or Flux).
    #[arg(long)]
    job: Option<String>,
    /// Job size in nodes (default: SLURM_JOB_NUM_NODES, else 1).
    #[arg(long)]
    job_size: Option<u32>,
    /// User the job runs for.
    #[arg(long)]
    user: Option<String>,
    /// Account the job is charged to.
    #[arg(long)]
    account: Option<String>,
    /// Statistics file written at exit by every process (.json → JSON lines; %p → pid).
    #[arg(long, value_name = "FILE")]
    stats: Option<String>,
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Unix socket of the node's local controller (`cheferd local`).
    #[arg(long, value_name = "SOCKET")]
    controller: Option<String>,
    /// Stage log level: off, error, warn, info, debug.
    #[arg(long)]
    log: Option<String>,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    program: Vec<OsString>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Commands::Run(args) => run(&args),
        Commands::Stats { file, per_process } => stats(&file, per_process),
        Commands::Demo { seconds } => demo(seconds),
        Commands::Mdloop { dir, seconds } => mdloop(&dir, seconds),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { message, code }) => {
            eprintln!("padll: {message}");
            ExitCode::from(code)
        }
    }
}

struct Failure {
    message: String,
    code: u8,
}

fn usage(message: String) -> Failure {
    Failure { message, code: 2 }
}

/// The stage's environment for these arguments, validated exactly as the stage will
/// read it.
fn stage_environment(args: &RunArgs) -> Result<Vec<(&'static str, String)>, Failure> {
    let mut env = Vec::new();
    for mount in &args.mounts {
        if !mount.starts_with('/') {
            return Err(usage(format!("--mount '{mount}' is not an absolute path")));
        }
        if mount.contains(':') {
            return Err(usage(format!(
                "--mount '{mount}' contains ':', which separates mountpoints"
            )));
        }
    }
    if !args.mounts.is_empty() {
        env.push(("PADLL_MOUNTS", args.mounts.join(":")));
    }
    if let Some(bad) = args.limits.iter().find(|l| l.contains(',')) {
        return Err(usage(format!(
            "--limit '{bad}' contains ',': give one limit per --limit"
        )));
    }
    if !args.limits.is_empty() {
        env.push(("PADLL_RULES", args.limits.join(",")));
    }
    let optional = [
        ("PADLL_BURST_MS", args.burst_ms.map(|v| v.to_string())),
        ("PADLL_JOB_ID", args.job.clone().or_else(default_job_id)),
        ("PADLL_JOB_SIZE", args.job_size.map(|v| v.to_string())),
        ("PADLL_USER", args.user.clone()),
        ("PADLL_ACCOUNT", args.account.clone()),
        ("PADLL_STATS", args.stats.clone()),
        (
            "PADLL_CONFIG",
            args.config.as_ref().map(|p| p.display().to_string()),
        ),
        ("PADLL_LOG", args.log.clone()),
        ("PADLL_CONTROLLER", args.controller.clone()),
    ];
    env.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));

    let overrides: HashMap<&str, &String> = env.iter().map(|(k, v)| (*k, v)).collect();
    config::load(&|name| {
        overrides
            .get(name)
            .map(|v| v.to_string())
            .or_else(|| std::env::var(name).ok())
    })
    .map_err(|e| usage(cli_wording(&e)))?;
    Ok(env)
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
        .then(|| format!("run-{}", std::process::id()))
}

/// Names the flag rather than the variable it sets.
fn cli_wording(message: &str) -> String {
    [
        ("PADLL_RULES: ", "--limit: "),
        ("PADLL_MOUNTS: ", "--mount: "),
        ("PADLL_CONFIG: ", "--config: "),
        ("PADLL_LOG: ", "--log: "),
        ("PADLL_BURST_MS: ", "--burst-ms: "),
    ]
    .iter()
    .fold(message.to_string(), |m, (var, flag)| {
        m.replacen(var, flag, 1)
    })
}

fn stage_library() -> Result<PathBuf, Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure {
        message: format!("cannot locate this executable: {e}"),
        code: 1,
    })?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    padll_wire::locate_stage_library(dir).ok_or_else(|| Failure {
        message: format!(
            "{} not found (it must sit beside the padll binary)",
            dir.join(padll_wire::STAGE_LIBRARY).display()
        ),
        code: 1,
    })
}

fn preload_value(library: &Path) -> String {
    let library = library.display().to_string();
    match std::env::var("LD_PRELOAD") {
        Ok(current) if current.split([' ', ':']).any(|p| p == library) => current,
        Ok(current) if !current.trim().is_empty() => format!("{current}:{library}"),
        _ => library,
    }
}

fn run(args: &RunArgs) -> Result<(), Failure> {
    let env = stage_environment(args)?;
    let library = stage_library()?;
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
        message: format!("cannot run '{}': {error}", program.to_string_lossy()),
        code: if error.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        },
    })
}

fn stats(file: &Path, per_process: bool) -> Result<(), Failure> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| usage(format!("cannot read '{}': {e}", file.display())))?;
    let reports = report::parse(&text).map_err(|e| usage(format!("'{}' {e}", file.display())))?;
    if per_process {
        print!("{}", report::table(&reports));
    } else {
        let mut out = format!(
            "padll statistics: {} process(es) in {}\n",
            reports.len(),
            file.display()
        );
        report::write_ops(&mut out, &report::total(&reports));
        print!("{out}");
    }
    Ok(())
}

/// The demo: the same metadata loop (this binary's `mdloop`, run under the stage) with
/// no limit, a `getattr` limit and a metadata-class limit.
fn demo(seconds: f64) -> Result<(), Failure> {
    let library = stage_library()?;
    let exe = std::env::current_exe().map_err(|e| usage(e.to_string()))?;
    let scratch = std::env::temp_dir().join(format!("padll-demo-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .map_err(|e| usage(format!("cannot create {}: {e}", scratch.display())))?;
    let mount = scratch.display().to_string();
    println!(
        "PADLL stage demo: a metadata loop (stat, open+close) on {mount}, {seconds} s per run\n"
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "limit", "achieved ops/s", "limit ops/s"
    );
    let runs: [(&str, Option<&str>, Option<f64>); 4] = [
        ("none (not preloaded)", None, None),
        ("none (preloaded, managed)", Some("all=1G/s"), None),
        ("getattr=2000/s", Some("getattr=2000/s"), Some(2000.0)),
        (
            "metadata=1000/s (stat+open+close)",
            Some("metadata=1000/s"),
            Some(1000.0),
        ),
    ];
    for (label, limit, expected) in runs {
        let mut command = Command::new(&exe);
        command.args(["mdloop", &mount, &seconds.to_string()]);
        if let Some(limit) = limit {
            command
                .env("LD_PRELOAD", preload_value(&library))
                .env("PADLL_MOUNTS", &mount)
                .env("PADLL_RULES", limit);
        }
        let output = command
            .output()
            .map_err(|e| usage(format!("cannot run the loop: {e}")))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let rate = text
            .trim()
            .parse::<f64>()
            .map_err(|_| usage(format!("the loop printed '{text}'")))?;
        let expected = expected.map_or("-".to_string(), |e| format!("{e:.0}"));
        println!("{label:<34} {rate:>14.0} {expected:>14}");
    }
    let _ = std::fs::remove_dir_all(&scratch);
    println!("\nEach stat is one getattr; each open+close pair is two metadata operations.");
    Ok(())
}

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
        operations += 3;
    }
    println!("{:.1}", operations as f64 / start.elapsed().as_secs_f64());
    Ok(())
}
