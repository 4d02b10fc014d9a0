//! The `policies` binary: exit codes, messages, JSON in and out.

use crate::util::{policies, stderr};
use std::process::Output;

#[test]
fn allocate_prints_rates_and_chains_state() {
    let input = r#"{"jobs": [
        {"id": 1, "demand": 15000, "usage": 2000, "size": 1},
        {"id": 2, "demand": 40000, "usage": 60000, "wanted": 90000, "size": 3}
    ]}"#;
    let o = policies(
        &["allocate", "--policy", "adaptbf", "--max-rate", "110000"],
        input,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rates: Vec<f64> = v["rates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rate"].as_f64().unwrap())
        .collect();
    assert_eq!(rates.iter().sum::<f64>(), 110_000.0);
    assert_eq!(v["rates"][1]["id"], 2);
    // Chain: feed the state back.
    let mut next: serde_json::Value = serde_json::from_str(input).unwrap();
    next["state"] = v["state"].clone();
    let o2 = policies(
        &["allocate", "--policy", "adaptbf", "--max-rate", "110000"],
        &next.to_string(),
    );
    assert!(o2.status.success(), "{}", stderr(&o2));
    let v2: serde_json::Value = serde_json::from_slice(&o2.stdout).unwrap();
    let recs: i64 = v2["state"]["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["record"].as_i64().unwrap())
        .sum();
    assert_eq!(recs, 0);
}

