//! Run-time configuration: environment variables, optionally a TOML file, and the rule
//! syntax shared with `padll run --limit`.
//!
//! | variable | meaning |
//! |---|---|
//! | `PADLL_MOUNTS` | `:`-separated mountpoints to manage |
//! | `PADLL_RULES` | `,`-separated `SELECTOR=RATE` limits (see [`parse_rule`]) |
//! | `PADLL_BURST_MS` | bucket depth, as milliseconds of the rate (default 10) |
//! | `PADLL_LIMIT_SCOPE` | `job`: a limit binds all the job's processes on this node together (default when a job id is known); `process`: each process on its own (default without a job id) |
//! | `PADLL_JOB_ID`, `PADLL_JOB_SIZE`, `PADLL_USER`, `PADLL_ACCOUNT` | identity (else taken from Slurm, PBS, LSF or Flux; `padll run` without any sets `run-<its pid>` so a whole run is one job) |
//! | `PADLL_STATS` | write statistics at exit: a table, or JSON lines if the name ends in `.json`; `%p` → pid |
//! | `PADLL_CONTROLLER` | Unix socket of the node's local controller (`cheferd local`): rules then come from the control plane |
//! | `PADLL_CONTROLLER_UID` | the uid `cheferd local` runs as, if not root: rules are taken only from a controller running as root, this uid or the stage's own uid |
//! | `PADLL_PLACEMENT` | `,`-separated `MOUNT[=STRIPES]`: new files under these (Lustre) mountpoints get their storage targets from the controller (see [`Placement`]) |
//! | `PADLL_PLACEMENT_WAIT_MS` | how long a file creation waits for its targets (default 50; no answer → created as usual) |
//! | `PADLL_DEFAULT_LIMIT` | limits (as `PADLL_RULES`) for a program whose controller gives it no rules at start and whose job has no last known rules on this node; `0` = unthrottled; unset: `PADLL_RULES` stand |
//! | `PADLL_LOG` | `error` (default), `warn`, `info`, `debug`, or `off` |
//! | `PADLL_CONFIG` | a TOML file with the same settings (variables override it) |

pub use crate::channel::LimitScope;
use crate::channel::{ChannelSpec, Scope, Unit};
use serde::{Deserialize, Serialize};

/// Default bucket depth, in milliseconds' worth of the rate.
pub const DEFAULT_BURST_MS: u64 = 10;

/// A rate as written by a user: `5000/s`, `2k`, `100MiB/s`, `1.5GB/s`. Its unit is its
/// variant, so no use of the number can forget what it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rate {
    /// Requests per second: a plain number, or one with a `k`, `M` or `G` multiplier.
    Ops(u64),
    /// Bytes per second: a unit naming bytes (`B`, `KiB`, `MB`, …).
    Bytes(u64),
}

impl Rate {
    /// Tokens per second, whatever they count.
    pub fn per_second(self) -> u64 {
        match self {
            Rate::Ops(n) | Rate::Bytes(n) => n,
        }
    }

    /// What its tokens count.
    pub fn unit(self) -> Unit {
        match self {
            Rate::Ops(_) => Unit::Requests,
            Rate::Bytes(_) => Unit::Bytes,
        }
    }
}

/// A rate [`parse_rate`] refused: the text as given and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad rate '{text}': {kind}")]
pub struct RateError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub kind: RateErrorKind,
}

/// Why a rate was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RateErrorKind {
    /// A minus sign.
    #[error("must not be negative")]
    Negative,
    /// `inf`, `infinity` or `nan`.
    #[error("must be a finite number")]
    NotFinite,
    /// No number where one was expected.
    #[error("expected a number such as 5000/s or 100MiB/s")]
    NotANumber,
    /// A suffix that is no unit (kept).
    #[error("unknown unit '{0}' (use k, M, G, B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")]
    UnknownUnit(String),
    /// Less than one token per second once rounded.
    #[error("must be at least 1 per second")]
    BelowOne,
    /// Above [`crate::channel::MAX_RATE`].
    #[error("too large")]
    TooLarge,
}

