//! Numbers at the edges of their types: demands, limits and weights that overflow when
//! multiplied or added, states with records near `i64::MAX`, capacities below one token.
//! Each case once hung, panicked or gave a job nothing it was owed.

use policies::adaptbf::{Adaptbf, AdaptbfState, JobEntry, MAX_RECORD};
use policies::{build, JobSnapshot, Policy};
use std::time::Duration;

fn job(id: u64, demand: f64, usage: f64) -> JobSnapshot {
    JobSnapshot::new(id, demand, usage)
}

/// `f` on another thread, or `None` if it gives no answer within `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

/// A job wanting 10³⁰⁸ ops/s over Δt = 10 s has a demand of inf tokens: its `DF`
/// (eq. 6) was inf/inf = NaN, counted as 0, and the 10¹¹ tokens were handed out one
/// per job per pass (~5·10¹⁰ passes). Saturated, it is simply the largest demand.
#[test]
fn adaptbf_overflowing_demand_is_answered_at_once_and_takes_the_surplus() {
    let mut greedy = job(2, 100.0, 1.0);
    greedy.wanted = Some(1e308);
    let jobs = vec![job(1, 100.0, 50.0), greedy.clone()];
    let r = within(10, move || Adaptbf::new(10.0).allocate(1e10, &jobs))
        .expect("adaptbf (Δt = 10 s, Max_R = 1e10) gave no answer in 10 s");
    assert!(r.iter().sum::<f64>() <= 1e10 && r[1] > 9e9, "{r:?}");
    // Job 1 used 50 ops/s (u ≤ 1): eq. (7) gives it about its demand, job 2 the rest.
    let r = Adaptbf::new(10.0).allocate(1e6, &[job(1, 100.0, 50.0), greedy]);
    assert!(r[0] <= 51.0 && r[0] >= 50.0, "{r:?}");
    assert_eq!(r.iter().sum::<f64>(), 1e6);
}

/// `Max_R` = 10³⁰⁰: a cycle's tokens used to be capped at i64::MAX / 4 and the records
/// overflowed `i64` in the second cycle (a panic in `simulate --max-rate 1e300`).
#[test]
fn adaptbf_at_an_absurd_max_rate_keeps_records_in_range() {
    let mut p = Adaptbf::new(1.0);
    for cycle in 0..40u64 {
        let jobs: Vec<JobSnapshot> = (1..=4)
            .map(|id| {
                let mut j = job(id, 0.0, 1.0);
                j.size = id as u32;
                j.wanted = Some(if (cycle + id) % 3 == 0 { 1.0 } else { 1e300 });
                j
            })
            .collect();
        let r = p.allocate(1e300, &jobs);
        assert!(r.iter().all(|x| x.is_finite() && *x >= 0.0), "{r:?}");
        assert!(r.iter().sum::<f64>() <= 1e300, "{r:?}");
        let st = p.current_state();
        assert!(
            st.jobs.iter().all(|e| e.record.abs() <= MAX_RECORD),
            "{st:?}"
        );
        assert_eq!(
            st.jobs.iter().map(|e| i128::from(e.record)).sum::<i128>(),
            0
        );
    }
}

fn entry(id: u64, record: i64) -> JobEntry {
    JobEntry {
        id,
        record,
        remainder: 0.0,
        allocated: 10,
    }
}

/// A state's records near i64::MAX made the write-off's sum (or `abs` of i64::MIN)
/// overflow: refused on load, naming the job and the value.
#[test]
fn adaptbf_refuses_a_state_with_records_out_of_range() {
    for (records, needle) in [
        (vec![i64::MAX, 1], "job 1: bad record 9223372036854775807"),
        (vec![1, i64::MIN], "job 2: bad record -9223372036854775808"),
        (vec![MAX_RECORD + 1, -MAX_RECORD - 1], "job 1: bad record"),
    ] {
        let state = AdaptbfState {
            jobs: records
                .iter()
                .enumerate()
                .map(|(i, &r)| entry(i as u64 + 1, r))
                .collect(),
        };
        let mut p = Adaptbf::new(1.0);
        let e = p
            .load_state(&serde_json::to_value(&state).unwrap())
            .expect_err("an out-of-range record was loaded");
        let e = e.to_string();
        assert!(e.contains(needle) && !e.contains('\n'), "{e}");
    }
    // In range, and not summing to zero (as after departures): loaded and balanced.
    let state = AdaptbfState {
        jobs: vec![entry(1, MAX_RECORD), entry(2, 5)],
    };
    let mut p = Adaptbf::new(1.0);
    p.load_state(&serde_json::to_value(&state).unwrap())
        .unwrap();
    p.allocate(100.0, &[job(1, 0.0, 10.0), job(2, 0.0, 10.0)]);
    assert_eq!(
        p.current_state().jobs.iter().map(|e| e.record).sum::<i64>(),
        0
    );
}

