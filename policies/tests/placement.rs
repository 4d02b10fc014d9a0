//! Placement (Paul et al. §III): the MCMF solver against brute force, the placement
//! network's invariants, the "one predicted request fewer" rule, the baselines, the
//! Markov chain, and the simulator's trends (Figs. 11, 12, 17, Table II).

use policies::placement::markov;
use policies::placement::mcmf::{Method, Network, SHORTEST_PATHS_UP_TO};
use policies::placement::sim::{self, PlaceScenario};
use policies::placement::{
    assignment_cost, place, predictions, round_robin_order, solve_network, CostModel, Decision,
    History, Oss, PlaceError, PlaceInput, Placer, PlacerState, Request, Target, Weights,
};
use proptest::prelude::*;

const GB: f64 = 1e9;

fn target(id: u32, oss: u32, cap: f64, used: f64) -> Target {
    Target {
        id,
        oss,
        capacity: cap,
        used,
        load: 0.0,
    }
}

/// `input` placed by `mcmf:0` (no prediction), from a fresh state.
fn mcmf_without_prediction(input: &PlaceInput) -> Decision {
    place(
        &Placer::parse("mcmf:0").unwrap(),
        input,
        &mut PlacerState::default(),
    )
    .unwrap()
}

fn req(id: u64, app: u32, stripes: u32, bytes: f64) -> Request {
    Request {
        id,
        app,
        stripes,
        bytes,
    }
}

// ---------- the solver against brute force ----------

#[derive(Debug, Clone)]
struct Arc {
    from: usize,
    to: usize,
    cap: i64,
    cost: i64,
    step: i64,
}

/// Every integer flow on the arcs (caps ≤ 2): the maximum value, and the least cost
/// among flows of that value.
fn brute(nodes: usize, arcs: &[Arc], s: usize, t: usize) -> (i64, i64) {
    let mut best = (0i64, 0i64);
    let mut flows = vec![0i64; arcs.len()];
    loop {
        let mut bal = vec![0i64; nodes];
        for (a, &f) in arcs.iter().zip(&flows) {
            bal[a.from] -= f;
            bal[a.to] += f;
        }
        if (0..nodes).all(|v| v == s || v == t || bal[v] == 0) {
            let value = bal[t];
            let cost: i64 = arcs
                .iter()
                .zip(&flows)
                .map(|(a, &f)| a.cost * f + a.step * f * (f - 1) / 2)
                .sum();
            if value > best.0 || (value == best.0 && cost < best.1) {
                best = (value, cost);
            }
        }
        // Next flow vector (odometer).
        let mut k = 0;
        loop {
            if k == arcs.len() {
                return best;
            }
            if flows[k] < arcs[k].cap {
                flows[k] += 1;
                break;
            }
            flows[k] = 0;
            k += 1;
        }
    }
}

/// Both algorithms of the solver.
fn methods() -> impl Strategy<Value = Method> {
    prop::sample::select(vec![Method::ShortestPaths, Method::CostScaling])
}

