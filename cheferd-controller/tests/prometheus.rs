//! A real Prometheus (Debian's `prometheus`) scrapes a running global controller with
//! load (a local controller and two jobs doing metadata I/O under the stage), and every
//! query of the Grafana dashboard (`etc/grafana/padll.json`, read here, so the test
//! follows the dashboard) returns data through Prometheus' HTTP query API. The scraped
//! text also passes `promtool check metrics` (format and naming conventions).

use crate::ports::{self, Ports};
use crate::util::{job_id, run_with_timeout, wait_for, Cluster, START_TIMEOUT};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Prometheus answers its first query about 6 s after start; a loaded CI machine may
/// take much longer.
const DATA_DEADLINE: Duration = Duration::from_secs(90);
/// What the dashboard's `$__rate_interval` stands for here (Grafana derives it from
/// the scrape interval): long enough for two 1-s scrapes.
const RATE_INTERVAL: &str = "30s";

fn config() -> &'static str {
    r#"interval_ms = 1000
[[resource]]
name = "{scratch}:metadata"
max_rate = "auto"
target_p50_ms = 50
ceiling = 2000
policy = "psfa"
[[resource]]
name = "{scratch}:data"
max_rate = "100MiB/s"
policy = "psfa"
"#
}

/// A Prometheus server, killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    /// Holds its port while it lives.
    _port: Ports,
}

impl Prometheus {
    /// Starts Prometheus in `dir`, scraping `target` every second, and waits until it
    /// serves (on another port if its was taken).
    fn start(dir: &Path, target: &str) -> Prometheus {
        ports::start_on_fresh_ports(1, "prometheus", |port| {
            Prometheus::try_start(dir, target, port)
        })
    }

    /// [`Prometheus::start`] on `port`, or `None` if the port was taken.
    fn try_start(dir: &Path, target: &str, reserved: Ports) -> Option<Prometheus> {
        let port = reserved.get(0);
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: cheferd\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("prometheus.yml written");
        // `.log`: the cluster prints it when the test fails.
        let log = dir.join("prometheus.log");
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prometheus-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("prometheus starts");
        let mut prometheus = Prometheus {
            child,
            port,
            _port: reserved,
        };
        let ready = wait_for(DATA_DEADLINE, "prometheus to serve", || {
            if http_get(port, "/-/ready").is_ok() {
                return Some(true);
            }
            prometheus.child.try_wait().ok().flatten()?;
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(ports::in_use(&log), "prometheus exited:\n{log}");
            Some(false)
        });
        ready.then_some(prometheus)
    }

    /// An instant query's result vector, or why there is none.
    fn query(&self, promql: &str) -> Result<Vec<serde_json::Value>, String> {
        let encoded =
            percent_encoding::utf8_percent_encode(promql, percent_encoding::NON_ALPHANUMERIC);
        let body = http_get(self.port, &format!("/api/v1/query?query={encoded}"))?;
        let reply: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if reply["status"] != "success" {
            return Err(format!("query failed: {body}"));
        }
        Ok(reply["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of `GET path` on loopback `port` (HTTP/1.0: the server closes).
fn http_get(port: u16, path: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or("no HTTP header end")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "{}: {body}",
            head.lines().next().unwrap_or_default()
        ));
    }
    Ok(body.to_string())
}

/// The dashboard's template variables (name, the PromQL of its `label_values(M, L)`
/// query, and label L) and every panel target's expression.
fn dashboard() -> (Vec<(String, String, String)>, Vec<String>) {
    let path = crate::util::repository().join("etc/grafana/padll.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let json: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let variables = json["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| {
            let name = v["name"].as_str().expect("a variable's name");
            let query = v["query"]["query"].as_str().expect("a query variable");
            let (metric, label) = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .and_then(|q| q.rsplit_once(','))
                .unwrap_or_else(|| panic!("{name}: not label_values(METRIC, LABEL): {query}"));
            (
                name.to_string(),
                metric.trim().to_string(),
                label.trim().to_string(),
            )
        })
        .collect();
    let mut exprs = Vec::new();
    let mut panels: Vec<&serde_json::Value> =
        json["panels"].as_array().expect("panels").iter().collect();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(
                target["expr"]
                    .as_str()
                    .expect("a target's expr")
                    .to_string(),
            );
        }
    }
    (variables, exprs)
}

#[test]
#[cfg_attr(
    not(all(has_prometheus, has_promtool)),
    ignore = "prometheus not installed (Debian package prometheus)"
)]
fn prometheus_scrapes_the_controller_and_every_dashboard_query_has_data() {
    let _turn = crate::util::alone();
    let (variables, exprs) = dashboard();
    assert!(exprs.len() >= 10, "the dashboard has queries: {exprs:?}");
    let mut cluster = Cluster::new(config());
    cluster.start_global();
    cluster.start_local("n1");
    cluster.start_job(&job_id("job-a"), &["n1"], 300);
    cluster.start_job(&job_id("job-b"), &["n1"], 300);
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 2)]);

    let target = format!("127.0.0.1:{}", cluster.metrics_port);
    let scraped = wait_for(START_TIMEOUT, "the metrics endpoint", || {
        http_get(cluster.metrics_port, "/metrics").ok()
    });
    let checked = promtool_check(&scraped, cluster.dir.path());
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{scraped}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let prometheus = Prometheus::start(cluster.dir.path(), &target);
    let deadline = Instant::now() + DATA_DEADLINE;
    loop {
        // Each variable takes the first value Prometheus knows for its label.
        let mut values = Vec::new();
        let mut missing = Vec::new();
        for (name, metric, label) in &variables {
            match prometheus.query(metric).map(|r| {
                r.first()
                    .and_then(|s| s["metric"][label].as_str().map(String::from))
            }) {
                Ok(Some(value)) => values.push((format!("${name}"), value)),
                other => missing.push(format!("variable {name} ({metric}): {other:?}")),
            }
        }
        for expr in &exprs {
            let mut promql = expr.replace("$__rate_interval", RATE_INTERVAL);
            for (variable, value) in &values {
                promql = promql.replace(variable, value);
            }
            if promql.contains('$') {
                missing.push(format!("{expr}: a variable without a value"));
                continue;
            }
            match prometheus.query(&promql) {
                Ok(result) if !result.is_empty() => {}
                other => missing.push(format!("{promql}: {other:?}")),
            }
        }
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {DATA_DEADLINE:?}, dashboard queries without data:\n{}",
            missing.join("\n")
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // The data is the controller's: the jobs' assigned rates add up to Max_R (which
    // `max_rate = "auto"` moves: both from the same scrape).
    let difference = prometheus
        .query(
            "sum(cheferd_job_assigned_rate_ops_per_second) \
             - sum(cheferd_resource_max_rate_ops_per_second)",
        )
        .expect("a difference");
    let difference: f64 = difference[0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("a number");
    assert!(
        difference.abs() < 1.0,
        "assigned rates sum to Max_R {difference:+} tokens/s"
    );
}

/// `promtool check metrics` on `text` (it reads only stdin), with a deadline.
fn promtool_check(text: &str, dir: &Path) -> std::process::Output {
    let path = dir.join("scraped.txt");
    std::fs::write(&path, text).expect("metrics written");
    let mut command = Command::new("sh");
    command
        .args(["-c", "exec promtool check metrics < \"$1\"", "sh"])
        .arg(&path);
    run_with_timeout(&mut command, Duration::from_secs(30))
}
