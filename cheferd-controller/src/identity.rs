//! Who a stage works for, decided by the local controller from what the job cannot
//! change — never from the stage's environment alone (`PADLL_JOB_ID` and
//! `PADLL_JOB_SIZE` are the user's to set):
//!
//! - the peer's **uid and pid**, from the kernel (`SO_PEERCRED`);
//! - the peer's **cgroup** (`/proc/<pid>/cgroup`): Slurm's `proctrack/cgroup` puts every
//!   process of a job under `…/job_<id>/…`, on cgroup v1
//!   (`…/slurm_<host>/uid_<U>/job_<N>/step_<S>/…`) and v2
//!   (`…/slurmstepd.scope/job_<N>/step_<S>/…`), and a process cannot leave it;
//! - the **scheduler's record** of that job (`scontrol show job <N>`: owner and node
//!   count), when `scontrol` can be run.
//!
//! [`Resolver::resolve`] turns a stage's claim into the identity the control plane uses:
//!
//! | the kernel says | job id | job size |
//! |---|---|---|
//! | a Slurm job N (its owner is the peer, or the peer is root) | `N`, whatever was claimed (a different claim is relabelled and logged) | Slurm's node count (else 1) |
//! | a Slurm job N owned by someone else | refused | |
//! | no scheduler job, peer is root or the controller's own uid | the claim (they could stop the controller anyway) | the claim |
//! | no scheduler job, any other uid U | `<claim>@uid<U>`: one user can never join or shrink another user's job | 1 |
//!
//! The source of job facts is pluggable ([`JobSource`]): [`SlurmCgroups`] reads a
//! `/proc` tree (the real one, or a fixture in tests) and asks `scontrol`, for at most
//! [`SCONTROL_TIMEOUT`] (a hung `scontrol` is killed and the job's record taken as
//! unknown), holding no lock meanwhile: other jobs' lookups go on, and lookups of the
//! same job wait for the one running.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A scheduler job as the kernel and the scheduler know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerJob {
    /// The scheduler's job id.
    pub id: String,
    /// The uid that owns the job, if known (cgroup v1 path or `scontrol`).
    pub owner: Option<u32>,
    /// Nodes allocated to the job, if known (`scontrol`).
    pub nodes: Option<u32>,
}

/// Where the facts about a process' job come from.
pub trait JobSource: Send + Sync {
    /// The scheduler job process `pid` belongs to, or `None` if it runs outside any.
    fn job_of(&self, pid: u32) -> Option<SchedulerJob>;
}

/// The identity the control plane uses for a stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Job id (see the module table).
    pub job_id: String,
    /// Job size in nodes.
    pub job_size: u32,
    /// Why it differs from the stage's claim, if it does (for the log).
    pub note: Option<String>,
}

/// Decides stages' identities (see the module documentation).
pub struct Resolver {
    source: Box<dyn JobSource>,
    /// The uid whose claims are taken as they are besides root (the controller's own).
    trusted_uid: u32,
}

impl Resolver {
    /// A resolver asking `source` about processes and trusting root and `trusted_uid`.
    pub fn new(source: Box<dyn JobSource>, trusted_uid: u32) -> Resolver {
        Resolver {
            source,
            trusted_uid,
        }
    }

    /// The identity of a stage that claims `claimed_job` of `claimed_size` nodes and is,
    /// as the kernel says, process `pid` of `uid`. `Err` names why the stage is refused.
    pub fn resolve(
        &self,
        claimed_job: &str,
        claimed_size: u32,
        uid: u32,
        pid: u32,
    ) -> Result<Resolved, ForeignJob> {
        if let Some(job) = self.source.job_of(pid) {
            if let Some(owner) = job.owner {
                if owner != uid && uid != 0 {
                    return Err(ForeignJob {
                        pid,
                        uid,
                        job: job.id,
                        owner,
                    });
                }
            }
            let note = (claimed_job != job.id).then(|| {
                format!(
                    "claimed job {} but runs in Slurm job {}",
                    padll_wire::quote(&padll_wire::control::short(claimed_job)),
                    job.id
                )
            });
            return Ok(Resolved {
                job_size: job.nodes.unwrap_or(1).max(1),
                job_id: job.id,
                note,
            });
        }
        if uid == 0 || uid == self.trusted_uid {
            return Ok(Resolved {
                job_id: claimed_job.to_string(),
                job_size: claimed_size.max(1),
                note: None,
            });
        }
        let note = (claimed_size > 1).then(|| {
            format!("claimed {claimed_size} nodes; without a scheduler job a stage counts as 1")
        });
        Ok(Resolved {
            job_id: format!("{claimed_job}@uid{uid}"),
            job_size: 1,
            note,
        })
    }
}

