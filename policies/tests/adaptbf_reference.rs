//! AdapTBF §III-C (eqs. 1–25) read again, plainly, and compared with `Adaptbf` on
//! seeded random chained cycles; and the re-compensation of one such cycle by hand.
//!
//! The reference below does not call the implementation: it is the paper's equations
//! one by one, with the clarifications documented in `policies/README.md` where the
//! paper leaves a choice (observed demand `d = wanted·Δt`, whole surplus tokens,
//! `α^{t−1}` of a job idle in the previous cycle, the extra bounds of eq. (14) and how a
//! capped reclaim is shared, which job loses an excess token). The implementation only
//! shows its final allocations and its state; the step values are recovered from them:
//! a job's record moves by exactly the tokens it gave (+) or received (−) in steps 2–3,
//! so `α = α_RC + (r_RC − r)` (eq. 2), a borrower gave `α_RD − α_RC` (eq. 14) and a
//! lender received `α_RC − α_RD` (eq. 19).

use policies::adaptbf::{Adaptbf, AdaptbfState, JobEntry};
use policies::trace::Rng;
use policies::{JobSnapshot, Policy};

/// What the reference computes for one active job in one cycle.
#[derive(Debug, Clone, Copy, Default)]
struct Step {
    alpha: i64,
    alpha_rd: i64,
    alpha_rc: i64,
    record: i64,
    record_rc: i64,
    /// eq. (14): tokens reclaimed from a borrower.
    reclaimed: i64,
    /// eq. (19): tokens given back to a lender, and its real share `DF/ΣDF·T_R`.
    repaid: i64,
    repaid_exact: f64,
    lender: bool,
    borrower: bool,
}

/// §III-C4: floor `raw + ρ` (eq. 23), carry the rest (eq. 24), then give a missing
/// token to the largest remainder or take an excess one from the smallest, one token at
/// a time, adjusting the remainder with it, until the step hands out exactly `total`.
/// Ties: lower id first. A job is never taken below zero tokens; `|ρ| ≤ 1`.
fn apportion(total: i64, raw: &[f64], rho: &mut [f64], ids: &[u64]) -> Vec<i64> {
    let mut tokens: Vec<i64> = Vec::with_capacity(raw.len());
    for (r, p) in raw.iter().zip(rho.iter_mut()) {
        let v = r + *p;
        let a = v.floor().max(0.0);
        *p = v - a;
        tokens.push(a as i64);
    }
    let mut missing = total - tokens.iter().sum::<i64>();
    while missing != 0 {
        let candidates = (0..raw.len()).filter(|&k| missing > 0 || tokens[k] > 0);
        let pick = if missing > 0 {
            candidates.max_by(|&a, &b| rho[a].total_cmp(&rho[b]).then(ids[b].cmp(&ids[a])))
        } else {
            candidates.min_by(|&a, &b| rho[a].total_cmp(&rho[b]).then(ids[a].cmp(&ids[b])))
        };
        let Some(k) = pick else { break };
        let one = missing.signum();
        tokens[k] += one;
        rho[k] -= one as f64;
        missing -= one;
    }
    for p in rho.iter_mut() {
        *p = p.clamp(-1.0, 1.0);
    }
    tokens
}

