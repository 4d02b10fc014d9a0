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
/// its last component, only if it is a regular file (a FIFO or device is refused), and
/// not if another user planted it in a shared directory ([`planted`]).
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
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if let Some(owner) = planted(path, &metadata) {
        return Err(std::io::Error::other(format!(
            "it belongs to uid {owner}, in a directory every user may write"
        )));
    }
    Ok(file)
}

/// The owner of a statistics file that another user made in a sticky, world-writable
/// directory (`/tmp`, where the documented `%j`/`%p` names are predictable): the
/// kernel's `fs.protected_regular` rule, which a node may not enforce. Appending there
/// would hand that user the job's reports and let them forge lines of it. A file of
/// the directory's owner, or in a directory of the user's own (a project's,
/// group-writable), is written as before.
fn planted(path: &str, file: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid takes no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    if file.uid() == me {
        return None;
    }
    let parent = match std::path::Path::new(path).parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => std::path::Path::new("."),
    };
    let directory = std::fs::metadata(parent).ok()?;
    let shared =
        directory.mode() & (libc::S_ISVTX | libc::S_IWOTH) == libc::S_ISVTX | libc::S_IWOTH;
    (shared && directory.uid() != file.uid()).then_some(file.uid())
}
