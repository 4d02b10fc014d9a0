//! How `max_rate = "auto"` (`policies::capacity`) behaves on simulated file systems:
//! for each curve shape `κ` (target / no-load latency − 1), latency noise (standard
//! deviation of the log of each measured quantile) and enforcement lag, 200 seeded runs
//! of a random capacity step (×0.25 … ×4) under saturating demand; prints the intervals until `Max_R` stays within ±10 % of the new
//! capacity (median and worst) and the worst deviation afterwards.
//!
//! `cargo run --release -p policies --example capacity_table`

use policies::capacity::model::{ClosedLoop, SimulatedFs};
use policies::capacity::{CapacityEstimator, Settings};
use policies::trace::Rng;

const RUNS: usize = 200;
const SATURATING: f64 = 1e13;

fn main() {
    let mut rng = Rng::new(20);
    println!("| κ | noise | lag | intervals to ±10 % (median / worst) | worst |Max_R / C − 1| after 10 |");
    println!("|---:|---:|---:|---:|---:|");
    for kappa in [0.25, 0.5, 1.0, 2.0, 4.0] {
        for noise in [0.0, 0.01, 0.02] {
            for lag in [0.0, 0.3] {
                let mut settles = Vec::with_capacity(RUNS);
                let mut worst_deviation: f64 = 0.0;
                for _ in 0..RUNS {
                    let capacity = 10f64.powf(rng.range(2.0, 6.0));
                    let target = 10f64.powf(rng.range(-4.0, -1.0));
                    let step = if rng.uniform() < 0.5 {
                        rng.range(0.25, 0.9)
                    } else {
                        rng.range(1.1, 4.0)
                    };
                    let settings =
                        Settings::new(Some(target), None, capacity / 100.0, capacity * 100.0);
                    let estimator = CapacityEstimator::new(settings).expect("valid settings");
                    let fs =
                        SimulatedFs::with_capacity(capacity, target, kappa, noise, rng.next_u64());
                    let mut sim = ClosedLoop::new(fs, estimator);
                    sim.lag = lag;
                    for _ in 0..40 {
                        sim.run(SATURATING);
                    }
                    let new_capacity = capacity * step;
                    sim.fs.set_capacity(new_capacity, target);
                    let ratios: Vec<f64> = (0..110)
                        .map(|_| sim.run(SATURATING).next_max_rate / new_capacity)
                        .collect();
                    let settle = (0..30)
                        .find(|&k| ratios[k..30].iter().all(|r| (r - 1.0).abs() <= 0.1))
                        .map_or(usize::MAX, |k| k + 1);
                    settles.push(settle);
                    let deviation = ratios[10..]
                        .iter()
                        .map(|r| (r - 1.0).abs())
                        .fold(0.0, f64::max);
                    worst_deviation = worst_deviation.max(deviation);
                }
                settles.sort_unstable();
                let show = |n: usize| {
                    if n == usize::MAX {
                        "> 30".to_string()
                    } else {
                        n.to_string()
                    }
                };
                println!(
                    "| {kappa} | {:.1} % | {lag} | {} / {} | {:.1} % |",
                    noise * 100.0,
                    show(settles[RUNS / 2]),
                    show(settles[RUNS - 1]),
                    worst_deviation * 100.0
                );
            }
        }
    }
}
