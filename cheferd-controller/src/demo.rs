//! `cheferd-lab demo`: the whole system on one machine, with no configuration file.
//!
//! It starts a global and a local controller in this process, then runs jobs — the
//! replayer (`cheferd-lab replay`) under the stage (`libpadll.so`), each replaying its
//! share of a bursty metadata trace against a scratch directory — joining one after
//! another. Every second it prints each job's usage and assigned rate; at the end it
//! writes the per-job rates over time (CSV, PNG, SVG) and a summary: the aggregate
//! against `Max_R`, and per job its demand, the rate it was assigned while all jobs
//! ran, the operations it did and how long it took.

use crate::config::Resource;
use crate::config::{GlobalConfig, JobConfig, ResourceConfig};
use crate::global_process::{self, Cycles, GlobalError, GlobalOptions};
use crate::local::{self, LocalError, LocalOptions};
use crate::supervise::Supervisor;
use crate::tls::CertsError;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Demo settings (all have defaults).
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Seconds of load per job (see [`SECONDS`]).
    pub seconds: usize,
    /// Seconds between two jobs joining (see [`STAGGER`]).
    pub stagger: usize,
    /// Number of jobs (see [`JOBS`]).
    pub jobs: usize,
    /// `Max_R` of the scratch directory's metadata, ops/s (see [`MAX_RATE`]).
    pub max_rate: f64,
    /// Policy.
    pub policy: String,
    /// Where the CSV and plots go; `None`: the demo's directory under the temporary
    /// directory, kept at the end (the rest of it is removed).
    pub out: Option<PathBuf>,
}

/// The demo's bounds of `--seconds`: the trace is generated whole, in memory.
pub const SECONDS: RangeInclusive<usize> = 1..=3600;
/// Of `--stagger`, seconds.
pub const STAGGER: RangeInclusive<usize> = 0..=600;
/// Of `--jobs`: one per demand the demo defines (`DEMANDS`).
pub const JOBS: RangeInclusive<usize> = 1..=4;
/// Of `--max-rate`, ops/s: the smallest still gives every job a demand, the largest is
/// beyond what one machine's metadata operations reach.
pub const MAX_RATE: RangeInclusive<u64> = 100..=1_000_000;

/// Demands of the four jobs, as fractions of `Max_R` (PADLL Table I: 15, 25, 30 and
/// 40 kops/s of 110).
const DEMANDS: [f64; 4] = [15.0 / 110.0, 25.0 / 110.0, 30.0 / 110.0, 40.0 / 110.0];

