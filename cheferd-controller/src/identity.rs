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
//! `/proc` tree (the real one, or a fixture in tests) and asks `scontrol`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
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
                    "claimed job '{claimed_job}' but runs in Slurm job {}",
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
/// from `scontrol show job` (cached for a minute; skipped when `scontrol` is missing).
pub struct SlurmCgroups {
    proc_root: PathBuf,
    scontrol: Option<PathBuf>,
    cache: Mutex<HashMap<String, (Instant, Option<ScontrolJob>)>>,
}

/// What `scontrol show job` says about a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ScontrolJob {
    owner: Option<u32>,
    nodes: Option<u32>,
}

const SCONTROL_CACHE: Duration = Duration::from_secs(60);

impl SlurmCgroups {
    /// Reads `proc_root` (normally `/proc`) and runs `scontrol` if given.
    pub fn new(proc_root: PathBuf, scontrol: Option<PathBuf>) -> SlurmCgroups {
        SlurmCgroups {
            proc_root,
            scontrol,
            cache: Mutex::new(HashMap::new()),
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

    fn scontrol_job(&self, id: &str) -> Option<ScontrolJob> {
        let scontrol = self.scontrol.as_ref()?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, job)) = cache.get(id) {
            if at.elapsed() < SCONTROL_CACHE {
                return *job;
            }
        }
        let job = std::process::Command::new(scontrol)
            .args(["show", "job", "--oneliner", id])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| parse_scontrol(&String::from_utf8_lossy(&out.stdout)));
        if cache.len() > 4096 {
            cache.clear();
        }
        cache.insert(id.to_string(), (Instant::now(), job));
        job
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

/// The Slurm job (and, on cgroup v1, its owner) named by a `/proc/<pid>/cgroup` file:
/// the first path with a `job_<digits>` component.
fn parse_cgroup(text: &str) -> Option<(String, Option<u32>)> {
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let components: Vec<&str> = path.split('/').collect();
        let id = components.iter().find_map(|c| {
            c.strip_prefix("job_")
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })?;
        let owner = components
            .iter()
            .find_map(|c| c.strip_prefix("uid_").and_then(|u| u.parse().ok()));
        Some((id.to_string(), owner))
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

    const V1: &str = "12:pids:/slurm_node07/uid_1000/job_4242/step_0/task_1\n\
                      11:freezer:/slurm_node07/uid_1000/job_4242/step_0\n\
                      1:name=systemd:/system.slice/slurmd.service\n";
    const V2: &str = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n";
    const NONE: &str = "0::/user.slice/user-1000.slice/session-3.scope\n";

    #[test]
    fn cgroup_files_name_the_job_on_v1_and_v2() {
        assert_eq!(parse_cgroup(V1), Some(("4242".into(), Some(1000))));
        assert_eq!(parse_cgroup(V2), Some(("77".into(), None)));
        assert_eq!(parse_cgroup(NONE), None);
        assert_eq!(parse_cgroup("0::/x/job_/y\n0::/x/job_ab/y\n"), None);
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
        let scontrol = root.join("scontrol");
        std::fs::write(
            &scontrol,
            "#!/bin/sh\necho \"JobId=$4 UserId=bob(1002) NumNodes=16\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
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
}
