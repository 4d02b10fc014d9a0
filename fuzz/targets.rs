//! The bodies of the fuzz targets, as plain functions: `fuzz_targets/*.rs` wrap each in
//! `fuzz_target!`, and `cheferd-controller/tests/fuzz_corpus.rs` runs every committed
//! corpus file and a short seeded pass of mutated inputs through them (so CI needs
//! neither nightly nor cargo-fuzz). Each checks only "no panic, no unbounded
//! allocation or hang" plus cheap invariants of what it decoded.
//!
//! Included with `#[path]` by both; it uses only crates both depend on.

#![allow(dead_code)]

use cheferd_controller::admin::AdminRequest;
use cheferd_controller::config::GlobalConfig;
use cheferd_controller::global::Controller;
use cheferd_controller::proto::{LocalMessage, RelayUp};
use padll_wire::channel::{MAX_CHANNELS, MAX_RATE};
use padll_wire::config::{burst_for, MAX_BURST_MS};
use padll_wire::control::{self, ControlMessage, LastRules, StageMessage};
use prost::Message;
use std::sync::Arc;

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target: its name (= `fuzz_targets/<name>.rs` and `corpus/<name>/`) and body.
pub const TARGETS: &[(&str, Target)] = &[
    ("stage_message", stage_message),
    ("control_message", control_message),
    ("stats_report", stats_report),
    ("admin_request", admin_request),
    ("grpc_stream", grpc_stream),
    ("relay_stream", relay_stream),
    ("global_config", global_config),
    ("stage_config", stage_config),
    ("rate_selector", rate_selector),
    ("allocate", allocate),
    ("place", place),
    ("last_rules", last_rules),
    ("placement_feed", placement_feed),
    ("trace_file", trace_file),
];

/// A line as the sockets see it (they drop lines that are not UTF-8).
fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// A decoded JSON line re-encodes to one line that decodes to the same value.
fn json_line<T>(data: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let Some(line) = text(data) else { return };
    let Ok(message) = control::decode::<T>(line) else {
        return;
    };
    let encoded = control::encode(&message);
    assert!(encoded.ends_with('\n') && !encoded[..encoded.len() - 1].contains('\n'));
    let again: T = control::decode(encoded.trim_end()).expect("a re-encoded message decodes");
    assert_eq!(again, message);
}

/// Stage → local controller: `hello`, `usage`, `applied`.
pub fn stage_message(data: &[u8]) {
    json_line::<StageMessage>(data);
}

/// Local controller → stage: `welcome`, `reject`, `collect_usage`, `set_rules`.
pub fn control_message(data: &[u8]) {
    json_line::<ControlMessage>(data);
}

/// A statistics file (`padll stats`): JSON lines of reports; each re-encodes to a line
/// that parses to the same report.
pub fn stats_report(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(reports) = padll_wire::report::parse(text) else {
        return;
    };
    let lines: Vec<String> = reports
        .iter()
        .map(|r| serde_json::to_string(r).expect("a report encodes"))
        .collect();
    let again = padll_wire::report::parse(&lines.join("\n")).expect("re-encoded reports parse");
    assert_eq!(again, reports);
    let _ = padll_wire::report::table(&reports);
}

/// The global controller the registry targets feed: two resources, small caps so the
/// fuzzer can reach them.
const GLOBAL_TOML: &str = r#"
interval_ms = 1000
max_nodes = 4
max_stages_per_node = 8
max_jobs_per_node = 3
[[resource]]
name = "/scratch:metadata"
max_rate = "100k"
policy = "psfa"
[[resource]]
name = "/scratch:data"
max_rate = "1GiB/s"
policy = "uniform"
[[job]]
id = "7"
priority = 2.0
"#;

fn controller() -> Arc<Controller> {
    let config = GlobalConfig::parse(GLOBAL_TOML, &cheferd_controller::policy::check)
        .expect("the fuzz targets' global configuration");
    Controller::new(config).expect("the fuzz targets' controller")
}

