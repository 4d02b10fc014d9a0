//! The global controller's configuration (TOML). Every error names the key and the
//! bad value; nothing starts on a bad file. Every key, its type, default and an
//! example: `etc/README.md`; a sample: `etc/global.toml`.

use padll_wire::channel::{Costs, Scope, MAX_COST, MILLI_TOKENS};
use padll_wire::config::{
    normalize_mount, parse_rate, parse_selector, toml_error, Rate, RateError, RateText,
};
use padll_wire::ops::{Class, Op};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One mountpoint × class.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource {
    /// The mountpoint, as the stages register it.
    pub mount: String,
    /// The class of operations.
    pub class: Class,
}

impl Resource {
    /// Parses `MOUNT:CLASS`: a channel selector (the syntax of `padll run --limit`)
    /// scoped to a mountpoint, naming a class.
    pub fn parse(text: &str) -> Result<Resource, ResourceError> {
        match parse_selector(text) {
            Ok((Some(mount), Scope::Class(class))) => Ok(Resource {
                mount: normalize_mount(&mount),
                class,
            }),
            _ => Err(ResourceError(text.to_string())),
        }
    }

    /// Whether its tokens are bytes (data) or operations.
    pub fn counts_bytes(&self) -> bool {
        self.class == Class::Data
    }

    /// `rate` as a rate of this resource: the one way from a parsed rate to a
    /// resource's capacity, demand or limit, so a bytes rate never configures a
    /// resource counting operations (a plain number is in the resource's own tokens).
    pub fn rate(&self, rate: Rate) -> Result<ResourceRate, UnitMismatch> {
        match rate {
            Rate::Bytes(_) if !self.counts_bytes() => Err(UnitMismatch {
                resource: self.clone(),
            }),
            rate => Ok(self.own_tokens(rate.per_second())),
        }
    }

    /// `per_second` of the resource's own tokens (operations, or bytes for data): a
    /// number the program chose rather than one a user wrote with a unit.
    pub fn own_tokens(&self, per_second: u64) -> ResourceRate {
        ResourceRate(per_second)
    }
}

/// A rate checked against the resource it configures (its capacity, a job's demand
/// or limit), in that resource's tokens per second. Only a [`Resource`] makes one
/// ([`Resource::rate`], [`Resource::own_tokens`]); it becomes a unit-free number only
/// where it enters the policies' arithmetic ([`ResourceRate::tokens`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ResourceRate(u64);

impl ResourceRate {
    /// Tokens per second, for the policies and the plan (unit-free math).
    pub fn tokens(self) -> f64 {
        self.0 as f64
    }
}

/// As the number of tokens per second (a float, as before rates were typed), for
/// `ctl config`.
impl Serialize for ResourceRate {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.tokens())
    }
}

impl std::fmt::Display for ResourceRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A resource [`Resource::parse`] refused (the text as given).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad resource '{0}': expected MOUNT:CLASS with a class (metadata, data, directory or xattr), as in /scratch:metadata")]
pub struct ResourceError(pub String);

/// A bytes rate given to a resource counting operations.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a rate of bytes, but {resource} counts operations")]
pub struct UnitMismatch {
    /// The resource it was given to.
    pub resource: Resource,
}

/// A rate refused for a resource: the key it was given under (`resource[0].max_rate`,
/// `--demand`), the text, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RateOfError {
    /// Not a rate at all.
    #[error("{key}: {error}")]
    Unparsable {
        /// Where it was given.
        key: String,
        /// Why (it keeps the text).
        error: RateError,
    },
    /// A rate, in the wrong unit.
    #[error("{key}: '{text}' is {error}")]
    WrongUnit {
        /// Where it was given.
        key: String,
        /// The rate as given.
        text: String,
        /// Which resource it was for.
        error: UnitMismatch,
    },
}

