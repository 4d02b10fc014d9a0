//! Compute time of one control cycle per policy for 10, 1 000, 10 000 and 100 000 jobs.
//!
//! `cargo bench -p policies --bench cycle` (release profile). Prints a Markdown table of
//! the median time per cycle. Stateful policies (AdapTBF) run successive cycles on the
//! same instance, as in the control loop. Pass `--quick` for a shorter run.

use std::hint::black_box;
mod timing;

use std::time::Duration;
use timing::fmt;

use policies::trace::Rng;
use policies::{build, JobSnapshot};

const SPECS: &[&str] = &[
    "uniform:4",
    "priority",
    "psharing",
    "psfa",
    "adaptbf",
    "job-fair",
    "size-fair",
    "user-fair",
    "priority-fair",
    "themis:group,user,size",
    "drf:1e12",
    "mckp",
    "mckp:100",
    "mckp-size",
];

const SIZES: [usize; 4] = [10, 1_000, 10_000, 100_000];

fn jobs(n: usize, seed: u64) -> Vec<JobSnapshot> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let demand = rng.range(10.0, 1000.0);
            let usage = demand * rng.range(0.0, 1.5);
            let mut j = JobSnapshot::new(i as u64 + 1, demand, usage);
            j.wanted = Some(usage * rng.range(1.0, 2.0));
            j.user = (i % 200) as u32;
            j.group = j.user % 10;
            j.size = 1 + (rng.next_u64() % 64) as u32;
            j.priority = 1.0 + (rng.next_u64() % 10) as f64;
            j.data_demand = demand * rng.range(1e5, 1e7);
            j
        })
        .collect()
}

fn main() {
    let quick = timing::quick();
    let budget = Duration::from_millis(if quick { 100 } else { 400 });
    let inputs: Vec<Vec<JobSnapshot>> = SIZES.iter().map(|&n| jobs(n, n as u64)).collect();
    println!("| policy | 10 jobs | 1 000 jobs | 10 000 jobs | 100 000 jobs | ns/job @ 10 000 |");
    println!("|---|---:|---:|---:|---:|---:|");
    for spec in SPECS {
        let mut row = format!("| `{spec}` |");
        let mut per_job = 0.0;
        for (k, js) in inputs.iter().enumerate() {
            let max_rate = 300.0 * js.len() as f64;
            let mut p = build(spec).unwrap();
            let mut out = Vec::with_capacity(js.len());
            // Warm-up (also fills AdapTBF's state and the scratch buffers).
            p.allocate_into(max_rate, js, &mut out);
            let median = timing::median(budget, || {
                p.allocate_into(black_box(max_rate), black_box(js), &mut out);
                black_box(&out);
            });
            if SIZES[k] == 10_000 {
                per_job = median.as_secs_f64() * 1e9 / 10_000.0;
            }
            row.push_str(&format!(" {} |", fmt(median)));
        }
        row.push_str(&format!(" {per_job:.0} |"));
        println!("{row}");
    }
}
