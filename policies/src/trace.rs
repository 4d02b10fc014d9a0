//! Metadata load traces: a seeded generator shaped like PADLL §II-A and a plain-text
//! file format that the simulator and the real replayer both read.
//!
//! ## File format (`padll-trace v1`)
//! CSV, UTF-8, `#` lines are comments. The first non-comment line is the header
//! ```text
//! second,job,open,close,getattr,setattr,rename,mkdir,unlink
//! ```
//! then one row per (second, job): `second` counts from **the job's own start** (0, 1,
//! 2, …), `job` is the job's number in the scenario (1-based), and each remaining column
//! is the number of operations of that type the job issues during that second. Rows are
//! sorted by `second` then `job`; a job's trace ends at its last row. Extra trailing
//! columns are ignored by readers, so new operation types can be appended.
//!
//! ## Generator
//! [`generate_aggregate`] draws a per-second aggregate load with a regime-switching model
//! (calm / normal / high periods with random dwell times), short bursts of 2.5–4× and
//! multiplicative noise, then rescales it to the requested mean. [`split`] gives each job
//! its Table I load proportion of that aggregate, and [`OP_MIX`] splits every second's
//! operations by type with the proportions of PADLL Fig. 3 (open, close, getattr and
//! rename are 98 % of the load; getattr ≈ 47 %).

use std::fmt::Write as _;
use std::io::{BufRead, Write};

/// Operation types of a trace row, in column order.
pub const OP_TYPES: [&str; 7] = [
    "open", "close", "getattr", "setattr", "rename", "mkdir", "unlink",
];

/// Share of each operation type in the generated load (sums to 1), after PADLL §II-A /
/// Fig. 3: open 29 kops/s and close 43.5 kops/s of ~200 kops/s, getattr ≈ 47 %, open +
/// close + getattr + rename ≈ 98 %.
pub const OP_MIX: [f64; 7] = [0.145, 0.2175, 0.475, 0.008, 0.1425, 0.003, 0.009];

/// A small deterministic PRNG (SplitMix64): no dependency, same stream on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }
}

/// Parameters of the aggregate load generator.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadShape {
    /// Length of the trace in seconds (PADLL §V-C: 36 minutes).
    pub seconds: usize,
    /// Mean aggregate rate, ops/s.
    pub mean: f64,
    /// Seed of the PRNG.
    pub seed: u64,
}

impl Default for LoadShape {
    fn default() -> Self {
        LoadShape {
            seconds: 36 * 60,
            mean: 90_000.0,
            seed: 42,
        }
    }
}

/// Generate the per-second aggregate load (ops/s) described in the module docs.
pub fn generate_aggregate(shape: &LoadShape) -> Vec<f64> {
    let mut rng = Rng::new(shape.seed);
    // Regimes: (relative level, mean dwell in seconds).
    const REGIMES: [(f64, f64); 4] = [(0.25, 90.0), (0.8, 150.0), (1.3, 120.0), (2.0, 60.0)];
    let mut regime = 1usize;
    let mut dwell = 0.0;
    let mut burst_left = 0usize;
    let mut burst_mult = 1.0;
    let mut level = REGIMES[regime].0;
    let mut out = Vec::with_capacity(shape.seconds);
    for _ in 0..shape.seconds {
        if dwell <= 0.0 {
            regime = (rng.next_u64() % REGIMES.len() as u64) as usize;
            dwell = -REGIMES[regime].1 * (1.0 - rng.uniform()).ln();
        }
        dwell -= 1.0;
        // Smooth transitions between regime levels.
        level += (REGIMES[regime].0 - level) * 0.2;
        if burst_left == 0 && rng.uniform() < 0.02 {
            burst_left = 3 + (rng.next_u64() % 25) as usize;
            burst_mult = rng.range(2.5, 4.0);
        }
        let b = if burst_left > 0 {
            burst_left -= 1;
            burst_mult
        } else {
            1.0
        };
        let noise = rng.range(0.7, 1.3);
        out.push(level * b * noise);
    }
    let m = out.iter().sum::<f64>() / out.len().max(1) as f64;
    if m > 0.0 {
        for x in out.iter_mut() {
            *x *= shape.mean / m;
        }
    }
    out
}

/// One job's trace: per second, the number of operations of each type ([`OP_TYPES`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobTrace {
    /// `ops[s][k]`: operations of type `k` issued during second `s` of the job.
    pub ops: Vec<[u64; 7]>,
}

impl JobTrace {
    /// Total operations per second.
    pub fn totals(&self) -> Vec<f64> {
        self.ops
            .iter()
            .map(|r| r.iter().sum::<u64>() as f64)
            .collect()
    }
}

/// Split `count` operations by [`OP_MIX`] with largest-remainder rounding.
pub fn split_ops(count: u64) -> [u64; 7] {
    let mut out = [0u64; 7];
    let mut fr = [(0.0f64, 0usize); 7];
    let mut used = 0;
    for k in 0..7 {
        let x = count as f64 * OP_MIX[k];
        out[k] = x.floor() as u64;
        used += out[k];
        fr[k] = (x - x.floor(), k);
    }
    fr.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, k) in fr.iter().take((count - used.min(count)) as usize) {
        out[k] += 1;
    }
    out
}

/// Give each job `proportions[j]` of the aggregate, as a per-job trace (PADLL §V-C: every
/// job replays its load proportion of the trace from its own start).
pub fn split(aggregate: &[f64], proportions: &[f64]) -> Vec<JobTrace> {
    proportions
        .iter()
        .map(|&p| JobTrace {
            ops: aggregate
                .iter()
                .map(|&a| split_ops((a * p).round().max(0.0) as u64))
                .collect(),
        })
        .collect()
}