/// A stage refused: its process runs in a scheduler job of another uid.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("process {pid} of uid {uid} runs in Slurm job {job} of uid {owner}")]
pub struct ForeignJob {
    /// The stage's process.
    pub pid: u32,
    /// Its uid.
    pub uid: u32,
    /// The job it runs in.
    pub job: String,
    /// The job's owner.
    pub owner: u32,
}

/// Slurm's `proctrack/cgroup`: the job from `<proc>/<pid>/cgroup`, its size and owner
/// from `scontrol show job` (cached for a minute, an answer that did not come for
/// [`UNANSWERED_CACHE`]; skipped when `scontrol` is missing).
pub struct SlurmCgroups {
    proc_root: PathBuf,
    scontrol: Option<PathBuf>,
    /// How long one `scontrol` may run ([`SCONTROL_TIMEOUT`]).
    timeout: Duration,
    cache: Mutex<HashMap<String, Lookup>>,
    /// Signalled when a lookup running ends.
    looked_up: Condvar,
}

/// A job's record in the cache.
#[derive(Clone, Copy, Debug)]
enum Lookup {
    /// `scontrol` runs for it since then.
    Running(Instant),
    /// What it said (`None`: nothing usable), and when.
    Done(Instant, Option<ScontrolJob>),
}

/// What `scontrol show job` says about a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ScontrolJob {
    owner: Option<u32>,
    nodes: Option<u32>,
}

const SCONTROL_CACHE: Duration = Duration::from_secs(60);
/// How long a lookup that failed (or timed out) is remembered: the scheduler may answer
/// again soon.
pub const UNANSWERED_CACHE: Duration = Duration::from_secs(10);
/// How long one `scontrol show job` may run before it is killed.
pub const SCONTROL_TIMEOUT: Duration = Duration::from_secs(5);
/// Jobs remembered at most; more empties the cache of answers.
const CACHED_JOBS: usize = 4096;
/// The most of `scontrol`'s output read (a job's record is a few KiB).
const SCONTROL_OUTPUT: usize = 64 * 1024;

impl SlurmCgroups {
    /// Reads `proc_root` (normally `/proc`) and runs `scontrol` if given.
    pub fn new(proc_root: PathBuf, scontrol: Option<PathBuf>) -> SlurmCgroups {
        SlurmCgroups {
            proc_root,
            scontrol,
            timeout: SCONTROL_TIMEOUT,
            cache: Mutex::new(HashMap::new()),
            looked_up: Condvar::new(),
        }
    }

    /// The real `/proc`, and `scontrol` if it is on `PATH`.
    pub fn system() -> SlurmCgroups {
        let scontrol = std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("scontrol"))
                .find(|candidate| candidate.is_file())
        });
        SlurmCgroups::new(PathBuf::from("/proc"), scontrol)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Lookup>> {
        padll_wire::sync::lock(&self.cache)
    }

    /// What `scontrol` says about job `id`: from the cache, from the lookup of it
    /// already running (waited for, at most until its timeout), or from a run of its
    /// own, with the cache unlocked.
    fn scontrol_job(&self, id: &str) -> Option<ScontrolJob> {
        let scontrol = self.scontrol.as_ref()?;
        let mut cache = self.lock();
        loop {
            match cache.get(id) {
                Some(Lookup::Done(at, job)) => {
                    let kept = if job.is_some() {
                        SCONTROL_CACHE
                    } else {
                        UNANSWERED_CACHE
                    };
                    if at.elapsed() < kept {
                        return *job;
                    }
                    break;
                }
                Some(Lookup::Running(since)) => {
                    // The running lookup ends by its timeout; past that (its thread
                    // panicked), this one goes without.
                    let left =
                        (self.timeout + Duration::from_secs(1)).checked_sub(since.elapsed())?;
                    cache = padll_wire::sync::recover(self.looked_up.wait_timeout(cache, left)).0;
                }
                None => break,
            }
        }
        if cache.len() >= CACHED_JOBS {
            cache.retain(|_, lookup| matches!(lookup, Lookup::Running(_)));
        }
        cache.insert(id.to_string(), Lookup::Running(Instant::now()));
        drop(cache);
        let job = run_scontrol(scontrol, id, self.timeout).map(|out| parse_scontrol(&out));
        self.lock()
            .insert(id.to_string(), Lookup::Done(Instant::now(), job));
        self.looked_up.notify_all();
        job
    }
}

