//! `cheferd demo`: the whole system on one machine, with no configuration file.
//!
//! It starts a global and a local controller in this process, then runs jobs — the
//! replayer (`cheferd replay`) under the stage (`libpadll.so`), each replaying its
//! share of a bursty metadata trace against a scratch directory — joining one after
//! another. Every second it prints each job's usage and assigned rate; at the end it
//! writes the per-job rates over time (CSV, PNG, SVG) and a summary: the aggregate
//! against `Max_R`, and each job's share against its demand.

use crate::config::Resource;
use crate::config::{ConfigError, GlobalConfig, JobConfig, ResourceConfig};
use crate::global::{self, Controller};
use crate::local::{self, LocalOptions};
use crate::tls::{CertsError, TlsFileError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Demo settings (all have defaults).
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Seconds of load per job.
    pub seconds: usize,
    /// Seconds between two jobs joining.
    pub stagger: usize,
    /// Number of jobs (1–4).
    pub jobs: usize,
    /// `Max_R` of the scratch directory's metadata, ops/s.
    pub max_rate: f64,
    /// Policy.
    pub policy: String,
    /// Where the CSV, plots and summary go.
    pub out: PathBuf,
}

/// Demands of the four jobs, as fractions of `Max_R` (PADLL Table I: 15, 25, 30 and
/// 40 kops/s of 110).
const DEMANDS: [f64; 4] = [15.0 / 110.0, 25.0 / 110.0, 30.0 / 110.0, 40.0 / 110.0];

struct Jobs(Vec<Child>);

