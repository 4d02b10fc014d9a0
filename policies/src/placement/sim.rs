//! A discrete-time simulator of Lustre servers (OSSes) and targets (OSTs) under a
//! stream of file-creation requests, after Paul et al. §IV-A1, to compare placers
//! (Figs. 11, 12, 17 and Table II).
//!
//! * **Cluster.** `osses × osts_per_oss` targets of equal capacity. A stripe being
//!   written is a stream; every step of `step` seconds a stream writes
//!   `min(B_ost / n_ost, B_oss / n_oss) · step` bytes, where `n_ost` / `n_oss` are the
//!   streams on its target / server (bandwidth shared by the streams using it: "the
//!   simulator takes into account the number of applications using a particular OST at
//!   a given timestamp", §IV-C). A request is done when all its stripes are; its
//!   bandwidth is `bytes / (done − arrival)`.
//! * **Space** is reserved when a request is placed (the MDS knows what it allocated),
//!   so `used` includes stripes still being written.
//! * **Server load**: `CPU% = 5 + 4 · streams + 40 · (bytes stored / server capacity)`
//!   (writes in progress plus reads of the data it holds), `Memory% = 10 + 2 · streams`,
//!   both capped at 100 — what a statistics collector (§III-A) would publish.
//! * **Background traffic.** Every target is, a `background` share of the time (spells
//!   of 10 minutes on average), busy with [`BG_STREAMS`] streams of clients outside the
//!   workload; they take their bandwidth share and show in the statistics.
//! * **Initial state.** Not balanced (the paper's runs start "from a highly unbalanced
//!   setup"): the targets of the first server already hold `hot_fill` of their
//!   capacity, the others `cold_fill`.
//! * **Workload.** Three applications named after the paper's traces (§IV-A3): each
//!   issues write requests with seeded inter-arrival times (uniform in 0.5–1.5 × its
//!   period) and sizes cycling through its pattern with ±`jitter`. The capacity of a
//!   target is chosen so that the expected writes fill `fill` of the cluster by the end.
//!
//! The placer sees the current statistics at every request (the paper's 5-second
//! publisher period is the default step), plus each application's last
//! [`markov::DEFAULT_WINDOW`] request sizes for MCMF's predictions.

use crate::trace::Rng;

use super::{markov, place, History, Oss, PlaceInput, Placer, PlacerState, Request, Target};

/// One application of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct App {
    /// Id (and name in the report).
    pub id: u32,
    /// Name.
    pub name: &'static str,
    /// Mean seconds between two requests.
    pub period: f64,
    /// Sizes (bytes) the requests cycle through.
    pub sizes: Vec<f64>,
    /// Relative noise on each size (uniform ±).
    pub jitter: f64,
    /// Probability that a request leaves the pattern (any size between the pattern's
    /// smallest and largest).
    pub noise: f64,
    /// Stripe count of every request.
    pub stripes: u32,
    /// Files created at once per arrival (file-per-process bursts); the arrival's bytes
    /// are split among them.
    pub files: usize,
}

