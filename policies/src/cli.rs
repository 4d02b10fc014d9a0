//! The command-line interface (`policies simulate | allocate | trace`), kept as library
//! functions so that the `cheferd` binary can expose the same subcommands by calling
//! [`run`] (or by embedding [`Command`] in its own clap parser and calling
//! [`execute`]).
//!
//! Exit codes ([`FailureKind::exit_code`]): 0 success, 1 an I/O failure (e.g. cannot
//! write the output directory), 2 bad arguments or bad input (the message names the bad
//! value or field).

use std::ffi::OsString;
use std::fs;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser, Subcommand};
use padll_wire::exit::{EX_FAILURE, EX_USAGE};
use padll_wire::flags::whole;
use serde::Deserialize;

use crate::placement::{self, PlaceInput, Placer, PlacerState};
use crate::sim::{self, Scenario, SimResult};
use crate::trace::{self, LoadShape};
use crate::{build, JobSnapshot};

#[path = "../../scripts/cli-errors.rs"]
mod cli_errors;

/// QoS control policies for shared HPC storage: simulate, dry-run, generate traces.
#[derive(Debug, Parser)]
#[command(name = "policies", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replay PADLL's per-job QoS scenarios (Table I) under one or all policies.
    Simulate(SimulateArgs),
    /// Dry run of one control cycle: read a snapshot (JSON) on stdin, print the rates.
    Allocate(AllocateArgs),
    /// Generate a seeded metadata trace for a scenario (padll-trace v1 CSV).
    Trace(TraceArgs),
    /// Dry run of one placement decision: targets, servers and requests (JSON) on
    /// stdin, the chosen targets on stdout.
    Place(PlaceArgs),
    /// Replay the placement experiments (Figs. 11, 12, 17, Table II) in the simulator.
    PlaceSim(PlaceSimArgs),
}

/// Arguments of `place`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Input (stdin): {\"targets\": [{\"id\": 0, \"oss\": 0, \"capacity\": 1e12, \"used\": 2e11}, ...], \"osses\": [{\"id\": 0, \"cpu\": 35, \"memory\": 20}], \"requests\": [{\"id\": 1, \"app\": 7, \"stripes\": 4, \"bytes\": 4e9}], \"history\": [{\"app\": 7, \"bytes\": [...]}], \"state\": <from a previous decision, optional>}\nOutput: {\"placer\", \"placements\": [{\"request\", \"targets\"}], \"predicted\", \"dropped\", \"cost\", \"state\"}. See policies/README.md."
)]
pub struct PlaceArgs {
    /// Placer: mcmf (= mcmf:3,3: Markov order 3, 3 predicted requests per application),
    /// mcmf:ORDER[,PREDICT], mcmf:0 (no prediction), round-robin, random[:SEED].
    // The text is the flag's help: its brackets are the usage's optional parts.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long, default_value = "mcmf")]
    pub placer: String,
}

/// Arguments of `place-sim`.
#[derive(Debug, clap::Args)]
pub struct PlaceSimArgs {
    /// Output directory for summary.md and the PNG/SVG plots.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Workload seed.
    #[arg(long, default_value_t = 42, allow_negative_numbers = true, value_parser = whole(0..=u64::MAX))]
    pub seed: u64,
    /// Simulated hours of the Figs. 11–12 runs (the paper: 24).
    #[arg(long, default_value_t = 24.0, allow_negative_numbers = true)]
    pub hours: f64,
    /// Target counts of the scalability run (Fig. 17).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "160,480,800,1024,3600",
        allow_negative_numbers = true,
        value_parser = whole(1..=100_000usize)
    )]
    pub osts: Vec<usize>,
    /// Simulated hours of each scalability run.
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
    pub scale_hours: f64,
    /// Skip the PNG/SVG plots.
    #[arg(long)]
    pub no_plots: bool,
    /// `paper` (Figs. 11, 12, 17, Table II) or `alternating` (MCMF with and without
    /// prediction on applications alternating large and small files, nearly full
    /// targets; --seed only).
    #[arg(long, default_value = "paper")]
    pub scenario: String,
}

