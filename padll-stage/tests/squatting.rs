//! Issue 18, attacks d and e: another user (uid 65534) creates the names of a job's files
//! in `/dev/shm` (an empty file, a symlink, a 1 GiB file, a directory) before the job
//! starts. Where a root component made the job user's directory (`/dev/shm/padll/<uid>`)
//! the job keeps its files there and the squat changes nothing: its processes share its
//! limit and its last rules are kept and used. Without that directory (no root component
//! on the node) the squatted names cannot be used: each process then runs at the limit
//! divided by the node's CPUs, so a job running no more processes than the node has CPUs
//! still stays within its limit.
//!
//! The job runs as a uid of this test alone, so the directories made here are no other
//! test's; run as root (to make them, and to become the other users).

use crate::util::{controller_stub, library, metadata_rule, scratch};
use padll_wire::node_files::{self, UserDirectory};
use padll_wire::ops::{Class, Op};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const SQUATTER: u32 = 65534;
/// The job's limit, and how many of its processes run at once.
const LIMIT: f64 = 300.0;
const PROCESSES: usize = 3;

/// The squats, as shell commands of the squatter's on `{}` (the name).
const SQUATS: [(&str, &str); 4] = [
    ("an empty file", ": > {}"),
    ("a symlink", "ln -s /dev/null {}"),
    ("a 1 GiB file", "truncate -s 1G {}"),
    ("a directory", "mkdir {}"),
];

/// A uid that only test `n` of this process uses.
fn victim(n: u32) -> u32 {
    4_000_000 + (std::process::id() % 1_000_000) * 4 + n
}

/// The node of a victim uid: its directory, made as a root component makes it or not at
/// all, and what the squatter planted, all removed at the end (also when a test fails).
struct Node {
    uid: u32,
    planted: Vec<PathBuf>,
}

impl Node {
    fn new(uid: u32, with_user_directory: bool) -> Node {
        let node = Node {
            uid,
            planted: Vec::new(),
        };
        let _ = std::fs::remove_dir_all(node.user_directory());
        if with_user_directory {
            node_files::prepare_user_directory(uid, uid).unwrap();
            assert!(UserDirectory::open(uid).is_some());
        } else {
            assert!(UserDirectory::open(uid).is_none());
        }
        node
    }

    fn user_directory(&self) -> PathBuf {
        Path::new(node_files::NODE_DIRECTORY).join(self.uid.to_string())
    }

    /// The squatter creates `name` with `command` (a [`SQUATS`] line).
    fn squat(&mut self, command: &str, name: &str) {
        let out = as_squatter(&command.replace("{}", name));
        assert!(out.status.success(), "{command} {name}: {out:?}");
        self.planted.push(name.into());
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.user_directory());
        for path in &self.planted {
            let _ = std::fs::remove_file(path).or_else(|_| std::fs::remove_dir(path));
        }
    }
}

fn as_squatter(script: &str) -> Output {
    Command::new("sh")
        .args(["-c", script])
        .uid(SQUATTER)
        .gid(SQUATTER)
        .output()
        .unwrap()
}

/// A scratch directory (the job's mountpoint) that `uid` owns.
fn mountpoint(name: &str, uid: u32) -> PathBuf {
    let dir = scratch(name);
    std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).unwrap();
    dir
}

/// What a job's processes did together.
struct Run {
    /// Managed metadata calls, every process together (the stage's own statistics).
    operations: u64,
    seconds: f64,
    stderr: String,
}

impl Run {
    fn rate(&self) -> f64 {
        self.operations as f64 / self.seconds
    }

    /// At most `limit` (+5 %, and the burst), and far from starved.
    fn assert_within(&self, limit: f64, what: &str) {
        let rate = self.rate();
        assert!(
            rate <= limit * 1.05 + 10.0 / self.seconds,
            "{what}: the job ran at {rate:.0} ops/s under {limit}/s\n{}",
            self.stderr
        );
        assert!(
            rate >= limit * 0.25,
            "{what}: the job ran at {rate:.0} ops/s, not held to {limit}/s\n{}",
            self.stderr
        );
    }
}