/// Parses a rate. A unit containing `B` counts bytes (`KB` = 1000 B, `KiB` = 1024 B);
/// otherwise the rate counts requests, with optional `k`, `M`, `G` multipliers.
/// `/s` is optional.
pub fn parse_rate(text: &str) -> Result<Rate, RateError> {
    let bad = |kind| RateError {
        text: text.to_string(),
        kind,
    };
    let trimmed = text.trim();
    let body = trimmed.strip_suffix("/s").unwrap_or(trimmed).trim();
    if body.starts_with('-') {
        return Err(bad(RateErrorKind::Negative));
    }
    let lowered = body.trim_start_matches('+').to_ascii_lowercase();
    if ["inf", "infinity", "nan"].contains(&lowered.as_str()) {
        return Err(bad(RateErrorKind::NotFinite));
    }
    let split = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(split);
    let value: f64 = number.parse().map_err(|_| bad(RateErrorKind::NotANumber))?;
    let (multiplier, unit): (f64, fn(u64) -> Rate) = match suffix.trim() {
        "" => (1.0, Rate::Ops),
        "k" | "K" => (1e3, Rate::Ops),
        "M" => (1e6, Rate::Ops),
        "G" => (1e9, Rate::Ops),
        "B" => (1.0, Rate::Bytes),
        "kB" | "KB" => (1e3, Rate::Bytes),
        "MB" => (1e6, Rate::Bytes),
        "GB" => (1e9, Rate::Bytes),
        "TB" => (1e12, Rate::Bytes),
        "KiB" => (1024.0, Rate::Bytes),
        "MiB" => (1024.0 * 1024.0, Rate::Bytes),
        "GiB" => (1024.0 * 1024.0 * 1024.0, Rate::Bytes),
        "TiB" => (1024.0 * 1024.0 * 1024.0 * 1024.0, Rate::Bytes),
        other => return Err(bad(RateErrorKind::UnknownUnit(other.to_string()))),
    };
    let per_second = (value * multiplier).round();
    if per_second < 1.0 {
        return Err(bad(RateErrorKind::BelowOne));
    }
    if per_second > crate::channel::MAX_RATE as f64 {
        return Err(bad(RateErrorKind::TooLarge));
    }
    Ok(unit(per_second as u64))
}

/// A rate as a configuration file writes it: a number of tokens per second (`110000`)
/// or a string in the [`parse_rate`] syntax (`"110k"`, `"20GiB/s"`). Kept as text until
/// the key it belongs to is known, so an error can name the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateText(pub String);