/// Arguments of `simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Scenario of PADLL Table I: 1, 2, 3 or `all`.
    #[arg(long, default_value = "all")]
    pub scenario: String,
    /// Policy spec (see `allocate --help`) or `all` (baseline, uniform:4, priority,
    /// psharing, psfa, adaptbf, size-fair). Repeatable.
    #[arg(long, default_value = "all")]
    pub policy: Vec<String>,
    /// Output directory for the table, CSVs and plots.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of the generated trace (ignored with --trace).
    #[arg(long, default_value_t = 42, allow_negative_numbers = true, value_parser = whole(0..=u64::MAX))]
    pub seed: u64,
    /// Read the per-job traces from this padll-trace v1 file instead of generating them.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Simulation step in seconds (≤ the interval).
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    pub step: f64,
    /// Control-loop interval in seconds.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub interval: f64,
    /// Capacity Max_R in ops/s (`110000`, `110k`, as in the controller's TOML).
    #[arg(
        long,
        default_value_t = 110_000.0,
        value_parser = parse_max_rate,
        allow_negative_numbers = true
    )]
    pub max_rate: f64,
    /// Skip the PNG/SVG plots.
    #[arg(long)]
    pub no_plots: bool,
}

/// Arguments of `allocate`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Input (stdin): {\"jobs\": [{\"id\": 1, \"demand\": 15000, \"usage\": 9000, ...}], \"state\": <state from a previous cycle, optional>}\nOutput: {\"policy\", \"max_rate\", \"rates\": [{\"id\", \"rate\"}], \"state\"} — feed `state` back to chain cycles. See policies/README.md."
)]
pub struct AllocateArgs {
    /// Policy spec, e.g. psfa, psfa:0.3, adaptbf, themis:group,user,size, drf:1e9.
    #[arg(long)]
    pub policy: String,
    /// Capacity Max_R of the resource (same unit as the rates): a number (`110000`,
    /// `1.1e5`) or a rate in the controller's syntax (`110k`, `5000/s`, `20GiB/s`).
    #[arg(long, value_parser = parse_max_rate, allow_negative_numbers = true)]
    pub max_rate: f64,
    /// Control interval in seconds (AdapTBF's Δt; default: the spec's, as in
    /// `adaptbf:10`, else 1 s). Given, it overrides the spec's.
    #[arg(long, allow_negative_numbers = true)]
    pub interval: Option<f64>,
}

/// Arguments of `trace`.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// Scenario of PADLL Table I whose load proportions split the aggregate (1, 2, 3).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = whole(1..=3usize))]
    pub scenario: usize,
    /// PRNG seed.
    #[arg(long, default_value_t = 42, allow_negative_numbers = true, value_parser = whole(0..=u64::MAX))]
    pub seed: u64,
    /// Mean aggregate load, ops/s.
    #[arg(long, default_value_t = 90_000.0, allow_negative_numbers = true)]
    pub mean: f64,
    /// Length of each job's trace, seconds.
    #[arg(long, default_value_t = 2160, allow_negative_numbers = true, value_parser = whole(1..=1_000_000usize))]
    pub seconds: usize,
    /// Output file (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The policies `simulate --policy all` runs (the paper's setups plus AdapTBF and size-fair).
pub const SIM_POLICIES: [&str; 7] = [
    "baseline",
    "uniform:4",
    "priority",
    "psharing",
    "psfa",
    "adaptbf",
    "size-fair",
];

/// Parse `--max-rate`: a plain non-negative number, or a rate in the syntax the
/// controller's TOML accepts (`110k`, `5000/s`, `20GiB/s`; `padll_wire::config::parse_rate`).
pub fn parse_max_rate(text: &str) -> Result<f64, MaxRateError> {
    let t = text.trim();
    if let Ok(v) = t.parse::<f64>() {
        return if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(MaxRateError::NotNonNegative(text.to_string()))
        };
    }
    padll_wire::config::parse_rate(t)
        .map(|r| r.per_second() as f64)
        .map_err(|error| MaxRateError::NotARate {
            text: text.to_string(),
            error,
        })
}