/// Checks what every configuration must satisfy, however it was reached.
fn check_global(config: &GlobalConfig) {
    assert!((1..=3_600_000).contains(&config.interval_ms));
    assert!(config.burst_ms >= 1);
    assert!((0.0..=1.0).contains(&config.stage_floor));
    assert!(config.limits.max_nodes >= 1);
    assert!(config.limits.max_stages_per_node >= 1);
    assert!(config.limits.max_jobs_per_node >= 1);
    for r in &config.resources {
        assert!(
            r.max_rate.tokens() >= 1.0 && r.max_rate.tokens() <= MAX_RATE as f64,
            "{}",
            r.max_rate
        );
        cheferd_controller::policy::check(&r.policy).expect("a configured policy exists");
    }
    for job in config.jobs.values() {
        assert!(job.priority > 0.0 && job.priority.is_finite());
        for v in job.demand.values().chain(job.limit.values()) {
            assert!(v.tokens() >= 1.0 && v.tokens() <= MAX_RATE as f64);
        }
    }
    assert!(config.rules.windows(2).all(|w| w[0].at <= w[1].at));
    for rule in &config.rules {
        assert!(rule.at >= 0.0 && rule.at.is_finite());
        assert!(config.resources.iter().any(|r| r.resource == rule.resource));
    }
}

/// An admin request line; a `change` is applied (as an admin's would be) to a fresh
/// controller, which must still hold a valid configuration.
pub fn admin_request(data: &[u8]) {
    let Some(line) = text(data) else { return };
    let Ok(request) = serde_json::from_str::<AdminRequest>(line) else {
        return;
    };
    let encoded = serde_json::to_string(&request).expect("a request encodes");
    let again: AdminRequest = serde_json::from_str(&encoded).expect("a re-encoded request decodes");
    assert_eq!(serde_json::to_string(&again).unwrap(), encoded);
    if let AdminRequest::Change { change } = request {
        let controller = controller();
        let _ = controller.change(change);
        check_global(&controller.config());
        let _ = controller.snapshot();
    }
}

/// Bytes on the gRPC stream: length-delimited `LocalMessage`s as prost decodes them
/// (the first must be a `Register`), fed through the registry twice (the node
/// re-attaches: its stages come back as orphans). The node and stage caps hold.
pub fn grpc_stream(data: &[u8]) {
    let mut rest = data;
    let mut messages = Vec::new();
    while !rest.is_empty() && messages.len() < 4096 {
        match LocalMessage::decode_length_delimited(&mut rest) {
            Ok(message) => {
                let encoded = message.encode_to_vec();
                let again =
                    LocalMessage::decode(&encoded[..]).expect("a re-encoded message decodes");
                assert_eq!(again.encode_to_vec(), encoded);
                messages.push(message);
            }
            Err(_) => break,
        }
    }
    let controller = controller();
    let limits = controller.config().limits;
    for _ in 0..2 {
        let _ = controller.feed_stream(messages.iter().cloned());
        let snapshot = controller.snapshot();
        assert!(snapshot.nodes.len() <= limits.max_nodes);
        for node in &snapshot.nodes {
            assert!(
                node.stages + node.orphans <= limits.max_stages_per_node,
                "{} stages + {} orphans",
                node.stages,
                node.orphans
            );
        }
    }
}

/// Bytes on a relay's stream: length-delimited `RelayUp`s, each many nodes' messages
/// by link, fed through one relay stream and then its end. The node and stage caps
/// hold, and no node stays attached once the relay's stream ended.
pub fn relay_stream(data: &[u8]) {
    let mut rest = data;
    let mut batches = Vec::new();
    while !rest.is_empty() && batches.len() < 256 {
        match RelayUp::decode_length_delimited(&mut rest) {
            Ok(up) => batches.push(up),
            Err(_) => break,
        }
    }
    let controller = controller();
    let limits = controller.config().limits;
    controller.feed_relay(batches);
    let snapshot = controller.snapshot();
    assert!(snapshot.nodes.len() <= limits.max_nodes);
    for node in &snapshot.nodes {
        assert!(
            !node.attached,
            "{} attached after its relay left",
            node.node
        );
        assert!(node.stages + node.orphans <= limits.max_stages_per_node);
    }
}

