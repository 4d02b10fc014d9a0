//! Run-time configuration: environment variables, optionally a TOML file, and the rule
//! syntax shared with `padll run --limit`.
//!
//! | variable | meaning |
//! |---|---|
//! | `PADLL_MOUNTS` | `:`-separated mountpoints to manage |
//! | `PADLL_RULES` | `,`-separated `SELECTOR=RATE` limits (see [`parse_rule`]; a rate of bytes only for `read`, `write`, `mmap`, `data` and `all`) |
//! | `PADLL_BURST_MS` | bucket depth, as milliseconds of the rate (default 10, at most 60 000) |
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
use crate::channel::{
    ChannelSpec, Scope, Unit, MAX_CHANNELS, MAX_CHANNELS_PER_REQUEST, MAX_MOUNTS, MILLI_TOKENS,
};
use crate::ops::Op;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

/// Default bucket depth, in milliseconds' worth of the rate.
pub const DEFAULT_BURST_MS: u64 = 10;
/// Deepest bucket, in milliseconds' worth of the rate: a minute. A deeper bucket lets
/// a program that was idle for a while run unlimited for as long (a day of burst is no
/// limit at all).
pub const MAX_BURST_MS: u64 = 60_000;

/// Longest mountpoint, in bytes: the longest path the stage resolves (`PATH_MAX`).
pub const MAX_MOUNT_BYTES: usize = libc::PATH_MAX as usize;
/// Longest job id, user or account a stage registers with its controller (the
/// controller refuses longer ones).
pub const MAX_NAME_BYTES: usize = 256;
/// Longest path of the controller's socket: a Unix socket address holds 108 bytes,
/// the path's NUL among them (`sockaddr_un.sun_path`).
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// The job id `padll run` gives a run that no batch system names: `run-<its pid>`
/// (the program's pid too, as `padll run` becomes the program).
pub fn run_job_id(pid: u32) -> String {
    format!("run-{pid}")
}

/// Whether `job` is a [`run_job_id`]: a job that cannot recur (no later process joins
/// it, bar a reused pid), so what it keeps on the node goes with its last process.
pub fn is_run_job(job: &str) -> bool {
    job.strip_prefix("run-")
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

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

/// As a rate is written: requests as a plain number (`5000/s`); bytes in the unit,
/// decimal or binary, that writes them shortest, with at most two decimals
/// (`20MiB/s`, `100MB/s`, `1.5GiB/s`, `4095B/s`): a rate typed with a unit reads back
/// in that unit, and [`parse_rate`] reads the text back to the same rate.
impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = match *self {
            Rate::Ops(n) => return write!(f, "{n}/s"),
            Rate::Bytes(n) => u128::from(n),
        };
        // In hundredths of each unit no larger than the rate that holds it exactly
        // (`B` always does, unless the rate is 0), the fewest.
        let (hundredths, name) = BYTE_UNITS
            .iter()
            .map(|&(name, size)| (u128::from(size), name))
            .filter(|(size, _)| bytes >= *size && (bytes * 100) % size == 0)
            .map(|(size, name)| (bytes * 100 / size, name))
            .min_by_key(|(hundredths, _)| *hundredths)
            .unwrap_or((0, "B"));
        let (whole, fraction) = (hundredths / 100, hundredths % 100);
        match fraction {
            0 => write!(f, "{whole}{name}/s"),
            _ if fraction % 10 == 0 => write!(f, "{whole}.{}{name}/s", fraction / 10),
            _ => write!(f, "{whole}.{fraction:02}{name}/s"),
        }
    }
}

impl ChannelSpec {
    /// Its rate, with what its tokens count.
    pub fn typed_rate(&self) -> Rate {
        match self.unit {
            Unit::Requests => Rate::Ops(self.rate),
            Unit::Bytes => Rate::Bytes(self.rate),
        }
    }
}

/// As a rule is written: `/scratch:write=20MiB/s` (see [`Rate`]'s display).
impl std::fmt::Display for ChannelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(mount) = &self.mount {
            write!(f, "{mount}:")?;
        }
        write!(f, "{}={}", self.scope.name(), self.typed_rate())?;
        // Weights cannot be written in a rule; shown as the control plane set them.
        for (i, (op, cost)) in self.costs.iter().enumerate() {
            let separator = if i == 0 { " weighing " } else { ", " };
            let tokens = cost as f64 / MILLI_TOKENS as f64;
            write!(f, "{separator}{op}={tokens}")?;
        }
        Ok(())
    }
}

/// The units of a byte rate, as written and shown: decimal (`KB` = 1000 B) and binary
/// (`KiB` = 1024 B).
const BYTE_UNITS: [(&str, u64); 9] = [
    ("B", 1),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

/// A rate [`parse_rate`] refused: the text as given and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad rate {}: {kind}", crate::quote(.text))]
pub struct RateError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub kind: RateErrorKind,
}

/// The rates [`parse_rate`] accepts, for its errors.
const RATE_RANGE: &str = "rates go from 1/s to 281474976710656/s (256TiB/s)";

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
    #[error("unknown unit {} (use k, M, G, B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", crate::quote(.0))]
    UnknownUnit(String),
    /// Less than one token per second once rounded.
    #[error("below 1 per second: {RATE_RANGE}")]
    BelowOne,
    /// Above [`crate::channel::MAX_RATE`].
    #[error("too large: {RATE_RANGE}")]
    TooLarge,
}

/// Parses a rate. A unit containing `B` counts bytes (`KB` = 1000 B, `KiB` = 1024 B);
/// otherwise the rate counts requests, with optional `k`, `M`, `G` multipliers.
/// `/s` is optional; the number may have a decimal point and an exponent (`1.5e6`).
/// A fraction of a token per second is dropped (`1.5` is 1/s, `1.5KB/s` 1500 B/s,
/// `0.5` refused as below 1): a limit never admits more than it says.
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
    let (number, suffix) = body.split_at(number_length(body));
    let value: f64 = number.parse().map_err(|_| bad(RateErrorKind::NotANumber))?;
    let (multiplier, unit): (u64, fn(u64) -> Rate) = match suffix.trim() {
        "" => (1, Rate::Ops),
        "k" | "K" => (1_000, Rate::Ops),
        "M" => (1_000_000, Rate::Ops),
        "G" => (1_000_000_000, Rate::Ops),
        "kB" => (1_000, Rate::Bytes),
        other => match BYTE_UNITS.iter().find(|(name, _)| *name == other) {
            Some(&(_, size)) => (size, Rate::Bytes),
            None => return Err(bad(RateErrorKind::UnknownUnit(other.to_string()))),
        },
    };
    let per_second = whole_per_second(value * multiplier as f64);
    if per_second < 1.0 {
        return Err(bad(RateErrorKind::BelowOne));
    }
    if per_second > crate::channel::MAX_RATE as f64 {
        return Err(bad(RateErrorKind::TooLarge));
    }
    Ok(unit(per_second as u64))
}

/// A rate's whole tokens per second: rounded down, so a limit never admits more than
/// was asked (`1.5` → 1, `0.9` → 0, refused), but a product that is whole in decimal
/// and missed it only by the binary floats' error stays whole (`4.35k` → 4350, where
/// `4.35 × 1000` is 4349.999…).
fn whole_per_second(exact: f64) -> f64 {
    let nearest = exact.round();
    if (exact - nearest).abs() <= exact.abs() * 4.0 * f64::EPSILON {
        nearest
    } else {
        exact.floor()
    }
}

