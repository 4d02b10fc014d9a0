//! What a job leaves in `/dev/shm` under a controller: a job `padll run` names
//! `run-<pid>` cannot recur, so its last process removes its last rules and its segment;
//! a named job (a batch system's) keeps its last rules for its next steps.

use crate::util::{controller_stub, metadata_rule, scratch};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The job's files on this node (wherever the stage keeps them now).
fn job_files(job: &str) -> (PathBuf, PathBuf) {
    // SAFETY: geteuid takes no arguments and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let files = padll_wire::node_files::job_files(uid, job);
    (files.last_rules.into(), files.segment.into())
}

/// `padll run` under the stub with `flags`: a shell running two metadata loops at once
/// under the stage. Returns the job id it ran as once every process has ended, having
/// checked that the job's last rules were kept while it ran.
fn run_job(dir: &Path, name: &str, flags: &[&str]) -> String {
    let socket = dir.join(format!("{name}.sock"));
    let applied = controller_stub(&socket, vec![metadata_rule(dir, 100_000, 100)]);
    let padll = crate::util::padll();
    let script = format!(
        // The job outlives the check below by seconds, however late the test wakes.
        "{padll} mdloop {dir} 1 >/dev/null & {padll} mdloop {dir} 5 >/dev/null; wait",
        padll = padll.display(),
        dir = dir.display()
    );
    let mut command = Command::new(&padll);
    command.args(["run", "--mount", dir.to_str().unwrap()]);
    command.args(["--controller", socket.to_str().unwrap()]);
    command.args(flags).args(["--", "sh", "-c", &script]);
    for var in [
        "SLURM_JOB_ID",
        "PBS_JOBID",
        "LSB_JOBID",
        "FLUX_JOB_ID",
        "PADLL_JOB_ID",
    ] {
        command.env_remove(var);
    }
    let child = command.stderr(Stdio::piped()).spawn().unwrap();
    let job = match flags {
        ["--job", job] => job.to_string(),
        _ => padll_wire::config::run_job_id(child.id()),
    };
    applied
        .recv_timeout(Duration::from_secs(30))
        .expect("no stage applied the controller's rules");
    assert!(
        job_files(&job).0.is_file(),
        "the job's last rules are kept while it runs"
    );
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    job
}

#[test]
fn a_run_leaves_nothing_behind_and_a_named_job_keeps_its_last_rules() {
    let dir = scratch("node-files");
    let job = run_job(&dir, "run", &[]);
    assert!(padll_wire::config::is_run_job(&job), "{job}");
    let (rules, segment) = job_files(&job);
    for left in [rules, segment] {
        assert!(!left.exists(), "{} was left behind", left.display());
    }

    let named = format!("node-files-{}", std::process::id());
    assert_eq!(run_job(&dir, "named", &["--job", &named]), named);
    let (kept, segment) = job_files(&named);
    assert!(
        kept.is_file(),
        "a named job's last rules are for its next steps"
    );
    assert!(!segment.exists());
    let _ = std::fs::remove_file(kept);
    let _ = std::fs::remove_dir_all(dir);
}

/// A process that ends with `_exit` (as dash does, skipping destructors) still leaves
/// its job: the last one removes the job's segment.
#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn a_last_process_ending_with_exit_removes_the_segment() {
    let dir = scratch("node-files-exit");
    let job = format!("run-{}", std::process::id());
    let script = format!(
        "import os, sys\nos.stat('{}')\nsys.stdout.write(str(os.path.exists('{}')))\nsys.stdout.flush()\nos._exit(0)",
        dir.display(),
        job_files(&job).1.display()
    );
    let output = Command::new("python3")
        .args(["-c", &script])
        .env("LD_PRELOAD", crate::util::library())
        .env("PADLL_MOUNTS", &dir)
        .env("PADLL_RULES", "metadata=100k")
        .env("PADLL_JOB_ID", &job)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.stdout, b"True", "the job's segment while it ran");
    assert!(!job_files(&job).1.exists(), "left behind by _exit");
    let _ = std::fs::remove_dir_all(dir);
}

/// Limits the stage cannot hold (five on one request, more than it has channels) are
/// refused in one line naming the variable, before the job's segment is made: none is
/// left behind.
#[test]
fn limits_the_stage_cannot_hold_leave_no_segment() {
    let dir = scratch("node-files-unholdable");
    let mount = dir.display().to_string();
    let job = format!("unholdable-{}", std::process::id());
    let five_on_open = format!("open=1,metadata=2,all=3,{mount}:open=4,{mount}:all=5");
    let three_hundred = vec!["open=5"; 300].join(",");
    for rules in [five_on_open, three_hundred] {
        let env = [
            ("PADLL_MOUNTS", mount.as_ref()),
            ("PADLL_RULES", rules.as_ref()),
            ("PADLL_JOB_ID", job.as_ref()),
        ];
        let stderr = crate::util::refused_in_one_line(&env, "running unthrottled: PADLL_RULES: ");
        let segment = job_files(&job).1;
        assert!(
            !segment.exists(),
            "{} was left: {stderr}",
            segment.display()
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
