//! `cheferd`: the PADLL control plane's command line.

use cheferd_controller::admin::{self, AdminRequest, CtlError, CtlErrorKind};
use cheferd_controller::config::GlobalConfig;
use cheferd_controller::global::{self, Change, Controller};
use cheferd_controller::local::{self, LocalLimits, LocalOptions};
use cheferd_controller::supervise::Supervisor;
use cheferd_controller::{bounds, demo, metrics, policy};
use clap::{Args, CommandFactory, Parser, Subcommand};
use padll_wire::config::{parse_rate, Rate};
use padll_wire::exit::{EX_FAILURE, EX_NOPERM, EX_UNAVAILABLE, EX_USAGE};
use policies::cli::whole;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[path = "../../scripts/cli-docs.rs"]
mod cli_docs;
mod man_pages;

/// Where the controllers' sockets are by default: systemd makes it
/// (`RuntimeDirectory=cheferd` in `etc/systemd/`); elsewhere give the paths.
const LOCAL_SOCKET: &str = "/run/cheferd/local.sock";
/// The global controller's admin socket by default (see [`LOCAL_SOCKET`]).
const ADMIN_SOCKET: &str = "/run/cheferd/admin.sock";

/// Upper bounds of numeric flags, far above any real use: a value beyond (a typo, a
/// unit mistaken) is refused at parsing rather than tried.
const MAX_COUNT: usize = 1_000_000;
/// See [`MAX_COUNT`]: 1 TiB.
const MAX_BYTES: usize = 1 << 40;
/// See [`MAX_COUNT`]: about 11 days (`replay --rate` holds one row a second).
const MAX_SECONDS: usize = 1_000_000;
/// See [`MAX_COUNT`]: a century.
const MAX_DAYS: u32 = 36_500;

/// Clap's refusal of the command line. A refused value is one line naming the flag and
/// the value (exit 2); the rest (unknown flags, help, version) clap prints as it does.
fn parse_failure(error: clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let (arg, value) = (
        error.get(ContextKind::InvalidArg),
        error.get(ContextKind::InvalidValue),
    );
    match (error.kind(), arg, value, std::error::Error::source(&error)) {
        (
            ErrorKind::ValueValidation,
            Some(ContextValue::String(arg)),
            Some(ContextValue::String(value)),
            Some(reason),
        ) => {
            // `--jobs <JOBS>`: the flag; a positional argument is its `<NAME>`.
            let flag = arg.split(' ').next().unwrap_or(arg);
            eprintln!(
                "cheferd: {flag} '{}': {reason}",
                padll_wire::control::short(value)
            );
            ExitCode::from(EX_USAGE)
        }
        _ => error.exit(),
    }
}

#[derive(Parser)]
#[command(
    name = "cheferd",
    version = cheferd_controller::VERSION,
    about = "PADLL control plane: global and local controllers, admin CLI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the global controller.
    Global(GlobalArgs),
    /// Run a local controller (one per compute node).
    Local(LocalArgs),
    /// Demonstrate the whole system: controllers, jobs under the stage, live rates, a plot.
    Demo(DemoArgs),
    /// Benchmark the control cycle with simulated local controllers on loopback.
    Bench(BenchArgs),
    /// The simulated local controllers of `bench`, in their own process (so the bench
    /// process's CPU time is the global controller's).
    #[command(hide = true)]
    BenchLocals(BenchLocalsArgs),
    /// Replay a metadata trace (or a constant load) against a directory, printing the
    /// achieved rate every second.
    Replay(ReplayArgs),
    /// Replay PADLL's Table I scenarios in the simulator (same as `policies simulate`).
    Simulate(policies::cli::SimulateArgs),
    /// Dry run of one control cycle: a JSON snapshot on stdin, rates on stdout.
    Allocate(policies::cli::AllocateArgs),
    /// Generate a seeded metadata trace (padll-trace v1 CSV) for the replayer.
    Trace(policies::cli::TraceArgs),
    /// Make the site CA and the certificates of the global and local controllers
    /// (mutual TLS; no openssl needed).
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Dry run of one stripe-placement decision: targets and requests (JSON) on stdin,
    /// the chosen targets on stdout (same as `policies place`).
    Place(policies::cli::PlaceArgs),
    /// Administer a running global controller.
    Ctl(CtlArgs),
    /// Write man pages or shell completions (used by scripts/install.sh).
    #[command(hide = true, subcommand)]
    Generate(cli_docs::Generate),
}