/// The output of `scontrol show job --oneliner <id>`, or `None` if it fails or takes
/// longer than `timeout` (it is killed then, with anything it started, and reaped).
fn run_scontrol(scontrol: &Path, id: &str, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    let mut child = Command::new(scontrol)
        .args(["show", "job", "--oneliner", id])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own process group, so that a kill reaches what it started too.
        .process_group(0)
        .spawn()
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let (sender, output) = std::sync::mpsc::channel();
    // Read on a thread of its own, so that the wait for it has a deadline (it ends when
    // the group is killed, at the latest).
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let read = (&mut stdout)
            .take(SCONTROL_OUTPUT as u64)
            .read_to_end(&mut out);
        let _ = sender.send(read.map(|_| out));
    });
    let out = output
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .ok()
        .and_then(Result::ok);
    let status = out.as_ref().and_then(|_| exit_status(&mut child, deadline));
    let (Some(out), Some(status)) = (out, status) else {
        // SAFETY: kill takes no pointers; the group is the child's own (see above), and
        // the child is not reaped yet, so no other process has its pid.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        let _ = child.wait();
        return None;
    };
    status
        .success()
        .then(|| String::from_utf8_lossy(&out).into_owned())
}

/// How `child` exited, if it does by `deadline`.
fn exit_status(child: &mut std::process::Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => return None,
        }
    }
}

impl JobSource for SlurmCgroups {
    fn job_of(&self, pid: u32) -> Option<SchedulerJob> {
        let text =
            std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup")).ok()?;
        let (id, owner) = parse_cgroup(&text)?;
        let record = self.scontrol_job(&id);
        Some(SchedulerJob {
            owner: owner.or(record.and_then(|r| r.owner)),
            nodes: record.and_then(|r| r.nodes),
            id,
        })
    }
}

/// The Slurm job (and, on cgroup v1, its owner) named by a `/proc/<pid>/cgroup` file,
/// read only where Slurm's daemons (root) make a job's cgroups, from a hierarchy's root:
/// `/slurm[_NODE]/uid_U/job_N/…` (cgroup v1) and
/// `/system.slice/[NODE_]slurmstepd.scope/job_N/…` (cgroup v2). A `job_N` anywhere else
/// proves nothing: a user names cgroups freely in a subtree systemd delegates to them
/// (`user@UID.service`), and could so take another user's job id.
fn parse_cgroup(text: &str) -> Option<(String, Option<u32>)> {
    let job = |component: Option<&str>| {
        component?
            .strip_prefix("job_")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .map(str::to_string)
    };
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let mut components = path.strip_prefix('/')?.split('/');
        match components.next()? {
            "system.slice" => {
                let scope = components.next()?;
                let slurm = scope == "slurmstepd.scope" || scope.ends_with("_slurmstepd.scope");
                Some((job(components.next().filter(|_| slurm))?, None))
            }
            top if top == "slurm" || top.starts_with("slurm_") => {
                let owner = components.next()?.strip_prefix("uid_")?.parse().ok()?;
                Some((job(components.next())?, Some(owner)))
            }
            _ => None,
        }
    })
}

