//! Control when etcd is lost, with a real etcd (the helpers of [`crate::standby`]):
//!
//! - a single `cheferd global --etcd` (no standby) whose etcd is killed keeps
//!   controlling: a job started during the outage is throttled to its share of `Max_R`
//!   and `ctl jobs` shows it; once etcd is back it leads on in the same term;
//! - etcd is wiped under a running system (data lost, rebuilt): the leader finds its
//!   lease gone and exits, and once the global controllers are started again (as their
//!   service manager does) the local controllers follow the new leader, whose term is
//!   smaller than the one they saw but of a newer generation, without being restarted:
//!   a new job is throttled.

use crate::standby::{
    assert_jobs_running, cluster, new_cluster, restart_etcd_and_lead_on, wait_capped, Etcd, Global,
    ETCD_PREFIX, MAX_RATE, START_TIMEOUT,
};
use crate::util::{assigned, job_id, wait_for, Cluster, CAP_TOLERANCE};
use std::time::{Duration, Instant};

/// What a new job offers: several times `Max_R`, which it would run at unthrottled.
const GREEDY: u64 = 4 * MAX_RATE as u64;

/// Waits until the global controller behind the cluster's admin socket lists `job`
/// with a share assigned, and `ctl jobs` shows it.
fn wait_for_job_listed(cluster: &Cluster, job: &str) {
    wait_for(
        Duration::from_secs(30),
        &format!("job {job} assigned a share"),
        || {
            let snapshot = cluster.try_snapshot()?;
            (assigned(&snapshot, job) > 0.0).then_some(())
        },
    );
    let jobs = cluster.ctl(&["jobs"]);
    assert!(jobs.status.success(), "ctl jobs: {jobs:?}");
    let table = String::from_utf8_lossy(&jobs.stdout);
    assert!(
        table.contains(job),
        "ctl jobs does not show {job}:\n{table}"
    );
}

#[test]
#[cfg_attr(not(has_etcd), ignore = "etcd not installed")]
fn a_lone_global_keeps_controlling_while_etcd_is_down() {
    let _turn = crate::util::alone();
    let mut cluster = new_cluster("psfa");
    let mut etcd = Etcd::start(cluster.dir.path(), 1, None);
    let a = Global::start(&cluster, "a", &etcd);
    a.wait_for_log(START_TIMEOUT, "elected leader");
    cluster.admin = a.admin.clone();
    cluster.global_urls = a.url();
    cluster.start_local("n1");
    cluster.start_job(&job_id("j1"), &["n1"], MAX_RATE as u64);
    cluster.wait_for_stages(Duration::from_secs(20), &[("n1", 1)]);
    let term = a.status()["term"].as_u64().expect("a term");

    etcd.kill();
    a.wait_for_log(
        Duration::from_secs(30),
        &format!("keeping control in term {term} (no standby is known); administrative changes are not persisted until etcd answers again"),
    );
    // Past the lease's TTL: it controls without it.
    a.wait_for_status("A controlling with its lease lapsed", |status| {
        status["lease_valid"] == false && status["etcd_reachable"] == false
    });
    assert_eq!(a.status()["controlling"], true, "{}", a.status());
    assert!(
        !a.log().contains("not controlling"),
        "A stopped controlling:\n{}",
        a.log()
    );

    // A job started during the outage gets its share, and the aggregate keeps to Max_R.
    let late = job_id("late");
    cluster.start_job(&late, &["n1"], GREEDY);
    cluster.wait_for_stages(Duration::from_secs(20), &[("n1", 2)]);
    wait_for_job_listed(&cluster, &late);
    let capped = wait_capped(&cluster, MAX_RATE);
    std::thread::sleep(Duration::from_secs(4));
    let now = Instant::now();
    cluster.assert_aggregate_capped(capped, now, MAX_RATE);
    let late_rate = cluster.job_rate(&late, capped, now - Duration::from_millis(1200));
    assert!(
        late_rate > 0.0 && late_rate <= MAX_RATE * CAP_TOLERANCE,
        "the job started during the outage ran at {late_rate:.0}/s (Max_R {MAX_RATE})"
    );
    assert_eq!(a.status()["etcd_reachable"], false, "etcd came back early");

    // etcd back with its data: A finds its lease and leads on in the same term.
    restart_etcd_and_lead_on(&mut etcd, &a, term);
    assert_jobs_running(&mut cluster);
    assert!(cluster.controllers_alive(), "a local controller died");
}

