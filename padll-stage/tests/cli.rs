//! `padll run` and `padll stats` as a batch script uses them: bad flags are named and
//! nothing starts; good ones preload the stage (keeping an existing `LD_PRELOAD`), take
//! the job's identity from the batch system unless a flag overrides it, and throttle.

use padll_wire::report::{self, Report};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn padll(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_padll"));
    command.args(args);
    // The test's own environment must not leak a batch system's identity in.
    for var in [
        "SLURM_JOB_ID",
        "SLURM_JOB_NUM_NODES",
        "SLURM_JOB_ACCOUNT",
        "PBS_JOBID",
        "LSB_JOBID",
        "FLUX_JOB_ID",
        "LD_PRELOAD",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    command.output().expect("padll runs")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("padll-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn reports(path: &Path) -> Vec<Report> {
    report::parse(&std::fs::read_to_string(path).expect("statistics written")).expect("JSON")
}

#[test]
fn bad_flags_are_named_and_nothing_starts() {
    let dir = scratch("bad");
    let marker = dir.join("started");
    let mount = dir.display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--mount", &mount, "--limit", "open=fast"], "fast"),
        (&["--mount", &mount, "--limit", "bogus=5/s"], "bogus"),
        (
            &["--mount", &mount, "--limit", "/elsewhere:metadata=5/s"],
            "/elsewhere",
        ),
        (&["--mount", "relative/dir"], "relative/dir"),
        (&["--mount", &mount, "--log", "loud"], "loud"),
        (&["--mount", &mount, "--job-size", "many"], "many"),
        (&["--mount", &mount, "--frobnicate"], "--frobnicate"),
        (
            &["--mount", &mount, "--config", "/nonexistent/padll.toml"],
            "/nonexistent/padll.toml",
        ),
    ];
    for (flags, named) in cases {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "touch", marker.to_str().unwrap()]);
        let out = padll(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(named),
            "{flags:?}: the message does not name '{named}': {}",
            stderr(&out)
        );
        assert!(!marker.exists(), "{flags:?}: the program was started");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn run_preloads_the_stage_and_keeps_an_existing_preload() {
    let dir = scratch("preload");
    let out = padll(
        &[
            "run",
            "--mount",
            dir.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo \"$LD_PRELOAD|$PADLL_MOUNTS|$PADLL_JOB_ID\"",
        ],
        &[("LD_PRELOAD", "/lib/x86_64-linux-gnu/libc.so.6")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.trim().split('|').collect();
    let preload: Vec<&str> = fields[0].split(':').collect();
    assert_eq!(preload[0], "/lib/x86_64-linux-gnu/libc.so.6", "{text}");
    assert!(preload[1].ends_with("libpadll.so"), "{text}");
    assert_eq!(fields[1], dir.to_str().unwrap());
    assert!(
        fields[2].starts_with("run-"),
        "a job id for the whole run: {text}"
    );
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}

/// The identity a short `padll run` recorded with `flags` under `env`.
fn identity_of_run(
    dir: &Path,
    flags: &[&str],
    env: &[(&str, &str)],
) -> padll_wire::config::Identity {
    let stats = dir.join("stats.json");
    let _ = std::fs::remove_file(&stats);
    let mut args = vec![
        "run",
        "--mount",
        dir.to_str().unwrap(),
        "--stats",
        stats.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[
        "--",
        env!("CARGO_BIN_EXE_padll"),
        "mdloop",
        dir.to_str().unwrap(),
        "0.2",
    ]);
    let out = padll(&args, env);
    assert!(out.status.success(), "{}", stderr(&out));
    reports(&stats).remove(0).identity
}

#[test]
fn identity_comes_from_the_batch_system_and_flags_override_it() {
    let dir = scratch("identity");
    let slurm = [
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_JOB_NUM_NODES", "8"),
        ("SLURM_JOB_ACCOUNT", "climate"),
    ];
    let identity = identity_of_run(&dir, &[], &slurm);
    assert_eq!(
        (
            identity.job_id.as_str(),
            identity.job_size,
            identity.account.as_str()
        ),
        ("4242", 8, "climate")
    );

    let flags = [
        "--job",
        "override",
        "--job-size",
        "2",
        "--account",
        "physics",
        "--user",
        "alice",
    ];
    let identity = identity_of_run(&dir, &flags, &slurm);
    assert_eq!(identity.job_id, "override");
    assert_eq!(identity.job_size, 2);
    assert_eq!(identity.account, "physics");
    assert_eq!(identity.user, "alice");

    for (var, value) in [
        ("PBS_JOBID", "pbs.1"),
        ("LSB_JOBID", "lsf.2"),
        ("FLUX_JOB_ID", "flux.3"),
    ] {
        assert_eq!(
            identity_of_run(&dir, &[], &[(var, value)]).job_id,
            value,
            "{var}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn run_throttles_and_stats_prints_the_table() {
    let dir = scratch("throttle");
    let stats = dir.join("job.json");
    let scoped = format!("{}:metadata=400/s", dir.display());
    let out = padll(
        &[
            "run",
            "--mount",
            dir.to_str().unwrap(),
            "--limit",
            &scoped,
            "--stats",
            stats.to_str().unwrap(),
            "--",
            env!("CARGO_BIN_EXE_padll"),
            "mdloop",
            dir.to_str().unwrap(),
            "2",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let rate: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        rate <= 420.0 && rate > 250.0,
        "mdloop ran at {rate:.0} ops/s under 400/s"
    );

    // The job total per operation, and per process with the channels' rates.
    let table = padll(&["stats", stats.to_str().unwrap()], &[]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = String::from_utf8_lossy(&table.stdout);
    for expected in ["getattr", "open", "close", "wait"] {
        assert!(text.contains(expected), "no '{expected}' in:\n{text}");
    }
    let table = padll(&["stats", "--per-process", stats.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains(&scoped.replace("=400/s", "")) && text.contains("400"),
        "no channel in:\n{text}"
    );
    let missing = padll(&["stats", "/nonexistent/stats.json"], &[]);
    assert_ne!(missing.status.code(), Some(0));
    assert!(
        stderr(&missing).contains("/nonexistent/stats.json"),
        "{}",
        stderr(&missing)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_stage_demo_shows_the_limit_taking_effect() {
    let out = padll(&["demo", "--seconds", "1"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let limited: f64 = text
        .lines()
        .find(|l| l.starts_with("metadata=1000/s"))
        .and_then(|l| l.split_whitespace().rev().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no metadata=1000/s row in:\n{text}"));
    assert!(limited <= 1050.0 && limited > 500.0, "{text}");
}
