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
//! | `PADLL_LOG` | `error` (default), `warn`, `info`, `debug`, or `off` |
//! | `PADLL_CONFIG` | a TOML file with the same settings (variables override it) |

pub use crate::channel::LimitScope;
use crate::channel::{ChannelSpec, Scope, Unit};
use serde::{Deserialize, Serialize};

/// Default bucket depth, in milliseconds' worth of the rate.
pub const DEFAULT_BURST_MS: u64 = 10;

/// A rate as written by a user: `5000/s`, `2k`, `100MiB/s`, `1.5GB/s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Tokens per second.
    pub per_second: u64,
    /// Requests, or bytes when the unit named bytes (`B`, `KiB`, `MB`, …).
    pub unit: Unit,
}

/// Parses a rate. A unit containing `B` counts bytes (`KB` = 1000 B, `KiB` = 1024 B);
/// otherwise the rate counts requests, with optional `k`, `M`, `G` multipliers.
/// `/s` is optional.
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let bad = |why: &str| format!("bad rate '{text}': {why}");
    let trimmed = text.trim();
    let body = trimmed.strip_suffix("/s").unwrap_or(trimmed).trim();
    if body.starts_with('-') {
        return Err(bad("must not be negative"));
    }
    let lowered = body.trim_start_matches('+').to_ascii_lowercase();
    if ["inf", "infinity", "nan"].contains(&lowered.as_str()) {
        return Err(bad("must be a finite number"));
    }
    let split = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| bad("expected a number such as 5000/s or 100MiB/s"))?;
    let (multiplier, unit) = match suffix.trim() {
        "" => (1.0, Unit::Requests),
        "k" | "K" => (1e3, Unit::Requests),
        "M" => (1e6, Unit::Requests),
        "G" => (1e9, Unit::Requests),
        "B" => (1.0, Unit::Bytes),
        "kB" | "KB" => (1e3, Unit::Bytes),
        "MB" => (1e6, Unit::Bytes),
        "GB" => (1e9, Unit::Bytes),
        "TB" => (1e12, Unit::Bytes),
        "KiB" => (1024.0, Unit::Bytes),
        "MiB" => (1024.0 * 1024.0, Unit::Bytes),
        "GiB" => (1024.0 * 1024.0 * 1024.0, Unit::Bytes),
        "TiB" => (1024.0 * 1024.0 * 1024.0 * 1024.0, Unit::Bytes),
        other => {
            return Err(bad(&format!(
                "unknown unit '{other}' (use k, M, G, B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            )))
        }
    };
    let per_second = (value * multiplier).round();
    if per_second < 1.0 {
        return Err(bad("must be at least 1 per second"));
    }
    if per_second > crate::channel::MAX_RATE as f64 {
        return Err(bad("too large"));
    }
    Ok(Rate {
        per_second: per_second as u64,
        unit,
    })
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

/// A selector: an operation, class or `all`, optionally scoped to one mountpoint
/// (`/scratch:metadata`).
pub fn parse_selector(text: &str) -> Result<(Option<String>, Scope), String> {
    let (mount, name) = match text.rsplit_once(':') {
        Some((mount, name)) if mount.starts_with('/') => (Some(mount.to_string()), name),
        Some(_) => return Err(format!("bad selector '{text}': a scope must be an absolute mountpoint, as in /scratch:metadata")),
        None => (None, text),
    };
    let scope = Scope::parse(name).ok_or_else(|| {
        format!(
            "bad selector '{text}': '{name}' is not 'all', a class (metadata, data, directory, xattr) or an operation ({})",
            crate::ops::Op::ALL.iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")
        )
    })?;
    Ok((mount, scope))
}

/// Parses `SELECTOR=RATE` into a channel spec whose burst is `burst_ms` of the rate.
pub fn parse_rule(text: &str, burst_ms: u64) -> Result<ChannelSpec, String> {
    let (selector, rate) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("bad limit '{text}': expected SELECTOR=RATE, as in open=5000/s or /scratch:data=100MiB/s"))?;
    let (mount, scope) = parse_selector(selector.trim())?;
    let rate = parse_rate(rate)?;
    Ok(ChannelSpec {
        mount: mount.map(|m| normalize_mount(&m)),
        scope,
        rate: rate.per_second,
        unit: rate.unit,
        burst: burst_for(rate.per_second, burst_ms),
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
    fn parse(text: &str) -> Result<LogLevel, String> {
        match text {
            "off" => Ok(LogLevel::Off),
            "error" => Ok(LogLevel::Error),
            "warn" => Ok(LogLevel::Warn),
            "info" => Ok(LogLevel::Info),
            "debug" => Ok(LogLevel::Debug),
            other => Err(format!(
                "bad log level '{other}' (use off, error, warn, info, debug)"
            )),
        }
    }
}

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
}

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
pub fn read_config_file(path: &str) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".to_string());
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "{} bytes exceeds the limit of {MAX_CONFIG_BYTES}",
            meta.len()
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "it grew past the limit of {MAX_CONFIG_BYTES} bytes"
        ));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())
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
    for spec in &limits {
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
    })
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
        assert_eq!(
            r("5000/s"),
            Rate {
                per_second: 5000,
                unit: Unit::Requests
            }
        );
        assert_eq!(
            r("2k"),
            Rate {
                per_second: 2000,
                unit: Unit::Requests
            }
        );
        assert_eq!(
            r("1.5M/s"),
            Rate {
                per_second: 1_500_000,
                unit: Unit::Requests
            }
        );
        assert_eq!(
            r("100MiB/s"),
            Rate {
                per_second: 100 << 20,
                unit: Unit::Bytes
            }
        );
        assert_eq!(
            r("10 GB/s"),
            Rate {
                per_second: 10_000_000_000,
                unit: Unit::Bytes
            }
        );
        assert_eq!(
            r("1TiB/s"),
            Rate {
                per_second: 1 << 40,
                unit: Unit::Bytes
            }
        );
        for bad in [
            "", "fast", "5x/s", "0/s", "0.1", "-5", "1e99GB", "inf", "NaN", "-inf/s",
        ] {
            let err = parse_rate(bad).unwrap_err();
            assert!(err.contains(&format!("'{bad}'")), "{err}");
        }
        for (bad, why) in [
            ("-5", "must not be negative"),
            ("-inf/s", "must not be negative"),
            ("inf", "must be a finite number"),
            ("NaN/s", "must be a finite number"),
        ] {
            let err = parse_rate(bad).unwrap_err();
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
        assert!(parse_selector("scratch:open")
            .unwrap_err()
            .contains("scratch:open"));
        assert!(parse_selector("opne").unwrap_err().contains("'opne'"));
        let spec = parse_rule("/scratch/:data=100MiB/s", 10).unwrap();
        assert_eq!(spec.mount.as_deref(), Some("/scratch"));
        assert_eq!(spec.unit, Unit::Bytes);
        assert_eq!(spec.burst, (100 << 20) / 100);
        assert!(parse_rule("open", 10)
            .unwrap_err()
            .contains("SELECTOR=RATE"));
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
            "mounts = [\"/scratch\"]\njob_id = \"j1\"\n[[limit]]\nselector = \"/scratch:metadata\"\nrate = \"2k\"\nburst = 7\n",
        )
        .unwrap();
        let config = load_from(&[("PADLL_CONFIG", path.to_str().unwrap())]).unwrap();
        assert_eq!(config.mounts, vec!["/scratch"]);
        assert_eq!(config.identity.job_id, "j1");
        assert_eq!(config.limits[0].rate, 2000);
        assert_eq!(config.limits[0].burst, 7);
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
