//! The stage's control client: a background thread that registers this process with
//! the node's local controller (`PADLL_CONTROLLER`, a Unix socket), pushes usage and
//! applies the rules it receives (PADLL paper §III-B).
//!
//! The application's I/O never waits on it: rules reach the data path through the
//! channel table's atomics. Only a starting program waits, at most
//! [`FIRST_RULES_PATIENCE`], for its first rules (fail closed: a new process of a job
//! never runs unthrottled until they come). When none come — the controller is
//! unreachable, refuses the stage or is silent — it runs under its [`Fallback`]: the
//! job's last rules on this node ([`last_rules`]), else the default limit. The whole
//! thread runs as the stage's own I/O (no hook manages its socket). If the controller
//! goes away the stage keeps its last rules (fail-static), says so once on stderr, and
//! reconnects with exponential backoff. After `fork` the child closes its copy of the
//! parent's connection and starts its own thread.
//!
//! The connection is one descriptor, moved out of the program's way and checked to be
//! still ours before every use ([`crate::stage_fds`]): a program that closes it
//! (`closefrom(3)`) or puts a file of its own on its number (`exec 4>log`) never has its
//! file written, read or closed by the stage, which forgets the number and reconnects
//! on a fresh one.

use crate::guard::StageIo;
use crate::stage_fds::{self, Held, Slot};
use crate::{channels, last_rules, log, stats};
use padll_wire::channel::{ChannelSpec, Unit};
use padll_wire::config::{Identity, LogLevel};
use padll_wire::control::{
    self, ControlMessage, StageMessage, MAX_MESSAGE_BYTES, PROTOCOL_VERSION,
};
use padll_wire::sync::{lock, recover, try_lock};
use std::convert::Infallible;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Why a rule set cannot be applied: the rule at fault.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// A rule names a mountpoint this stage does not manage.
    #[error("'{0}' is not a mountpoint of this stage")]
    NotAMountpoint(String),
    /// A rule counting bytes of operations that move none: it would never limit.
    #[error("rule '{0}' is a rate of bytes, but {scope} counts operations", scope = .0.scope.name())]
    BytesOnOperations(ChannelSpec),
    /// The channel table refused a rule.
    #[error(transparent)]
    Channel(#[from] channels::ChannelError),
}

/// Why the process at the controller's socket is not trusted to give rules.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Its credentials cannot be read.
    #[error("cannot tell who serves it: {0}")]
    Unknown(std::io::Error),
    /// It runs as a uid that may not set our rules.
    #[error(
        "it is served by uid {uid} (pid {pid}), neither root{} nor this process' uid; its rules are refused",
        .controller_uid.map_or(String::new(), |uid| format!(", the controller's uid {uid}"))
    )]
    Stranger {
        /// Its uid.
        uid: u32,
        /// Its pid.
        pid: i32,
        /// The configured controller uid, if any.
        controller_uid: Option<u32>,
    },
}

/// Where to connect, whom to trust there, who we are, and what to run under without
/// rules from the controller.
pub struct Target {
    /// The local controller's socket.
    pub socket: String,
    /// The uid the controller may run as besides root and our own.
    pub controller_uid: Option<u32>,
    /// Who we are.
    pub identity: Identity,
    /// Our mountpoints.
    pub mountpoints: Vec<String>,
    /// Rules when the controller gives none at start.
    pub fallback: Fallback,
}

/// What a starting program runs under when the controller gives it no rules.
pub struct Fallback {
    /// The job whose last rules are kept and used (uid, job id), when limits bind the
    /// job; `None` for per-process limits.
    pub job: Option<(u32, String)>,
    /// `PADLL_DEFAULT_LIMIT`: `None` keeps the configured limits; empty = unthrottled.
    pub default_limits: Option<Vec<ChannelSpec>>,
}

static TARGET: OnceLock<Target> = OnceLock::new();
/// The connected socket's descriptor and identity (none when not connected), closed by
/// a forked child if still ours.
static CONNECTION: Slot = Slot::empty();

/// The connection: one socket, shared by the control thread (reading) and [`writer`].
type Connection = Arc<Held<UnixStream>>;

