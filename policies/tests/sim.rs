//! Simulator tests: the shape of the paper's results (§V-C) and the trace format.

use policies::sim::{self, Scenario};
use policies::trace::{self, LoadShape};
use policies::{build, Policy};

fn run(sc: &Scenario, spec: &str) -> sim::SimResult {
    let mut p = build(spec).unwrap();
    sim::simulate(sc, p.as_mut())
}

/// A shorter scenario (12 min traces, jobs 1 min apart) for the debug-build tests.
fn short(n: usize) -> Scenario {
    let agg = trace::generate_aggregate(&LoadShape {
        seconds: 720,
        mean: 90_000.0,
        seed: 7,
    });
    let mut sc = Scenario::paper(n, &agg).unwrap();
    for (k, j) in sc.jobs.iter_mut().enumerate() {
        j.start = 60.0 * k as f64;
    }
    sc.step = 0.1;
    sc
}

#[test]
fn controlled_policies_never_exceed_max_r_and_all_jobs_finish() {
    for n in 1..=3 {
        let sc = short(n);
        for spec in policies::cli::SIM_POLICIES.iter().chain(&[
            "job-fair",
            "themis:group,user,size",
            "mckp",
        ]) {
            let r = run(&sc, spec);
            assert!(
                r.makespan().is_some(),
                "{spec} #{n}: unfinished {:?}",
                r.completion
            );
            if *spec != "baseline" {
                assert_eq!(r.seconds_over, 0, "{spec} #{n}");
                assert!(r.peak <= sc.max_rate * (1.0 + 1e-9) + 1e-6, "{spec} #{n}");
            }
        }
    }
}

#[test]
fn baseline_finishes_with_the_trace_and_exceeds_max_r() {
    let sc = short(1);
    let r = run(&sc, "baseline");
    for (j, c) in sc.jobs.iter().zip(&r.completion) {
        let end = j.start + j.trace.len() as f64;
        assert!((c.unwrap() - end).abs() <= 0.2, "{c:?} vs {end}");
    }
    assert!(
        r.seconds_over > 0,
        "the generated load has bursts above Max_R"
    );
}

#[test]
fn paper_shape_scenario_3() {
    // PADLL §V-C, scenario #3: Priority starves job 4 (15 kops/s, 45 % of the load);
    // PSharing is much faster; PSFA is at least as fast as PSharing and close to
    // Baseline. Uses the paper's full setup (36-min traces, jobs 3 min apart).
    let sc = Scenario::paper_generated(3, 42).unwrap();
    let base = run(&sc, "baseline").makespan().unwrap();
    let prio = run(&sc, "priority").makespan().unwrap();
    let psh = run(&sc, "psharing").makespan().unwrap();
    let psfa = run(&sc, "psfa").makespan().unwrap();
    assert!((base - 45.0 * 60.0).abs() < 1.0);
    assert!(prio > psh + 10.0 * 60.0, "priority {prio} psharing {psh}");
    assert!(psfa <= psh + 1.0, "psfa {psfa} psharing {psh}");
    assert!(psfa < base + 3.0 * 60.0);
}

#[test]
fn time_series_and_csv() {
    let sc = short(2);
    let r = run(&sc, "psfa");
    let csv = sim::throughput_csv(&sc, &r);
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("second,job1,job2,job3,job4,total"));
    assert_eq!(csv.lines().count(), r.throughput.len() + 1);
    let total: f64 = r.throughput.iter().flatten().sum();
    let want: f64 = sc.jobs.iter().flat_map(|j| j.trace.iter()).sum();
    assert!(
        (total - want).abs() / want < 1e-6,
        "every operation is served once"
    );
    let table = sim::markdown_table(&sc, &[r]);
    assert!(table.contains("| psfa:0.5 |"), "{table}");
}

#[test]
fn trace_generator_shape_and_determinism() {
    let shape = LoadShape::default();
    let a = trace::generate_aggregate(&shape);
    assert_eq!(a, trace::generate_aggregate(&shape));
    assert_ne!(
        a,
        trace::generate_aggregate(&LoadShape {
            seed: 1,
            ..shape.clone()
        })
    );
    let mean = a.iter().sum::<f64>() / a.len() as f64;
    assert!((mean - 90_000.0).abs() < 1.0);
    let max = a.iter().cloned().fold(0.0, f64::max);
    let calm = a.iter().filter(|&&x| x < 0.5 * mean).count();
    let over = a.iter().filter(|&&x| x > 110_000.0).count();
    assert!(
        max > 2.5 * 110_000.0 * 0.9,
        "bursts of several times Max_R: {max}"
    );
    assert!(calm > a.len() / 20, "calm periods: {calm}");
    assert!(over > a.len() / 20, "periods over capacity: {over}");
}

#[test]
fn trace_file_round_trip() {
    let agg = trace::generate_aggregate(&LoadShape {
        seconds: 50,
        ..LoadShape::default()
    });
    let traces = trace::split(&agg, &[0.15, 0.2, 0.2, 0.45]);
    let mut buf = Vec::new();
    trace::write(&mut buf, &traces, "test\nsecond line").unwrap();
    let text = String::from_utf8(buf.clone()).unwrap();
    assert!(text.starts_with("# padll-trace v1\n# test\n# second line\nsecond,job,open,close,getattr,setattr,rename,mkdir,unlink\n0,1,"));
    let back = trace::read(&buf[..]).unwrap();
    assert_eq!(back, traces);
    // Per-op counts add up to the proportion of the aggregate.
    let row = &traces[3].ops[0];
    assert_eq!(row.iter().sum::<u64>(), (agg[0] * 0.45).round() as u64);
}