/// A job's replayer, killed if it still runs when the demo ends.
struct Job {
    process: Child,
    /// Its standard output: a line a second, then its total.
    output: PathBuf,
    joined: Instant,
    /// When it exited, once it has.
    exited: Option<Instant>,
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// What the summary tells of a job: when it joined and exited (seconds since the demo
/// started), and the operations its replayer counted.
struct JobRun {
    joined: f64,
    exited: Option<f64>,
    operations: Option<u64>,
}

/// The system calls a replayer counted: its last line, `# total N calls (M operations) in …`.
fn replayed_operations(output: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(output).ok()?;
    text.lines()
        .last()?
        .strip_prefix("# total ")?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// Seconds after the last job joins before the assigned rates count as "all jobs
/// running": its first control cycles still run on provisional rates.
const SETTLE_SECONDS: u64 = 3;

/// Why the demo stopped.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// `--jobs` out of [`JOBS`].
    #[error("--jobs {0} must be between 1 and 4")]
    Jobs(usize),
    /// A file or directory could not be made or written.
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        /// `create`, `create --out` or `write`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A job's process could not be started (its number).
    #[error("cannot start job {job}: {error}")]
    StartJob {
        /// 1-based.
        job: usize,
        /// Why.
        error: std::io::Error,
    },
    /// Its throwaway certificates could not be made.
    #[error(transparent)]
    Certs(#[from] CertsError),
    /// Its global controller did not start, or stopped.
    #[error(transparent)]
    Global(#[from] GlobalError),
    /// Its local controller did not start, or stopped.
    #[error(transparent)]
    Local(#[from] LocalError),
    /// One of its controllers ended (which and how).
    #[error("{0}")]
    Stopped(String),
    /// The plot could not be drawn.
    #[error(transparent)]
    Plot(#[from] policies::plot::PlotError),
    /// SIGINT or SIGTERM could not be caught.
    #[error(transparent)]
    Signals(#[from] crate::bounds::SignalsError),
    /// Stopped by SIGINT or SIGTERM, its jobs stopped and its files removed.
    #[error("stopped by {signal}: its jobs were stopped and its files removed")]
    Interrupted {
        /// `SIGINT` or `SIGTERM`.
        signal: &'static str,
    },
}

impl DemoError {
    /// The exit code a shell reports for a death by the signal that stopped the demo
    /// (130 for SIGINT, 143 for SIGTERM), if one did.
    pub fn signal_exit_code(&self) -> Option<u8> {
        match self {
            DemoError::Interrupted { signal: "SIGINT" } => Some(128 + libc::SIGINT as u8),
            DemoError::Interrupted { .. } => Some(128 + libc::SIGTERM as u8),
            _ => None,
        }
    }
}

fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> DemoError + 'a {
    move |error| DemoError::Io {
        action,
        path: path.to_path_buf(),
        error,
    }
}

/// Runs the demo. `lab` is this executable, `cheferd-lab` (the jobs run its `replay`), `library`
/// the stage.
pub async fn run(options: &DemoOptions, lab: &Path, library: &Path) -> Result<(), DemoError> {
    if !JOBS.contains(&options.jobs) {
        return Err(DemoError::Jobs(options.jobs));
    }
    let own = std::env::temp_dir().join(format!("cheferd-demo-{}", std::process::id()));
    // What the run needs (scratch directory, certificates, trace, socket) is removed at
    // the end; `own` too unless the results are in it.
    let base = own.join("run");
    let scratch = base.join("scratch");
    std::fs::create_dir_all(&scratch).map_err(io_error("create", &scratch))?;
    let out = options.out.as_ref().unwrap_or(&own);
    std::fs::create_dir_all(out).map_err(io_error("create --out", out))?;
    // Ctrl-C (SIGINT to the whole process group) or a SIGTERM to the demo alone: the
    // run is dropped, which kills its jobs (`Job`), and cleaned up as at the end.
    let mut stop = crate::bounds::StopSignals::install()?;
    let result = tokio::select! {
        result = run_in(options, lab, library, &base, &scratch, out) => result,
        signal = stop.recv() => Err(DemoError::Interrupted { signal }),
    };
    let _ = std::fs::remove_dir_all(&base);
    let _ = std::fs::remove_dir(&own);
    remove_job_files(options.jobs);
    result
}

/// The name of the demo's `j`-th job (from 1), as it shows it.
fn job_name(j: usize) -> String {
    format!("job-{j}")
}

/// The job id of the demo's `j`-th job: its name and this process' pid, so that the
/// files the stage keeps for a job on the node are this run's alone.
fn job_id(j: usize) -> String {
    format!("{}.{}", job_name(j), std::process::id())
}

/// "1 job", "3 jobs".
fn jobs_phrase(jobs: usize) -> String {
    format!("{jobs} job{}", if jobs == 1 { "" } else { "s" })
}

/// The files the stage kept for the demo's jobs in `/dev/shm` (their last rules; a
/// segment if one was left): the jobs cannot recur once the demo is over.
fn remove_job_files(jobs: usize) {
    // SAFETY: geteuid cannot fail and touches no memory.
    let uid = unsafe { libc::geteuid() };
    for id in (1..=jobs).map(job_id) {
        for files in padll_wire::node_files::both_places(uid, &id) {
            let _ = std::fs::remove_file(files.last_rules);
            let _ = std::fs::remove_file(files.segment);
        }
    }
}

async fn run_in(
    options: &DemoOptions,
    lab: &Path,
    library: &Path,
    base: &Path,
    scratch: &Path,
    out: &Path,
) -> Result<(), DemoError> {
    let mount = scratch.display().to_string();
    let resource = Resource {
        mount: mount.clone(),
        class: padll_wire::ops::Class::Metadata,
    };
    let job_names: Vec<String> = (1..=options.jobs).map(job_name).collect();
    let job_ids: Vec<String> = (1..=options.jobs).map(job_id).collect();
    let config = GlobalConfig {
        interval_ms: 1000,
        resources: vec![ResourceConfig {
            resource: resource.clone(),
            max_rate: resource.own_tokens(options.max_rate as u64),
            policy: options.policy.clone(),
            auto: None,
            weights: Default::default(),
        }],
        jobs: job_ids
            .iter()
            .zip(DEMANDS)
            .map(|(id, share)| {
                let job = JobConfig {
                    priority: 1.0,
                    demand: [(
                        resource.clone(),
                        resource.own_tokens((share * options.max_rate).round() as u64),
                    )]
                    .into(),
                    ..JobConfig::default()
                };
                (id.clone(), job)
            })
            .collect(),
        ..GlobalConfig::default()
    };

    // The control plane, in this process. Local ↔ global runs as in production, with
    // mutual TLS: a throwaway site CA, a server certificate for loopback and the node's
    // certificate, made here (in the temporary directory, removed at the end) so the
    // demo needs no setup.
    let tls_dir = base.join("tls");
    crate::tls::make_loopback_site(&tls_dir, &["demo-node"])?;
    let mut global = global_process::start(GlobalOptions {
        config,
        config_file: None,
        listen: "127.0.0.1:0".into(),
        admin_socket: None,
        metrics: None,
        tls: Some(crate::tls::loopback_server(&tls_dir)),
        cycles: Cycles::Loop,
    })
    .await?;
    let controller = global.controller().clone();
    let url = format!("https://{}", global.grpc_address());
    println!(
        "local ↔ global: mutual TLS (throwaway CA and certificates in {}, removed at the end)",
        tls_dir.display()
    );
    let socket = base.join("local.sock");
    // Both controllers run until the demo ends; the first to stop ends it.
    let mut controllers = Supervisor::default();
    controllers.spawn("the global controller", async move {
        Err(DemoError::Global(global.ended().await))
    });
    let local = local::run(LocalOptions {
        limits: local::LocalLimits::default(),
        default_limit: local::DefaultLimit::BuiltIn,
        node: "demo-node".into(),
        socket: socket.clone(),
        global: url,
        tls: Some(crate::tls::loopback_node(&tls_dir, "demo-node")),
        report_interval: Duration::from_millis(250),
    });
    controllers.spawn("the local controller", async move { Ok(local.await?) });

    // A bursty trace (mean 1.3 × Max_R), a quarter of it per job.
    let seconds = options.seconds;
    let aggregate = policies::trace::generate_aggregate(&policies::trace::LoadShape {
        seconds,
        mean: 1.3 * options.max_rate,
        seed: 7,
    });
    let traces = policies::trace::split(&aggregate, &[0.25; 4][..options.jobs]);
    let trace_path = base.join("trace.csv");
    let mut file = std::fs::File::create(&trace_path).map_err(io_error("create", &trace_path))?;
    policies::trace::write(&mut file, &traces, "cheferd-lab demo")
        .map_err(io_error("write", &trace_path))?;

    println!(
        "PADLL demo: {} replay a bursty metadata trace on {mount}\n  Max_R = {:.0} ops/s, policy {}, demands {}\n",
        jobs_phrase(options.jobs),
        options.max_rate,
        options.policy,
        job_names
            .iter()
            .zip(DEMANDS)
            .map(|(n, d)| format!("{n}={:.0}", d * options.max_rate))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let header: String = job_names
        .iter()
        .map(|n| format!(" {:>17}", format!("{n} use/assigned")))
        .collect();
    println!("{:>4}{header} {:>9} {:>7}", "t(s)", "total", "Max_R");

    // The stages of the first job would run unmanaged until the local controller
    // listens: wait for its socket (it binds at once).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut jobs: Vec<Job> = Vec::new();
    let started = Instant::now();
    let mut usage: Vec<Vec<f64>> = Vec::new();
    // Each job's assigned rate, summed over the seconds all jobs ran (and their count).
    let mut assigned_all_running = vec![0.0; options.jobs];
    let mut seconds_all_running = Vec::new();
    let mut next_tick = started + Duration::from_secs(1);
    loop {
        let elapsed = started.elapsed().as_secs() as usize;
        while jobs.len() < options.jobs && elapsed >= jobs.len() * options.stagger {
            let j = jobs.len() + 1;
            let dir = scratch.join(format!("job-{j}"));
            std::fs::create_dir_all(&dir).map_err(io_error("create", &dir))?;
            let output = base.join(format!("job-{j}.out"));
            let stdout = std::fs::File::create(&output).map_err(io_error("create", &output))?;
            let process = Command::new(lab)
                .arg("replay")
                .arg("--trace")
                .arg(&trace_path)
                .args(["--job", &j.to_string(), "--threads", "3", "--dir"])
                .arg(&dir)
                .env("LD_PRELOAD", library)
                .env("PADLL_MOUNTS", &mount)
                .env("PADLL_CONTROLLER", &socket)
                .env("PADLL_JOB_ID", &job_ids[j - 1])
                .stdout(stdout)
                .spawn()
                .map_err(|error| DemoError::StartJob { job: j, error })?;
            jobs.push(Job {
                process,
                output,
                joined: Instant::now(),
                exited: None,
            });
        }
        tokio::select! {
            () = tokio::time::sleep_until(next_tick.into()) => {}
            ended = controllers.first_end() => return Err(ended.into_error(DemoError::Stopped)),
        }
        next_tick += Duration::from_secs(1);
        for job in &mut jobs {
            if job.exited.is_none() && matches!(job.process.try_wait(), Ok(Some(_))) {
                job.exited = Some(Instant::now());
            }
        }

        let snapshot = controller.snapshot();
        let share = |id: &String| snapshot.shares.iter().find(|s| &s.job == id);
        let row: Vec<f64> = job_ids
            .iter()
            .map(|id| share(id).map_or(0.0, |s| s.usage))
            .collect();
        let line: String = job_ids
            .iter()
            .map(|id| match share(id) {
                Some(s) => format!(" {:>8.0}/{:<8.0}", s.usage, s.assigned),
                None => format!(" {:>17}", "-"),
            })
            .collect();
        let total: f64 = row.iter().sum();
        let second = usage.len() + 1;
        println!("{second:>4}{line} {total:>9.0} {:>7.0}", options.max_rate);
        usage.push(row);

        let all_started = jobs.len() == options.jobs;
        let all_running = all_started
            && jobs.iter().all(|job| job.exited.is_none())
            && jobs
                .iter()
                .all(|job| job.joined.elapsed() >= Duration::from_secs(SETTLE_SECONDS));
        if all_running {
            for (sum, id) in assigned_all_running.iter_mut().zip(&job_ids) {
                *sum += share(id).map_or(0.0, |s| s.assigned);
            }
            seconds_all_running.push(second);
        }
        let all_done = all_started && jobs.iter().all(|job| job.exited.is_some());
        if all_done
            || started.elapsed()
                > Duration::from_secs((seconds + options.jobs * options.stagger + 120) as u64)
        {
            break;
        }
    }
    let since_start = |at: Instant| at.duration_since(started).as_secs_f64();
    let runs: Vec<JobRun> = jobs
        .iter()
        .map(|job| JobRun {
            joined: since_start(job.joined),
            exited: job.exited.map(since_start),
            operations: job.exited.and_then(|_| replayed_operations(&job.output)),
        })
        .collect();
    drop(jobs);
    let all_running = AllRunning {
        seconds: &seconds_all_running,
        assigned: assigned_all_running
            .iter()
            .map(|sum| sum / seconds_all_running.len().max(1) as f64)
            .collect(),
    };
    let summary = summarize(options, out, &job_names, &usage, &all_running, &runs);
    // The controllers stop with the runtime, which polls none of their tasks again.
    // Stopped here (the supervisor dropped), the global controller would still run and
    // see its local controller go, and warn after the summary that it detached, as if
    // something had gone wrong.
    tokio::spawn(async move {
        let _controllers = controllers;
        std::future::pending::<()>().await
    });
    summary
}

/// The seconds during which every job ran (past [`SETTLE_SECONDS`]), and each job's
/// mean assigned rate over them.
struct AllRunning<'a> {
    seconds: &'a [usize],
    assigned: Vec<f64>,
}

fn summarize(
    options: &DemoOptions,
    out: &Path,
    names: &[String],
    series: &[Vec<f64>],
    all_running: &AllRunning,
    runs: &[JobRun],
) -> Result<(), DemoError> {
    let csv_path = out.join("rates.csv");
    let mut csv = format!("second,{},total\n", names.join(","));
    for (s, row) in series.iter().enumerate() {
        let values: Vec<String> = row.iter().map(|v| format!("{v:.1}")).collect();
        csv.push_str(&format!(
            "{},{},{:.1}\n",
            s + 1,
            values.join(","),
            row.iter().sum::<f64>()
        ));
    }
    std::fs::write(&csv_path, csv).map_err(io_error("write", &csv_path))?;
    let png = out.join("rates.png");
    let svg = out.join("rates.svg");
    let title = format!(
        "cheferd-lab demo — {} with Max_R {:.0} ops/s",
        options.policy, options.max_rate
    );
    let labels: Vec<String> = names
        .iter()
        .zip(DEMANDS)
        .map(|(name, share)| format!("{name}, demand {:.0}/s", share * options.max_rate))
        .collect();
    policies::plot::plot_rates(
        &title,
        &labels,
        series,
        options.max_rate,
        Some(&png),
        Some(&svg),
    )?;

    // The first seconds run on provisional rates until the first cycles have data.
    let settled = &series[series.len().min(3)..];
    let peak = settled
        .iter()
        .map(|row| row.iter().sum::<f64>())
        .fold(0.0, f64::max);
    let over = settled
        .iter()
        .filter(|row| row.iter().sum::<f64>() > options.max_rate * 1.05)
        .count();
    println!("\nsummary");
    println!(
        "  aggregate: peak {peak:.0} ops/s = {:.1} % of Max_R; {over} of {} one-second windows above Max_R + 5 %",
        100.0 * peak / options.max_rate,
        settled.len()
    );
    print!("{}", job_table(options, names, all_running, runs));
    println!("  rates per second: {}", csv_path.display());
    println!("  plot: {} (and {})", png.display(), svg.display());
    Ok(())
}

/// Per job: its demand (and share of all demands), the rate it was assigned while all
/// jobs ran (and share of `Max_R`), the operations it did and when it ran, under the
/// lines explaining why equal work gives equal operations whatever the shares.
fn job_table(
    options: &DemoOptions,
    names: &[String],
    all_running: &AllRunning,
    runs: &[JobRun],
) -> String {
    let demands: Vec<f64> = DEMANDS[..names.len()]
        .iter()
        .map(|share| share * options.max_rate)
        .collect();
    let all_demands: f64 = demands.iter().sum();
    let all_operations: u64 = runs.iter().filter_map(|run| run.operations).sum();
    let window = match all_running.seconds {
        [] => "never at once: try a smaller --stagger".to_string(),
        [first, .., last] => format!("t = {first}–{last} s"),
        [only] => format!("t = {only} s"),
    };
    let mut table = format!(
        "  Every job replays its own quarter of the trace (whatever --jobs), so each does the\n  \
         same operations: a job assigned less takes longer, and the jobs still running take\n  \
         up the rate of those done.\n  \
         Assigned: the mean rate while every job ran ({window}).\n  \
         {:<6} {:>16} {:>20} {:>19} {:>10}\n",
        "", "demand (share)", "assigned (of Max_R)", "operations (share)", "ran"
    );
    let percent = |part: f64, whole: f64| format!("{:.1} %", 100.0 * part / whole);
    for (j, name) in names.iter().enumerate() {
        let demand = format!("{:.0}/s ({})", demands[j], percent(demands[j], all_demands));
        let assigned = match all_running.seconds {
            [] => "-".to_string(),
            _ => {
                let rate = all_running.assigned[j];
                format!("{rate:.0}/s ({})", percent(rate, options.max_rate))
            }
        };
        let run = runs.get(j);
        let done = match run.and_then(|run| run.operations) {
            Some(n) => format!("{n} ({})", percent(n as f64, all_operations as f64)),
            None => "-".to_string(),
        };
        let ran = match run {
            Some(JobRun {
                joined,
                exited: Some(exited),
                ..
            }) => format!("{joined:.0}–{exited:.0} s"),
            Some(JobRun { joined, .. }) => format!("{joined:.0} s–"),
            None => "-".to_string(),
        };
        table.push_str(&format!(
            "  {name:<6} {demand:>16} {assigned:>20} {done:>19} {ran:>10}\n"
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_job_is_no_jobs() {
        assert_eq!(jobs_phrase(1), "1 job");
        assert_eq!(jobs_phrase(2), "2 jobs");
    }
}
