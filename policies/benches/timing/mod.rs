//! What the policies' bench binaries share: the median of repeated runs and its format.

use std::time::{Duration, Instant};

/// Whether `--quick` was passed (a shorter budget, e.g. for a smoke run).
pub fn quick() -> bool {
    std::env::args().any(|a| a == "--quick")
}

/// The median time of `run`, repeated at least 5 times and while `budget` lasts (at most
/// 10 000 times, and never past 10 × `budget` for a slow `run`).
pub fn median(budget: Duration, mut run: impl FnMut()) -> Duration {
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < budget && times.len() < 10_000) {
        let t = Instant::now();
        run();
        times.push(t.elapsed());
        if start.elapsed() > budget * 10 {
            break;
        }
    }
    times.sort();
    times[times.len() / 2]
}

/// `d` in µs below a millisecond, else in ms.
pub fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}