fn arc_strategy(nodes: usize) -> impl Strategy<Value = Arc> {
    (0..nodes, 0..nodes, 0i64..=2, 0i64..=9, 0i64..=3).prop_map(|(from, to, cap, cost, step)| Arc {
        from,
        to,
        cap,
        cost,
        step,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Both algorithms reach the maximum flow value and, among flows of that value, the
    /// minimum cost (eqs. 1–2), on random networks with linear and convex arcs; the flow it
    /// returns respects capacities and conservation.
    #[test]
    fn mcmf_matches_brute_force(arcs in prop::collection::vec(arc_strategy(5), 1..=7), method in methods()) {
        let arcs: Vec<Arc> = arcs.into_iter().filter(|a| a.from != a.to).collect();
        let (s, t) = (0, 4);
        let mut net = Network::new(5);
        for a in &arcs {
            net.add_arc(a.from, a.to, a.cap, a.cost, a.step);
        }
        let r = net.solve_by(s, t, i64::MAX, Some(method));
        let (value, cost) = brute(5, &arcs, s, t);
        prop_assert_eq!(r.flow, value);
        prop_assert_eq!(r.cost, cost);
        let mut bal = [0i64; 5];
        for a in net.arcs() {
            prop_assert!(a.flow >= 0 && a.flow <= a.cap);
            bal[a.from as usize] -= a.flow;
            bal[a.to as usize] += a.flow;
        }
        prop_assert_eq!(bal[t], r.flow);
        prop_assert_eq!(bal[s], -r.flow);
        prop_assert!(bal[1..4].iter().all(|&b| b == 0));
    }
}

/// The reference solver: successive shortest paths as the paper describes them (the
/// cheapest augmenting path first, Bellman–Ford over the residual network, one unit at
/// a time so that convex arcs are priced unit by unit), up to `limit` units. Returns
/// the value, the cost and each arc's flow.
fn ssp_reference(
    nodes: usize,
    arcs: &[Arc],
    s: usize,
    t: usize,
    limit: i64,
) -> (i64, i64, Vec<i64>) {
    let mut flow = vec![0i64; arcs.len()];
    let mut value = 0;
    while value < limit {
        // Residual arcs: (arc, forward) with the next unit's cost.
        let mut dist = vec![i64::MAX; nodes];
        let mut via: Vec<Option<(usize, bool)>> = vec![None; nodes];
        dist[s] = 0;
        for _ in 0..nodes {
            let mut changed = false;
            for (k, a) in arcs.iter().enumerate() {
                let f = flow[k];
                let steps = [
                    (a.from, a.to, f < a.cap, a.cost + f * a.step, true),
                    (a.to, a.from, f > 0, -(a.cost + (f - 1) * a.step), false),
                ];
                for (u, v, open, c, forward) in steps {
                    if open && dist[u] != i64::MAX && dist[u] + c < dist[v] {
                        dist[v] = dist[u] + c;
                        via[v] = Some((k, forward));
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        if dist[t] == i64::MAX {
            break;
        }
        let mut v = t;
        while v != s {
            let (k, forward) = via[v].expect("on the path");
            if forward {
                flow[k] += 1;
                v = arcs[k].from;
            } else {
                flow[k] -= 1;
                v = arcs[k].to;
            }
        }
        value += 1;
    }
    let cost = arcs
        .iter()
        .zip(&flow)
        .map(|(a, &f)| a.cost * f + a.step * f * (f - 1) / 2)
        .sum();
    (value, cost, flow)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// On networks too large for brute force, both algorithms' value and cost equal the
    /// reference successive-shortest-paths solver's.
    #[test]
    fn mcmf_matches_successive_shortest_paths(
        arcs in prop::collection::vec(
            (0usize..9, 0usize..9, 0i64..=6, 0i64..=50, 0i64..=5)
                .prop_map(|(from, to, cap, cost, step)| Arc { from, to, cap, cost, step }),
            1..=30,
        ),
        limit in 0i64..=16,
        method in methods(),
    ) {
        let arcs: Vec<Arc> = arcs.into_iter().filter(|a| a.from != a.to).collect();
        let (s, t) = (0, 8);
        let mut net = Network::new(9);
        for a in &arcs {
            net.add_arc(a.from, a.to, a.cap, a.cost, a.step);
        }
        let r = net.solve_by(s, t, limit, Some(method));
        let (value, cost, _) = ssp_reference(9, &arcs, s, t, limit);
        prop_assert_eq!((r.flow, r.cost), (value, cost));
    }
}

// ---------- the placement network ----------

fn tiny_input() -> impl Strategy<Value = PlaceInput> {
    cluster_input(2..=5, 3, 1..=3, 1..=2)
}

/// Clusters of `targets` targets (used 0–10 of 10 GB, load 0–100 %) on `servers`
/// servers, and `requests` requests of `stripes` stripes each.
fn cluster_input(
    targets: std::ops::RangeInclusive<usize>,
    servers: usize,
    stripes: std::ops::RangeInclusive<u32>,
    requests: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = PlaceInput> {
    let targets = prop::collection::vec((0u32..servers as u32, 0u64..=10, 0u64..=20), targets);
    let osses = prop::collection::vec((0u32..=100, 0u32..=100), servers);
    let reqs = prop::collection::vec((stripes, 1u64..=4), requests);
    (targets, osses, reqs).prop_map(|(ts, os, rs)| PlaceInput {
        stripe_size: GB,
        osses: os
            .iter()
            .enumerate()
            .map(|(j, &(c, m))| Oss {
                id: j as u32,
                cpu: c as f64,
                memory: m as f64,
            })
            .collect(),
        targets: ts
            .iter()
            .enumerate()
            .map(|(k, &(oss, used, load))| Target {
                id: k as u32,
                oss,
                capacity: 10.0 * GB,
                used: used as f64 * GB,
                load: load as f64 * 5.0,
            })
            .collect(),
        requests: rs
            .iter()
            .enumerate()
            .map(|(i, &(stripes, gb))| req(i as u64, 1, stripes, gb as f64 * GB))
            .collect(),
        history: Vec::new(),
    })
}

/// All ways to give each request `stripes` distinct targets.
fn assignments(input: &PlaceInput) -> Vec<Vec<Vec<u32>>> {
    fn subsets(ids: &[u32], k: usize) -> Vec<Vec<u32>> {
        if k == 0 {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for (i, &x) in ids.iter().enumerate() {
            for mut rest in subsets(&ids[i + 1..], k - 1) {
                rest.insert(0, x);
                out.push(rest);
            }
        }
        out
    }
    let ids: Vec<u32> = input.targets.iter().map(|t| t.id).collect();
    let mut all: Vec<Vec<Vec<u32>>> = vec![Vec::new()];
    for r in &input.requests {
        let subs = subsets(&ids, r.stripes as usize);
        all = all
            .into_iter()
            .flat_map(|a| {
                subs.iter().map(move |s| {
                    let mut b = a.clone();
                    b.push(s.clone());
                    b
                })
            })
            .collect();
    }
    all
}

/// Clusters a little larger than [`tiny_input`]'s (up to 10 targets, 12 requests of
/// 1–4 stripes, some of them too full for a stripe): for the reference solver.
fn small_input() -> impl Strategy<Value = PlaceInput> {
    cluster_input(2..=10, 4, 1..=4, 1..=12)
}

/// The paper's Fig. 10 network for `reqs` — source → request (its stripes) → every
/// target with room (one stripe, the server's load) → its server (the target's convex
/// cost) → sink (the server's convex cost) — solved by [`ssp_reference`]: each
/// request's targets and the cost, `None` if not every stripe is carried.
fn fig_10(input: &PlaceInput, reqs: &[Request], w: &Weights) -> Option<(Vec<Vec<u32>>, i64)> {
    let model = CostModel::new(input, reqs, w);
    let targets: Vec<&Target> = input.targets.iter().filter(|t| model.room(t) > 0).collect();
    let mut servers: Vec<u32> = targets.iter().map(|t| t.oss).collect();
    servers.sort_unstable();
    servers.dedup();
    let (r0, t0) = (2, 2 + reqs.len());
    let s0 = t0 + targets.len();
    let mut arcs = Vec::new();
    let mut arc = |from, to, cap, cost, step| {
        arcs.push(Arc {
            from,
            to,
            cap,
            cost,
            step,
        })
    };
    for (i, r) in reqs.iter().enumerate() {
        arc(0, r0 + i, r.stripes as i64, 0, 0);
    }
    for i in 0..reqs.len() {
        for (e, t) in targets.iter().enumerate() {
            arc(r0 + i, t0 + e, 1, model.placing_on(t), 0);
        }
    }
    for (e, t) in targets.iter().enumerate() {
        let (first, step) = model.target(t);
        let j = servers.binary_search(&t.oss).unwrap();
        arc(t0 + e, s0 + j, model.room(t), first, step);
    }
    let step = model.server_step();
    for j in 0..servers.len() {
        arc(s0 + j, 1, model.total_stripes, step, step);
    }
    let (value, cost, flow) = ssp_reference(s0 + servers.len(), &arcs, 0, 1, i64::MAX);
    if value < model.total_stripes {
        return None;
    }
    let first_choice = reqs.len();
    let assigned = (0..reqs.len())
        .map(|i| {
            (0..targets.len())
                .filter(|&e| flow[first_choice + i * targets.len() + e] > 0)
                .map(|e| targets[e].id)
                .collect()
        })
        .collect();
    Some((assigned, cost))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// On tiny clusters the network's optimum equals the cheapest of every possible
    /// assignment (same cost model), and it is feasible exactly when some assignment
    /// is; every request gets `stripes` distinct targets with room.
    #[test]
    fn placement_is_optimal_vs_brute_force(input in tiny_input()) {
        let w = Weights::default();
        let best = assignments(&input)
            .iter()
            .filter_map(|a| assignment_cost(&input, &input.requests, &w, a))
            .min();
        match solve_network(&input, &input.requests, &w) {
            None => prop_assert!(best.is_none()),
            Some((targets, cost)) => {
                prop_assert_eq!(Some(cost), best);
                prop_assert_eq!(assignment_cost(&input, &input.requests, &w, &targets), Some(cost));
                for (r, ts) in input.requests.iter().zip(&targets) {
                    prop_assert_eq!(ts.len(), r.stripes as usize);
                }
            }
        }
    }

    /// The placement network (one node per stripe count) has the optimum of the paper's
    /// Fig. 10 network (one node per request), built here from the same costs and
    /// solved by the reference solver: feasible for the same inputs, the same cost, and
    /// an assignment of that cost.
    #[test]
    fn grouped_network_equals_fig_10(input in small_input()) {
        let w = Weights::default();
        let reference = fig_10(&input, &input.requests, &w);
        match solve_network(&input, &input.requests, &w) {
            None => prop_assert!(reference.is_none()),
            Some((targets, cost)) => {
                let (ref_targets, ref_cost) = reference.expect("feasible for the reference too");
                prop_assert_eq!(cost, ref_cost);
                prop_assert_eq!(assignment_cost(&input, &input.requests, &w, &ref_targets), Some(ref_cost));
                prop_assert_eq!(assignment_cost(&input, &input.requests, &w, &targets), Some(cost));
            }
        }
    }

    /// §III-C2 on the same inputs with history: `mcmf:3,3` drops the fewest predicted
    /// requests (from the last) that let the reference network carry every stripe, and
    /// its cost is the reference's for the requests kept; a current request set the
    /// reference cannot carry is refused.
    #[test]
    fn predicted_requests_dropped_as_the_reference_needs(input in small_input(), sizes in prop::collection::vec(1u64..=4, 4..=12)) {
        let mut input = input;
        input.history = vec![History { app: 1, bytes: sizes.iter().map(|&g| g as f64 * GB).collect() }];
        let w = Weights::default();
        let mut reqs = input.requests.clone();
        reqs.extend(predictions(&input, 3, 3));
        let predicted = reqs.len() - input.requests.len();
        let kept = (input.requests.len()..=reqs.len())
            .rev()
            .find_map(|n| fig_10(&input, &reqs[..n], &w).map(|(_, cost)| (n, cost)));
        match (place(&Placer::parse("mcmf:3,3").unwrap(), &input, &mut PlacerState::default()), kept) {
            (Ok(d), Some((n, cost))) => {
                prop_assert_eq!(d.dropped, reqs.len() - n);
                prop_assert_eq!(d.predicted.len(), predicted - d.dropped);
                prop_assert_eq!(d.cost, cost);
            }
            (Err(_), None) => {}
            (got, want) => prop_assert!(false, "placed {:?}, reference {:?}", got, want),
        }
    }

    /// Every placer: one entry per request, `stripes` distinct known targets each, the
    /// targets' free space respected; deterministic.
    #[test]
    fn placers_respect_capacity_and_are_deterministic(input in tiny_input(), which in 0usize..3) {
        let placer = [Placer::parse("mcmf").unwrap(), Placer::RoundRobin, Placer::Random { seed: 7 }][which].clone();
        let mut s1 = PlacerState::default();
        let mut s2 = PlacerState::default();
        let d1 = place(&placer, &input, &mut s1);
        let d2 = place(&placer, &input, &mut s2);
        prop_assert_eq!(&d1, &d2);
        prop_assert_eq!(s1, s2);
        if let Ok(d) = d1 {
            prop_assert_eq!(d.placements.len(), input.requests.len());
            let mut bytes = vec![0.0; input.targets.len()];
            for (r, p) in input.requests.iter().zip(&d.placements) {
                prop_assert_eq!(p.request, r.id);
                let mut ts = p.targets.clone();
                ts.sort_unstable();
                ts.dedup();
                prop_assert_eq!(ts.len(), r.stripes as usize);
                for &t in &p.targets {
                    bytes[t as usize] += r.bytes / r.stripes as f64;
                }
            }
            for (t, b) in input.targets.iter().zip(&bytes) {
                prop_assert!(t.used + b <= t.capacity + 1.0, "target {} over capacity", t.id);
            }
        }
    }
}

#[test]
fn mcmf_prefers_empty_targets_on_idle_servers_and_spreads_stripes() {
    let input = PlaceInput {
        stripe_size: GB,
        osses: vec![
            Oss {
                id: 0,
                cpu: 90.0,
                memory: 50.0,
            },
            Oss {
                id: 1,
                cpu: 10.0,
                memory: 10.0,
            },
            Oss {
                id: 2,
                cpu: 10.0,
                memory: 10.0,
            },
        ],
        targets: vec![
            target(0, 0, 100.0 * GB, 0.0),
            target(1, 1, 100.0 * GB, 50.0 * GB),
            target(2, 1, 100.0 * GB, 1.0 * GB),
            target(3, 2, 100.0 * GB, 2.0 * GB),
            target(4, 2, 100.0 * GB, 60.0 * GB),
        ],
        requests: vec![req(9, 1, 2, 2.0 * GB)],
        history: Vec::new(),
    };
    let d = mcmf_without_prediction(&input);
    assert_eq!(d.placements[0].request, 9);
    assert_eq!(d.placements[0].targets, vec![2, 3]);
}

/// `count` servers with CPU and memory loads drawn in the ranges given (%).
fn random_servers(
    rng: &mut policies::trace::Rng,
    count: u32,
    cpu: (f64, f64),
    memory: (f64, f64),
) -> Vec<Oss> {
    (0..count)
        .map(|id| Oss {
            id,
            cpu: rng.range(cpu.0, cpu.1),
            memory: rng.range(memory.0, memory.1),
        })
        .collect()
}

/// Batches larger than [`SHORTEST_PATHS_UP_TO`] stripes (solved by cost scaling) have
/// the optimum of Fig. 10's network solved by the reference, feasible or not.
#[test]
fn batches_match_fig_10() {
    let mut rng = policies::trace::Rng::new(11);
    for round in 0..6 {
        let input = PlaceInput {
            stripe_size: GB,
            osses: random_servers(&mut rng, 4, (0.0, 100.0), (0.0, 100.0)),
            targets: (0..12)
                .map(|k| Target {
                    load: rng.range(0.0, 100.0),
                    ..target(k, k % 4, 100.0 * GB, rng.range(0.0, 100.0) * GB)
                })
                .collect(),
            requests: (0..30 + 4 * round)
                .map(|i| {
                    req(
                        i,
                        1,
                        1 + (rng.next_u64() % 4) as u32,
                        rng.range(1.0, 8.0) * GB,
                    )
                })
                .collect(),
            history: Vec::new(),
        };
        let w = Weights::default();
        let stripes: i64 = input.requests.iter().map(|r| r.stripes as i64).sum();
        assert!(stripes > SHORTEST_PATHS_UP_TO);
        let got = solve_network(&input, &input.requests, &w);
        let want = fig_10(&input, &input.requests, &w);
        assert_eq!(
            got.as_ref().map(|g| g.1),
            want.as_ref().map(|w| w.1),
            "round {round}"
        );
        if let Some((targets, cost)) = got {
            assert_eq!(
                assignment_cost(&input, &input.requests, &w, &targets),
                Some(cost)
            );
        }
    }
}

/// A batch spreads as round-robin would, leaning to the emptier targets: 250 requests
/// of 4 stripes on 100 targets 10–70 % used (10 stripes each on average) use every
/// target, none more than twice the mean, and the emptiest quarter more than the
/// fullest quarter.
#[test]
fn mcmf_spreads_a_batch_over_all_targets() {
    let mut rng = policies::trace::Rng::new(3);
    let input = PlaceInput {
        stripe_size: GB,
        osses: random_servers(&mut rng, 25, (5.0, 95.0), (10.0, 80.0)),
        targets: (0..100)
            .map(|k| target(k, k / 4, 1000.0 * GB, rng.range(100.0, 700.0) * GB))
            .collect(),
        requests: (0..250).map(|i| req(i, 1, 4, 4.0 * GB)).collect(),
        history: Vec::new(),
    };
    let d = mcmf_without_prediction(&input);
    let mut per_target = vec![0usize; 100];
    for p in &d.placements {
        for &t in &p.targets {
            per_target[t as usize] += 1;
        }
    }
    assert!(
        per_target.iter().all(|&n| (1..=20).contains(&n)),
        "{per_target:?}"
    );
    let mut by_used: Vec<usize> = (0..100).collect();
    by_used.sort_by(|&a, &b| input.targets[a].used.total_cmp(&input.targets[b].used));
    let quarter = |ks: &[usize]| ks.iter().map(|&k| per_target[k]).sum::<usize>();
    assert!(
        quarter(&by_used[..25]) > quarter(&by_used[75..]),
        "{per_target:?}"
    );
}

/// §III-C2: "if a flow is not possible for all the requests, we remove one of the
/// predicted requests … and run the algorithm again … until all requests are mapped".
#[test]
fn infeasible_network_drops_predicted_requests_one_at_a_time() {
    // Four targets with room for exactly one 1-GB stripe each.
    let input = PlaceInput {
        stripe_size: GB,
        osses: Vec::new(),
        targets: (0..4).map(|k| target(k, k, 10.0 * GB, 9.0 * GB)).collect(),
        requests: vec![req(1, 5, 2, 2.0 * GB)],
        history: vec![History {
            app: 5,
            bytes: vec![2.0 * GB; 20],
        }],
    };
    // Current 2 stripes + 3 predicted × 2 stripes = 8 > 4: two predictions are dropped.
    let d = place(
        &Placer::parse("mcmf:3,3").unwrap(),
        &input,
        &mut PlacerState::default(),
    )
    .unwrap();
    assert_eq!(d.dropped, 2);
    assert_eq!(d.predicted.len(), 1);
    assert_eq!(d.predicted[0].bytes, 2.0 * GB);
    assert_eq!(d.placements[0].targets.len(), 2);
    // Without predictions nothing is dropped and the result for the current request is
    // a valid placement too.
    let d0 = mcmf_without_prediction(&input);
    assert_eq!((d0.dropped, d0.predicted.len()), (0, 0));
    // The current request alone does not fit: an error naming it.
    let mut big = input.clone();
    big.requests[0].stripes = 5;
    let e = place(
        &Placer::parse("mcmf").unwrap(),
        &big,
        &mut PlacerState::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            PlaceError::TooFewTargets {
                request: 1,
                stripes: 5,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("request 1: cannot place 5 stripes"),
        "{e}"
    );
}

#[test]
fn round_robin_interleaves_servers_and_carries_its_pointer() {
    let targets: Vec<Target> = (0..6)
        .map(|k| target(k, k % 2 + 10 * (k / 4), 10.0 * GB, 0.0))
        .collect();
    // Servers 0: {0, 2}, 1: {1, 3}, 10: {4}, 11: {5}.
    let order: Vec<u32> = round_robin_order(&targets)
        .iter()
        .map(|&k| targets[k].id)
        .collect();
    assert_eq!(order, vec![0, 1, 4, 5, 2, 3]);
    let mut input = PlaceInput {
        stripe_size: GB,
        osses: Vec::new(),
        targets,
        requests: vec![req(1, 0, 4, 4.0 * GB)],
        history: Vec::new(),
    };
    let mut st = PlacerState::default();
    let d = place(&Placer::RoundRobin, &input, &mut st).unwrap();
    assert_eq!(d.placements[0].targets, vec![0, 1, 4, 5]);
    assert_eq!(st.next, 4);
    // Target 2 is full: skipped.
    input.targets[2].used = 10.0 * GB;
    let d = place(&Placer::RoundRobin, &input, &mut st).unwrap();
    assert_eq!(d.placements[0].targets, vec![3, 0, 1, 4]);
}

#[test]
fn random_prefers_targets_more_than_40_percent_free() {
    let mut targets: Vec<Target> = (0..8).map(|k| target(k, k, 10.0 * GB, 7.0 * GB)).collect();
    targets[3].used = 1.0 * GB;
    targets[6].used = 5.0 * GB;
    let input = PlaceInput {
        stripe_size: GB,
        osses: Vec::new(),
        targets,
        requests: vec![req(1, 0, 2, 2.0 * GB)],
        history: Vec::new(),
    };
    for seed in 0..20 {
        let d = place(
            &Placer::Random { seed },
            &input,
            &mut PlacerState::default(),
        )
        .unwrap();
        let mut t = d.placements[0].targets.clone();
        t.sort_unstable();
        assert_eq!(t, vec![3, 6], "seed {seed}");
    }
    // Three stripes: the third from the rest.
    let mut three = input.clone();
    three.requests[0].stripes = 3;
    let d = place(
        &Placer::Random { seed: 1 },
        &three,
        &mut PlacerState::default(),
    )
    .unwrap();
    assert!(d.placements[0].targets[..2].contains(&3) && d.placements[0].targets[..2].contains(&6));
}

/// Round-robin and random place a decision's requests one after the other: a request
/// that fits alone but not in what the ones before it left is named.
#[test]
fn a_request_left_without_room_by_the_ones_before_it_is_named() {
    // Four targets with room for one 1-GB stripe each.
    let input = PlaceInput {
        stripe_size: GB,
        osses: Vec::new(),
        targets: (0..4).map(|k| target(k, k, 10.0 * GB, 9.0 * GB)).collect(),
        requests: vec![req(1, 0, 2, 2.0 * GB), req(2, 0, 3, 3.0 * GB)],
        history: Vec::new(),
    };
    for placer in [Placer::RoundRobin, Placer::Random { seed: 3 }] {
        let e = place(&placer, &input, &mut PlacerState::default()).unwrap_err();
        assert_eq!(
            e,
            PlaceError::NoRoomLeft {
                request: 2,
                stripes: 3,
                with_room: 2,
                stripe_bytes: GB
            },
            "{placer:?}"
        );
        assert_eq!(
            e.to_string(),
            "request 2: cannot place 3 stripes after the requests before it: only 2 targets still have room for a stripe of 1000000000 bytes"
        );
        // Five stripes do not fit even alone: that is what is said.
        let mut alone = input.clone();
        alone.requests[1].stripes = 5;
        alone.requests[1].bytes = 5.0 * GB;
        let e = place(&placer, &alone, &mut PlacerState::default()).unwrap_err();
        assert!(
            matches!(
                e,
                PlaceError::TooFewTargets {
                    request: 2,
                    stripes: 5,
                    with_room: 4,
                    ..
                }
            ),
            "{placer:?}: {e:?}"
        );
    }
}

#[test]
fn placer_specs() {
    assert_eq!(Placer::parse("mcmf").unwrap().name(), "mcmf:3,3");
    assert_eq!(Placer::parse("mcmf:8,1").unwrap().name(), "mcmf:8,1");
    assert_eq!(Placer::parse("mcmf:0").unwrap().name(), "mcmf:0,0");
    assert_eq!(Placer::parse("rr").unwrap(), Placer::RoundRobin);
    assert_eq!(
        Placer::parse("random:9").unwrap(),
        Placer::Random { seed: 9 }
    );
    for bad in ["mcmf:9", "mcmf:x", "random:-1", "round-robin:2", "lottery"] {
        assert!(Placer::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn bad_specs_keep_the_spec_and_say_what_is_wrong() {
    use policies::SpecErrorKind;
    let e = Placer::parse(" round-robin:2 ").unwrap_err();
    assert_eq!(
        (e.what, e.spec.as_str(), &e.kind),
        (
            "placer",
            "round-robin:2",
            &SpecErrorKind::NoParameters("2".into())
        )
    );
    assert_eq!(
        e.to_string(),
        "placer `round-robin:2`: takes no parameters (got `2`)"
    );
    let e = Placer::parse("lottery").unwrap_err();
    assert_eq!(e.kind, SpecErrorKind::Unknown);
    assert!(
        e.to_string()
            .starts_with("unknown placer `lottery` (known: mcmf,"),
        "{e}"
    );
    let e = policies::build("psfa:2").err().unwrap();
    assert_eq!((e.what, e.spec.as_str()), ("policy", "psfa:2"));
    assert!(
        matches!(&e.kind, SpecErrorKind::BadParameter { what: "epsilon", value, .. } if value == "2"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "policy `psfa:2`: bad epsilon `2` (must be in [0, 1])"
    );
    let e = policies::build("themis:user,user").err().unwrap();
    assert!(matches!(e.kind, SpecErrorKind::Levels(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "policy `themis:user,user`: fairness level `user` appears twice"
    );
}

// ---------- Markov chain (§III-B, Table II) ----------

#[test]
fn markov_accuracy_by_order_follows_table_ii() {
    let acc: Vec<f64> = (1..=8)
        .map(|m| sim::markov_accuracy(42, 1500, m, markov::DEFAULT_WINDOW))
        .collect();
    // Order 3 is far better than 1 and 2; beyond 3 the gain is minimal (Table II).
    assert!(acc[0] < acc[1] && acc[1] + 15.0 < acc[2], "{acc:?}");
    assert!(acc[2] > 90.0, "{acc:?}");
    for a in &acc[3..] {
        assert!((a - acc[2]).abs() < 3.0, "{acc:?}");
    }
}

#[test]
fn markov_predicts_the_pattern() {
    // …, 16, 8, 8 → 8, 16, 8, 8.
    let h: Vec<f64> = (0..30).map(|i| [8.0, 8.0, 8.0, 16.0][i % 4]).collect();
    assert_eq!(markov::predict(&h, 3, 4), {
        let (mu, sd) = markov::mean_sd(&h);
        vec![
            markov::value_of(-1, mu, sd),
            markov::value_of(2, mu, sd),
            markov::value_of(-1, mu, sd),
            markov::value_of(-1, mu, sd),
        ]
    });
    assert!(markov::predict(&[], 3, 2).is_empty());
    assert_eq!(markov::predict(&[5.0; 4], 3, 2), vec![5.0, 5.0]);
}

/// Table II is flat past order 3 because the simulated applications' size patterns are
/// order 3: without noise, each one's next state follows from its last three, which
/// orders 1 and 2 cannot see. Higher orders gain only on patterns that need a longer
/// context: seven equal sizes then a larger one needs order 7.
#[test]
fn table_ii_flat_past_order_three_as_the_patterns_are_order_three() {
    for app in sim::paper_apps() {
        let sizes: Vec<f64> = (0..600).map(|i| app.sizes[i % app.sizes.len()]).collect();
        let acc = |m| markov::accuracy(&sizes, m, markov::DEFAULT_WINDOW);
        assert!(acc(2) < 100.0, "{}: order 2 {}", app.name, acc(2));
        for m in 3..=markov::MAX_ORDER {
            assert_eq!(acc(m), 100.0, "{} order {m}", app.name);
        }
    }
    let long: Vec<f64> = (0..600)
        .map(|i| if i % 8 == 7 { 9.0 } else { 1.0 })
        .collect();
    let acc = |m| markov::accuracy(&long, m, markov::DEFAULT_WINDOW);
    assert!(acc(3) < acc(7), "{} vs {}", acc(3), acc(7));
    assert_eq!(acc(7), 100.0);
}

/// Algorithm 1's input is "the set of current requests' write bytes": every current
/// request of an application follows its history, not only the first.
#[test]
fn predictor_trains_on_every_current_request_of_an_application() {
    let past = vec![4.0 * GB, 4.0 * GB, 12.0 * GB, 4.0 * GB, 4.0 * GB, 12.0 * GB];
    let two_now = PlaceInput {
        stripe_size: GB,
        osses: Vec::new(),
        targets: (0..8).map(|k| target(k, k, 100.0 * GB, 0.0)).collect(),
        requests: vec![req(1, 1, 2, 4.0 * GB), req(2, 1, 2, 4.0 * GB)],
        history: vec![History {
            app: 1,
            bytes: past.clone(),
        }],
    };
    // The same sizes given as history, the current request's size unknown (0).
    let mut as_history = two_now.clone();
    as_history.requests = vec![req(1, 1, 2, 0.0)];
    as_history.history[0].bytes.extend([4.0 * GB, 4.0 * GB]);
    let sizes = |input: &PlaceInput| -> Vec<f64> {
        predictions(input, 3, 3).iter().map(|r| r.bytes).collect()
    };
    assert_eq!(sizes(&two_now).len(), 3);
    assert_eq!(sizes(&two_now), sizes(&as_history));
    // Only the first one would predict something else: after 12, 4 comes 4, not 12.
    let mut first_only = as_history.clone();
    first_only.history[0].bytes.pop();
    assert_ne!(sizes(&two_now), sizes(&first_only));
}

/// §III-B: "the training sequence of requests is a list of any length longer than the
/// order of Markov chain" — an application with a shorter past has no predicted
/// requests (it used to get `PREDICT` copies of its current request).
#[test]
fn no_prediction_from_a_history_no_longer_than_the_order() {
    let mut input = PlaceInput {
        stripe_size: GB,
        osses: Vec::new(),
        targets: (0..8).map(|k| target(k, k, 100.0 * GB, 0.0)).collect(),
        requests: vec![req(1, 1, 2, 4.0 * GB)],
        history: Vec::new(),
    };
    let placer = Placer::parse("mcmf:3,3").unwrap();
    let d = place(&placer, &input, &mut PlacerState::default()).unwrap();
    assert!(d.predicted.is_empty(), "{:?}", d.predicted);
    // Two past sizes and the current one: 3, not longer than order 3.
    input.history = vec![History {
        app: 1,
        bytes: vec![4.0 * GB, 8.0 * GB],
    }];
    assert!(predictions(&input, 3, 3).is_empty());
    assert_eq!(predictions(&input, 2, 3).len(), 3);
    input.history[0].bytes.push(4.0 * GB);
    assert_eq!(predictions(&input, 3, 3).len(), 3);
}

/// State −2 maps to `μ − 1.7σ`, negative for sizes alternating 2 and 256 GB; a
/// predicted size is raised to the smallest size seen (it used to become 0, which a
/// request reads as "one stripe size per stripe").
#[test]
fn a_predicted_size_is_never_below_the_smallest_seen() {
    let h: Vec<f64> = (0..20)
        .map(|i| if i % 2 == 0 { 2.0 * GB } else { 256.0 * GB })
        .collect();
    let (mu, sd) = markov::mean_sd(&h);
    assert!(markov::value_of(-2, mu, sd) < 0.0);
    let p = markov::predict(&h, 3, 2);
    assert_eq!(p[0], 2.0 * GB, "{p:?}");
    assert_eq!(markov::state_of(p[0], mu, sd), -2);
    assert_eq!(p[1], markov::value_of(2, mu, sd));
    let input = PlaceInput {
        stripe_size: GB,
        osses: Vec::new(),
        targets: (0..8).map(|k| target(k, k, 1000.0 * GB, 0.0)).collect(),
        requests: vec![req(1, 1, 2, 256.0 * GB)],
        history: vec![History { app: 1, bytes: h }],
    };
    let predicted = predictions(&input, 3, 1);
    assert_eq!(predicted.len(), 1);
    assert_eq!(predicted[0].bytes, 2.0 * GB);
}

// ---------- the simulator's trends (Figs. 11, 12, 17) ----------

/// On applications alternating large and small files against nearly full targets the
/// predicted requests change MCMF's decisions: over six seeds, more bandwidth and at
/// least as many files placed than without prediction (`examples/prediction.rs` prints
/// every run).
#[test]
fn prediction_changes_the_outcome_on_alternating_sizes() {
    let (mut with, mut without) = ((0.0, 0, 0), (0.0, 0, 0));
    for seed in [1, 2, 3, 4, 5, 42] {
        let sc = PlaceScenario::alternating(seed);
        for (spec, total) in [("mcmf:3,3", &mut with), ("mcmf:0", &mut without)] {
            let r = sim::simulate(&sc, &Placer::parse(spec).unwrap());
            assert!(r.failed > 0, "{spec} seed {seed}: the cluster fills up");
            total.0 += r.mean_bandwidth;
            total.1 += r.requests - r.failed;
            total.2 += r.dropped;
        }
    }
    assert!(with.0 > without.0, "bandwidth {} vs {}", with.0, without.0);
    assert!(with.1 >= without.1, "files {} vs {}", with.1, without.1);
    assert!(
        with.2 > 0 && without.2 == 0,
        "dropped {} / {}",
        with.2,
        without.2
    );
}

#[test]
fn simulator_reproduces_the_papers_trends() {
    let sc = PlaceScenario::paper(42);
    let run = |p: &str| sim::simulate(&sc, &Placer::parse(p).unwrap());
    let (m, rr, rnd) = (run("mcmf"), run("round-robin"), run("random"));
    for r in [&m, &rr, &rnd] {
        assert_eq!(r.samples.len(), 144);
        assert!(r.completed > r.requests * 9 / 10);
    }
    let at = |r: &sim::PlaceSimResult, h: f64| {
        r.samples.iter().find(|s| s.hour >= h).unwrap().disk_ratio
    };
    // Fig. 11: MCMF reaches ≈ 1 well before round-robin; random is the worst.
    let settle = m.disk_settled(1.1).expect("mcmf settles");
    assert!(settle <= 3.0, "mcmf settles at {settle} h");
    assert!(rr.disk_settled(1.1).is_none_or(|h| h > 2.0 * settle));
    assert!(at(&m, 6.0) < at(&rr, 6.0) && at(&rr, 6.0) < at(&rnd, 6.0));
    assert!(
        m.mean_disk_ratio() < rr.mean_disk_ratio() && rr.mean_disk_ratio() < rnd.mean_disk_ratio()
    );
    // Fig. 12: OSS CPU more balanced under MCMF, random the worst.
    assert!(m.mean_cpu_ratio() < rr.mean_cpu_ratio() && rr.mean_cpu_ratio() < rnd.mean_cpu_ratio());
    // Fig. 17 (short): MCMF's bandwidth ≥ round-robin's, and more targets help both.
    let bw = |n: usize, p: &str| {
        sim::simulate(
            &PlaceScenario::scaled(n, 0.5, 42),
            &Placer::parse(p).unwrap(),
        )
        .mean_bandwidth
    };
    let (m160, r160, r480) = (
        bw(160, "mcmf"),
        bw(160, "round-robin"),
        bw(480, "round-robin"),
    );
    assert!(m160 > r160 * 1.1, "{m160} vs {r160}");
    assert!(r480 > r160, "{r480} vs {r160}");
}
