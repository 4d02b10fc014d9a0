//! The Slurm integration against a real Slurm (issue 9 "Slurm", issue 8 identity): a
//! two-node Slurm on this host with `proctrack/cgroup` (`scripts/slurm-test-cluster.sh`), the SPANK
//! plugin (`scripts/slurm/build.sh`) in its plugstack.conf, a global and a local
//! controller, and jobs submitted with `sbatch --padll` that replay metadata operations
//! on the managed directory. Everything is checked through `cheferd ctl … --json`.
//!
//! Runs as root (Slurm's daemons and `sbatch --uid`); skipped, naming what is missing,
//! where Slurm, munge, libslurm-dev or a C compiler are not installed.

use crate::ports::{self, Ports};
use crate::util::{run_with_timeout, stage_library, wait_for, Cluster};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The scratch directory's metadata capacity, ops/s.
const MAX_RATE: f64 = 1000.0;
/// Every replayer offers more than `MAX_RATE`.
const OFFERED: u64 = 2000;
/// The other user: another user's job stays apart.
const NOBODY: u32 = 65534;
/// Slurm's nodes (slurmd on this host).
const NODES: u16 = 2;
/// What `slurm-test-cluster.sh up` exits with when a daemon's port was taken.
const PORT_IN_USE: i32 = 3;
/// The demands the administrator gives jobs A and B (the `priority` policy assigns them
/// as they are when they fit in `MAX_RATE`).
const DEMAND_A: f64 = 600.0;
const DEMAND_B: f64 = 200.0;

/// The repository's `scripts/`.
fn scripts() -> PathBuf {
    crate::util::repository().join("scripts")
}

/// A running test Slurm; dropping it cancels its jobs and stops its daemons (also when
/// the test fails).
struct Slurm {
    base: PathBuf,
    /// Holds slurmctld's port and the slurmd ports after it while it lives.
    _ports: Ports,
}