impl App {
    /// Size of the application's `n`-th request (draws from `rng`).
    pub fn size(&self, n: usize, rng: &mut Rng) -> f64 {
        let base = if rng.uniform() < self.noise {
            let lo = self.sizes.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = self.sizes.iter().copied().fold(0.0, f64::max);
            rng.range(lo, hi)
        } else {
            self.sizes[n % self.sizes.len()]
        };
        base * (1.0 + rng.range(-self.jitter, self.jitter))
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MB: f64 = 1e6;

/// The three applications (IOR, HACC-IO, TPA) with periodic size patterns.
pub fn paper_apps() -> Vec<App> {
    vec![
        App {
            id: 1,
            name: "IOR",
            period: 60.0,
            sizes: vec![8.0 * GIB, 8.0 * GIB, 8.0 * GIB, 16.0 * GIB],
            jitter: 0.05,
            noise: 0.03,
            stripes: 4,
            files: 4,
        },
        App {
            id: 2,
            name: "HACC-IO",
            period: 300.0,
            sizes: vec![48.0 * GIB, 4.0 * GIB, 4.0 * GIB, 4.0 * GIB, 24.0 * GIB],
            jitter: 0.05,
            noise: 0.03,
            stripes: 8,
            files: 16,
        },
        App {
            id: 3,
            name: "TPA",
            period: 20.0,
            sizes: vec![
                0.5 * GIB,
                0.5 * GIB,
                0.5 * GIB,
                1.5 * GIB,
                1.5 * GIB,
                4.0 * GIB,
            ],
            jitter: 0.05,
            noise: 0.03,
            stripes: 2,
            files: 1,
        },
    ]
}

/// Two applications that alternate large and small files ([`PlaceScenario::alternating`]).
pub fn alternating_apps() -> Vec<App> {
    vec![
        App {
            id: 1,
            name: "BIG-SMALL",
            period: 120.0,
            sizes: vec![256.0 * GIB, 2.0 * GIB],
            jitter: 0.05,
            noise: 0.0,
            stripes: 8,
            files: 1,
        },
        App {
            id: 2,
            name: "SMALL-SMALL-BIG",
            period: 60.0,
            sizes: vec![1.0 * GIB, 1.0 * GIB, 96.0 * GIB],
            jitter: 0.05,
            noise: 0.0,
            stripes: 4,
            files: 1,
        },
    ]
}

/// A simulation setup.
#[derive(Debug, Clone, PartialEq)]
pub struct PlaceScenario {
    /// Servers.
    pub osses: usize,
    /// Targets per server.
    pub osts_per_oss: usize,
    /// Bandwidth of a target, bytes/s.
    pub ost_bandwidth: f64,
    /// Bandwidth of a server (shared by its targets' streams), bytes/s.
    pub oss_bandwidth: f64,
    /// Simulated hours.
    pub hours: f64,
    /// Step, seconds.
    pub step: f64,
    /// Seconds between two samples of the ratios.
    pub sample: f64,
    /// The applications.
    pub apps: Vec<App>,
    /// Request rate multiplier (every period divided by it).
    pub load: f64,
    /// Share of the cluster the expected writes fill by the end.
    pub fill: f64,
    /// Initial fill of the first server's targets.
    pub hot_fill: f64,
    /// Initial fill of the others.
    pub cold_fill: f64,
    /// Share of the time a target carries background traffic from other clients.
    pub background: f64,
    /// Seed of the workload and of the background traffic.
    pub seed: u64,
}

impl PlaceScenario {
    /// The paper's setup (§IV-A3): 8 OSSes × 4 OSTs, 24 hours.
    pub fn paper(seed: u64) -> Self {
        PlaceScenario {
            osses: 8,
            osts_per_oss: 4,
            ost_bandwidth: 150.0 * MB,
            oss_bandwidth: 400.0 * MB,
            hours: 24.0,
            step: 5.0,
            sample: 600.0,
            apps: paper_apps(),
            load: 1.0,
            fill: 0.6,
            hot_fill: 0.03,
            cold_fill: 0.005,
            background: 0.0,
            seed,
        }
    }

    /// The scalability setup of Fig. 17: `osts` targets, 8 per server, a workload 12×
    /// the base one, background traffic on targets a quarter of the time, `hours` long.
    pub fn scaled(osts: usize, hours: f64, seed: u64) -> Self {
        PlaceScenario {
            osses: osts.div_ceil(8),
            osts_per_oss: 8,
            hours,
            load: 12.0,
            background: 0.25,
            ..Self::paper(seed)
        }
    }

    /// Prediction's test bench: two applications alternating large and small files (a
    /// large file's stripes hold 24–32 GiB, a small one's 0.25 GiB) on 4 OSSes × 4 OSTs
    /// of 3.6 TiB that start 70 % full (the first server's 90 %), with background
    /// traffic; 4 hours of writes are 40 % of the cluster, more than its free space, so
    /// the last files fail.
    pub fn alternating(seed: u64) -> Self {
        PlaceScenario {
            osses: 4,
            osts_per_oss: 4,
            hours: 4.0,
            apps: alternating_apps(),
            fill: 0.4,
            hot_fill: 0.9,
            cold_fill: 0.7,
            background: 0.25,
            ..Self::paper(seed)
        }
    }

    /// Number of targets.
    pub fn targets(&self) -> usize {
        self.osses * self.osts_per_oss
    }

    /// Capacity of one target so that the expected writes fill `fill` of the cluster.
    pub fn ost_capacity(&self) -> f64 {
        let per_s: f64 = self
            .apps
            .iter()
            .map(|a| a.sizes.iter().sum::<f64>() / a.sizes.len() as f64 / a.period * self.load)
            .sum();
        (per_s * self.hours * 3600.0 / (self.fill * self.targets() as f64)).max(GIB)
    }
}

/// Streams of background traffic on a busy target.
pub const BG_STREAMS: usize = 3;

/// One sample of the load-balance ratios.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Hours since the start.
    pub hour: f64,
    /// Max / mean disk space used over the targets (Fig. 11).
    pub disk_ratio: f64,
    /// Max / mean CPU over the servers, averaged over the sample period (Fig. 12).
    pub cpu_ratio: f64,
}

/// What a run produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlaceSimResult {
    /// Placer spec.
    pub placer: String,
    /// Samples, every `sample` seconds.
    pub samples: Vec<Sample>,
    /// Mean over completed requests of `bytes / (done − arrival)`, bytes/s (Fig. 17).
    pub mean_bandwidth: f64,
    /// Requests placed.
    pub requests: usize,
    /// Requests completed by the end.
    pub completed: usize,
    /// Predicted requests dropped because the network was infeasible (MCMF).
    pub dropped: usize,
    /// Files the placer could not place (the cluster had no room for them).
    pub failed: usize,
    /// Bytes of the files placed.
    pub placed_bytes: f64,
}

