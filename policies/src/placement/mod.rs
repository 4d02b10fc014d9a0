//! Load-balanced placement of new files' stripes on storage targets (OSTs), after Paul
//! et al., "I/O Load Balancing for Big Data HPC Applications" §III.
//!
//! Given the storage servers (OSSes: CPU and memory load), their targets (OSTs: capacity
//! and bytes used, §III-A / Table I statistics) and the write requests to place (stripe
//! count and bytes), a [`Placer`] chooses, for every request, `stripes` distinct
//! targets. Like the rate policies, every placer is a pure, deterministic function of its
//! input and its explicit [`PlacerState`].
//!
//! ## MCMF (§III-C)
//!
//! The flow network of Fig. 10: source `S1` → request `R_i` (capacity = its stripe
//! count, cost 0) → every target `OST_jk` (capacity 1, so a request puts at most one
//! stripe on a target — the paper's feasibility constraint; cost = the load of the
//! target's server `OSS_j`, `α·CPU% + β·Memory%` with `α = β = 0.5`) → sink `S2`
//! (capacity = how many stripes still fit on the target, `KBavailable / stripe size`;
//! cost = the target's load `TotalKB − KBavailable`). The requests are the current ones
//! plus those the Markov chain ([`markov`], §III-B) predicts for the same applications;
//! the minimum-cost maximum flow (eqs. 1–2) is found by [`mcmf`], each current request
//! is given the targets its stripes flowed to, and if the network cannot carry every
//! stripe "we remove one of the predicted requests … and run the algorithm again.
//! This process is repeated until all requests are mapped" (§III-C2) — the last
//! predicted one goes first.
//!
//! Departures from the paper's text, so that its intent ("the edges between OST and sink
//! … create a load balanced distribution of OSTs") holds within one round:
//!
//! * **Commensurable costs.** The two terms are put on one scale: the OSS term is its
//!   load in percent, the OST term its used space in percent of the *mean* target
//!   capacity (the paper adds CPU % to kilobytes, where the kilobytes dominate). Both are
//!   weighted ([`Weights`], 1 and 1 by default) and scaled to integers (`COST_SCALE`).
//! * **Load after placement.** The OST arc is convex: the `u`-th stripe given to a
//!   target in this round costs the target's load *after* `u + 1` stripes: used +
//!   `(u+1)` × the round's mean stripe bytes, and I/O load + `(u+1)` ×
//!   [`Weights::ost_stripe`] percent (each stripe is one more stream written to the
//!   target; 25 %, as in the simulator). With a constant per-unit cost every request of
//!   a round would pile onto the same emptiest targets, and with the bytes alone (a
//!   stripe is a tiny share of a target) nearly so.
//! * **One node per stripe count.** No cost depends on the request, so requests of
//!   equal stripe count share a node (see [`solve_network`]): the same optimum, with
//!   (stripe counts) × targets arcs instead of requests × targets.
//! * **Stripe bytes.** A request's stripe holds `bytes / stripes` bytes (the paper's
//!   "number of write bytes divided by the stripe size" is the count of stripe-size
//!   chunks); a target's capacity in the network is its free space over the largest
//!   stripe of the round (at least the configured stripe size).
//! * **Server layer.** Targets flow into a node per server (`OST_jk → OSS_j → S2`, the
//!   "requests → OSTs → OSSes" of Fig. 10's hierarchy), whose arc to the sink is convex:
//!   every stripe placed on a server in this round adds [`Weights::oss_stripe`] percent
//!   to its load. Without it a wide request would take all the targets of the least
//!   loaded server, which then shares one server's bandwidth among them.
//! * **Busy targets.** A target's I/O load (percent busy, e.g. from `brw_stats`, which
//!   §III-D says the MDS uses to remove stragglers) is added to its space term.
//! * A predicted request has the predicted bytes and the stripe count of its
//!   application's first current request (the paper derives the count from the bytes).
//!
//! ## Baselines (§IV-B)
//!
//! * `round-robin`: Lustre's default — targets in an order that alternates servers (the
//!   `k`-th target of each OSS in turn), a pointer carried in the state; full targets are
//!   skipped.
//! * `random[:SEED]`: the paper's weighted random — a random target among those whose
//!   free space is more than 40 % of their capacity (the rest if not enough of those),
//!   seeded, the number of decisions so far in the state.

pub mod markov;
pub mod mcmf;
pub mod sim;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::registry::{SpecError, SpecErrorKind};
use crate::trace::Rng;
use mcmf::Network;

