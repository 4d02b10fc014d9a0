//! A batch of file creations for `policies place`, and the spread of its answer.
//!
//! `place_batch N M [SEED]` prints a `place` input: `M` targets of 10 TB, four per
//! server, 10–70 % used (uniform), I/O load 0–50 %, servers at CPU 5–95 % and memory
//! 10–80 %; `N` requests of 1–8 stripes (uniform) and 1 MB–64 GB (log-uniform), from 16
//! applications, no history. Seeded (default 1).
//!
//! `place_batch --spread M` reads `place`'s output and prints the stripes, the targets
//! used (of `M`), and the most and mean stripes per target (the mean over all `M`).
//!
//! ```sh
//! cargo run --release -p policies --example place_batch -- 10000 1000 > batch.json
//! target/release/policies place --placer mcmf:0 < batch.json \
//!   | cargo run --release -p policies --example place_batch -- --spread 1000
//! ```
//! `scripts/bench-place-batch.sh` runs the README's batch table this way.

use std::collections::HashMap;
use std::io::Read;
use std::process::ExitCode;

use policies::placement::{Oss, PlaceInput, Request, Target};
use policies::trace::Rng;

const OSTS_PER_OSS: usize = 4;
const CAPACITY: f64 = 1e13;

fn batch(requests: usize, targets: usize, seed: u64) -> PlaceInput {
    let mut rng = Rng::new(seed);
    PlaceInput {
        stripe_size: 1_048_576.0,
        osses: (0..targets.div_ceil(OSTS_PER_OSS))
            .map(|j| Oss {
                id: j as u32,
                cpu: rng.range(5.0, 95.0),
                memory: rng.range(10.0, 80.0),
            })
            .collect(),
        targets: (0..targets)
            .map(|k| Target {
                id: k as u32,
                oss: (k / OSTS_PER_OSS) as u32,
                capacity: CAPACITY,
                used: CAPACITY * rng.range(0.1, 0.7),
                load: rng.range(0.0, 50.0),
            })
            .collect(),
        requests: (0..requests)
            .map(|i| Request {
                id: i as u64,
                app: (rng.next_u64() % 16) as u32,
                stripes: 1 + (rng.next_u64() % 8) as u32,
                bytes: 10f64.powf(rng.range(6.0, 10.806)).round(),
            })
            .collect(),
        history: Vec::new(),
    }
}

/// Stripes per target in `place`'s output.
fn spread(output: &str, targets: usize) -> Result<String, String> {
    let v: serde_json::Value =
        serde_json::from_str(output).map_err(|e| format!("bad output: {e}"))?;
    let placements = v["placements"]
        .as_array()
        .ok_or("no `placements` in the output")?;
    let mut per_target: HashMap<u64, u64> = HashMap::new();
    for p in placements {
        for t in p["targets"]
            .as_array()
            .ok_or("a placement without `targets`")?
        {
            *per_target
                .entry(t.as_u64().ok_or("a bad target id")?)
                .or_default() += 1;
        }
    }
    let stripes: u64 = per_target.values().sum();
    let max = per_target.values().copied().max().unwrap_or(0);
    let mean = stripes as f64 / targets.max(1) as f64;
    Ok(format!(
        "stripes {stripes}, targets used {} of {targets}, max {max}, mean {mean:.2}, max/mean {:.2}",
        per_target.len(),
        max as f64 / mean.max(f64::MIN_POSITIVE)
    ))
}

fn run(args: &[String]) -> Result<String, String> {
    let number = |s: &String, what: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("bad {what} `{s}` (expected an integer)"))
    };
    match args {
        [flag, m] if flag == "--spread" => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("reading stdin: {e}"))?;
            spread(&text, number(m, "target count")? as usize)
        }
        [n, m, rest @ ..] if rest.len() <= 1 => {
            let seed = rest.first().map(|s| number(s, "seed")).transpose()?;
            let input = batch(
                number(n, "request count")? as usize,
                number(m, "target count")? as usize,
                seed.unwrap_or(1),
            );
            serde_json::to_string(&input).map_err(|e| e.to_string())
        }
        _ => Err("usage: place_batch N M [SEED] | place_batch --spread M".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("place_batch: {e}");
            ExitCode::from(2)
        }
    }
}