/// Max_R·Δt = 0.9 tokens: ⌊0.9⌋ = 0 gave every job 0 in every cycle.
#[test]
fn adaptbf_below_one_token_per_cycle_still_hands_out_max_r() {
    let mut p = Adaptbf::new(0.1);
    let jobs = [job(1, 0.0, 100.0), job(2, 0.0, 100.0)];
    let mut got = [0.0; 2];
    for _ in 0..10 {
        let r = p.allocate(9.0, &jobs);
        let sum: f64 = r.iter().sum();
        assert!((sum - 9.0).abs() < 1e-9, "{r:?}");
        got[0] += r[0];
        got[1] += r[1];
    }
    // One token a cycle, alternating by the remainders: half each.
    assert!((got[0] - got[1]).abs() <= 9.0 + 1e-9, "{got:?}");
}

/// MCKP with a `Max_R` below one operation: its unit was one operation, the capacity
/// ⌊0.5⌋ = 0 units, and every job got nothing.
#[test]
fn mckp_below_one_operation_still_hands_out_max_r() {
    let r = build("mckp")
        .unwrap()
        .allocate(0.5, &[job(1, 100.0, 100.0)]);
    assert!(r[0] > 0.0 && r[0] <= 0.5, "{r:?}");
    let r = build("mckp")
        .unwrap()
        .allocate(10.5, &[job(1, 100.0, 100.0)]);
    assert!(r[0] > 10.0 && r[0] <= 10.5, "{r:?}");
}

/// Size 0 (which `validate` accepts and the controller sends as 1) counted as no nodes
/// at all: the job got nothing while the other took everything.
#[test]
fn adaptbf_weights_a_job_of_size_zero_like_one_node() {
    let mut a = job(1, 0.0, 1000.0);
    a.size = 0;
    let mut b = job(2, 0.0, 1000.0);
    b.size = 5;
    let r = Adaptbf::new(1.0).allocate(600.0, &[a, b]);
    assert_eq!(r, vec![100.0, 500.0]);
}

/// Limits whose sum overflows to inf: the scale-down factor was cap / inf = 0.
#[test]
fn priority_scales_overflowing_limits_down_instead_of_to_zero() {
    let r = build("priority").unwrap().allocate(
        1000.0,
        &[job(1, 1e308, 1.0), job(2, 1e308, 1.0), job(3, 10.0, 5.0)],
    );
    let sum: f64 = r.iter().sum();
    assert!((sum - 1000.0).abs() < 1e-9, "{r:?}");
    assert!((r[0] - 500.0).abs() < 1e-9 && r[0] == r[1], "{r:?}");
}

/// STATIC at Max_R = f64::MAX: `units · unit` overflowed to inf, then inf · 0 = NaN.
#[test]
fn mckp_static_at_the_largest_max_rate_gives_finite_shares() {
    for spec in ["mckp-static:64,10", "mckp-size:10"] {
        let jobs: Vec<JobSnapshot> = (1..=3)
            .map(|id| {
                let mut j = job(id, 10.0, 10.0);
                j.size = 40;
                j
            })
            .collect();
        let r = build(spec).unwrap().allocate(f64::MAX, &jobs);
        assert!(r.iter().all(|x| x.is_finite() && *x > 0.0), "{spec}: {r:?}");
        assert!(r.iter().sum::<f64>() <= f64::MAX, "{spec}: {r:?}");
    }
}