impl PlaceSimResult {
    /// First hour from which the disk ratio stays ≤ `threshold` to the end.
    pub fn disk_settled(&self, threshold: f64) -> Option<f64> {
        settled(&self.samples, threshold, |s| s.disk_ratio)
    }
    /// First hour from which the CPU ratio stays ≤ `threshold` to the end.
    pub fn cpu_settled(&self, threshold: f64) -> Option<f64> {
        settled(&self.samples, threshold, |s| s.cpu_ratio)
    }
    /// Mean CPU ratio over the samples.
    pub fn mean_cpu_ratio(&self) -> f64 {
        mean(self.samples.iter().map(|s| s.cpu_ratio))
    }
    /// Mean disk ratio over the samples.
    pub fn mean_disk_ratio(&self) -> f64 {
        mean(self.samples.iter().map(|s| s.disk_ratio))
    }
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

fn settled(samples: &[Sample], threshold: f64, f: impl Fn(&Sample) -> f64) -> Option<f64> {
    let last_bad = samples.iter().rposition(|s| f(s) > threshold);
    match last_bad {
        None => samples.first().map(|s| s.hour),
        Some(i) => samples.get(i + 1).map(|s| s.hour),
    }
}

struct Stream {
    req: usize,
    ost: usize,
    left: f64,
}

struct Live {
    arrival: f64,
    bytes: f64,
    stripes_left: usize,
}

fn max_over_mean(xs: &[f64]) -> f64 {
    let m = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let mx = xs.iter().copied().fold(0.0, f64::max);
    if m > 0.0 {
        mx / m
    } else {
        1.0
    }
}

/// Run `sc` under `placer`.
pub fn simulate(sc: &PlaceScenario, placer: &Placer) -> PlaceSimResult {
    let n_ost = sc.targets();
    let cap = sc.ost_capacity();
    let mut used: Vec<f64> = (0..n_ost)
        .map(|k| {
            if k / sc.osts_per_oss == 0 {
                sc.hot_fill * cap
            } else {
                sc.cold_fill * cap
            }
        })
        .collect();
    let mut rng = Rng::new(sc.seed);
    let mut next_at: Vec<f64> = sc
        .apps
        .iter()
        .map(|a| rng.range(0.0, a.period / sc.load))
        .collect();
    let mut nth = vec![0usize; sc.apps.len()];
    let mut history: Vec<Vec<f64>> = vec![Vec::new(); sc.apps.len()];
    let mut streams: Vec<Stream> = Vec::new();
    let mut live: Vec<Live> = Vec::new();
    let mut state = PlacerState::default();
    let mut res = PlaceSimResult {
        placer: placer.name(),
        ..PlaceSimResult::default()
    };
    let mut bw_sum = 0.0;
    let mut cpu_acc = 0.0;
    let mut cpu_n = 0usize;
    let end = sc.hours * 3600.0;
    let steps = (end / sc.step).round() as usize;
    let per_sample = (sc.sample / sc.step).round().max(1.0) as usize;
    let oss_cap = cap * sc.osts_per_oss as f64;
    let mut n_on_ost = vec![0usize; n_ost];
    let mut n_on_oss = vec![0usize; sc.osses];
    // Background traffic of clients outside the workload: each target is busy with
    // `BG_STREAMS` streams a `background` share of the time, in spells of 10 minutes on
    // average (a Markov on/off process, seeded apart from the workload).
    let mut bg_rng = Rng::new(sc.seed ^ 0xB0B0_B0B0);
    let mut bg = vec![false; n_ost];
    let p_off = (sc.step / 600.0).min(1.0);
    let p_on = if sc.background < 1.0 {
        (p_off * sc.background / (1.0 - sc.background)).min(1.0)
    } else {
        1.0
    };
    let loads = |streams_on_oss: &[usize], used: &[f64]| -> Vec<(f64, f64)> {
        (0..sc.osses)
            .map(|j| {
                let stored: f64 = used[j * sc.osts_per_oss..(j + 1) * sc.osts_per_oss]
                    .iter()
                    .sum();
                let s = streams_on_oss[j] as f64;
                (
                    (5.0 + 4.0 * s + 40.0 * stored / oss_cap).min(100.0),
                    (10.0 + 2.0 * s).min(100.0),
                )
            })
            .collect()
    };
    for step in 0..steps {
        let t = step as f64 * sc.step;
        for (k, b) in bg.iter_mut().enumerate() {
            let flip = bg_rng.uniform() < if *b { p_off } else { p_on };
            if flip {
                *b = !*b;
                let j = k / sc.osts_per_oss;
                if *b {
                    n_on_ost[k] += BG_STREAMS;
                    n_on_oss[j] += BG_STREAMS;
                } else {
                    n_on_ost[k] -= BG_STREAMS;
                    n_on_oss[j] -= BG_STREAMS;
                }
            }
        }
        // Arrivals in [t, t + step), in time order.
        while let Some((a, at)) = next_at
            .iter()
            .copied()
            .enumerate()
            .min_by(|x, y| x.1.total_cmp(&y.1).then(x.0.cmp(&y.0)))
            .filter(|&(_, at)| at < t + sc.step)
        {
            let app = &sc.apps[a];
            let bytes = app.size(nth[a], &mut rng);
            nth[a] += 1;
            next_at[a] = at + rng.range(0.5, 1.5) * app.period / sc.load;
            let file_bytes = bytes / app.files.max(1) as f64;
            for _ in 0..app.files.max(1) {
                let load = loads(&n_on_oss, &used);
                let input = PlaceInput {
                    stripe_size: super::DEFAULT_STRIPE_SIZE,
                    osses: (0..sc.osses)
                        .map(|j| Oss {
                            id: j as u32,
                            cpu: load[j].0,
                            memory: load[j].1,
                        })
                        .collect(),
                    targets: (0..n_ost)
                        .map(|k| Target {
                            id: k as u32,
                            oss: (k / sc.osts_per_oss) as u32,
                            capacity: cap,
                            used: used[k],
                            load: (25.0 * n_on_ost[k] as f64).min(100.0),
                        })
                        .collect(),
                    requests: vec![Request {
                        id: res.requests as u64,
                        app: app.id,
                        stripes: app.stripes,
                        bytes: file_bytes,
                    }],
                    history: vec![History {
                        app: app.id,
                        bytes: history[a].clone(),
                    }],
                };
                let h = &mut history[a];
                h.push(file_bytes);
                if h.len() > markov::DEFAULT_WINDOW {
                    h.remove(0);
                }
                res.requests += 1;
                let Ok(d) = place(placer, &input, &mut state) else {
                    res.failed += 1; // the cluster has no room for it: the file fails
                    continue;
                };
                res.dropped += d.dropped;
                res.placed_bytes += file_bytes;
                let per = file_bytes / app.stripes as f64;
                let r = live.len();
                live.push(Live {
                    arrival: at,
                    bytes: file_bytes,
                    stripes_left: app.stripes as usize,
                });
                for &k in &d.placements[0].targets {
                    let k = k as usize;
                    used[k] = (used[k] + per).min(cap);
                    streams.push(Stream {
                        req: r,
                        ost: k,
                        left: per,
                    });
                    n_on_ost[k] += 1;
                    n_on_oss[k / sc.osts_per_oss] += 1;
                }
            }
        }
        // Write for one step with shared bandwidth.
        let mut finished = false;
        for s in streams.iter_mut() {
            let j = s.ost / sc.osts_per_oss;
            let rate = (sc.ost_bandwidth / n_on_ost[s.ost] as f64)
                .min(sc.oss_bandwidth / n_on_oss[j] as f64);
            s.left -= rate * sc.step;
            if s.left <= 0.0 {
                finished = true;
            }
        }
        if finished {
            let done_t = t + sc.step;
            streams.retain(|s| {
                if s.left > 0.0 {
                    return true;
                }
                n_on_ost[s.ost] -= 1;
                n_on_oss[s.ost / sc.osts_per_oss] -= 1;
                let l = &mut live[s.req];
                l.stripes_left -= 1;
                if l.stripes_left == 0 {
                    bw_sum += l.bytes / (done_t - l.arrival).max(sc.step);
                    res.completed += 1;
                }
                false
            });
        }
        let cpu: Vec<f64> = loads(&n_on_oss, &used).iter().map(|l| l.0).collect();
        cpu_acc += max_over_mean(&cpu);
        cpu_n += 1;
        if (step + 1) % per_sample == 0 {
            res.samples.push(Sample {
                hour: (t + sc.step) / 3600.0,
                disk_ratio: max_over_mean(&used),
                cpu_ratio: cpu_acc / cpu_n as f64,
            });
            cpu_acc = 0.0;
            cpu_n = 0;
        }
    }
    res.mean_bandwidth = if res.completed > 0 {
        bw_sum / res.completed as f64
    } else {
        0.0
    };
    res
}

/// Table II: accuracy (%) of an order-`order` chain on the collective trace of
/// [`paper_apps`] (`n` requests): each request's state is predicted one step ahead from
/// the last `window` requests *of its own application* (the model "differentiates
/// between the applications based on their assigned identifiers", §III-B).
pub fn markov_accuracy(seed: u64, n: usize, order: usize, window: usize) -> f64 {
    let trace = collective_trace(seed, n);
    let apps = paper_apps().len();
    let mut per_app: Vec<Vec<f64>> = vec![Vec::new(); apps];
    for &(a, b) in &trace {
        per_app[a].push(b);
    }
    let (mut hits, mut total) = (0.0, 0usize);
    for sizes in &per_app {
        let w = window.max(order + 1);
        if sizes.len() > w {
            let k = sizes.len() - w;
            hits += markov::accuracy(sizes, order, w) * k as f64 / 100.0;
            total += k;
        }
    }
    if total == 0 {
        0.0
    } else {
        100.0 * hits / total as f64
    }
}

/// The collective stream of [`paper_apps`]' requests in arrival order, `n` of them:
/// `(application index, bytes)`.
pub fn collective_trace(seed: u64, n: usize) -> Vec<(usize, f64)> {
    let apps = paper_apps();
    let mut rng = Rng::new(seed);
    let mut next_at: Vec<f64> = apps.iter().map(|a| rng.range(0.0, a.period)).collect();
    let mut nth = vec![0usize; apps.len()];
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let (a, at) = next_at
            .iter()
            .copied()
            .enumerate()
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .expect("apps");
        let app = &apps[a];
        out.push((a, app.size(nth[a], &mut rng)));
        nth[a] += 1;
        next_at[a] = at + rng.range(0.5, 1.5) * app.period;
    }
    out
}

