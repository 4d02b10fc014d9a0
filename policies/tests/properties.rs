//! Property tests for every policy (proptest).

use policies::adaptbf::{Adaptbf, AdaptbfState, RHO_BOUND};
use policies::themis::{ideal_shares, parse_levels};
use policies::{build, JobSnapshot, Policy, RateOption};
use proptest::prelude::*;

/// Every policy spec the properties run on (baseline is excluded: it is unlimited).
const SPECS: &[&str] = &[
    "uniform",
    "uniform:3",
    "priority",
    "psharing",
    "psharing:weighted",
    "psfa",
    "psfa:0",
    "psfa:1",
    "adaptbf",
    "adaptbf:0.1",
    "job-fair",
    "size-fair",
    "user-fair",
    "priority-fair",
    "group-fair",
    "themis:group,user,size",
    "themis:user,priority",
    "drf",
    "drf:5000",
    "mckp:200",
    "mckp-static:64,10",
    "mckp-size:10",
];

fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        12 => 0.0..2000.0f64,
        4 => Just(0.0),
        4 => 0.0..5.0f64,
        // Near f64::MAX: products and sums overflow to inf.
        1 => 1e300..f64::MAX,
    ]
}

fn job() -> impl Strategy<Value = JobSnapshot> {
    (
        (0u32..3, 0u32..4, 1u32..9, 0.1..10.0f64),
        (
            rate(),
            rate(),
            proptest::option::of(rate()),
            proptest::option::of(rate()),
            rate(),
        ),
        proptest::collection::vec((rate(), rate()), 0..4),
    )
        .prop_map(
            |((group, user, size, priority), (demand, usage, wanted, limit, data), opts)| {
                let mut j = JobSnapshot::new(0, demand, usage);
                j.group = group;
                j.user = user + 10 * group;
                j.size = size;
                j.priority = priority;
                // Finite (as `validate` requires): near f64::MAX the sum would be inf.
                j.wanted = wanted.map(|w| (w + usage).min(f64::MAX));
                j.limit = limit;
                j.data_demand = data;
                j.options = opts
                    .into_iter()
                    .map(|(rate, utility)| RateOption { rate, utility })
                    .collect();
                j
            },
        )
}

fn jobs() -> impl Strategy<Value = Vec<JobSnapshot>> {
    proptest::collection::vec(job(), 0..12).prop_map(|mut v| {
        for (i, j) in v.iter_mut().enumerate() {
            j.id = i as u64 + 1;
        }
        v
    })
}

fn capacity() -> impl Strategy<Value = f64> {
    prop_oneof![
        2 => Just(0.0),
        2 => 1.0..50.0f64,
        8 => 50.0..20_000.0f64,
        // Beyond 2⁵³ tokens a cycle, and up to f64::MAX.
        1 => 1e15..1e300f64,
    ]
}

/// AdapTBF's tokens per cycle and the operations a token is worth: `⌊Max_R·Δt⌋` of
/// one, or one of `Max_R·Δt` when that is below one.
fn adaptbf_tokens(max: f64, dt: f64) -> (i64, f64) {
    let quota = max * dt;
    if quota > 0.0 && quota < 1.0 {
        (1, quota)
    } else {
        (quota.floor() as i64, 1.0)
    }
}

