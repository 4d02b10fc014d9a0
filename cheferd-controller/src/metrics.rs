//! Prometheus text metrics over HTTP (`GET /metrics`): per job and resource usage,
//! assigned rate and demand; each resource's `Max_R`; cycles and their latency;
//! attached nodes and registered stages. Names follow Prometheus' conventions: counters
//! end in `_total`, units are in the name (`_seconds`, `_bytes`, `_ops_per_second`,
//! `_bytes_per_second`), so a resource's rates appear under the name of its unit: a
//! metadata resource counts operations, a data resource bytes (docs/control-plane.md, *Metrics*).

use crate::bounds::{Incoming, Limited, ListenerCaps};
use crate::config::Resource;
use crate::global::{AutoSnapshot, ServiceSummary};
use crate::global::{Controller, Metrics, LATENCY_BUCKETS};
use crate::plan::JobShare;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use padll_wire::latency;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;

/// How long a client may take to send its request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request head read.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Serves the metrics endpoint on an already-bound listener: HTTP/1, one request per
/// connection, connections capped by the descriptor limit and closed after
/// [`crate::bounds::METRICS_LIFETIME`] ([`ListenerCaps`]), so idle or slow clients
/// cannot hold descriptors the other listeners need.
pub async fn serve(controller: Arc<Controller>, listener: TcpListener) {
    let caps = ListenerCaps::of_this_process().metrics;
    let mut incoming = Incoming::new(listener, "metrics endpoint", caps);
    while let Some(Ok(stream)) = incoming.next().await {
        tokio::spawn(serve_connection(controller.clone(), stream));
    }
}