#[test]
#[cfg_attr(not(has_etcd), ignore = "etcd not installed")]
fn after_etcd_is_wiped_the_locals_follow_the_new_leader_without_a_restart() {
    let _turn = crate::util::alone();
    let (mut cluster, mut etcd, mut a, mut b) = cluster("psfa", 1, false);
    // B's election key is newer than A's: with B leading, the locals see a term that
    // the wiped etcd's first leader will not reach.
    let _ = a.child.kill();
    let _ = a.child.wait();
    b.wait_for_log(Duration::from_secs(15), "elected leader");
    cluster.admin = b.admin.clone();
    cluster.wait_for_stages(Duration::from_secs(30), &[("n1", 2), ("n2", 2)]);
    let seen = b.status();
    let seen_term = seen["term"].as_u64().expect("a term");
    let seen_created = seen["generation"]["created_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no generation in {seen}"));
    let locals = [cluster.local_pid("n1"), cluster.local_pid("n2")];

    etcd.wipe();
    etcd.restart();
    let exited = wait_for(Duration::from_secs(30), "B to exit", || {
        b.child.try_wait().ok().flatten()
    });
    assert!(!exited.success());
    let log = b.log();
    assert!(
        ["has expired", "it no longer leads"]
            .iter()
            .any(|why| log.contains(why)),
        "{log}"
    );

    // Their service manager starts both again: one leads the wiped etcd.
    a.restart(&cluster, &etcd);
    b.restart(&cluster, &etcd);
    let leader = wait_for(
        Duration::from_secs(30),
        "a leader of the wiped etcd",
        || {
            [&a, &b]
                .into_iter()
                .find(|g| g.log().contains("elected leader"))
        },
    );
    let status = leader.status();
    let term = status["term"].as_u64().expect("a term");
    assert!(
        term < seen_term,
        "term {term} after the wipe, {seen_term} before: the test shows nothing"
    );
    let created = status["generation"]["created_ms"]
        .as_u64()
        .expect("a generation");
    assert!(created > seen_created, "{status}");
    let stored = etcd
        .get(&format!("{ETCD_PREFIX}/generation"))
        .expect("the generation stored in etcd");
    assert!(String::from_utf8_lossy(&stored).contains(&created.to_string()));

    // The locals, not restarted, follow it: it lists their stages and throttles a new job.
    cluster.admin = leader.admin.clone();
    cluster.wait_for_stages(Duration::from_secs(60), &[("n1", 2), ("n2", 2)]);
    let late = job_id("late");
    cluster.start_job(&late, &["n1"], GREEDY);
    wait_for_job_listed(&cluster, &late);
    let capped = wait_capped(&cluster, MAX_RATE);
    std::thread::sleep(Duration::from_secs(4));
    cluster.assert_aggregate_capped(capped, Instant::now(), MAX_RATE);
    assert_eq!(
        [cluster.local_pid("n1"), cluster.local_pid("n2")],
        locals,
        "a local controller was restarted"
    );
    for node in ["n1", "n2"] {
        let log = cluster.local_log(node);
        assert!(
            !log.contains("a leader of etcd data since replaced")
                && !log.contains("a deposed leader"),
            "{node} refused a leader:\n{log}"
        );
    }
    assert_jobs_running(&mut cluster);
    assert!(cluster.controllers_alive(), "a local controller died");
}