/// A `--max-rate` [`parse_max_rate`] refused.
#[derive(Debug, thiserror::Error)]
pub enum MaxRateError {
    /// A number, but negative or not finite (the text).
    #[error("bad --max-rate `{0}` (expected a non-negative number)")]
    NotNonNegative(String),
    /// Neither a number nor a rate.
    #[error("bad --max-rate `{text}` (expected a number or a rate such as 110k): {error}")]
    NotARate {
        /// As given.
        text: String,
        /// Why it is no rate.
        error: padll_wire::config::RateError,
    },
}

/// A CLI failure: one line naming the bad value, and its kind, which alone decides the
/// exit code ([`FailureKind::exit_code`]).
pub type Failure = padll_wire::exit::Failure<FailureKind>;

/// What kind of failure a [`Failure`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// Bad arguments or input.
    Usage,
    /// Reading or writing failed.
    Io,
}

impl FailureKind {
    /// The `policies` binary's exit code for this kind.
    pub fn exit_code(self) -> u8 {
        match self {
            FailureKind::Usage => EX_USAGE,
            FailureKind::Io => EX_FAILURE,
        }
    }
}

/// Bad usage: `error` (a message or a typed error) is the one line shown.
fn usage(error: impl std::fmt::Display) -> Failure {
    Failure::new(FailureKind::Usage, error.to_string())
}

/// Reading or writing failed: `error` is the one line shown.
fn io(error: impl std::fmt::Display) -> Failure {
    Failure::new(FailureKind::Io, error.to_string())
}

/// Parse `args` (including the program name) and run; returns the exit code. Errors go
/// to stderr.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            if let Some(code) = cli_errors::shown(&e) {
                return code;
            }
            eprintln!("policies: {}", cli_errors::line(&e, &Cli::command(), &args));
            return EX_USAGE;
        }
    };
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    match execute(&cli.command, &mut stdin.lock(), &mut stdout.lock()) {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("error: {f}");
            f.kind.exit_code()
        }
    }
}

/// Run one subcommand with explicit input and output streams.
pub fn execute(cmd: &Command, input: &mut dyn Read, out: &mut dyn Write) -> Result<(), Failure> {
    match cmd {
        Command::Simulate(a) => simulate(a, out),
        Command::Allocate(a) => allocate(a, input, out),
        Command::Trace(a) => make_trace(a, out),
        Command::Place(a) => place(a, input, out),
        Command::PlaceSim(a) => place_sim(a, out),
    }
}

/// The JSON input of `allocate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocateInput {
    /// The active jobs.
    pub jobs: Vec<JobSnapshot>,
    /// State returned by the previous cycle (optional).
    #[serde(default)]
    pub state: serde_json::Value,
}