/// The placers compared in Figs. 11 and 12.
pub const FIG_PLACERS: [&str; 3] = ["mcmf", "round-robin", "random"];

/// Requests of the Table II trace.
pub const TABLE2_REQUESTS: usize = 3000;

/// Everything `policies place-sim` reports.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Figs. 11/12: one run per placer on [`PlaceScenario::paper`].
    pub balance: Vec<PlaceSimResult>,
    /// Fig. 17: `(targets, placer, mean bandwidth bytes/s)`.
    pub scaling: Vec<(usize, String, f64)>,
    /// Table II: `(order, accuracy %, microseconds per prediction)`.
    pub markov: Vec<(usize, f64, f64)>,
}

/// Run Figs. 11, 12 (`hours`, 32 targets), 17 (`osts`, `scale_hours` each) and Table II.
pub fn figures(seed: u64, hours: f64, osts: &[usize], scale_hours: f64) -> Figures {
    let sc = PlaceScenario {
        hours,
        ..PlaceScenario::paper(seed)
    };
    let balance = FIG_PLACERS
        .iter()
        .map(|p| simulate(&sc, &Placer::parse(p).expect("known placer")))
        .collect();
    let mut scaling = Vec::new();
    for &n in osts {
        let sc = PlaceScenario::scaled(n, scale_hours, seed);
        for p in ["mcmf", "round-robin"] {
            let r = simulate(&sc, &Placer::parse(p).expect("known placer"));
            scaling.push((sc.targets(), p.to_string(), r.mean_bandwidth));
        }
    }
    let markov = (1..=markov::MAX_ORDER)
        .map(|m| {
            let t = std::time::Instant::now();
            let acc = markov_accuracy(seed, TABLE2_REQUESTS, m, markov::DEFAULT_WINDOW);
            let us = t.elapsed().as_secs_f64() * 1e6 / TABLE2_REQUESTS as f64;
            (m, acc, us)
        })
        .collect();
    Figures {
        balance,
        scaling,
        markov,
    }
}

