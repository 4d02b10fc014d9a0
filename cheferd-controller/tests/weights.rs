//! `weights` end to end: a resource whose every metadata call costs two tokens holds a
//! job to `Max_R / 2` calls a second, and its usage counts tokens, not calls.

use crate::util::{assigned, job_id, Cluster, START_TIMEOUT};
use padll_wire::ops::{Class, Op};
use std::time::{Duration, Instant};

const MAX_RATE: f64 = 400.0;
const WEIGHT: f64 = 2.0;

#[test]
fn every_call_costs_its_weight() {
    let _turn = crate::util::alone();
    let weights: Vec<String> = Op::ALL
        .iter()
        .filter(|op| op.class() == Class::Metadata)
        .map(|op| format!("{} = {WEIGHT}", op.name()))
        .collect();
    let mut cluster = Cluster::new(&format!(
        "interval_ms = 500\n[[resource]]\nname = \"{{scratch}}:metadata\"\n\
         max_rate = {MAX_RATE}\npolicy = \"uniform\"\nweights = {{ {} }}\n",
        weights.join(", ")
    ));
    cluster.start_global();
    cluster.start_local("n1");
    let job = job_id("weighed");
    // It would make 1 500 calls a second unweighted.
    cluster.start_process(&job, "n1", 1500);
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 1)]);
    crate::util::wait_for(START_TIMEOUT, "the job's share", || {
        (assigned(&cluster.snapshot(), &job) > 0.0).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    // One interval's usage may hold a batch of credit more or less than its rate: the
    // usage compared is a mean over the span the calls are counted in.
    let from = Instant::now();
    let mut usages = Vec::new();
    while from.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(500));
        let snapshot = cluster.snapshot();
        let share = snapshot.shares.iter().find(|s| s.job == job);
        usages.push(share.map_or(0.0, |s| s.usage));
    }
    let to = Instant::now();
    let usage = usages.iter().sum::<f64>() / usages.len() as f64;
    // The last window of the replayer is reported up to a second after `to`.
    std::thread::sleep(Duration::from_millis(1300));
    let calls = cluster.job_rate(&job, from, to);
    eprintln!(
        "Max_R {MAX_RATE} tokens/s, weight {WEIGHT}: {calls:.0} calls/s, usage {usage:.0} tokens/s"
    );
    // Unweighted it would be held to Max_R calls a second; a loaded machine may slow it.
    assert!(
        (MAX_RATE / WEIGHT * 0.3..=MAX_RATE / WEIGHT * 1.15).contains(&calls),
        "{calls:.0} calls/s under Max_R {MAX_RATE} with every call weighing {WEIGHT}"
    );
    assert!(
        usage >= calls * 1.5 && usage <= MAX_RATE * 1.15,
        "usage {usage:.0} tokens/s for {calls:.0} calls/s weighing {WEIGHT} each"
    );
}