/// Integer cost of 100 % load (costs are integers so the solver is exact).
pub const COST_SCALE: f64 = 1e7;

/// Default stripe size (Lustre's 1 MiB).
pub const DEFAULT_STRIPE_SIZE: f64 = 1_048_576.0;

/// A storage server (OSS) and its load (§III-A, Table I: CPU%, Memory%).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Oss {
    /// Server id (targets refer to it).
    pub id: u32,
    /// CPU utilisation, percent (0–100).
    #[serde(default)]
    pub cpu: f64,
    /// Memory utilisation, percent (0–100).
    #[serde(default)]
    pub memory: f64,
}

/// A storage target (OST).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Target index (what the layout names).
    pub id: u32,
    /// The server it is attached to.
    pub oss: u32,
    /// Size, bytes (`TotalKB`).
    pub capacity: f64,
    /// Bytes used (`TotalKB − KBavailable`).
    pub used: f64,
    /// I/O load of the target, percent (0–100): how busy its disk is, e.g. from
    /// `brw_stats` (§III-D uses it to avoid stragglers). Default 0.
    #[serde(default)]
    pub load: f64,
}

impl Target {
    /// Free bytes.
    pub fn free(&self) -> f64 {
        (self.capacity - self.used).max(0.0)
    }
}

/// A file-creation request: `stripes` distinct targets for `bytes` of data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Request id (echoed in the output).
    pub id: u64,
    /// Application id (the Markov chain is per application).
    #[serde(default)]
    pub app: u32,
    /// Stripe count (≥ 1).
    pub stripes: u32,
    /// Bytes the file will hold (0 = unknown: one stripe size per stripe).
    #[serde(default)]
    pub bytes: f64,
}

/// Past write sizes of one application (oldest first), for the Markov predictor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    /// Application id.
    pub app: u32,
    /// Bytes written by its past requests, oldest first.
    pub bytes: Vec<f64>,
}

/// Everything one placement decision sees.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaceInput {
    /// Stripe size, bytes (default 1 MiB).
    #[serde(default = "default_stripe_size")]
    pub stripe_size: f64,
    /// The servers (absent: every server's load counts as 0).
    #[serde(default)]
    pub osses: Vec<Oss>,
    /// The targets.
    pub targets: Vec<Target>,
    /// The requests to place now, in order.
    pub requests: Vec<Request>,
    /// Past write sizes per application (MCMF's predictions).
    #[serde(default)]
    pub history: Vec<History>,
}

fn default_stripe_size() -> f64 {
    DEFAULT_STRIPE_SIZE
}

impl PlaceInput {
    /// `Ok` if every field is usable; else one line naming the field and value.
    pub fn validate(&self) -> Result<(), InputError> {
        let bad = |of: String, field: String, value: &dyn std::fmt::Display, expected| {
            Err(InputError::Bad {
                of,
                field,
                value: value.to_string(),
                expected,
            })
        };
        let num = |of: String, field: String, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                bad(of, field, &v, "expected a finite number ≥ 0".into())
            }
        };
        let duplicate = |what, id| Err(InputError::Duplicate { what, id });
        if !(self.stripe_size.is_finite() && self.stripe_size > 0.0) {
            return bad(
                String::new(),
                "stripe_size".into(),
                &self.stripe_size,
                "expected bytes > 0".into(),
            );
        }
        let mut osses = HashSet::new();
        for o in &self.osses {
            if !osses.insert(o.id) {
                return duplicate("oss", o.id.into());
            }
            for (f, v) in [("cpu", o.cpu), ("memory", o.memory)] {
                if !(v.is_finite() && (0.0..=100.0).contains(&v)) {
                    let expected = "expected a percentage 0–100".into();
                    return bad(format!("oss {}", o.id), f.into(), &v, expected);
                }
            }
        }
        let mut ids = HashSet::new();
        for t in &self.targets {
            let of = || format!("target {}", t.id);
            if !ids.insert(t.id) {
                return duplicate("target", t.id.into());
            }
            num(of(), "capacity".into(), t.capacity)?;
            num(of(), "used".into(), t.used)?;
            if !(t.load.is_finite() && (0.0..=100.0).contains(&t.load)) {
                let expected = "expected a percentage 0–100".into();
                return bad(of(), "load".into(), &t.load, expected);
            }
            if t.used > t.capacity {
                let expected = format!("more than its capacity {}", t.capacity);
                return bad(of(), "used".into(), &t.used, expected);
            }
            if !self.osses.is_empty() && !osses.contains(&t.oss) {
                return bad(of(), "oss".into(), &t.oss, "not in `osses`".into());
            }
        }
        let mut rids = HashSet::new();
        for r in &self.requests {
            let of = || format!("request {}", r.id);
            if !rids.insert(r.id) {
                return duplicate("request", r.id);
            }
            if r.stripes == 0 {
                return bad(of(), "stripes".into(), &0, "expected ≥ 1".into());
            }
            num(of(), "bytes".into(), r.bytes)?;
        }
        for h in &self.history {
            for (k, &b) in h.bytes.iter().enumerate() {
                num(
                    format!("history of app {}", h.app),
                    format!("bytes[{k}]"),
                    b,
                )?;
            }
        }
        Ok(())
    }
}