/// The placers compared on [`PlaceScenario::alternating`]: MCMF with and without
/// prediction, and round-robin for reference.
pub const PREDICTION_PLACERS: [&str; 3] = ["mcmf:3,3", "mcmf:0", "round-robin"];

/// One run of [`PlaceScenario::alternating`] per placer of [`PREDICTION_PLACERS`].
pub fn prediction_runs(seed: u64) -> Vec<PlaceSimResult> {
    let sc = PlaceScenario::alternating(seed);
    PREDICTION_PLACERS
        .iter()
        .map(|p| simulate(&sc, &Placer::parse(p).expect("known placer")))
        .collect()
}

/// Markdown table of [`prediction_runs`].
pub fn prediction_markdown(seed: u64, runs: &[PlaceSimResult]) -> String {
    let mut s = format!(
        "### Prediction: alternating large and small files on nearly full targets (seed {seed})\n\n| placer | files placed | files failed | GiB placed | disk max/mean at the end | mean CPU max/mean | mean bandwidth (MB/s) | predictions dropped |\n|---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in runs {
        let end = r.samples.last().map_or(1.0, |x| x.disk_ratio);
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.3} | {:.3} | {:.1} | {} |\n",
            r.placer,
            r.requests - r.failed,
            r.failed,
            r.placed_bytes / GIB,
            end,
            r.mean_cpu_ratio(),
            r.mean_bandwidth / MB,
            r.dropped
        ));
    }
    s
}