fn tol(max: f64) -> f64 {
    1e-9 * max.max(1.0) + 1e-9
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn rates_are_valid_and_within_capacity(jobs in jobs(), max in capacity()) {
        for spec in SPECS {
            let mut p = build(spec).unwrap();
            let r = p.allocate(max, &jobs);
            prop_assert_eq!(r.len(), jobs.len(), "{}", spec);
            for x in &r {
                prop_assert!(x.is_finite() && *x >= 0.0, "{}: {:?}", spec, r);
            }
            let sum: f64 = r.iter().sum();
            prop_assert!(sum <= max + tol(max), "{}: sum {} > {}", spec, sum, max);
        }
    }

    #[test]
    fn deterministic(jobs in jobs(), max in capacity()) {
        for spec in SPECS {
            let a = build(spec).unwrap().allocate(max, &jobs);
            let b = build(spec).unwrap().allocate(max, &jobs);
            prop_assert_eq!(a, b, "{}", spec);
        }
    }

    #[test]
    fn work_conserving_policies_hand_out_all_of_max_r(jobs in jobs(), max in capacity()) {
        prop_assume!(!jobs.is_empty());
        for spec in ["psharing", "psfa", "psfa:0", "job-fair", "size-fair", "themis:group,user,size"] {
            let r = build(spec).unwrap().allocate(max, &jobs);
            let sum: f64 = r.iter().sum();
            prop_assert!((sum - max).abs() <= tol(max) * 10.0, "{}: {} vs {}", spec, sum, max);
        }
    }

    #[test]
    fn psharing_is_max_min_fair_over_demands(jobs in jobs(), max in capacity()) {
        // PADLL §IV-B: plain max-min ("equal shares"), whatever the jobs' priorities
        // (they are random here; issue 10: they used to weight the shares silently).
        let r = build("psharing").unwrap().allocate(max, &jobs);
        let total_demand: f64 = jobs.iter().map(|j| j.demand).sum();
        for (i, j) in jobs.iter().enumerate() {
            // Every job gets at least min(demand, equal share).
            let floor = j.demand.min(max / jobs.len() as f64);
            prop_assert!(r[i] + tol(max) >= floor);
            if total_demand >= max {
                // Over-subscribed: no job above its demand, and an unsatisfied job is
                // never below anyone else.
                prop_assert!(r[i] <= j.demand + tol(max));
                if r[i] + tol(max) < j.demand {
                    for x in &r {
                        prop_assert!(r[i] + tol(max) * 10.0 >= *x, "{:?}", r);
                    }
                }
            } else {
                prop_assert!(r[i] + tol(max) >= j.demand);
            }
        }
    }

    #[test]
    fn psharing_weighted_is_weighted_max_min(jobs in jobs(), max in capacity()) {
        // `psharing:weighted`: over-subscribed, an unsatisfied job's rate per unit of
        // priority is at least every other job's; nobody above its demand.
        let r = build("psharing:weighted").unwrap().allocate(max, &jobs);
        let total_demand: f64 = jobs.iter().map(|j| j.demand).sum();
        prop_assume!(total_demand >= max);
        for (i, j) in jobs.iter().enumerate() {
            prop_assert!(r[i] <= j.demand + tol(max));
            if r[i] + tol(max) * 10.0 < j.demand {
                for (k, o) in jobs.iter().enumerate() {
                    prop_assert!(r[i] / j.priority + tol(max) * 10.0 >= r[k] / o.priority, "{:?}", r);
                }
            }
        }
    }

    #[test]
    fn psfa_keeps_busy_jobs_at_least_their_capped_demand(jobs in jobs(), max in capacity()) {
        // A job using more than its demand gets min(demand, its fair share at its turn) ≥
        // min(demand, Max_R / Active) — jobs ahead of it take at most their fair share.
        let r = build("psfa").unwrap().allocate(max, &jobs);
        for (i, j) in jobs.iter().enumerate() {
            if j.usage > j.demand {
                prop_assert!(r[i] + tol(max) >= j.demand.min(max / jobs.len() as f64));
            }
        }
    }

    #[test]
    fn themis_gives_each_job_min_of_need_and_fair_share(jobs in jobs(), max in capacity()) {
        for spec in ["job-fair", "size-fair", "user-fair", "group,user,size"] {
            let levels = parse_levels(spec.trim_end_matches("-fair")).unwrap();
            let ideal = ideal_shares(&levels, &jobs);
            let name = if spec.contains(',') { format!("themis:{spec}") } else { spec.to_string() };
            let r = build(&name).unwrap().allocate(max, &jobs);
            for (i, j) in jobs.iter().enumerate() {
                prop_assert!(r[i] + tol(max) * 10.0 >= j.need().min(ideal[i] * max), "{}: {:?}", spec, r);
            }
        }
    }

    #[test]
    fn drf_respects_both_demands_and_capacities(jobs in jobs(), max in capacity(), data in 1.0..10_000.0f64) {
        let mut p = policies::drf::Drf::new(data);
        let r = p.allocate(max, &jobs);
        let d = p.data_rates().to_vec();
        prop_assert!(d.iter().sum::<f64>() <= data + tol(data));
        for (i, j) in jobs.iter().enumerate() {
            prop_assert!(r[i] <= j.demand + tol(max));
            prop_assert!(d[i] <= j.data_demand + tol(data));
        }
        // Pareto efficiency: if some job is below its demand, some resource it uses is full.
        let used_m: f64 = r.iter().sum();
        let used_d: f64 = d.iter().sum();
        for (i, j) in jobs.iter().enumerate() {
            if r[i] + 1e-6 * j.demand.max(1.0) < j.demand {
                let m_full = used_m >= max - 1e-6 * max.max(1.0);
                let d_full = j.data_demand > 0.0 && used_d >= data - 1e-6 * data.max(1.0);
                prop_assert!(m_full || d_full, "job {} starved: {:?} / {:?}", i, r, d);
            }
        }
    }

    #[test]
    fn mckp_picks_one_option_per_job(jobs in jobs(), max in 1.0..200.0f64) {
        // Resolution ≥ Max_R: quanta of 1, so the choice is one of the options exactly.
        let r = build("mckp:1000").unwrap().allocate(max, &jobs);
        let sum: f64 = r.iter().sum();
        prop_assert!(sum <= max + tol(max));
        for (i, j) in jobs.iter().enumerate() {
            if j.options.is_empty() { continue; }
            let min: f64 = j.options.iter().map(|o| o.rate).fold(f64::INFINITY, f64::min);
            let feasible: f64 = jobs.iter().map(|j| j.options.iter().map(|o| o.rate.ceil()).fold(f64::INFINITY, f64::min)).filter(|x| x.is_finite()).sum();
            if feasible <= max.floor() {
                prop_assert!(j.options.iter().any(|o| o.rate == r[i]), "job {}: {} not an option", i, r[i]);
            } else {
                prop_assert!(r[i] <= min + 1e-9);
            }
        }
    }

    #[test]
    fn adaptbf_invariants_over_cycles(
        cycles in proptest::collection::vec((jobs(), 1.0..5_000.0f64), 1..8),
    ) {
        let mut p = Adaptbf::new(1.0);
        for (jobs, max) in cycles {
            let r = p.allocate(max, &jobs);
            let sum: f64 = r.iter().sum();
            if jobs.iter().any(|j| j.need() > 0.0) {
                // Each cycle distributes exactly its whole number of tokens …
                prop_assert_eq!(sum, max.floor());
            } else {
                // … to the jobs that did I/O (AdapTBF §III-C1); none did: none given.
                prop_assert_eq!(sum, 0.0);
            }
            let st = p.current_state();
            prop_assert_eq!(st.jobs.len(), jobs.len());
            prop_assert_eq!(st.jobs.iter().map(|e| e.record).sum::<i64>(), 0);
            for e in &st.jobs {
                prop_assert!(e.remainder.abs() <= RHO_BOUND, "{:?}", e);
            }
            for x in &r {
                prop_assert!(*x == x.floor());
            }
        }
    }

    /// Chained cycles over a fixed set of jobs that go idle and come back (state fed
    /// back through JSON, as `policies allocate` does): an idle job gets 0 and its record
    /// and remainder do not move (it earns no credit and pays no debt); active jobs share
    /// exactly the cycle's tokens; records always sum to zero.
    #[test]
    fn adaptbf_idle_jobs_get_nothing_and_earn_no_credit(
        sizes in proptest::collection::vec(1u32..9, 1..6),
        pattern in proptest::collection::vec(proptest::collection::vec(
            prop_oneof![2 => Just(0.0), 1 => 0.5..40.0f64, 2 => Just(1e9)], 6), 1..40),
        max in prop_oneof![1.0..20.0f64, 20.0..5_000.0f64],
        dt in prop_oneof![Just(1.0), Just(0.1), Just(0.5)],
    ) {
        let mut p = Adaptbf::new(dt);
        let mut prev: Option<AdaptbfState> = None;
        for needs in &pattern {
            let jobs: Vec<JobSnapshot> = sizes.iter().enumerate().map(|(i, &n)| {
                let mut j = JobSnapshot::new(i as u64 + 1, 0.0, 0.0);
                j.size = n;
                j.wanted = Some(needs[i]);
                j
            }).collect();
            let r = p.allocate(max, &jobs);
            let (total, token) = adaptbf_tokens(max, dt);
            let tokens: Vec<i64> = r.iter().map(|x| (x * dt / token).round() as i64).collect();
            let st = p.current_state().clone();
            let any_active = needs[..jobs.len()].iter().any(|&d| d > 0.0);
            prop_assert_eq!(tokens.iter().sum::<i64>(), if any_active { total } else { 0 });
            prop_assert_eq!(st.jobs.iter().map(|e| e.record).sum::<i64>(), 0);
            for (k, j) in jobs.iter().enumerate() {
                if j.need() == 0.0 {
                    prop_assert_eq!(r[k], 0.0, "idle job {} got {:?}", j.id, r);
                    let before = prev.as_ref().and_then(|s| s.jobs.iter().find(|e| e.id == j.id));
                    let (rec, rho) = before.map_or((0, 0.0), |e| (e.record, e.remainder));
                    prop_assert_eq!(st.jobs[k].record, rec, "idle job {} earned credit", j.id);
                    prop_assert_eq!(st.jobs[k].remainder, rho);
                }
            }
            // Chain through JSON.
            let text = serde_json::to_string(&p.state()).unwrap();
            p = Adaptbf::new(dt);
            p.load_state(&serde_json::from_str(&text).unwrap()).unwrap();
            let _ = st;
            prev = Some(p.current_state().clone());
        }
    }

    /// §III-C4 "jobs receive their fair share over time": saturated jobs with fixed node
    /// counts get, after any number of cycles, their priority share of all the tokens
    /// handed out so far within one token (the rounding never costs a job credit).
    #[test]
    fn adaptbf_saturated_jobs_converge_to_priority_shares(
        sizes in proptest::collection::vec(1u32..12, 1..7),
        max in prop_oneof![1.0..30.0f64, 30.0..3_000.0f64],
        dt in prop_oneof![Just(1.0), Just(0.1), Just(0.25)],
        cycles in 1usize..300,
    ) {
        let jobs: Vec<JobSnapshot> = sizes.iter().enumerate().map(|(i, &n)| {
            let mut j = JobSnapshot::new(i as u64 + 1, 0.0, 1e12);
            j.size = n;
            j
        }).collect();
        let nodes: f64 = sizes.iter().map(|&n| n as f64).sum();
        let (total, token) = adaptbf_tokens(max, dt);
        let total = total as f64;
        let mut p = Adaptbf::new(dt);
        let mut cum = vec![0i64; jobs.len()];
        for t in 1..=cycles {
            let r = p.allocate(max, &jobs);
            for (c, x) in cum.iter_mut().zip(&r) {
                *c += (x * dt / token).round() as i64;
            }
            for (k, &n) in sizes.iter().enumerate() {
                let ideal = t as f64 * total * n as f64 / nodes;
                prop_assert!((cum[k] as f64 - ideal).abs() < 1.0 + 1e-6,
                    "cycle {}: job {} has {} tokens, its share is {}", t, k + 1, cum[k], ideal);
            }
        }
    }

    /// Saturated jobs that go idle and come back (no surplus, so no lending): over the
    /// whole run, each job's tokens are the sum, over the cycles it was active, of its
    /// priority share among the jobs active then (eq. 1), within two tokens (the
    /// remainder it carries, < 1, plus the one it may carry into an idle phase).
    #[test]
    fn adaptbf_shares_converge_with_idle_phases(
        sizes in proptest::collection::vec(1u32..9, 1..6),
        pattern in proptest::collection::vec(proptest::collection::vec(
            prop_oneof![1 => Just(false), 3 => Just(true)], 6), 1..200),
        max in prop_oneof![1.0..20.0f64, 20.0..500.0f64],
    ) {
        let mut p = Adaptbf::new(1.0);
        let total = max.floor();
        let mut cum = vec![0.0; sizes.len()];
        let mut ideal = vec![0.0; sizes.len()];
        for active in &pattern {
            let jobs: Vec<JobSnapshot> = sizes.iter().enumerate().map(|(i, &n)| {
                let mut j = JobSnapshot::new(i as u64 + 1, 0.0, 0.0);
                j.size = n;
                j.wanted = Some(if active[i] { 1e12 } else { 0.0 });
                j
            }).collect();
            let r = p.allocate(max, &jobs);
            let nodes: f64 = sizes.iter().zip(active).filter(|(_, &a)| a).map(|(&n, _)| n as f64).sum();
            for (k, &n) in sizes.iter().enumerate() {
                cum[k] += r[k];
                if active[k] {
                    ideal[k] += total * n as f64 / nodes;
                } else {
                    prop_assert_eq!(r[k], 0.0);
                }
                prop_assert!((cum[k] - ideal[k]).abs() < 2.0 + 1e-6,
                    "job {}: {} tokens, share {}", k + 1, cum[k], ideal[k]);
            }
            prop_assert!(p.current_state().jobs.iter().all(|e| e.record == 0));
        }
    }

    #[test]
    fn adaptbf_state_chaining_is_deterministic(
        cycles in proptest::collection::vec(jobs(), 1..5),
    ) {
        let mut a = Adaptbf::new(1.0);
        let mut b = Adaptbf::new(1.0);
        for jobs in cycles {
            let ra = a.allocate(1000.0, &jobs);
            let rb = b.allocate(1000.0, &jobs);
            prop_assert_eq!(ra, rb);
            let s = serde_json::to_string(&b.state()).unwrap();
            b = Adaptbf::new(1.0);
            b.load_state(&serde_json::from_str(&s).unwrap()).unwrap();
        }
    }
}