fn allocate(a: &AllocateArgs, input: &mut dyn Read, out: &mut dyn Write) -> Result<(), Failure> {
    check(
        a.max_rate.is_finite() && a.max_rate >= 0.0,
        "--max-rate",
        a.max_rate,
        "a non-negative number",
    )?;
    if let Some(interval) = a.interval {
        check(
            interval.is_finite() && interval > 0.0,
            "--interval",
            interval,
            "seconds > 0",
        )?;
    }
    let mut policy = build(&a.policy).map_err(usage)?;
    // Only when given: `adaptbf:10` keeps its 10 s otherwise.
    if let Some(interval) = a.interval {
        policy.set_interval(interval);
    }
    let mut text = String::new();
    input
        .read_to_string(&mut text)
        .map_err(|e| usage(format!("reading stdin: {e}")))?;
    let snap: AllocateInput =
        serde_json::from_str(&text).map_err(|e| usage(format!("bad snapshot JSON: {e}")))?;
    let mut seen = std::collections::HashSet::new();
    for j in &snap.jobs {
        j.validate()
            .map_err(|e| usage(format!("bad snapshot JSON: {e}")))?;
        if !seen.insert(j.id) {
            return Err(usage(format!(
                "bad snapshot JSON: duplicate job id `{}`",
                j.id
            )));
        }
    }
    policy
        .load_state(&snap.state)
        .map_err(|e| usage(format!("bad snapshot JSON: field `state`: {e}")))?;
    let rates = policy.allocate(a.max_rate, &snap.jobs);
    let mut result = serde_json::json!({
        "policy": policy.name(),
        "max_rate": a.max_rate,
        "rates": snap.jobs.iter().zip(&rates).map(|(j, r)| serde_json::json!({"id": j.id, "rate": r})).collect::<Vec<_>>(),
        "state": policy.state(),
    });
    if let Some(serde_json::Value::Object(extra)) = policy.extra_outputs() {
        for (k, v) in extra {
            result[k] = v;
        }
    }
    let text = serde_json::to_string_pretty(&result).map_err(io)?;
    writeln!(out, "{text}").map_err(io)
}

fn make_trace(a: &TraceArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let row = sim::TABLE_I
        .get(a.scenario.wrapping_sub(1))
        .ok_or_else(|| {
            usage(format!(
                "bad --scenario `{}` (expected 1, 2 or 3)",
                a.scenario
            ))
        })?;
    check(
        a.mean.is_finite() && a.mean > 0.0,
        "--mean",
        a.mean,
        "ops/s > 0",
    )?;
    if a.seconds == 0 {
        return Err(usage("bad --seconds `0` (expected > 0)"));
    }
    let agg = trace::generate_aggregate(&LoadShape {
        seconds: a.seconds,
        mean: a.mean,
        seed: a.seed,
    });
    let props: Vec<f64> = row.iter().map(|r| r.0).collect();
    let traces = trace::split(&agg, &props);
    let comment = format!(
        "PADLL Table I scenario #{} load proportions {:?}; seed {}; mean aggregate {} ops/s; {} s per job\ngenerated by `policies trace --scenario {} --seed {} --mean {} --seconds {}`",
        a.scenario, props, a.seed, a.mean, a.seconds, a.scenario, a.seed, a.mean, a.seconds
    );
    match &a.out {
        Some(p) => {
            let f = fs::File::create(p).map_err(|e| io(format!("{}: {e}", p.display())))?;
            let mut w = std::io::BufWriter::new(f);
            trace::write(&mut w, &traces, &comment)
                .map_err(|e| io(format!("{}: {e}", p.display())))?;
            w.flush().map_err(|e| io(format!("{}: {e}", p.display())))
        }
        None => trace::write(out, &traces, &comment).map_err(io),
    }
}

/// Parse `--scenario` (`1`, `2`, `3` or `all`).
fn scenarios(s: &str) -> Result<Vec<usize>, Failure> {
    match s.trim() {
        "all" => Ok(vec![1, 2, 3]),
        x => match x.parse::<usize>() {
            Ok(n @ 1..=3) => Ok(vec![n]),
            _ => Err(usage(format!(
                "bad --scenario `{s}` (expected 1, 2, 3 or all)"
            ))),
        },
    }
}