/// One AdapTBF cycle of `total` (= ⌊T·Δt⌋) tokens by the paper: `prev` is the state
/// after the previous cycle, `jobs` are `(id, nodes, observed demand in tokens)`.
/// Returns the steps of each job, in `jobs` order (`None` for an idle one).
fn reference(total: i64, prev: &AdaptbfState, jobs: &[(u64, u32, f64)]) -> Vec<Option<Step>> {
    let entry = |id| prev.jobs.iter().find(|e| e.id == id).copied();
    let active: Vec<usize> = (0..jobs.len()).filter(|&k| jobs[k].2 > 0.0).collect();
    let ids: Vec<u64> = active.iter().map(|&k| jobs[k].0).collect();
    let d: Vec<f64> = active.iter().map(|&k| jobs[k].2).collect();
    let mut rho: Vec<f64> = ids
        .iter()
        .map(|&id| entry(id).map_or(0.0, |e| e.remainder))
        .collect();
    let record: Vec<i64> = ids
        .iter()
        .map(|&id| entry(id).map_or(0, |e| e.record))
        .collect();
    let n = active.len();
    if n == 0 {
        return vec![None; jobs.len()];
    }

    // eq. (1): p_x = n_x / Σ n over the active jobs.
    let nodes: f64 = active.iter().map(|&k| jobs[k].1 as f64).sum();
    let p: Vec<f64> = active.iter().map(|&k| jobs[k].1 as f64 / nodes).collect();
    // eq. (2): α_x = T·p_x·Δt, whole tokens with remainders (eqs. 23–25).
    let raw: Vec<f64> = p.iter().map(|p| total as f64 * p).collect();
    let alpha = apportion(total, &raw, &mut rho, &ids);

    // eq. (3): u_x = d_x / α_x^{t−1}; a job idle in the previous cycle (α^{t−1} = 0)
    // or new is measured against its current allocation; a zero denominator is 1.
    let u: Vec<f64> = (0..n)
        .map(|i| {
            let before = entry(ids[i]).map_or(0, |e| e.allocated as i64);
            let denominator = if before > 0 { before } else { alpha[i] };
            d[i] / denominator.max(1) as f64
        })
        .collect();
    // eq. (4): surplus, whole tokens; eq. (5): their total.
    let ts_x: Vec<i64> = (0..n)
        .map(|i| {
            if alpha[i] as f64 > d[i] {
                (alpha[i] as f64 - d[i]).floor() as i64
            } else {
                0
            }
        })
        .collect();
    let ts: i64 = ts_x.iter().sum();
    // eq. (6): distribution factor.
    let df: Vec<f64> = (0..n)
        .map(|i| {
            if u[i] > 1.0 {
                u[i] + u[i] * p[i]
            } else {
                u[i] * p[i]
            }
        })
        .collect();
    let df_sum: f64 = df.iter().sum();
    // eqs. (7)–(8).
    let mut alpha_rd = alpha.clone();
    let mut record_rd = record.clone();
    if ts > 0 {
        let share = if df_sum > 0.0 {
            let raw: Vec<f64> = df.iter().map(|f| f / df_sum * ts as f64).collect();
            apportion(ts, &raw, &mut rho, &ids)
        } else {
            ts_x.clone()
        };
        for i in 0..n {
            alpha_rd[i] = alpha[i] - ts_x[i] + share[i];
            record_rd[i] = record[i] + ts_x[i] - share[i];
        }
    }

    // eqs. (9)–(10).
    let lender: Vec<bool> = (0..n).map(|i| record[i] > 0 && record_rd[i] > 0).collect();
    let borrower: Vec<bool> = (0..n).map(|i| record[i] < 0 && record_rd[i] < 0).collect();
    // eqs. (12)–(13): one coefficient for the step.
    // C = Σ n_x·(max(1, u) + max(0, 1 − ū)) / (2 Σ n): node counts are integers, so
    // the product with α_RD is exact whenever the utilization terms are.
    let c_nodes: f64 = (0..n)
        .filter(|&i| lender[i])
        .map(|i| {
            let u_next = if alpha_rd[i] > 0 {
                d[i] / alpha_rd[i] as f64
            } else {
                f64::INFINITY
            };
            jobs[active[i]].1 as f64 * (u[i].max(1.0) + (1.0 - u_next).max(0.0))
        })
        .sum();
    // eq. (14) with the documented bounds: also ≤ |r_RD| and ≤ α_RD.
    let mut reclaimed = vec![0i64; n];
    for i in (0..n).filter(|&i| borrower[i]) {
        let by_c = (c_nodes * alpha_rd[i] as f64 / (2.0 * nodes)).floor() as i64;
        reclaimed[i] = by_c
            .min(record[i].abs())
            .min(record_rd[i].abs())
            .min(alpha_rd[i])
            .max(0);
    }
    // No more than the lenders are owed in total: if the borrowers would give more,
    // each gives the same fraction of its T_R^x (whole tokens, largest remainder).
    let owed: i64 = (0..n).filter(|&i| lender[i]).map(|i| record_rd[i]).sum();
    let asked: i64 = reclaimed.iter().sum();
    if asked > owed {
        let exact: Vec<f64> = reclaimed
            .iter()
            .map(|&r| (owed * r) as f64 / asked as f64)
            .collect();
        for i in 0..n {
            reclaimed[i] = exact[i].floor() as i64;
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| {
            let fraction = |i: usize| exact[i] - exact[i].floor();
            fraction(b)
                .total_cmp(&fraction(a))
                .then(ids[a].cmp(&ids[b]))
        });
        let short = owed - reclaimed.iter().sum::<i64>();
        for &i in order.iter().take(short.max(0) as usize) {
            reclaimed[i] += 1;
        }
    }
    // eq. (17).
    let tr: i64 = reclaimed.iter().sum();
    // eqs. (18)–(20): T_R shared among J+ by DF.
    let lenders_df: f64 = (0..n).filter(|&i| lender[i]).map(|i| df[i]).sum();
    let mut repaid_exact = vec![0.0; n];
    let mut repaid = vec![0i64; n];
    if tr > 0 {
        let lenders: Vec<usize> = (0..n).filter(|&i| lender[i]).collect();
        for &i in &lenders {
            repaid_exact[i] = df[i] / lenders_df * tr as f64;
        }
        let raw: Vec<f64> = lenders.iter().map(|&i| repaid_exact[i]).collect();
        let mut lender_rho: Vec<f64> = lenders.iter().map(|&i| rho[i]).collect();
        let lender_ids: Vec<u64> = lenders.iter().map(|&i| ids[i]).collect();
        let given = apportion(tr, &raw, &mut lender_rho, &lender_ids);
        for (k, &i) in lenders.iter().enumerate() {
            repaid[i] = given[k];
        }
    }

    let mut out = vec![None; jobs.len()];
    for (i, &k) in active.iter().enumerate() {
        out[k] = Some(Step {
            alpha: alpha[i],
            alpha_rd: alpha_rd[i],
            alpha_rc: alpha_rd[i] - reclaimed[i] + repaid[i],
            record: record[i],
            record_rc: record_rd[i] + reclaimed[i] - repaid[i],
            reclaimed: reclaimed[i],
            repaid: repaid[i],
            repaid_exact: repaid_exact[i],
            lender: lender[i],
            borrower: borrower[i],
        });
    }
    out
}

