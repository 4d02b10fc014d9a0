//! `cheferd-lab bench`: control-cycle latency with many local controllers on loopback — from
//! the tick until the last `Enforce` is queued on its stream (collect + compute +
//! enforce), and until every `Enforce` was acknowledged — and the global controller's own CPU
//! time per control interval.
//!
//! The global controller runs in this process, ticking every control interval (200 ms
//! unless told otherwise) as its control loop does; the simulated local controllers run in a child process (`cheferd-lab
//! bench-locals`), as they would on other machines, so this process's CPU time is the
//! global controller's alone (the two still share the cores). Each simulated local
//! controller is a real gRPC client on its own stream; it announces `stages` stages of
//! distinct jobs, pushes a usage report for all of them on the global controller's
//! `Schedule`, acknowledging the latest `Enforce` in it — what a real local controller
//! does, without the stages.
//!
//! Each row is measured twice on the same attachments: with steady usage (the plan does
//! not change, so no rules are sent) and with `Max_R` changed before every cycle (every
//! stage's rules change and every local controller is sent them).

use crate::config::Resource;
use crate::config::{GlobalConfig, ResourceConfig};
use crate::global::{self, Change, Controller};
use crate::global_process::{self, Cycles, GlobalOptions};
use crate::local::ReportClock;
use crate::proto::{
    self, global_client::GlobalClient, global_message, local_message, LocalMessage,
};
use std::convert::Infallible;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

pub mod floor;

/// The default control interval: short, for many cycles in little time, yet long enough
/// for 1 000 local controllers' reports to be received between two cycles.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(200);
/// Cycles run before measuring (after attaching, and after switching modes), so the
/// local controllers' report slots have settled.
const WARM_UP: usize = 5;

/// Result for one number of local controllers, in one mode.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// Simulated local controllers.
    pub locals: usize,
    /// Stages per local controller.
    pub stages: usize,
    /// Whether every stage's rules changed every cycle.
    pub changing: bool,
    /// Cycles measured.
    pub cycles: usize,
    /// Median cycle latency (until the last `Enforce` is queued), ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Median wait for reports due and not yet arrived, ms.
    pub collect_p50_ms: f64,
    /// Median compute step (planning, encoding and queueing the rules), ms.
    pub compute_p50_ms: f64,
    /// Median time from the tick until every `Enforce` was acknowledged, ms, over the
    /// cycles that sent rules (infinite for one whose acks were not all in by the next
    /// tick); `None` if none did.
    pub acked_p50_ms: Option<f64>,
    /// The control interval, ms.
    pub interval_ms: u64,
    /// The global controller's CPU time (user + system) per control interval, ms:
    /// receiving the reports, the cycle, sending the rules and receiving the acks.
    pub global_cpu_ms: f64,
    /// The global controller's resident memory at the end of the row (`VmRSS`), MiB.
    pub rss_mib: f64,
    /// Mean local controllers sent rules per cycle.
    pub enforced: f64,
    /// Mean protocol bytes per local controller per interval (both directions).
    pub bytes_per_local: f64,
    /// The same reads and writes on plain TCP connections ([`floor`]): CPU per control
    /// interval, ms, once measured.
    pub floor_cpu_ms: Option<f64>,
    /// Relays the local controllers attached through (0: each attached directly).
    pub relays: usize,
}