impl<'de> Deserialize<'de> for RateText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RateText;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a rate: a number per second or a string such as \"110k\" or \"20GiB/s\"",
                )
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<RateText, E> {
                Ok(RateText(text.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<RateText, E> {
                Ok(RateText(n.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<RateText, E> {
                Ok(RateText(n.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<RateText, E> {
                Ok(RateText(n.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A TOML error as one line: the line it is on (with its text, which shows the key)
/// and what is wrong.
pub fn toml_error(text: &str, error: &toml::de::Error) -> String {
    let Some(at) = error.span().map(|s| s.start.min(text.len())) else {
        return error.message().to_string();
    };
    let line = text.as_bytes()[..at]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1;
    let content = text.lines().nth(line - 1).unwrap_or_default().trim();
    let content: String = content.chars().take(80).collect();
    format!("line {line} `{content}`: {}", error.message())
}

/// A selector [`parse_selector`] refused: the text as given and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad selector '{text}': {kind}")]
pub struct SelectorError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub kind: SelectorErrorKind,
}

/// Why a selector was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorErrorKind {
    /// A scope before `:` that is not an absolute path.
    #[error("a scope must be an absolute mountpoint, as in /scratch:metadata")]
    RelativeMount,
    /// A name that is no operation, class or `all` (kept).
    #[error("'{0}' is not 'all', a class (metadata, data, directory, xattr) or an operation ({ops})", ops = crate::ops::Op::ALL.iter().map(|o| o.name()).collect::<Vec<_>>().join(", "))]
    UnknownName(String),
}

/// A selector: an operation, class or `all`, optionally scoped to one mountpoint
/// (`/scratch:metadata`).
pub fn parse_selector(text: &str) -> Result<(Option<String>, Scope), SelectorError> {
    let bad = |kind| SelectorError {
        text: text.to_string(),
        kind,
    };
    let (mount, name) = match text.rsplit_once(':') {
        Some((mount, name)) if mount.starts_with('/') => (Some(mount.to_string()), name),
        Some(_) => return Err(bad(SelectorErrorKind::RelativeMount)),
        None => (None, text),
    };
    let scope =
        Scope::parse(name).ok_or_else(|| bad(SelectorErrorKind::UnknownName(name.to_string())))?;
    Ok((mount, scope))
}

/// A rule [`parse_rule`] refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// No `=` (the text as given).
    #[error(
        "bad limit '{0}': expected SELECTOR=RATE, as in open=5000/s or /scratch:data=100MiB/s"
    )]
    NoRate(String),
    /// A bad selector before the `=`.
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// A bad rate after it.
    #[error(transparent)]
    Rate(#[from] RateError),
}

/// Parses `SELECTOR=RATE` into a channel spec whose burst is `burst_ms` of the rate.
pub fn parse_rule(text: &str, burst_ms: u64) -> Result<ChannelSpec, RuleError> {
    let (selector, rate) = text
        .rsplit_once('=')
        .ok_or_else(|| RuleError::NoRate(text.to_string()))?;
    let (mount, scope) = parse_selector(selector.trim())?;
    let rate = parse_rate(rate)?;
    Ok(ChannelSpec {
        mount: mount.map(|m| normalize_mount(&m)),
        scope,
        rate: rate.per_second(),
        unit: rate.unit(),
        burst: burst_for(rate.per_second(), burst_ms),
    })
}

/// Bucket depth for a rate: `burst_ms` worth of tokens, at least one.
pub fn burst_for(rate: u64, burst_ms: u64) -> u64 {
    ((rate as u128 * burst_ms as u128) / 1000).clamp(1, u64::MAX as u128) as u64
}

/// Folds a mountpoint's spelling (`/scratch/` → `/scratch`) so rules and the mount
/// list agree.
pub fn normalize_mount(mount: &str) -> String {
    let trimmed = mount.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_string()
    } else {
        trimmed.to_string()
    }
}

/// Who this process works for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// Job id (`PADLL_JOB_ID`, else the batch system's; `pid-<pid>` when none).
    pub job_id: String,
    /// Nodes allocated to the job (1 when unknown).
    pub job_size: u32,
    /// User name.
    pub user: String,
    /// Account / group the job is charged to.
    pub account: String,
    /// Numeric user id.
    pub uid: u32,
    /// Numeric group id.
    pub gid: u32,
    /// Host name.
    pub hostname: String,
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
}

/// Log verbosity for the stage's stderr messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Nothing at all.
    Off,
    /// Only problems that change behaviour (bad configuration).
    Error,
    /// Also recoverable oddities.
    Warn,
    /// Also start-up and exit summaries.
    Info,
    /// Everything.
    Debug,
}

impl LogLevel {
    fn parse(text: &str) -> Result<LogLevel, LogLevelError> {
        match text {
            "off" => Ok(LogLevel::Off),
            "error" => Ok(LogLevel::Error),
            "warn" => Ok(LogLevel::Warn),
            "info" => Ok(LogLevel::Info),
            "debug" => Ok(LogLevel::Debug),
            other => Err(LogLevelError(other.to_string())),
        }
    }
}

/// A log level that is none of [`LogLevel`]'s names (the text).
#[derive(Debug, thiserror::Error)]
#[error("bad log level '{0}' (use off, error, warn, info, debug)")]
struct LogLevelError(String);

/// The stage's whole configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Mountpoints to manage.
    pub mounts: Vec<String>,
    /// Limits to install at start.
    pub limits: Vec<ChannelSpec>,
    /// Whom those limits bind: the job's processes on this node together, or each
    /// process.
    pub limit_scope: LimitScope,
    /// Who we are.
    pub identity: Identity,
    /// Where to write statistics at exit.
    pub stats_path: Option<String>,
    /// How chatty to be on stderr.
    pub log: LogLevel,
    /// The local controller's Unix socket, if the stage is under dynamic control.
    pub controller: Option<String>,
    /// The uid the local controller runs as, if not root (rules from a peer of another
    /// uid are refused).
    pub controller_uid: Option<u32>,
    /// Limits for a program under a controller that gives it no rules at start when its
    /// job has no last known rules on this node (`PADLL_DEFAULT_LIMIT`): `None` keeps
    /// [`Config::limits`]; an empty list (`0`) means unthrottled.
    pub default_limits: Option<Vec<ChannelSpec>>,
    /// Mountpoints whose new files are placed by the control plane.
    pub placement: Vec<Placement>,
    /// How long a file creation waits for its targets.
    pub placement_wait_ms: u64,
}

/// A mountpoint whose new files get their storage targets (Lustre OSTs) from the
/// control plane's placement service (issue 10; Paul et al., paper 004).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The mountpoint (one of [`Config::mounts`]).
    pub mount: String,
    /// Targets per new file (stripe count, 1 … [`crate::control::MAX_STRIPES`]).
    pub stripes: u32,
}

/// Default for [`Config::placement_wait_ms`].
pub const DEFAULT_PLACEMENT_WAIT_MS: u64 = 50;

/// The TOML file's shape (`PADLL_CONFIG`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    mounts: Option<Vec<String>>,
    job_id: Option<String>,
    job_size: Option<u32>,
    user: Option<String>,
    account: Option<String>,
    stats: Option<String>,
    log: Option<String>,
    controller: Option<String>,
    controller_uid: Option<u32>,
    burst_ms: Option<u64>,
    limit_scope: Option<String>,
    default_limit: Option<String>,
    placement: Option<String>,
    placement_wait_ms: Option<u64>,
    #[serde(default)]
    limit: Vec<FileLimit>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimit {
    selector: String,
    rate: RateText,
    burst: Option<u64>,
}

/// Largest configuration file read (`PADLL_CONFIG`, `padll run --config`).
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Reads a configuration file with care: opened non-blocking (a FIFO or a device never
/// hangs the program), it must be a regular file of at most [`MAX_CONFIG_BYTES`]
/// (`/dev/zero` would otherwise be read until memory runs out). The error says why.
pub fn read_config_file(path: &str) -> Result<String, ReadError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ReadError::Grew);
    }
    String::from_utf8(bytes).map_err(|_| ReadError::NotUtf8)
}

/// Why [`read_config_file`] did not read a file (the caller names the file).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Opening or reading failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A directory, FIFO, device or socket.
    #[error("not a regular file")]
    NotRegular,
    /// Larger than [`MAX_CONFIG_BYTES`] (its size).
    #[error("{0} bytes exceeds the limit of {MAX_CONFIG_BYTES}")]
    TooLarge(u64),
    /// It grew past [`MAX_CONFIG_BYTES`] while being read.
    #[error("it grew past the limit of {MAX_CONFIG_BYTES} bytes")]
    Grew,
    /// Not text.
    #[error("not UTF-8 text")]
    NotUtf8,
}

