//! Compute time of one placement decision (Paul et al. §III-C) at 100, 1 000 and 8 000
//! targets (8 per server), for one request of 4 stripes: MCMF without prediction, MCMF
//! with the paper's order-3 chain and 3 predicted requests (4 requests, 16 stripes in the
//! network), round-robin and random. The time includes building the flow network and
//! the Markov prediction over a 256-request history.
//!
//! `cargo bench -p policies --bench place` (release profile). Prints a Markdown table of
//! the median time per decision. Pass `--quick` for a shorter run.

use std::hint::black_box;
mod timing;

use std::time::Duration;
use timing::fmt;

use policies::placement::{place, History, Oss, PlaceInput, Placer, PlacerState, Request, Target};
use policies::trace::Rng;

const PLACERS: &[&str] = &["mcmf:0", "mcmf", "round-robin", "random"];
const SIZES: [usize; 3] = [100, 1_000, 8_000];

fn input(n: usize, seed: u64) -> PlaceInput {
    let mut rng = Rng::new(seed);
    let osses = n.div_ceil(8);
    PlaceInput {
        stripe_size: 1_048_576.0,
        osses: (0..osses)
            .map(|j| Oss {
                id: j as u32,
                cpu: rng.range(5.0, 95.0),
                memory: rng.range(10.0, 80.0),
            })
            .collect(),
        targets: (0..n)
            .map(|k| Target {
                id: k as u32,
                oss: (k / 8) as u32,
                capacity: 1e13,
                used: rng.range(0.0, 8e12),
                load: rng.range(0.0, 100.0),
            })
            .collect(),
        requests: vec![Request {
            id: 1,
            app: 1,
            stripes: 4,
            bytes: 16e9,
        }],
        history: vec![History {
            app: 1,
            bytes: (0..256)
                .map(|i| [8e9, 8e9, 8e9, 16e9][i % 4] * rng.range(0.95, 1.05))
                .collect(),
        }],
    }
}

fn main() {
    let quick = timing::quick();
    let budget = Duration::from_millis(if quick { 100 } else { 500 });
    let inputs: Vec<PlaceInput> = SIZES.iter().map(|&n| input(n, n as u64)).collect();
    println!("| placer | 100 targets | 1 000 targets | 8 000 targets |");
    println!("|---|---:|---:|---:|");
    for spec in PLACERS {
        let placer = Placer::parse(spec).unwrap();
        let mut row = format!("| `{}` |", placer.name());
        for inp in &inputs {
            let mut state = PlacerState::default();
            place(&placer, inp, &mut state).unwrap();
            let median = timing::median(budget, || {
                black_box(place(&placer, black_box(inp), &mut state).unwrap());
            });
            row.push_str(&format!(" {} |", fmt(median)));
        }
        println!("{row}");
    }
}
