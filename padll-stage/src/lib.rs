//! # PADLL data-plane stage
//!
//! `libpadll.so`, preloaded into an unmodified program (`LD_PRELOAD`, or `padll run`),
//! intercepts the POSIX calls through which it touches files ([`hooks`]), decides
//! whether each targets a registered mountpoint ([`paths`], [`fdtable`]) and, if so,
//! makes it wait in the token buckets of the channels that serve it ([`channels`])
//! before calling the real libc function. Everything else passes straight through.
//! PADLL paper (001) §III-A.
//!
//! Configuration comes from the environment at load time ([`config`]); the channel
//! API ([`add_channel`], [`set_limit`], …) lets a control client change the rules at
//! run time, and [`stats_snapshot`] reads the counters. See `ARCHITECTURE.md` for the
//! invariants every hook keeps.

mod bucket;
mod call;
mod channels;
mod control;
mod credit;
mod effects;
mod errno;
mod fdtable;
mod guard;
mod hooks;
mod intercept;
mod last_rules;
mod path_pool;
mod paths;
mod placed_files;
mod placement;
mod real;
mod report;
mod resolve;
mod shared;
mod stage_fds;
mod stats;
mod tsc;
mod vfork;
mod walks;

pub use channels::{add as add_channel, list as channel_list, remove as remove_channel, set_limit};
pub use padll_wire::channel::{ChannelId, ChannelInfo, ChannelSpec, Scope, Unit};
pub use padll_wire::config::{self, Config, Identity, LimitScope, LogLevel};
pub use padll_wire::ops::{self, Class, Op};
pub use stats::snapshot as stats_snapshot;

use guard::StageIo;
use paths::MountTable;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU8, Ordering};
use std::sync::OnceLock;

/// True once the stage is initialised with at least one mountpoint: until then (and
/// forever when misconfigured) every hook is a plain call to libc.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static MOUNTS: OnceLock<MountTable> = OnceLock::new();
/// The mount table once the stage is active (null before, and for ever when
/// misconfigured): what the hooks' fast path reads, with one load.
static ACTIVE_MOUNTS: AtomicPtr<MountTable> = AtomicPtr::new(std::ptr::null_mut());
static SETTINGS: OnceLock<Settings> = OnceLock::new();
static LOG_LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Error as u8);

struct Settings {
    identity: Identity,
    stats_path: Option<String>,
    /// The last rules this process' control thread keeps for its job, when the job
    /// cannot recur ([`config::is_run_job`]): its last process on the node removes them.
    passing_rules: Option<last_rules::Passing>,
}

/// The process the stage's state belongs to: set at load and in a forked child (whose
/// fork handler runs). A `vfork` child shares the parent's memory but not its pid.
static PID: AtomicU32 = AtomicU32::new(0);

/// This process' pid, by system call.
fn current_pid() -> u32 {
    // SAFETY: getpid takes no arguments, touches no memory of ours and cannot fail.
    unsafe { libc::syscall(libc::SYS_getpid) as u32 }
}

/// Whether hooks should do any work.
#[inline(always)]
pub(crate) fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// The mount table if the stage is active: one load (the table is published, with
/// `Release`, after it and everything the hooks read was set up).
#[inline(always)]
pub(crate) fn active_mounts() -> Option<&'static MountTable> {
    // SAFETY: the pointer is null or points into `MOUNTS`, which is never dropped.
    unsafe { ACTIVE_MOUNTS.load(Ordering::Acquire).as_ref() }
}

/// The mount table (empty before initialisation).
#[inline]
pub(crate) fn mounts() -> &'static MountTable {
    static EMPTY: MountTable = MountTable::EMPTY;
    MOUNTS.get().unwrap_or(&EMPTY)
}

/// The registered mountpoints, as configured.
pub fn mountpoints() -> Vec<String> {
    mounts().names().to_vec()
}

/// Who this process works for (job, user, host, …), once initialised.
pub fn identity() -> Option<Identity> {
    SETTINGS.get().map(|s| s.identity.clone())
}