/// Reads the configuration through `var` (the environment, or a map in tests).
/// Errors name the variable and the bad value.
pub fn load(var: &dyn Fn(&str) -> Option<String>) -> Result<Config, String> {
    let config_path = var("PADLL_CONFIG").filter(|p| !p.is_empty());
    let in_file = |what: String| {
        format!(
            "PADLL_CONFIG: '{}': {what}",
            config_path.as_deref().unwrap_or_default()
        )
    };
    let file = match &config_path {
        Some(path) => {
            let text = read_config_file(path)
                .map_err(|e| format!("PADLL_CONFIG: cannot read '{path}': {e}"))?;
            toml::from_str::<FileConfig>(&text)
                .map_err(|e| format!("PADLL_CONFIG: '{path}': {}", toml_error(&text, &e)))?
        }
        None => FileConfig::default(),
    };
    let burst_ms = match var("PADLL_BURST_MS") {
        Some(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms > 0)
            .ok_or_else(|| {
                format!("PADLL_BURST_MS: bad value '{v}' (a positive number of milliseconds)")
            })?,
        None => file.burst_ms.unwrap_or(DEFAULT_BURST_MS),
    };

    let mounts: Vec<String> = match var("PADLL_MOUNTS") {
        Some(list) => list
            .split(':')
            .filter(|m| !m.is_empty())
            .map(normalize_mount)
            .collect(),
        None => file
            .mounts
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|m| normalize_mount(m))
            .collect(),
    };
    if let Some(bad) = mounts.iter().find(|m| !m.starts_with('/')) {
        return Err(format!(
            "PADLL_MOUNTS: mountpoint '{bad}' is not an absolute path"
        ));
    }

    let mut limits = Vec::new();
    match var("PADLL_RULES") {
        Some(rules) => {
            for rule in rules.split(',').map(str::trim).filter(|r| !r.is_empty()) {
                limits.push(parse_rule(rule, burst_ms).map_err(|e| format!("PADLL_RULES: {e}"))?);
            }
        }
        None => {
            for (i, limit) in file.limit.iter().enumerate() {
                let mut spec =
                    parse_rule(&format!("{}={}", limit.selector, limit.rate.0), burst_ms)
                        .map_err(|e| in_file(format!("limit[{i}]: {e}")))?;
                if let Some(burst) = limit.burst {
                    if burst == 0 {
                        return Err(in_file(format!(
                            "limit[{i}].burst = 0: must be at least 1 (selector '{}')",
                            limit.selector
                        )));
                    }
                    spec.burst = burst;
                }
                limits.push(spec);
            }
        }
    }
    let default_limits = match var("PADLL_DEFAULT_LIMIT") {
        Some(text) => Some(
            parse_default_limit(&text, burst_ms)
                .map_err(|e| format!("PADLL_DEFAULT_LIMIT: {e}"))?,
        ),
        None => file
            .default_limit
            .as_deref()
            .map(|text| {
                parse_default_limit(text, burst_ms)
                    .map_err(|e| format!("PADLL_CONFIG: default_limit: {e}"))
            })
            .transpose()?,
    };
    let placement = match var("PADLL_PLACEMENT") {
        Some(text) => parse_placement(&text).map_err(|e| format!("PADLL_PLACEMENT: {e}"))?,
        None => match &file.placement {
            Some(text) => {
                parse_placement(text).map_err(|e| format!("PADLL_CONFIG: placement: {e}"))?
            }
            None => Vec::new(),
        },
    };
    if let Some(bad) = placement.iter().find(|p| !mounts.contains(&p.mount)) {
        return Err(format!(
            "PADLL_PLACEMENT: '{}' is not among the mountpoints ({})",
            bad.mount,
            mounts.join(":")
        ));
    }
    let wait_text =
        var("PADLL_PLACEMENT_WAIT_MS").or_else(|| file.placement_wait_ms.map(|ms| ms.to_string()));
    let placement_wait_ms = match wait_text {
        Some(text) => text
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|ms| (1..=10_000).contains(ms))
            .ok_or_else(|| {
                format!("PADLL_PLACEMENT_WAIT_MS: bad value '{text}' (1 to 10000 milliseconds)")
            })?,
        None => DEFAULT_PLACEMENT_WAIT_MS,
    };
    for spec in limits.iter().chain(default_limits.iter().flatten()) {
        if let Some(mount) = &spec.mount {
            if !mounts.contains(mount) {
                return Err(format!(
                    "limit '{spec}' names '{mount}', which is not among the mountpoints ({})",
                    mounts.join(":")
                ));
            }
        }
    }

    let log = match var("PADLL_LOG").or(file.log.clone()) {
        Some(level) => LogLevel::parse(level.trim()).map_err(|e| format!("PADLL_LOG: {e}"))?,
        None => LogLevel::Error,
    };

    let job_size_text = var("PADLL_JOB_SIZE")
        .or_else(|| var("SLURM_JOB_NUM_NODES"))
        .or_else(|| var("SLURM_NNODES"));
    let job_size = match job_size_text {
        Some(text) => text
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("PADLL_JOB_SIZE: bad node count '{text}'"))?,
        None => file.job_size.unwrap_or(1),
    };
    // SAFETY: getuid, getgid, getpid and getppid take no arguments, touch no memory of ours
    // and cannot fail.
    let (uid, gid, pid, ppid) = unsafe {
        (
            libc::getuid(),
            libc::getgid(),
            libc::getpid() as u32,
            libc::getppid() as u32,
        )
    };
    let named_job = var("PADLL_JOB_ID")
        .or_else(|| var("SLURM_JOB_ID"))
        .or_else(|| var("PBS_JOBID"))
        .or_else(|| var("LSB_JOBID"))
        .or_else(|| var("FLUX_JOB_ID"))
        .or(file.job_id);
    // Without a job id there is no job to share limits with.
    let limit_scope = match var("PADLL_LIMIT_SCOPE").or(file.limit_scope) {
        Some(text) => LimitScope::parse(&text).map_err(|e| format!("PADLL_LIMIT_SCOPE: {e}"))?,
        None if named_job.is_some() => LimitScope::Job,
        None => LimitScope::Process,
    };
    let job_id = named_job.unwrap_or_else(|| format!("pid-{pid}"));
    let controller_uid = match var("PADLL_CONTROLLER_UID") {
        Some(text) => Some(text.trim().parse::<u32>().map_err(|_| {
            format!("PADLL_CONTROLLER_UID: bad uid '{text}' (a number, as in 980)")
        })?),
        None => file.controller_uid,
    };
    let user = var("PADLL_USER")
        .or_else(|| var("SLURM_JOB_USER"))
        .or(file.user)
        .or_else(|| var("USER"))
        .unwrap_or_else(|| uid.to_string());
    let account = var("PADLL_ACCOUNT")
        .or_else(|| var("SLURM_JOB_ACCOUNT"))
        .or_else(|| var("PBS_ACCOUNT"))
        .or_else(|| var("LSB_PROJECT_NAME"))
        .or(file.account)
        .unwrap_or_default();

    Ok(Config {
        mounts,
        limits,
        limit_scope,
        identity: Identity {
            job_id,
            job_size,
            user,
            account,
            uid,
            gid,
            hostname: hostname(),
            pid,
            ppid,
        },
        stats_path: var("PADLL_STATS").filter(|p| !p.is_empty()).or(file.stats),
        controller_uid,
        controller: var("PADLL_CONTROLLER")
            .filter(|p| !p.is_empty())
            .or(file.controller),
        log,
        default_limits,
        placement,
        placement_wait_ms,
    })
}