/// A configuration file [`GlobalConfig::parse`] refused: one line naming the key and
/// the bad value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not TOML, or not this file's shape: `message` names the line and its text, then
    /// what is wrong.
    #[error("{message}")]
    Toml {
        /// The line, its text and what is wrong, for the user.
        message: String,
        /// The parser's error (boxed: it is large, and every `Result` carries the room).
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A number out of its range.
    #[error("{key} = {value}: {range}")]
    OutOfRange {
        /// The key (`interval_ms`, `job[0].priority`).
        key: String,
        /// The value as written.
        value: String,
        /// The allowed range, as a sentence.
        range: &'static str,
    },
    /// A resource name that is no `MOUNT:CLASS`.
    #[error("{key}: {error}")]
    BadResource {
        /// Where it was given.
        key: String,
        /// Why (it keeps the text).
        error: ResourceError,
    },
    /// A `relays` entry that is no node name.
    #[error("relays: {0}")]
    BadRelay(crate::tls::NameError),
    /// A resource or a job configured twice.
    #[error("{key}: '{name}' is configured twice")]
    Duplicate {
        /// Where the second one is.
        key: String,
        /// The name as written.
        name: String,
    },
    /// A job setting or rule for a resource that is not configured.
    #[error("{key}: '{name}' is not a configured resource")]
    NotConfigured {
        /// Where it was given.
        key: String,
        /// The name as written.
        name: String,
    },
    /// A rate that is no rate, or of the wrong unit.
    #[error(transparent)]
    Rate(#[from] RateOfError),
    /// A policy name that builds no policy.
    #[error("{key}: {error}")]
    Policy {
        /// Where it was given.
        key: String,
        /// Why (it keeps the name).
        error: Box<policies::SpecError>,
    },
    /// A bad `weights` entry.
    #[error("{key}: {why}")]
    Weight {
        /// The key (`resource[0].weights.open`).
        key: String,
        /// Why.
        why: String,
    },
    /// A key that means something only with `max_rate = "auto"`.
    #[error("{key}: only with max_rate = \"auto\"")]
    OnlyAuto {
        /// The key.
        key: String,
    },
    /// A key `max_rate = "auto"` needs.
    #[error("{key}: max_rate = \"auto\" needs it (the most Max_R may reach)")]
    AutoNeeds {
        /// The key.
        key: String,
    },
    /// `max_rate = "auto"` settings that do not fit together.
    #[error("{key}: {error}")]
    Auto {
        /// The resource's key.
        key: String,
        /// Why.
        error: policies::capacity::SettingsError,
    },
    /// A bad `[placement]` section.
    #[error(transparent)]
    Placement(#[from] crate::placement_service::PlacementConfigError),
}

impl serde::Serialize for Resource {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Resource {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Resource, D::Error> {
        let text = String::deserialize(deserializer)?;
        Resource::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.mount, self.class)
    }
}

/// One shared resource and how it is shared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResourceConfig {
    /// Mountpoint and class.
    pub resource: Resource,
    /// Capacity `Max_R` (with [`ResourceConfig::auto`], the one in force: it starts at
    /// the ceiling and follows the file system's service times).
    pub max_rate: ResourceRate,
    /// Policy name.
    pub policy: String,
    /// `max_rate = "auto"`: its latency targets, floor and ceiling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoCapacity>,
    /// `weights`: what each operation's call costs, in thousandths of the resource's
    /// tokens (operations not named: one token). Empty for data (bytes).
    #[serde(skip_serializing_if = "Costs::is_empty")]
    pub weights: Costs,
}

/// `max_rate = "auto"`: `Max_R` moves, each interval, toward the largest rate that keeps
/// the resource's service times at their targets (`policies::capacity`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AutoCapacity {
    /// The median service time to hold, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_p50_ms: Option<f64>,
    /// The 99th percentile to hold, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_p99_ms: Option<f64>,
    /// `Max_R` never goes below it.
    pub floor: ResourceRate,
    /// `Max_R` never goes above it; also where it starts.
    pub ceiling: ResourceRate,
}

impl AutoCapacity {
    /// The estimator's settings (seconds and tokens per second).
    pub fn settings(&self) -> policies::capacity::Settings {
        policies::capacity::Settings::new(
            self.target_p50_ms.map(|ms| ms / 1e3),
            self.target_p99_ms.map(|ms| ms / 1e3),
            self.floor.tokens(),
            self.ceiling.tokens(),
        )
    }
}

/// Per-job settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobConfig {
    /// Priority or weight (default 1).
    pub priority: f64,
    /// Demand (QoS reservation) per resource.
    pub demand: BTreeMap<Resource, ResourceRate>,
    /// Static limit per resource.
    pub limit: BTreeMap<Resource, ResourceRate>,
}

/// A time-scheduled static rule.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScheduledRule {
    /// Seconds after start.
    pub at: f64,
    /// Job id.
    pub job: String,
    /// The resource limited.
    pub resource: Resource,
    /// The limit; `None` lifts it.
    pub limit: Option<ResourceRate>,
}