/// A [`PlaceInput`] refused by [`PlaceInput::validate`], naming the item, the field
/// and the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// Two servers, targets or requests with one id.
    #[error("duplicate {what} id `{id}`")]
    Duplicate {
        /// `oss`, `target` or `request`.
        what: &'static str,
        /// The id.
        id: u64,
    },
    /// A value out of its range.
    #[error("{}bad {field} {value} ({expected})", if of.is_empty() { String::new() } else { format!("{of}: ") })]
    Bad {
        /// Whose field (`target 3`), empty for the input's own.
        of: String,
        /// The field (`capacity`, `bytes[2]`).
        field: String,
        /// The value as given.
        value: String,
        /// What it must be.
        expected: String,
    },
}

/// Weights of the two cost terms (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    /// `α` of `α·CPU% + β·Memory%` (paper: 0.5).
    pub cpu: f64,
    /// `β` (paper: 0.5).
    pub memory: f64,
    /// Weight of the OSS term on request → OST arcs.
    pub oss: f64,
    /// Weight of the OST space term on OST → server arcs.
    pub ost: f64,
    /// Weight of the OST I/O load term ([`Target::load`]) on OST → server arcs.
    pub io: f64,
    /// Load (percent) one stripe placed in this round adds to its server (the OSS →
    /// sink arcs are convex with this step; 0 = the paper's constant OSS cost).
    pub oss_stripe: f64,
    /// I/O load (percent, weighted by `io`) one stripe placed in this round adds to its
    /// target: a stripe being written is one more stream on the target's disk.
    pub ost_stripe: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            cpu: 0.5,
            memory: 0.5,
            oss: 1.0,
            ost: 1.0,
            io: 1.0,
            oss_stripe: 2.0,
            ost_stripe: 25.0,
        }
    }
}

/// A placement algorithm, built by [`Placer::parse`].
#[derive(Debug, Clone, PartialEq)]
pub enum Placer {
    /// MCMF over current and `predict` predicted requests per application, chain order
    /// `order` (`mcmf` = `mcmf:3,3`; `mcmf:0` = no prediction).
    Mcmf {
        /// Markov chain order (1–8; 0 = no predicted requests).
        order: usize,
        /// Predicted requests per application of the current requests.
        predict: usize,
        /// Cost weights.
        weights: Weights,
    },
    /// Lustre's round-robin.
    RoundRobin,
    /// The paper's weighted random, seeded.
    Random {
        /// Seed.
        seed: u64,
    },
}

/// Names [`Placer::parse`] accepts.
pub const PLACER_NAMES: [&str; 3] = ["mcmf", "round-robin", "random"];