/// Weights 10¹⁷ apart: `(1 + 10¹⁷) − 10¹⁷` is 0, so the level dropped to 0 with 990
/// of 1 000 left and job 1 got nothing (`psharing` promises Σ = Max_R).
#[test]
fn weighted_water_filling_keeps_a_small_weight_next_to_a_huge_one() {
    let mut a = job(1, 100.0, 100.0);
    a.priority = 1.0;
    let mut b = job(2, 10.0, 10.0);
    b.priority = 1e17;
    let r = build("psharing:weighted")
        .unwrap()
        .allocate(1000.0, &[a, b]);
    assert!((r.iter().sum::<f64>() - 1000.0).abs() < 1e-6, "{r:?}");
    assert!(r[0] >= 100.0 && r[1] >= 10.0, "{r:?}");
}

/// Two weights of 10³⁰⁸ (priorities above [`policies::MAX_PRIORITY`] are refused at
/// every boundary, but a policy must not rely on it): their sum overflowed to inf and
/// each job's share of Max_R was 0.
#[test]
fn two_huge_weights_still_share_max_r() {
    for spec in [
        "priority-fair",
        "psharing:weighted",
        "themis:priority",
        "themis:user,priority",
    ] {
        let jobs: Vec<JobSnapshot> = (1..=2)
            .map(|id| JobSnapshot {
                priority: 1e308,
                ..job(id, 1000.0, 1000.0)
            })
            .collect();
        let r = build(spec).unwrap().allocate(1000.0, &jobs);
        assert_eq!(r, [500.0, 500.0], "{spec}");
    }
}

/// A demand of 10³⁰⁸: its levels `d·k/4` overflowed to inf, counted as a free option
/// worth its utility, and the job was "given" 0; a level above Max_R is no option at all.
#[test]
fn mckp_offers_a_huge_demand_levels_within_max_r() {
    let r = build("mckp")
        .unwrap()
        .allocate(1000.0, &[job(1, 1e308, 1.0), job(2, 10.0, 5.0)]);
    assert!(r[0] > 0.0 && r[1] >= 5.0, "{r:?}");
    assert!(r.iter().sum::<f64>() <= 1000.0, "{r:?}");
}

/// `mckp:RESOLUTION` took any u32: 4 294 967 295 allocated 32 GB and aborted.
#[test]
fn mckp_resolution_is_bounded() {
    for spec in ["mckp:4294967295", "mckp:100001"] {
        let e = build(spec)
            .err()
            .expect("an unbounded resolution was built");
        let e = e.to_string();
        assert!(e.contains("resolution") && e.contains(&spec[5..]), "{e}");
    }
    assert_eq!(build("mckp:100000").unwrap().name(), "mckp:100000");
}

/// Many jobs at the largest resolution stay within the DP's memory budget: a coarser
/// quantum, not 10 000 × 100 001 bytes of choices.
#[test]
fn mckp_many_jobs_at_the_largest_resolution_answer_quickly() {
    let jobs: Vec<JobSnapshot> = (1..=10_000).map(|id| job(id, 10.0, 5.0)).collect();
    let r = within(60, move || {
        build("mckp:100000").unwrap().allocate(110_000.0, &jobs)
    })
    .expect("mckp:100000 over 10 000 jobs gave no answer in 60 s");
    assert!(r.iter().sum::<f64>() <= 110_000.0 + 1e-6);
    assert!(r.iter().all(|x| x.is_finite() && *x >= 0.0));
    // Coarser quanta (≈ 16 ops/s) still serve most of the 10 000 jobs' 5 ops/s of need.
    let served: f64 = r.iter().map(|x| x.min(5.0)).sum();
    assert!(served > 0.5 * 50_000.0, "{served}");
}

/// A priority of 1e-320 (finite and > 0: valid) made a job's cap and the water level
/// both inf / weight = inf, and `inf <= inf` gave the job its whole demand, ten times
/// `Max_R`; beside a job of priority 1 too.
#[test]
fn a_tiny_priority_never_takes_more_than_max_r() {
    let mut tiny = job(1, 1000.0, 1000.0);
    tiny.priority = 1e-320;
    let mut other = job(2, 1000.0, 1000.0);
    other.priority = 1.0;
    for spec in ["psharing:weighted", "priority-fair", "themis:priority"] {
        for jobs in [vec![tiny.clone()], vec![tiny.clone(), other.clone()]] {
            let out = build(spec).unwrap().allocate(100.0, &jobs);
            let sum: f64 = out.iter().sum();
            assert!(
                (99.0..=100.0 * (1.0 + 1e-9)).contains(&sum),
                "{spec}: {out:?} against Max_R 100"
            );
        }
    }
}