/// The whole configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GlobalConfig {
    /// Control loop period, ms.
    pub interval_ms: u64,
    /// Stage bucket depth, ms of its rate.
    pub burst_ms: u64,
    /// Part of a job's rate split evenly over its stages (the rest follows usage).
    pub stage_floor: f64,
    /// Uids allowed to change settings through the admin socket (root always is).
    pub admins: Vec<u32>,
    /// Node names whose certificates may open a relay stream (`cheferd relay`) and so
    /// speak for the nodes attached through it.
    pub relays: Vec<String>,
    /// The shared resources.
    pub resources: Vec<ResourceConfig>,
    /// Per-job settings, by job id.
    pub jobs: BTreeMap<String, JobConfig>,
    /// Scheduled static rules, in time order.
    pub rules: Vec<ScheduledRule>,
    /// Caps on what local controllers may register.
    #[serde(default)]
    pub limits: GlobalLimits,
    /// Mutual TLS on the gRPC port (`[tls]`; the `--tls-…` flags override it).
    #[serde(default)]
    pub tls: TlsSettings,
    /// The placement service (`[placement]`, see `placement_service`), if any.
    #[serde(default)]
    pub placement: Option<crate::placement_service::PlacementConfig>,
}

/// `[tls]`: the global controller's certificate, key and the CA of node certificates
/// (paths relative to the configuration file's directory), or plaintext when
/// explicitly asked for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// The server certificate (PEM), as `--tls-cert`.
    pub cert: Option<std::path::PathBuf>,
    /// Its private key (PEM), as `--tls-key`.
    pub key: Option<std::path::PathBuf>,
    /// The site CA that signs node certificates (PEM), as `--tls-client-ca`.
    pub client_ca: Option<std::path::PathBuf>,
    /// Serve plaintext, unauthenticated gRPC (as `--insecure-plaintext`).
    #[serde(default)]
    pub insecure_plaintext: bool,
}

/// The global controller's caps against a misbehaving (or hostile) gRPC client; see
/// docs/security.md, Bounds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GlobalLimits {
    /// Local controllers (node names) registered at once, detached ones with orphans
    /// included; a further `Register` is refused.
    pub max_nodes: usize,
    /// Stages of one node; a further `StageJoined` is ignored (logged, rate-limited).
    pub max_stages_per_node: usize,
    /// Distinct job ids among one node's stages; a stage of a further job is ignored.
    pub max_jobs_per_node: usize,
}

impl Default for GlobalLimits {
    fn default() -> GlobalLimits {
        GlobalLimits {
            max_nodes: 16384,
            max_stages_per_node: 4096,
            max_jobs_per_node: 1024,
        }
    }
}

