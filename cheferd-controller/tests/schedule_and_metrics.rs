//! A time-scheduled static rule (Cheferd's `<id> <time> job <name> <op|class> <limit>`
//! files, here `[[rule]]` in the TOML) reaches real stages, which then run at it, and
//! the Prometheus endpoint shows usage, assigned rate and demand per job, cycle
//! latency, nodes and stages, with the types and names Prometheus' conventions ask for
//! — on real processes on loopback.
//!
//! The times themselves (both jobs at their demand until the rule's time, held from
//! it, lifted at the lifting rule's, one cycle per interval) are tested on a paused
//! clock in the global controller's unit tests (`src/global/tests.rs`): here, however
//! slow the start, only what a loaded machine cannot change is asserted.

use crate::util::{assigned, job_id, wait_for, Cluster, START_TIMEOUT};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Seconds after the controller's start.
const LIMITED_FROM: u32 = 15;
const STATIC_LIMIT: f64 = 150.0;

/// The configuration for jobs `a` and `b`.
fn config(a: &str, b: &str) -> String {
    format!(
        r#"interval_ms = 1000
[[resource]]
name = "{{scratch}}:metadata"
max_rate = "2000"
policy = "psfa"
[[job]]
id = "{a}"
demand = {{ "{{scratch}}:metadata" = "1000" }}
[[job]]
id = "{b}"
demand = {{ "{{scratch}}:metadata" = "1000" }}
[[rule]]
at = {LIMITED_FROM}
job = "{a}"
resource = "{{scratch}}:metadata"
limit = "{STATIC_LIMIT}"
"#
    )
}

/// The controller's clock (seconds since its start) at a snapshot in which `job`'s
/// assigned rate `holds`.
fn uptime_when(cluster: &Cluster, job: &str, holds: impl Fn(f64) -> bool) -> Option<f64> {
    let snapshot = cluster.try_snapshot()?;
    holds(assigned(&snapshot, job)).then_some(snapshot.uptime_s)
}

/// `GET /metrics` from the global controller.
fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.starts_with("HTTP/1.1 200").then_some(response)
}

/// The value of the sample `name{…label…}` (`label` as in `job="job-a"`), or of `name`
/// without labels when `label` is empty.
fn sample(metrics: &str, name: &str, label: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let matches = if label.is_empty() {
            rest.starts_with(' ')
        } else {
            rest.starts_with('{') && rest.split('}').next()?.contains(label)
        };
        matches.then(|| line.rsplit(' ').next()?.parse().ok())?
    })
}

/// The `# TYPE` line of a metric family.
fn family_type<'a>(metrics: &'a str, name: &str) -> Option<&'a str> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&format!("# TYPE {name} ")))
}

#[test]
fn a_scheduled_rule_reaches_the_stages_and_metrics_show_the_jobs() {
    let _turn = crate::util::alone();
    let (a, b) = (job_id("job-a"), job_id("job-b"));
    let mut cluster = Cluster::new(&config(&a, &b));
    cluster.start_global();
    cluster.start_local("n1");
    cluster.start_job(&a, &["n1"], 1500);
    cluster.start_job(&b, &["n1"], 1500);
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 2)]);

    // The rule, not before its time by the controller's clock: job-a is held at its
    // static limit, job-b gets what job-a cannot use.
    let held = |rate: f64| (rate - STATIC_LIMIT).abs() < 1.0;
    let seen = wait_for(
        START_TIMEOUT + Duration::from_secs(LIMITED_FROM.into()),
        "job-a held at the scheduled limit",
        || uptime_when(&cluster, &a, held),
    );
    assert!(seen >= LIMITED_FROM.into(), "held at {seen:.1} s");
    let cycles_seen = cluster.snapshot().cycle;
    // A replayer's window that a loaded machine ends late holds more than a second of
    // operations (the next one less): the mean is taken over four, so a late end moves
    // it by a quarter of the delay at most.
    std::thread::sleep(Duration::from_secs(2));
    let from = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    let to = Instant::now();
    // The last window is reported up to a second after it ends.
    std::thread::sleep(Duration::from_millis(1300));
    let achieved = cluster.job_rate(&a, from, to);
    assert!(
        achieved <= STATIC_LIMIT * 1.1 && achieved > STATIC_LIMIT * 0.5,
        "job-a ran at {achieved:.0} ops/s under a {STATIC_LIMIT} limit"
    );
    let share_of = |job: &str| assigned(&cluster.snapshot(), job);
    assert!(
        share_of(&b) > 1500.0,
        "job-b did not get the rest: {}",
        share_of(&b)
    );

    // Metrics while the rule holds.
    let metrics = wait_for(START_TIMEOUT, "the metrics endpoint", || {
        scrape(cluster.metrics_port)
    });
    let (label_a, label_b) = (format!("job=\"{a}\""), format!("job=\"{b}\""));
    for (name, label) in [
        ("cheferd_job_usage_ops_per_second", label_a.as_str()),
        ("cheferd_job_assigned_rate_ops_per_second", &label_b),
        ("cheferd_job_demand_ops_per_second", &label_b),
        ("cheferd_cycle_latency_seconds_bucket", "le=\"+Inf\""),
        ("cheferd_cycle_latency_seconds_count", ""),
        ("cheferd_last_cycle_latency_seconds", ""),
        ("cheferd_cycles_total", ""),
    ] {
        assert!(
            sample(&metrics, name, label).is_some(),
            "no {name} {label} in:\n{metrics}"
        );
    }
    for (name, kind) in [
        ("cheferd_cycles_total", "counter"),
        ("cheferd_cycle_latency_seconds", "histogram"),
        ("cheferd_job_usage_ops_per_second", "gauge"),
        ("cheferd_node_protocol_bytes_total", "counter"),
    ] {
        assert_eq!(family_type(&metrics, name), Some(kind), "{metrics}");
    }
    assert!(
        !metrics.contains("quantile="),
        "a last value is a gauge, not a quantile: {metrics}"
    );
    let resource = format!("resource=\"{}\"", cluster.metadata());
    assert_eq!(
        sample(
            &metrics,
            "cheferd_resource_max_rate_ops_per_second",
            &resource
        ),
        Some(2000.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "cheferd_job_assigned_rate_ops_per_second",
            &label_a
        ),
        Some(STATIC_LIMIT)
    );
    assert_eq!(
        sample(&metrics, "cheferd_job_demand_ops_per_second", &label_a),
        Some(1000.0)
    );
    assert_eq!(
        sample(&metrics, "cheferd_nodes", "state=\"attached\""),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "cheferd_stages", ""),
        Some(2.0),
        "{metrics}"
    );
    // Every cycle run is counted, and its latency observed.
    let cycles = sample(&metrics, "cheferd_cycles_total", "").unwrap();
    let observed = sample(&metrics, "cheferd_cycle_latency_seconds_count", "").unwrap();
    assert!(
        cycles >= cycles_seen as f64 && (cycles - observed).abs() <= 1.0,
        "{cycles} cycles run (at least {cycles_seen}), {observed} latencies observed"
    );
}