/// File-name-safe version of a policy spec.
fn file_name(policy: &str) -> String {
    policy
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn simulate(a: &SimulateArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let which = scenarios(&a.scenario)?;
    let mut specs: Vec<String> = Vec::new();
    for p in &a.policy {
        if p == "all" {
            specs.extend(SIM_POLICIES.iter().map(|s| s.to_string()));
        } else {
            specs.push(p.clone());
        }
    }
    for s in &specs {
        build(s).map_err(usage)?;
    }
    check(
        a.step >= sim::MIN_STEP && a.step <= 0.1 + 1e-12,
        "--step",
        a.step,
        "0.001 ≤ step ≤ 0.1 s",
    )?;
    check(
        a.interval.is_finite() && a.interval >= a.step,
        "--interval",
        a.interval,
        "seconds ≥ the step",
    )?;
    check(
        a.max_rate.is_finite() && a.max_rate > 0.0,
        "--max-rate",
        a.max_rate,
        "ops/s > 0",
    )?;
    let traces = match &a.trace {
        Some(p) => {
            let f = fs::File::open(p)
                .map_err(|e| usage(format!("bad --trace `{}`: {e}", p.display())))?;
            let t = trace::read(BufReader::new(f))
                .map_err(|e| usage(format!("bad --trace `{}`: {e}", p.display())))?;
            if t.len() < 4 {
                return Err(usage(format!(
                    "bad --trace `{}`: {} jobs, the scenarios need 4",
                    p.display(),
                    t.len()
                )));
            }
            Some(t)
        }
        None => None,
    };
    let mut report = String::new();
    for n in which {
        let mut sc = match &traces {
            Some(t) => Scenario::paper_with_traces(n, t),
            None => Scenario::paper_generated(n, a.seed).expect("scenario 1..=3"),
        };
        sc.step = a.step;
        sc.interval = a.interval;
        sc.max_rate = a.max_rate;
        let results: Vec<SimResult> = specs
            .iter()
            .map(|s| {
                let mut p = build(s).expect("validated");
                let mut r = sim::simulate(&sc, p.as_mut());
                r.policy = s.clone();
                r
            })
            .collect();
        let table = sim::markdown_table(&sc, &results);
        let section = format!(
            "## {} (Max_R = {} kops/s)\n\n{}\n",
            sc.name,
            sc.max_rate / 1000.0,
            table
        );
        write!(out, "{section}").map_err(io)?;
        report.push_str(&section);
        if let Some(dir) = &a.out {
            let d = dir.join(format!("scenario-{n}"));
            fs::create_dir_all(&d).map_err(|e| io(format!("{}: {e}", d.display())))?;
            for r in &results {
                let base = d.join(file_name(&r.policy));
                write_file(&base.with_extension("csv"), &sim::throughput_csv(&sc, r))?;
                if !a.no_plots {
                    crate::plot::plot(
                        &sc,
                        r,
                        Some(&base.with_extension("png")),
                        Some(&base.with_extension("svg")),
                    )
                    .map_err(io)?;
                }
            }
        }
    }
    if let Some(dir) = &a.out {
        write_file(&dir.join("summary.md"), &report)?;
    }
    Ok(())
}

/// `Ok` if `ok`, else a usage failure naming `flag` and its bad `value`.
fn check(ok: bool, flag: &str, value: f64, expected: &str) -> Result<(), Failure> {
    if ok {
        Ok(())
    } else {
        Err(usage(format!("bad {flag} `{value}` (expected {expected})")))
    }
}

fn write_file(p: &Path, text: &str) -> Result<(), Failure> {
    fs::write(p, text).map_err(|e| io(format!("{}: {e}", p.display())))
}

/// The JSON input of `place`: a [`PlaceInput`] plus the state of the previous decision.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlaceJson {
    #[serde(flatten)]
    input: PlaceInput,
    #[serde(default)]
    state: Option<PlacerState>,
}

fn place(a: &PlaceArgs, input: &mut dyn Read, out: &mut dyn Write) -> Result<(), Failure> {
    let placer = Placer::parse(&a.placer).map_err(|e| usage(format!("bad --placer: {e}")))?;
    let mut text = String::new();
    input
        .read_to_string(&mut text)
        .map_err(|e| usage(format!("reading stdin: {e}")))?;
    let j: PlaceJson =
        serde_json::from_str(&text).map_err(|e| usage(format!("bad placement JSON: {e}")))?;
    j.input
        .validate()
        .map_err(|e| usage(format!("bad placement JSON: {e}")))?;
    let mut state = j.state.unwrap_or_default();
    let d = placement::place(&placer, &j.input, &mut state).map_err(usage)?;
    let result = serde_json::json!({
        "placer": placer.name(),
        "placements": d.placements,
        "predicted": d.predicted,
        "dropped": d.dropped,
        "cost": d.cost,
        "state": state,
    });
    let text = serde_json::to_string_pretty(&result).map_err(io)?;
    writeln!(out, "{text}").map_err(io)
}

