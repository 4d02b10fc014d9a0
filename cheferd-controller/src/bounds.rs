//! What keeps the controllers bounded against hostile local users (issue 8): safe
//! creation of the Unix sockets, accept loops that back off when descriptors run out,
//! rate-limited logging of peers' mistakes, and byte budgets for partial lines.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::warn;

/// Creates a listening Unix socket at `path` with `mode`, refusing anything unsafe, in
/// one line naming the path; the [`SocketFile`] removes it again when dropped.
///
/// - a missing directory is named (`/run/cheferd` is made by systemd's
///   `RuntimeDirectory=`; elsewhere give the socket's path);
/// - a stale socket (connecting to it is refused: nobody listens) owned by us or root
///   is replaced;
/// - a live one (a controller answers on it) is never taken over, nor one whose state
///   cannot be told;
/// - a symbolic link (dangling or not) or a file of another type is refused;
/// - a parent directory writable by others is refused unless it has the sticky bit
///   (as `/tmp` has: there nobody else can remove or rename our socket), in which case a
///   stale socket must be our own to be replaced.
pub fn bind_unix(
    path: &Path,
    mode: u32,
) -> Result<(std::os::unix::net::UnixListener, SocketFile), SocketError> {
    let bad = |kind| SocketError {
        path: path.to_path_buf(),
        kind,
    };
    let parent = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => parent,
        None => Path::new("."),
    };
    let dir_error = |error| {
        bad(SocketErrorKind::Directory {
            dir: parent.to_path_buf(),
            error,
        })
    };
    let dir = std::fs::metadata(parent).map_err(dir_error)?;
    let sticky = dir.mode() & 0o1000 != 0;
    // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
    let me = unsafe { libc::geteuid() };
    if dir.mode() & 0o022 != 0 && !sticky {
        return Err(bad(SocketErrorKind::OpenDirectory {
            dir: parent.to_path_buf(),
            mode: dir.mode() & 0o7777,
        }));
    }
    if dir.uid() != me && dir.uid() != 0 && dir.mode() & 0o022 == 0 {
        // Another user's private directory: they could replace our socket.
        return Err(bad(SocketErrorKind::ForeignDirectory {
            dir: parent.to_path_buf(),
            uid: dir.uid(),
        }));
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bad(SocketErrorKind::Inspect(e))),
        Ok(meta) if meta.file_type().is_symlink() => return Err(bad(SocketErrorKind::Symlink)),
        Ok(meta) if !meta.file_type().is_socket() => return Err(bad(SocketErrorKind::NotSocket)),
        Ok(meta) => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err(bad(SocketErrorKind::Live)),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(bad(SocketErrorKind::Undecidable(e))),
            }
            if meta.uid() != me && meta.uid() != 0 && (sticky || me != 0) {
                return Err(bad(SocketErrorKind::ForeignStale(meta.uid())));
            }
            std::fs::remove_file(path).map_err(|e| bad(SocketErrorKind::Replace(e)))?;
        }
    }
    let listen = |e| bad(SocketErrorKind::Listen(e));
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(listen)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| bad(SocketErrorKind::Permissions(e)))?;
    listener.set_nonblocking(true).map_err(listen)?;
    let created = std::fs::symlink_metadata(path).map_err(listen)?;
    let file = SocketFile {
        path: path.to_path_buf(),
        identity: (created.dev(), created.ino()),
        _bound: listener.try_clone().map_err(listen)?,
    };
    Ok((listener, file))
}

/// A socket [`bind_unix`] refused or could not make: the path and why.
#[derive(Debug, thiserror::Error)]
#[error("{} {}: {kind}", kind.what_of(), path.display())]
pub struct SocketError {
    /// The socket's path.
    pub path: PathBuf,
    /// Why.
    pub kind: SocketErrorKind,
}