fn rates(o: &Output) -> (Vec<f64>, serde_json::Value) {
    assert!(o.status.success(), "{}", stderr(o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = v["rates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rate"].as_f64().unwrap())
        .collect();
    (r, v["state"].clone())
}

#[test]
fn allocate_chained_adaptbf_gives_an_idle_job_nothing() {
    // Issue 10, verbatim: Max_R 100, state fed back each cycle. Job 1 does no I/O: it
    // gets 0 and no record, every cycle (it used to get 50/50 from cycle 1 on).
    let mut input: serde_json::Value = serde_json::from_str(
        r#"{"jobs":[{"id":1,"demand":0,"usage":0,"wanted":0},{"id":2,"demand":0,"usage":1000,"wanted":1000}]}"#,
    )
    .unwrap();
    for _ in 0..4 {
        let o = policies(
            &["allocate", "--policy", "adaptbf", "--max-rate", "100"],
            &input.to_string(),
        );
        let (r, state) = rates(&o);
        assert_eq!(r, vec![0.0, 100.0]);
        for e in state["jobs"].as_array().unwrap() {
            assert_eq!(e["record"], 0, "{state}");
        }
        input["state"] = state;
    }
}

#[test]
fn allocate_accepts_max_rate_in_the_controllers_syntax() {
    // Issue 10: `--max-rate 110k` was refused although the controller's TOML takes it.
    let input = r#"{"jobs": [{"id": 1, "demand": 15000, "usage": 9000}]}"#;
    for (arg, want) in [
        ("110k", 110_000.0),
        ("110000", 110_000.0),
        ("1.1e5", 110_000.0),
        ("5000/s", 5000.0),
    ] {
        let o = policies(
            &["allocate", "--policy", "uniform", "--max-rate", arg],
            input,
        );
        let (r, _) = rates(&o);
        assert_eq!(r, vec![want], "{arg}");
    }
}

#[test]
fn a_negative_max_rate_is_refused_naming_it() {
    // Parsed as a value (not taken for a flag), then validated.
    for command in ["allocate", "simulate"] {
        let o = policies(&[command, "--policy", "psfa", "--max-rate", "-5"], "{}");
        assert_eq!(o.status.code(), Some(2), "{command}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("bad --max-rate `-5`"),
            "{command}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn allocate_drf_prints_data_rates() {
    let input = r#"{"jobs": [{"id": 1, "demand": 100, "data_demand": 400, "usage": 0},
                            {"id": 2, "demand": 300, "data_demand": 100, "usage": 0}]}"#;
    let o = policies(
        &["allocate", "--policy", "drf:18", "--max-rate", "9"],
        input,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["data_rates"].as_array().unwrap().len(), 2);
}

#[test]
fn bad_input_names_the_field_and_exits_2() {
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["allocate", "--policy", "psfa", "--max-rate", "10"],
            r#"{"jobs": [{"id": 1, "usage": 3}]}"#,
            "demand",
        ),
        (
            &["allocate", "--policy", "psfa", "--max-rate", "10"],
            r#"{"jobs": [{"id": 1, "usage": 3, "demand": 1, "bogus": 2}]}"#,
            "bogus",
        ),
        (
            &["allocate", "--policy", "psfa", "--max-rate", "10"],
            r#"{"jobs": [{"id": "x", "usage": 3, "demand": 1}]}"#,
            "line 1",
        ),
        (
            &["allocate", "--policy", "psfa", "--max-rate", "10"],
            r#"{"jobs": ["#,
            "EOF",
        ),
        (
            &["allocate", "--policy", "psfa", "--max-rate", "10"],
            r#"{"job": []}"#,
            "job",
        ),
        (
            &["allocate", "--policy", "psfa", "--max-rate", "10"],
            r#"{"jobs": [{"id": 1, "usage": 3, "demand": 1}, {"id": 1, "usage": 3, "demand": 1}]}"#,
            "duplicate job id `1`",
        ),
        (
            &["allocate", "--policy", "adaptbf", "--max-rate", "10"],
            r#"{"jobs": [], "state": {"jobs": [{"id": 1}]}}"#,
            "record",
        ),
        (
            &["allocate", "--policy", "nonsense", "--max-rate", "10"],
            "{}",
            "nonsense",
        ),
        (
            &["allocate", "--policy", "psfa:7", "--max-rate", "10"],
            "{}",
            "7",
        ),
        (
            &["allocate", "--policy", "psfa", "--max-rate", "-3"],
            "{}",
            "-3",
        ),
        (
            &["allocate", "--policy", "psfa", "--max-rate", "many"],
            "{}",
            "many",
        ),
        // Issue 10: a negative demand was accepted and got all of Max_R.
        (
            &["allocate", "--policy", "psharing", "--max-rate", "110k"],
            r#"{"jobs": [{"id": 1, "demand": -5, "usage": 0}]}"#,
            "job 1: bad demand -5",
        ),
        (
            &["allocate", "--policy", "psfa", "--max-rate", "10"],
            r#"{"jobs": [{"id": 4, "demand": 1, "usage": 0, "wanted": -1}]}"#,
            "job 4: bad wanted -1",
        ),
        (
            &["allocate", "--policy", "priority-fair", "--max-rate", "10"],
            r#"{"jobs": [{"id": 2, "demand": 1, "usage": 0, "priority": 0}]}"#,
            "job 2: bad priority 0",
        ),
        // Two priorities of 1e308 summed to inf: both jobs were given 0.
        (
            &["allocate", "--policy", "priority-fair", "--max-rate", "10"],
            r#"{"jobs": [{"id": 2, "demand": 1, "usage": 0, "priority": 2e6}]}"#,
            "job 2: bad priority 2000000 (expected a number > 0 and ≤ 1000000)",
        ),
        (
            &["allocate", "--policy", "mckp", "--max-rate", "10"],
            r#"{"jobs": [{"id": 3, "demand": 1, "usage": 0, "options": [{"rate": -1, "utility": 1}]}]}"#,
            "options[0].rate",
        ),
        (
            &["allocate", "--policy", "psfa", "--max-rate", "110q"],
            "{}",
            "110q",
        ),
        (&["simulate", "--scenario", "9"], "", "9"),
        (&["simulate", "--policy", "fastest"], "", "fastest"),
        (&["simulate", "--step", "5"], "", "5"),
        (&["trace", "--scenario", "0"], "", "0"),
        (&["frobnicate"], "", "frobnicate"),
    ];
    for (args, input, needle) in cases {
        let o = policies(args, input);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn trace_then_simulate_from_the_file() {
    let dir = std::env::temp_dir().join(format!("policies-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t.csv");
    let o = policies(
        &[
            "trace",
            "--scenario",
            "2",
            "--seconds",
            "120",
            "--out",
            file.to_str().unwrap(),
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.join("out");
    let o = policies(
        &[
            "simulate",
            "--scenario",
            "2",
            "--policy",
            "psfa",
            "--policy",
            "priority",
            "--trace",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("| psfa |") && table.contains("| priority |"),
        "{table}"
    );
    for f in [
        "summary.md",
        "scenario-2/psfa.csv",
        "scenario-2/psfa.png",
        "scenario-2/psfa.svg",
        "scenario-2/priority.png",
    ] {
        let p = out.join(f);
        assert!(
            std::fs::metadata(&p)
                .map(|m| m.len() > 100)
                .unwrap_or(false),
            "{}",
            p.display()
        );
    }
    let png = std::fs::read(out.join("scenario-2/psfa.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let svg = std::fs::read_to_string(out.join("scenario-2/psfa.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("psfa"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A negative or absurd count reaches its flag's check instead of reading as a flag (or
/// allocating a trace of 10¹¹ seconds).
#[test]
fn counts_out_of_range_name_their_flag() {
    for (args, needle) in [
        (
            &["trace", "--seconds", "-1"][..],
            "'-1' for '--seconds <SECONDS>': must be a whole number from 1 to 1000000",
        ),
        (
            &["trace", "--seconds", "99999999999"],
            "'99999999999' for '--seconds <SECONDS>': must be a whole number from 1 to 1000000",
        ),
        (
            &["trace", "--scenario", "9"],
            "'9' for '--scenario <SCENARIO>': must be a whole number from 1 to 3",
        ),
        (
            &["simulate", "--seed", "-3"],
            "'-3' for '--seed <SEED>': must be a whole number from 0",
        ),
        (&["simulate", "--interval", "-1"], "bad --interval `-1`"),
    ] {
        let o = policies(args, "");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

/// `--interval` given only when wanted: `adaptbf:10` ran with Δt = 1 s because the
/// flag's default always overrode the spec's.
#[test]
fn allocate_keeps_the_specs_interval_unless_given_one() {
    let input = r#"{"jobs": [{"id": 1, "demand": 0, "usage": 1000}]}"#;
    let allocated = |args: &[&str]| {
        let (_, state) = rates(&policies(args, input));
        state["jobs"][0]["allocated"].as_u64().unwrap()
    };
    let spec = ["allocate", "--policy", "adaptbf:10", "--max-rate", "100"];
    assert_eq!(allocated(&spec), 1000, "Δt = 10 s: 100 ops/s × 10 s");
    let given = [&spec[..], &["--interval", "2"]].concat();
    assert_eq!(allocated(&given), 200, "--interval 2 overrides the spec's");
}

/// Hostile values each get one line naming them and exit 2: a DP resolution of 2³²
/// (a 32 GB allocation), a state record of i64::MAX (an overflow), a step below the
/// simulator's 1 ms (silently raised to it), trace rows at second 2⁶⁴−1 or 10¹¹, or of
/// job 10¹¹ (overflow, or a multi-terabyte allocation).
#[test]
fn hostile_values_are_refused_in_one_line_naming_them() {
    let dir = std::env::temp_dir().join(format!("policies-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cases: Vec<(Vec<String>, &str, String)> = vec![
        (
            vec![
                "allocate".into(),
                "--policy".into(),
                "mckp:4294967295".into(),
            ],
            "{}",
            "4294967295".into(),
        ),
        (
            vec!["allocate".into(), "--policy".into(), "adaptbf".into()],
            r#"{"jobs": [{"id": 1, "demand": 1, "usage": 1}],
                "state": {"jobs": [{"id": 1, "record": 9223372036854775807, "remainder": 0, "allocated": 1},
                                   {"id": 2, "record": 1, "remainder": 0, "allocated": 1}]}}"#,
            "job 1: bad record 9223372036854775807".into(),
        ),
        (
            vec!["simulate".into(), "--step".into(), "1e-9".into()],
            "",
            "bad --step `0.000000001`".into(),
        ),
    ];
    for (k, (row, value)) in [
        ("18446744073709551615,1,5", "second `18446744073709551615`"),
        ("0,100000000000,5", "job `100000000000`"),
        ("100000000000,1,5", "second `100000000000`"),
    ]
    .into_iter()
    .enumerate()
    {
        let file = dir.join(format!("t{k}.csv"));
        std::fs::write(&file, format!("second,job,open\n{row}\n")).unwrap();
        let args = ["simulate", "--no-plots", "--trace", file.to_str().unwrap()];
        cases.push((args.map(String::from).to_vec(), "", value.to_string()));
    }
    for (args, input, needle) in &mut cases {
        if args[0] == "allocate" {
            args.extend(["--max-rate".into(), "1000".into()]);
        }
        let o = policies(&args.iter().map(String::as_str).collect::<Vec<_>>(), input);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(needle.as_str()), "{args:?}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A typo'd flag or subcommand, or a missing value, is one line naming it and the help
/// of the command it was given to (exit 2); `--help` still prints in full (exit 0).
#[test]
fn command_line_mistakes_are_one_line_naming_them() {
    for (args, expected) in [
        (
            &["--bogus"][..],
            "policies: unexpected argument '--bogus' found; see 'policies --help'",
        ),
        (
            &["simulate", "--no-plot"],
            "policies: unexpected argument '--no-plot' found (a similar argument exists: \
             '--no-plots'); see 'policies simulate --help'",
        ),
        (
            &["simluate"],
            "policies: unrecognized subcommand 'simluate' (a similar subcommand exists: \
             'simulate'); see 'policies --help'",
        ),
        (&["trace", "--mean"], "'--mean <MEAN>'"),
    ] {
        let o = policies(args, "");
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(expected), "{args:?}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: {e}");
    }
    for args in [&["--help"][..], &["simulate", "--help"]] {
        let o = policies(args, "");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).lines().count() > 5,
            "{args:?}"
        );
    }
}