impl Slurm {
    /// Brings up a two-node Slurm (two slurmd on this host) in cgroup mode in `base`,
    /// with `plugstack` as its plugstack.conf, on ports of its own (others if one was
    /// taken). What a second test run could share is named after slurmctld's port: the
    /// nodes (their cgroups are `slurm_<node>`), and the job ids (the stage keeps a
    /// job's buckets and rules in `/dev/shm` under its id), 1 000 per port.
    fn up(base: &Path, plugstack: &str) -> Slurm {
        ports::start_on_fresh_ports(1 + NODES, "slurm", |ports| {
            let ctld = ports.get(0);
            let mut up = Command::new(scripts().join("slurm-test-cluster.sh"));
            up.arg("up")
                .arg(base)
                .arg("cgroup")
                .env("CTLD_PORT", ctld.to_string())
                .env("SLURMD_PORT", ports.get(1).to_string())
                .env("NODE", format!("padll-{ctld}"))
                .env("NODES", NODES.to_string())
                .env("FIRST_JOB_ID", (u32::from(ctld) * 1000).to_string())
                .env("PLUGSTACK", plugstack);
            let output = run_with_timeout(&mut up, Duration::from_secs(120));
            if output.status.code() == Some(PORT_IN_USE) {
                return None;
            }
            assert!(
                output.status.success(),
                "slurm-test-cluster.sh up failed:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            Some(Slurm {
                base: base.to_path_buf(),
                _ports: ports,
            })
        })
    }

    fn conf(&self) -> PathBuf {
        self.base.join("etc/slurm.conf")
    }

    /// Replaces plugstack.conf: srun, sbatch and slurmstepd read it afresh.
    fn set_plugstack(&self, line: &str) {
        std::fs::write(self.base.join("etc/plugstack.conf"), format!("{line}\n"))
            .expect("plugstack.conf written");
    }

    /// A Slurm client command (`sbatch`, `scontrol`, …) against this cluster.
    fn client(&self, program: &str, args: &[&str]) -> Output {
        let mut command = Command::new(program);
        command.args(args).env("SLURM_CONF", self.conf());
        run_with_timeout(&mut command, Duration::from_secs(30))
    }

    /// `sbatch ARGS…`: the job id, or the failure's stderr.
    fn sbatch(&self, args: &[&str]) -> Result<String, String> {
        let output = self.client("sbatch", &[&["--parsable"], args].concat());
        let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
        if output.status.success() {
            Ok(stdout.split(';').next().unwrap_or_default().to_string())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// A job's `scontrol show job` field, e.g. `JobState`.
    fn job_field(&self, job: &str, field: &str) -> Option<String> {
        let output = self.client("scontrol", &["show", "job", "--oneliner", job]);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('='))
            .map(str::to_string)
    }

    /// Waits until the job has ended and returns its final state.
    fn wait_for_end(&self, job: &str) -> String {
        wait_for(
            Duration::from_secs(30),
            &format!("job {job} to end"),
            || {
                let state = self.job_field(job, "JobState")?;
                (!matches!(state.as_str(), "PENDING" | "RUNNING" | "COMPLETING")).then_some(state)
            },
        )
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let mut down = Command::new(scripts().join("slurm-test-cluster.sh"));
        down.arg("down").arg(&self.base);
        let output = run_with_timeout(&mut down, Duration::from_secs(60));
        if !output.status.success() {
            eprintln!(
                "slurm-test-cluster.sh down failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        if std::thread::panicking() {
            let mut logs: Vec<PathBuf> = std::fs::read_dir(self.base.join("log"))
                .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default();
            logs.sort();
            for log in logs {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("==== {} (last 20 lines)", log.display());
                for line in &lines[lines.len().saturating_sub(20)..] {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// `cheferd ctl VIEW --json`, parsed.
fn ctl_json(cluster: &Cluster, args: &[&str]) -> Value {
    let output = cluster.ctl(&[args, &["--json"]].concat());
    assert!(
        output.status.success(),
        "ctl {args:?} --json: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("ctl --json prints JSON")
}

/// The job's share of the scratch directory's metadata in `ctl jobs --json`.
fn share<'a>(jobs: &'a Value, job: &str) -> Option<&'a Value> {
    jobs["shares"]
        .as_array()?
        .iter()
        .find(|s| s["job"].as_str() == Some(job))
}

/// The Slurm job a process' cgroup names (`…/job_<id>/…`).
fn cgroup_job(pid: u64) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.split('/').find_map(|c| {
        let id = c.strip_prefix("job_")?;
        id.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| id.to_string())
    })
}

/// Mean of the last `n` complete one-second windows of a replayer's output
/// (`second,ops` lines; other lines are the stage's messages).
fn replayed_rate(output: &Path, n: usize) -> f64 {
    let text = std::fs::read_to_string(output).unwrap_or_default();
    let windows: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split_once(',')?.1.trim().parse().ok())
        .collect();
    let last = &windows[windows.len().saturating_sub(n)..];
    assert_eq!(
        last.len(),
        n,
        "{} has fewer than {n} windows",
        output.display()
    );
    last.iter().sum::<f64>() / n as f64
}

#[test]
#[cfg_attr(
    not(all(
        has_root,
        has_slurmctld,
        has_slurmd,
        has_munged,
        has_sbatch,
        has_spank_h,
        has_cc
    )),
    ignore = "needs root, slurmctld, slurmd, slurm-client, munge, libslurm-dev and cc"
)]
fn slurm_jobs_under_the_plugin_carry_slurms_identity_and_follow_the_policy() {
    let _turn = crate::util::alone();
    let mut cluster = Cluster::new(&format!(
        "interval_ms = 1000\n[[resource]]\nname = \"{{scratch}}:metadata\"\n\
         max_rate = \"{MAX_RATE}\"\npolicy = \"priority\"\n"
    ));
    // Another user's tasks reach the socket, the stage's configuration and their dirs.
    let dir = cluster.dir.path().to_path_buf();
    let open = |path: &Path, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    open(&dir, 0o755);
    let out = dir.join("out");
    std::fs::create_dir(&out).expect("output dir");
    open(&out, 0o777);
    open(&cluster.scratch, 0o777);
    let site_config = dir.join("padll.toml");
    std::fs::write(
        &site_config,
        format!("mounts = [\"{}\"]\n", cluster.scratch.display()),
    )
    .expect("stage configuration");

    let base = dir.join("slurm");
    let build = run_with_timeout(
        Command::new(scripts().join("slurm/build.sh")).arg(&base),
        Duration::from_secs(60),
    );
    assert!(
        build.status.success(),
        "build.sh: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let plugin = base.join("padll_spank.so");
    let socket = cluster.local_socket("node");
    let plugstack = |args: &str| {
        format!(
            "required {} library={} socket={} config={} {args}",
            plugin.display(),
            stage_library().display(),
            socket.display(),
            site_config.display()
        )
    };
    let slurm = Slurm::up(&base, &plugstack("default=off"));
    cluster
        .local_env
        .push(("SLURM_CONF".into(), slurm.conf().display().to_string()));
    cluster.start_global();
    cluster.start_local("node");

    // Job A (root, two nodes) replays; job B (another user, one node) replays too, and
    // a second process of B claims to be job A, with 64 nodes.
    let replayer = crate::util::cheferd_lab();
    let replay = |dir: &str| {
        format!(
            "{} replay --rate {OFFERED} --seconds 120 --threads 2 --dir {}/{dir}",
            replayer.display(),
            cluster.scratch.display()
        )
    };
    for name in ["a", "b", "claim"] {
        let work = cluster.scratch.join(name);
        std::fs::create_dir(&work).expect("work dir");
        open(&work, 0o777);
    }
    let script = |name: &str, body: String| {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/bash\n{body}\n")).expect("job script");
        open(&path, 0o755);
        path.display().to_string()
    };
    let job_a_script = script("a", format!("exec {}", replay("a")));
    let job_b_script = script(
        "b",
        format!(
            "PADLL_JOB_ID=$1 PADLL_JOB_SIZE=64 {claim} >{out}/claimer.out 2>&1 &\n\
             exec {own}",
            claim = replay("claim"),
            out = out.display(),
            own = replay("b"),
        ),
    );
    let output = |name: &str| format!("{}/{name}-%j.out", out.display());
    let a = slurm
        .sbatch(&[
            "--padll",
            "--nodes=2",
            "--mem=300M",
            "-o",
            &output("a"),
            &job_a_script,
        ])
        .expect("sbatch job A");
    let uid = NOBODY.to_string();
    let b = slurm
        .sbatch(&[
            "--padll",
            "--mem=300M",
            "--uid",
            &uid,
            "-o",
            &output("b"),
            &job_b_script,
            &a,
        ])
        .expect("sbatch job B");

    // The stages as the global controller lists them, once the batch scripts' shells
    // have become replayers: A's one, B's two.
    let stages = wait_for(
        Duration::from_secs(30),
        "one replayer of job A and two of job B",
        || {
            let stages = ctl_json(&cluster, &["stages"]);
            let stages = stages.as_array()?;
            let replayers = stages
                .iter()
                .all(|s| s["name"] == replayer.to_str().unwrap());
            let count = |job: &str| stages.iter().filter(|s| s["job"] == job).count();
            (replayers && count(&a) == 1 && count(&b) == 2 && stages.len() == 3)
                .then(|| stages.clone())
        },
    );
    for stage in &stages {
        let pid = stage["pid"].as_u64().unwrap();
        let job = stage["job"].as_str().unwrap();
        // Slurm's id, as the kernel's cgroup of that process names it …
        assert_eq!(cgroup_job(pid).as_deref(), Some(job), "stage {stage}");
        // … its size and owner from Slurm (B's claimer claims 64 nodes), and another
        // user's job apart from root's.
        let (size, owner) = if job == a { (2, 0) } else { (1, NOBODY) };
        assert_eq!(stage["job_size"], size, "stage {stage}");
        assert_eq!(stage["uid"], owner, "stage {stage}");
    }

    // The policy (`priority`: each job its demand, scaled down to fit Max_R). Demands
    // default to Max_R, so first half each; then the administrator gives Slurm's jobs
    // their own.
    let resource = cluster.metadata();
    let near = |value: f64, want: f64| (value - want).abs() <= 0.1 * want;
    let wait_for_rates = |want_a: f64, want_b: f64| {
        wait_for(
            Duration::from_secs(20),
            &format!("assigned rates {want_a} and {want_b}"),
            || {
                let jobs = ctl_json(&cluster, &["jobs"]);
                let assigned = |job: &str| share(&jobs, job)?["assigned"].as_f64();
                (near(assigned(&a)?, want_a) && near(assigned(&b)?, want_b)).then_some(jobs)
            },
        )
    };
    wait_for_rates(MAX_RATE / 2.0, MAX_RATE / 2.0);
    for (job, demand) in [(&a, DEMAND_A), (&b, DEMAND_B)] {
        let set = cluster.ctl(&[
            "set-job",
            job,
            "--resource",
            &resource,
            "--demand",
            &demand.to_string(),
            "--json",
        ]);
        assert!(
            set.status.success(),
            "set-job: {}",
            String::from_utf8_lossy(&set.stderr)
        );
        let reply: Value = serde_json::from_slice(&set.stdout).expect("set-job --json");
        assert!(
            reply.as_str().is_some_and(|r| r.contains(job.as_str())),
            "{reply}"
        );
    }
    let (want_a, want_b) = (DEMAND_A, DEMAND_B);
    let jobs = wait_for_rates(want_a, want_b);
    assert_eq!(share(&jobs, &b).unwrap()["stages"], 2);
    // Usage settles on the new rates within a few cycles. One cycle's usage, like one
    // replayer window, may hold a batch of credit more than its rate: both are means of
    // several.
    std::thread::sleep(Duration::from_secs(2));
    let samples: Vec<Value> = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_secs(1));
            ctl_json(&cluster, &["jobs"])
        })
        .collect();
    let usage = |job: &str| {
        let used = |jobs: &Value| share(jobs, job).unwrap()["usage"].as_f64().unwrap();
        samples.iter().map(used).sum::<f64>() / samples.len() as f64
    };
    let jobs = samples.last().expect("five samples");
    for (job, want) in [(&a, want_a), (&b, want_b)] {
        let used = usage(job);
        assert!(
            used <= 1.15 * want && used >= 0.5 * want,
            "job {job} used {used:.0} ops/s of its {want:.0} (a mean of 5 cycles): {jobs}"
        );
    }
    assert!(usage(&a) + usage(&b) <= 1.1 * MAX_RATE, "{jobs}");
    // What the replayers themselves counted: B's two processes together within B's rate.
    let file = |name: &str, job: &str| out.join(format!("{name}-{job}.out"));
    let replayed_a = replayed_rate(&file("a", &a), 4);
    let replayed_b = replayed_rate(&file("b", &b), 4) + replayed_rate(&out.join("claimer.out"), 4);
    assert!(replayed_a <= 1.15 * want_a, "A replayed {replayed_a:.0}/s");
    assert!(replayed_b <= 1.15 * want_b, "B replayed {replayed_b:.0}/s");
    assert!(replayed_a >= 0.5 * want_a && replayed_b >= 0.5 * want_b);
    // The controller relabelled the claimer, and said so.
    assert!(
        cluster
            .local_log("node")
            .contains(&format!("runs in Slurm job {b}")),
        "{}",
        cluster.local_log("node")
    );

    // The library is appended to a user's LD_PRELOAD, once also in a step of the job.
    let finished = |name: &str, args: &[&str]| {
        let job = slurm
            .sbatch(&[&["-o", &output(name)], args].concat())
            .expect("sbatch");
        assert_eq!(slurm.wait_for_end(&job), "COMPLETED", "job {name}");
        std::fs::read_to_string(out.join(format!("{name}-{job}.out"))).expect("job output")
    };
    let text = finished(
        "preload",
        &[
            "--padll",
            "--export=ALL,LD_PRELOAD=libm.so.6",
            "--wrap",
            "echo \"$LD_PRELOAD\"; srun bash -c 'echo \"$LD_PRELOAD\"'",
        ],
    );
    let want = format!("libm.so.6 {}", stage_library().display());
    let preloads: Vec<&str> = text.lines().filter(|l| l.starts_with("libm")).collect();
    assert_eq!(preloads, [want.as_str(), want.as_str()], "{text}");

    // Without libpadll.so a job still runs, after one line on its stderr.
    slurm.set_plugstack(&format!(
        "required {} library=/nonexistent/libpadll.so default=on",
        plugin.display()
    ));
    let text = finished("plain", &["--wrap", "echo ran"]);
    let padll_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("padll:")).collect();
    assert_eq!(padll_lines.len(), 1, "{text}");
    assert!(
        padll_lines[0].contains("/nonexistent/libpadll.so"),
        "{text}"
    );
    assert!(text.lines().any(|l| l == "ran"), "{text}");

    // Where the site's default is on, a job may opt out.
    slurm.set_plugstack(&plugstack("default=on"));
    let text = finished(
        "opt-out",
        &["--padll=off", "--wrap", "echo \"[$LD_PRELOAD]\""],
    );
    assert!(text.lines().any(|l| l == "[]"), "{text}");

    // A plugstack.conf typo is named, and leaves PADLL off rather than failing jobs.
    slurm.set_plugstack(&plugstack("bogus=1"));
    let text = finished("typo", &["--padll", "--wrap", "echo \"[$LD_PRELOAD]\""]);
    assert!(text.lines().any(|l| l == "[]"), "{text}");
    let typo = slurm.client("sbatch", &["--padll", "--wrap", "true"]);
    let stderr = String::from_utf8_lossy(&typo.stderr);
    assert!(stderr.contains("unknown argument 'bogus=1'"), "{stderr}");

    // A site that runs every job under PADLL refuses --padll=off, naming why.
    slurm.set_plugstack(&plugstack("default=always"));
    let refused = slurm
        .sbatch(&["--padll=off", "--wrap", "true"])
        .expect_err("--padll=off refused");
    assert!(refused.contains("every job under PADLL"), "{refused}");
}