/// `global.toml`: a parsed configuration is valid and builds a controller.
pub fn global_config(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(config) = GlobalConfig::parse(text, &cheferd_controller::policy::check) else {
        return;
    };
    check_global(&config);
    Controller::new(config).expect("a parsed configuration builds a controller");
}

/// The stage's configuration: `NAME=VALUE` lines (the environment, `PADLL_CONFIG`
/// excepted), then a line `---`, then the TOML file `PADLL_CONFIG` names (without the
/// `---` line: all of it is the file).
/// The warnings about unknown `PADLL_*` names stay one line each.
pub fn stage_config(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let (env, toml) = match text.split_once("\n---\n") {
        Some((env, toml)) => (env, toml),
        None => ("", text),
    };
    let env: Vec<(&str, &str)> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| *k != "PADLL_CONFIG")
        .collect();
    let names = env.iter().map(|(name, _)| std::ffi::OsString::from(name));
    for warning in padll_wire::config::unknown_variables(names) {
        assert!(!warning.contains('\n'), "{warning}");
    }
    let path = std::env::temp_dir().join(format!("padll-fuzz-stage-{}.toml", std::process::id()));
    std::fs::write(&path, toml).expect("writing the configuration file");
    let path = path.to_str().expect("a UTF-8 temporary path").to_string();
    let var = |name: &str| -> Option<String> {
        if name == "PADLL_CONFIG" {
            return Some(path.clone());
        }
        env.iter()
            .rev()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    };
    let loaded = padll_wire::config::load(&var);
    let _ = std::fs::remove_file(&path);
    let Ok(config) = loaded else {
        return;
    };
    assert!(config.mounts.iter().all(|m| m.starts_with('/')));
    for placement in &config.placement {
        assert!(config.mounts.contains(&placement.mount), "{placement:?}");
        assert!((1..=padll_wire::control::MAX_STRIPES).contains(&placement.stripes));
    }
    for spec in config
        .limits
        .iter()
        .chain(config.default_limits.iter().flatten())
    {
        assert!((1..=MAX_RATE).contains(&spec.rate), "{spec:?}");
        let most = burst_for(spec.rate, MAX_BURST_MS);
        assert!((1..=most).contains(&spec.burst), "{spec:?}");
        if let Some(mount) = &spec.mount {
            assert!(config.mounts.contains(mount), "{spec:?}");
        }
    }
}

/// Rates, selectors and `SELECTOR=RATE` rules: a parsed rate is within 1..=MAX_RATE
/// and its plain spelling parses to itself; a selector re-spelt parses to itself.
pub fn rate_selector(data: &[u8]) {
    let Some(text) = text(data) else { return };
    if let Ok(rate) = padll_wire::config::parse_rate(text) {
        assert!((1..=MAX_RATE).contains(&rate.per_second()), "{rate:?}");
        let spelt = match rate {
            padll_wire::config::Rate::Ops(n) => format!("{n}/s"),
            padll_wire::config::Rate::Bytes(n) => format!("{n}B/s"),
        };
        assert_eq!(padll_wire::config::parse_rate(&spelt), Ok(rate));
    }
    if let Ok((mount, scope)) = padll_wire::config::parse_selector(text) {
        let spelt = match &mount {
            Some(m) => format!("{m}:{}", scope.name()),
            None => scope.name().to_string(),
        };
        assert_eq!(
            padll_wire::config::parse_selector(&spelt),
            Ok((mount, scope))
        );
    }
    let burst_ms = data.first().map_or(10, |b| u64::from(*b) * 1000 + 1);
    if let Ok(spec) = padll_wire::config::parse_rule(text, burst_ms) {
        assert!(
            (1..=MAX_RATE).contains(&spec.rate) && spec.burst >= 1,
            "{spec:?}"
        );
    }
}

/// Parameterised specs `allocate` tries besides every plain name the registry builds
/// (`policies::policy_names`); the first byte picks one of them all.
const POLICY_VARIANTS: &[&str] = &["drf:1e9", "psfa:0.3", "psharing:weighted"];
const MAX_RATES: &[f64] = &[0.0, 1.0, 1000.0, 110_000.0, 1e12, 1e300];