/// How many cycles (of those where the check applies) agreed, per check.
#[derive(Debug, Default)]
struct Agreement {
    cycles: usize,
    /// Cycles in which no job did I/O: eq. (2) then allocates nothing (§III-C1).
    no_active_job: usize,
    eq2: usize,
    eq14_cycles: usize,
    eq14: usize,
    eq19_cycles: usize,
    eq19: usize,
    conserved: usize,
}

fn job(id: u64, size: u32, usage: f64, wanted: f64) -> JobSnapshot {
    let mut j = JobSnapshot::new(id, 0.0, usage);
    j.size = size;
    j.wanted = Some(wanted);
    j
}

/// Run one cycle of `p` and compare its rates and state with the reference's.
fn run_and_compare(
    seen: &mut Agreement,
    failures: &mut Vec<String>,
    cycle: &str,
    p: &mut Adaptbf,
    max_rate: f64,
    jobs: &[JobSnapshot],
) {
    let dt = p.interval;
    let total = (max_rate * dt).floor() as i64;
    let before = p.current_state().clone();
    let rates = p.allocate(max_rate, jobs);
    let after = p.current_state();
    let input: Vec<(u64, u32, f64)> = jobs.iter().map(|j| (j.id, j.size, j.need() * dt)).collect();
    let steps = reference(total, &before, &input);
    let tokens: Vec<i64> = rates.iter().map(|r| (r * dt).round() as i64).collect();
    let mut fail = |what: &str, detail: String| failures.push(format!("{cycle}: {what}: {detail}"));
    seen.cycles += 1;
    if steps.iter().all(Option::is_none) {
        seen.no_active_job += 1;
    }

    // eq. (2): the initial allocations implied by the outputs are the reference's, and
    // sum to the cycle's tokens.
    let implied: Vec<i64> = steps
        .iter()
        .enumerate()
        .filter_map(|(k, s)| s.map(|s| tokens[k] + after.jobs[k].record - s.record))
        .collect();
    let expected: Vec<i64> = steps.iter().flatten().map(|s| s.alpha).collect();
    if implied == expected && (implied.is_empty() || implied.iter().sum::<i64>() == total) {
        seen.eq2 += 1;
    } else {
        fail(
            "eq. (2)",
            format!("implied {implied:?}, reference {expected:?}, T {total}"),
        );
    }

    // eq. (14): what each borrower gave back.
    let active = || {
        steps
            .iter()
            .enumerate()
            .filter_map(|(k, s)| s.map(|s| (k, s)))
    };
    if active().any(|(k, s)| s.borrower && (s.reclaimed > 0 || tokens[k] != s.alpha_rd)) {
        seen.eq14_cycles += 1;
        let got: Vec<i64> = active()
            .filter(|(_, s)| s.borrower)
            .map(|(k, s)| s.alpha_rd - tokens[k])
            .collect();
        let want: Vec<i64> = active()
            .filter(|(_, s)| s.borrower)
            .map(|(_, s)| s.reclaimed)
            .collect();
        if got == want {
            seen.eq14 += 1;
        } else {
            fail("eq. (14)", format!("reclaimed {got:?}, reference {want:?}"));
        }
    }

    // eq. (19): what each lender got back, and that it is its DF share of T_R within
    // the rounding (a step's whole tokens differ from the real share by < 2: the
    // remainder carried in and the one carried out are both in (−1, 1)).
    if active().any(|(k, s)| s.lender && (s.repaid > 0 || tokens[k] != s.alpha_rd)) {
        seen.eq19_cycles += 1;
        let got: Vec<i64> = active()
            .filter(|(_, s)| s.lender)
            .map(|(k, s)| tokens[k] - s.alpha_rd)
            .collect();
        let want: Vec<i64> = active()
            .filter(|(_, s)| s.lender)
            .map(|(_, s)| s.repaid)
            .collect();
        let exact: Vec<f64> = active()
            .filter(|(_, s)| s.lender)
            .map(|(_, s)| s.repaid_exact)
            .collect();
        let near = got
            .iter()
            .zip(&exact)
            .all(|(g, e)| (*g as f64 - e).abs() < 2.0);
        if got == want && near {
            seen.eq19 += 1;
        } else {
            fail(
                "eq. (19)",
                format!("repaid {got:?}, reference {want:?} (exact {exact:?})"),
            );
        }
    }

    // Conservation: the cycle hands out its tokens, records sum to zero, and every
    // active job's allocation and record are the reference's.
    let any_active = steps.iter().any(Option::is_some);
    let handed: i64 = tokens.iter().sum();
    let records: i64 = after.jobs.iter().map(|e| e.record).sum();
    let same =
        active().all(|(k, s)| tokens[k] == s.alpha_rc && after.jobs[k].record == s.record_rc);
    if handed == if any_active { total } else { 0 } && records == 0 && same {
        seen.conserved += 1;
    } else {
        fail(
            "conservation",
            format!("handed {handed} of {total}, records sum {records}, same {same}"),
        );
    }
}