impl Drop for Jobs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Why the demo stopped.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// `--jobs` out of range.
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
    /// The gRPC port could not be opened.
    #[error("cannot listen: {0}")]
    Listen(std::io::Error),
    /// A job's process could not be started (its number).
    #[error("cannot start job {job}: {error}")]
    StartJob {
        /// 1-based.
        job: usize,
        /// Why.
        error: std::io::Error,
    },
    /// The demo's own configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Its throwaway certificates could not be made.
    #[error(transparent)]
    Certs(#[from] CertsError),
    /// Or not loaded.
    #[error(transparent)]
    Tls(#[from] TlsFileError),
    /// The plot could not be drawn.
    #[error(transparent)]
    Plot(#[from] policies::plot::PlotError),
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

/// Runs the demo. `cheferd` is this executable (the jobs run its `replay`), `library`
/// the stage.
pub async fn run(options: &DemoOptions, cheferd: &Path, library: &Path) -> Result<(), DemoError> {
    if !(1..=4).contains(&options.jobs) {
        return Err(DemoError::Jobs(options.jobs));
    }
    let base = std::env::temp_dir().join(format!("cheferd-demo-{}", std::process::id()));
    let scratch = base.join("scratch");
    std::fs::create_dir_all(&scratch).map_err(io_error("create", &scratch))?;
    std::fs::create_dir_all(&options.out).map_err(io_error("create --out", &options.out))?;
    let result = run_in(options, cheferd, library, &base, &scratch).await;
    let _ = std::fs::remove_dir_all(&base);
    result
}

async fn run_in(
    options: &DemoOptions,
    cheferd: &Path,
    library: &Path,
    base: &Path,
    scratch: &Path,
) -> Result<(), DemoError> {
    let mount = scratch.display().to_string();
    let resource = Resource {
        mount: mount.clone(),
        class: padll_wire::ops::Class::Metadata,
    };
    let job_names: Vec<String> = (1..=options.jobs).map(|j| format!("job-{j}")).collect();
    let config = GlobalConfig {
        interval_ms: 1000,
        resources: vec![ResourceConfig {
            resource: resource.clone(),
            max_rate: resource.own_tokens(options.max_rate as u64),
            policy: options.policy.clone(),
        }],
        jobs: job_names
            .iter()
            .zip(DEMANDS)
            .map(|(name, share)| {
                let job = JobConfig {
                    priority: 1.0,
                    demand: [(
                        resource.clone(),
                        resource.own_tokens((share * options.max_rate).round() as u64),
                    )]
                    .into(),
                    ..JobConfig::default()
                };
                (name.clone(), job)
            })
            .collect(),
        ..GlobalConfig::default()
    };

    // The control plane, in this process.
    let controller = Controller::new(config)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(DemoError::Listen)?;
    // Local ↔ global runs as in production, with mutual TLS: a throwaway site CA, a
    // server certificate for loopback and the node's certificate, made here (in the
    // temporary directory, removed at the end) so the demo needs no setup.
    let tls_dir = base.join("tls");
    crate::tls::make_loopback_site(&tls_dir, &["demo-node"])?;
    let server_tls = crate::tls::loopback_server(&tls_dir).load()?;
    let url = format!(
        "https://{}",
        listener.local_addr().map_err(DemoError::Listen)?
    );
    println!(
        "local ↔ global: mutual TLS (throwaway CA and certificates in {}, removed at the end)",
        tls_dir.display()
    );
    tokio::spawn(global::serve(
        controller.clone(),
        listener,
        Some(server_tls),
    ));
    tokio::spawn(controller.clone().run_loop());
    let socket = base.join("local.sock");
    tokio::spawn(local::run(LocalOptions {
        limits: local::LocalLimits::default(),
        node: "demo-node".into(),
        socket: socket.clone(),
        global: url,
        tls: Some(crate::tls::loopback_node(&tls_dir, "demo-node")),
        report_interval: Duration::from_millis(250),
    }));

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
    policies::trace::write(&mut file, &traces, "cheferd demo")
        .map_err(io_error("write", &trace_path))?;

    println!(
        "PADLL demo: {} jobs replay a bursty metadata trace on {mount}\n  Max_R = {:.0} ops/s, policy {}, demands {}\n",
        options.jobs,
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

    let mut jobs = Jobs(Vec::new());
    let started = Instant::now();
    let mut series: Vec<Vec<f64>> = Vec::new();
    let mut next_tick = started + Duration::from_secs(1);
    loop {
        let elapsed = started.elapsed().as_secs() as usize;
        while jobs.0.len() < options.jobs && elapsed >= jobs.0.len() * options.stagger {
            let j = jobs.0.len() + 1;
            let dir = scratch.join(format!("job-{j}"));
            std::fs::create_dir_all(&dir).map_err(io_error("create", &dir))?;
            let child = Command::new(cheferd)
                .arg("replay")
                .arg("--trace")
                .arg(&trace_path)
                .args(["--job", &j.to_string(), "--threads", "3", "--dir"])
                .arg(&dir)
                .env("LD_PRELOAD", library)
                .env("PADLL_MOUNTS", &mount)
                .env("PADLL_CONTROLLER", &socket)
                .env("PADLL_JOB_ID", &job_names[j - 1])
                .stdout(Stdio::null())
                .spawn()
                .map_err(|error| DemoError::StartJob { job: j, error })?;
            jobs.0.push(child);
        }
        tokio::time::sleep_until(next_tick.into()).await;
        next_tick += Duration::from_secs(1);

        let snapshot = controller.snapshot();
        let row: Vec<f64> = job_names
            .iter()
            .map(|name| {
                snapshot
                    .shares
                    .iter()
                    .find(|s| &s.job == name)
                    .map_or(0.0, |s| s.usage)
            })
            .collect();
        let line: String = job_names
            .iter()
            .map(
                |name| match snapshot.shares.iter().find(|s| &s.job == name) {
                    Some(s) => format!(" {:>8.0}/{:<8.0}", s.usage, s.assigned),
                    None => format!(" {:>17}", "-"),
                },
            )
            .collect();
        let total: f64 = row.iter().sum();
        println!(
            "{:>4}{line} {total:>9.0} {:>7.0}",
            series.len() + 1,
            options.max_rate
        );
        series.push(row);

        let all_started = jobs.0.len() == options.jobs;
        let all_done = all_started
            && jobs
                .0
                .iter_mut()
                .all(|c| matches!(c.try_wait(), Ok(Some(_))));
        if all_done
            || started.elapsed()
                > Duration::from_secs((seconds + options.jobs * options.stagger + 120) as u64)
        {
            break;
        }
    }
    drop(jobs);
    summarize(options, &job_names, &series)
}

fn summarize(
    options: &DemoOptions,
    names: &[String],
    series: &[Vec<f64>],
) -> Result<(), DemoError> {
    let csv_path = options.out.join("rates.csv");
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
    let png = options.out.join("rates.png");
    let svg = options.out.join("rates.svg");
    let title = format!(
        "cheferd demo — {} with Max_R {:.0} ops/s",
        options.policy, options.max_rate
    );
    policies::plot::plot_rates(
        &title,
        names,
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
    let mut totals: BTreeMap<&str, f64> = BTreeMap::new();
    for row in settled {
        for (name, v) in names.iter().zip(row) {
            *totals.entry(name).or_default() += v;
        }
    }
    let all: f64 = totals.values().sum();
    for (name, demand) in names.iter().zip(DEMANDS) {
        println!(
            "  {name}: {:.1} % of the operations served (demand {:.0} ops/s)",
            100.0 * totals.get(name.as_str()).copied().unwrap_or(0.0) / all.max(1.0),
            demand * options.max_rate
        );
    }
    println!(
        "  wrote {}, {} and {}",
        csv_path.display(),
        png.display(),
        svg.display()
    );
    Ok(())
}