/// Runs `processes` metadata loops of 2 s at once as `uid`, all processes of `job` on
/// the mountpoint `dir`, with the stage's settings `env`.
fn run_job(uid: u32, dir: &Path, job: &str, processes: usize, env: &[(&str, &str)]) -> Run {
    let stats = dir.join(format!("{job}.json"));
    let _ = std::fs::remove_file(&stats);
    let started = Instant::now();
    let children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new(crate::util::padll())
                .args(["mdloop", dir.to_str().unwrap(), "2"])
                .env_clear()
                .env("LD_PRELOAD", library())
                .env("PADLL_MOUNTS", dir)
                .env("PADLL_JOB_ID", job)
                .env("PADLL_STATS", &stats)
                .envs(env.iter().copied())
                .uid(uid)
                .gid(uid)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut stderr = String::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        stderr.push_str(&String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{stderr}");
    }
    let seconds = started.elapsed().as_secs_f64();
    let reports = padll_wire::report::parse(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(reports.len(), processes, "{stderr}");
    let operations = padll_wire::report::total(&reports)
        .iter()
        .filter(|op| Op::from_name(&op.op).is_some_and(|o| o.class() == Class::Metadata))
        .map(|op| op.managed)
        .sum();
    Run {
        operations,
        seconds,
        stderr,
    }
}

#[test]
#[cfg_attr(
    not(has_root),
    ignore = "needs root to make the user's directory and be other users"
)]
fn names_squatted_in_dev_shm_do_not_split_a_job_with_its_users_directory() {
    let uid = victim(0);
    let mut node = Node::new(uid, true);
    let dir = mountpoint("squat-shared", uid);
    // The squatter cannot create anything in root's directory or the user's.
    for name in [
        format!("{}/{}x", node_files::NODE_DIRECTORY, uid),
        node.user_directory()
            .join("segment-x")
            .display()
            .to_string(),
    ] {
        let out = as_squatter(&format!("mkdir {name} || : > {name}"));
        assert!(
            !out.status.success() && !Path::new(&name).exists(),
            "{name}"
        );
    }
    for (n, (what, command)) in SQUATS.iter().enumerate() {
        let job = format!("squat-{n}-{}", std::process::id());
        let flat = node_files::flat_job_files(uid, &job);
        node.squat(command, &flat.segment);
        node.squat(command, &flat.last_rules);
        let run = run_job(
            uid,
            &dir,
            &job,
            PROCESSES,
            &[("PADLL_RULES", "metadata=300/s")],
        );
        assert!(run.stderr.is_empty(), "{what}: {}", run.stderr);
        run.assert_within(LIMIT, what);
        assert!(
            !Path::new(&node_files::private_job_files(uid, &job).segment).exists(),
            "{what}: the last process removes the job's segment"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(not(has_root), ignore = "needs root to be other users")]
fn without_the_users_directory_a_squatted_segment_divides_the_limit() {
    let uid = victim(1);
    let mut node = Node::new(uid, false);
    let dir = mountpoint("squat-flat", uid);
    // SAFETY: sysconf only reads.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    // As many processes as CPUs (3 at most): the job stays within its limit.
    let processes = PROCESSES.min(cpus);
    for (n, (what, command)) in SQUATS.iter().enumerate() {
        let job = format!("squat-flat-{n}-{}", std::process::id());
        let segment = node_files::flat_job_files(uid, &job).segment;
        node.squat(command, &segment);
        let run = run_job(
            uid,
            &dir,
            &job,
            processes,
            &[("PADLL_RULES", "metadata=300/s")],
        );
        let said = format!("job-wide limits unavailable ({segment}: ");
        assert_eq!(
            run.stderr.matches(&said).count(),
            processes,
            "{what}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains(&format!("at 1/{cpus} of each limit")),
            "{}",
            run.stderr
        );
        run.assert_within(LIMIT * processes as f64 / cpus as f64, what);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(
    not(has_root),
    ignore = "needs root to make the user's directory and be other users"
)]
fn a_squatted_rules_name_does_not_keep_the_last_rules_from_the_job() {
    let uid = victim(2);
    let mut node = Node::new(uid, true);
    let dir = mountpoint("squat-rules", uid);
    let job = format!("squat-rules-{}", std::process::id());
    let flat = node_files::flat_job_files(uid, &job);
    node.squat(": > {}", &flat.last_rules);
    node.squat(": > {}", &flat.segment);

    // A process of the job under its controller, which lowers it to 200/s.
    let socket = dir.join("controller.sock");
    let applied = controller_stub(&socket, vec![metadata_rule(&dir, 200, 2)]);
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let controlled = [
        ("PADLL_CONTROLLER", socket.to_str().unwrap()),
        ("PADLL_RULES", "metadata=2000/s"),
    ];
    let run = run_job(uid, &dir, &job, 1, &controlled);
    applied
        .recv_timeout(Duration::from_secs(30))
        .expect("the stage applied the controller's rules");
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    let kept = node_files::private_job_files(uid, &job).last_rules;
    let meta = std::fs::metadata(&kept).expect("the job's last rules are kept");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (uid, 0o600));
    let squatted = std::fs::symlink_metadata(&flat.last_rules).unwrap();
    assert_eq!((squatted.uid(), squatted.len()), (SQUATTER, 0));

    // The controller is gone: new processes of the job run under those rules, together,
    // not under the (far higher) default limit.
    std::fs::remove_file(&socket).unwrap();
    let run = run_job(
        uid,
        &dir,
        &job,
        PROCESSES,
        &[
            ("PADLL_CONTROLLER", socket.to_str().unwrap()),
            ("PADLL_RULES", "metadata=5000/s"),
            ("PADLL_DEFAULT_LIMIT", "metadata=5000/s"),
        ],
    );
    assert_eq!(
        run.stderr
            .matches("running under the job's last rules on this node")
            .count(),
        PROCESSES,
        "{}",
        run.stderr
    );
    run.assert_within(200.0, "the last rules");
    let _ = std::fs::remove_dir_all(dir);
}