/// Length of the number that starts `text`: digits and points, then an exponent
/// (`e6`, `E-3`) if one follows.
fn number_length(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mantissa = bytes
        .iter()
        .take_while(|b| b.is_ascii_digit() || **b == b'.')
        .count();
    if let [b'e' | b'E', rest @ ..] = &bytes[mantissa..] {
        let sign = usize::from(matches!(rest.first(), Some(b'+' | b'-')));
        let digits = rest[sign..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits > 0 {
            return mantissa + 1 + sign + digits;
        }
    }
    mantissa
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
    // toml's message may run over lines (it quotes the document): one line, `; `-joined.
    let message: Vec<&str> = (error.message().lines())
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    let message = crate::escape(&message.join("; ")).to_string();
    let Some(at) = error.span().map(|s| s.start.min(text.len())) else {
        return message;
    };
    let line = text.as_bytes()[..at]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1;
    let content = text.lines().nth(line - 1).unwrap_or_default().trim();
    let content: String = content.chars().take(80).collect();
    format!("line {line} `{}`: {message}", crate::escape(&content))
}

/// A selector [`parse_selector`] refused: the text as given and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad selector {}: {kind}", crate::quote(.text))]
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
    #[error("{} is not 'all', a class (metadata, data, directory, xattr) or an operation ({ops})", crate::quote(.0), ops = crate::ops::Op::ALL.iter().map(|o| o.name()).collect::<Vec<_>>().join(", "))]
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
        "bad limit {}: expected SELECTOR=RATE, as in open=5000/s or /scratch:data=100MiB/s",
        crate::quote(.0)
    )]
    NoRate(String),
    /// A bad selector before the `=`.
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// A bad rate after it.
    #[error(transparent)]
    Rate(#[from] RateError),
    /// A rate of bytes for a selector none of whose operations moves bytes
    /// ([`Scope::moves_bytes`]): it would never be charged, so never limit (the rule,
    /// trimmed).
    #[error("{}", bytes_on_operations(.0))]
    BytesOnOperations(String),
}

/// Why `rule` is refused: its rate counts bytes, its selector operations.
fn bytes_on_operations(rule: &str) -> String {
    let (selector, rate) = rule.rsplit_once('=').unwrap_or((rule, ""));
    format!(
        "bad limit {}: {} is a rate of bytes, but {} counts operations \
         (bytes are counted by {})",
        crate::quote(rule),
        crate::quote(rate.trim()),
        crate::escape(selector.trim()),
        byte_selectors()
    )
}

/// The selectors a rate of bytes can limit: `read, write, mmap, data and all`.
pub fn byte_selectors() -> String {
    let ops = crate::ops::Op::ALL.iter().map(|op| Scope::Op(*op));
    let classes = crate::ops::Class::ALL.map(Scope::Class);
    let names: Vec<&str> = ops
        .chain(classes)
        .filter(|scope| scope.moves_bytes())
        .map(Scope::name)
        .collect();
    format!("{} and all", names.join(", "))
}

/// Parses `SELECTOR=RATE` into a channel spec whose burst is `burst_ms` of the rate.
/// A rate of bytes is refused for a selector whose operations move none.
pub fn parse_rule(text: &str, burst_ms: u64) -> Result<ChannelSpec, RuleError> {
    let (selector, rate) = text
        .rsplit_once('=')
        .ok_or_else(|| RuleError::NoRate(text.to_string()))?;
    let (mount, scope) = parse_selector(selector.trim())?;
    let rate = parse_rate(rate)?;
    if rate.unit() == Unit::Bytes && !scope.moves_bytes() {
        return Err(RuleError::BytesOnOperations(text.trim().to_string()));
    }
    Ok(ChannelSpec {
        mount: mount.map(|m| normalize_mount(&m)),
        scope,
        rate: rate.per_second(),
        unit: rate.unit(),
        burst: burst_for(rate.per_second(), burst_ms),
        costs: Default::default(),
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
#[error("bad log level {} (use off, error, warn, info, debug)", crate::quote(.0))]
pub struct LogLevelError(pub String);

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

/// Most stripes (storage targets) one file can have (Lustre's `LOV_MAX_STRIPE_COUNT`).
pub const MAX_STRIPES: u32 = 2000;

/// A mountpoint whose new files get their storage targets (Lustre OSTs) from the
/// control plane's placement service (Paul et al., paper 004).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The mountpoint (one of [`Config::mounts`]).
    pub mount: String,
    /// Targets per new file (stripe count, 1 … [`MAX_STRIPES`]).
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

/// Reads a configuration file with care: see [`read_text_file`] (at most
/// [`MAX_CONFIG_BYTES`]).
pub fn read_config_file(path: &str) -> Result<String, ReadError> {
    read_text_file(path, MAX_CONFIG_BYTES)
}

/// Reads a text file from outside with care: opened non-blocking (a FIFO or a device
/// never hangs the program), it must be a regular file of at most `max_bytes`
/// (`/dev/zero` would otherwise be read until memory runs out) and UTF-8. The error
/// says why.
pub fn read_text_file(
    path: impl AsRef<std::path::Path>,
    max_bytes: u64,
) -> Result<String, ReadError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(ReadError::Directory);
    }
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    let too_large = |size| ReadError::TooLarge {
        size,
        limit: max_bytes,
    };
    if meta.len() > max_bytes {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(ReadError::Grew(max_bytes));
    }
    String::from_utf8(bytes).map_err(|_| ReadError::NotUtf8)
}

/// Why [`read_text_file`] did not read a file (the caller names the file).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Opening or reading failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A directory.
    #[error("a directory, not a regular file")]
    Directory,
    /// A FIFO, device or socket.
    #[error("not a regular file")]
    NotRegular,
    /// Larger than its limit.
    #[error("{size} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The most that is read.
        limit: u64,
    },
    /// It grew past its limit (kept) while being read.
    #[error("it grew past the limit of {0} bytes")]
    Grew(u64),
    /// Not text.
    #[error("not UTF-8 text")]
    NotUtf8,
}

/// A setting [`load`] refuses: where it came from and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe(self.origin.variable()))]
pub struct LoadError {
    /// The variable, or the configuration file's key, that holds the bad value.
    pub origin: Origin,
    /// What is wrong, with the value.
    pub kind: LoadErrorKind,
}

impl LoadError {
    /// The one-line message with `name` for the variable (a command line says the flag
    /// that set it): `NAME: ['FILE': [KEY: ]]WHAT`.
    pub fn describe(&self, name: &str) -> String {
        match &self.origin {
            Origin::Var(_) => format!("{name}: {}", self.kind),
            Origin::File { path, key: None } => {
                format!("{name}: {}: {}", crate::quote(path), self.kind)
            }
            Origin::File {
                path,
                key: Some(key),
            } => format!("{name}: {}: {key}: {}", crate::quote(path), self.kind),
        }
    }
}

/// Where a setting [`load`] read came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// An environment variable (`PADLL_RULES`).
    Var(&'static str),
    /// The `PADLL_CONFIG` file (its path), at `key` (`limit[2]`) when the key is known.
    File {
        /// The file as given.
        path: String,
        /// The key holding the bad value.
        key: Option<String>,
    },
}