/// `MOUNT[=STRIPES][,…]` (one stripe when not given).
fn parse_placement(text: &str) -> Result<Vec<Placement>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (mount, stripes) = match item.rsplit_once('=') {
                Some((mount, count)) => {
                    let stripes = count
                        .trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=crate::control::MAX_STRIPES).contains(n))
                        .ok_or_else(|| {
                            format!(
                                "bad stripe count '{count}' in '{item}' (1 to {})",
                                crate::control::MAX_STRIPES
                            )
                        })?;
                    (mount.trim(), stripes)
                }
                None => (item, 1),
            };
            if !mount.starts_with('/') {
                return Err(format!(
                    "'{mount}' is not an absolute mountpoint (as in /lustre=4)"
                ));
            }
            Ok(Placement {
                mount: normalize_mount(mount),
                stripes,
            })
        })
        .collect()
}

/// `SELECTOR=RATE[,…]` limits, or `0` for none (unthrottled).
fn parse_default_limit(text: &str, burst_ms: u64) -> Result<Vec<ChannelSpec>, String> {
    if text.trim() == "0" {
        return Ok(Vec::new());
    }
    let limits = text
        .split(',')
        .map(str::trim)
        .filter(|rule| !rule.is_empty())
        .map(|rule| parse_rule(rule, burst_ms))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if limits.is_empty() {
        return Err(format!(
            "'{text}' names no limit (give SELECTOR=RATE limits, or 0 for none)"
        ));
    }
    Ok(limits)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is a live local of `buf.len()` bytes, the length passed.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return String::new();
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Class, Op};
    use std::collections::HashMap;

    fn load_from(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        load(&|k| map.get(k).cloned())
    }

    #[test]
    fn config_files_must_be_small_regular_files() {
        let dir = std::env::temp_dir().join(format!("padll-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated CString alive across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let big = dir.join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_CONFIG_BYTES as usize + 1]).unwrap();
        let fine = dir.join("fine.toml");
        std::fs::write(&fine, "mounts = [\"/scratch\"]\n").unwrap();
        for (path, why) in [
            ("/dev/zero", "not a regular file"),
            (fifo.to_str().unwrap(), "not a regular file"),
            ("/", "not a regular file"),
            (big.to_str().unwrap(), "exceeds the limit"),
        ] {
            // A FIFO with no writer must not block: this returns at once.
            let error = load_from(&[("PADLL_CONFIG", path)]).unwrap_err();
            assert!(
                error.starts_with("PADLL_CONFIG: cannot read '")
                    && error.contains(path)
                    && error.contains(why),
                "{path}: {error}"
            );
            assert!(!error.contains('\n'));
        }
        let config = load_from(&[("PADLL_CONFIG", fine.to_str().unwrap())]).unwrap();
        assert_eq!(config.mounts, vec!["/scratch".to_string()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rates() {
        let r = |t| parse_rate(t).unwrap();
        assert_eq!(r("5000/s"), Rate::Ops(5000));
        assert_eq!(r("2k"), Rate::Ops(2000));
        assert_eq!(r("1.5M/s"), Rate::Ops(1_500_000));
        assert_eq!(r("100MiB/s"), Rate::Bytes(100 << 20));
        assert_eq!(r("10 GB/s"), Rate::Bytes(10_000_000_000));
        assert_eq!(r("1TiB/s"), Rate::Bytes(1 << 40));
        for bad in [
            "", "fast", "5x/s", "0/s", "0.1", "-5", "1e99GB", "inf", "NaN", "-inf/s",
        ] {
            let err = parse_rate(bad).unwrap_err();
            assert_eq!(err.text, bad);
            assert!(err.to_string().contains(&format!("'{bad}'")), "{err}");
        }
        for (bad, why) in [
            ("-5", "must not be negative"),
            ("-inf/s", "must not be negative"),
            ("inf", "must be a finite number"),
            ("NaN/s", "must be a finite number"),
        ] {
            let err = parse_rate(bad).unwrap_err().to_string();
            assert!(err.ends_with(why), "{err}");
        }
    }

    #[test]
    fn selectors_and_rules() {
        assert_eq!(parse_selector("open").unwrap(), (None, Scope::Op(Op::Open)));
        assert_eq!(parse_selector("all").unwrap(), (None, Scope::All));
        assert_eq!(
            parse_selector("/scratch:metadata").unwrap(),
            (Some("/scratch".into()), Scope::Class(Class::Metadata))
        );
        assert_eq!(
            parse_selector("scratch:open").unwrap_err().kind,
            SelectorErrorKind::RelativeMount
        );
        let unknown = parse_selector("opne").unwrap_err();
        assert_eq!(unknown.kind, SelectorErrorKind::UnknownName("opne".into()));
        assert!(unknown.to_string().contains("'opne'"), "{unknown}");
        let spec = parse_rule("/scratch/:data=100MiB/s", 10).unwrap();
        assert_eq!(spec.mount.as_deref(), Some("/scratch"));
        assert_eq!(spec.unit, Unit::Bytes);
        assert_eq!(spec.burst, (100 << 20) / 100);
        let no_rate = parse_rule("open", 10).unwrap_err();
        assert_eq!(no_rate, RuleError::NoRate("open".into()));
        assert!(no_rate.to_string().contains("SELECTOR=RATE"), "{no_rate}");
        assert!(matches!(
            parse_rule("opne=5", 10),
            Err(RuleError::Selector(e)) if e.text == "opne"
        ));
        assert!(matches!(
            parse_rule("open=5 parsecs", 10),
            Err(RuleError::Rate(e)) if e.text == "5 parsecs"
        ));
    }

    #[test]
    fn environment() {
        let config = load_from(&[
            ("PADLL_MOUNTS", "/scratch/:/data"),
            ("PADLL_RULES", "open=100/s, /data:read=1MiB/s"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_JOB_NUM_NODES", "8"),
            ("PADLL_STATS", "/tmp/s.json"),
        ])
        .unwrap();
        assert_eq!(config.mounts, vec!["/scratch", "/data"]);
        assert_eq!(config.limits.len(), 2);
        assert_eq!(config.identity.job_id, "4242");
        assert_eq!(config.identity.job_size, 8);
        assert_eq!(config.stats_path.as_deref(), Some("/tmp/s.json"));
        assert_eq!(config.limit_scope, LimitScope::Job);
        // Explicit settings beat the batch system's.
        let config = load_from(&[("PADLL_JOB_ID", "mine"), ("SLURM_JOB_ID", "4242")]).unwrap();
        assert_eq!(config.identity.job_id, "mine");
        // Limits bind the job unless asked otherwise; without a job, each process.
        let config = load_from(&[("PADLL_JOB_ID", "j"), ("PADLL_LIMIT_SCOPE", "process")]).unwrap();
        assert_eq!(config.limit_scope, LimitScope::Process);
        assert_eq!(load_from(&[]).unwrap().limit_scope, LimitScope::Process);
    }

    #[test]
    fn placement() {
        let config = load_from(&[]).unwrap();
        assert!(config.placement.is_empty());
        assert_eq!(config.placement_wait_ms, DEFAULT_PLACEMENT_WAIT_MS);
        let config = load_from(&[
            ("PADLL_MOUNTS", "/lustre:/scratch"),
            ("PADLL_PLACEMENT", "/lustre/=4, /scratch"),
            ("PADLL_PLACEMENT_WAIT_MS", "200"),
        ])
        .unwrap();
        assert_eq!(
            config.placement,
            vec![
                Placement {
                    mount: "/lustre".into(),
                    stripes: 4
                },
                Placement {
                    mount: "/scratch".into(),
                    stripes: 1
                }
            ]
        );
        assert_eq!(config.placement_wait_ms, 200);
    }

    #[test]
    fn default_limit() {
        assert_eq!(load_from(&[]).unwrap().default_limits, None);
        let config = load_from(&[("PADLL_DEFAULT_LIMIT", " 0 ")]).unwrap();
        assert_eq!(config.default_limits, Some(Vec::new()));
        let config = load_from(&[
            ("PADLL_MOUNTS", "/scratch"),
            (
                "PADLL_DEFAULT_LIMIT",
                "/scratch:metadata=200/s, data=1MiB/s",
            ),
        ])
        .unwrap();
        let limits = config.default_limits.unwrap();
        assert_eq!(limits.len(), 2);
        assert_eq!(limits[0].mount.as_deref(), Some("/scratch"));
        assert_eq!((limits[0].rate, limits[0].unit), (200, Unit::Requests));
        assert_eq!((limits[1].rate, limits[1].unit), (1 << 20, Unit::Bytes));
    }

    #[test]
    fn errors_name_the_bad_value() {
        for (pairs, needle) in [
            (vec![("PADLL_MOUNTS", "scratch")], "'scratch'"),
            (vec![("PADLL_RULES", "open=fast")], "'fast'"),
            (
                vec![("PADLL_MOUNTS", "/a"), ("PADLL_RULES", "/b:open=1")],
                "'/b'",
            ),
            (vec![("PADLL_LOG", "loud")], "'loud'"),
            (vec![("PADLL_BURST_MS", "0")], "'0'"),
            (vec![("PADLL_JOB_SIZE", "x")], "'x'"),
            (vec![("PADLL_LIMIT_SCOPE", "node")], "'node'"),
            (vec![("PADLL_CONTROLLER_UID", "cheferd")], "'cheferd'"),
            (vec![("PADLL_DEFAULT_LIMIT", "open=fast")], "'fast'"),
            (vec![("PADLL_PLACEMENT", "lustre")], "'lustre'"),
            (
                vec![("PADLL_MOUNTS", "/a"), ("PADLL_PLACEMENT", "/a=0")],
                "'0'",
            ),
            (
                vec![("PADLL_MOUNTS", "/a"), ("PADLL_PLACEMENT", "/b")],
                "'/b'",
            ),
            (vec![("PADLL_PLACEMENT_WAIT_MS", "0")], "'0'"),
            (vec![("PADLL_DEFAULT_LIMIT", " , ")], "' , '"),
            (
                vec![("PADLL_MOUNTS", "/a"), ("PADLL_DEFAULT_LIMIT", "/b:open=1")],
                "'/b'",
            ),
            (
                vec![("PADLL_CONFIG", "/nonexistent/padll.toml")],
                "/nonexistent/padll.toml",
            ),
        ] {
            let err = load_from(&pairs).unwrap_err();
            assert!(err.contains(needle), "{err} should name {needle}");
        }
    }

    #[test]
    fn toml_file() {
        let dir = std::env::temp_dir().join(format!("padll-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("padll.toml");
        std::fs::write(
            &path,
            "mounts = [\"/scratch\"]\njob_id = \"j1\"\ndefault_limit = \"metadata=300/s\"\n[[limit]]\nselector = \"/scratch:metadata\"\nrate = \"2k\"\nburst = 7\n",
        )
        .unwrap();
        let config = load_from(&[("PADLL_CONFIG", path.to_str().unwrap())]).unwrap();
        assert_eq!(config.mounts, vec!["/scratch"]);
        assert_eq!(config.identity.job_id, "j1");
        assert_eq!(config.limits[0].rate, 2000);
        assert_eq!(config.limits[0].burst, 7);
        assert_eq!(config.default_limits.unwrap()[0].rate, 300);
        std::fs::write(&path, "mounts = [\"/scratch\"]\nbogus = 1\n").unwrap();
        let err = load_from(&[("PADLL_CONFIG", path.to_str().unwrap())]).unwrap_err();
        assert!(err.contains("bogus"), "{err}");
        let limit = |rate: &str| {
            let text =
                format!("mounts = [\"/scratch\"]\n[[limit]]\nselector = \"open\"\nrate = {rate}\n");
            std::fs::write(&path, text).unwrap();
            load_from(&[("PADLL_CONFIG", path.to_str().unwrap())])
        };
        assert_eq!(limit("5000").unwrap().limits[0].rate, 5000);
        assert_eq!(limit("\"5k\"").unwrap().limits[0].rate, 5000);
        for (rate, why) in [
            ("-5", "bad rate '-5': must not be negative"),
            ("nan", "bad rate 'NaN': must be a finite number"),
            (
                "true",
                "line 4 `rate = true`: invalid type: boolean `true`, expected a rate",
            ),
        ] {
            let err = limit(rate).unwrap_err();
            assert!(
                err.contains(path.to_str().unwrap()) && err.contains(why),
                "{err}"
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