/// `cheferd global`.
#[derive(Args)]
struct GlobalArgs {
    /// TOML configuration (resources, policies, jobs, scheduled rules).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// gRPC address for local controllers.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: String,
    /// Admin socket for `cheferd ctl`.
    #[arg(long, value_name = "PATH", default_value = ADMIN_SOCKET)]
    admin_socket: PathBuf,
    /// Prometheus metrics address (`GET /metrics`).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    #[command(flatten)]
    tls: GlobalTlsArgs,
    #[command(flatten)]
    standby: StandbyArgs,
}

/// `cheferd local`.
#[derive(Args)]
struct LocalArgs {
    /// This node's name (default: its certificate's; with --insecure-plaintext, the
    /// host name). With TLS it must be a name the certificate carries.
    #[arg(long)]
    node: Option<String>,
    /// Unix socket the stages connect to (their PADLL_CONTROLLER).
    #[arg(long, value_name = "PATH", default_value = LOCAL_SOCKET)]
    socket: PathBuf,
    /// The global controller (`http://…` only with --insecure-plaintext); with a
    /// standby, every global controller, comma-separated: the leader is followed.
    #[arg(
        long,
        value_name = "URL[,URL…]",
        default_value = "https://127.0.0.1:50051"
    )]
    global: String,
    #[command(flatten)]
    tls: LocalTlsArgs,
    /// How often stages report usage, ms.
    #[arg(long, default_value_t = 250)]
    #[arg(allow_negative_numbers = true, value_parser = whole(10..=60_000u64))]
    report_ms: u64,
    /// Stage connections, all users together (also kept below the descriptor limit).
    #[arg(long, default_value_t = 4096)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_COUNT))]
    max_connections: usize,
    /// Stage connections per uid.
    #[arg(long, default_value_t = 1024)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_COUNT))]
    max_connections_per_uid: usize,
    /// Distinct jobs among one uid's stages.
    #[arg(long, default_value_t = 64)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_COUNT))]
    max_jobs_per_uid: usize,
    /// Bytes of partial lines buffered for all connections.
    #[arg(long, default_value_t = 64 << 20)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_BYTES))]
    max_pending_bytes: usize,
    /// Bytes of partial lines buffered for one uid's connections.
    #[arg(long, default_value_t = 16 << 20)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_BYTES))]
    max_pending_bytes_per_uid: usize,
    /// Limits of a job on this node while it has no rules from the global controller
    /// (starting, frozen, unreachable, fenced), whatever its own environment says: as
    /// PADLL_RULES (`/scratch:metadata=2000/s,/scratch:data=1GiB/s`), or 0 for none
    /// [default: 1 % of each resource's Max_R, once the global controller said it]
    #[arg(long, value_name = "RULES", value_parser = local::parse_default_limit)]
    #[arg(allow_hyphen_values = true)]
    default_limit: Option<local::DefaultLimit>,
}