const MAX_BACKOFF: Duration = Duration::from_secs(5);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A forked child waits this long before registering: most children `exec` at once
/// (a shell running a command), and the new program registers itself.
const CHILD_REGISTRATION_DELAY: Duration = Duration::from_millis(250);

/// How long a starting program waits for its first rules from the controller before
/// it runs under its [`Fallback`]: a new process of a job must not run unthrottled
/// until its rules arrive (the controller answers in a few ms; only an unreachable
/// global controller makes a start wait this long).
const FIRST_RULES_PATIENCE: Duration = Duration::from_millis(100);

/// Where a starting program stands with its first rules.
#[derive(Clone, Debug, PartialEq)]
enum FirstRules {
    /// Nothing yet.
    Waiting,
    /// The controller will give none: why (unreachable, rejected the stage, bad rules).
    Refused(String),
    /// In force: the controller's, or the fallback.
    Settled,
}

/// The starting program's [`FirstRules`]; once [`SETTLED`], never taken again (so a
/// `fork` cannot leave it held for the child).
static FIRST_RULES: (Mutex<FirstRules>, Condvar) =
    (Mutex::new(FirstRules::Waiting), Condvar::new());
static SETTLED: AtomicBool = AtomicBool::new(false);

/// Starts the control thread (once per process; again in a forked child) and waits for
/// the first rules (≤ [`FIRST_RULES_PATIENCE`]); without them, applies the fallback.
pub fn start(target: Target) {
    let _ = TARGET.set(target);
    spawn(Duration::ZERO);
    let (state, signal) = &FIRST_RULES;
    let guard = lock(state);
    let (mut guard, _) = recover(
        signal.wait_timeout_while(guard, FIRST_RULES_PATIENCE, |s| *s == FirstRules::Waiting),
    );
    // A controller that is only slow (its global controller away) is worth a warning;
    // one that cannot be used, an error.
    let why = match &*guard {
        FirstRules::Settled => None,
        FirstRules::Waiting => Some((
            LogLevel::Warn,
            format!("none within {} ms", FIRST_RULES_PATIENCE.as_millis()),
        )),
        FirstRules::Refused(why) => Some((LogLevel::Error, why.clone())),
    };
    if let (Some((level, why)), Some(target)) = (why, TARGET.get()) {
        // Under the lock: rules the controller sends meanwhile are applied after these.
        fall_back(target, level, &why);
    }
    *guard = FirstRules::Settled;
    SETTLED.store(true, Ordering::Release);
}

/// The controller will give the starting program no rules: tells it why (it applies
/// its fallback and says so). `false` if the program is past its start.
fn no_first_rules(why: String) -> bool {
    if SETTLED.load(Ordering::Acquire) {
        return false;
    }
    let (state, signal) = &FIRST_RULES;
    let mut guard = lock(state);
    if *guard != FirstRules::Waiting {
        return *guard != FirstRules::Settled;
    }
    *guard = FirstRules::Refused(why);
    signal.notify_all();
    true
}

/// Applies rules from the controller; the first ones end the starting program's wait.
fn apply_from_controller(target: &Target, rules: &[ChannelSpec]) -> Result<(), RulesError> {
    let result = if SETTLED.load(Ordering::Acquire) {
        apply(rules)
    } else {
        let (state, signal) = &FIRST_RULES;
        let mut guard = lock(state);
        let result = apply(rules);
        *guard = match &result {
            Ok(()) => FirstRules::Settled,
            Err(e) if *guard == FirstRules::Waiting => {
                FirstRules::Refused(format!("its rules were refused: {e}"))
            }
            Err(_) => guard.clone(),
        };
        SETTLED.store(*guard == FirstRules::Settled, Ordering::Release);
        signal.notify_all();
        result
    };
    if let (Ok(()), Some((uid, job))) = (&result, &target.fallback.job) {
        keep_last_rules(*uid, job, rules);
    }
    result
}

/// Whether this process keeps the job's last rules: [`KEEPING`], [`SAVING`] (a save
/// under way) or [`STOPPED`] (the process is ending).
static RULES_KEEPER: AtomicU8 = AtomicU8::new(KEEPING);
const KEEPING: u8 = 0;
const SAVING: u8 = 1;
const STOPPED: u8 = 2;

