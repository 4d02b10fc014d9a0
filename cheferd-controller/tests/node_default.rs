//! Issue 18, (l): a job started while no rules could come from the global controller
//! (starting, frozen, unreachable) ran unthrottled unless its own environment set
//! `PADLL_DEFAULT_LIMIT`. Now the local controller gives the stages of a job without
//! rules from the global controller its node's default (`cheferd local
//! --default-limit`, else 1 % of each resource's Max_R as the global controller last
//! said), for the job on the node; `0` gives none. None of the jobs here set anything
//! in their environment.

use crate::util::*;
use std::time::{Duration, Instant};

/// The global controller's Max_R: its built-in default is 1 % of it.
const MAX_R: f64 = 20_000.0;
const BUILT_IN: f64 = MAX_R / 100.0;
/// What each process offers, far above every default here.
const OFFERED: u64 = 1500;
/// Far above every default here, well below what a process offers.
const UNTHROTTLED: f64 = 4.0 * BUILT_IN;

fn cluster() -> Cluster {
    Cluster::new(&format!(
        r#"
interval_ms = 200
[[resource]]
name = "{{scratch}}:metadata"
max_rate = "{MAX_R}"
policy = "psfa"
"#
    ))
}

/// A job's rate (its processes' together) over its last `seconds` windows reported
/// by now.
fn recent_rate(cluster: &Cluster, job: &str, seconds: u64) -> f64 {
    let now = Instant::now();
    cluster.job_rate(job, now - Duration::from_millis(seconds * 1000 + 1300), now)
}

/// A job's rate over the next `seconds`, once its replayers are past their set-up
/// (their files, made under the default too) and `settle` has passed.
fn job_rate(cluster: &Cluster, job: &str, settle: Duration, seconds: u64) -> f64 {
    wait_for(START_TIMEOUT, &format!("{job} to replay"), || {
        (recent_rate(cluster, job, 1) > 0.0).then_some(())
    });
    std::thread::sleep(settle);
    let from = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let to = Instant::now();
    // The replayers' last windows are reported a second after they end.
    std::thread::sleep(Duration::from_millis(1300));
    let rate = cluster.job_rate(job, from, to);
    eprintln!("{job}: {rate:.0} ops/s");
    rate
}

/// `rate` is a limit's: at most a quarter above it (plus a bucket per process), at
/// least half of it (the job runs, and is not starved).
fn assert_held(rate: f64, limit: f64, what: &str) {
    assert!(
        rate <= limit * 1.25 + 2.0,
        "{what}: {rate:.0} ops/s above the default {limit}"
    );
    assert!(
        rate >= limit * 0.5,
        "{what}: {rate:.0} ops/s, starved under the default {limit}"
    );
}

fn wait_for_log(cluster: &Cluster, node: &str, needle: &str) {
    wait_for(
        START_TIMEOUT,
        &format!("{node}'s log to say {needle:?}"),
        || cluster.local_log(node).contains(needle).then_some(()),
    );
}

/// Sends `signal` to the global controller.
pub(crate) fn signal_global(cluster: &Cluster, signal: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child the cluster started and has not reaped.
    let sent = unsafe { libc::kill(cluster.global_pid() as i32, signal) };
    assert_eq!(sent, 0, "kill: {}", std::io::Error::last_os_error());
}

#[test]
fn a_site_default_holds_a_new_job_while_no_global_controller_answers() {
    let _turn = alone();
    let mut cluster = cluster();
    // No global controller ever runs on the cluster's port.
    let limit = 300.0;
    let default = format!("{}={limit}/s", cluster.metadata());
    cluster.start_local_with("n1", &["--default-limit", &default], None);
    wait_for_log(
        &cluster,
        "n1",
        &format!("stages without rules from the global controller get, per job: {default}"),
    );
    // Two processes of one job: the default is the job's on the node, split over them.
    let job = job_id("nd-site");
    cluster.start_job(&job, &["n1", "n1"], OFFERED);
    let rate = job_rate(&cluster, &job, Duration::from_secs(3), 4);
    assert_held(rate, limit, "two processes without a global controller");
    assert!(cluster.controllers_alive(), "the local controller died");
}

#[test]
fn a_frozen_global_leaves_new_jobs_the_built_in_default_or_none_until_it_resumes() {
    let _turn = alone();
    let mut cluster = cluster();
    cluster.start_global();
    // n1 has the built-in default; the site running n2 prefers availability.
    cluster.start_local("n1");
    cluster.start_local_with("n2", &["--default-limit", "0"], None);
    let built_in = format!("{}={BUILT_IN}/s", cluster.metadata());
    wait_for_log(
        &cluster,
        "n1",
        &format!("stages without rules from the global controller get, per job: {built_in}"),
    );
    wait_for_log(&cluster, "n2", "attached to the global controller");

    // Frozen, it sends no rules: not even a provisional share for a new job.
    signal_global(&cluster, libc::SIGSTOP);
    let (held, free) = (job_id("nd-held"), job_id("nd-free"));
    cluster.start_job(&held, &["n1"], OFFERED);
    cluster.start_job(&free, &["n2"], OFFERED);
    let held_rate = job_rate(&cluster, &held, Duration::from_secs(1), 4);
    assert_held(held_rate, BUILT_IN, "a new job while the global is frozen");
    let free_rate = job_rate(&cluster, &free, Duration::ZERO, 3);
    assert!(
        free_rate >= UNTHROTTLED,
        "with --default-limit 0, a new job ran at {free_rate:.0} ops/s: throttled"
    );

    // Resumed, the global controller's rules replace the default: the job grows to
    // its share, far above.
    signal_global(&cluster, libc::SIGCONT);
    wait_for(
        Duration::from_secs(60),
        "the held job to run at its share",
        || (recent_rate(&cluster, &held, 2) >= UNTHROTTLED).then_some(()),
    );
    assert!(cluster.controllers_alive(), "a controller died");
}

#[test]
fn a_bad_default_limit_is_one_line_naming_flag_and_value() {
    let _turn = together();
    for (value, why) in [
        ("metadata=fast", "bad rate 'fast'"),
        ("", "no limit"),
        ("-5", "expected SELECTOR=RATE"),
        ("/scratch:metadata=1MiB/s", "counts operations"),
    ] {
        let mut command = std::process::Command::new(cheferd());
        command.args(["local", "--insecure-plaintext", "--default-limit", value]);
        let output = run_with_timeout(&mut command, Duration::from_secs(30));
        let message = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{value:?}: {message}");
        assert_eq!(
            message.trim_end().lines().count(),
            1,
            "{value:?}: {message}"
        );
        assert!(
            message.contains(&format!("--default-limit '{value}': ")) && message.contains(why),
            "{value:?}: {message}"
        );
    }
}