impl Origin {
    /// The error of a value from here.
    pub fn refuse(self, kind: impl Into<LoadErrorKind>) -> LoadError {
        LoadError {
            origin: self,
            kind: kind.into(),
        }
    }

    /// The environment variable that holds the value, or names the file that does.
    pub fn variable(&self) -> &'static str {
        match self {
            Origin::Var(name) => name,
            Origin::File { .. } => "PADLL_CONFIG",
        }
    }
}

/// What is wrong with a setting (see [`LoadError`]); each keeps the bad value.
#[derive(Debug, thiserror::Error)]
pub enum LoadErrorKind {
    /// The configuration file cannot be read.
    #[error("cannot read it: {0}")]
    Unreadable(#[from] ReadError),
    /// The configuration file is not valid TOML of the expected shape (line and key).
    #[error("{0}")]
    Toml(String),
    /// A bucket depth that is not 1 to [`MAX_BURST_MS`] milliseconds.
    #[error("bad value {} (1 to {MAX_BURST_MS} milliseconds)", crate::quote(.0))]
    BurstMs(String),
    /// A mountpoint that is not an absolute path.
    #[error("mountpoint {} is not an absolute path", crate::quote(.0))]
    RelativeMount(String),
    /// A limit that does not parse.
    #[error(transparent)]
    Rule(#[from] RuleError),
    /// A limit's burst of 0, or deeper than [`MAX_BURST_MS`] of its rate: the bound
    /// `burst_ms` has, so a burst cannot switch a limit off either.
    #[error(
        "burst = {burst}: must be 1 to {most} ({} s of the rate) (selector {})",
        MAX_BURST_MS / 1000,
        crate::quote(.selector)
    )]
    Burst {
        /// The burst as given.
        burst: u64,
        /// The deepest allowed: [`MAX_BURST_MS`] of the rate.
        most: u64,
        /// The limit's selector.
        selector: String,
    },
    /// A default limit that names no limit (the text).
    #[error("{} names no limit (give SELECTOR=RATE limits, or 0 for none)", crate::quote(.0))]
    NoLimit(String),
    /// A limit on a mountpoint that is not managed.
    #[error(
        "limit {} names {}, which is not among the mountpoints ({})",
        crate::quote(.limit),
        crate::quote(.mount),
        crate::escape(.mounts)
    )]
    LimitOutsideMounts {
        /// The limit as parsed.
        limit: String,
        /// Its mountpoint.
        mount: String,
        /// The managed mountpoints, `:`-separated.
        mounts: String,
    },
    /// A placement's stripe count outside 1..=[`MAX_STRIPES`].
    #[error("bad stripe count {} in {} (1 to {MAX_STRIPES})", crate::quote(.count), crate::quote(.item))]
    Stripes {
        /// The count as given.
        count: String,
        /// The whole `MOUNT=STRIPES` item.
        item: String,
    },
    /// A placement mountpoint that is not an absolute path.
    #[error("{} is not an absolute mountpoint (as in /lustre=4)", crate::quote(.0))]
    RelativePlacement(String),
    /// A placement on a mountpoint that is not managed.
    #[error("{} is not among the mountpoints ({})", crate::quote(.mount), crate::escape(.mounts))]
    PlacementOutsideMounts {
        /// The placement's mountpoint.
        mount: String,
        /// The managed mountpoints, `:`-separated.
        mounts: String,
    },
    /// A placement wait outside 1..=10 000 ms.
    #[error("bad value {} (1 to 10000 milliseconds)", crate::quote(.0))]
    PlacementWaitMs(String),
    /// An unknown log level.
    #[error(transparent)]
    Log(#[from] LogLevelError),
    /// A node count that is not a positive number.
    #[error("bad node count {} (a number of nodes, at least 1)", crate::quote(.0))]
    JobSize(String),
    /// An empty job id.
    #[error("the job id is empty (leave it unset to take the batch system's)")]
    EmptyJobId,
    /// An unknown limit scope.
    #[error(transparent)]
    Scope(#[from] crate::channel::LimitScopeError),
    /// A controller uid that is not a number.
    #[error("bad uid {} (a number, as in 980)", crate::quote(.0))]
    ControllerUid(String),
    /// A value that is not UTF-8 (its bytes).
    #[error("{} is not UTF-8: only UTF-8 values can be used", crate::quote(.0))]
    NotUtf8(Vec<u8>),
    /// More mountpoints than the stage manages (how many).
    #[error("{0} mountpoints: at most {MAX_MOUNTS} are supported")]
    TooManyMounts(usize),
    /// More limits than the stage has channels (how many).
    #[error("{0} limits: at most {MAX_CHANNELS} are supported")]
    TooManyLimits(usize),
    /// More limits than a request can wait in apply to one operation on a mountpoint.
    #[error(
        "more than {MAX_CHANNELS_PER_REQUEST} limits apply to '{op}' on {} \
         (a request waits in at most {MAX_CHANNELS_PER_REQUEST})",
        crate::quote(.mount)
    )]
    TooManyPerRequest {
        /// The operation.
        op: Op,
        /// The mountpoint.
        mount: String,
    },
    /// A value longer than it may be: what it is, its start and its length.
    #[error("{what} {} of {bytes} bytes is too long (at most {most})", crate::quote(.start))]
    TooLong {
        /// What the value is (`mountpoint`, `job id`, …).
        what: &'static str,
        /// Its first characters.
        start: String,
        /// Its length.
        bytes: usize,
        /// The most bytes it may have.
        most: usize,
    },
}

/// `what` of `value` is longer than `most` bytes: its first 64 characters are named.
fn too_long(what: &'static str, value: &str, most: usize) -> Option<LoadErrorKind> {
    (value.len() > most).then(|| {
        let mut start: String = value.chars().take(64).collect();
        if start.len() < value.len() {
            start.push('…');
        }
        LoadErrorKind::TooLong {
            what,
            start,
            bytes: value.len(),
            most,
        }
    })
}

