//! A discrete-time simulator of jobs issuing metadata operations against one resource
//! of capacity `Max_R`, under a control policy (the PADLL §V-C per-job QoS experiments).
//!
//! * Time advances in steps of `step` seconds (≤ 0.1 s by default). Each job has a
//!   per-second demand trace ([`crate::trace`]); in each step it adds `trace[s]·step`
//!   operations to its backlog and issues at most `rate·step` of them. Operations not
//!   admitted stay in the backlog.
//! * Every `interval` seconds (default 1 s) the control loop runs the policy on what it
//!   observed during the interval — per job `usage` (served ops/s) and `wanted`
//!   (ops/s it would have issued unthrottled: backlog at the start of the interval plus
//!   new arrivals) — and the new rates take effect from the next step. A job that
//!   arrives between two cycles waits for the next cycle (≤ one interval) for a rate.
//! * A job finishes when its trace is over and its backlog is empty; its completion
//!   time is recorded and it leaves the snapshot.
//!
//! [`Scenario::paper`] builds scenarios #1–#3 of PADLL Table I: four jobs entering 3
//! minutes apart, `Max_R` = 110 kops/s.

use crate::trace::{self, JobTrace, LoadShape};
use crate::{JobSnapshot, Policy};

/// One job of a scenario.
#[derive(Debug, Clone)]
pub struct SimJob {
    /// Job number (1-based, as in the paper's figures).
    pub id: u64,
    /// Arrival time, seconds from the start of the experiment.
    pub start: f64,
    /// The job's QoS demand (Table I rate limit), ops/s.
    pub demand: f64,
    /// Node count (priority for AdapTBF and size-fair).
    pub size: u32,
    /// Priority weight.
    pub priority: f64,
    /// Owner (ThemisIO user-fair).
    pub user: u32,
    /// Account (ThemisIO group-fair).
    pub group: u32,
    /// Operations to issue in each second of the job's life.
    pub trace: Vec<f64>,
}

/// A simulation setup.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Human-readable name.
    pub name: String,
    /// Capacity `Max_R` of the resource (ops/s).
    pub max_rate: f64,
    /// Simulation step, seconds.
    pub step: f64,
    /// Control-loop interval, seconds.
    pub interval: f64,
    /// The jobs.
    pub jobs: Vec<SimJob>,
    /// Give up after this many seconds (a policy that starves a job must not loop forever).
    pub horizon: f64,
}

/// PADLL Table I: (load proportion, rate limit in kops/s) per job, per scenario.
pub const TABLE_I: [[(f64, f64); 4]; 3] = [
    [(0.25, 15.0), (0.25, 25.0), (0.25, 30.0), (0.25, 40.0)],
    [(0.15, 15.0), (0.20, 25.0), (0.20, 30.0), (0.45, 40.0)],
    [(0.15, 40.0), (0.20, 25.0), (0.20, 30.0), (0.45, 15.0)],
];

impl Scenario {
    /// Scenario `n` (1–3) of PADLL Table I over the given aggregate trace (ops/s per
    /// second, e.g. from [`trace::generate_aggregate`]): job `k` starts at `180·(k−1)` s
    /// and replays its load proportion of the trace; its demand is its Table I rate; its
    /// node count is that rate / 5 kops/s (3, 5, 6, 8), so that size-based policies
    /// (AdapTBF, size-fair) see the same priorities as the others.
    pub fn paper(n: usize, aggregate: &[f64]) -> Option<Scenario> {
        let row = TABLE_I.get(n.checked_sub(1)?)?;
        let props: Vec<f64> = row.iter().map(|r| r.0).collect();
        let traces = trace::split(aggregate, &props);
        Some(Self::paper_with_traces(n, &traces))
    }