/// `UserId=alice(1000)` and `NumNodes=2` from `scontrol show job --oneliner`.
fn parse_scontrol(text: &str) -> ScontrolJob {
    let field = |name: &str| {
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    ScontrolJob {
        owner: field("UserId").and_then(|v| {
            let inner = v.split_once('(')?.1.strip_suffix(')')?;
            inner.parse().ok()
        }),
        nodes: field("NumNodes").and_then(|v| v.split('-').next()?.parse().ok()),
    }
}

/// The name of user `uid` as the system knows it (`getpwuid_r`), or the number if it
/// has none: a stage's user for anything keyed per user (`application =
/// "user+program"`), from the uid the kernel vouches for, never the stage's claim
/// (`PADLL_USER`/`USER`, which any user can set to another's name). May ask NSS (LDAP):
/// called off the async workers.
pub fn user_name(uid: u32) -> String {
    let mut buffer = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: passwd is plain data; all-zero is a valid (empty) value that
    // getpwuid_r overwrites.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to a live local of the size passed; getpwuid_r writes
    // the entry's strings into `buffer` and sets `found` to `&entry` or null.
    let status = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if status != 0 || found.is_null() || entry.pw_name.is_null() {
        return uid.to_string();
    }
    // SAFETY: on success pw_name points to a NUL-terminated string in `buffer`.
    let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) };
    match name.to_str() {
        Ok(name) if !name.is_empty() && !name.chars().any(char::is_control) => name.to_string(),
        _ => uid.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc` tree with one cgroup file per (pid, content).
    fn fixture(name: &str, processes: &[(u32, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("cheferd-proc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (pid, cgroup) in processes {
            let dir = root.join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup"), cgroup).unwrap();
        }
        root
    }

    /// An executable `scontrol` stand-in in `dir` running `body` (`$4` is the job id).
    fn script(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("scontrol");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// Polls `done` every 10 ms for at most 30 s.
    fn within_30s(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(
                Instant::now() < deadline,
                "{what} did not happen within 30 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    const V1: &str = "12:pids:/slurm_node07/uid_1000/job_4242/step_0/task_1\n\
                      11:freezer:/slurm_node07/uid_1000/job_4242/step_0\n\
                      1:name=systemd:/system.slice/slurmd.service\n";
    const V2: &str = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n";
    const NONE: &str = "0::/user.slice/user-1000.slice/session-3.scope\n";
    const V2_88: &str = "0::/system.slice/slurmstepd.scope/job_88/step_0/user/task_0\n";

    #[test]
    fn cgroup_files_name_the_job_on_v1_and_v2() {
        assert_eq!(parse_cgroup(V1), Some(("4242".into(), Some(1000))));
        assert_eq!(parse_cgroup(V2), Some(("77".into(), None)));
        assert_eq!(parse_cgroup(NONE), None);
        assert_eq!(parse_cgroup("0::/x/job_/y\n0::/x/job_ab/y\n"), None);
        assert_eq!(
            parse_cgroup("0::/system.slice/node07_slurmstepd.scope/job_9/step_0/user/task_0\n"),
            Some(("9".into(), None)),
            "one of several slurmd on a host"
        );
    }

    /// Components of cgroup paths: Slurm's, and others a user may choose.
    const COMPONENTS: &[&str] = &[
        "slurm",
        "slurm_n1",
        "uid_7",
        "uid_x",
        "job_42",
        "job_",
        "system.slice",
        "slurmstepd.scope",
        "n1_slurmstepd.scope",
        "user.slice",
        "x:y",
    ];

    /// Whether `text` has a line whose path is Slurm's own for job `id` (and, on
    /// cgroup v1, its `owner`): the only places a job may be read from.
    fn has_slurm_path(text: &str, id: &str, owner: Option<u32>) -> bool {
        text.lines().any(|line| {
            let path = line.splitn(3, ':').nth(2).unwrap_or("");
            let parts: Vec<&str> = path.split('/').collect();
            let job = format!("job_{id}");
            parts.len() > 3
                && parts[3] == job
                && match owner {
                    Some(uid) => {
                        (parts[1] == "slurm" || parts[1].starts_with("slurm_"))
                            && parts[2] == format!("uid_{uid}")
                    }
                    None => parts[1] == "system.slice" && parts[2].ends_with("slurmstepd.scope"),
                }
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        // A `/proc/<pid>/cgroup` file whose paths a user named (any components, Slurm's
        // among them): reading it never panics, and a job is only ever read from where
        // Slurm's daemons make one, at a hierarchy's root.
        #[test]
        fn a_job_is_read_only_from_slurms_own_cgroups(
            lines in proptest::collection::vec(
                (
                    proptest::sample::select(&["0:", "1:name=systemd", "4:pids", "x"][..]),
                    proptest::collection::vec(proptest::sample::select(COMPONENTS), 0..6),
                ),
                0..4,
            )
        ) {
            let text: String = lines
                .iter()
                .map(|(head, parts)| format!("{head}:/{}\n", parts.join("/")))
                .collect();
            if let Some((id, owner)) = parse_cgroup(&text) {
                proptest::prop_assert!(
                    has_slurm_path(&text, &id, owner),
                    "{text:?} gave job {id}, owner {owner:?}"
                );
            }
        }
    }

    /// Cgroups a user may make and name (systemd delegates `user@UID.service` to
    /// them): a job id or owner in them is no evidence.
    #[test]
    fn a_job_in_a_user_made_cgroup_is_not_believed() {
        let delegated = "/user.slice/user-65534.slice/user@65534.service";
        for forged in [
            format!("0::{delegated}/uid_65534/job_5002\n"),
            format!("0::{delegated}/job_5003\n"),
            format!("1:name=systemd:{delegated}/slurm_node07/uid_1000/job_4242/step_0\n"),
            format!("0::{delegated}/system.slice/slurmstepd.scope/job_77/step_0\n"),
            "0::/system.slice/user-made.scope/job_77/step_0\n".to_string(),
            "0::/slurm_node07/job_4242/step_0\n".to_string(),
        ] {
            assert_eq!(parse_cgroup(&forged), None, "{forged}");
        }
        // A forged line does not hide the real one after it.
        let both = format!("1:name=systemd:{delegated}/job_5003\n{V1}");
        assert_eq!(parse_cgroup(&both), Some(("4242".into(), Some(1000))));
    }

    #[test]
    fn scontrol_gives_owner_and_size() {
        let line =
            "JobId=77 JobName=run UserId=alice(1000) GroupId=alice(1000) NumNodes=4 NumCPUs=8";
        assert_eq!(
            parse_scontrol(line),
            ScontrolJob {
                owner: Some(1000),
                nodes: Some(4)
            }
        );
        assert_eq!(
            parse_scontrol("NumNodes=2-4").nodes,
            Some(2),
            "a range: the minimum"
        );
    }

    #[test]
    fn claims_are_checked_against_the_kernel() {
        let root = fixture("claims", &[(100, V1), (200, V2), (300, NONE)]);
        let resolver = Resolver::new(Box::new(SlurmCgroups::new(root.clone(), None)), 990);
        // A process in Slurm job 4242 claiming another job is relabelled; its size is
        // the scheduler's (unknown here: 1), not the claimed 4 000 000 000.
        let r = resolver
            .resolve("victim", 4_000_000_000, 1000, 100)
            .unwrap();
        assert_eq!((r.job_id.as_str(), r.job_size), ("4242", 1));
        assert!(r.note.unwrap().contains("victim"));
        // Another uid inside that job (impossible without root's help) is refused.
        let refused = resolver.resolve("4242", 1, 1001, 100).unwrap_err();
        assert_eq!((refused.job.as_str(), refused.owner), ("4242", 1000));
        assert!(refused.to_string().contains("uid 1000"), "{refused}");
        // Root is trusted inside a job too.
        assert_eq!(resolver.resolve("x", 1, 0, 100).unwrap().job_id, "4242");
        // cgroup v2 has no owner in the path: the job is still Slurm's.
        assert_eq!(resolver.resolve("77", 1, 1000, 200).unwrap().job_id, "77");
        // No scheduler job: a user's claim is scoped by its uid and counts as 1 node.
        let r = resolver.resolve("4242", 8, 1000, 300).unwrap();
        assert_eq!((r.job_id.as_str(), r.job_size), ("4242@uid1000", 1));
        assert_eq!(
            resolver.resolve("4242", 1, 1001, 300).unwrap().job_id,
            "4242@uid1001"
        );
        // ... and a process that has gone (no /proc entry) likewise.
        assert_eq!(
            resolver.resolve("j", 1, 1000, 999).unwrap().job_id,
            "j@uid1000"
        );
        // Root, and the controller's own uid, without a scheduler job keep their claim.
        for trusted in [0, 990] {
            let r = resolver.resolve("4242", 8, trusted, 300).unwrap();
            assert_eq!((r.job_id.as_str(), r.job_size, r.note), ("4242", 8, None));
        }
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn the_scheduler_gives_the_size_and_owner() {
        let root = fixture("scontrol", &[(100, V2)]);
        let scontrol = script(&root, "echo \"JobId=$4 UserId=bob(1002) NumNodes=16\"");
        let resolver = Resolver::new(
            Box::new(SlurmCgroups::new(root.clone(), Some(scontrol))),
            990,
        );
        let r = resolver.resolve("77", 1, 1002, 100).unwrap();
        assert_eq!((r.job_id.as_str(), r.job_size), ("77", 16));
        let refused = resolver.resolve("77", 1, 1000, 100).unwrap_err();
        assert!(refused.to_string().contains("uid 1002"), "{refused}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_hung_scontrol_holds_up_no_other_job() {
        let root = fixture("hung", &[(100, V2), (200, V2_88)]);
        let dir = root.display();
        // Job 77's lookup hangs until the test releases it.
        let scontrol = script(
            &root,
            &format!(
                "echo run >> {dir}/runs-$4\n\
                 if [ $4 = 77 ]; then touch {dir}/started; \
                 while [ ! -e {dir}/release ]; do sleep 0.05; done; fi\n\
                 echo \"JobId=$4 UserId=bob(1002) NumNodes=16\""
            ),
        );
        let source = SlurmCgroups {
            timeout: Duration::from_secs(120),
            ..SlurmCgroups::new(root.clone(), Some(scontrol))
        };
        let resolver = std::sync::Arc::new(Resolver::new(Box::new(source), 990));
        let resolve = |job: &'static str, pid: u32| {
            let resolver = resolver.clone();
            std::thread::spawn(move || resolver.resolve(job, 1, 1002, pid).unwrap().job_size)
        };
        let hung = resolve("77", 100);
        within_30s("job 77's lookup started", || root.join("started").exists());
        let same_job = resolve("77", 100);
        // Another job is looked up meanwhile: its hello does not wait for job 77's.
        let other = resolve("88", 200);
        within_30s("job 88 resolved", || other.is_finished());
        assert_eq!(other.join().unwrap(), 16);
        assert!(!hung.is_finished() && !same_job.is_finished());
        std::fs::write(root.join("release"), "").unwrap();
        assert_eq!((hung.join().unwrap(), same_job.join().unwrap()), (16, 16));
        let runs = std::fs::read_to_string(root.join("runs-77")).unwrap();
        assert_eq!(
            runs.lines().count(),
            1,
            "the second lookup waited for the first"
        );
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_hung_scontrol_is_killed_after_its_timeout() {
        let root = fixture("timeout", &[(100, V2)]);
        let dir = root.display();
        let scontrol = script(
            &root,
            &format!("echo run >> {dir}/runs; sleep 1000 & echo $! > {dir}/sleeper; wait"),
        );
        let source = SlurmCgroups {
            // Ample for the stand-in to start its sleeper on a loaded machine.
            timeout: Duration::from_secs(2),
            ..SlurmCgroups::new(root.clone(), Some(scontrol))
        };
        let resolver = Resolver::new(Box::new(source), 990);
        // The job is still Slurm's (its cgroup says so); its size unknown: 1.
        let r = resolver.resolve("77", 8, 1002, 100).unwrap();
        assert_eq!((r.job_id.as_str(), r.job_size), ("77", 1));
        // What the stand-in started was killed with it.
        let sleeper = std::fs::read_to_string(root.join("sleeper")).unwrap();
        let stat = format!("/proc/{}/stat", sleeper.trim());
        within_30s("the sleeper killed", || {
            std::fs::read_to_string(&stat).map_or(true, |s| s.contains(") Z "))
        });
        // An unanswered lookup is remembered for a while: no new run, no new wait.
        assert_eq!(resolver.resolve("77", 8, 1002, 100).unwrap().job_size, 1);
        let runs = std::fs::read_to_string(root.join("runs")).unwrap();
        assert_eq!(runs.lines().count(), 1, "scontrol ran again");
        std::fs::remove_dir_all(root).unwrap();
    }
}