/// Writes one line to stderr if `level` is enabled (never to stdout). One raw
/// `write(2)`: no stdio lock that a `fork` could leave held.
pub fn log(level: LogLevel, message: &str) {
    if level as u8 > LOG_LEVEL.load(Ordering::Relaxed) || level == LogLevel::Off {
        return;
    }
    let _io = StageIo::enter();
    let line = format!("padll[{}]: {message}\n", std::process::id());
    // SAFETY: valid buffer; fd 2 may be closed, in which case nothing is written.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Threads holding credit (`channels`) carry a non-null value under this key, so their
/// credit is returned when they end (glibc runs key destructors at thread exit).
static CREDIT_KEY: std::sync::OnceLock<libc::pthread_key_t> = std::sync::OnceLock::new();

extern "C" fn thread_ending(_: *mut libc::c_void) {
    let _ = std::panic::catch_unwind(|| channels::return_credit(stats::local()));
}

/// Makes the calling thread return its unspent credit when it ends (once per thread:
/// a TCB lookup on later calls).
pub(crate) fn return_credit_at_thread_exit() {
    if let Some(&key) = CREDIT_KEY.get() {
        // SAFETY: a key created by us; the value is only a marker.
        unsafe {
            if libc::pthread_getspecific(key).is_null() {
                libc::pthread_setspecific(key, std::ptr::NonNull::<u8>::dangling().as_ptr().cast());
            }
        }
    }
}

/// The library constructor: resolve every real function first, then read the
/// configuration. A bad configuration is reported in one line and the program runs
/// unthrottled.
extern "C" fn on_load() {
    let _ = std::panic::catch_unwind(|| {
        PID.store(current_pid(), Ordering::Relaxed);
        for real in hooks::TABLE
            .iter()
            .chain(hooks::OLD_VERSIONS)
            .chain(walks::REALS)
        {
            real.resolve();
        }
        tsc::start();
        let _io = StageIo::enter();
        let loaded = config::load_os(&|name| std::env::var_os(name));
        if let Ok(config) = &loaded {
            LOG_LEVEL.store(config.log as u8, Ordering::Relaxed);
        }
        for warning in config::unknown_variables(std::env::vars_os().map(|(name, _)| name)) {
            log(LogLevel::Error, &warning);
        }
        let config = match loaded {
            Ok(config) => config,
            Err(message) => {
                log(
                    LogLevel::Error,
                    &format!("configuration error, running unthrottled: {message}"),
                );
                return;
            }
        };
        if let Err(message) = start(&config) {
            log(
                LogLevel::Error,
                &format!("configuration error, running unthrottled: {message}"),
            );
            channels::clear();
        }
    });
}

/// Why the stage cannot start with its configuration (it then runs unthrottled).
#[derive(Debug, thiserror::Error)]
enum StartError {
    /// A mountpoint cannot be registered.
    #[error(transparent)]
    Mount(#[from] paths::MountError),
    /// A limit cannot be installed.
    #[error(transparent)]
    Channel(#[from] channels::ChannelError),
}

fn start(config: &Config) -> Result<(), StartError> {
    let table = MountTable::new(&config.mounts)?;
    channels::set_mounts(table.names())?;
    // SAFETY: trivial getter; the segment belongs to the effective uid that makes it.
    let job = (config.limit_scope == LimitScope::Job && !table.is_empty())
        .then(|| (unsafe { libc::geteuid() }, config.identity.job_id.clone()));
    let job_wide = install_limits(&config.limits, job.as_ref())?;
    // A job of `padll run` cannot recur: the last rules its controller gives are of no
    // use after its last process on the node, which its segment's locks single out
    // (so every process joins it, limits or not).
    let passing_rules = match &job {
        Some((uid, id)) if config.controller.is_some() && config::is_run_job(id) => {
            match shared::join(*uid, id) {
                Ok(()) => Some(last_rules::Passing::new(*uid, id)),
                Err(e) => {
                    log(
                        LogLevel::Warn,
                        &format!("the job's last rules will outlive it: {e}"),
                    );
                    None
                }
            }
        }
        _ => None,
    };
    let _ = SETTINGS.set(Settings {
        identity: config.identity.clone(),
        stats_path: config.stats_path.clone(),
        passing_rules,
    });
    if table.is_empty() {
        // Limits or a controller without a mountpoint do nothing: a configuration
        // problem, said as one (a lone stage, with neither, is only idle).
        let unused = match (config.limits.first(), &config.controller) {
            (Some(limit), _) => Some(format!(
                "the limit {}",
                padll_wire::quote(&limit.to_string())
            )),
            (None, Some(socket)) => Some(format!("the controller {}", padll_wire::quote(socket))),
            (None, None) => None,
        };
        match unused {
            Some(what) => log(
                LogLevel::Error,
                &format!(
                    "{what} limits nothing: no mountpoint is registered \
                     (PADLL_MOUNTS, or mounts in PADLL_CONFIG); every call passes through"
                ),
            ),
            None => log(
                LogLevel::Info,
                "no mountpoint registered; every call passes through",
            ),
        }
        return Ok(());
    }
    placement::configure(table.names(), &config.placement, config.placement_wait_ms);
    let _ = MOUNTS.set(table);
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: valid out-pointer and a destructor that never unwinds.
    if unsafe { libc::pthread_key_create(&mut key, Some(thread_ending)) } == 0 {
        let _ = CREDIT_KEY.set(key);
    }
    resolve::refresh_current_dir();
    adopt_inherited_descriptors();
    // SAFETY: registering plain functions as fork handlers.
    unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_in_parent),
            Some(after_fork_in_child),
        )
    };
    ACTIVE.store(true, Ordering::Release);
    if let Some(table) = MOUNTS.get() {
        ACTIVE_MOUNTS.store(std::ptr::from_ref(table).cast_mut(), Ordering::Release);
    }
    if let Some(socket) = &config.controller {
        control::start(control::Target {
            socket: socket.clone(),
            controller_uid: config.controller_uid,
            identity: config.identity.clone(),
            mountpoints: config.mounts.clone(),
            fallback: control::Fallback {
                job,
                default_limits: config.default_limits.clone(),
            },
        });
    }
    log(
        LogLevel::Info,
        &format!(
            "managing {} with {} channel(s), job {}, limits per {}",
            config
                .mounts
                .iter()
                .map(|m| padll_wire::quote(m).to_string())
                .collect::<Vec<_>>()
                .join(", "),
            config.limits.len(),
            padll_wire::quote(&config.identity.job_id),
            if job_wide { "job" } else { "process" }
        ),
    );
    Ok(())
}