/// `cheferd demo`.
#[derive(Args)]
struct DemoArgs {
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

/// `cheferd bench`.
#[derive(Args)]
struct BenchArgs {
    /// Numbers of local controllers to simulate.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=100_000usize))]
    locals: Vec<usize>,
    /// Stages (jobs) per local controller.
    #[arg(long, default_value_t = 4)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=1000usize))]
    stages: usize,
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

/// `cheferd bench-locals`.
#[derive(Args)]
struct BenchLocalsArgs {
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

/// `cheferd replay`.
#[derive(Args)]
struct ReplayArgs {
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

/// `cheferd ctl`.
#[derive(Args)]
struct CtlArgs {
    /// The global controller's admin socket.
    #[arg(long, value_name = "PATH", default_value = ADMIN_SOCKET)]
    #[arg(global = true)]
    socket: PathBuf,
    /// Print the views (nodes, jobs, stages, top, dump) and replies as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

/// The global controller's TLS flags (they override `[tls]` of the configuration).
#[derive(clap::Args)]
struct GlobalTlsArgs {
    /// Its certificate (PEM; `cheferd certs server` makes it).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The site CA: local controllers must present a node certificate it signed.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Serve plaintext gRPC, unauthenticated: anyone who reaches the port can pose as
    /// any node. For tests and trusted networks only.
    #[arg(long)]
    insecure_plaintext: bool,
}

/// A local controller's TLS flags.
#[derive(clap::Args)]
struct LocalTlsArgs {
    /// This node's certificate (PEM; `cheferd certs node` makes it). Its DNS name is
    /// the node's name.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The site CA the global controller's certificate must chain to.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// The name the global controller's certificate must carry (default: the host of
    /// --global).
    #[arg(long, value_name = "NAME")]
    tls_server_name: Option<String>,
    /// Talk plaintext gRPC to a global controller run with --insecure-plaintext.
    #[arg(long)]
    insecure_plaintext: bool,
}

/// `cheferd global`'s standby flags (see `cheferd_controller::standby`).
#[derive(Args)]
struct StandbyArgs {
    /// Run as one of several global controllers, the leader elected in this etcd
    /// cluster (client URLs, comma-separated). Without it, the only global controller.
    #[arg(long, value_name = "URL[,URL…]", value_delimiter = ',')]
    etcd: Vec<String>,
    /// The etcd key prefix of this cluster's election and administrative changes.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "/padll",
        requires = "etcd"
    )]
    etcd_prefix: String,
    /// Seconds a dead leader keeps the leadership (its etcd lease's TTL).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10,
        requires = "etcd",
        allow_negative_numbers = true,
        value_parser = whole(1..=3600u64)
    )]
    etcd_ttl: u64,
    /// The URL local controllers reach this global controller by, as in their
    /// `--global` lists (default: http(s)://LISTEN).
    #[arg(long, value_name = "URL", requires = "etcd")]
    advertise: Option<String>,
    /// The CA of etcd's server certificates: talk to etcd over TLS (https:// URLs).
    #[arg(long, value_name = "PEM", requires = "etcd")]
    etcd_ca: Option<PathBuf>,
    /// A client certificate for etcd (its `--client-cert-auth`), with --etcd-key.
    #[arg(long, value_name = "PEM", requires_all = ["etcd_key", "etcd_ca"])]
    etcd_cert: Option<PathBuf>,
    /// The key of --etcd-cert.
    #[arg(long, value_name = "PEM", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
}

#[derive(Subcommand)]
enum CertsCommand {
    /// A new site CA: DIR/ca.pem and DIR/ca.key (0600). Keep ca.key off the compute
    /// nodes.
    Ca {
        /// Directory to write to (created 0700 if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "cheferd site CA")]
        name: String,
        /// Days of validity.
        #[arg(long, default_value_t = 3650)]
        #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_DAYS))]
        days: u32,
    },
    /// One certificate per node NAME, signed by the CA: OUT/node-NAME.pem and
    /// OUT/node-NAME.key (0600), for `cheferd local --tls-cert/--tls-key` (each node's
    /// `cheferd local` takes its name from its certificate).
    Node(SignArgs),
    /// The global controller's certificate for the host names and IP addresses local
    /// controllers reach it by (each one in --global URLs must be listed):
    /// OUT/server.pem and OUT/server.key (0600).
    Server(SignArgs),
}

/// What `cheferd certs node` and `cheferd certs server` sign.
#[derive(Args)]
struct SignArgs {
    /// Node names, or the server's host names and addresses.
    #[arg(required = true)]
    names: Vec<String>,
    /// The CA directory (`cheferd certs ca --out`).
    #[arg(long, value_name = "DIR")]
    ca: PathBuf,
    /// Directory to write to (created 0700 if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Days of validity.
    #[arg(long, default_value_t = 825)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_DAYS))]
    days: u32,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// Role (single, leader or follower), term, leader, etcd and lease.
    Status,
    /// Attached local controllers.
    Nodes,
    /// Jobs with usage, demand and assigned rate per resource.
    Jobs,
    /// Registered stages.
    Stages,
    /// Live jobs view, refreshed every second (Ctrl-C to quit).
    Top {
        /// Print once and exit.
        #[arg(long)]
        once: bool,
    },
    /// The whole state as JSON (registry, last cycle, configuration).
    Dump,
    /// Change a resource's policy.
    SetPolicy {
        /// `MOUNT:CLASS`.
        resource: String,
        /// Policy name.
        policy: String,
    },
    /// Change a resource's capacity Max_R.
    SetMaxRate {
        /// `MOUNT:CLASS`.
        resource: String,
        /// Rate (`110000`, `110k`, `20GiB/s`).
        #[arg(allow_negative_numbers = true)]
        rate: String,
    },
    /// Change a job's priority, or its demand / static limit on a resource.
    SetJob {
        /// Job id.
        job: String,
        /// New priority (> 0).
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<f64>,
        /// The resource for --demand / --limit.
        #[arg(long)]
        resource: Option<String>,
        /// New demand (a rate: `40000`, `40k`, `1GiB/s`).
        #[arg(long, allow_negative_numbers = true)]
        demand: Option<String>,
        /// New static limit (a rate), or `none` to lift it.
        #[arg(long, allow_negative_numbers = true)]
        limit: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return parse_failure(error),
    };
    // Daemons log their lifecycle; one-shot commands only what goes wrong.
    let default_level = match cli.command {
        Command::Global(_) | Command::Local(_) => "info",
        Command::Bench(_) | Command::BenchLocals(_) => "error",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match try_main(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("cheferd: {failure}");
            ExitCode::from(failure.kind.exit_code())
        }
    }
}

/// Each subcommand's entry function. The controllers, the demo and `ctl` run in an
/// async runtime; the others are plain code.
fn try_main(command: Command) -> Result<(), Failure> {
    match command {
        Command::Global(args) => in_runtime(run_global(args)),
        Command::Local(args) => in_runtime(run_local(args)),
        Command::Demo(args) => in_runtime(run_demo(args)),
        Command::Bench(args) => bench(args),
        Command::BenchLocals(args) => in_runtime(bench_locals(args)),
        Command::Replay(args) => replay(args),
        Command::Simulate(args) => run_policies(policies::cli::Command::Simulate(args)),
        Command::Allocate(args) => run_policies(policies::cli::Command::Allocate(args)),
        Command::Trace(args) => run_policies(policies::cli::Command::Trace(args)),
        Command::Place(args) => run_policies(policies::cli::Command::Place(args)),
        Command::Certs(command) => certs(command),
        Command::Ctl(args) => in_runtime(async { ctl(args).await.map_err(CtlError::into_kind) }),
        Command::Generate(what) => {
            cli_docs::generate(&what, Cli::command(), &man_pages::EXTRAS).map_err(usage)
        }
    }
}

/// Why `cheferd` failed.
type Failure = padll_wire::exit::Failure<Kind>;

/// The kinds of failure, each with its exit code.
#[derive(Clone, Copy, Debug)]
enum Kind {
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
fn usage(error: impl std::fmt::Display) -> Failure {
    Failure::new(Kind::Usage, error.to_string())
}

/// A run-time failure: `error` is the one line shown.
fn failed(error: impl std::fmt::Display) -> Failure {
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

impl From<policies::cli::FailureKind> for Kind {
    fn from(kind: policies::cli::FailureKind) -> Kind {
        match kind {
            policies::cli::FailureKind::Usage => Kind::Usage,
            policies::cli::FailureKind::Io => Kind::Failed,
        }
    }
}

/// Runs `task` to its end in a runtime of its own.
fn in_runtime(task: impl std::future::Future<Output = Result<(), Failure>>) -> Result<(), Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| failed(format!("cannot start the runtime: {e}")))?
        .block_on(task)
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

async fn run_demo(args: DemoArgs) -> Result<(), Failure> {
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
    demo::run(&options, &exe, &library).await.map_err(failed)
}

async fn bench_locals(args: BenchLocalsArgs) -> Result<(), Failure> {
    cheferd_controller::bench::run_locals(args.url, args.locals, args.stages)
        .await
        .map_err(failed)
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

/// The replayer runs without the async runtime: it is plain threads doing file I/O,
/// usually under the stage.
fn replay(args: ReplayArgs) -> Result<(), Failure> {
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

/// Each row runs in a runtime of its own, so nothing of one row lingers in the next.
fn bench(args: BenchArgs) -> Result<(), Failure> {
    let BenchArgs {
        locals,
        stages,
        cycles,
        interval_ms,
        policy: name,
    } = args;
    policy::check(&name).map_err(|e| usage(format!("--policy: {e}")))?;
    let interval = std::time::Duration::from_millis(interval_ms);
    let mut rows = Vec::new();
    for n in locals {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| failed(format!("cannot start the runtime: {e}")))?;
        rows.extend(
            runtime
                .block_on(cheferd_controller::bench::run(
                    n, stages, cycles, interval, &name,
                ))
                .map_err(failed)?,
        );
    }
    print!("{}", cheferd_controller::bench::table(&rows));
    Ok(())
}

async fn run_global(args: GlobalArgs) -> Result<(), Failure> {
    let GlobalArgs {
        config,
        listen,
        admin_socket,
        metrics: metrics_addr,
        tls,
        standby,
    } = args;
    let text = std::fs::read_to_string(&config)
        .map_err(|e| usage(format!("cannot read --config {}: {e}", config.display())))?;
    let parsed = GlobalConfig::parse(&text, &policy::check)
        .map_err(|e| usage(format!("{}: {e}", config.display())))?;
    for warning in parsed.warnings() {
        tracing::warn!("{}: {warning}", config.display());
    }
    let server_tls = global_tls(&config, &parsed.tls, tls)?;
    let standby = standby_options(standby, &listen, server_tls.as_ref())?;
    let server_tls = server_tls
        .map(|tls| tls.load())
        .transpose()
        .map_err(usage)?;
    let mut stop = bounds::StopSignals::install().map_err(failed)?;
    // Removed when this function returns: at a stop, or when starting fails below.
    let (admin_listener, _admin_file) = bounds::bind_unix(&admin_socket, 0o666).map_err(usage)?;
    let grpc = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| usage(format!("cannot listen on --listen {listen}: {e}")))?;
    let metrics_listener = match &metrics_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| usage(format!("cannot listen on --metrics {addr}: {e}")))?,
        ),
        None => None,
    };
    let admins = parsed.admins.clone();
    let controller = Controller::new(parsed).map_err(usage)?;
    let secured = if server_tls.is_some() {
        "mutual TLS"
    } else {
        "PLAINTEXT"
    };
    let bound = |listener: &tokio::net::TcpListener| {
        listener
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string())
    };
    tracing::info!(
        version = cheferd_controller::VERSION,
        config = %config.display(),
        listen = %bound(&grpc),
        grpc = secured,
        admin_socket = %admin_socket.display(),
        metrics = %metrics_listener.as_ref().map_or("off".into(), bound),
        "global controller started"
    );
    // Each task runs for the life of the process: the first to end (or panic) ends it.
    let mut tasks = Supervisor::default();
    if let Some(listener) = metrics_listener {
        let controller = controller.clone();
        tasks.spawn("the metrics endpoint", async move {
            metrics::serve(controller, listener).await;
            Ok(())
        });
    }
    {
        let controller = controller.clone();
        tasks.spawn("the admin socket", async move {
            admin::serve(controller, admin_listener, admins)
                .await
                .map_err(usage)
        });
    }
    {
        let controller = controller.clone();
        match standby {
            Some(options) => tasks.spawn("the standby", async move {
                cheferd_controller::standby::run(controller, options)
                    .await
                    .map_err(failed)
            }),
            None => tasks.spawn("the control loop", async move {
                controller.run_loop().await;
                Ok(())
            }),
        }
    }
    tasks.spawn("the gRPC server", async move {
        global::serve(controller, grpc, server_tls)
            .await
            .map_err(failed)
    });
    tokio::select! {
        ended = tasks.first_end() => Err(ended.into_error(failed)),
        signal = stop.recv() => {
            tracing::info!(signal, "global controller stopped");
            Ok(())
        }
    }
}