#[test]
fn adaptbf_agrees_with_a_plain_reading_of_the_equations() {
    let mut seen = Agreement::default();
    let mut failures = Vec::new();
    for seed in 0..100u64 {
        let mut rng = Rng::new(seed);
        let n = 2 + (rng.next_u64() % 5) as usize;
        let sizes: Vec<u32> = (0..n).map(|_| 1 + (rng.next_u64() % 16) as u32).collect();
        let dt = [1.0, 1.0, 0.5, 0.1][(rng.next_u64() % 4) as usize];
        let mut p = Adaptbf::new(dt);
        for cycle in 0..30 {
            let max_rate = rng.range(5.0, 3_000.0).round();
            let nodes: u32 = sizes.iter().sum();
            let jobs: Vec<JobSnapshot> = (0..n)
                .map(|i| {
                    // Idle, a trickle, about its priority share (the reclaim coefficient
                    // then decides), or hungry; whole numbers of operations half the time.
                    let share = max_rate * sizes[i] as f64 / nodes as f64;
                    let wanted = match rng.next_u64() % 6 {
                        0 => 0.0,
                        1 => rng.range(0.0, 50.0),
                        2 | 3 => share * rng.range(0.3, 1.6),
                        _ => rng.range(0.0, 4.0 * max_rate),
                    };
                    let wanted = if rng.next_u64().is_multiple_of(2) {
                        wanted.round()
                    } else {
                        wanted
                    };
                    let usage = (wanted * rng.range(0.5, 1.0)).floor();
                    job(100 + i as u64, sizes[i], usage, wanted)
                })
                .collect();
            let name = format!("seed {seed} cycle {cycle}");
            run_and_compare(&mut seen, &mut failures, &name, &mut p, max_rate, &jobs);
        }
    }
    eprintln!("{seen:?}");
    for f in failures.iter().take(12) {
        eprintln!("{f}");
    }
    assert!(seen.cycles >= 1_000, "{seen:?}");
    assert!(
        seen.eq14_cycles >= 50 && seen.eq19_cycles >= 50,
        "too few re-compensations: {seen:?}"
    );
    assert!(
        failures.is_empty(),
        "{} disagreements, {seen:?}",
        failures.len()
    );
}