/// Installs `specs` as the channels, in place of those in force (all or nothing, see
/// [`channels::install`]): in the shared buckets of `job` (uid, id) when given and its
/// segment can be used, else in buckets of this process. `Ok(true)` if they bind the
/// job.
///
/// A process of a job that cannot share its job's buckets (another user occupies the
/// segment's name in a `/dev/shm` without the uid's directory, `/dev/shm` is full…) does
/// not know how many of the job's processes run beside it: each gets the limit divided
/// by the node's CPUs, so that a job running no more processes at once than the node has
/// CPUs stays within its limit (fail closed), and says so in one line.
pub(crate) fn install_limits(
    specs: &[ChannelSpec],
    job: Option<&(u32, String)>,
) -> Result<bool, channels::ChannelError> {
    // A set the channels refuse makes nothing: not even the job's segment.
    channels::check(specs)?;
    let mut share = 1;
    let job_buckets = job.and_then(|(uid, id)| {
        shared::attach(*uid, id, specs)
            .map_err(|e| {
                share = node_cpus();
                log(
                    LogLevel::Error,
                    &format!(
                        "job-wide limits unavailable ({e}); this process keeps its own, at 1/{share} of each limit (a share per CPU of the node)"
                    ),
                )
            })
            .ok()
    });
    let channels: Vec<_> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| match &job_buckets {
            Some(buckets) => (spec.clone(), Some(buckets[i])),
            None => (share_of(spec, share), None),
        })
        .collect();
    channels::install(&channels)?;
    Ok(job_buckets.is_some())
}

/// `spec` with its rate and burst divided by `share` (at least 1 each).
fn share_of(spec: &ChannelSpec, share: u64) -> ChannelSpec {
    ChannelSpec {
        rate: (spec.rate / share).max(1),
        burst: (spec.burst / share).max(1),
        ..spec.clone()
    }
}

/// The node's online CPUs (at least 1).
fn node_cpus() -> u64 {
    // SAFETY: sysconf only reads.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    cpus.max(1) as u64
}

/// Descriptors inherited across `exec` (`exec 3</scratch/f` in a batch script) are
/// classified from `/proc/self/fd`.
fn adopt_inherited_descriptors() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        effects::adopt(fd);
    }
}

/// No lock may be held across `fork`: the control-path registry is taken here and
/// released on both sides.
extern "C" fn before_fork() {
    channels::hold_registry_for_fork();
    control::hold_for_fork();
}

extern "C" fn after_fork_in_parent() {
    control::release_after_fork();
    channels::release_registry_after_fork();
}

/// The child of `fork` keeps the rules and descriptors but starts its own account and
/// its own control connection.
extern "C" fn after_fork_in_child() {
    PID.store(current_pid(), Ordering::Relaxed);
    control::release_after_fork();
    channels::release_registry_after_fork();
    stats::reset();
    channels::reset_counters();
    shared::after_fork_in_child();
    placed_files::forget_all();
    control::after_fork_in_child();
}

/// Leaves the job on this node: the last process removes the job's segment and, for a
/// job that cannot recur, its last rules. Atomics and raw system calls only: `_exit`,
/// which may be called from a signal handler, does it too.
fn leave_job() {
    control::stop_keeping_rules();
    if shared::leave() {
        if let Some(rules) = SETTINGS.get().and_then(|s| s.passing_rules.as_ref()) {
            rules.remove();
        }
    }
}

/// A process ending without its destructors (`_exit`: how shells such as dash end, and
/// forked children): it leaves the job as [`on_unload`] does, but writes no statistics
/// (that would allocate). A `vfork` child, which shares its parent's state, leaves
/// nothing.
pub(crate) fn leave_job_without_destructors() {
    if PID.load(Ordering::Relaxed) == current_pid() {
        leave_job();
    }
}

/// The library destructor: write statistics if asked, and leave the job.
extern "C" fn on_unload() {
    let _ = std::panic::catch_unwind(|| {
        let _io = StageIo::enter();
        placed_files::report_open();
        // Credit still held by this process' threads goes back to the buckets (the
        // job's other processes go on using them).
        for counters in stats::every_thread() {
            channels::return_credit(counters);
        }
        leave_job();
        let Some(settings) = SETTINGS.get() else {
            return;
        };
        let Some(path) = &settings.stats_path else {
            return;
        };
        if let Err(e) = report::append(path, &settings.identity) {
            log(LogLevel::Error, &e.to_string());
        }
    });
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;