/// Runs the benchmark for `locals` local controllers ticking every `interval`, both
/// modes.
pub async fn run(
    locals: usize,
    relays: usize,
    stages: usize,
    cycles: usize,
    interval: Duration,
    policy: &str,
) -> Result<Vec<BenchRow>, BenchError> {
    raise_descriptor_limit(locals + 256)?;
    let resource = Resource::parse("/scratch:metadata")?;
    let mut config = GlobalConfig {
        interval_ms: interval.as_millis() as u64,
        resources: vec![ResourceConfig {
            resource: resource.clone(),
            max_rate: resource.own_tokens(1_000_000),
            policy: policy.to_string(),
            auto: None,
            weights: Default::default(),
        }],
        ..GlobalConfig::default()
    };
    config.limits.max_nodes = config.limits.max_nodes.max(locals);
    // Plaintext on loopback: the numbers are the control cycle's, not TLS's (the
    // handshake is once per stream; record encryption adds per-byte cost on both ends).
    // The cycles are run here, as the control loop would, to time each.
    let mut global = global_process::start(GlobalOptions {
        config,
        config_file: None,
        listen: "127.0.0.1:0".into(),
        admin_socket: None,
        metrics: None,
        tls: None,
        cycles: Cycles::Caller,
    })
    .await?;
    let controller = global.controller().clone();
    let url = format!("http://{}", global.grpc_address());
    let this = std::env::current_exe().map_err(|error| BenchError::Io {
        what: "locate this executable",
        error,
    })?;
    // Relays run in a process of their own (as on a rack's node), the local
    // controllers attached to them: each process needs a descriptor per connection.
    let (relays_process, urls) = if relays > 0 {
        let mut child = Command::new(&this)
            .args(["bench-relays", "--url", &url])
            .args(["--relays", &relays.to_string()])
            .args(["--locals", &locals.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|error| BenchError::Io {
                what: "start the relays",
                error,
            })?;
        let mut urls = String::new();
        if let Some(stdout) = child.stdout.take() {
            use std::io::BufRead;
            let _ = std::io::BufReader::new(stdout).read_line(&mut urls);
        }
        let relays_process = LocalsProcess(child);
        if urls.trim().is_empty() {
            return Err(BenchError::NoRelays);
        }
        (Some(relays_process), urls.trim().to_string())
    } else {
        (None, url)
    };
    let child = LocalsProcess(
        Command::new(&this)
            .args(["bench-locals", "--url", &urls])
            .args(["--locals", &locals.to_string()])
            .args(["--stages", &stages.to_string()])
            .stdin(Stdio::null())
            .spawn()
            .map_err(|error| BenchError::Io {
                what: "start the simulated local controllers",
                error,
            })?,
    );

    // The cycles run on the runtime's worker, as `cheferd global`'s control loop does
    // (sharing its one thread with the streams), not on this thread beside it.
    let measuring = tokio::spawn(async move {
        let mut rows = measure(&controller, &resource, locals, stages, cycles, interval).await?;
        rows.iter_mut().for_each(|row| row.relays = relays);
        Ok::<_, BenchError>(rows)
    });
    // The global controller's failure (its gRPC server's) ends the benchmark.
    let rows = tokio::select! {
        rows = measuring => match rows {
            Ok(rows) => rows?,
            Err(failed) => std::panic::resume_unwind(failed.into_panic()),
        },
        error = global.ended() => return Err(BenchError::Global(error)),
    };
    drop(child);
    drop(relays_process);
    Ok(rows)
}

/// Both modes' rows, once the simulated local controllers attached to `controller`.
async fn measure(
    controller: &Controller,
    resource: &Resource,
    locals: usize,
    stages: usize,
    cycles: usize,
    interval: Duration,
) -> Result<Vec<BenchRow>, BenchError> {
    // Wait until every local controller and stage is registered, for as long as more
    // keep coming: on a loaded machine 2 000 take minutes (1 749 had attached through
    // 20 relays after 2 minutes beside `stress-ng --cpu 2` and three builds), while
    // none coming for a minute means they never will.
    let mut attached = (0, 0);
    let mut deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let snapshot = controller.snapshot();
        if snapshot.nodes.len() == locals && snapshot.stages.len() == locals * stages {
            break;
        }
        if (snapshot.nodes.len(), snapshot.stages.len()) != attached {
            attached = (snapshot.nodes.len(), snapshot.stages.len());
            deadline = Instant::now() + Duration::from_secs(60);
        }
        if Instant::now() > deadline {
            return Err(BenchError::NotAttached {
                attached: snapshot.nodes.len(),
                locals,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut rows = Vec::new();
    // One tick sequence throughout, as the control loop's, so the report slots the
    // local controllers were given stay valid.
    let mut tick = tokio::time::Instant::now();
    for changing in [false, true] {
        let mut max_rate = 1e6;
        let mut run_cycle = async |tick: &mut tokio::time::Instant| {
            tokio::time::sleep_until(*tick).await;
            let this = *tick;
            *tick += interval;
            if changing {
                max_rate = if max_rate == 1e6 { 0.9e6 } else { 1e6 };
                controller
                    .change(Change::MaxRate {
                        resource: resource.to_string(),
                        rate: max_rate.to_string(),
                    })
                    .map_err(BenchError::Change)?;
            }
            controller.cycle_at(this).await;
            Ok::<_, BenchError>(())
        };
        // The warm-up also sends the rules of the new stages.
        for _ in 0..WARM_UP {
            run_cycle(&mut tick).await?;
        }
        tokio::time::sleep_until(tick).await;
        let bytes_before = controller.protocol_bytes();
        let cpu_before = cpu_time();
        for _ in 0..cycles {
            run_cycle(&mut tick).await?;
        }
        // Whole intervals: the last cycle's acks and the next reports are received.
        tokio::time::sleep_until(tick).await;
        let cpu = cpu_time() - cpu_before;
        let bytes = controller.protocol_bytes() - bytes_before;
        let phases = controller.phases(cycles);
        let median = |f: &dyn Fn(&global::Phases) -> f64| {
            let mut values: Vec<f64> = phases.iter().map(f).collect();
            percentile(&mut values, 0.5)
        };
        let mut latencies: Vec<f64> = phases.iter().map(|p| ms(p.latency)).collect();
        let mut acked: Vec<f64> = phases
            .iter()
            .filter(|p| p.enforced > 0)
            .map(|p| p.acked.map_or(f64::INFINITY, ms))
            .collect();
        rows.push(BenchRow {
            locals,
            stages,
            changing,
            cycles,
            p50_ms: percentile(&mut latencies, 0.5),
            p99_ms: percentile(&mut latencies, 0.99),
            collect_p50_ms: median(&|p| ms(p.collect)),
            compute_p50_ms: median(&|p| ms(p.compute)),
            acked_p50_ms: (!acked.is_empty()).then(|| percentile(&mut acked, 0.5)),
            interval_ms: interval.as_millis() as u64,
            global_cpu_ms: ms(cpu) / cycles as f64,
            rss_mib: resident_mib(),
            enforced: phases.iter().map(|p| p.enforced).sum::<usize>() as f64 / cycles as f64,
            bytes_per_local: bytes as f64 / (cycles * locals) as f64,
            floor_cpu_ms: None,
            relays: 0,
        });
    }
    Ok(rows)
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// More open files needed than the hard limit allows.
    #[error("{needed} open files needed but the hard limit is {hard}")]
    HardLimit {
        /// Descriptors needed.
        needed: usize,
        /// The hard limit.
        hard: libc::rlim_t,
    },
    /// The soft limit could not be raised (to this).
    #[error("cannot raise the open-file limit to {0}")]
    RaiseLimit(usize),
    /// The benchmark's resource was refused.
    #[error(transparent)]
    Resource(#[from] crate::config::ResourceError),
    /// Its configuration was refused.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A system call failed (what it was for).
    #[error("cannot {what}: {error}")]
    Io {
        /// What it was for.
        what: &'static str,
        /// Why.
        error: std::io::Error,
    },
    /// Not every simulated local controller attached within two minutes.
    #[error("only {attached} of {locals} local controllers attached, and no more for a minute")]
    NotAttached {
        /// How many did.
        attached: usize,
        /// How many were started.
        locals: usize,
    },
    /// The relays' process ended before it said where they listen (its error is on
    /// stderr).
    #[error("the relays did not start")]
    NoRelays,
    /// The global controller did not start, or stopped.
    #[error(transparent)]
    Global(#[from] crate::global_process::GlobalError),
    /// A `set-max-rate` change was refused.
    #[error(transparent)]
    Change(#[from] crate::global::ChangeRefused),
}

/// The child process, killed when dropped (whatever way the benchmark ends).
struct LocalsProcess(Child);

impl Drop for LocalsProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn percentile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

/// This process's CPU time (user + system).
fn cpu_time() -> Duration {
    // SAFETY: an all-zero rusage is valid, and getrusage only writes to it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a live local `rusage`: a valid out-pointer of the size getrusage
    // writes.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// This process's resident memory (`VmRSS` of `/proc/self/status`), MiB; 0 if unknown.
fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// `cheferd-lab bench-relays`: `relays` relays attached to `url` for `locals` local
/// controllers, until killed; prints their URLs first, comma-separated, on one line.
pub async fn run_relays(url: String, relays: usize, locals: usize) -> Result<(), BenchError> {
    raise_descriptor_limit(locals + relays + 256)?;
    let mut urls = Vec::new();
    let mut running = Vec::new();
    for _ in 0..relays {
        let listen = |error| BenchError::Io {
            what: "listen for a relay",
            error,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(listen)?;
        urls.push(format!("http://{}", listener.local_addr().map_err(listen)?));
        let options = crate::relay::RelayOptions {
            global: url.clone(),
            upstream_tls: None,
            downstream_tls: None,
        };
        running.push(tokio::spawn(crate::relay::run(listener, options)));
    }
    println!("{}", urls.join(","));
    for relay in running {
        let _ = relay.await;
    }
    Ok(())
}

/// `cheferd-lab bench-locals`: `locals` simulated local controllers attached to `urls`
/// (comma-separated: local controller i to the i-th mod their number), until killed.
pub async fn run_locals(urls: String, locals: usize, stages: usize) -> Result<(), BenchError> {
    raise_descriptor_limit(locals + 256)?;
    let urls: Vec<&str> = urls.split(',').collect();
    let tasks: Vec<_> = (0..locals)
        .map(|i| {
            let url = urls[i % urls.len()].to_string();
            tokio::spawn(simulated_local(url, format!("node{i:04}"), stages))
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    Ok(())
}

async fn simulated_local(url: String, node: String, stages: usize) -> Infallible {
    // A thousand simultaneous connects can overflow the listen backlog, and on a loaded
    // machine a relay may lose its own stream and end those of its nodes: attach again
    // whenever the stream could not be made or ended, as a real local controller does
    // (the process is killed when the benchmark ends).
    loop {
        attach_once(&url, &node, stages).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One attachment, until it could not be made or its stream ended.
async fn attach_once(url: &str, node: &str, stages: usize) {
    let Ok(mut client) = GlobalClient::connect(url.to_string()).await else {
        return;
    };
    let (sender, receiver) = mpsc::unbounded_channel::<LocalMessage>();
    let send = |body| {
        let _ = sender.send(LocalMessage { body: Some(body) });
    };
    send(local_message::Body::Register(proto::Register {
        node: node.to_string(),
        version: proto::VERSION,
    }));
    for stage_id in 1..=stages as u64 {
        send(local_message::Body::StageJoined(proto::StageJoined {
            stage: Some(proto::Stage {
                stage_id,
                job_id: format!("{node}-job{stage_id}"),
                job_size: 1,
                mountpoints: vec!["/scratch".into()],
                ..proto::Stage::default()
            }),
            announced: false,
        }));
    }
    let Ok(response) = client.attach(UnboundedReceiverStream::new(receiver)).await else {
        return;
    };
    let mut inbound = response.into_inner();
    let mut clock = ReportClock::default();
    let mut applied = 0;
    loop {
        tokio::select! {
            message = inbound.message() => match message.ok().flatten().and_then(|m| m.body) {
                Some(global_message::Body::Schedule(schedule)) => clock.schedule(&schedule),
                Some(global_message::Body::Enforce(enforce)) => applied = applied.max(enforce.cycle),
                Some(global_message::Body::Registered(_) | global_message::Body::PlaceReply(_)) => {}
                None => return,
            },
            cycle = clock.next() => send(local_message::Body::Usage(proto::Usage {
                cycle,
                applied,
                stages: (1..=stages as u64)
                    .map(|stage_id| proto::StageUsage {
                        stage_id,
                        resources: vec![proto::ResourceUsage {
                            resource: 0, // its only resource, /scratch:metadata
                            rate: 1000.0 + stage_id as f64,
                            limit: 2000,
                            latency: Vec::new(),
                        }],
                    })
                    .collect(),
            })),
        }
    }
}

/// One descriptor per local controller in each process: raise the soft limit towards
/// the hard one, or say why the run cannot work.
fn raise_descriptor_limit(needed: usize) -> Result<(), BenchError> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a live local `rlimit`: a valid out-pointer of the size getrlimit
    // writes.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if limit.rlim_cur as usize >= needed {
        return Ok(());
    }
    if (limit.rlim_max as usize) < needed {
        return Err(BenchError::HardLimit {
            needed,
            hard: limit.rlim_max,
        });
    }
    limit.rlim_cur = needed as libc::rlim_t;
    // SAFETY: valid pointer; raising the soft limit up to the hard one is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(BenchError::RaiseLimit(needed));
    }
    Ok(())
}

/// The benchmark table in Markdown.
pub fn table(rows: &[BenchRow]) -> String {
    let mut out = String::from(
        "| local controllers | stages each | rules change | interval (ms) | cycles | p50 cycle (ms) | p99 (ms) | p50 collect wait (ms) | p50 compute + send (ms) | p50 until all acks (ms) | global CPU per interval (ms) | global CPU (% of a core) | global RSS (MiB) | locals sent rules | bytes per local per interval | plain TCP floor (% of a core) | relays |\n|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.3} | {:.1} | {:.0} | {:.0} | {:.0} | {} | {} |\n",
            r.locals,
            r.stages,
            if r.changing { "every cycle" } else { "never" },
            r.interval_ms,
            r.cycles,
            r.p50_ms,
            r.p99_ms,
            r.collect_p50_ms,
            r.compute_p50_ms,
            r.acked_p50_ms
                .map_or("-".to_string(), |a| format!("{a:.3}")),
            r.global_cpu_ms,
            100.0 * r.global_cpu_ms / r.interval_ms as f64,
            r.rss_mib,
            r.enforced,
            r.bytes_per_local,
            r.floor_cpu_ms.map_or("-".to_string(), |floor| format!(
                "{:.1}",
                100.0 * floor / r.interval_ms as f64
            )),
            r.relays,
        ));
    }
    out
}
