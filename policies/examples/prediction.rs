//! Does MCMF's Markov prediction change the outcome? Every run of `mcmf:3,3` against
//! `mcmf:0` (and round-robin), seeds 1–5 and 42, on the paper's setup (Figs. 11–12, 24 h;
//! Fig. 17 at 160 OSTs, 2 h) and on `PlaceScenario::alternating`.
//!
//! `cargo run --release -p policies --example prediction`

use policies::placement::sim::{self, PlaceScenario, PlaceSimResult};
use policies::placement::Placer;

const SEEDS: [u64; 6] = [1, 2, 3, 4, 5, 42];

fn row(scenario: &str, seed: u64, r: &PlaceSimResult) {
    println!(
        "| {scenario} | {seed} | {} | {} | {} | {:.0} | {:.3} | {:.3} | {:.1} | {} |",
        r.placer,
        r.requests - r.failed,
        r.failed,
        r.placed_bytes / f64::from(1u32 << 30),
        r.samples.last().map_or(1.0, |s| s.disk_ratio),
        r.mean_cpu_ratio(),
        r.mean_bandwidth / 1e6,
        r.dropped
    );
}

fn main() {
    println!("| scenario | seed | placer | files placed | failed | GiB placed | disk max/mean at the end | mean CPU max/mean | mean bandwidth (MB/s) | predictions dropped |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    let placers = ["mcmf:3,3", "mcmf:0"];
    for seed in SEEDS {
        let scenarios = [
            ("paper 24 h", PlaceScenario::paper(seed)),
            ("Fig. 17, 160 OSTs", PlaceScenario::scaled(160, 2.0, seed)),
        ];
        for (name, sc) in &scenarios {
            for p in placers {
                row(
                    name,
                    seed,
                    &sim::simulate(sc, &Placer::parse(p).expect("placer")),
                );
            }
        }
        for r in sim::prediction_runs(seed) {
            row("alternating", seed, &r);
        }
    }
}