/// `policies allocate`: byte 0 picks the policy, byte 1 `--max-rate`, the rest is the
/// JSON on stdin. Accepted input gives JSON with a finite, non-negative rate per job
/// (`baseline`: none).
pub fn allocate(data: &[u8]) {
    let [p, r, json @ ..] = data else { return };
    let names = policies::policy_names();
    let pick = usize::from(*p) % (names.len() + POLICY_VARIANTS.len());
    let policy = names
        .get(pick)
        .copied()
        .unwrap_or_else(|| POLICY_VARIANTS[pick - names.len()]);
    let command = policies::cli::Command::Allocate(policies::cli::AllocateArgs {
        policy: policy.to_string(),
        max_rate: MAX_RATES[usize::from(*r) % MAX_RATES.len()],
        interval: None,
    });
    let mut out = Vec::new();
    if policies::cli::execute(&command, &mut &json[..], &mut out).is_err() {
        return;
    }
    let result: serde_json::Value = serde_json::from_slice(&out).expect("allocate prints JSON");
    for rate in result["rates"].as_array().expect("allocate prints rates") {
        // `baseline` limits nothing: its rates are infinite (JSON null).
        if policy == "baseline" && rate["rate"].is_null() {
            continue;
        }
        let rate = rate["rate"].as_f64().expect("a rate is a number");
        assert!(rate.is_finite() && rate >= 0.0, "{rate}");
    }
}

/// The placers `place` tries (the first byte picks one).
const PLACERS: &[&str] = &["mcmf", "mcmf:0", "mcmf:8,8", "round-robin", "random:1"];

/// `policies place`: byte 0 picks the placer, the rest is the JSON on stdin. Accepted
/// input gives JSON naming a placement per request not dropped.
pub fn place(data: &[u8]) {
    let [p, json @ ..] = data else { return };
    let command = policies::cli::Command::Place(policies::cli::PlaceArgs {
        placer: PLACERS[usize::from(*p) % PLACERS.len()].to_string(),
    });
    let mut out = Vec::new();
    if policies::cli::execute(&command, &mut &json[..], &mut out).is_err() {
        return;
    }
    let result: serde_json::Value = serde_json::from_slice(&out).expect("place prints JSON");
    assert!(result["placements"].is_array(), "{result}");
}

/// A job's last-rules file (`LastRules::decode`): at most 255 rules with rates in
/// 1 … 2⁴⁸ and bursts ≥ 1; they re-encode to a file that decodes to the same.
pub fn last_rules(data: &[u8]) {
    let Ok(rules) = LastRules::decode(data) else {
        return;
    };
    assert!(rules.len() <= MAX_CHANNELS);
    for spec in &rules {
        assert!(
            (1..=MAX_RATE).contains(&spec.rate) && spec.burst >= 1,
            "{spec:?}"
        );
    }
    let again = LastRules::decode(LastRules::encode(&rules).as_bytes());
    assert_eq!(again, Ok(rules));
}

/// The placement service's per-target load feed (`placement_service::parse_feed`): at
/// most 65 536 targets, each with finite space, used ≤ capacity, on a server named.
pub fn placement_feed(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(loads) = cheferd_controller::placement_service::parse_feed(text) else {
        return;
    };
    assert!(loads.targets.len() <= cheferd_controller::placement_service::MAX_TARGETS);
    for target in &loads.targets {
        assert!(target.capacity.is_finite() && (0.0..=target.capacity).contains(&target.used));
    }
}

/// A `padll-trace v1` file (`policies::trace::read`, what `simulate --trace` and the
/// replayer read): a trace read holds at most `MAX_JOBS` jobs spanning `MAX_ROWS`
/// seconds together, none longer than `MAX_SECONDS`.
pub fn trace_file(data: &[u8]) {
    use policies::trace::{self, MAX_JOBS, MAX_ROWS, MAX_SECONDS};
    let Ok(traces) = trace::read(data) else {
        return;
    };
    assert!(traces.len() as u64 <= MAX_JOBS);
    let rows: u64 = traces.iter().map(|t| t.ops.len() as u64).sum();
    assert!(rows <= MAX_ROWS, "{rows}");
    assert!(traces.iter().all(|t| t.ops.len() as u64 <= MAX_SECONDS));
}