/// The standby's options, if `--etcd` was given, checked.
fn standby_options(
    args: StandbyArgs,
    listen: &str,
    tls: Option<&cheferd_controller::tls::ServerTls>,
) -> Result<Option<cheferd_controller::standby::StandbyOptions>, Failure> {
    if args.etcd.is_empty() {
        return Ok(None);
    }
    if !args.etcd_prefix.starts_with('/') || args.etcd_prefix.len() > 256 {
        return Err(usage(format!(
            "--etcd-prefix '{}' must start with / and be at most 256 bytes",
            args.etcd_prefix
        )));
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let advertise = args
        .advertise
        .unwrap_or_else(|| format!("{scheme}://{listen}"));
    if !advertise.starts_with(&format!("{scheme}://")) {
        return Err(usage(format!(
            "--advertise '{advertise}' must be a {scheme}:// URL (as in the local controllers' --global)"
        )));
    }
    let etcd_tls = match (args.etcd_ca, args.etcd_cert, args.etcd_key) {
        (Some(ca), cert, key) => {
            let trust = cheferd_controller::tls::trusting("--etcd-ca", &ca).map_err(usage)?;
            Some(match (cert, key) {
                (Some(cert), Some(key)) => trust.identity(
                    cheferd_controller::tls::identity("--etcd-cert", &cert, "--etcd-key", &key)
                        .map_err(usage)?,
                ),
                _ => trust,
            })
        }
        _ => None,
    };
    Ok(Some(cheferd_controller::standby::StandbyOptions {
        endpoints: args.etcd,
        etcd_tls,
        prefix: args.etcd_prefix.trim_end_matches('/').to_string(),
        advertise,
        ttl: Duration::from_secs(args.etcd_ttl),
        peer_tls: tls
            .map(|tls| tls.peer_client())
            .transpose()
            .map_err(usage)?,
    }))
}

async fn run_local(args: LocalArgs) -> Result<(), Failure> {
    let LocalArgs {
        node,
        socket,
        global,
        tls,
        report_ms,
        max_connections,
        max_connections_per_uid,
        max_jobs_per_uid,
        max_pending_bytes,
        max_pending_bytes_per_uid,
        default_limit,
    } = args;
    let limits = LocalLimits {
        max_connections,
        max_connections_per_uid,
        max_jobs_per_uid,
        max_pending_bytes,
        max_pending_bytes_per_uid,
    };
    if !global
        .split(',')
        .all(|url| url.starts_with("http://") || url.starts_with("https://"))
    {
        return Err(usage(format!(
            "--global '{global}' must be a URL such as http://10.0.0.1:50051"
        )));
    }
    let tls = local_tls(tls)?;
    // With a certificate, the node is who the certificate says (its first DNS name).
    let certified = match &tls {
        Some(tls) => Some(tls.node_names().map_err(usage)?.remove(0)),
        None => None,
    };
    let node = node
        .or(certified)
        .unwrap_or_else(padll_wire::config::hostname);
    let mut stop = bounds::StopSignals::install().map_err(failed)?;
    let run = local::run(LocalOptions {
        node,
        socket,
        global,
        tls,
        report_interval: Duration::from_millis(report_ms),
        limits,
        default_limit: default_limit.unwrap_or(local::DefaultLimit::BuiltIn),
    });
    let signal = tokio::select! {
        result = run => return result.map_err(usage),
        signal = stop.recv() => signal,
    };
    // `run`, which owns the socket file, is dropped by now: the socket is gone.
    tracing::info!(signal, "local controller stopped");
    Ok(())
}

async fn ctl(args: CtlArgs) -> Result<(), CtlError> {
    let CtlArgs {
        socket,
        json,
        command,
    } = args;
    let socket = socket.as_path();
    // `--json`: each view prints the part of the admin socket's snapshot it shows.
    let snapshot_json = || admin::request(socket, &AdminRequest::Snapshot);
    match command {
        CtlCommand::Status if json => println!("{}", snapshot_json().await?["leadership"]),
        CtlCommand::Status => print!("{}", admin::snapshot(socket).await?.leadership.render()),
        CtlCommand::Nodes if json => println!("{}", snapshot_json().await?["nodes"]),
        CtlCommand::Stages if json => println!("{}", snapshot_json().await?["stages"]),
        CtlCommand::Jobs | CtlCommand::Top { once: true } if json => {
            println!("{}", jobs_json(snapshot_json().await?))
        }
        CtlCommand::Top { .. } if json => loop {
            println!("{}", jobs_json(snapshot_json().await?));
            tokio::time::sleep(Duration::from_secs(1)).await;
        },
        CtlCommand::Nodes => print!("{}", admin::nodes_table(&admin::snapshot(socket).await?)),
        CtlCommand::Jobs => print!("{}", admin::jobs_table(&admin::snapshot(socket).await?)),
        CtlCommand::Stages => print!("{}", admin::stages_table(&admin::snapshot(socket).await?)),
        CtlCommand::Top { once } => loop {
            let table = admin::jobs_table(&admin::snapshot(socket).await?);
            if once {
                print!("{table}");
                break;
            }
            // Clear the screen only on a terminal: a pipe or file gets one table a second.
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                print!("\x1b[2J\x1b[H{table}");
            } else {
                println!("{table}");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        },
        CtlCommand::Dump => {
            let snapshot = admin::request(socket, &AdminRequest::Snapshot).await?;
            let config = admin::request(socket, &AdminRequest::Config).await?;
            let dump = serde_json::json!({ "state": snapshot, "config": config });
            println!(
                "{}",
                serde_json::to_string_pretty(&dump).unwrap_or_default()
            );
        }
        CtlCommand::SetPolicy { resource, policy } => {
            send_change(socket, Change::Policy { resource, policy }, json).await?
        }
        CtlCommand::SetMaxRate { resource, rate } => {
            send_change(socket, Change::MaxRate { resource, rate }, json).await?
        }
        CtlCommand::SetJob {
            job,
            priority,
            resource,
            demand,
            limit,
        } => {
            let change = Change::Job {
                job,
                priority,
                resource,
                demand,
                limit,
            };
            send_change(socket, change, json).await?
        }
    }
    Ok(())
}

/// Sends a change, checked first so that a typo is bad usage (exit 2) naming the value;
/// the controller refuses (exit 1) what only it can judge, such as a resource it does
/// not share.
async fn send_change(socket: &std::path::Path, change: Change, json: bool) -> Result<(), CtlError> {
    change
        .check()
        .map_err(|error| CtlError::new(CtlErrorKind::Usage, error.to_string()))?;
    print_ok(
        admin::request(socket, &AdminRequest::Change { change }).await?,
        json,
    );
    Ok(())
}

/// The jobs view of a snapshot for `ctl jobs --json` and `ctl top --json`: what the
/// table shows (cycle, latency, resources, every job's share of each).
fn jobs_json(mut snapshot: serde_json::Value) -> serde_json::Value {
    let keys = [
        "cycle",
        "latency_ms_p50",
        "latency_ms_p99",
        "resources",
        "shares",
    ];
    let view = keys.map(|key| (key.to_string(), snapshot[key].take()));
    serde_json::Value::Object(view.into_iter().collect())
}

fn print_ok(value: serde_json::Value, json: bool) {
    match value {
        serde_json::Value::String(s) if !json => println!("{s}"),
        other => println!("{other}"),
    }
}

/// The global controller's TLS files: flags over `[tls]` (whose relative paths are
/// taken from the configuration file's directory); `None` only when plaintext is asked
/// for.
fn global_tls(
    config_path: &std::path::Path,
    settings: &cheferd_controller::config::TlsSettings,
    flags: GlobalTlsArgs,
) -> Result<Option<cheferd_controller::tls::ServerTls>, Failure> {
    let base = config_path.parent().unwrap_or(std::path::Path::new("."));
    let from_config = |path: &Option<PathBuf>| path.as_ref().map(|p| base.join(p));
    let cert = flags.tls_cert.or_else(|| from_config(&settings.cert));
    let key = flags.tls_key.or_else(|| from_config(&settings.key));
    let client_ca = flags
        .tls_client_ca
        .or_else(|| from_config(&settings.client_ca));
    let plaintext = flags.insecure_plaintext || settings.insecure_plaintext;
    match (cert, key, client_ca) {
        (None, None, None) if plaintext => {
            tracing::warn!(
                "--insecure-plaintext: the gRPC port is neither encrypted nor authenticated; \
                 anyone who reaches it can pose as any node"
            );
            Ok(None)
        }
        (None, None, None) => Err(usage(
            "the gRPC port needs --tls-cert, --tls-key and \
             --tls-client-ca (or [tls] in the configuration; `cheferd certs` makes them), \
             or --insecure-plaintext",
        )),
        _ if plaintext => Err(usage(
            "--insecure-plaintext conflicts with the TLS files given",
        )),
        (Some(cert), Some(key), Some(client_ca)) => Ok(Some(cheferd_controller::tls::ServerTls {
            cert,
            key,
            client_ca,
        })),
        (cert, key, _) => Err(usage(format!(
            "mutual TLS needs {} as well",
            if cert.is_none() {
                "--tls-cert"
            } else if key.is_none() {
                "--tls-key"
            } else {
                "--tls-client-ca"
            }
        ))),
    }
}

/// A local controller's TLS files; `None` only when plaintext is asked for.
fn local_tls(flags: LocalTlsArgs) -> Result<Option<cheferd_controller::tls::ClientTls>, Failure> {
    match (flags.tls_cert, flags.tls_key, flags.tls_ca) {
        (None, None, None) if flags.insecure_plaintext => {
            tracing::warn!(
                "--insecure-plaintext: the stream to the global controller is neither \
                 encrypted nor authenticated"
            );
            Ok(None)
        }
        (None, None, None) => Err(usage(
            "the global controller is reached with --tls-cert, \
             --tls-key and --tls-ca (`cheferd certs` makes them), or --insecure-plaintext",
        )),
        _ if flags.insecure_plaintext => Err(usage(
            "--insecure-plaintext conflicts with the TLS files given",
        )),
        (Some(cert), Some(key), Some(ca)) => Ok(Some(cheferd_controller::tls::ClientTls {
            cert,
            key,
            ca,
            server_name: flags.tls_server_name,
        })),
        (cert, key, _) => Err(usage(format!(
            "mutual TLS needs {} as well",
            if cert.is_none() {
                "--tls-cert"
            } else if key.is_none() {
                "--tls-key"
            } else {
                "--tls-ca"
            }
        ))),
    }
}

/// `cheferd certs …`: prints the files written.
fn certs(command: CertsCommand) -> Result<(), Failure> {
    use cheferd_controller::tls::{make_ca, make_leaf, Role};
    let written = match command {
        CertsCommand::Ca { out, name, days } => make_ca(&out, &name, days),
        CertsCommand::Node(SignArgs {
            names,
            ca,
            out,
            days,
        }) => {
            // Check every name before writing anything.
            for name in &names {
                cheferd_controller::tls::check_name(name).map_err(usage)?;
            }
            let mut all = Vec::new();
            for name in &names {
                all.extend(
                    make_leaf(Role::Node, std::slice::from_ref(name), &ca, &out, days)
                        .map_err(usage)?,
                );
            }
            Ok(all)
        }
        CertsCommand::Server(SignArgs {
            names,
            ca,
            out,
            days,
        }) => make_leaf(Role::Server, &names, &ca, &out, days),
    }
    .map_err(usage)?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}