fn hours(h: Option<f64>) -> String {
    h.map_or("never".into(), |h| format!("{h:.1} h"))
}

/// Markdown tables of [`Figures`].
pub fn markdown(f: &Figures) -> String {
    let mut s = String::from(
        "### Figs. 11–12: 8 OSSes × 4 OSTs\n\n| placer | disk max/mean at 1 h | 6 h | 12 h | 24 h | disk ≤ 1.1 from | mean CPU max/mean | CPU ≤ 1.2 from | mean bandwidth (MB/s) | predictions dropped |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &f.balance {
        let at = |h: f64| {
            r.samples
                .iter()
                .find(|x| x.hour >= h - 1e-9)
                .map_or("—".to_string(), |x| format!("{:.2}", x.disk_ratio))
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.3} | {} | {:.0} | {} |\n",
            r.placer,
            at(1.0),
            at(6.0),
            at(12.0),
            at(24.0),
            hours(r.disk_settled(1.1)),
            r.mean_cpu_ratio(),
            hours(r.cpu_settled(1.2)),
            r.mean_bandwidth / MB,
            r.dropped
        ));
    }
    if !f.scaling.is_empty() {
        s.push_str("\n### Fig. 17: mean request bandwidth (MB/s) vs targets\n\n| OSTs | mcmf | round-robin | gain |\n|---:|---:|---:|---:|\n");
        for pair in f.scaling.chunks(2) {
            if let [(n, _, m), (_, _, r)] = pair {
                s.push_str(&format!(
                    "| {n} | {:.0} | {:.0} | {:+.1} % |\n",
                    m / MB,
                    r / MB,
                    100.0 * (m / r - 1.0)
                ));
            }
        }
    }
    s.push_str("\n### Table II: Markov chain accuracy by order (per-application chains on the collective trace, window 256)\n\n| order | accuracy (%) | paper (%) | µs per prediction |\n|---:|---:|---:|---:|\n");
    const PAPER: [f64; 8] = [65.6, 78.7, 95.5, 96.3, 96.8, 97.2, 97.5, 97.8];
    for &(m, a, us) in &f.markov {
        s.push_str(&format!("| {m} | {a:.1} | {} | {us:.1} |\n", PAPER[m - 1]));
    }
    s
}
