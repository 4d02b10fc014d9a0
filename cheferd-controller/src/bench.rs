//! `cheferd bench`: control-cycle latency (collect + compute + enforce) with many local
//! controllers on loopback, simulated in one process, and the protocol bytes exchanged
//! per local controller per cycle.
//!
//! Each simulated local controller is a real gRPC client on its own stream; it announces
//! `stages` stages of distinct jobs, answers every `Collect` with a usage report for all
//! of them and every `Enforce` with `Applied` — what a real local controller does,
//! without the stages.

use crate::config::{GlobalConfig, ResourceConfig};
use crate::global::{self, Controller};
use crate::proto::{
    self, global_client::GlobalClient, global_message, local_message, LocalMessage,
};
use crate::usage::Resource;
use prost::Message;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// Result for one number of local controllers.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// Simulated local controllers.
    pub locals: usize,
    /// Stages per local controller.
    pub stages: usize,
    /// Cycles measured.
    pub cycles: usize,
    /// Median cycle latency, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Median duration of the compute step alone, ms.
    pub compute_p50_ms: f64,
    /// Mean protocol bytes per local controller per cycle (both directions).
    pub bytes_per_local: f64,
}

/// Runs the benchmark for each count in `locals`.
pub async fn run(
    locals: &[usize],
    stages: usize,
    cycles: usize,
    policy: &str,
) -> Result<Vec<BenchRow>, String> {
    raise_descriptor_limit(locals.iter().max().copied().unwrap_or(1) * 2 + 256)?;
    let mut rows = Vec::new();
    for &n in locals {
        rows.push(run_one(n, stages, cycles, policy).await?);
    }
    Ok(rows)
}

async fn run_one(
    locals: usize,
    stages: usize,
    cycles: usize,
    policy: &str,
) -> Result<BenchRow, String> {
    let resource = Resource::parse("/scratch:metadata")?;
    let config = GlobalConfig {
        interval_ms: 1000,
        resources: vec![ResourceConfig {
            resource,
            max_rate: 1e6,
            policy: policy.to_string(),
        }],
        ..GlobalConfig::default()
    };
    let controller = Controller::new(config)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let url = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let server = tokio::spawn(global::serve(controller.clone(), listener));

    let bytes = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..locals {
        tasks.push(tokio::spawn(simulated_local(
            url.clone(),
            format!("node{i:04}"),
            stages,
            bytes.clone(),
        )));
    }
    // Wait until every local controller and stage is registered.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let snapshot = controller.snapshot();
        if snapshot.nodes.len() == locals && snapshot.stages.len() == locals * stages {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {locals} local controllers attached",
                snapshot.nodes.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Warm-up cycles, then measured ones (bytes counted over the measured ones).
    for _ in 0..3 {
        controller.cycle(Duration::from_secs(10)).await;
    }
    let before = controller
        .snapshot()
        .nodes
        .iter()
        .map(|n| n.bytes_in + n.bytes_out)
        .sum::<u64>();
    let mut latencies = Vec::with_capacity(cycles);
    let mut computes = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        latencies.push(
            controller
                .cycle(Duration::from_secs(10))
                .await
                .as_secs_f64()
                * 1e3,
        );
        computes.push(controller.last_compute().as_secs_f64() * 1e3);
    }
    computes.sort_by(f64::total_cmp);
    let after = controller
        .snapshot()
        .nodes
        .iter()
        .map(|n| n.bytes_in + n.bytes_out)
        .sum::<u64>();
    latencies.sort_by(f64::total_cmp);
    for task in tasks {
        task.abort();
    }
    server.abort();
    Ok(BenchRow {
        locals,
        stages,
        cycles,
        p50_ms: latencies[latencies.len() / 2],
        p99_ms: latencies[((latencies.len() - 1) as f64 * 0.99).round() as usize],
        compute_p50_ms: computes[computes.len() / 2],
        bytes_per_local: (after - before) as f64 / (cycles * locals) as f64,
    })
}

async fn simulated_local(url: String, node: String, stages: usize, bytes: Arc<AtomicU64>) {
    // A thousand simultaneous connects can overflow the listen backlog: retry until
    // attached, as a real local controller does.
    loop {
        if attach_once(&url, &node, stages, &bytes).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One attachment; false if it could not be made (true once served to the end).
async fn attach_once(url: &str, node: &str, stages: usize, bytes: &AtomicU64) -> bool {
    let Ok(mut client) = GlobalClient::connect(url.to_string()).await else {
        return false;
    };
    let (sender, receiver) = mpsc::unbounded_channel::<LocalMessage>();
    let send = |body| {
        let message = LocalMessage { body: Some(body) };
        bytes.fetch_add(message.encoded_len() as u64, Ordering::Relaxed);
        let _ = sender.send(message);
    };
    send(local_message::Body::Register(proto::Register {
        node: node.to_string(),
        version: padll_wire::control::PROTOCOL_VERSION,
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
        }));
    }
    let Ok(response) = client.attach(UnboundedReceiverStream::new(receiver)).await else {
        return false;
    };
    let mut inbound = response.into_inner();
    while let Ok(Some(message)) = inbound.message().await {
        match message.body {
            Some(global_message::Body::Collect(proto::Collect { cycle })) => {
                send(local_message::Body::Usage(proto::Usage {
                    cycle,
                    stages: (1..=stages as u64)
                        .map(|stage_id| proto::StageUsage {
                            stage_id,
                            resources: vec![proto::ResourceUsage {
                                mount: "/scratch".into(),
                                class: "metadata".into(),
                                rate: 1000.0 + stage_id as f64,
                                limit: 2000,
                            }],
                        })
                        .collect(),
                }))
            }
            Some(global_message::Body::Enforce(proto::Enforce {
                cycle,
                stages: plans,
            })) => send(local_message::Body::Applied(proto::Applied {
                cycle,
                stages: plans.len() as u32,
            })),
            _ => {}
        }
    }
    true
}

/// Two descriptors per simulated local controller (client and server end): raise the
/// soft limit towards the hard one, or say why the run cannot work.
fn raise_descriptor_limit(needed: usize) -> Result<(), String> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if limit.rlim_cur as usize >= needed {
        return Ok(());
    }
    if (limit.rlim_max as usize) < needed {
        return Err(format!(
            "{needed} open files needed but the hard limit is {}",
            limit.rlim_max
        ));
    }
    limit.rlim_cur = needed as libc::rlim_t;
    // SAFETY: valid pointer; raising the soft limit up to the hard one is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(format!("cannot raise the open-file limit to {needed}"));
    }
    Ok(())
}

/// The benchmark table in Markdown.
pub fn table(rows: &[BenchRow]) -> String {
    let mut out = String::from(
        "| local controllers | stages each | cycles | p50 cycle latency (ms) | p99 (ms) | p50 compute step (ms) | bytes per local per cycle |\n|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.0} |\n",
            r.locals, r.stages, r.cycles, r.p50_ms, r.p99_ms, r.compute_p50_ms, r.bytes_per_local
        ));
    }
    out
}