async fn serve_connection(controller: Arc<Controller>, stream: Limited) {
    let service = hyper::service::service_fn(move |request| {
        let response = respond(&controller, &request);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    // Errors are the client's (gone, too slow, not HTTP): nothing to log.
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

/// `GET /metrics` (or `/`): the exposition; anything else 404.
fn respond<B>(controller: &Controller, request: &Request<B>) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    let (status, body) = if request.method() == Method::GET && (path == "/metrics" || path == "/") {
        (StatusCode::OK, render(&controller.metrics()))
    } else {
        (
            StatusCode::NOT_FOUND,
            "only GET /metrics is served\n".to_string(),
        )
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// Writes metric families in the text exposition format.
struct Exposition(String);

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            let pairs: Vec<String> = labels
                .iter()
                .map(|(key, value)| format!("{key}=\"{}\"", escape(value)))
                .collect();
            let _ = write!(self.0, "{{{}}}", pairs.join(","));
        }
        // Rust writes infinities as `inf`; the format wants `+Inf`.
        let value = match value {
            v if v == f64::INFINITY => "+Inf".to_string(),
            v if v == f64::NEG_INFINITY => "-Inf".to_string(),
            v => v.to_string(),
        };
        let _ = writeln!(self.0, " {value}");
    }

    /// One gauge family with a sample per row.
    fn gauge(&mut self, name: &str, help: &str, rows: &[(Vec<(&str, &str)>, f64)]) {
        self.family(name, "gauge", help);
        for (labels, value) in rows {
            self.sample(name, labels, *value);
        }
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A per-job gauge: its name between `cheferd_job_` and the unit, its help, and its
/// value in a share.
struct JobGauge {
    name: &'static str,
    help: &'static str,
    value: fn(&JobShare) -> f64,
}

const JOB_GAUGES: [JobGauge; 3] = [
    JobGauge {
        name: "usage",
        help: "A job's usage of a resource over the last interval (all its stages).",
        value: |j| j.usage,
    },
    JobGauge {
        name: "assigned_rate",
        help: "The rate assigned to a job on a resource in the last cycle.",
        value: |j| j.assigned,
    },
    JobGauge {
        name: "demand",
        help: "A job's demand (QoS reservation) on a resource; Max_R when not configured.",
        value: |j| j.demand,
    },
];

/// A rate's unit in metric names: operations or bytes per second.
fn unit(counts_bytes: bool) -> &'static str {
    if counts_bytes {
        "bytes_per_second"
    } else {
        "ops_per_second"
    }
}

/// The exposition text of the controller's metrics.
pub fn render(metrics: &Metrics) -> String {
    let (s, latency) = (&metrics.snapshot, &metrics.cycle_latency);
    let mut out = Exposition(String::new());
    out.family("cheferd_cycles_total", "counter", "Control cycles run.");
    out.sample("cheferd_cycles_total", &[], s.cycle as f64);

    let name = "cheferd_cycle_latency_seconds";
    out.family(
        name,
        "histogram",
        "Control cycle latency: from the tick until the last Enforce is queued (collect + compute + enforce).",
    );
    let mut cumulative = 0;
    for (bound, count) in LATENCY_BUCKETS.iter().zip(latency.counts()) {
        cumulative += count;
        out.sample(
            "cheferd_cycle_latency_seconds_bucket",
            &[("le", &bound.to_string())],
            cumulative as f64,
        );
    }
    let count = latency.count() as f64;
    out.sample(
        "cheferd_cycle_latency_seconds_bucket",
        &[("le", "+Inf")],
        count,
    );
    out.sample("cheferd_cycle_latency_seconds_sum", &[], latency.sum());
    out.sample("cheferd_cycle_latency_seconds_count", &[], count);
    out.gauge(
        "cheferd_last_cycle_latency_seconds",
        "Latency of the last control cycle.",
        &[(vec![], s.latency_ms_last / 1e3)],
    );

    let attached = s.nodes.iter().filter(|n| n.attached).count();
    out.gauge(
        "cheferd_nodes",
        "Local controllers known, by state: attached (stream up) or detached (stream lost, its stages kept as orphans).",
        &[
            (vec![("state", "attached")], attached as f64),
            (
                vec![("state", "detached")],
                (s.nodes.len() - attached) as f64,
            ),
        ],
    );
    out.gauge(
        "cheferd_stages",
        "Stages registered through attached local controllers.",
        &[(vec![], s.stages.len() as f64)],
    );
    out.gauge(
        "cheferd_orphan_stages",
        "Stages of detached local controllers, still running at their last rates.",
        &[(
            vec![],
            s.nodes.iter().map(|n| n.orphans).sum::<usize>() as f64,
        )],
    );

    let l = &s.leadership;
    let flag = |yes: bool| if yes { 1.0 } else { 0.0 };
    out.gauge(
        "cheferd_role",
        "This global controller's role (single: no etcd; leader or follower with a standby), 1 for the current one, with the leader's URL if known.",
        &[(
            vec![
                ("role", l.role.as_str()),
                ("leader", l.leader.as_deref().unwrap_or("")),
            ],
            1.0,
        )],
    );
    out.gauge(
        "cheferd_leader_term",
        "The leader's term (the etcd revision of its election key); 0 alone or while no leader is known.",
        &[(vec![], l.term as f64)],
    );
    out.gauge(
        "cheferd_controlling",
        "1 if this global controller sends rules now (alone; or leading with a valid lease, or with every standby confirming that etcd is down).",
        &[(vec![], flag(l.controlling))],
    );
    if let Some(reachable) = l.etcd_reachable {
        out.gauge(
            "cheferd_etcd_reachable",
            "1 if etcd answered this global controller's last request.",
            &[(vec![], flag(reachable))],
        );
    }
    if let Some(valid) = l.lease_valid {
        out.gauge(
            "cheferd_lease_valid",
            "1 if this leader's etcd lease is valid by its clock.",
            &[(vec![], flag(valid))],
        );
    }

    for counts_bytes in [false, true] {
        let unit = unit(counts_bytes);
        let rows: Vec<_> = s
            .resources
            .iter()
            .filter(|r| {
                Resource::parse(&r.resource).is_ok_and(|r| r.counts_bytes() == counts_bytes)
            })
            .map(|r| {
                (
                    vec![
                        ("resource", r.resource.as_str()),
                        ("policy", r.policy.as_str()),
                    ],
                    r.max_rate,
                )
            })
            .collect();
        out.gauge(
            &format!("cheferd_resource_max_rate_{unit}"),
            "Capacity Max_R of each resource, shared by its policy.",
            &rows,
        );
        let shares: Vec<_> = s
            .shares
            .iter()
            .filter(|j| j.resource.counts_bytes() == counts_bytes)
            .map(|j| (j.job.as_str(), j.resource.to_string(), j))
            .collect();
        for gauge in JOB_GAUGES {
            let rows: Vec<_> = shares
                .iter()
                .map(|(job, resource, share)| {
                    (
                        vec![("job", *job), ("resource", resource.as_str())],
                        (gauge.value)(share),
                    )
                })
                .collect();
            out.gauge(
                &format!("cheferd_job_{}_{unit}", gauge.name),
                gauge.help,
                &rows,
            );
        }
    }

    service_times(&mut out, metrics);

    let name = "cheferd_node_protocol_bytes_total";
    out.family(
        name,
        "counter",
        "gRPC payload bytes exchanged with each local controller since it attached.",
    );
    for n in &s.nodes {
        out.sample(
            name,
            &[("node", &n.node), ("direction", "in")],
            n.bytes_in as f64,
        );
        out.sample(
            name,
            &[("node", &n.node), ("direction", "out")],
            n.bytes_out as f64,
        );
    }
    out.0
}

/// Each resource's service times: a histogram since start (the stages' log-scale
/// buckets; `_sum` is estimated from the buckets' midpoints, as the stages count no
/// sum) and the last interval's median and 99th percentile.
fn service_times(out: &mut Exposition, metrics: &Metrics) {
    let name = "cheferd_resource_service_seconds";
    out.family(
        name,
        "histogram",
        "How long the file system took to serve the managed calls of a resource, all stages, since start.",
    );
    let bucket = format!("{name}_bucket");
    for (r, histogram) in metrics
        .snapshot
        .resources
        .iter()
        .zip(&metrics.service_times)
    {
        let resource = ("resource", r.resource.as_str());
        let counts = histogram.counts();
        let mut cumulative = 0u64;
        let mut sum = 0.0;
        // Every bucket, always: a histogram's buckets must not change between scrapes.
        for i in 0..latency::BUCKETS {
            let count = counts.get(i).copied().unwrap_or(0);
            cumulative += count;
            let lower = latency::lower_bound_ns(i) as f64;
            let upper = latency::upper_bound_ns(i).map_or(lower, |u| u as f64);
            sum += count as f64 * (lower + upper) / 2.0 * 1e-9;
            if let Some(upper) = latency::upper_bound_ns(i) {
                let le = (upper as f64 * 1e-9).to_string();
                out.sample(&bucket, &[resource, ("le", &le)], cumulative as f64);
            }
        }
        out.sample(&bucket, &[resource, ("le", "+Inf")], cumulative as f64);
        out.sample(&format!("{name}_sum"), &[resource], sum);
        out.sample(&format!("{name}_count"), &[resource], cumulative as f64);
    }
    for (quantile, value) in [
        ("p50", (|s| s.p50_ms) as fn(&ServiceSummary) -> Option<f64>),
        ("p99", |s| s.p99_ms),
    ] {
        let rows: Vec<_> = metrics
            .snapshot
            .resources
            .iter()
            .filter_map(|r| {
                Some((
                    vec![("resource", r.resource.as_str())],
                    value(&r.service)? / 1e3,
                ))
            })
            .collect();
        out.gauge(
            &format!("cheferd_resource_service_{quantile}_seconds"),
            "The file system's service time of a resource's calls over the last interval, all stages (absent without calls).",
            &rows,
        );
    }
    let auto = || {
        metrics
            .snapshot
            .resources
            .iter()
            .filter_map(|r| Some((r, r.auto?)))
    };
    for (quantile, target) in [
        (
            "p50",
            (|a| a.target_p50_ms) as fn(&AutoSnapshot) -> Option<f64>,
        ),
        ("p99", |a| a.target_p99_ms),
    ] {
        let rows: Vec<_> = auto()
            .filter_map(|(r, a)| Some((vec![("resource", r.resource.as_str())], target(&a)? / 1e3)))
            .collect();
        out.gauge(
            &format!("cheferd_resource_service_target_{quantile}_seconds"),
            "The service time a resource's Max_R is steered to hold (max_rate = \"auto\").",
            &rows,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::global::{LatencyHistogram, Snapshot};
    use padll_wire::latency::Histogram;

    #[test]
    fn service_times_are_a_histogram_and_the_last_intervals_quantiles() {
        let snapshot: Snapshot = serde_json::from_value(serde_json::json!({
            "cycle": 5, "uptime_s": 5.0, "interval_ms": 1000, "nodes": [],
            "resources": [
                {"resource": "/s:metadata", "max_rate": 1000.0, "policy": "psfa",
                 "service": {"calls": 3, "p50_ms": 0.25, "p99_ms": 4.0},
                 "auto": {"target_p50_ms": 0.5, "target_p99_ms": null, "floor": 10.0,
                          "ceiling": 5000.0}},
                {"resource": "/s:data", "max_rate": 1e9, "policy": "psfa"}],
            "stages": [], "shares": [], "latency_ms_p50": 3.0, "latency_ms_p99": 2000.0,
            "latency_ms_last": 2000.0
        }))
        .unwrap();
        let mut metadata = Histogram::default();
        for ns in [1_500, 300_000, 300_000] {
            metadata.record(ns);
        }
        let text = render(&Metrics {
            snapshot,
            cycle_latency: LatencyHistogram::default(),
            service_times: vec![metadata, Histogram::default()],
        });
        let name = "cheferd_resource_service_seconds";
        let buckets = |resource: &str| {
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}_bucket{{resource=\"{resource}\"")))
                .count()
        };
        assert_eq!(buckets("/s:metadata"), latency::BUCKETS);
        assert_eq!(buckets("/s:data"), latency::BUCKETS);
        for line in [
            "cheferd_resource_service_seconds_bucket{resource=\"/s:metadata\",le=\"0.000001024\"} 0",
            "cheferd_resource_service_seconds_bucket{resource=\"/s:metadata\",le=\"0.000002048\"} 1",
            "cheferd_resource_service_seconds_bucket{resource=\"/s:metadata\",le=\"+Inf\"} 3",
            "cheferd_resource_service_seconds_count{resource=\"/s:metadata\"} 3",
            "cheferd_resource_service_seconds_count{resource=\"/s:data\"} 0",
            "cheferd_resource_service_p50_seconds{resource=\"/s:metadata\"} 0.00025",
            "cheferd_resource_service_p99_seconds{resource=\"/s:metadata\"} 0.004",
            "cheferd_resource_service_target_p50_seconds{resource=\"/s:metadata\"} 0.0005",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("cheferd_resource_service_p50_seconds{resource=\"/s:data\""));
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_counted() {
        let mut histogram = LatencyHistogram::default();
        for ms in [0.05, 0.2, 3.0, 3.0, 2000.0] {
            histogram.observe(Duration::from_secs_f64(ms / 1e3));
        }
        assert_eq!(histogram.count(), 5);
        let snapshot: Snapshot = serde_json::from_value(serde_json::json!({
            "cycle": 5, "uptime_s": 5.0, "interval_ms": 1000, "resources": [], "nodes": [],
            "stages": [], "shares": [], "latency_ms_p50": 3.0, "latency_ms_p99": 2000.0,
            "latency_ms_last": 2000.0
        }))
        .unwrap();
        let text = render(&Metrics {
            snapshot,
            cycle_latency: histogram,
            service_times: Vec::new(),
        });
        for line in [
            "cheferd_cycle_latency_seconds_bucket{le=\"0.0001\"} 1",
            "cheferd_cycle_latency_seconds_bucket{le=\"0.00025\"} 2",
            "cheferd_cycle_latency_seconds_bucket{le=\"0.0025\"} 2",
            "cheferd_cycle_latency_seconds_bucket{le=\"0.005\"} 4",
            "cheferd_cycle_latency_seconds_bucket{le=\"1\"} 4",
            "cheferd_cycle_latency_seconds_bucket{le=\"+Inf\"} 5",
            "cheferd_cycle_latency_seconds_count 5",
            "cheferd_cycles_total 5",
            "cheferd_last_cycle_latency_seconds 2",
            "# TYPE cheferd_cycles_total counter",
            "# TYPE cheferd_cycle_latency_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("cheferd_cycle_latency_seconds_sum "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((sum - 2.00625).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn leadership_shows_role_term_etcd_and_lease_only_where_they_apply() {
        let snapshot = |leadership: serde_json::Value| -> Snapshot {
            serde_json::from_value(serde_json::json!({
                "cycle": 0, "uptime_s": 0.0, "interval_ms": 1000, "resources": [],
                "nodes": [], "stages": [], "shares": [], "latency_ms_p50": 0.0,
                "latency_ms_p99": 0.0, "latency_ms_last": 0.0, "leadership": leadership
            }))
            .unwrap()
        };
        let metrics = |snapshot| Metrics {
            snapshot,
            cycle_latency: LatencyHistogram::default(),
            service_times: Vec::new(),
        };
        let single = render(&metrics(snapshot(
            serde_json::json!({"role": "single", "term": 0, "controlling": true}),
        )));
        assert!(
            single
                .lines()
                .any(|l| l == "cheferd_role{role=\"single\",leader=\"\"} 1"),
            "{single}"
        );
        assert!(
            single.lines().any(|l| l == "cheferd_controlling 1"),
            "{single}"
        );
        assert!(
            !single.contains("cheferd_etcd_reachable") && !single.contains("cheferd_lease_valid")
        );
        let leader = render(&metrics(snapshot(serde_json::json!({
            "role": "leader", "term": 42, "leader": "https://g1:50051",
            "etcd_reachable": false, "etcd_unreachable_since": 1, "lease_valid": false,
            "controlling": true
        }))));
        for line in [
            "cheferd_role{role=\"leader\",leader=\"https://g1:50051\"} 1",
            "cheferd_leader_term 42",
            "cheferd_etcd_reachable 0",
            "cheferd_lease_valid 0",
            "cheferd_controlling 1",
        ] {
            assert!(
                leader.lines().any(|l| l == line),
                "no {line:?} in\n{leader}"
            );
        }
    }
}