    /// Scenario `n` with explicit per-job traces (e.g. read from a trace file).
    pub fn paper_with_traces(n: usize, traces: &[JobTrace]) -> Scenario {
        let row = TABLE_I[(n.clamp(1, 3)) - 1];
        let jobs = row
            .iter()
            .zip(traces)
            .enumerate()
            .map(|(k, (&(_, kops), t))| SimJob {
                id: k as u64 + 1,
                start: 180.0 * k as f64,
                demand: kops * 1000.0,
                size: (kops / 5.0).round() as u32,
                priority: kops,
                user: k as u32 + 1,
                group: 1,
                trace: t.totals(),
            })
            .collect();
        Scenario {
            name: format!("scenario #{n}"),
            max_rate: 110_000.0,
            step: 0.1,
            interval: 1.0,
            jobs,
            horizon: 6.0 * 3600.0,
        }
    }

    /// Scenario `n` with the default generated trace of `seed`.
    pub fn paper_generated(n: usize, seed: u64) -> Option<Scenario> {
        let agg = trace::generate_aggregate(&LoadShape {
            seed,
            ..LoadShape::default()
        });
        Self::paper(n, &agg)
    }
}

/// What a simulation produced.
#[derive(Debug, Clone, Default)]
pub struct SimResult {
    /// Policy name.
    pub policy: String,
    /// Completion time of each job (seconds from the experiment start), `None` if it
    /// had not finished by the horizon.
    pub completion: Vec<Option<f64>>,
    /// Served operations per job per whole second: `throughput[s][j]`.
    pub throughput: Vec<Vec<f64>>,
    /// Largest aggregate served in one second (ops/s).
    pub peak: f64,
    /// Seconds in which the aggregate exceeded `Max_R`.
    pub seconds_over: usize,
    /// Control cycles run.
    pub cycles: usize,
}

impl SimResult {
    /// Time at which the last job finished (seconds), if all did.
    pub fn makespan(&self) -> Option<f64> {
        self.completion
            .iter()
            .try_fold(0.0f64, |m, c| c.map(|c| m.max(c)))
    }
}

#[derive(Debug, Clone, Default)]
struct State {
    backlog: f64,
    issued_until: usize, // whole seconds of the trace already added
    frac: f64,           // position inside the trace, seconds
    rate: f64,
    served_interval: f64,
    wanted_interval: f64,
    done: Option<f64>,
    active: bool,
}

/// Smallest simulation step, seconds ([`simulate`] clamps a smaller one; the CLI
/// refuses it).
pub const MIN_STEP: f64 = 1e-3;