/// Why a socket was refused or not made.
#[derive(Debug, thiserror::Error)]
pub enum SocketErrorKind {
    /// Its directory cannot be examined.
    #[error("its directory {}: {error}", dir.display())]
    Directory {
        /// The directory.
        dir: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// Its directory is writable by others and not sticky.
    #[error("its directory {} is writable by others (mode {mode:o}) and not sticky", dir.display())]
    OpenDirectory {
        /// The directory.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Its directory is another user's.
    #[error("its directory {} belongs to uid {uid}", dir.display())]
    ForeignDirectory {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// What is at the path cannot be examined.
    #[error("{0}")]
    Inspect(io::Error),
    /// A symbolic link is there.
    #[error("it is a symbolic link (remove it if it is yours)")]
    Symlink,
    /// Some other file is there.
    #[error("it exists and is not a socket")]
    NotSocket,
    /// A controller answers on it.
    #[error("a running controller answers on it (stop it first, or give another path)")]
    Live,
    /// Whether a controller answers on it cannot be told.
    #[error("cannot tell whether a controller answers on it: {0}")]
    Undecidable(io::Error),
    /// A stale socket of another uid.
    #[error("the stale socket there belongs to uid {0}")]
    ForeignStale(u32),
    /// The stale socket could not be removed.
    #[error("{0}")]
    Replace(io::Error),
    /// Binding or listening failed.
    #[error("{0}")]
    Listen(io::Error),
    /// Its mode could not be set.
    #[error("{0}")]
    Permissions(io::Error),
}

impl SocketErrorKind {
    /// How the message begins, before the path.
    fn what_of(&self) -> &'static str {
        match self {
            SocketErrorKind::Directory { .. } | SocketErrorKind::Inspect(_) => {
                "cannot use the socket"
            }
            SocketErrorKind::Replace(_) => "cannot replace the stale socket",
            SocketErrorKind::Listen(_) => "cannot listen on",
            SocketErrorKind::Permissions(_) => "cannot set permissions of",
            _ => "refusing the socket",
        }
    }
}

/// A socket file [`bind_unix`] created: removed when dropped (at shutdown, or when a
/// start fails half-way), unless it is no longer ours (removed by someone else, and
/// perhaps bound again by another controller).
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    /// Device and inode of the file we bound.
    identity: (u64, u64),
    /// The bound socket, kept open until the file is removed: it pins the file's inode,
    /// so a file made at the path meanwhile never has our inode number.
    _bound: std::os::unix::net::UnixListener,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.identity);
        if ours {
            if let Err(e) = std::fs::remove_file(&self.path) {
                warn!("cannot remove the socket {}: {e}", self.path.display());
            }
        }
    }
}

/// SIGTERM and SIGINT (what systemd, `kill` and Ctrl-C send to stop a daemon), caught
/// from [`StopSignals::install`] on so that a daemon can remove its sockets and log
/// its stop.
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Catches both signals from now on (inside a tokio runtime).
    pub fn install() -> Result<StopSignals, SignalsError> {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind: SignalKind| signal(kind).map_err(SignalsError);
        Ok(StopSignals {
            term: install(SignalKind::terminate())?,
            int: install(SignalKind::interrupt())?,
        })
    }

    /// Waits for either signal and returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// The stop signals could not be caught.
#[derive(Debug, thiserror::Error)]
#[error("cannot handle SIGTERM and SIGINT: {0}")]
pub struct SignalsError(pub io::Error);