fn place_sim(a: &PlaceSimArgs, out: &mut dyn Write) -> Result<(), Failure> {
    match a.scenario.as_str() {
        "paper" => {}
        "alternating" => {
            let runs = placement::sim::prediction_runs(a.seed);
            let md = placement::sim::prediction_markdown(a.seed, &runs);
            write!(out, "{md}").map_err(io)?;
            if let Some(dir) = &a.out {
                fs::create_dir_all(dir).map_err(|e| io(format!("{}: {e}", dir.display())))?;
                write_file(&dir.join("prediction.md"), &md)?;
            }
            return Ok(());
        }
        other => {
            return Err(usage(format!(
                "bad --scenario `{other}` (expected paper or alternating)"
            )))
        }
    }
    if let Some(&n) = a.osts.iter().find(|&&n| n == 0 || n > 100_000) {
        return Err(usage(format!("bad --osts `{n}` (expected 1–100000)")));
    }
    check(
        a.scale_hours.is_finite() && a.scale_hours > 0.0 && a.scale_hours <= 48.0,
        "--scale-hours",
        a.scale_hours,
        "hours in (0, 48]",
    )?;
    check(
        a.hours.is_finite() && a.hours >= 1.0 && a.hours <= 240.0,
        "--hours",
        a.hours,
        "hours in [1, 240]",
    )?;
    let f = placement::sim::figures(a.seed, a.hours, &a.osts, a.scale_hours);
    let md = placement::sim::markdown(&f);
    write!(out, "{md}").map_err(io)?;
    let Some(dir) = &a.out else { return Ok(()) };
    fs::create_dir_all(dir).map_err(|e| io(format!("{}: {e}", dir.display())))?;
    write_file(&dir.join("summary.md"), &md)?;
    if a.no_plots {
        return Ok(());
    }
    let series = |pick: fn(&placement::sim::Sample) -> f64| -> Vec<crate::plot::Series> {
        f.balance
            .iter()
            .map(|r| {
                (
                    r.placer.clone(),
                    r.samples.iter().map(|s| (s.hour, pick(s))).collect(),
                )
            })
            .collect()
    };
    let figs: [(&str, &str, &str, Vec<crate::plot::Series>, bool); 3] = [
        (
            "fig11-disk",
            "Max/mean disk space used over 32 OSTs (cf. Fig. 11)",
            "max/mean disk used",
            series(|s| s.disk_ratio),
            false,
        ),
        (
            "fig12-cpu",
            "Max/mean OSS CPU over 8 OSSes, 10-min means (cf. Fig. 12)",
            "max/mean CPU",
            series(|s| s.cpu_ratio),
            false,
        ),
        (
            "fig17-bandwidth",
            "Mean request bandwidth vs number of OSTs (cf. Fig. 17)",
            "MB/s",
            ["mcmf", "round-robin"]
                .iter()
                .map(|p| {
                    (
                        p.to_string(),
                        f.scaling
                            .iter()
                            .filter(|x| x.1 == *p)
                            .map(|x| (x.0 as f64, x.2 / 1e6))
                            .collect(),
                    )
                })
                .collect(),
            true,
        ),
    ];
    for (name, title, y, s, markers) in &figs {
        let x = if *markers { "OSTs" } else { "hours" };
        let base = dir.join(name);
        crate::plot::plot_lines(
            title,
            x,
            y,
            s,
            if *markers { 0.0 } else { 1.0 },
            *markers,
            Some(&base.with_extension("png")),
            Some(&base.with_extension("svg")),
        )
        .map_err(io)?;
    }
    Ok(())
}