/// Load a previous state `(id, allocated, record, remainder)` into a fresh `Adaptbf`.
fn with_state(entries: &[(u64, u64, i64, f64)]) -> Adaptbf {
    let mut p = Adaptbf::new(1.0);
    let state = AdaptbfState {
        jobs: entries
            .iter()
            .map(|&(id, allocated, record, remainder)| JobEntry {
                id,
                record,
                remainder,
                allocated,
            })
            .collect(),
    };
    p.load_state(&serde_json::to_value(&state).unwrap())
        .unwrap();
    p
}

fn record(p: &Adaptbf, id: u64) -> i64 {
    p.current_state()
        .jobs
        .iter()
        .find(|e| e.id == id)
        .unwrap()
        .record
}

#[test]
fn adaptbf_recompensation_of_a_chained_cycle_by_hand() {
    // The 8th cycle of a chained run: T = 770 tokens, Δt = 1, node counts 3/2/8/16.
    let mut p = with_state(&[
        (553, 148, -570, 0.0246),
        (470, 15, 30, 0.4499),
        (586, 0, 608, -0.3154),
        (602, 607, -68, 0.1893),
    ]);
    let jobs = [
        job(470, 3, 15.0, 4760.92),
        job(553, 2, 148.0, 6464.16),
        job(586, 8, 0.0, 1955.46),
        job(602, 16, 607.0, 2557.27),
    ];
    // eq. (2), Σn = 29: 79.655 / 53.103 / 212.414 / 424.828, plus the carried remainders
    // 80.105 / 53.128 / 212.098 / 425.017 → 80 / 53 / 212 / 425 (770; ρ .105/.128/.098/.017).
    // Every job wants more than that: no surplus (eq. 4), α_RD = α, r_RD = r.
    // J+ = {470, 586}, J− = {553, 602} (eqs. 9–10).
    // eq. (3): u_470 = 4760.92 / 15 = 317.395. Job 586 got nothing last cycle (it was
    // idle), so it is measured against its current allocation: u_586 = 1955.46 / 212 =
    // 9.2239. (Counting α^{t−1} = 0 as one token would give u_586 = 1955.46 and a DF
    // of 2 494.9 — the 14.9 : 106.1 split — only because the job had been idle.)
    // eq. (6): DF_470 = 317.395·(1 + 3/29) = 350.229, DF_586 = 9.2239·(1 + 8/29) = 11.768.
    // eq. (13): C = (3·317.395 + 8·9.2239) / (2·29) = 17.69; eq. (14): job 553 gives
    // min(570, ⌊17.69·53⌋, α_RD 53) = 53, job 602 min(68, ⌊17.69·425⌋) = 68: T_R = 121.
    // eq. (19): 121·350.229/361.997 = 117.066 and 121·11.768/361.997 = 3.934; with the
    // remainders 117.171 → 117 and 4.032 → 4.
    let rates = p.allocate(770.0, &jobs);
    assert_eq!(
        rates,
        vec![80.0 + 117.0, 53.0 - 53.0, 212.0 + 4.0, 425.0 - 68.0]
    );
    // eq. (20) as printed: 470 is repaid by its DF share although it was owed only 30.
    assert_eq!(record(&p, 470), 30 - 117);
    assert_eq!(record(&p, 586), 608 - 4);
    assert_eq!(record(&p, 553), -570 + 53);
    assert_eq!(record(&p, 602), -68 + 68);
}