impl Placer {
    /// `mcmf[:ORDER[,PREDICT]]`, `round-robin` (`rr`), `random[:SEED]`.
    pub fn parse(spec: &str) -> Result<Placer, SpecError> {
        let spec = spec.trim();
        let (name, params) = match spec.split_once(':') {
            Some((n, p)) => (n.trim(), Some(p.trim())),
            None => (spec, None),
        };
        let err = |kind| SpecError {
            what: "placer",
            spec: spec.to_string(),
            kind,
            known: &PLACER_NAMES,
        };
        let bad = |what, value: &str, expected| {
            err(SpecErrorKind::BadParameter {
                what,
                value: value.to_string(),
                expected,
            })
        };
        let int = |what, v: &str, max: usize| -> Result<usize, SpecError> {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|&x| x <= max)
                .ok_or_else(|| bad(what, v, format!("expected an integer 0–{max}")))
        };
        match (name, params) {
            ("mcmf", None) => Ok(Placer::Mcmf {
                order: 3,
                predict: 3,
                weights: Weights::default(),
            }),
            ("mcmf", Some(p)) => {
                let (o, n) = match p.split_once(',') {
                    Some((o, n)) => (o, Some(n)),
                    None => (p, None),
                };
                let order = int("order", o, markov::MAX_ORDER)?;
                let predict = match n {
                    Some(n) => int("prediction count", n, 64)?,
                    None if order == 0 => 0,
                    None => 3,
                };
                Ok(Placer::Mcmf {
                    order,
                    predict: if order == 0 { 0 } else { predict },
                    weights: Weights::default(),
                })
            }
            ("round-robin" | "rr", None) => Ok(Placer::RoundRobin),
            ("random", None) => Ok(Placer::Random { seed: 42 }),
            ("random", Some(s)) => s
                .parse::<u64>()
                .map(|seed| Placer::Random { seed })
                .map_err(|_| bad("seed", s, "expected an integer".into())),
            ("round-robin" | "rr", Some(p)) => Err(err(SpecErrorKind::NoParameters(p.to_string()))),
            _ => Err(err(SpecErrorKind::Unknown)),
        }
    }

    /// Canonical spec.
    pub fn name(&self) -> String {
        match self {
            Placer::Mcmf { order, predict, .. } => format!("mcmf:{order},{predict}"),
            Placer::RoundRobin => "round-robin".into(),
            Placer::Random { seed } => format!("random:{seed}"),
        }
    }
}

/// State carried from one decision to the next (round-robin's pointer, the random
/// placer's decision count). JSON-serialisable so that dry runs can be chained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacerState {
    /// Round-robin: position of the next target in the server-interleaved order.
    #[serde(default)]
    pub next: usize,
    /// Decisions made so far (seeds the random placer's stream).
    #[serde(default)]
    pub decisions: u64,
}

/// Where one request's stripes go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The request's id.
    pub request: u64,
    /// Target ids, one per stripe (sorted for MCMF; in pointer order for round-robin).
    pub targets: Vec<u32>,
}

/// A predicted request that was part of the flow network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    /// Application.
    pub app: u32,
    /// Predicted bytes.
    pub bytes: f64,
    /// Stripe count.
    pub stripes: u32,
}

/// The outcome of one decision.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// One entry per current request, in input order.
    pub placements: Vec<Placement>,
    /// Predicted requests kept in the final network (MCMF).
    pub predicted: Vec<Predicted>,
    /// Predicted requests removed because the network could not carry them (§III-C2).
    pub dropped: usize,
    /// Cost (eq. 1) of the final flow; [`COST_SCALE`] = 100 % of load (MCMF; 0 otherwise).
    pub cost: i64,
}

/// Place `input.requests` with `placer`, updating `state`. Errors (one line) when a
/// current request cannot be placed at all: fewer targets with room than its stripes.
pub fn place(
    placer: &Placer,
    input: &PlaceInput,
    state: &mut PlacerState,
) -> Result<Decision, PlaceError> {
    let d = match placer {
        Placer::Mcmf {
            order,
            predict,
            weights,
        } => place_mcmf(input, *order, *predict, weights),
        Placer::RoundRobin => place_round_robin(input, state),
        Placer::Random { seed } => place_random(input, *seed, state.decisions),
    };
    state.decisions += 1;
    d
}

/// Bytes one stripe of `r` holds.
fn stripe_bytes(r: &Request, stripe_size: f64) -> f64 {
    if r.bytes > 0.0 {
        r.bytes / r.stripes as f64
    } else {
        stripe_size
    }
}

/// How many stripes of `unit` bytes still fit on `t` (at least the target must fit one).
fn room(t: &Target, unit: f64) -> i64 {
    if unit <= 0.0 {
        return i64::MAX / 4;
    }
    (t.free() / unit).floor().min(1e15) as i64
}