/// Run `scenario` under `policy`.
pub fn simulate(scenario: &Scenario, policy: &mut dyn Policy) -> SimResult {
    policy.set_interval(scenario.interval);
    let n = scenario.jobs.len();
    let dt = scenario
        .step
        .clamp(MIN_STEP, scenario.interval.max(MIN_STEP));
    let steps_per_interval = (scenario.interval / dt).round().max(1.0) as usize;
    let mut st = vec![State::default(); n];
    let mut res = SimResult {
        policy: policy.name(),
        completion: vec![None; n],
        ..SimResult::default()
    };
    let mut snaps: Vec<JobSnapshot> = Vec::with_capacity(n);
    let mut idx: Vec<usize> = Vec::with_capacity(n);
    let mut rates: Vec<f64> = Vec::with_capacity(n);
    let mut second_served = vec![0.0; n];
    let mut step = 0usize;
    let eps = 1e-6;
    loop {
        let t = step as f64 * dt;
        if t >= scenario.horizon || st.iter().all(|s| s.done.is_some()) {
            break;
        }
        // Control loop at interval boundaries (on the previous interval's observations).
        if step > 0 && step.is_multiple_of(steps_per_interval) {
            snaps.clear();
            idx.clear();
            for (k, (j, s)) in scenario.jobs.iter().zip(&st).enumerate() {
                if s.active && s.done.is_none() {
                    let mut snap =
                        JobSnapshot::new(j.id, j.demand, s.served_interval / scenario.interval);
                    snap.wanted = Some(s.wanted_interval / scenario.interval);
                    snap.size = j.size;
                    snap.priority = j.priority;
                    snap.user = j.user;
                    snap.group = j.group;
                    snaps.push(snap);
                    idx.push(k);
                }
            }
            policy.allocate_into(scenario.max_rate, &snaps, &mut rates);
            res.cycles += 1;
            for (&k, &r) in idx.iter().zip(&rates) {
                st[k].rate = if r.is_nan() { 0.0 } else { r.max(0.0) };
            }
            for s in st.iter_mut() {
                s.served_interval = 0.0;
                // Next interval's `wanted` starts with the backlog carried into it.
                s.wanted_interval = s.backlog;
            }
        }
        // One step of every job.
        for (k, (j, s)) in scenario.jobs.iter().zip(st.iter_mut()).enumerate() {
            if s.done.is_some() || t + eps < j.start {
                continue;
            }
            if !s.active {
                s.active = true;
                s.rate = 0.0;
            }
            // Arrivals: the part of the trace covering [frac, frac + dt).
            let mut arrivals = 0.0;
            let mut left = dt;
            while left > eps && s.issued_until < j.trace.len() {
                let sec = s.issued_until;
                let in_sec = (sec as f64 + 1.0 - s.frac).min(left);
                arrivals += j.trace[sec] * in_sec;
                s.frac += in_sec;
                left -= in_sec;
                if s.frac + eps >= sec as f64 + 1.0 {
                    s.issued_until += 1;
                    s.frac = s.issued_until as f64;
                }
            }
            s.backlog += arrivals;
            s.wanted_interval += arrivals;
            let served = if s.rate.is_infinite() {
                s.backlog
            } else {
                s.backlog.min(s.rate * dt)
            };
            s.backlog -= served;
            s.served_interval += served;
            second_served[k] += served;
            if s.issued_until >= j.trace.len() && s.backlog < 0.5 {
                s.backlog = 0.0;
                s.done = Some(t + dt);
                res.completion[k] = Some(t + dt);
            }
        }
        step += 1;
        // Close a whole second of throughput.
        let now = step as f64 * dt;
        if (now + eps).floor() > ((now - dt) + eps).floor() {
            let total: f64 = second_served.iter().sum();
            res.peak = res.peak.max(total);
            if total > scenario.max_rate * (1.0 + 1e-9) + 1e-6 {
                res.seconds_over += 1;
            }
            res.throughput
                .push(std::mem::replace(&mut second_served, vec![0.0; n]));
        }
    }
    if second_served.iter().any(|&x| x > 0.0) {
        res.throughput.push(second_served);
    }
    res
}

/// Format seconds as minutes with one decimal.
pub fn minutes(s: Option<f64>) -> String {
    match s {
        Some(s) => format!("{:.1}", s / 60.0),
        None => "—".into(),
    }
}

/// A Markdown table row per policy: job completion times and makespan (minutes),
/// peak aggregate and the seconds over `Max_R`.
pub fn markdown_table(scenario: &Scenario, results: &[SimResult]) -> String {
    let mut s = String::new();
    s.push_str("| policy |");
    for j in &scenario.jobs {
        s.push_str(&format!(" job {} (min) |", j.id));
    }
    s.push_str(" makespan (min) | peak (kops/s) | seconds > Max_R |\n|---|");
    for _ in &scenario.jobs {
        s.push_str("---:|");
    }
    s.push_str("---:|---:|---:|\n");
    for r in results {
        s.push_str(&format!("| {} |", r.policy));
        for c in &r.completion {
            s.push_str(&format!(" {} |", minutes(*c)));
        }
        s.push_str(&format!(
            " {} | {:.1} | {} |\n",
            minutes(r.makespan()),
            r.peak / 1000.0,
            r.seconds_over
        ));
    }
    s
}

/// Per-second throughput as CSV: `second,job1,...,jobN,total` (ops/s).
pub fn throughput_csv(scenario: &Scenario, r: &SimResult) -> String {
    let mut s = String::from("second");
    for j in &scenario.jobs {
        s.push_str(&format!(",job{}", j.id));
    }
    s.push_str(",total\n");
    for (sec, row) in r.throughput.iter().enumerate() {
        s.push_str(&sec.to_string());
        for x in row {
            s.push_str(&format!(",{x:.1}"));
        }
        s.push_str(&format!(",{:.1}\n", row.iter().sum::<f64>()));
    }
    s
}
