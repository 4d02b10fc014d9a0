//! `policies place` (dry run of one placement decision) and `policies place-sim`: JSON in
//! and out, state chaining, exit code 2 and one line naming the field for bad input.

use crate::util::{policies, stderr};
use std::process::Output;

const CLUSTER: &str = r#"{
  "osses": [{"id": 0, "cpu": 90, "memory": 60}, {"id": 1, "cpu": 10, "memory": 20}],
  "targets": [
    {"id": 0, "oss": 0, "capacity": 1e12, "used": 1e10},
    {"id": 1, "oss": 0, "capacity": 1e12, "used": 1e10},
    {"id": 2, "oss": 1, "capacity": 1e12, "used": 5e11},
    {"id": 3, "oss": 1, "capacity": 1e12, "used": 2e10, "load": 10}
  ],
  "requests": [{"id": 7, "app": 1, "stripes": 2, "bytes": 4e9}],
  "history": [{"app": 1, "bytes": [4e9, 4e9, 8e9, 4e9, 4e9, 8e9]}]
}"#;

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn place_mcmf_prints_targets_and_predictions() {
    let v = json(&policies(&["place"], CLUSTER));
    assert_eq!(v["placer"], "mcmf:3,3");
    assert_eq!(v["placements"][0]["request"], 7);
    // The idle server's emptier target, then the busy server's emptiest.
    let t: Vec<u64> = v["placements"][0]["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(t.len(), 2);
    assert!(t.contains(&3), "{t:?}");
    assert_eq!(v["predicted"].as_array().unwrap().len(), 3);
    assert_eq!(v["dropped"], 0);
    assert!(v["cost"].as_i64().unwrap() > 0);
}

#[test]
fn place_round_robin_chains_its_pointer() {
    let o = policies(&["place", "--placer", "round-robin"], CLUSTER);
    let v = json(&o);
    assert_eq!(v["placements"][0]["targets"], serde_json::json!([0, 2]));
    let mut next: serde_json::Value = serde_json::from_str(CLUSTER).unwrap();
    next["state"] = v["state"].clone();
    let v2 = json(&policies(
        &["place", "--placer", "round-robin"],
        &next.to_string(),
    ));
    assert_eq!(v2["placements"][0]["targets"], serde_json::json!([1, 3]));
    assert_eq!(v2["state"]["decisions"], 2);
}

#[test]
fn place_random_is_seeded() {
    let a = json(&policies(&["place", "--placer", "random:3"], CLUSTER));
    let b = json(&policies(&["place", "--placer", "random:3"], CLUSTER));
    assert_eq!(a, b);
}

#[test]
fn place_bad_input_exits_2_naming_the_field() {
    let base: serde_json::Value = serde_json::from_str(CLUSTER).unwrap();
    let with = |path: &[&str], v: serde_json::Value| {
        let mut j = base.clone();
        let mut cur = &mut j;
        for p in &path[..path.len() - 1] {
            cur = match p.parse::<usize>() {
                Ok(i) => &mut cur[i],
                Err(_) => &mut cur[*p],
            };
        }
        let last = path[path.len() - 1];
        match last.parse::<usize>() {
            Ok(i) => cur[i] = v,
            Err(_) => cur[last] = v,
        }
        j.to_string()
    };
    let cases: Vec<(Vec<&str>, String, &str)> = vec![
        (vec!["place"], "{".into(), "bad placement JSON"),
        (
            vec!["place"],
            with(&["targets", "0", "used"], (-5).into()),
            "target 0: bad used -5",
        ),
        (
            vec!["place"],
            with(&["targets", "1", "used"], 2e12.into()),
            "target 1: bad used 2000000000000 (more than its capacity",
        ),
        (
            vec!["place"],
            with(&["targets", "2", "oss"], 9.into()),
            "target 2: bad oss 9",
        ),
        (
            vec!["place"],
            with(&["targets", "3", "load"], 120.into()),
            "target 3: bad load 120",
        ),
        (
            vec!["place"],
            with(&["osses", "0", "cpu"], 101.into()),
            "oss 0: bad cpu 101",
        ),
        (
            vec!["place"],
            with(&["requests", "0", "stripes"], 0.into()),
            "request 7: bad stripes 0",
        ),
        (
            vec!["place"],
            with(&["requests", "0", "stripes"], 5.into()),
            "request 7: cannot place 5 stripes",
        ),
        (
            vec!["place"],
            with(&["requests", "0", "bytes"], (-1.0).into()),
            "request 7: bad bytes -1",
        ),
        (
            vec!["place"],
            with(&["history", "0", "bytes", "2"], (-3).into()),
            "history of app 1: bad bytes[2] -3",
        ),
        (
            vec!["place"],
            with(&["stripe_size"], 0.into()),
            "bad stripe_size 0",
        ),
        (
            vec!["place"],
            with(&["targets", "0", "bogus"], 1.into()),
            "unknown field `bogus`",
        ),
        (
            vec!["place"],
            with(&["targets", "1", "id"], 0.into()),
            "duplicate target id `0`",
        ),
        (
            vec!["place", "--placer", "mcmf:9"],
            CLUSTER.into(),
            "bad --placer: placer `mcmf:9`: bad order `9`",
        ),
        (
            vec!["place", "--placer", "lottery"],
            CLUSTER.into(),
            "unknown placer `lottery`",
        ),
    ];
    for (args, input, want) in cases {
        let o = policies(&args, &input);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?} {want}: {e}");
        assert!(e.contains(want), "want `{want}` in: {e}");
        assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    }
}

#[test]
fn place_sim_writes_summary_and_plots() {
    let dir = std::env::temp_dir().join(format!("place-sim-{}", std::process::id()));
    let o = policies(
        &[
            "place-sim",
            "--hours",
            "2",
            "--osts",
            "160",
            "--scale-hours",
            "0.2",
            "--out",
            dir.to_str().unwrap(),
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("| mcmf:3,3 |") && md.contains("Table II"));
    for f in ["fig11-disk", "fig12-cpu", "fig17-bandwidth"] {
        for ext in ["png", "svg"] {
            assert!(dir.join(format!("{f}.{ext}")).exists(), "{f}.{ext}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let o = policies(
        &["place-sim", "--scenario", "alternating", "--seed", "3"],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let md = String::from_utf8_lossy(&o.stdout);
    for row in ["| mcmf:3,3 |", "| mcmf:0,0 |", "| round-robin |"] {
        assert!(md.contains(row), "{row} in {md}");
    }
    let o = policies(&["place-sim", "--scenario", "busy"], "");
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("bad --scenario `busy` (expected paper or alternating)")
            && e.trim().lines().count() == 1,
        "{e}"
    );
    let o = policies(&["place-sim", "--osts", "0"], "");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("'0' for '--osts <OSTS>': must be a whole number from 1 to 100000"));
}