/// Write traces in the `padll-trace v1` format.
pub fn write(
    out: &mut (impl Write + ?Sized),
    traces: &[JobTrace],
    comment: &str,
) -> std::io::Result<()> {
    let mut s = String::new();
    s.push_str("# padll-trace v1\n");
    for line in comment.lines() {
        let _ = writeln!(s, "# {line}");
    }
    s.push_str("second,job");
    for t in OP_TYPES {
        s.push(',');
        s.push_str(t);
    }
    s.push('\n');
    let longest = traces.iter().map(|t| t.ops.len()).max().unwrap_or(0);
    for sec in 0..longest {
        for (j, t) in traces.iter().enumerate() {
            if let Some(row) = t.ops.get(sec) {
                let _ = write!(s, "{sec},{}", j + 1);
                for c in row {
                    let _ = write!(s, ",{c}");
                }
                s.push('\n');
            }
        }
        if s.len() > 1 << 16 {
            out.write_all(s.as_bytes())?;
            s.clear();
        }
    }
    out.write_all(s.as_bytes())
}

/// A trace [`read`] refused.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A bad line (1-based) and what is wrong with it.
    #[error("line {line}: {kind}")]
    Line {
        /// Its number.
        line: usize,
        /// What is wrong.
        kind: TraceErrorKind,
    },
    /// No header line at all.
    #[error("empty trace: no header line")]
    Empty,
}

/// What is wrong with a line of a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceErrorKind {
    /// It could not be read.
    #[error(transparent)]
    Io(std::io::Error),
    /// The first line is no header.
    #[error("expected the header `second,job,{}`", OP_TYPES.join(","))]
    Header,
    /// Not as many fields as the header.
    #[error("{fields} fields, the header has {header}")]
    FieldCount {
        /// Fields on the line.
        fields: usize,
        /// Columns of the header.
        header: usize,
    },
    /// A field that is no count.
    #[error("bad {column} `{value}`")]
    BadField {
        /// Its column.
        column: String,
        /// As given.
        value: String,
    },
    /// Job `0` (jobs are numbered from 1).
    #[error("bad job `0` (jobs are numbered from 1)")]
    JobZero,
    /// A `second` or `job` beyond what a trace may hold ([`MAX_SECONDS`], [`MAX_JOBS`],
    /// [`MAX_ROWS`]).
    #[error("bad {column} `{value}` (expected at most {max})")]
    TooLarge {
        /// Its column (`second`, `job`).
        column: &'static str,
        /// As given.
        value: u64,
        /// The largest accepted.
        max: u64,
    },
}

/// Longest trace a file may give one job, seconds (as `policies trace --seconds`).
pub const MAX_SECONDS: u64 = 1_000_000;

/// Most jobs a trace file may number.
pub const MAX_JOBS: u64 = 10_000;

/// Most (second, job) rows the jobs' traces may span together (each job's trace runs to
/// its last second: 4 jobs of [`MAX_SECONDS`], ≈ 224 MB).
pub const MAX_ROWS: u64 = 4 * MAX_SECONDS;

/// Read a `padll-trace v1` file. Errors name the line and the bad field.
pub fn read(input: impl BufRead) -> Result<Vec<JobTrace>, TraceError> {
    let mut traces: Vec<JobTrace> = Vec::new();
    let mut rows = 0u64;
    let mut columns: Option<Vec<String>> = None;
    for (n, line) in input.lines().enumerate() {
        let at = |kind| TraceError::Line { line: n + 1, kind };
        let line = line.map_err(|e| at(TraceErrorKind::Io(e)))?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let Some(cols) = &columns else {
            if fields.len() < 2 || fields[0] != "second" || fields[1] != "job" {
                return Err(at(TraceErrorKind::Header));
            }
            columns = Some(fields.iter().map(|s| s.to_string()).collect());
            continue;
        };
        if fields.len() != cols.len() {
            return Err(at(TraceErrorKind::FieldCount {
                fields: fields.len(),
                header: cols.len(),
            }));
        }
        let num = |i: usize| -> Result<u64, TraceError> {
            fields[i].parse::<u64>().map_err(|_| {
                at(TraceErrorKind::BadField {
                    column: cols[i].clone(),
                    value: fields[i].to_string(),
                })
            })
        };
        let sec = num(0)?;
        let job = num(1)?;
        if job == 0 {
            return Err(at(TraceErrorKind::JobZero));
        }
        let too_large = |column, value, max| at(TraceErrorKind::TooLarge { column, value, max });
        if job > MAX_JOBS {
            return Err(too_large("job", job, MAX_JOBS));
        }
        if sec >= MAX_SECONDS {
            return Err(too_large("second", sec, MAX_SECONDS - 1));
        }
        let (sec, job) = (sec as usize, job as usize);
        // Every job's trace runs to its last row: the rows spanned together are bounded.
        let had = traces.get(job - 1).map_or(0, |t| t.ops.len()) as u64;
        let grow = (sec as u64 + 1).saturating_sub(had);
        if rows + grow > MAX_ROWS {
            let max = (had + (MAX_ROWS - rows)).saturating_sub(1);
            return Err(too_large("second", sec as u64, max));
        }
        rows += grow;
        if traces.len() < job {
            traces.resize_with(job, JobTrace::default);
        }
        let t = &mut traces[job - 1];
        if t.ops.len() < sec + 1 {
            t.ops.resize(sec + 1, [0; 7]);
        }
        for (k, op) in OP_TYPES.iter().enumerate() {
            if let Some(i) = cols.iter().position(|c| c == op) {
                t.ops[sec][k] = num(i)?;
            }
        }
    }
    if columns.is_none() {
        return Err(TraceError::Empty);
    }
    Ok(traces)
}