/// The predicted requests: `predict` per application of the current requests, in
/// order of application first appearance then time. An application's chain is trained
/// on its history followed by the sizes of all its current requests (Algorithm 1's input
/// is "the set of current requests' write bytes"; a size of 0, unknown, is left out);
/// its predicted requests have the stripe count of its first current request.
pub fn predictions(input: &PlaceInput, order: usize, predict: usize) -> Vec<Request> {
    if order == 0 || predict == 0 {
        return Vec::new();
    }
    let hist: HashMap<u32, &[f64]> = input
        .history
        .iter()
        .map(|h| (h.app, h.bytes.as_slice()))
        .collect();
    // Each application's first current request and its sizes, history first.
    let mut apps: Vec<(&Request, Vec<f64>)> = Vec::new();
    let mut index: HashMap<u32, usize> = HashMap::new();
    for r in &input.requests {
        let i = *index.entry(r.app).or_insert_with(|| {
            let past = hist.get(&r.app).map(|h| h.to_vec()).unwrap_or_default();
            apps.push((r, past));
            apps.len() - 1
        });
        if r.bytes > 0.0 {
            apps[i].1.push(r.bytes);
        }
    }
    let per_app: Vec<Vec<f64>> = apps
        .iter()
        .map(|(_, h)| {
            let start = h.len().saturating_sub(markov::DEFAULT_WINDOW);
            markov::predict(&h[start..], order, predict)
        })
        .collect();
    let apps: Vec<&Request> = apps.iter().map(|(r, _)| *r).collect();
    // Interleaved by horizon, so that dropping from the end removes the furthest ones.
    let mut out = Vec::new();
    for k in 0..predict {
        for (r, p) in apps.iter().zip(&per_app) {
            if let Some(&b) = p.get(k) {
                out.push(Request {
                    id: u64::MAX - out.len() as u64,
                    app: r.app,
                    stripes: r.stripes,
                    bytes: b,
                });
            }
        }
    }
    out
}

/// The costs of eq. (1) for one set of requests (§III-C1), in [`COST_SCALE`] units:
/// what the network of [`solve_network`] charges on its arcs and what
/// [`assignment_cost`] adds up for a given assignment — one model, so the brute-force
/// check tests the solver, not a second copy of the costs. No cost depends on which
/// request a stripe belongs to, only on its target (and the round's totals).
pub struct CostModel<'a> {
    input: &'a PlaceInput,
    weights: &'a Weights,
    /// Each server's load (`cpu`, `memory` weighted), %.
    oss_load: HashMap<u32, f64>,
    mean_cap: f64,
    /// The largest stripe of the requests: a target's room is counted in it.
    unit_max: f64,
    /// The mean stripe: what each stripe placed adds to a target's used bytes.
    unit_mean: f64,
    /// Stripes of all the requests.
    pub total_stripes: i64,
}

impl<'a> CostModel<'a> {
    /// The costs of placing `reqs` on `input`'s targets.
    pub fn new(input: &'a PlaceInput, reqs: &[Request], weights: &'a Weights) -> CostModel<'a> {
        let mean_cap = if input.targets.is_empty() {
            1.0
        } else {
            (input.targets.iter().map(|t| t.capacity).sum::<f64>() / input.targets.len() as f64)
                .max(1.0)
        };
        let unit_max = reqs
            .iter()
            .map(|r| stripe_bytes(r, input.stripe_size))
            .fold(input.stripe_size, f64::max);
        let total_stripes: i64 = reqs.iter().map(|r| r.stripes as i64).sum();
        let unit_mean = reqs
            .iter()
            .map(|r| stripe_bytes(r, input.stripe_size) * r.stripes as f64)
            .sum::<f64>()
            / total_stripes.max(1) as f64;
        CostModel {
            input,
            weights,
            oss_load: input
                .osses
                .iter()
                .map(|o| (o.id, weights.cpu * o.cpu + weights.memory * o.memory))
                .collect(),
            mean_cap,
            unit_max,
            unit_mean,
            total_stripes,
        }
    }

    /// Stripes of the largest size that fit on `t`.
    pub fn room(&self, t: &Target) -> i64 {
        room(t, self.unit_max)
    }

    /// A stripe of a request on `t`: the load of `t`'s server (R_i → OST_jk).
    pub fn placing_on(&self, t: &Target) -> i64 {
        let load = self.oss_load.get(&t.oss).copied().unwrap_or(0.0) / 100.0;
        pct(self.weights.oss * load)
    }

    /// `t`'s first stripe and the increase for each further one (OST_jk → OSS_j: its
    /// load after them — used bytes and the I/O load of the streams written to it).
    pub fn target(&self, t: &Target) -> (i64, i64) {
        let w = self.weights;
        let space = w.ost * self.unit_mean / self.mean_cap;
        let stream = w.io * w.ost_stripe / 100.0;
        let first = w.ost * t.used / self.mean_cap + w.io * t.load / 100.0 + space + stream;
        (pct(first), pct(space + stream))
    }

    /// Each stripe of the round on one server (OSS_j → sink).
    pub fn server_step(&self) -> i64 {
        pct(self.weights.oss * self.weights.oss_stripe / 100.0)
    }

    fn target_of(&self, id: u32) -> Option<&'a Target> {
        self.input.targets.iter().find(|t| t.id == id)
    }
}

