//! Time-scheduled static rules (Cheferd's `<id> <time> job <name> <op|class> <limit>`
//! files, here `[[rule]]` in the TOML) take effect at their time and are lifted at theirs,
//! and the Prometheus endpoint shows usage, assigned rate and demand per job, cycle
//! latency, nodes and stages, with the types and names Prometheus' conventions ask for
//! — on real processes on loopback.

use crate::util::{assigned, wait_for, Cluster};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const LIMITED_FROM: u32 = 8;
const LIFTED_AT: u32 = 16;
const STATIC_LIMIT: f64 = 150.0;

fn config() -> String {
    format!(
        r#"interval_ms = 1000
[[resource]]
name = "{{scratch}}:metadata"
max_rate = "2000"
policy = "psfa"
[[job]]
id = "job-a"
demand = {{ "{{scratch}}:metadata" = "1000" }}
[[job]]
id = "job-b"
demand = {{ "{{scratch}}:metadata" = "1000" }}
[[rule]]
at = {LIMITED_FROM}
job = "job-a"
resource = "{{scratch}}:metadata"
limit = "{STATIC_LIMIT}"
[[rule]]
at = {LIFTED_AT}
job = "job-a"
resource = "{{scratch}}:metadata"
limit = "none"
"#
    )
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
fn scheduled_rules_apply_at_their_time_and_metrics_show_the_jobs() {
    let _turn = crate::util::alone();
    let mut cluster = Cluster::new(&config());
    // Before the controller starts: its clock for `at` starts later than this one.
    let started = std::time::Instant::now();
    cluster.start_global();
    cluster.start_local("n1");
    cluster.start_job("job-a", &["n1"], 1500);
    cluster.start_job("job-b", &["n1"], 1500);
    cluster.wait_for_stages(Duration::from_secs(15), &[("n1", 2)]);

    // Before the rule: PSFA gives both busy jobs their demand.
    let share_of = |job: &str| assigned(&cluster.snapshot(), job);
    wait_for(Duration::from_secs(6), "job-a at its demand", || {
        ((share_of("job-a") - 1000.0).abs() < 50.0).then_some(())
    });
    assert!(
        started.elapsed() < Duration::from_secs(LIMITED_FROM.into()),
        "the machine was too slow to observe the time before the rule"
    );

    // The rule: job-a is held at its static limit, job-b gets what job-a cannot use.
    wait_for(
        Duration::from_secs(15),
        "job-a held at the scheduled limit",
        || ((share_of("job-a") - STATIC_LIMIT).abs() < 1.0).then_some(()),
    );
    assert!(started.elapsed() >= Duration::from_secs(LIMITED_FROM.into()));
    std::thread::sleep(Duration::from_secs(3));
    let now = std::time::Instant::now();
    let achieved = cluster.job_rate("job-a", now - Duration::from_secs(2), now);
    assert!(
        achieved <= STATIC_LIMIT * 1.1 && achieved > STATIC_LIMIT * 0.5,
        "job-a ran at {achieved:.0} ops/s under a {STATIC_LIMIT} limit"
    );
    assert!(
        share_of("job-b") > 1500.0,
        "job-b did not get the rest: {}",
        share_of("job-b")
    );

    // Metrics while the rule holds.
    let metrics = wait_for(Duration::from_secs(10), "the metrics endpoint", || {
        scrape(cluster.metrics_port)
    });
    for (name, label) in [
        ("cheferd_job_usage_ops_per_second", "job=\"job-a\""),
        ("cheferd_job_assigned_rate_ops_per_second", "job=\"job-b\""),
        ("cheferd_job_demand_ops_per_second", "job=\"job-b\""),
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
            "job=\"job-a\""
        ),
        Some(STATIC_LIMIT)
    );
    assert_eq!(
        sample(
            &metrics,
            "cheferd_job_demand_ops_per_second",
            "job=\"job-a\""
        ),
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
    let cycles = sample(&metrics, "cheferd_cycles_total", "").unwrap();
    let observed = sample(&metrics, "cheferd_cycle_latency_seconds_count", "").unwrap();
    assert!(
        cycles >= 8.0 && (cycles - observed).abs() <= 1.0,
        "{cycles} cycles run, {observed} latencies observed"
    );

    // The rule is lifted at its time.
    wait_for(Duration::from_secs(15), "job-a back at its demand", || {
        ((share_of("job-a") - 1000.0).abs() < 50.0).then_some(())
    });
    assert!(started.elapsed() >= Duration::from_secs(LIFTED_AT.into()));
}