/// Saves `rules` as the job's last rules, unless the process is ending.
fn keep_last_rules(uid: u32, job: &str, rules: &[ChannelSpec]) {
    if RULES_KEEPER
        .compare_exchange(KEEPING, SAVING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let saved = last_rules::save(uid, job, rules);
    // Only this thread moves it from SAVING.
    RULES_KEEPER.store(KEEPING, Ordering::Release);
    if let Err(e) = saved {
        log(
            LogLevel::Warn,
            &format!("cannot keep the job's last rules: {e}"),
        );
    }
}

/// At exit: keeps no more rules, once a save under way (a few file operations) is done
/// (waiting at most 100 ms), so that a last process removing the job's file does not
/// see it written again behind it.
pub fn stop_keeping_rules() {
    for _ in 0..100 {
        match RULES_KEEPER.compare_exchange(KEEPING, STOPPED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) | Err(STOPPED) => return,
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Puts the starting program under the job's last rules on this node, else the
/// default limit, else leaves its configured limits; says which in one line at `level`.
fn fall_back(target: &Target, level: LogLevel, why: &str) {
    let fallback = &target.fallback;
    let ignored = |e: &dyn std::fmt::Display| {
        log(
            LogLevel::Error,
            &format!("ignored the job's last rules: {e}"),
        );
        None
    };
    let saved = fallback
        .job
        .as_ref()
        .and_then(|(uid, job)| match last_rules::load(*uid, job) {
            Ok(Some(rules)) => match check(&rules) {
                Ok(()) => Some(rules),
                Err(e) => ignored(&e),
            },
            Ok(None) => None,
            Err(e) => ignored(&e),
        });
    let chosen = match (saved, &fallback.default_limits) {
        (Some(rules), _) => Some((rules, "the job's last rules on this node")),
        (None, Some(limits)) => Some((limits.clone(), "the default limit (PADLL_DEFAULT_LIMIT)")),
        (None, None) => None,
    };
    let running = match chosen {
        None => "its configured limits".to_string(),
        Some((rules, source)) => {
            match crate::install_limits(&rules, fallback.job.as_ref()) {
                // Nothing changed (an installation is all or nothing).
                Err(e) => format!("its configured limits, as {source} cannot be applied ({e})"),
                Ok(_) if rules.is_empty() => format!("{source}: none"),
                Ok(_) => format!(
                    "{source}: {}",
                    rules
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
    };
    log(
        level,
        &format!(
            "no rules from the controller at {} ({why}): running under {running}",
            target.socket
        ),
    );
}

fn spawn(delay: Duration) {
    let _ = std::thread::Builder::new()
        .name("padll-control".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            let _io = StageIo::enter();
            std::thread::sleep(delay);
            if let Some(target) = TARGET.get() {
                run(target);
            }
        });
}

/// In the child of `fork`: drop the parent's connection and connect anew.
pub fn after_fork_in_child() {
    if TARGET.get().is_none() {
        return;
    }
    // No one waits for first rules in the child (only a starting program does).
    SETTLED.store(true, Ordering::Release);
    // A save the parent's control thread was making is not the child's.
    let _ = RULES_KEEPER.compare_exchange(SAVING, KEEPING, Ordering::AcqRel, Ordering::Acquire);
    // Not waited for. Forgotten, not dropped: the parent's control thread, which shares
    // it, is not here. One held at `fork` by another thread (the control thread in a
    // write to a controller that stopped reading) stays held in this process for ever:
    // the child leaves it, with the parent's connection in it, and writes through a
    // lock of its own.
    match try_lock(writer()) {
        Some(mut held) => std::mem::forget(held.take()),
        None => {
            let fresh: &'static Mutex<Option<Connection>> = Box::leak(Box::new(Mutex::new(None)));
            WRITER.store(std::ptr::from_ref(fresh).cast_mut(), Ordering::Release);
        }
    }
    // Our copy of the parent's socket, unless the program put a file of its own on its
    // number (raw calls: no hook, async-signal-safe).
    if let Some((fd, identity)) = CONNECTION.take() {
        stage_fds::close_if_ours(fd, identity);
    }
    // The threads that were waiting for placement answers are the parent's.
    lock(&PENDING.0).clear();
    spawn(CHILD_REGISTRATION_DELAY);
}

fn run(target: &Target) {
    let mut backoff = Duration::from_millis(100);
    let mut was_connected = false;
    let mut warned = false;
    loop {
        match session(target) {
            Ended::Rejected {
                reason,
                retry: false,
            } => {
                // It never will take this stage: keep the rules in force, stop trying.
                if !no_first_rules(format!("it rejected this stage: {reason}")) {
                    log(
                        LogLevel::Error,
                        &format!(
                            "the controller rejected this stage: {reason}; keeping the rules in force"
                        ),
                    );
                }
                return;
            }
            Ended::Rejected {
                reason,
                retry: true,
            } => {
                // A cap or a budget, which frees up: keep the rules in force and try
                // again on the slow backoff. Said once on stderr (the fallback's line
                // at start), later ones below it.
                let told = no_first_rules(format!("it rejected this stage: {reason}; retrying"));
                if !told {
                    log(
                        if REJECTION_TOLD.load(Ordering::Relaxed) {
                            LogLevel::Info
                        } else {
                            LogLevel::Error
                        },
                        &format!(
                            "the controller at {} rejected this stage ({reason}); keeping the rules in force, retrying",
                            target.socket
                        ),
                    );
                }
                REJECTION_TOLD.store(true, Ordering::Relaxed);
                warned = true;
                backoff = backoff.max(REJECTED_BACKOFF);
            }
            Ended::Taken(reason) => {
                // Nothing is wrong with the controller: said only at `info`.
                log(
                    LogLevel::Info,
                    &format!(
                        "the program took the controller's connection ({reason}); reconnecting"
                    ),
                );
                was_connected = true;
                backoff = Duration::from_millis(100);
            }
            Ended::Lost(reason) => {
                // Said once on stderr: a controller that restarts again and again must
                // not fill the job's error output (later losses at `warn`).
                let level = if LOSS_TOLD.swap(true, Ordering::Relaxed) {
                    LogLevel::Warn
                } else {
                    LogLevel::Error
                };
                log(
                    level,
                    &format!(
                        "lost the controller at {} ({reason}); keeping the last rules",
                        target.socket
                    ),
                );
                was_connected = true;
                backoff = Duration::from_millis(100);
            }
            Ended::NeverConnected(reason) => {
                let told = no_first_rules(format!("cannot reach it: {reason}; retrying"));
                if !told && !warned && !was_connected {
                    log(
                        LogLevel::Error,
                        &format!(
                            "cannot reach the controller at {} ({reason}); keeping the rules in force, retrying",
                            target.socket
                        ),
                    );
                }
                warned = true;
            }
        }
        std::thread::sleep(jittered(backoff));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Whether a loss of the controller was said on stderr (later ones are logged at
/// `warn`, reconnections at `info`). Inherited by a forked child: its parent said it on
/// the same stderr.
static LOSS_TOLD: AtomicBool = AtomicBool::new(false);

/// Whether a rejection was said on stderr (later ones are logged at `info`). Inherited
/// by a forked child: its parent said it on the same stderr.
static REJECTION_TOLD: AtomicBool = AtomicBool::new(false);

/// The first wait after a rejection that may change: the processes of a job rejected
/// together (a cap) come back spread over seconds, not at once.
const REJECTED_BACKOFF: Duration = Duration::from_secs(1);

/// `backoff` less up to half of it, at random: processes that lost or were refused by
/// the controller together do not all come back at the same instant.
fn jittered(backoff: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // SAFETY: a trivial getter.
    let pid = unsafe { libc::getpid() } as u64;
    // splitmix64 of the time and pid: processes started together still differ.
    let mut x = (u64::from(nanos) ^ pid.rotate_left(32)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    let half = backoff / 2;
    let cut = half.as_nanos() as u64;
    backoff - Duration::from_nanos(if cut == 0 { 0 } else { x % (cut + 1) })
}

/// How a session with the controller ended (it ends in no other way).
#[derive(Debug)]
enum Ended {
    /// The controller rejected this stage: its reason, shortened, and whether the
    /// rejection may change (a cap, a budget: tried again later).
    Rejected { reason: String, retry: bool },
    /// No session: the controller could not be reached, trusted or registered with.
    NeverConnected(Unreachable),
    /// The connection broke after registration.
    Lost(std::io::Error),
    /// The program closed the connection's descriptor or put a file of its own on its
    /// number (left to it, never closed).
    Taken(std::io::Error),
}

/// Why no session with the controller began.
#[derive(Debug, thiserror::Error)]
enum Unreachable {
    /// Connecting or the handshake's I/O failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The process at the socket may not give rules.
    #[error(transparent)]
    Untrusted(#[from] TrustError),
    /// It answered `hello` with something else than `welcome` or `reject`.
    #[error("unexpected handshake reply {0:?}")]
    Handshake(Option<ControlMessage>),
}

/// One connection: handshake, then serve until it ends.
fn session(target: &Target) -> Ended {
    // Out of the program's way from the start, on a fresh number at each reconnect.
    let stream = match UnixStream::connect(&target.socket).and_then(Held::adopt) {
        Ok(stream) => stream,
        Err(e) => return Ended::NeverConnected(e.into()),
    };
    let trusted = match stream.get() {
        Ok(socket) => trust(socket, target.controller_uid).map_err(Unreachable::from),
        Err(e) => Err(e.into()),
    };
    if let Err(e) = trusted {
        return Ended::NeverConnected(e);
    }
    CONNECTION.store(stream.fd(), stream.identity());
    let connection = Arc::new(stream);
    let Err(mut ended) = serve(target, Arc::clone(&connection));
    CONNECTION.take();
    if let (Ended::Lost(e) | Ended::NeverConnected(Unreachable::Io(e)), Err(_)) =
        (&mut ended, connection.get())
    {
        ended = Ended::Taken(std::mem::replace(e, std::io::Error::other("")));
    }
    drop(connection);
    // The last reference: the socket closes here, if it is still ours.
    *lock(writer()) = None;
    ended
}

/// Rules are taken only from a controller running as root, as the configured
/// controller uid, or as ourselves (who could change our rules anyway): anyone else who
/// put a socket at that path is not the node's controller.
fn trust(stream: &UnixStream, controller_uid: Option<u32>) -> Result<(), TrustError> {
    let mut peer = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a connected socket of ours and a buffer of the stated size.
    let got = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut peer as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if got != 0 {
        return Err(TrustError::Unknown(std::io::Error::last_os_error()));
    }
    // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
    let own = unsafe { libc::geteuid() };
    if peer.uid == 0 || peer.uid == own || Some(peer.uid) == controller_uid {
        return Ok(());
    }
    Err(TrustError::Stranger {
        uid: peer.uid,
        pid: peer.pid,
        controller_uid,
    })
}

/// Registers and serves the connection until it ends (never `Ok`).
fn serve(target: &Target, connection: Connection) -> Result<Infallible, Ended> {
    let never = |e: std::io::Error| Ended::NeverConnected(e.into());
    let mut reader = LineReader::new(Reader(Arc::clone(&connection)));
    let mut identity = target.identity.clone();
    // SAFETY: trivial getters (the pids change across fork).
    unsafe {
        identity.pid = libc::getpid() as u32;
        identity.ppid = libc::getppid() as u32;
    }
    let hello = StageMessage::Hello {
        version: PROTOCOL_VERSION,
        stage_name: std::env::args().next().unwrap_or_default(),
        identity,
        mountpoints: target.mountpoints.clone(),
    };
    let stream = || connection.get();
    stream()
        .and_then(|mut s| s.write_all(control::encode(&hello).as_bytes()))
        .map_err(never)?;
    stream()
        .and_then(|s| s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)))
        .map_err(never)?;
    // A controller that stops reading cannot hold the writer (and a `fork`) for ever.
    stream()
        .and_then(|s| s.set_write_timeout(Some(HANDSHAKE_TIMEOUT)))
        .map_err(never)?;
    let interval = match reader.next_message().map_err(never)? {
        Some(ControlMessage::Welcome {
            version: PROTOCOL_VERSION,
            report_interval_ms,
            ..
        }) => Duration::from_millis(report_interval_ms.clamp(10, 60_000)),
        Some(ControlMessage::Reject { reason, retry }) => {
            return Err(Ended::Rejected {
                reason: control::short(&reason),
                retry,
            })
        }
        other => return Err(Ended::NeverConnected(Unreachable::Handshake(other))),
    };
    // Only now may application threads write (a `place` before `hello` would be refused).
    *lock(writer()) = Some(Arc::clone(&connection));
    log(
        LogLevel::Info,
        &format!("registered with the controller at {}", target.socket),
    );

    let lost = Ended::Lost;
    let mut seq = 0u64;
    let mut next_report = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_report {
            seq += 1;
            send_usage(seq).map_err(lost)?;
            next_report = now + interval;
        }
        stream()
            .and_then(|s| {
                s.set_read_timeout(Some(
                    next_report
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ))
            })
            .map_err(lost)?;
        match reader.next_message() {
            Ok(Some(ControlMessage::CollectUsage)) => {
                seq += 1;
                send_usage(seq).map_err(lost)?;
            }
            Ok(Some(ControlMessage::SetRules {
                seq: rules_seq,
                rules,
            })) => {
                let error = apply_from_controller(target, &rules)
                    .err()
                    .map(|e| e.to_string());
                if let Some(e) = &error {
                    log(
                        LogLevel::Warn,
                        &format!("refused rules from the controller: {e}"),
                    );
                }
                let reply = StageMessage::Applied {
                    seq: rules_seq,
                    error,
                };
                send(&reply).map_err(lost)?;
            }
            Ok(Some(ControlMessage::Placed { id, targets })) => placement_answered(id, targets),
            Ok(Some(other)) => log(
                LogLevel::Warn,
                &format!("ignored unexpected message from the controller: {other:?}"),
            ),
            Ok(None) => {} // timeout: time to report
            Err(e) if e.kind() == ErrorKind::InvalidData => log(LogLevel::Warn, &e.to_string()),
            Err(e) => return Err(lost(e)),
        }
    }
}

fn send_usage(seq: u64) -> std::io::Result<()> {
    let usage = StageMessage::Usage {
        seq,
        channels: channels::list(),
        ops: stats::snapshot(),
        latency: stats::latency_rows(&crate::mountpoints()),
    };
    send(&usage)
}

/// The connection while connected, for writing: the control thread and application
/// threads asking for placement write whole lines through it, one at a time (each
/// write checks that its descriptor is still ours, [`Held::get`]). Reached through
/// [`writer`].
static FIRST_WRITER: Mutex<Option<Connection>> = Mutex::new(None);

/// The writer's lock in use when it is not [`FIRST_WRITER`]: a forked child whose
/// parent's control thread held the writer at `fork` (in a write that blocks) starts on
/// a fresh one (leaked: the inherited one can never be taken again).
static WRITER: AtomicPtr<Mutex<Option<Connection>>> = AtomicPtr::new(std::ptr::null_mut());

/// The writer's lock of this process.
fn writer() -> &'static Mutex<Option<Connection>> {
    let fresh = WRITER.load(Ordering::Acquire);
    if fresh.is_null() {
        &FIRST_WRITER
    } else {
        // SAFETY: only ever a leaked box, never freed.
        unsafe { &*fresh }
    }
}

/// Placement requests waiting for their answer: id and, once answered, the targets.
type Waiting = Vec<(u64, Option<Vec<u32>>)>;
static PENDING: (Mutex<Waiting>, Condvar) = (Mutex::new(Vec::new()), Condvar::new());
/// Requests waiting at once, at most (each is an application thread creating a file).
const MAX_PENDING: usize = 1024;

/// Writes one message on the connection (an error when there is none).
fn send(message: &StageMessage) -> std::io::Result<()> {
    let line = control::encode(message);
    match lock(writer()).as_ref() {
        Some(writer) => writer.get()?.write_all(line.as_bytes()),
        None => Err(std::io::Error::new(
            ErrorKind::NotConnected,
            "not connected",
        )),
    }
}

/// Asks the controller where a new file on `mount` should go: its `stripes` targets,
/// or `None` without a connection or an answer within `wait`. Called by an application
/// thread creating a file (as stage I/O).
pub(crate) fn ask_placement(mount: &str, stripes: u32, wait: Duration) -> Option<Vec<u32>> {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let (pending, answered) = &PENDING;
    {
        let mut waiting = lock(pending);
        if waiting.len() >= MAX_PENDING {
            return None;
        }
        waiting.push((id, None));
    }
    let deadline = Instant::now() + wait;
    let line = control::encode(&StageMessage::Place {
        id,
        mount: mount.to_string(),
        stripes,
    });
    let asked = send_within(line.as_bytes(), deadline);
    let mut waiting = lock(pending);
    if asked {
        let left = deadline.saturating_duration_since(Instant::now());
        waiting = recover(answered.wait_timeout_while(waiting, left, |w| {
            w.iter().any(|(i, targets)| *i == id && targets.is_none())
        }))
        .0;
    }
    let at = waiting.iter().position(|(i, _)| *i == id)?;
    waiting.swap_remove(at).1.filter(|t| !t.is_empty())
}

/// How long an application thread closing a placed file may wait for the writer to
/// report its size (the control thread may be writing); past it the size is lost.
const FILE_SIZE_WAIT: Duration = Duration::from_millis(10);

/// Reports the final size of a file this stage created placed on `mount` (called by
/// an application thread at the file's last close, [`crate::placed_files`]).
pub(crate) fn report_file_size(mount: &str, bytes: u64) {
    let _io = StageIo::enter();
    let line = control::encode(&StageMessage::FileSize {
        mount: mount.to_string(),
        bytes,
    });
    send_within(line.as_bytes(), Instant::now() + FILE_SIZE_WAIT);
}

/// Writes `line` for an application thread, never waiting past `deadline`: the writer
/// is taken only when free (the control thread may be in a write to a controller that
/// does not read), and the line goes out without blocking (a short line on a Unix
/// socket goes whole or not at all; a rare partial one is finished).
fn send_within(line: &[u8], deadline: Instant) -> bool {
    loop {
        match try_lock(writer()) {
            Some(writer) => {
                let Some(mut stream) = writer.as_ref().and_then(|w| w.get().ok()) else {
                    return false;
                };
                // SAFETY: our connected socket and a buffer of the stated length.
                let sent = unsafe {
                    libc::send(
                        stream.as_raw_fd(),
                        line.as_ptr().cast(),
                        line.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                };
                return match usize::try_from(sent) {
                    Ok(n) if n == line.len() => true,
                    Ok(n) if n > 0 => stream.write_all(&line[n..]).is_ok(),
                    _ => false,
                };
            }
            None if Instant::now() >= deadline => return false,
            None => std::thread::sleep(Duration::from_micros(100)),
        }
    }
}

/// The controller's answer to a placement request (late or unknown ones are dropped).
fn placement_answered(id: u64, targets: Vec<u32>) {
    let (pending, answered) = &PENDING;
    let mut waiting = lock(pending);
    if let Some(entry) = waiting.iter_mut().find(|(i, _)| *i == id) {
        entry.1 = Some(targets);
        answered.notify_all();
    }
}

type HeldForFork = (
    Option<std::sync::MutexGuard<'static, Option<Connection>>>,
    std::sync::MutexGuard<'static, Waiting>,
);

thread_local! {
    /// The writer and pending-request guards held by the thread calling `fork`.
    static HELD_FOR_FORK: std::cell::RefCell<Option<HeldForFork>> =
        const { std::cell::RefCell::new(None) };
}

/// Takes the writer and pending-request locks before `fork` (a child would otherwise
/// inherit them held by a thread it does not have).
pub fn hold_for_fork() {
    // The writer may be held by the control thread in a write (bounded by its send
    // timeout): `fork` waits for it at most a few milliseconds. Without it the child
    // starts on a writer lock of its own ([`after_fork_in_child`]); the application
    // never waits.
    let deadline = Instant::now() + Duration::from_millis(10);
    let writer = loop {
        match try_lock(writer()) {
            Some(guard) => break Some(guard),
            None if Instant::now() >= deadline => break None,
            None => std::thread::yield_now(),
        }
    };
    let held = (writer, lock(&PENDING.0));
    let _ = HELD_FOR_FORK.try_with(|h| *h.borrow_mut() = Some(held));
}

/// Releases what [`hold_for_fork`] took (in parent and child).
pub fn release_after_fork() {
    let _ = HELD_FOR_FORK.try_with(|h| h.borrow_mut().take());
}

/// Makes the channel set exactly `rules` ([`channels::update`]: matching channels are
/// re-rated in place, the rest added or removed), all or nothing: a set this stage
/// cannot hold changes nothing.
pub fn apply(rules: &[ChannelSpec]) -> Result<(), RulesError> {
    check(rules)?;
    channels::update(rules)?;
    Ok(())
}

/// Whether this stage can hold `rules`: its mountpoints, rates and bursts in range.
fn check(rules: &[ChannelSpec]) -> Result<(), RulesError> {
    let mounts = crate::mountpoints();
    for rule in rules {
        if let Some(mount) = &rule.mount {
            if !mounts.contains(mount) {
                return Err(RulesError::NotAMountpoint(mount.clone()));
            }
        }
        channels::validate(rule)?;
        if rule.unit == Unit::Bytes && !rule.scope.moves_bytes() {
            return Err(RulesError::BytesOnOperations(rule.clone()));
        }
    }
    Ok(())
}

/// The connection's reading side: each read checks that its descriptor is still ours.
struct Reader(Connection);

impl Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.get()?.read(buf)
    }
}

/// Reads newline-terminated messages of bounded length.
struct LineReader {
    inner: BufReader<Reader>,
    line: Vec<u8>,
}

impl LineReader {
    fn new(stream: Reader) -> LineReader {
        LineReader {
            inner: BufReader::new(stream),
            line: Vec::new(),
        }
    }

    /// `Ok(None)` on timeout (a partial line is kept for the next call);
    /// `InvalidData` for a malformed or oversized line (dropped); other errors and EOF
    /// end the connection.
    fn next_message(&mut self) -> std::io::Result<Option<ControlMessage>> {
        loop {
            let available = match self.inner.fill_buf() {
                Ok([]) => {
                    return Err(std::io::Error::new(
                        ErrorKind::UnexpectedEof,
                        "connection closed",
                    ))
                }
                Ok(bytes) => bytes,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(None)
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let (chunk, complete) = match available.iter().position(|b| *b == b'\n') {
                Some(end) => (&available[..end], Some(end + 1)),
                None => (available, None),
            };
            let room = MAX_MESSAGE_BYTES + 1 - self.line.len().min(MAX_MESSAGE_BYTES + 1);
            self.line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            let consumed = complete.unwrap_or(available.len());
            self.inner.consume(consumed);
            if complete.is_some() {
                let line = std::mem::take(&mut self.line);
                let text = String::from_utf8_lossy(&line);
                return control::decode::<ControlMessage>(text.trim_end())
                    .map(Some)
                    .map_err(|e| {
                        std::io::Error::new(
                            ErrorKind::InvalidData,
                            format!("dropped a message from the controller: {e}"),
                        )
                    });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use padll_wire::channel::Scope;
    use padll_wire::ops::{Class, Op};

    #[test]
    fn backoff_is_jittered_within_its_lower_half() {
        for backoff in [Duration::ZERO, Duration::from_millis(100), MAX_BACKOFF] {
            for _ in 0..100 {
                let wait = jittered(backoff);
                assert!(
                    wait <= backoff && wait >= backoff / 2,
                    "{wait:?} of {backoff:?}"
                );
            }
        }
    }

    #[test]
    fn rules_of_bytes_must_count_operations_that_move_bytes() {
        let rule = |scope, unit| ChannelSpec {
            mount: None,
            scope,
            rate: 1 << 20,
            unit,
            burst: 1 << 10,
            costs: Default::default(),
        };
        for scope in [Scope::All, Scope::Class(Class::Data), Scope::Op(Op::Write)] {
            assert!(check(&[rule(scope, Unit::Bytes)]).is_ok(), "{scope:?}");
        }
        assert!(check(&[rule(Scope::Class(Class::Metadata), Unit::Requests)]).is_ok());
        let refused = check(&[rule(Scope::Class(Class::Metadata), Unit::Bytes)]).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "rule 'metadata=1MiB/s' is a rate of bytes, but metadata counts operations"
        );
    }
}