/// `x` (a fraction of load) in [`COST_SCALE`] units.
fn pct(x: f64) -> i64 {
    (x * COST_SCALE).round() as i64
}

/// Solve the Fig. 10 network for `reqs`. Returns the stripes' targets per request
/// (sorted) and the cost, or `None` if not every stripe can be carried.
///
/// Requests with the same stripe count are interchangeable ([`CostModel`]: no cost
/// depends on the request), so they share one node: source → `S` (capacity `n·S` for
/// the `n` requests of `S` stripes) → every target (capacity `n`: one stripe per request
/// and target, cost as R_i → OST_jk) → its server → sink. Its flows are exactly the
/// per-target sums of Fig. 10's flows, at the same cost, so its optimum is Fig. 10's;
/// the network has (stripe counts) × targets arcs instead of requests × targets. Each
/// node's stripes are then dealt to its requests in turn, target by target: a target
/// carries at most `n` of them, so they go to distinct requests, and each request gets
/// `S`.
pub fn solve_network(
    input: &PlaceInput,
    reqs: &[Request],
    weights: &Weights,
) -> Option<(Vec<Vec<u32>>, i64)> {
    let model = CostModel::new(input, reqs, weights);
    // Targets that can take at least one stripe.
    let eligible: Vec<(usize, i64)> = input
        .targets
        .iter()
        .enumerate()
        .map(|(k, t)| (k, model.room(t)))
        .filter(|&(_, c)| c > 0)
        .collect();
    // Servers of the eligible targets, in id order.
    let mut servers: Vec<u32> = eligible
        .iter()
        .map(|&(k, _)| input.targets[k].oss)
        .collect();
    servers.sort_unstable();
    servers.dedup();
    // The requests of each stripe count, in input order.
    let mut classes: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, r) in reqs.iter().enumerate() {
        classes.entry(r.stripes).or_default().push(i);
    }
    let c0 = 2;
    let t0 = c0 + classes.len();
    let s0 = t0 + eligible.len();
    let mut net = Network::new(s0 + servers.len());
    let (src, sink) = (0, 1);
    for (c, (&stripes, members)) in classes.iter().enumerate() {
        net.add_arc(src, c0 + c, stripes as i64 * members.len() as i64, 0, 0);
    }
    // → OST_jk: one stripe per request, cost = load of OSS_j (§III-C1).
    let mut arc_of = Vec::with_capacity(classes.len() * eligible.len());
    for (c, members) in classes.values().enumerate() {
        for (e, &(k, _)) in eligible.iter().enumerate() {
            let cost = model.placing_on(&input.targets[k]);
            arc_of.push(net.add_arc(c0 + c, t0 + e, members.len() as i64, cost, 0));
        }
    }
    // OST_jk → OSS_j: capacity = stripes that fit, cost = the OST's load after them.
    for (e, &(k, cap)) in eligible.iter().enumerate() {
        let t = &input.targets[k];
        let (first, step) = model.target(t);
        let j = servers.binary_search(&t.oss).expect("server listed");
        net.add_arc(t0 + e, s0 + j, cap, first, step);
    }
    // OSS_j → S2: uncapacitated; each stripe of the round adds `oss_stripe` % of load.
    let total_stripes = model.total_stripes;
    for j in 0..servers.len() {
        let step = model.server_step();
        net.add_arc(s0 + j, sink, total_stripes, step, step);
    }
    let res = net.solve(src, sink, total_stripes);
    if res.flow < total_stripes {
        return None;
    }
    // Dealt cheapest target first, so that at every turn the first requests (the
    // current ones, before the predicted) get the cheaper targets.
    let mut out = vec![Vec::new(); reqs.len()];
    for (c, members) in classes.values().enumerate() {
        let mut used: Vec<(i64, usize, i64)> = eligible
            .iter()
            .enumerate()
            .filter_map(|(e, &(k, _))| {
                let f = net.flow(arc_of[c * eligible.len() + e]);
                let t = &input.targets[k];
                (f > 0).then(|| (model.placing_on(t) + model.target(t).0, k, f))
            })
            .collect();
        used.sort_unstable();
        let mut turn = 0;
        for (_, k, f) in used {
            for _ in 0..f {
                out[members[turn % members.len()]].push(input.targets[k].id);
                turn += 1;
            }
        }
    }
    for targets in &mut out {
        targets.sort_unstable();
    }
    Some((out, res.cost))
}