// Brute-force checks on small inputs: more cases (each is cheap).
proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// MCKP (arbitration paper §3.1, eq. 1) against brute force on small integer
    /// instances: the DP's choice is feasible and as good as the best of all
    /// `Π N_i` combinations; `None` exactly when no combination fits. Through the
    /// policy (quanta of 1 since `Max_R` ≤ resolution) the rates' utility is the same.
    #[test]
    fn mckp_matches_brute_force(
        classes in proptest::collection::vec(
            proptest::collection::vec((0usize..8, 0u32..100), 1..4), 1..5),
        cap in 0usize..20,
    ) {
        let classes: Vec<Vec<(usize, f64)>> = classes.into_iter()
            .map(|c| c.into_iter().map(|(w, v)| (w, v as f64 / 4.0)).collect()).collect();
        // Brute force over every combination.
        let mut best: Option<f64> = None;
        let mut pick = vec![0usize; classes.len()];
        loop {
            let w: usize = pick.iter().zip(&classes).map(|(&o, c)| c[o].0).sum();
            let v: f64 = pick.iter().zip(&classes).map(|(&o, c)| c[o].1).sum();
            if w <= cap && best.is_none_or(|b| v > b) {
                best = Some(v);
            }
            let mut k = 0;
            while k < pick.len() {
                pick[k] += 1;
                if pick[k] < classes[k].len() { break; }
                pick[k] = 0;
                k += 1;
            }
            if k == pick.len() { break; }
        }
        let got = policies::mckp::solve(cap, &classes);
        match (best, &got) {
            (None, None) => {}
            (Some(b), Some(p)) => {
                let w: usize = p.iter().zip(&classes).map(|(&o, c)| c[o].0).sum();
                let v: f64 = p.iter().zip(&classes).map(|(&o, c)| c[o].1).sum();
                prop_assert!(w <= cap, "{:?} weighs {} > {}", p, w, cap);
                prop_assert!((v - b).abs() < 1e-9, "DP {} vs brute force {}", v, b);
            }
            _ => prop_assert!(false, "DP {:?} vs brute force {:?}", got, best),
        }
        if let Some(b) = best {
            let jobs: Vec<JobSnapshot> = classes.iter().enumerate().map(|(i, c)| {
                let mut j = JobSnapshot::new(i as u64 + 1, 0.0, 0.0);
                j.options = c.iter().map(|&(w, u)| RateOption { rate: w as f64, utility: u }).collect();
                j
            }).collect();
            let r = build("mckp").unwrap().allocate(cap as f64, &jobs);
            prop_assert!(r.iter().sum::<f64>() <= cap as f64);
            let utility: f64 = r.iter().zip(&classes).map(|(&x, c)| {
                c.iter().filter(|o| o.0 as f64 == x).map(|o| o.1).fold(f64::NEG_INFINITY, f64::max)
            }).sum();
            prop_assert!((utility - b).abs() < 1e-9, "policy {:?}: {} vs {}", r, utility, b);
        }
    }

    /// DRF against brute force: among all feasible allocations on a grid of fractions
    /// (each job gets `f_j ∈ {0, 1/K, …, 1}` of its demand vector, both capacities
    /// respected), none has a lexicographically larger sorted vector of weighted
    /// dominant shares than DRF's (DRF is the max-min fair allocation of dominant shares,
    /// Ghodsi et al. §4).
    #[test]
    fn drf_is_leximin_optimal_against_brute_force(
        demands in proptest::collection::vec((1u32..100, 0u32..100, 1u32..4), 1..4),
        cap_m in 10u32..200,
        cap_d in 10u32..200,
    ) {
        let jobs: Vec<JobSnapshot> = demands.iter().enumerate().map(|(i, &(m, d, w))| {
            let mut j = JobSnapshot::new(i as u64 + 1, m as f64, 0.0);
            j.data_demand = d as f64;
            j.priority = w as f64;
            j
        }).collect();
        let (cm, cd) = (cap_m as f64, cap_d as f64);
        let mut p = policies::drf::Drf::new(cd);
        let r = p.allocate(cm, &jobs);
        let delta: Vec<f64> = jobs.iter().map(|j| (j.demand / cm).max(j.data_demand / cd)).collect();
        let shares = |f: &[f64]| -> Vec<f64> {
            let mut s: Vec<f64> = f.iter().zip(&delta).zip(&jobs).map(|((f, d), j)| f * d / j.priority).collect();
            s.sort_by(f64::total_cmp);
            s
        };
        let f_drf: Vec<f64> = r.iter().zip(&jobs).map(|(x, j)| x / j.demand).collect();
        let s_drf = shares(&f_drf);
        const K: usize = 24;
        let n = jobs.len();
        let mut idx = vec![0usize; n];
        loop {
            let f: Vec<f64> = idx.iter().map(|&k| k as f64 / K as f64).collect();
            let um: f64 = f.iter().zip(&jobs).map(|(f, j)| f * j.demand).sum();
            let ud: f64 = f.iter().zip(&jobs).map(|(f, j)| f * j.data_demand).sum();
            if um <= cm + 1e-9 && ud <= cd + 1e-9 {
                let s = shares(&f);
                for (a, b) in s_drf.iter().zip(&s) {
                    if *a > b + 1e-9 { break; }
                    prop_assert!(*a >= b - 1e-9, "grid {:?} beats DRF {:?}: {:?} vs {:?}", f, f_drf, s, s_drf);
                }
            }
            let mut k = 0;
            while k < n {
                idx[k] += 1;
                if idx[k] <= K { break; }
                idx[k] = 0;
                k += 1;
            }
            if k == n { break; }
        }
    }
}