#[test]
fn adaptbf_reclaim_floors_a_whole_product_exactly() {
    // T = 121, node counts 6 (lender) and 5 (borrower): α = 66 / 55, no surplus. The
    // lender's demand equals both its last and its current allocation (u = ū = 1), so
    // eq. (13) gives C = 6/11 · (1 + 0)/2 = 3/11 and eq. (14) ⌊3/11 · 55⌋ = 15 exactly.
    // (6/11 · 1/2 · 55 computed in that order is 14.999…, which floors to 14.)
    let mut p = with_state(&[(1, 66, 100, 0.0), (2, 55, -100, 0.0)]);
    let rates = p.allocate(121.0, &[job(1, 6, 66.0, 66.0), job(2, 5, 55.0, 1000.0)]);
    assert_eq!(rates, vec![66.0 + 15.0, 55.0 - 15.0]);
    assert_eq!((record(&p, 1), record(&p, 2)), (85, -85));
}

#[test]
fn adaptbf_capped_reclaim_is_shared_by_every_borrower() {
    // Job 1 is owed 10 tokens, job 4 (idle, so in neither J+ nor J−) 9 990; the two
    // equal borrowers could each give α_RD = 100 by eq. (14) (C = 1/3 · (100 + 0)/2).
    // Only the 10 owed to the active lender are reclaimed, the same 5 from each
    // borrower whatever their order in the snapshot.
    for order in [[2, 3], [3, 2]] {
        let mut p = with_state(&[
            (1, 100, 10, 0.0),
            (2, 100, -5000, 0.0),
            (3, 100, -5000, 0.0),
            (4, 100, 9990, 0.0),
        ]);
        let mut jobs: Vec<JobSnapshot> = [1, order[0], order[1]]
            .iter()
            .map(|&id| job(id, 1, 1e4, 1e4))
            .collect();
        jobs.push(job(4, 1, 0.0, 0.0));
        let rates = p.allocate(300.0, &jobs);
        assert_eq!(rates, vec![110.0, 95.0, 95.0, 0.0]);
        let records: Vec<i64> = [1, 2, 3, 4].iter().map(|&id| record(&p, id)).collect();
        assert_eq!(records, vec![0, -4995, -4995, 9990]);
    }
}