/// Eq. (1) for a given assignment of `reqs`' stripes (`targets[i]` = ids of request
/// `i`'s targets) in the network [`solve_network`] builds — for checking the solver
/// against brute force. `None` if the assignment breaks a capacity (eq. 2) or the
/// one-stripe-per-target rule.
pub fn assignment_cost(
    input: &PlaceInput,
    reqs: &[Request],
    weights: &Weights,
    targets: &[Vec<u32>],
) -> Option<i64> {
    let model = CostModel::new(input, reqs, weights);
    let mut per_target: BTreeMap<u32, i64> = BTreeMap::new();
    let mut per_server: BTreeMap<u32, i64> = BTreeMap::new();
    let mut cost = 0i64;
    for (r, ts) in reqs.iter().zip(targets) {
        let mut seen = HashSet::new();
        if ts.len() != r.stripes as usize {
            return None;
        }
        for id in ts {
            if !seen.insert(*id) {
                return None;
            }
            let t = model.target_of(*id)?;
            cost += model.placing_on(t);
            *per_target.entry(*id).or_default() += 1;
            *per_server.entry(t.oss).or_default() += 1;
        }
    }
    for (id, f) in per_target {
        let t = model.target_of(id)?;
        if f > model.room(t) {
            return None;
        }
        let (first, step) = model.target(t);
        cost += first * f + step * f * (f - 1) / 2;
    }
    let step = model.server_step();
    for (_, f) in per_server {
        cost += step * f + step * f * (f - 1) / 2;
    }
    Some(cost)
}

fn infeasible(input: &PlaceInput, reqs: &[Request]) -> PlaceError {
    // Name the first request that cannot fit on its own, else the set as a whole.
    for r in reqs {
        let unit = stripe_bytes(r, input.stripe_size).max(input.stripe_size);
        let n = input.targets.iter().filter(|t| room(t, unit) > 0).count();
        if (r.stripes as usize) > n {
            return PlaceError::TooFewTargets {
                request: r.id,
                stripes: r.stripes,
                with_room: n,
                stripe_bytes: unit,
            };
        }
    }
    PlaceError::NoSpace(reqs.len())
}

/// Why [`place`] placed nothing.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlaceError {
    /// A request with more stripes than targets with room for one.
    #[error("request {request}: cannot place {stripes} stripes: only {with_room} targets have room for a stripe of {stripe_bytes} bytes")]
    TooFewTargets {
        /// The request's id.
        request: u64,
        /// Its stripes.
        stripes: u32,
        /// Targets with room for one of its stripes.
        with_room: usize,
        /// The size of one stripe.
        stripe_bytes: f64,
    },
    /// The requests (their number) fit one by one but not together.
    #[error("cannot place the {0} requests together: not enough free space on the targets")]
    NoSpace(usize),
    /// A request that fits alone but not in the space the requests placed before it in
    /// the same decision left (round-robin, random).
    #[error("request {request}: cannot place {stripes} stripes after the requests before it: only {with_room} targets still have room for a stripe of {stripe_bytes} bytes")]
    NoRoomLeft {
        /// The request's id.
        request: u64,
        /// Its stripes.
        stripes: u32,
        /// Targets with room left for one of its stripes.
        with_room: usize,
        /// The size of one stripe.
        stripe_bytes: f64,
    },
}

/// Why `r` (`stripes` targets with `unit` bytes free each) cannot be placed in the free
/// space `free` that the requests before it left: alone it does not fit at all, else
/// the ones before it took the room.
fn no_room_left(input: &PlaceInput, r: &Request, free: &[f64], unit: f64) -> PlaceError {
    let alone = input.targets.iter().filter(|t| t.free() >= unit).count();
    if r.stripes as usize > alone {
        return PlaceError::TooFewTargets {
            request: r.id,
            stripes: r.stripes,
            with_room: alone,
            stripe_bytes: unit,
        };
    }
    PlaceError::NoRoomLeft {
        request: r.id,
        stripes: r.stripes,
        with_room: free.iter().filter(|&&f| f >= unit).count(),
        stripe_bytes: unit,
    }
}

