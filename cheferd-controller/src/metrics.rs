//! Prometheus text metrics over HTTP (`GET /metrics`): per job and resource usage,
//! assigned rate and demand; cycle latency; connected nodes and stages.

use crate::global::{Controller, Snapshot};
use std::fmt::Write as _;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::warn;

/// Serves the metrics endpoint on an already-bound listener.
pub async fn serve(controller: Arc<Controller>, listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let controller = controller.clone();
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let request_line = String::from_utf8_lossy(&head)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            let (status, body) = if request_line.starts_with("GET /metrics ")
                || request_line.starts_with("GET / ")
            {
                ("200 OK", render(&controller.snapshot()))
            } else {
                ("404 Not Found", "only GET /metrics is served\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = stream.write_all(response.as_bytes()).await {
                warn!("metrics client: {e}");
            }
        });
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition text for a snapshot.
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, rows: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, value) in rows {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    gauge(
        "cheferd_cycles",
        "Control cycles run.",
        vec![(String::new(), s.cycle as f64)],
    );
    gauge(
        "cheferd_cycle_latency_ms",
        "Control cycle latency (from the tick until the last Enforce is queued: collect + compute + enforce), ms.",
        vec![
            ("{quantile=\"0.5\"}".into(), s.latency_ms_p50),
            ("{quantile=\"0.99\"}".into(), s.latency_ms_p99),
            ("{quantile=\"last\"}".into(), s.latency_ms_last),
        ],
    );
    gauge(
        "cheferd_nodes",
        "Attached local controllers.",
        vec![(
            String::new(),
            s.nodes.iter().filter(|n| n.attached).count() as f64,
        )],
    );
    gauge(
        "cheferd_stages",
        "Registered stages.",
        vec![(String::new(), s.stages.len() as f64)],
    );
    gauge(
        "cheferd_resource_max_rate",
        "Capacity Max_R of each resource (ops/s or bytes/s).",
        s.resources
            .iter()
            .map(|r| {
                (
                    format!(
                        "{{resource=\"{}\",policy=\"{}\"}}",
                        escape(&r.resource),
                        escape(&r.policy)
                    ),
                    r.max_rate,
                )
            })
            .collect(),
    );
    let job_rows = |f: &dyn Fn(&crate::plan::JobShare) -> f64| -> Vec<(String, f64)> {
        s.shares
            .iter()
            .map(|j| {
                (
                    format!(
                        "{{job=\"{}\",resource=\"{}\"}}",
                        escape(&j.job),
                        escape(&j.resource.to_string())
                    ),
                    f(j),
                )
            })
            .collect()
    };
    gauge(
        "cheferd_job_usage",
        "Job usage over the last interval.",
        job_rows(&|j| j.usage),
    );
    gauge(
        "cheferd_job_assigned_rate",
        "Rate assigned to the job this cycle.",
        job_rows(&|j| j.assigned),
    );
    gauge(
        "cheferd_job_demand",
        "Job demand (reservation).",
        job_rows(&|j| j.demand),
    );
    gauge(
        "cheferd_node_protocol_bytes",
        "gRPC payload bytes exchanged with each local controller since it attached.",
        s.nodes
            .iter()
            .flat_map(|n| {
                [
                    (
                        format!("{{node=\"{}\",direction=\"in\"}}", escape(&n.node)),
                        n.bytes_in as f64,
                    ),
                    (
                        format!("{{node=\"{}\",direction=\"out\"}}", escape(&n.node)),
                        n.bytes_out as f64,
                    ),
                ]
            })
            .collect(),
    );
    out
}