#[test]
fn trace_reader_names_bad_fields() {
    use trace::{TraceError, TraceErrorKind};
    let refused = |text: &[u8]| trace::read(text).expect_err("a bad trace was read");
    let bad_field = refused(b"second,job,open\n0,1,x\n");
    assert!(
        matches!(&bad_field, TraceError::Line {
            line: 2,
            kind: TraceErrorKind::BadField { column, value },
        } if column == "open" && value == "x"),
        "{bad_field:?}"
    );
    let e = bad_field.to_string();
    assert!(
        e.contains("line 2") && e.contains("open") && e.contains("`x`"),
        "{e}"
    );
    let header = refused(b"sec,job\n");
    assert!(
        matches!(
            header,
            TraceError::Line {
                line: 1,
                kind: TraceErrorKind::Header
            }
        ),
        "{header:?}"
    );
    assert!(header.to_string().contains("header"));
    let job_zero = refused(b"second,job,open\n0,0,1\n");
    assert!(
        matches!(
            job_zero,
            TraceError::Line {
                line: 2,
                kind: TraceErrorKind::JobZero
            }
        ),
        "{job_zero:?}"
    );
    assert!(job_zero.to_string().contains("job `0`"));
    let fields = refused(b"second,job,open\n0,1\n");
    assert!(
        matches!(
            fields,
            TraceError::Line {
                line: 2,
                kind: TraceErrorKind::FieldCount {
                    fields: 2,
                    header: 3
                },
            }
        ),
        "{fields:?}"
    );
    assert!(fields.to_string().contains("fields"));
    let empty = refused(b"# nothing\n");
    assert!(matches!(empty, TraceError::Empty), "{empty:?}");
    // A line that cannot be read keeps the reader's error.
    let unreadable = refused(b"second,job,open\n0,1,\xff\n");
    assert!(
        matches!(&unreadable, TraceError::Line {
            line: 2,
            kind: TraceErrorKind::Io(io),
        } if io.kind() == std::io::ErrorKind::InvalidData),
        "{unreadable:?}"
    );
}

#[test]
fn adaptbf_in_simulation_keeps_records_balanced() {
    let sc = short(3);
    let mut p = policies::adaptbf::Adaptbf::new(1.0);
    let r = sim::simulate(&sc, &mut p);
    assert!(r.makespan().is_some());
    let sum: i64 = p.current_state().jobs.iter().map(|e| e.record).sum();
    assert_eq!(sum, 0);
    assert!(p.name().starts_with("adaptbf"));
}

/// `second` and `job` size the traces: 2⁶⁴−1 overflowed `second + 1`, 10¹¹ asked for
/// terabytes. Each is refused naming the line, the column and the value.
#[test]
fn trace_reader_refuses_seconds_and_jobs_beyond_its_bounds() {
    use trace::{TraceError, TraceErrorKind, MAX_JOBS, MAX_ROWS, MAX_SECONDS};
    let refused = |text: &str| trace::read(text.as_bytes()).expect_err("a huge trace was read");
    for (row, column, value) in [
        ("18446744073709551615,1,5", "second", u64::MAX),
        ("100000000000,1,5", "second", 100_000_000_000),
        ("0,100000000000,5", "job", 100_000_000_000),
        (&*format!("{MAX_SECONDS},1,5"), "second", MAX_SECONDS),
        (&*format!("0,{},5", MAX_JOBS + 1), "job", MAX_JOBS + 1),
    ] {
        let e = refused(&format!("second,job,open\n0,1,1\n{row}\n"));
        assert!(
            matches!(&e, TraceError::Line {
                line: 3,
                kind: TraceErrorKind::TooLarge { column: c, value: v, .. },
            } if *c == column && *v == value),
            "{row}: {e:?}"
        );
        assert!(
            e.to_string().contains(&format!("{column} `{value}`")),
            "{e}"
        );
    }
    // Together the jobs span at most MAX_ROWS seconds.
    let last = MAX_SECONDS - 1;
    let mut text = String::from("second,job,open\n");
    let jobs = MAX_ROWS / MAX_SECONDS;
    for job in 1..=jobs {
        text.push_str(&format!("{last},{job},1\n"));
    }
    assert_eq!(trace::read(text.as_bytes()).unwrap().len() as u64, jobs);
    text.push_str(&format!("0,{},1\n", jobs + 1));
    let e = refused(&text);
    assert!(
        matches!(
            &e,
            TraceError::Line {
                kind: TraceErrorKind::TooLarge {
                    column: "second",
                    value: 0,
                    max: 0
                },
                ..
            }
        ),
        "{e:?}"
    );
    // The largest accepted second and job still read.
    let ok = trace::read(format!("second,job,open\n{last},1,2\n0,{MAX_JOBS},1\n").as_bytes());
    let ok = ok.unwrap();
    assert_eq!(
        (ok[0].ops.len() as u64, ok.len() as u64),
        (MAX_SECONDS, MAX_JOBS)
    );
}
