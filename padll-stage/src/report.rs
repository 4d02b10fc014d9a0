//! This process' statistics report, written at exit when `PADLL_STATS` is set.

use crate::{channels, stats};
use padll_wire::config::Identity;
use padll_wire::report::{expand_path, table, Report};
use std::io::Write as _;

/// The current process' report.
pub fn current(identity: &Identity) -> Report {
    let mut identity = identity.clone();
    // After fork the identity's pids are the parent's.
    // SAFETY: getpid and getppid take no arguments, touch no memory of ours and cannot fail.
    unsafe {
        identity.pid = libc::getpid() as u32;
        identity.ppid = libc::getppid() as u32;
    }
    Report {
        program: std::env::args().next().unwrap_or_default(),
        identity,
        ops: stats::snapshot(),
        channels: channels::list(),
        latency: stats::latency_rows(&crate::mountpoints()),
    }
}

/// Appends this process' report to `path` ([`expand_path`]: `%p` → pid, `%j` → job
/// id, `%h` → host): one JSON line when the name ends in `.json`, else a table. One
/// `write` call, so processes sharing a file don't interleave.
pub fn append(path: &str, identity: &Identity) -> Result<(), StatisticsError> {
    let report = current(identity);
    let path = expand_path(path, &report.identity);
    let error = |error| StatisticsError {
        path: path.clone(),
        error,
    };
    let text = if path.ends_with(".json") {
        let mut line = serde_json::to_string(&report).map_err(|e| error(e.into()))?;
        line.push('\n');
        line
    } else {
        table(std::slice::from_ref(&report))
    };
    open_statistics(&path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(error)
}

/// Statistics that could not be written: the file (its name expanded) and why.
#[derive(Debug, thiserror::Error)]
#[error("cannot write statistics to '{path}': {error}")]
pub struct StatisticsError {
    /// The file, as this process named it.
    pub path: String,
    /// Why.
    pub error: std::io::Error,
}

/// Opens the statistics file for appending, with care: non-blocking (a FIFO with no
/// reader fails instead of hanging the program at exit), not through a symbolic link in
/// its last component, and only if it is a regular file (a FIFO or device is refused).
pub fn open_statistics(path: &str) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::other("it is a symbolic link"),
            Some(libc::ENXIO) => std::io::Error::other("it is a FIFO without a reader"),
            _ => e,
        })?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}