/// Whether the stage can hold `limits` as its channels on `mounts`: at most
/// [`MAX_CHANNELS`] of them, and at most [`MAX_CHANNELS_PER_REQUEST`] applying to any
/// operation on a mountpoint.
fn fit_channels(limits: &[ChannelSpec], mounts: &[String]) -> Result<(), LoadErrorKind> {
    if limits.len() > MAX_CHANNELS {
        return Err(LoadErrorKind::TooManyLimits(limits.len()));
    }
    for mount in mounts {
        for op in Op::ALL {
            let applying = limits.iter().filter(|limit| {
                limit.mount.as_ref().is_none_or(|m| m == mount) && limit.scope.covers(*op)
            });
            if applying.count() > MAX_CHANNELS_PER_REQUEST {
                return Err(LoadErrorKind::TooManyPerRequest {
                    op: *op,
                    mount: mount.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The variables [`load`] reads of its own: the stage's settings.
pub const VARIABLES: [&str; 16] = [
    "PADLL_MOUNTS",
    "PADLL_RULES",
    "PADLL_BURST_MS",
    "PADLL_LIMIT_SCOPE",
    "PADLL_JOB_ID",
    "PADLL_JOB_SIZE",
    "PADLL_USER",
    "PADLL_ACCOUNT",
    "PADLL_STATS",
    "PADLL_CONTROLLER",
    "PADLL_CONTROLLER_UID",
    "PADLL_PLACEMENT",
    "PADLL_PLACEMENT_WAIT_MS",
    "PADLL_DEFAULT_LIMIT",
    "PADLL_LOG",
    "PADLL_CONFIG",
];

/// The other `PADLL_*` variables PADLL reads: `padll run`'s library, `padll-bench`'s
/// settings and the tests' strictness. They stay in the environment of the programs
/// the stage runs in, so they are known to it too.
const TOOL_VARIABLES: [&str; 6] = [
    "PADLL_LIBRARY",
    "PADLL_BENCH_MILLIS",
    "PADLL_BENCH_RATES",
    "PADLL_BENCH_RAW",
    "PADLL_BENCH_SECONDS",
    "PADLL_STRICT_RATES",
];

/// A warning for each of `names` (the environment's) that looks like a `PADLL_*`
/// variable (in any case) but is none PADLL reads, naming the closest that is: a typo
/// (`PADLL_RULES` without its `S`) would otherwise mean no limits, silently.
pub fn unknown_variables(names: impl IntoIterator<Item = OsString>) -> Vec<String> {
    let known = || VARIABLES.iter().chain(&TOOL_VARIABLES);
    names
        .into_iter()
        .map(OsString::into_vec)
        .filter(|name| name.len() >= 6 && name[..6].eq_ignore_ascii_case(b"PADLL_"))
        .filter(|name| !known().any(|k| k.as_bytes() == name.as_slice()))
        .filter_map(|name| {
            let upper = name.to_ascii_uppercase();
            let closest = known().min_by_key(|k| edit_distance(k.as_bytes(), &upper))?;
            Some(format!(
                "{} is no PADLL variable: it is ignored (did you mean {closest}?)",
                crate::escape(&name)
            ))
        })
        .collect()
}

/// Levenshtein distance: the fewest insertions, deletions and substitutions of bytes
/// that turn `a` into `b`.
fn edit_distance(a: &[u8], b: &[u8]) -> usize {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, x) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, y) in b.iter().enumerate() {
            let substituted = diagonal + usize::from(x != y);
            diagonal = row[j + 1];
            row[j + 1] = substituted.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// [`load`] through `var`, whose values may be any bytes (the environment's): a
/// `PADLL_*` variable that is not UTF-8 is refused, naming it (the configuration is
/// text: mountpoints and rules reach the controller and the statistics as UTF-8), where
/// it was treated as unset; another (a batch system's, `USER`) is read lossily.
pub fn load_os(var: &dyn Fn(&str) -> Option<OsString>) -> Result<Config, LoadError> {
    let not_utf8 = std::cell::Cell::new(None);
    let config = load(&|name| match var(name)?.into_string() {
        Ok(text) => Some(text),
        Err(bytes) if name.starts_with("PADLL_") => {
            let first = not_utf8.take().unwrap_or((name, bytes.into_vec()));
            not_utf8.set(Some(first));
            None
        }
        Err(bytes) => Some(bytes.to_string_lossy().into_owned()),
    });
    match not_utf8.take() {
        Some((name, bytes)) => Err(Origin::Var(name).refuse(LoadErrorKind::NotUtf8(bytes))),
        None => config,
    }
}

/// Reads the configuration through `var` (the environment, or a map in tests).
/// Errors name the variable (or the file and key) and the bad value.
pub fn load(var: &dyn Fn(&'static str) -> Option<String>) -> Result<Config, LoadError> {
    let config_path = var("PADLL_CONFIG").filter(|p| !p.is_empty());
    let path = config_path.clone().unwrap_or_default();
    let at = |key: &str| Origin::File {
        path: path.clone(),
        key: Some(key.to_string()),
    };
    let file = match &config_path {
        Some(path) => {
            let whole = Origin::File {
                path: path.clone(),
                key: None,
            };
            let text = read_config_file(path).map_err(|e| whole.clone().refuse(e))?;
            toml::from_str::<FileConfig>(&text)
                .map_err(|e| whole.refuse(LoadErrorKind::Toml(toml_error(&text, &e))))?
        }
        None => FileConfig::default(),
    };
    let burst_ms_of = |text: &str, origin: Origin| {
        (text.trim().parse::<u64>().ok())
            .filter(|ms| (1..=MAX_BURST_MS).contains(ms))
            .ok_or_else(|| origin.refuse(LoadErrorKind::BurstMs(text.to_string())))
    };
    let burst_ms = match (var("PADLL_BURST_MS"), file.burst_ms) {
        (Some(text), _) => burst_ms_of(&text, Origin::Var("PADLL_BURST_MS"))?,
        (None, Some(ms)) => burst_ms_of(&ms.to_string(), at("burst_ms"))?,
        (None, None) => DEFAULT_BURST_MS,
    };

    let (mounts, mounts_origin): (Vec<String>, _) = match var("PADLL_MOUNTS") {
        Some(list) => (
            list.split(':')
                .filter(|m| !m.is_empty())
                .map(normalize_mount)
                .collect(),
            Origin::Var("PADLL_MOUNTS"),
        ),
        None => (
            file.mounts
                .clone()
                .unwrap_or_default()
                .iter()
                .map(|m| normalize_mount(m))
                .collect(),
            at("mounts"),
        ),
    };
    if let Some(bad) = mounts.iter().find(|m| !m.starts_with('/')) {
        return Err(mounts_origin.refuse(LoadErrorKind::RelativeMount(bad.clone())));
    }
    if mounts.len() > MAX_MOUNTS {
        return Err(mounts_origin.refuse(LoadErrorKind::TooManyMounts(mounts.len())));
    }
    if let Some(kind) = mounts
        .iter()
        .find_map(|m| too_long("mountpoint", m, MAX_MOUNT_BYTES))
    {
        return Err(mounts_origin.refuse(kind));
    }
    let outside_mounts = |spec: &ChannelSpec| {
        let mount = spec.mount.as_ref().filter(|m| !mounts.contains(m))?;
        Some(LoadErrorKind::LimitOutsideMounts {
            limit: spec.to_string(),
            mount: mount.clone(),
            mounts: mounts.join(":"),
        })
    };
    // Parses `SELECTOR=RATE` limits (checked against the mountpoints) of one origin.
    let limits_of = |text: &str, origin: &Origin| {
        let mut limits = Vec::new();
        for rule in text.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let spec = parse_rule(rule, burst_ms).map_err(|e| origin.clone().refuse(e))?;
            if let Some(kind) = outside_mounts(&spec) {
                return Err(origin.clone().refuse(kind));
            }
            limits.push(spec);
        }
        Ok(limits)
    };

    let (limits, limits_origin) = match var("PADLL_RULES") {
        Some(rules) => {
            let origin = Origin::Var("PADLL_RULES");
            (limits_of(&rules, &origin)?, origin)
        }
        None => {
            let mut limits = Vec::new();
            for (i, limit) in file.limit.iter().enumerate() {
                let origin = at(&format!("limit[{i}]"));
                let rule = format!("{}={}", limit.selector, limit.rate.0);
                let mut spec = limits_of(&rule, &origin)?.remove(0);
                if let Some(burst) = limit.burst {
                    let most = burst_for(spec.rate, MAX_BURST_MS);
                    if !(1..=most).contains(&burst) {
                        return Err(origin.refuse(LoadErrorKind::Burst {
                            burst,
                            most,
                            selector: limit.selector.clone(),
                        }));
                    }
                    spec.burst = burst;
                }
                limits.push(spec);
            }
            (limits, at("limit"))
        }
    };
    fit_channels(&limits, &mounts).map_err(|e| limits_origin.refuse(e))?;
    // `SELECTOR=RATE[,…]` limits, or `0` for none (unthrottled).
    let default_limits_of = |text: &str, origin: Origin| {
        if text.trim() == "0" {
            return Ok(Vec::new());
        }
        let limits = limits_of(text, &origin)?;
        if limits.is_empty() {
            return Err(origin.refuse(LoadErrorKind::NoLimit(text.to_string())));
        }
        fit_channels(&limits, &mounts).map_err(|e| origin.refuse(e))?;
        Ok(limits)
    };
    let default_limits = match var("PADLL_DEFAULT_LIMIT") {
        Some(text) => Some(default_limits_of(
            &text,
            Origin::Var("PADLL_DEFAULT_LIMIT"),
        )?),
        None => file
            .default_limit
            .as_deref()
            .map(|text| default_limits_of(text, at("default_limit")))
            .transpose()?,
    };
    let placement = match var("PADLL_PLACEMENT") {
        Some(text) => {
            placements_of(&text, &mounts).map_err(|e| Origin::Var("PADLL_PLACEMENT").refuse(e))?
        }
        None => match &file.placement {
            Some(text) => placements_of(text, &mounts).map_err(|e| at("placement").refuse(e))?,
            None => Vec::new(),
        },
    };
    let placement_wait_ms = match (var("PADLL_PLACEMENT_WAIT_MS"), file.placement_wait_ms) {
        (Some(text), _) => {
            wait_ms(&text).map_err(|e| Origin::Var("PADLL_PLACEMENT_WAIT_MS").refuse(e))?
        }
        (None, Some(ms)) => {
            wait_ms(&ms.to_string()).map_err(|e| at("placement_wait_ms").refuse(e))?
        }
        (None, None) => DEFAULT_PLACEMENT_WAIT_MS,
    };

    let log = match (var("PADLL_LOG"), &file.log) {
        (Some(level), _) => {
            LogLevel::parse(level.trim()).map_err(|e| Origin::Var("PADLL_LOG").refuse(e))?
        }
        (None, Some(level)) => LogLevel::parse(level.trim()).map_err(|e| at("log").refuse(e))?,
        (None, None) => LogLevel::Error,
    };

    let job_size_text = ["PADLL_JOB_SIZE", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"]
        .into_iter()
        .find_map(|name| Some((var(name)?, name)));
    let job_size = match (job_size_text, file.job_size) {
        (Some((text, name)), _) => text
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| Origin::Var(name).refuse(LoadErrorKind::JobSize(text)))?,
        (None, Some(0)) => return Err(at("job_size").refuse(LoadErrorKind::JobSize("0".into()))),
        (None, size) => size.unwrap_or(1),
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
    let named_job = [
        "PADLL_JOB_ID",
        "SLURM_JOB_ID",
        "PBS_JOBID",
        "LSB_JOBID",
        "FLUX_JOB_ID",
    ]
    .into_iter()
    .find_map(|name| Some((var(name)?, Origin::Var(name))))
    .or_else(|| Some((file.job_id?, at("job_id"))));
    if let Some((_, origin)) = named_job.as_ref().filter(|(id, _)| id.trim().is_empty()) {
        return Err(origin.clone().refuse(LoadErrorKind::EmptyJobId));
    }
    // Without a job id there is no job to share limits with.
    let limit_scope = match (var("PADLL_LIMIT_SCOPE"), &file.limit_scope) {
        (Some(text), _) => {
            LimitScope::parse(&text).map_err(|e| Origin::Var("PADLL_LIMIT_SCOPE").refuse(e))?
        }
        (None, Some(text)) => LimitScope::parse(text).map_err(|e| at("limit_scope").refuse(e))?,
        (None, None) if named_job.is_some() => LimitScope::Job,
        (None, None) => LimitScope::Process,
    };
    let (job_id, job_origin) =
        named_job.unwrap_or_else(|| (format!("pid-{pid}"), Origin::Var("PADLL_JOB_ID")));
    let controller_uid = match var("PADLL_CONTROLLER_UID") {
        Some(text) => Some(text.trim().parse::<u32>().map_err(|_| {
            Origin::Var("PADLL_CONTROLLER_UID").refuse(LoadErrorKind::ControllerUid(text.clone()))
        })?),
        None => file.controller_uid,
    };
    // The first of `names` that is set, with its origin.
    let first_of = |names: &[&'static str]| {
        (names.iter()).find_map(|name| Some((var(name)?, Origin::Var(name))))
    };
    let (user, user_origin) = first_of(&["PADLL_USER", "SLURM_JOB_USER"])
        .or(file.user.map(|user| (user, at("user"))))
        .or_else(|| first_of(&["USER"]))
        .unwrap_or_else(|| (uid.to_string(), Origin::Var("PADLL_USER")));
    let (account, account_origin) = first_of(&[
        "PADLL_ACCOUNT",
        "SLURM_JOB_ACCOUNT",
        "PBS_ACCOUNT",
        "LSB_PROJECT_NAME",
    ])
    .or(file.account.map(|account| (account, at("account"))))
    .unwrap_or_else(|| (String::new(), Origin::Var("PADLL_ACCOUNT")));
    let controller = match var("PADLL_CONTROLLER").filter(|p| !p.is_empty()) {
        Some(path) => Some((path, Origin::Var("PADLL_CONTROLLER"))),
        None => file.controller.map(|path| (path, at("controller"))),
    };
    if let Some((path, origin)) = &controller {
        // A longer path cannot be connected to; the controller refuses longer names.
        let too_long = [
            (origin, too_long("socket path", path, MAX_SOCKET_PATH_BYTES)),
            (&job_origin, too_long("job id", &job_id, MAX_NAME_BYTES)),
            (&user_origin, too_long("user", &user, MAX_NAME_BYTES)),
            (
                &account_origin,
                too_long("account", &account, MAX_NAME_BYTES),
            ),
        ];
        if let Some((origin, Some(kind))) = too_long.into_iter().find(|(_, kind)| kind.is_some()) {
            return Err(origin.clone().refuse(kind));
        }
    }

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
        controller: controller.map(|(path, _)| path),
        log,
        default_limits,
        placement,
        placement_wait_ms,
    })
}

/// `MOUNT[=STRIPES][,…]` (one stripe when not given), each on one of `mounts`.
fn placements_of(text: &str, mounts: &[String]) -> Result<Vec<Placement>, LoadErrorKind> {
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
                        .filter(|n| (1..=MAX_STRIPES).contains(n))
                        .ok_or_else(|| LoadErrorKind::Stripes {
                            count: count.to_string(),
                            item: item.to_string(),
                        })?;
                    (mount.trim(), stripes)
                }
                None => (item, 1),
            };
            if !mount.starts_with('/') {
                return Err(LoadErrorKind::RelativePlacement(mount.to_string()));
            }
            let mount = normalize_mount(mount);
            if !mounts.contains(&mount) {
                return Err(LoadErrorKind::PlacementOutsideMounts {
                    mount,
                    mounts: mounts.join(":"),
                });
            }
            Ok(Placement { mount, stripes })
        })
        .collect()
}

/// How long a creating call waits for its placement: 1 to 10 000 ms.
fn wait_ms(text: &str) -> Result<u64, LoadErrorKind> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|ms| (1..=10_000).contains(ms))
        .ok_or_else(|| LoadErrorKind::PlacementWaitMs(text.to_string()))
}

