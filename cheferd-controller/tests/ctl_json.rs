//! `cheferd ctl … --json`: every view prints JSON of what the admin socket returned,
//! against a global and a local controller with one job under the stage.

use crate::util::{job_id, Cluster, START_TIMEOUT};
use serde_json::Value;

/// `ctl ARGS…`, which must succeed, parsed as JSON.
fn json(cluster: &Cluster, args: &[&str]) -> Value {
    let output = cluster.ctl(args);
    assert!(
        output.status.success(),
        "ctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("ctl {args:?} is not JSON ({e}): {:?}", output.stdout))
}

#[test]
fn every_ctl_view_prints_json() {
    let _turn = crate::util::alone();
    let mut cluster = Cluster::new(
        "interval_ms = 500\n[[resource]]\nname = \"{scratch}:metadata\"\n\
         max_rate = \"1000\"\npolicy = \"uniform\"\n",
    );
    cluster.start_global();
    cluster.start_local("n1");
    let job = job_id("job-1");
    cluster.start_process(&job, "n1", 300);
    cluster.wait_for_stages(START_TIMEOUT, &[("n1", 1)]);
    let resource = cluster.metadata();
    crate::util::wait_for(START_TIMEOUT, "a share for job-1", || {
        let jobs = json(&cluster, &["jobs", "--json"]);
        (jobs["shares"][0]["job"] == job.as_str()).then_some(())
    });

    // The stage's service times reach the global controller, merged per resource.
    let service = crate::util::wait_for(START_TIMEOUT, "job-1's service times", || {
        let jobs = json(&cluster, &["jobs", "--json"]);
        let service = jobs["resources"][0]["service"].clone();
        (service["calls"].as_u64()? > 0).then_some(service)
    });
    let p50 = service["p50_ms"].as_f64().expect("a median");
    let p99 = service["p99_ms"].as_f64().expect("a 99th percentile");
    assert!(p50 > 0.0 && p99 >= p50, "{service}");
    let table = String::from_utf8_lossy(&cluster.ctl(&["jobs"]).stdout).into_owned();
    assert!(table.contains("service p50 "), "{table}");

    let nodes = json(&cluster, &["nodes", "--json"]);
    assert_eq!(nodes[0]["node"], "n1", "{nodes}");
    assert_eq!(nodes[0]["attached"], true, "{nodes}");
    let stages = json(&cluster, &["--json", "stages"]);
    assert_eq!(stages[0]["job"], job.as_str(), "{stages}");
    assert_eq!(stages[0]["job_size"], 1, "{stages}");
    for view in [&["jobs", "--json"][..], &["top", "--once", "--json"]] {
        let jobs = json(&cluster, view);
        assert_eq!(
            jobs["resources"][0]["resource"],
            resource.as_str(),
            "{jobs}"
        );
        assert_eq!(jobs["shares"][0]["resource"], resource.as_str(), "{jobs}");
        assert!(
            jobs["shares"][0]["assigned"].as_f64().unwrap() > 0.0,
            "{jobs}"
        );
        assert!(jobs["cycle"].as_u64().unwrap() > 0, "{jobs}");
    }
    let status = json(&cluster, &["status", "--json"]);
    assert_eq!(status["role"], "single", "{status}");
    assert_eq!(status["controlling"], true, "{status}");
    let table = cluster.ctl(&["status"]);
    assert!(String::from_utf8_lossy(&table.stdout).starts_with("role         single\n"));
    let dump = json(&cluster, &["dump", "--json"]);
    assert!(dump["state"]["stages"].is_array() && dump["config"].is_object());
    let reply = json(&cluster, &["set-policy", &resource, "psfa", "--json"]);
    assert!(reply.is_string(), "{reply}");

    // Without --json the views stay tables.
    let table = cluster.ctl(&["nodes"]);
    assert!(String::from_utf8_lossy(&table.stdout).starts_with("node "));
}