impl Default for GlobalConfig {
    fn default() -> Self {
        GlobalConfig {
            interval_ms: 1000,
            burst_ms: 10,
            stage_floor: 0.1,
            admins: Vec::new(),
            relays: Vec::new(),
            resources: Vec::new(),
            jobs: BTreeMap::new(),
            rules: Vec::new(),
            limits: GlobalLimits::default(),
            tls: TlsSettings::default(),
            placement: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    interval_ms: Option<u64>,
    burst_ms: Option<u64>,
    stage_floor: Option<f64>,
    #[serde(default)]
    admins: Vec<u32>,
    #[serde(default)]
    relays: Vec<String>,
    max_nodes: Option<usize>,
    max_stages_per_node: Option<usize>,
    max_jobs_per_node: Option<usize>,
    #[serde(default)]
    resource: Vec<RawResource>,
    #[serde(default)]
    job: Vec<RawJob>,
    #[serde(default)]
    rule: Vec<RawRule>,
    #[serde(default)]
    tls: TlsSettings,
    placement: Option<crate::placement_service::PlacementConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResource {
    name: String,
    max_rate: RateText,
    policy: String,
    target_p50_ms: Option<f64>,
    target_p99_ms: Option<f64>,
    floor: Option<RateText>,
    ceiling: Option<RateText>,
    #[serde(default)]
    weights: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    id: String,
    priority: Option<f64>,
    #[serde(default)]
    demand: BTreeMap<String, RateText>,
    #[serde(default)]
    limit: BTreeMap<String, RateText>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    at: f64,
    job: String,
    resource: String,
    limit: RateText,
}

/// Parses `text`, given under `key`, as a rate of `resource` (see [`Resource::rate`]).
pub fn rate_of(key: &str, text: &str, resource: &Resource) -> Result<ResourceRate, RateOfError> {
    let rate = parse_rate(text).map_err(|error| RateOfError::Unparsable {
        key: key.to_string(),
        error,
    })?;
    resource.rate(rate).map_err(|error| RateOfError::WrongUnit {
        key: key.to_string(),
        text: text.to_string(),
        error,
    })
}

/// The `Max_R` of `resource[i]`: its `max_rate`, or with `max_rate = "auto"` its
/// ceiling and the settings that move it. Each key only where it means something.
fn capacity_of(
    i: usize,
    r: &RawResource,
    resource: &Resource,
) -> Result<(ResourceRate, Option<AutoCapacity>), ConfigError> {
    let key = |name: &str| format!("resource[{i}].{name}");
    if r.max_rate.0 != "auto" {
        let only_auto = [
            ("target_p50_ms", r.target_p50_ms.is_some()),
            ("target_p99_ms", r.target_p99_ms.is_some()),
            ("floor", r.floor.is_some()),
            ("ceiling", r.ceiling.is_some()),
        ];
        if let Some((name, _)) = only_auto.iter().find(|(_, set)| *set) {
            return Err(ConfigError::OnlyAuto { key: key(name) });
        }
        return Ok((rate_of(&key("max_rate"), &r.max_rate.0, resource)?, None));
    }
    let ceiling = r.ceiling.as_ref().ok_or_else(|| ConfigError::AutoNeeds {
        key: key("ceiling"),
    })?;
    let ceiling = rate_of(&key("ceiling"), &ceiling.0, resource)?;
    // Without a floor: 1 % of the ceiling, as a new job's first share.
    let floor = match &r.floor {
        Some(floor) => rate_of(&key("floor"), &floor.0, resource)?,
        None => resource.own_tokens(ceiling.0.div_ceil(100)),
    };
    for (name, ms) in [
        ("target_p50_ms", r.target_p50_ms),
        ("target_p99_ms", r.target_p99_ms),
    ] {
        if let Some(ms) = ms.filter(|ms| !(ms.is_finite() && *ms > 0.0)) {
            return Err(ConfigError::OutOfRange {
                key: key(name),
                value: ms.to_string(),
                range: "must be a number of milliseconds above 0",
            });
        }
    }
    let auto = AutoCapacity {
        target_p50_ms: r.target_p50_ms,
        target_p99_ms: r.target_p99_ms,
        floor,
        ceiling,
    };
    auto.settings()
        .validate()
        .map_err(|error| ConfigError::Auto {
            key: format!("resource[{i}]"),
            error,
        })?;
    Ok((ceiling, Some(auto)))
}

/// The `weights` of `resource[i]`: operations of its class, each from 0 to 1000 tokens
/// a call, kept in thousandths.
fn weights_of(
    i: usize,
    weights: &BTreeMap<String, f64>,
    resource: &Resource,
) -> Result<Costs, ConfigError> {
    if resource.counts_bytes() && !weights.is_empty() {
        return Err(ConfigError::Weight {
            key: format!("resource[{i}].weights"),
            why: format!("{resource} counts bytes; weights are for resources counting calls"),
        });
    }
    let mut costs = Vec::new();
    for (name, weight) in weights {
        let key = format!("resource[{i}].weights.{name}");
        let Some(op) = Op::from_name(name) else {
            let names: Vec<&str> = Op::ALL
                .iter()
                .filter(|op| op.class() == resource.class)
                .map(|op| op.name())
                .collect();
            let why = format!(
                "no operation '{name}' (those of {resource}: {})",
                names.join(", ")
            );
            return Err(ConfigError::Weight { key, why });
        };
        if op.class() != resource.class {
            let why = format!(
                "'{name}' is a {} operation, not one of {resource}",
                op.class()
            );
            return Err(ConfigError::Weight { key, why });
        }
        let max = (MAX_COST / MILLI_TOKENS) as f64;
        if !(weight.is_finite() && (0.0..=max).contains(weight)) {
            return Err(ConfigError::OutOfRange {
                key,
                value: weight.to_string(),
                range: "must be a number of tokens from 0 to 1000",
            });
        }
        costs.push((op, (weight * MILLI_TOKENS as f64).round() as u32));
    }
    // Each operation is named once (a TOML table), within MAX_COST (checked above).
    Costs::new(costs).map_err(|error| ConfigError::Weight {
        key: format!("resource[{i}].weights"),
        why: error.to_string(),
    })
}

impl GlobalConfig {
    /// Parses and validates a TOML configuration; `policy_exists` says which policy
    /// names are known.
    pub fn parse(
        text: &str,
        policy_exists: &dyn Fn(&str) -> Result<(), policies::SpecError>,
    ) -> Result<GlobalConfig, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|source| ConfigError::Toml {
            message: toml_error(text, &source),
            source: Box::new(source),
        })?;
        let out_of_range =
            |key: &str, value: &dyn std::fmt::Display, range| ConfigError::OutOfRange {
                key: key.to_string(),
                value: value.to_string(),
                range,
            };
        let mut config = GlobalConfig::default();
        if let Some(ms) = raw.interval_ms {
            if ms == 0 || ms > 3_600_000 {
                return Err(out_of_range(
                    "interval_ms",
                    &ms,
                    "must be between 1 and 3600000",
                ));
            }
            config.interval_ms = ms;
        }
        if let Some(ms) = raw.burst_ms {
            // The stages' own bound: a deeper bucket lets an idle job run unlimited for
            // as long.
            if ms == 0 || ms > padll_wire::config::MAX_BURST_MS {
                return Err(out_of_range("burst_ms", &ms, "must be between 1 and 60000"));
            }
            config.burst_ms = ms;
        }
        if let Some(floor) = raw.stage_floor {
            if !(0.0..=1.0).contains(&floor) {
                return Err(out_of_range(
                    "stage_floor",
                    &floor,
                    "must be between 0 and 1",
                ));
            }
            config.stage_floor = floor;
        }
        config.admins = raw.admins;
        for name in &raw.relays {
            crate::tls::check_name(name).map_err(ConfigError::BadRelay)?;
        }
        config.relays = raw.relays;
        config.tls = raw.tls;
        if let Some(placement) = &raw.placement {
            placement.validate()?;
        }
        config.placement = raw.placement;
        for (key, value, slot) in [
            ("max_nodes", raw.max_nodes, &mut config.limits.max_nodes),
            (
                "max_stages_per_node",
                raw.max_stages_per_node,
                &mut config.limits.max_stages_per_node,
            ),
            (
                "max_jobs_per_node",
                raw.max_jobs_per_node,
                &mut config.limits.max_jobs_per_node,
            ),
        ] {
            match value {
                Some(0) => return Err(out_of_range(key, &0, "must be at least 1")),
                Some(n) => *slot = n,
                None => {}
            }
        }
        let parse_resource = |key: String, name: &str| {
            Resource::parse(name).map_err(|error| ConfigError::BadResource { key, error })
        };
        for (i, r) in raw.resource.iter().enumerate() {
            let resource = parse_resource(format!("resource[{i}].name"), &r.name)?;
            if config.resources.iter().any(|c| c.resource == resource) {
                return Err(ConfigError::Duplicate {
                    key: format!("resource[{i}].name"),
                    name: r.name.clone(),
                });
            }
            let (max_rate, auto) = capacity_of(i, r, &resource)?;
            policy_exists(&r.policy).map_err(|error| ConfigError::Policy {
                key: format!("resource[{i}].policy"),
                error: Box::new(error),
            })?;
            let weights = weights_of(i, &r.weights, &resource)?;
            config.resources.push(ResourceConfig {
                resource,
                max_rate,
                policy: r.policy.clone(),
                auto,
                weights,
            });
        }
        let known = |key: String, name: &str, resources: &[ResourceConfig]| {
            let resource = parse_resource(key.clone(), name)?;
            if resources.iter().any(|c| c.resource == resource) {
                Ok(resource)
            } else {
                Err(ConfigError::NotConfigured {
                    key,
                    name: name.to_string(),
                })
            }
        };
        for (i, j) in raw.job.iter().enumerate() {
            if config.jobs.contains_key(&j.id) {
                return Err(ConfigError::Duplicate {
                    key: format!("job[{i}].id"),
                    name: j.id.clone(),
                });
            }
            let priority = j.priority.unwrap_or(1.0);
            if !policies::priority_ok(priority) {
                return Err(out_of_range(
                    &format!("job[{i}].priority"),
                    &priority,
                    policies::PRIORITY_RANGE,
                ));
            }
            let mut job = JobConfig {
                priority,
                ..JobConfig::default()
            };
            for (name, value) in &j.demand {
                let key = format!("job[{i}].demand.\"{name}\"");
                let resource = known(key.clone(), name, &config.resources)?;
                let value = rate_of(&key, &value.0, &resource)?;
                job.demand.insert(resource, value);
            }
            for (name, value) in &j.limit {
                let key = format!("job[{i}].limit.\"{name}\"");
                let resource = known(key.clone(), name, &config.resources)?;
                let value = rate_of(&key, &value.0, &resource)?;
                job.limit.insert(resource, value);
            }
            config.jobs.insert(j.id.clone(), job);
        }
        for (i, r) in raw.rule.iter().enumerate() {
            if !(r.at >= 0.0 && r.at.is_finite()) {
                return Err(out_of_range(
                    &format!("rule[{i}].at"),
                    &r.at,
                    "must be a non-negative number of seconds",
                ));
            }
            let resource = known(
                format!("rule[{i}].resource"),
                &r.resource,
                &config.resources,
            )?;
            let limit = if r.limit.0 == "none" {
                None
            } else {
                Some(rate_of(&format!("rule[{i}].limit"), &r.limit.0, &resource)?)
            };
            config.rules.push(ScheduledRule {
                at: r.at,
                job: r.job.clone(),
                resource,
                limit,
            });
        }
        config.rules.sort_by(|a, b| a.at.total_cmp(&b.at));
        Ok(config)
    }

    /// What is legal but most likely a mistake, one line each, for the log at start.
    pub fn warnings(&self) -> Vec<String> {
        if self.resources.is_empty() {
            vec![
                "the configuration has no [[resource]]: nothing is shared and no stage is limited"
                    .into(),
            ]
        } else {
            Vec::new()
        }
    }

    /// The settings of a job (defaults for unknown jobs).
    pub fn job(&self, id: &str) -> JobConfig {
        self.jobs.get(id).cloned().unwrap_or(JobConfig {
            priority: 1.0,
            ..JobConfig::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use padll_wire::config::MAX_BURST_MS;

    #[test]
    fn resource_parsing() {
        assert_eq!(
            Resource::parse("/scratch/:data").unwrap().to_string(),
            "/scratch:data"
        );
        for bad in [
            "scratch:data",
            "/scratch:bogus",
            "/scratch",
            "/scratch:open",
        ] {
            // (A selector of one operation is no resource.)
            let error = Resource::parse(bad).unwrap_err();
            assert_eq!(error.0, bad);
            assert!(error.to_string().contains(&format!("'{bad}'")), "{error}");
        }
    }

    #[test]
    fn rates_keep_their_unit_to_the_resource() {
        let metadata = Resource::parse("/s:metadata").unwrap();
        let data = Resource::parse("/s:data").unwrap();
        assert_eq!(metadata.rate(Rate::Ops(5)), Ok(metadata.own_tokens(5)));
        assert_eq!(data.rate(Rate::Bytes(5)), Ok(data.own_tokens(5)));
        // A plain number counts the resource's own tokens.
        assert_eq!(data.rate(Rate::Ops(5)), Ok(data.own_tokens(5)));
        assert_eq!(
            metadata.rate(Rate::Bytes(5)),
            Err(UnitMismatch {
                resource: metadata.clone()
            })
        );
        let error = rate_of("--limit", "1KiB", &metadata).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--limit: '1KiB' is a rate of bytes, but /s:metadata counts operations"
        );
    }

    fn parse(text: &str) -> Result<GlobalConfig, String> {
        GlobalConfig::parse(text, &crate::policy::check).map_err(|e| e.to_string())
    }

    #[test]
    fn full_example() {
        let config = parse(
            r#"
            interval_ms = 500
            [[resource]]
            name = "/scratch:metadata"
            max_rate = "110k"
            policy = "psfa"
            [[job]]
            id = "4242"
            priority = 2
            demand = { "/scratch:metadata" = "40k" }
            limit = { "/scratch:metadata" = "10k" }
            [[rule]]
            at = 60
            job = "4242"
            resource = "/scratch:metadata"
            limit = "none"
            "#,
        )
        .unwrap();
        assert_eq!(config.interval_ms, 500);
        let metadata = Resource::parse("/scratch:metadata").unwrap();
        assert_eq!(config.resources[0].max_rate, metadata.own_tokens(110_000));
        let job = config.job("4242");
        assert_eq!(job.priority, 2.0);
        assert_eq!(job.demand[&metadata], metadata.own_tokens(40_000));
        assert_eq!(job.limit[&metadata], metadata.own_tokens(10_000));
        assert_eq!(config.rules[0].limit, None);
        assert_eq!(config.job("other").priority, 1.0);
    }

    #[test]
    fn rates_are_numbers_or_strings() {
        let expected = Resource::parse("/s:metadata").unwrap().own_tokens(110_000);
        for written in ["110000", "110000.0", "\"110000\"", "\"110k\"", "\"110k/s\""] {
            let config = parse(&format!(
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = {written}\npolicy = \"psfa\"\n\
                 [[job]]\nid = \"j\"\ndemand = {{ \"/s:metadata\" = {written} }}\n\
                 [[rule]]\nat = 1\njob = \"j\"\nresource = \"/s:metadata\"\nlimit = {written}"
            ))
            .unwrap_or_else(|e| panic!("{written}: {e}"));
            assert_eq!(config.resources[0].max_rate, expected, "{written}");
            let job = config.job("j");
            assert_eq!(job.demand.values().next(), Some(&expected), "{written}");
            assert_eq!(config.rules[0].limit, Some(expected), "{written}");
        }
        let data =
            parse("[[resource]]\nname = \"/s:data\"\nmax_rate = \"20GiB/s\"\npolicy = \"psfa\"")
                .unwrap();
        assert_eq!(data.resources[0].max_rate.tokens(), (20u64 << 30) as f64);
    }

    #[test]
    fn warns_without_resources() {
        assert_eq!(parse("").unwrap().warnings().len(), 1);
        assert_eq!(parse("interval_ms = 500").unwrap().warnings().len(), 1);
        let shared =
            parse("[[resource]]\nname = \"/s:data\"\nmax_rate = \"1GiB/s\"\npolicy = \"psfa\"");
        assert!(shared.unwrap().warnings().is_empty());
    }

    #[test]
    fn the_deepest_bucket_is_the_stages() {
        assert!(parse(&format!("burst_ms = {MAX_BURST_MS}")).is_ok());
        assert!(parse(&format!("burst_ms = {}", MAX_BURST_MS + 1)).is_err());
    }

    #[test]
    fn errors_name_key_and_value() {
        for (text, needle) in [
            ("interval_ms = 0", "interval_ms = 0"),
            // The stages' bound (`MAX_BURST_MS`), named.
            (
                "burst_ms = 60001",
                "burst_ms = 60001: must be between 1 and 60000",
            ),
            ("bogus = 1", "bogus"),
            (
                "[[resource]]\nname = \"scratch:metadata\"\nmax_rate = \"1k\"\npolicy = \"psfa\"",
                "resource[0].name",
            ),
            (
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = \"fast\"\npolicy = \"psfa\"",
                "resource[0].max_rate",
            ),
            (
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = \"1k\"\npolicy = \"magic\"",
                "resource[0].policy: unknown policy `magic`",
            ),
            (
                "[[job]]\nid = \"1\"\ndemand = { \"/nope:data\" = \"1k\" }",
                "'/nope:data' is not a configured resource",
            ),
            ("[[job]]\nid = \"1\"\npriority = -1", "job[0].priority = -1"),
            (
                "[[job]]\nid = \"1\"\npriority = 2e6",
                "job[0].priority = 2000000: must be from 0.000001 to 1000000",
            ),
            (
                "[[job]]\nid = \"1\"\n[[job]]\nid = \"2\"\n[[job]]\nid = \"1\"\npriority = 2",
                "job[2].id: '1' is configured twice",
            ),
            (
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = \"20GiB/s\"\npolicy = \"psfa\"",
                "resource[0].max_rate: '20GiB/s' is a rate of bytes, but /s:metadata counts operations",
            ),
            (
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = \"1k\"\npolicy = \"psfa\"\n\
                 [[job]]\nid = \"1\"\nlimit = { \"/s:metadata\" = \"1MiB/s\" }",
                "job[0].limit.\"/s:metadata\": '1MiB/s' is a rate of bytes, but /s:metadata counts operations",
            ),
            (
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = \"1k\"\npolicy = \"psfa\"\n\
                 [[rule]]\nat = 5\njob = \"1\"\nresource = \"/s:metadata\"\nlimit = \"1MB\"",
                "rule[0].limit: '1MB' is a rate of bytes, but /s:metadata counts operations",
            ),
            (
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = -5\npolicy = \"psfa\"",
                "resource[0].max_rate: bad rate '-5': must not be negative",
            ),
            (
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = nan\npolicy = \"psfa\"",
                "resource[0].max_rate: bad rate 'NaN': must be a finite number",
            ),
            (
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = inf\npolicy = \"psfa\"",
                "resource[0].max_rate: bad rate 'inf': must be a finite number",
            ),
            (
                "[[resource]]\nname = \"/s:metadata\"\nmax_rate = \"1k\"\npolicy = \"psfa\"\n\
                 [[job]]\nid = \"1\"\ndemand = { \"/s:metadata\" = -5 }",
                "job[0].demand.\"/s:metadata\": bad rate '-5': must not be negative",
            ),
            (
                "interval_ms = 1000\n[[resource]]\nname = \"/s:metadata\"\nmax_rate = true\npolicy = \"psfa\"",
                "line 4 `max_rate = true`: invalid type: boolean `true`, expected a rate",
            ),
            ("interval_ms = -5", "line 1 `interval_ms = -5`"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{err:?} should contain {needle:?}");
        }
    }

    #[test]
    fn auto_capacity_has_targets_a_floor_and_a_ceiling() {
        let metadata = Resource::parse("/s:metadata").unwrap();
        let resource =
            |keys: &str| format!("[[resource]]\nname = \"/s:metadata\"\npolicy = \"psfa\"\n{keys}");
        let config = parse(&resource(
            "max_rate = \"auto\"\ntarget_p50_ms = 0.5\nceiling = \"20k\"",
        ))
        .unwrap();
        let r = &config.resources[0];
        assert_eq!(
            r.max_rate,
            metadata.own_tokens(20_000),
            "starts at the ceiling"
        );
        let auto = r.auto.as_ref().unwrap();
        assert_eq!(auto.floor, metadata.own_tokens(200), "1 % of the ceiling");
        assert_eq!((auto.target_p50_ms, auto.target_p99_ms), (Some(0.5), None));
        let settings = auto.settings();
        assert_eq!(settings.target_p50, Some(0.0005));
        assert_eq!((settings.floor, settings.ceiling), (200.0, 20_000.0));
        let both = parse(&resource(
            "max_rate = \"auto\"\ntarget_p99_ms = 5\ntarget_p50_ms = 1\nfloor = 50\nceiling = 1000",
        ))
        .unwrap();
        assert_eq!(
            both.resources[0].auto.as_ref().unwrap().floor,
            metadata.own_tokens(50)
        );
        assert_eq!(
            parse(&resource("max_rate = 1000")).unwrap().resources[0].auto,
            None
        );
        for (keys, needle) in [
            (
                "max_rate = \"auto\"\ntarget_p50_ms = 1",
                "resource[0].ceiling: max_rate = \"auto\" needs it",
            ),
            (
                "max_rate = \"auto\"\nceiling = 1000",
                "resource[0]: max_rate = \"auto\" needs target_p50_ms or target_p99_ms",
            ),
            (
                "max_rate = \"auto\"\ntarget_p50_ms = -1\nceiling = 1000",
                "resource[0].target_p50_ms = -1: must be a number of milliseconds above 0",
            ),
            (
                "max_rate = \"auto\"\ntarget_p99_ms = nan\nceiling = 1000",
                "resource[0].target_p99_ms = NaN",
            ),
            (
                "max_rate = \"auto\"\ntarget_p50_ms = 1\nfloor = 2000\nceiling = 1000",
                "resource[0]: floor must be ≤ ceiling, got floor 2000 > ceiling 1000",
            ),
            (
                "max_rate = \"auto\"\ntarget_p50_ms = 1\nceiling = \"1GiB/s\"",
                "resource[0].ceiling: '1GiB/s' is a rate of bytes",
            ),
            (
                "max_rate = \"auto\"\ntarget_p50_ms = 1\nfloor = \"slow\"\nceiling = 10",
                "resource[0].floor",
            ),
            (
                "max_rate = 1000\ntarget_p50_ms = 1",
                "resource[0].target_p50_ms: only with max_rate = \"auto\"",
            ),
            (
                "max_rate = 1000\nceiling = 5000",
                "resource[0].ceiling: only with max_rate = \"auto\"",
            ),
        ] {
            let err = parse(&resource(keys)).unwrap_err();
            assert!(err.contains(needle), "{err:?} should contain {needle:?}");
        }
    }

    #[test]
    fn weights_are_operations_of_the_class_kept_in_thousandths() {
        let resource = |class: &str, weights: &str| {
            format!(
                "[[resource]]\nname = \"/s:{class}\"\nmax_rate = 1000\npolicy = \"psfa\"\nweights = {{ {weights} }}"
            )
        };
        let config = parse(&resource("metadata", "open = 3, close = 0, getattr = 0.1")).unwrap();
        let weights = &config.resources[0].weights;
        assert_eq!(
            weights.iter().collect::<Vec<_>>(),
            vec![(Op::Open, 3000), (Op::Close, 0), (Op::Getattr, 100)]
        );
        assert_eq!(weights.of(Op::Unlink), 1000, "not named: one token");
        assert!(parse(&resource("metadata", "")).unwrap().resources[0]
            .weights
            .is_empty());
        for (class, weights, needle) in [
            (
                "metadata",
                "create = 3",
                "resource[0].weights.create: no operation 'create' (those of /s:metadata: open, close, getattr",
            ),
            (
                "metadata",
                "read = 2",
                "resource[0].weights.read: 'read' is a data operation, not one of /s:metadata",
            ),
            (
                "data",
                "read = 2",
                "resource[0].weights: /s:data counts bytes; weights are for resources counting calls",
            ),
            (
                "metadata",
                "open = -1",
                "resource[0].weights.open = -1: must be a number of tokens from 0 to 1000",
            ),
            ("metadata", "open = 1001", "resource[0].weights.open = 1001"),
            ("metadata", "open = nan", "resource[0].weights.open = NaN"),
            ("metadata", "open = \"3\"", "invalid type: string"),
        ] {
            let err = parse(&resource(class, weights)).unwrap_err();
            assert!(err.contains(needle), "{err:?} should contain {needle:?}");
        }
    }
}