fn place_mcmf(
    input: &PlaceInput,
    order: usize,
    predict: usize,
    weights: &Weights,
) -> Result<Decision, PlaceError> {
    let mut reqs: Vec<Request> = input.requests.clone();
    let n = reqs.len();
    let mut predicted = predictions(input, order, predict);
    reqs.extend(predicted.iter().cloned());
    let mut dropped = 0;
    loop {
        if let Some((targets, cost)) = solve_network(input, &reqs, weights) {
            return Ok(Decision {
                placements: input
                    .requests
                    .iter()
                    .zip(targets)
                    .map(|(r, t)| Placement {
                        request: r.id,
                        targets: t,
                    })
                    .collect(),
                predicted: predicted
                    .iter()
                    .map(|p| Predicted {
                        app: p.app,
                        bytes: p.bytes,
                        stripes: p.stripes,
                    })
                    .collect(),
                dropped,
                cost,
            });
        }
        // §III-C2: one predicted request fewer, and again.
        if reqs.len() == n {
            return Err(infeasible(input, &input.requests));
        }
        reqs.pop();
        predicted.pop();
        dropped += 1;
    }
}

/// Target indices in Lustre's round-robin order: the `k`-th target of every server in
/// turn (servers and their targets by id).
pub fn round_robin_order(targets: &[Target]) -> Vec<usize> {
    let mut by_oss: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (k, t) in targets.iter().enumerate() {
        by_oss.entry(t.oss).or_default().push(k);
    }
    for v in by_oss.values_mut() {
        v.sort_by_key(|&k| targets[k].id);
    }
    let depth = by_oss.values().map(Vec::len).max().unwrap_or(0);
    let mut order = Vec::with_capacity(targets.len());
    for d in 0..depth {
        for v in by_oss.values() {
            if let Some(&k) = v.get(d) {
                order.push(k);
            }
        }
    }
    order
}

fn place_round_robin(input: &PlaceInput, state: &mut PlacerState) -> Result<Decision, PlaceError> {
    let order = round_robin_order(&input.targets);
    let n = order.len();
    let mut free: Vec<f64> = input.targets.iter().map(Target::free).collect();
    let mut placements = Vec::with_capacity(input.requests.len());
    for r in &input.requests {
        let unit = stripe_bytes(r, input.stripe_size);
        let mut chosen = Vec::with_capacity(r.stripes as usize);
        let mut scanned = 0;
        while chosen.len() < r.stripes as usize && scanned < n {
            let k = order[(state.next + scanned) % n];
            scanned += 1;
            if free[k] >= unit {
                chosen.push(k);
            }
        }
        if chosen.len() < r.stripes as usize {
            return Err(no_room_left(input, r, &free, unit));
        }
        state.next = (state.next + scanned) % n.max(1);
        for &k in &chosen {
            free[k] -= unit;
        }
        placements.push(Placement {
            request: r.id,
            targets: chosen.iter().map(|&k| input.targets[k].id).collect(),
        });
    }
    Ok(Decision {
        placements,
        ..Decision::default()
    })
}

fn place_random(input: &PlaceInput, seed: u64, decision: u64) -> Result<Decision, PlaceError> {
    let mut rng = Rng::new(seed ^ decision.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut free: Vec<f64> = input.targets.iter().map(Target::free).collect();
    let mut placements = Vec::with_capacity(input.requests.len());
    for r in &input.requests {
        let unit = stripe_bytes(r, input.stripe_size);
        // §IV-B: "a random OST from a subset of the OSTs whose ratio of available space
        // to total disk space is greater than 0.4".
        let mut good: Vec<usize> = Vec::new();
        let mut rest: Vec<usize> = Vec::new();
        for (k, t) in input.targets.iter().enumerate() {
            if free[k] < unit {
                continue;
            }
            if t.capacity > 0.0 && free[k] / t.capacity > 0.4 {
                good.push(k);
            } else {
                rest.push(k);
            }
        }
        let mut chosen = Vec::with_capacity(r.stripes as usize);
        for pool in [&mut good, &mut rest] {
            while chosen.len() < r.stripes as usize && !pool.is_empty() {
                let i = (rng.next_u64() % pool.len() as u64) as usize;
                chosen.push(pool.swap_remove(i));
            }
        }
        if chosen.len() < r.stripes as usize {
            return Err(no_room_left(input, r, &free, unit));
        }
        for &k in &chosen {
            free[k] -= unit;
        }
        placements.push(Placement {
            request: r.id,
            targets: chosen.iter().map(|&k| input.targets[k].id).collect(),
        });
    }
    Ok(Decision {
        placements,
        ..Decision::default()
    })
}
