//! Issue 8, attack 10: processes started while the local controller is down ran
//! unthrottled (`split` wrote 8.4 MB with no wait). Now a process that gets no rules
//! from its controller at start runs under its job's last rules on this node, else
//! under the default limit (`PADLL_DEFAULT_LIMIT`; `0` = unthrottled). Each scenario runs
//! a job's processes one after another from a shell under the stage, as a batch script
//! does, and measures what they did over the whole run.

use crate::util::*;
use padll_wire::ops::{Class, Op};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A job id unique to this test run; its files in `/dev/shm` (the last rules, a
/// segment) are removed when the test ends, also when it fails half-way.
struct Job(String);

impl Job {
    fn new(name: &str) -> Job {
        Job(format!("fc-{name}-{}", std::process::id()))
    }

    /// Its files in its user's directory and flat in `/dev/shm` (which are used
    /// depends on whether a root component made the directory).
    fn files(&self) -> [PathBuf; 4] {
        // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let [flat, private] = padll_wire::node_files::both_places(uid, &self.0);
        [
            flat.last_rules,
            flat.segment,
            private.last_rules,
            private.segment,
        ]
        .map(PathBuf::from)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for file in self.files() {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// What a run of short processes did.
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

    /// The processes said they ran under `source` and were held to `limit`: within 5 %
    /// above; below, by no more than a quarter (the run's time includes starting each
    /// process, which a loaded machine makes long), far above the other limit a test
    /// sets against it.
    fn assert_held(&self, source: &str, limit: f64) {
        assert!(self.stderr.contains(source), "{}", self.stderr);
        let rate = self.rate();
        assert!(
            rate <= limit * 1.05,
            "processes ran at {rate:.0} ops/s under {source} at {limit}"
        );
        assert!(
            rate >= limit * 0.25,
            "processes ran at {rate:.0} ops/s, not under {source} at {limit}"
        );
    }
}

/// Runs `processes` replayers of `ops` operations each (due within 0.1 s: unthrottled,
/// each is done in a few ms) one after another from a shell, all under the stage as
/// processes of `job`, talking to `controller`; `env` adds the stage's settings.
fn short_processes(
    scratch: &Path,
    controller: &Path,
    job: &Job,
    processes: usize,
    ops: u64,
    env: &[(&str, &str)],
) -> Run {
    let dir = scratch.join(&job.0);
    std::fs::create_dir_all(&dir).unwrap();
    let stats = tempfile::tempdir().unwrap();
    let stats = stats.path().join("stats.json");
    let replay = format!(
        "{} replay --rate {} --seconds 1 --speed 10 --threads 2 --dir {}",
        cheferd_lab().display(),
        ops,
        dir.display()
    );
    let script =
        format!("for ((i = 0; i < {processes}; i++)); do {replay} >/dev/null || exit 1; done");
    let started = Instant::now();
    let out = run_with_timeout(
        Command::new("bash")
            .args(["-c", &script])
            .env("LD_PRELOAD", stage_library())
            .env("PADLL_MOUNTS", scratch)
            .env("PADLL_CONTROLLER", controller)
            .env("PADLL_JOB_ID", &job.0)
            .env("PADLL_STATS", &stats)
            .envs(env.iter().copied()),
        Duration::from_secs(120),
    );
    let seconds = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    // Every metadata call on the scratch directory counts, the replayers' set-up
    // included (the limits are on metadata).
    let reports = padll_wire::report::parse(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(reports.len(), processes + 1, "the shell and each replayer");
    let run = Run {
        operations: padll_wire::report::total(&reports)
            .iter()
            .filter(|op| Op::from_name(&op.op).is_some_and(|o| o.class() == Class::Metadata))
            .map(|op| op.managed)
            .sum(),
        seconds,
        stderr,
    };
    eprintln!(
        "{processes} processes: {} operations in {:.2} s = {:.0}/s",
        run.operations,
        run.seconds,
        run.rate()
    );
    assert!(run.operations >= processes as u64 * ops);
    run
}

#[test]
#[cfg_attr(not(has_bash), ignore = "bash not installed")]
fn processes_started_while_the_local_controller_is_down_keep_the_jobs_last_rules() {
    let _turn = alone();
    let mut cluster = Cluster::new(
        r#"
interval_ms = 200
[[resource]]
name = "{scratch}:metadata"
max_rate = "400"
policy = "psfa"
"#,
    );
    cluster.start_global();
    cluster.start_local("n1");
    let job = Job::new("last");
    // One process of the job runs under the controller, saturating its share.
    cluster.start_process(&job.0, "n1", 2000);
    let resource = cluster.metadata();
    wait_for(Duration::from_secs(30), "the job's full share", || {
        let snapshot = cluster.try_snapshot()?;
        snapshot
            .shares
            .iter()
            .find(|s| s.job == job.0 && s.resource.to_string() == resource)
            .filter(|s| s.assigned >= 0.9 * 400.0)
            .map(|_| ())
    });
    // Let its stage receive and apply that rule.
    std::thread::sleep(Duration::from_secs(1));
    cluster.kill_local("n1");
    cluster.kill_job(&job.0);

    // The default limit is far below the job's rule (an eighth): the last rules must win.
    let run = short_processes(
        &cluster.scratch,
        &cluster.local_socket("n1"),
        &job,
        6,
        300,
        &[("PADLL_DEFAULT_LIMIT", &format!("{resource}=50/s"))],
    );
    // Every rule the job was given is at most Max_R, and the rule it had at the end was.
    run.assert_held("running under the job's last rules on this node", 400.0);
}

#[test]
#[cfg_attr(not(has_bash), ignore = "bash not installed")]
fn without_last_rules_the_default_limit_holds() {
    let _turn = alone();
    let scratch = tempfile::tempdir().unwrap();
    let job = Job::new("default");
    let limit = format!("{}:metadata=300/s", scratch.path().display());
    let run = short_processes(
        scratch.path(),
        &scratch.path().join("no-controller.sock"),
        &job,
        4,
        300,
        &[("PADLL_DEFAULT_LIMIT", &limit)],
    );
    run.assert_held("running under the default limit", 300.0);
}

#[test]
#[cfg_attr(not(has_bash), ignore = "bash not installed")]
fn default_limit_0_runs_free() {
    let _turn = alone();
    let scratch = tempfile::tempdir().unwrap();
    let job = Job::new("free");
    // Even limits configured for the program give way: the site chose availability.
    let run = short_processes(
        scratch.path(),
        &scratch.path().join("no-controller.sock"),
        &job,
        2,
        600,
        &[
            ("PADLL_DEFAULT_LIMIT", "0"),
            ("PADLL_RULES", "metadata=100/s"),
        ],
    );
    assert!(
        run.stderr
            .contains("running under the default limit (PADLL_DEFAULT_LIMIT): none"),
        "{}",
        run.stderr
    );
    assert!(
        run.rate() >= 5.0 * 100.0,
        "processes ran at {:.0} ops/s: throttled",
        run.rate()
    );
}