/// This machine's host name (empty if it cannot be read; a name that fills the buffer
/// without a NUL is taken whole).
pub fn hostname() -> String {
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
        load(&|k| map.get(k).cloned()).map_err(|e| e.to_string())
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
                error.starts_with(&format!("PADLL_CONFIG: '{path}': cannot read it: "))
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

    /// A fractional rate is rounded down to whole tokens per second, never up (`1.5`
    /// was 2/s, 33 % above what was asked; `0.5` was 1/s while `0.4` was refused);
    /// what rounds down to 0 is refused. Decimal products stay exact.
    #[test]
    fn fractional_rates_round_down_to_whole_tokens() {
        for (text, rate) in [
            ("1.5", Rate::Ops(1)),
            ("1.5/s", Rate::Ops(1)),
            ("2.99", Rate::Ops(2)),
            ("1.9999k", Rate::Ops(1999)),
            ("4.35k", Rate::Ops(4350)),
            ("1.1M", Rate::Ops(1_100_000)),
            ("0.3k", Rate::Ops(300)),
            ("1.5B/s", Rate::Bytes(1)),
            ("1.5KB/s", Rate::Bytes(1500)),
            ("0.5KiB/s", Rate::Bytes(512)),
            ("1.0001KiB/s", Rate::Bytes(1024)),
            ("2.7GB/s", Rate::Bytes(2_700_000_000)),
        ] {
            assert_eq!(parse_rate(text), Ok(rate), "{text}");
        }
        for text in ["0.5", "0.9", "0.9999/s", "0.4", "0.5B/s"] {
            let error = parse_rate(text).unwrap_err();
            assert_eq!(error.kind, RateErrorKind::BelowOne, "{text}");
            assert_eq!(
                error.to_string(),
                format!("bad rate '{text}': below 1 per second: {RATE_RANGE}")
            );
        }
    }

    #[test]
    fn rates_with_exponents_and_out_of_range() {
        assert_eq!(parse_rate("1e3/s"), Ok(Rate::Ops(1000)));
        assert_eq!(parse_rate("1.5E6"), Ok(Rate::Ops(1_500_000)));
        assert_eq!(parse_rate("2e1MiB/s"), Ok(Rate::Bytes(20 << 20)));
        assert_eq!(
            parse_rate("1e").unwrap_err().kind,
            RateErrorKind::UnknownUnit("e".into())
        );
        let max = crate::channel::MAX_RATE;
        assert_eq!(parse_rate(&max.to_string()), Ok(Rate::Ops(max)));
        assert!(RATE_RANGE.contains(&format!("{max}/s")), "{RATE_RANGE}");
        assert!(
            RATE_RANGE.contains(&Rate::Bytes(max).to_string()),
            "{RATE_RANGE}"
        );
        for (text, kind) in [
            ("1e30", RateErrorKind::TooLarge),
            ("1e400/s", RateErrorKind::TooLarge),
            (&(max + 1).to_string(), RateErrorKind::TooLarge),
            ("300TiB/s", RateErrorKind::TooLarge),
            ("1e-3", RateErrorKind::BelowOne),
            ("0.4/s", RateErrorKind::BelowOne),
        ] {
            let error = parse_rate(text).unwrap_err();
            assert_eq!(error.kind, kind, "{text}");
            assert!(
                error.to_string().ends_with(RATE_RANGE),
                "names the range: {error}"
            );
        }
    }

    #[test]
    fn rates_display_in_the_unit_they_were_written_in() {
        for text in [
            "5000/s",
            "2/s",
            "1B/s",
            "4095B/s",
            "1.5KB/s",
            "20MiB/s",
            "100MB/s",
            "10GB/s",
            "1TB/s",
            "1.5GiB/s",
            "1.25TiB/s",
            "4KiB/s",
            "256TiB/s",
        ] {
            let rate = parse_rate(text).unwrap();
            assert_eq!(rate.to_string(), text);
            assert_eq!(parse_rate(&rate.to_string()), Ok(rate));
        }
        // Other spellings of the same rate read back as the shortest.
        for (text, shown) in [
            ("2k", "2000/s"),
            ("20971520B/s", "20MiB/s"),
            ("1000KB/s", "1MB/s"),
            ("1536MiB", "1.5GiB/s"),
            ("1.024MB/s", "1000KiB/s"),
        ] {
            assert_eq!(parse_rate(text).unwrap().to_string(), shown, "{text}");
        }
        // Any byte count reads back to itself.
        for bytes in [
            1,
            999,
            1001,
            1023,
            1025,
            123_456_789,
            (1 << 40) + 1,
            u64::MAX,
        ] {
            let shown = Rate::Bytes(bytes).to_string();
            if bytes <= crate::channel::MAX_RATE {
                assert_eq!(parse_rate(&shown), Ok(Rate::Bytes(bytes)), "{shown}");
            }
        }
        let spec = parse_rule("/scratch:write=20MiB/s", 10).unwrap();
        assert_eq!(spec.to_string(), "/scratch:write=20MiB/s");
    }

    #[test]
    fn a_rate_of_bytes_needs_operations_that_move_bytes() {
        for rule in [
            "read=1MiB/s",
            "write=1B/s",
            "mmap=1GB/s",
            "data=100MiB/s",
            "all=100MiB/s",
            "/scratch:data=1KiB",
            "metadata=100/s",
            "getattr=2k",
        ] {
            assert!(parse_rule(rule, 10).is_ok(), "{rule}");
        }
        for (rule, selector) in [
            ("metadata=100B/s", "metadata"),
            ("/scratch:getattr = 1MiB/s", "/scratch:getattr"),
            ("sync=1GB", "sync"),
            ("allocate=1KiB", "allocate"),
            ("directory=1MB/s", "directory"),
            ("xattr=1MB/s", "xattr"),
            ("open=1TB/s", "open"),
        ] {
            let error = parse_rule(rule, 10).unwrap_err();
            assert_eq!(error, RuleError::BytesOnOperations(rule.into()));
            let message = error.to_string();
            assert!(
                message.contains(&format!("'{rule}'"))
                    && message.contains(&format!("but {selector} counts operations"))
                    && message.ends_with("(bytes are counted by read, write, mmap, data and all)"),
                "{message}"
            );
        }
        // The same refusal from every source of rules, naming it.
        let error = load_from(&[("PADLL_RULES", "metadata=100B/s")]).unwrap_err();
        assert!(
            error.starts_with(
                "PADLL_RULES: bad limit 'metadata=100B/s': '100B/s' is a rate of bytes"
            ),
            "{error}"
        );
    }

    #[test]
    fn burst_ms_is_bounded_everywhere() {
        let from_env = |ms: &str| load_from(&[("PADLL_BURST_MS", ms)]);
        assert!(from_env("1").is_ok() && from_env(&MAX_BURST_MS.to_string()).is_ok());
        for bad in ["0", "-3", "60001", "99999999999", "x", ""] {
            let error = from_env(bad).unwrap_err();
            assert_eq!(
                error,
                format!("PADLL_BURST_MS: bad value '{bad}' (1 to 60000 milliseconds)")
            );
        }
        let dir = std::env::temp_dir().join(format!("padll-config-burst-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("padll.toml");
        std::fs::write(&path, "burst_ms = 60001\n").unwrap();
        let error = load_from(&[("PADLL_CONFIG", path.to_str().unwrap())]).unwrap_err();
        assert!(
            error.ends_with("burst_ms: bad value '60001' (1 to 60000 milliseconds)"),
            "{error}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn job_ids_and_sizes() {
        for (pairs, error) in [
            (
                vec![("PADLL_JOB_ID", "")],
                "PADLL_JOB_ID: the job id is empty (leave it unset to take the batch system's)",
            ),
            (
                vec![("SLURM_JOB_ID", " ")],
                "SLURM_JOB_ID: the job id is empty (leave it unset to take the batch system's)",
            ),
            (
                vec![("PADLL_JOB_SIZE", "0")],
                "PADLL_JOB_SIZE: bad node count '0' (a number of nodes, at least 1)",
            ),
            (
                vec![("SLURM_JOB_NUM_NODES", "-1")],
                "SLURM_JOB_NUM_NODES: bad node count '-1' (a number of nodes, at least 1)",
            ),
        ] {
            assert_eq!(load_from(&pairs).unwrap_err(), error);
        }
        assert!(is_run_job(&run_job_id(42)));
        for not_run in ["run-", "run-4x", "4242", "running-1", "run-1-2"] {
            assert!(!is_run_job(not_run), "{not_run}");
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
    fn errors_keep_where_the_value_came_from_and_what_is_wrong() {
        let dir = std::env::temp_dir().join(format!("padll-config-origin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("padll.toml");
        let file = path.to_str().unwrap().to_string();
        let load_file = |text: &str| {
            std::fs::write(&path, text).unwrap();
            load(&|k| (k == "PADLL_CONFIG").then(|| file.clone())).unwrap_err()
        };
        let at = |key: &str| Origin::File {
            path: file.clone(),
            key: Some(key.into()),
        };
        let zero = load_file(
            "mounts = [\"/s\"]\n[[limit]]\nselector = \"open\"\nrate = 5\n\
             [[limit]]\nselector = \"getattr\"\nrate = 5\nburst = 0\n",
        );
        assert_eq!(zero.origin, at("limit[1]"));
        assert!(
            matches!(&zero.kind, LoadErrorKind::Burst { burst: 0, selector, .. } if selector == "getattr"),
            "{zero}"
        );
        let burst_ms = load_file("burst_ms = 0\n");
        assert_eq!(burst_ms.origin, at("burst_ms"));
        let outside = load_file("mounts = [\"/s\"]\ndefault_limit = \"/t:open=5\"\n");
        assert_eq!(outside.origin, at("default_limit"));
        assert!(
            matches!(&outside.kind, LoadErrorKind::LimitOutsideMounts { mount, .. } if mount == "/t")
        );
        let rules = load(&|k| (k == "PADLL_RULES").then(|| "open=fast".to_string())).unwrap_err();
        assert_eq!(rules.origin, Origin::Var("PADLL_RULES"));
        assert!(matches!(rules.kind, LoadErrorKind::Rule(_)));
        assert_eq!(
            rules.describe("--limit"),
            format!("--limit: {}", rules.kind)
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn what_the_stage_cannot_hold_is_refused_with_its_origin() {
        let many_mounts: Vec<String> = (0..=MAX_MOUNTS).map(|i| format!("/m{i}")).collect();
        let long_mount = format!("/{}", "m".repeat(MAX_MOUNT_BYTES));
        let open_limits = |n: usize| vec!["open=5"; n].join(",");
        let five_on_open = "open=1,metadata=2,all=3,/s:open=4,/s:all=5";
        let socket = |bytes: usize| format!("/{}", "s".repeat(bytes - 1));
        let long_name = "j".repeat(MAX_NAME_BYTES + 1);
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("PADLL_MOUNTS", &many_mounts.join(":"))],
                "PADLL_MOUNTS: 65 mountpoints: at most 64 are supported",
            ),
            (
                &[("PADLL_MOUNTS", &long_mount)],
                "PADLL_MOUNTS: mountpoint '/mmm",
            ),
            (
                &[("PADLL_MOUNTS", "/s"), ("PADLL_RULES", &open_limits(256))],
                "PADLL_RULES: 256 limits: at most 255 are supported",
            ),
            (
                &[("PADLL_MOUNTS", "/s:/t"), ("PADLL_RULES", five_on_open)],
                "PADLL_RULES: more than 4 limits apply to 'open' on '/s' \
                 (a request waits in at most 4)",
            ),
            (
                &[
                    ("PADLL_MOUNTS", "/s"),
                    ("PADLL_DEFAULT_LIMIT", five_on_open),
                ],
                "PADLL_DEFAULT_LIMIT: more than 4 limits apply to 'open' on '/s'",
            ),
            (
                &[("PADLL_MOUNTS", "/s"), ("PADLL_CONTROLLER", &socket(108))],
                "PADLL_CONTROLLER: socket path '/sss",
            ),
            (
                &[
                    ("PADLL_CONTROLLER", "/c.sock"),
                    ("PADLL_JOB_ID", &long_name),
                ],
                "PADLL_JOB_ID: job id 'jjj",
            ),
            (
                &[("PADLL_CONTROLLER", "/c.sock"), ("PADLL_USER", &long_name)],
                "PADLL_USER: user 'jjj",
            ),
        ];
        for (vars, expected) in cases {
            let error = load_from(vars).unwrap_err();
            assert!(error.starts_with(expected), "{vars:?}: {error}");
            assert!(!error.contains('\n'), "{error}");
        }
        let long = load_from(&[("PADLL_MOUNTS", &long_mount)]).unwrap_err();
        assert!(
            long.ends_with("…' of 4097 bytes is too long (at most 4096)"),
            "{long}"
        );
        // The largest values the stage holds pass; a long name without a controller too.
        let two_mounts = "/s:/t";
        let four_on_open = "open=1,metadata=2,all=3,/s:open=4,/t:open=5";
        assert!(load_from(&[("PADLL_MOUNTS", two_mounts), ("PADLL_RULES", four_on_open)]).is_ok());
        assert!(load_from(&[("PADLL_MOUNTS", &many_mounts[1..].join(":"))]).is_ok());
        assert!(load_from(&[("PADLL_CONTROLLER", &socket(107))]).is_ok());
        assert!(load_from(&[("PADLL_JOB_ID", &long_name)]).is_ok());

        let dir = std::env::temp_dir().join(format!("padll-config-fit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("padll.toml");
        let limit = "[[limit]]\nselector = \"open\"\nrate = 5\n";
        std::fs::write(&path, format!("mounts = [\"/s\"]\n{}", limit.repeat(5))).unwrap();
        let error =
            load(&|k| (k == "PADLL_CONFIG").then(|| path.display().to_string())).unwrap_err();
        assert_eq!(
            error.origin,
            Origin::File {
                path: path.display().to_string(),
                key: Some("limit".into())
            }
        );
        assert!(
            error
                .to_string()
                .contains(": limit: more than 4 limits apply to 'open' on '/s'"),
            "{error}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn echoed_values_and_toml_errors_stay_on_one_line() {
        let rules = load_from(&[("PADLL_RULES", "open=fa\nst")]).unwrap_err();
        assert_eq!(
            rules,
            "PADLL_RULES: bad rate 'fa\\nst': expected a number such as 5000/s or 100MiB/s"
        );
        let dir = std::env::temp_dir().join(format!("padll-config-lines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("padll.toml");
        let file = path.to_str().unwrap();
        for (text, expected) in [
            (
                "log = \"de\\nbug\"\n",
                ": log: bad log level 'de\\nbug' (use",
            ),
            (
                "mounts = [\"/tmp\"\nlog = \n",
                ": line 2 `log =`: invalid array; expected `]`",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let error = load_from(&[("PADLL_CONFIG", file)]).unwrap_err();
            assert!(!error.contains('\n'), "{error}");
            assert!(error.contains(expected), "{error}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A `PADLL_*` name nothing reads is named with the closest known one (a typo such
    /// as `PADLL_RULE` meant no limits without a word); the stage's and the tools' own
    /// names, and other programs' variables, pass.
    #[test]
    fn an_unknown_padll_variable_is_named_with_the_closest_known_one() {
        use std::os::unix::ffi::OsStringExt;
        let names = [
            "PADLL_RULE",
            "PADLL_MOUNT",
            "padll_rules",
            "PADLL_CONTROLER_UID",
            "PADLL_MOUNTS",
            "PADLL_BENCH_SECONDS",
            "PADLL_LIBRARY",
            "PADLLRULES",
            "PATH",
        ]
        .map(OsString::from);
        let not_utf8 = OsString::from_vec(b"PADLL_MOUNTS\xff".to_vec());
        assert_eq!(
            unknown_variables(names.into_iter().chain([not_utf8])),
            [
                "PADLL_RULE is no PADLL variable: it is ignored (did you mean PADLL_RULES?)",
                "PADLL_MOUNT is no PADLL variable: it is ignored (did you mean PADLL_MOUNTS?)",
                "padll_rules is no PADLL variable: it is ignored (did you mean PADLL_RULES?)",
                "PADLL_CONTROLER_UID is no PADLL variable: it is ignored \
                 (did you mean PADLL_CONTROLLER_UID?)",
                "PADLL_MOUNTS\\xff is no PADLL variable: it is ignored \
                 (did you mean PADLL_MOUNTS?)",
            ]
        );
    }

    /// [`VARIABLES`] are the `PADLL_*` variables [`load`] reads, all of them.
    #[test]
    fn the_known_variables_are_those_load_reads() {
        let asked = std::cell::RefCell::new(Vec::new());
        load(&|name| {
            asked.borrow_mut().push(name);
            None
        })
        .unwrap();
        let mut asked: Vec<&str> = asked.take();
        asked.retain(|name| name.starts_with("PADLL_"));
        asked.sort();
        asked.dedup();
        let mut known = VARIABLES.to_vec();
        known.sort();
        assert_eq!(asked, known);
    }

    /// Every `PADLL_*` name the repository's code and scripts use is known: a variable
    /// set by the SPANK plugin, `padll run`, a controller or a benchmark must not be
    /// warned about in the programs the stage runs in. (Tests are left out: they spell
    /// typos on purpose.)
    #[test]
    fn every_variable_the_code_uses_is_known() {
        // Names only the build uses, never read from a program's environment.
        const BUILD: [&str; 3] = [
            "PADLL_GIT_COMMIT",
            "PADLL_DEFAULT_LIBRARY",
            "PADLL_DEFAULT_SOCKET",
        ];
        let mut files = Vec::new();
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                let skipped = [".git", "target", "tests", "corpus"].map(OsString::from);
                if path.is_dir() && !skipped.contains(&entry.file_name()) {
                    dirs.push(path);
                } else if (path.extension()).is_some_and(|e| e == "rs" || e == "c" || e == "sh") {
                    files.push(path);
                }
            }
        }
        assert!(files.len() > 50, "the repository's files: {}", files.len());
        let mut unknown = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
            for (at, _) in code.match_indices("PADLL_") {
                let name: String = (code[at..].chars())
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                // `PADLL_BENCH_*` in prose is a family of known names.
                let known = name.ends_with('_')
                    || (VARIABLES.iter().chain(&TOOL_VARIABLES).chain(&BUILD)).any(|k| *k == name);
                if !known {
                    unknown.push(format!("{}: {name}", file.display()));
                }
            }
        }
        assert!(unknown.is_empty(), "{unknown:?}");
    }

    #[test]
    fn a_padll_variable_that_is_not_utf8_is_named() {
        use std::os::unix::ffi::OsStrExt;
        let load_bytes = |pairs: &[(&str, &[u8])]| {
            let map: HashMap<String, OsString> = (pairs.iter())
                .map(|(k, v)| (k.to_string(), std::ffi::OsStr::from_bytes(v).to_owned()))
                .collect();
            load_os(&|k| map.get(k).cloned())
        };
        let error = load_bytes(&[
            ("PADLL_MOUNTS", b"/tmp/caf\xe9"),
            ("PADLL_RULES", b"open=5"),
        ])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "PADLL_MOUNTS: '/tmp/caf\\xe9' is not UTF-8: only UTF-8 values can be used"
        );
        // A batch system's variable is read as well as it can be.
        let config = load_bytes(&[("SLURM_JOB_ID", b"j\xff")]).unwrap();
        assert_eq!(config.identity.job_id, "j\u{fffd}");
    }

    /// A `[[limit]] burst` is bounded as `burst_ms` is: a minute of the rate (a burst of
    /// 99999999999999 at 5/s was taken, a limit that never binds).
    #[test]
    fn a_limit_burst_deeper_than_a_minute_of_its_rate_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("padll-config-limit-burst-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("padll.toml");
        let file = path.to_str().unwrap();
        let limit = |rate: &str, burst: u64| {
            let text = format!("[[limit]]\nselector = \"data\"\nrate = {rate}\nburst = {burst}\n");
            std::fs::write(&path, text).unwrap();
            load_from(&[("PADLL_CONFIG", file)])
        };
        assert_eq!(limit("5", 300).unwrap().limits[0].burst, 300);
        assert_eq!(
            limit("\"1MiB/s\"", 60 << 20).unwrap().limits[0].burst,
            60 << 20
        );
        for (rate, burst, most) in [
            ("5", 301, 300),
            ("5", 99_999_999_999_999, 300),
            ("\"1MiB/s\"", (60 << 20) + 1, 60 << 20),
        ] {
            let error = limit(rate, burst).unwrap_err();
            assert_eq!(
                error,
                format!(
                    "PADLL_CONFIG: '{file}': limit[0]: burst = {burst}: must be 1 to {most} \
                     (60 s of the rate) (selector 'data')"
                )
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
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