/// Whether an accept error means the process (or system) ran out of something that
/// only time frees (descriptors, memory): the accept loop must then sleep, not spin.
pub fn is_exhaustion(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Backoff of an accept loop: after an error, how long to sleep (doubling from 10 ms
/// to 1 s while errors go on); logs one line per burst of errors and, when accepting
/// works again, one line with how many failed.
#[derive(Default)]
pub struct AcceptBackoff {
    failures: u64,
    delay: Duration,
}

impl AcceptBackoff {
    /// An accept failed: logs (first failure of a burst only) and returns how long to
    /// sleep before trying again.
    pub fn failed(&mut self, what: &str, error: &io::Error) -> Duration {
        if self.failures == 0 {
            warn!("{what}: accept failed ({error}); backing off until it works again");
        }
        self.failures += 1;
        self.delay = if is_exhaustion(error) {
            (self.delay * 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
        } else {
            Duration::from_millis(10)
        };
        self.delay
    }

    /// An accept worked.
    pub fn succeeded(&mut self, what: &str) {
        if self.failures > 0 {
            warn!(
                "{what}: accepting again after {} failed attempts",
                self.failures
            );
            self.failures = 0;
            self.delay = Duration::ZERO;
        }
    }
}

/// Raises the soft limit on open descriptors to the hard limit; returns the limit now
/// in force.
pub fn raise_nofile() -> u64 {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
        limit.rlim_cur as u64
    }
}

/// A log rate limit: at most `per_window` lines per `window`; the first line allowed
/// after some were suppressed says how many.
pub struct LogLimit {
    per_window: u64,
    window: Duration,
    /// Start of the current window (none yet) and lines logged in it.
    state: Mutex<(Option<Instant>, u64)>,
    suppressed: AtomicU64,
}

impl LogLimit {
    /// At most `per_window` lines per `window`.
    pub const fn new(per_window: u64, window: Duration) -> LogLimit {
        LogLimit {
            per_window,
            window,
            state: Mutex::new((None, 0)),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged now: `Some(n)` with the number suppressed since the
    /// last one logged, `None` to suppress this one.
    pub fn allow(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if state
            .0
            .is_none_or(|start| now.duration_since(start) >= self.window)
        {
            *state = (Some(now), 0);
        }
        if state.1 < self.per_window {
            state.1 += 1;
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Logs a warning about a peer's misbehaviour through `limit` (rate-limited; peers'
/// text must already be cut with `padll_wire::control::short`).
#[macro_export]
macro_rules! limited_warn {
    ($limit:expr, $($arg:tt)+) => {
        if let Some(suppressed) = $limit.allow() {
            if suppressed > 0 {
                tracing::warn!(suppressed, $($arg)+);
            } else {
                tracing::warn!($($arg)+);
            }
        }
    };
}

/// A byte budget shared by connections (partial lines being read): each connection
/// reserves what it buffers and gives it back when the line is complete or it leaves.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Takes `bytes` if they fit.
    pub fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    /// Gives `bytes` back.
    pub fn give(&self, bytes: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    /// Bytes in use.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Longest job id, user, account, host or program name a stage may register with.
pub const MAX_NAME_BYTES: usize = 256;
/// Most mountpoints a stage may register, and the longest one.
pub const MAX_MOUNTPOINTS: usize = 64;
/// Longest mountpoint, bytes.
pub const MAX_MOUNT_BYTES: usize = 4096;

/// Checks the sizes of what a stage registers (every field is kept for as long as the
/// stage runs, on the local and the global controller).
pub fn check_stage(stage: &crate::proto::Stage) -> Result<(), StageTooLarge> {
    for (what, value) in [
        ("job id", &stage.job_id),
        ("user", &stage.user),
        ("account", &stage.account),
        ("hostname", &stage.hostname),
        ("program name", &stage.stage_name),
    ] {
        if value.len() > MAX_NAME_BYTES {
            return Err(StageTooLarge::Name {
                what,
                bytes: value.len(),
            });
        }
    }
    if stage.mountpoints.len() > MAX_MOUNTPOINTS {
        return Err(StageTooLarge::Mountpoints(stage.mountpoints.len()));
    }
    if let Some(long) = stage.mountpoints.iter().find(|m| m.len() > MAX_MOUNT_BYTES) {
        return Err(StageTooLarge::Mountpoint(long.len()));
    }
    Ok(())
}

/// What of a stage [`check_stage`] found too large (its size; the bytes themselves are
/// a peer's and not echoed).
#[derive(Debug, thiserror::Error)]
pub enum StageTooLarge {
    /// A name field.
    #[error("its {what} of {bytes} bytes exceeds {MAX_NAME_BYTES}")]
    Name {
        /// Which field.
        what: &'static str,
        /// Its length.
        bytes: usize,
    },
    /// Too many mountpoints.
    #[error("{0} mountpoints exceed {MAX_MOUNTPOINTS}")]
    Mountpoints(usize),
    /// A mountpoint too long.
    #[error("a mountpoint of {0} bytes exceeds {MAX_MOUNT_BYTES}")]
    Mountpoint(usize),
}

/// A TCP listener as a stream of connections for tonic whose accept errors never end
/// the server nor make it spin: it backs off (10 ms doubling to 1 s) while accepting
/// fails (e.g. `EMFILE`), logging once per burst.
pub struct Incoming {
    listener: tokio::net::TcpListener,
    backoff: AcceptBackoff,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Incoming {
    /// Wraps a bound listener.
    pub fn new(listener: tokio::net::TcpListener) -> Incoming {
        Incoming {
            listener,
            backoff: AcceptBackoff::default(),
            sleep: None,
        }
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<tokio::net::TcpStream>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::future::Future;
        use std::task::Poll;
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, _))) => {
                    self.backoff.succeeded("gRPC listener");
                    let _ = stream.set_nodelay(true);
                    return Poll::Ready(Some(Ok(stream)));
                }
                Poll::Ready(Err(e)) => {
                    let delay = self.backoff.failed("gRPC listener", &e);
                    self.sleep = Some(Box::pin(tokio::time::sleep(delay)));
                }
            }
        }
    }
}
