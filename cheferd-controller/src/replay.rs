//! `cheferd-lab replay`: a multi-threaded metadata trace replayer (like the PADLL paper's
//! mdreplayer, §V). It replays one job of a `padll-trace v1` file (see the `policies`
//! crate: per-second operation counts by type) against a directory, or a constant load,
//! and prints the rate it achieved every second.
//!
//! Trace second `s` becomes due `s / speed` seconds after the start, for the second of
//! wall-clock time (over `speed`) that follows; operations not done by then stay in a
//! backlog (as in the simulator). The job ends when its trace and backlog are done, and
//! not before the trace's span (`seconds / speed`) has passed, so the rate over the run
//! is never the trace's operations squeezed into fewer seconds than it spans.
//!
//! Every operation of the trace is one metadata system call (`open`, `close`, `stat`,
//! `chmod`, `rename`, `mkdir`, `unlink`) except a `close` with no descriptor left to
//! close, which opens one first: two calls. What is counted is the calls, as issued and
//! as the stage sees them, so with the generator's mix (more closes than opens) the calls
//! are about 7 % more than the trace's operations.
//!
//! Output (stdout): `second,calls` per second of wall-clock time, then
//! `# total <calls> calls (<operations> operations) in <seconds> s = <rate> calls/s`.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Operation types, in the trace's column order.
const OPS: [&str; 7] = [
    "open", "close", "getattr", "setattr", "rename", "mkdir", "unlink",
];
/// Files each worker cycles through.
const FILES_PER_WORKER: usize = 32;

/// What to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Per-second counts by type (`OPS` order).
    pub seconds: Vec<[u64; 7]>,
    /// Directory to work in (a subdirectory per run is created and removed).
    pub dir: PathBuf,
    /// Worker threads.
    pub threads: usize,
    /// Trace seconds per wall-clock second.
    pub speed: f64,
}

impl ReplayOptions {
    /// Job `job` (1-based) of a trace file, counts multiplied by `scale`, at most
    /// `max_seconds` seconds of it.
    pub fn from_trace(
        path: &Path,
        job: usize,
        scale: f64,
        max_seconds: Option<usize>,
    ) -> Result<Vec<[u64; 7]>, ReplayError> {
        let file = std::fs::File::open(path).map_err(|error| ReplayError::Unreadable {
            path: path.to_path_buf(),
            error,
        })?;
        let traces = policies::trace::read(std::io::BufReader::new(file)).map_err(|error| {
            ReplayError::BadTrace {
                path: path.to_path_buf(),
                error,
            }
        })?;
        let trace = traces.get(job.wrapping_sub(1)).ok_or(ReplayError::NoJob {
            job,
            jobs: traces.len(),
        })?;
        let mut seconds: Vec<[u64; 7]> = trace
            .ops
            .iter()
            .map(|row| row.map(|count| (count as f64 * scale).round() as u64))
            .collect();
        if let Some(limit) = max_seconds {
            seconds.truncate(limit);
        }
        Ok(seconds)
    }

    /// A constant load of `rate` ops/s for `seconds`, mixed like the trace generator
    /// (getattr ≈ 47 %, close, open, rename, …).
    pub fn constant(rate: u64, seconds: usize) -> Vec<[u64; 7]> {
        vec![policies::trace::split_ops(rate); seconds]
    }
}

/// Why a replay did not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace file could not be opened.
    #[error("cannot read --trace {}: {error}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The trace file is not a trace.
    #[error("--trace {}: {error}", path.display())]
    BadTrace {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        error: policies::trace::TraceError,
    },
    /// `--job` names no job of the trace.
    #[error("--job {job}: the trace has jobs 1 to {jobs}")]
    NoJob {
        /// `--job`.
        job: usize,
        /// Jobs in the trace.
        jobs: usize,
    },
    /// `--threads` or `--speed` not positive.
    #[error("--threads and --speed must be positive")]
    NotPositive,
    /// Its working directory could not be made.
    #[error("cannot create {}: {error}", path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

/// Per-second achieved rates and the total.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayResult {
    /// System calls completed in each wall-clock second.
    pub per_second: Vec<u64>,
    /// All system calls (a `close` with no descriptor to close is two: `open`, `close`).
    pub total: u64,
    /// The trace's operations done.
    pub operations: u64,
    /// Wall-clock duration: at least the trace's span, `seconds / speed`.
    pub elapsed: Duration,
}

struct Shared {
    backlog: Mutex<VecDeque<u8>>,
    trace_done: AtomicBool,
    /// System calls made.
    completed: AtomicU64,
    /// The trace's operations done.
    operations: AtomicU64,
}

/// Replays, printing `second,ops` lines to `out` as they complete.
pub fn run(options: &ReplayOptions, out: &mut dyn Write) -> Result<ReplayResult, ReplayError> {
    if options.threads == 0 || options.speed.is_nan() || options.speed <= 0.0 {
        return Err(ReplayError::NotPositive);
    }
    let work = options.dir.join(format!("replay-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|error| ReplayError::Create {
        path: work.clone(),
        error,
    })?;
    let shared = Arc::new(Shared {
        backlog: Mutex::new(VecDeque::new()),
        trace_done: AtomicBool::new(false),
        completed: AtomicU64::new(0),
        operations: AtomicU64::new(0),
    });
    let workers: Vec<_> = (0..options.threads)
        .map(|w| {
            let shared = shared.clone();
            let dir = work.join(format!("w{w}"));
            std::thread::spawn(move || worker(&shared, &dir))
        })
        .collect();

    let start = Instant::now();
    // The last trace second is due at `(len - 1) / speed` and has the wall-clock second
    // (over `speed`) after it: the run spans at least that.
    let span = Duration::from_secs_f64(options.seconds.len() as f64 / options.speed);
    let mut per_second = Vec::new();
    let mut reported = 0u64;
    let mut next_report = start + Duration::from_secs(1);
    let mut released = 0;
    // Until the work is done: not the workers' exit and the clean-up after it.
    let elapsed = loop {
        // Release every trace second that is due.
        let due = ((start.elapsed().as_secs_f64() * options.speed).floor() as usize + 1)
            .min(options.seconds.len());
        while released < due {
            let mut backlog = padll_wire::sync::lock(&shared.backlog);
            interleave(&options.seconds[released], &mut backlog);
            released += 1;
        }
        if released == options.seconds.len() {
            shared.trace_done.store(true, Ordering::Release);
        }
        let now = Instant::now();
        let finished = now.duration_since(start) >= span
            && shared.trace_done.load(Ordering::Acquire)
            && padll_wire::sync::lock(&shared.backlog).is_empty()
            && workers.iter().all(|w| w.is_finished());
        let completed = shared.completed.load(Ordering::Relaxed);
        // A last partial second is shown if anything was done in it.
        if now >= next_report || (finished && (completed > reported || per_second.is_empty())) {
            per_second.push(completed - reported);
            let _ = writeln!(out, "{},{}", per_second.len(), completed - reported);
            let _ = out.flush();
            reported = completed;
            next_report += Duration::from_secs(1);
        }
        if finished {
            break now.duration_since(start);
        }
        // Up to the next report, or the end of the span if that comes first.
        let mut wake = next_report;
        if start + span > now {
            wake = wake.min(start + span);
        }
        std::thread::sleep(Duration::from_millis(5).min(wake.saturating_duration_since(now)));
    };
    for w in workers {
        let _ = w.join();
    }
    let _ = std::fs::remove_dir_all(&work);
    let total = shared.completed.load(Ordering::Relaxed);
    let operations = shared.operations.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "# total {total} calls ({operations} operations) in {:.2} s = {:.1} calls/s",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64()
    );
    Ok(ReplayResult {
        per_second,
        total,
        operations,
        elapsed,
    })
}

/// Appends one second's operations, interleaved so every type progresses evenly.
fn interleave(counts: &[u64; 7], backlog: &mut VecDeque<u8>) {
    let total: u64 = counts.iter().sum();
    let mut emitted = [0u64; 7];
    for _ in 0..total {
        // The type furthest behind its share so far goes next.
        let k = (0..7)
            .filter(|&k| emitted[k] < counts[k])
            .min_by(|&a, &b| {
                let lag = |k: usize| emitted[k] as f64 / counts[k] as f64;
                lag(a).total_cmp(&lag(b))
            })
            .unwrap_or(0);
        emitted[k] += 1;
        backlog.push_back(k as u8);
    }
}

fn worker(shared: &Shared, dir: &Path) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let names: Vec<CString> = (0..FILES_PER_WORKER)
        .map(|i| {
            CString::new(
                dir.join(format!("f{i}"))
                    .into_os_string()
                    .into_encoded_bytes(),
            )
            .unwrap_or_default()
        })
        .collect();
    for name in &names {
        let _ = std::fs::write(
            Path::new(std::str::from_utf8(name.as_bytes()).unwrap_or_default()),
            b"padll",
        );
    }
    let mut open_fds: Vec<i32> = Vec::new();
    let mut cursor = 0usize;
    let mut made_dirs = 0u64;
    loop {
        let op = padll_wire::sync::lock(&shared.backlog).pop_front();
        let Some(op) = op else {
            if shared.trace_done.load(Ordering::Acquire) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        cursor = (cursor + 1) % names.len();
        let name = &names[cursor];
        // SAFETY: (all calls) every path (`name`, `other`, `path`) is a NUL-terminated
        // CString of ours, alive across the call; every descriptor closed is ours
        // (opened here); `st` is a valid out-pointer of `struct stat`'s size.
        let calls = unsafe {
            match OPS[op as usize] {
                "open" => {
                    let fd = libc::open(name.as_ptr(), libc::O_RDONLY | libc::O_CREAT, 0o644);
                    if fd >= 0 {
                        open_fds.push(fd);
                    }
                    1
                }
                "close" => match open_fds.pop() {
                    Some(fd) => {
                        libc::close(fd);
                        1
                    }
                    None => {
                        let fd = libc::open(name.as_ptr(), libc::O_RDONLY | libc::O_CREAT, 0o644);
                        if fd >= 0 {
                            libc::close(fd);
                        }
                        2
                    }
                },
                "getattr" => {
                    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
                    libc::stat(name.as_ptr(), st.as_mut_ptr());
                    1
                }
                "setattr" => {
                    libc::chmod(name.as_ptr(), 0o644);
                    1
                }
                "rename" => {
                    let other = &names[(cursor + names.len() / 2) % names.len()];
                    libc::rename(name.as_ptr(), other.as_ptr());
                    1
                }
                "mkdir" => {
                    made_dirs += 1;
                    let path = CString::new(
                        dir.join(format!("d{made_dirs}"))
                            .into_os_string()
                            .into_encoded_bytes(),
                    )
                    .unwrap_or_default();
                    libc::mkdir(path.as_ptr(), 0o755);
                    1
                }
                _ => {
                    libc::unlink(name.as_ptr());
                    1
                }
            }
        };
        shared.completed.fetch_add(calls, Ordering::Relaxed);
        shared.operations.fetch_add(1, Ordering::Relaxed);
    }
    for fd in open_fds {
        // SAFETY: our own descriptors.
        unsafe { libc::close(fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_every_operation() {
        let dir = std::env::temp_dir().join(format!("cheferd-replay-test-{}", std::process::id()));
        let options = ReplayOptions {
            seconds: vec![[10, 10, 30, 2, 5, 1, 2]; 3],
            dir: dir.clone(),
            threads: 3,
            speed: 10.0,
        };
        let mut out = Vec::new();
        let result = run(&options, &mut out).unwrap();
        // 60 operations per second of trace; closes without an open cost two calls.
        assert!(result.total >= 180, "{result:?}");
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("# total"), "{text}");
        assert!(
            !dir.join(format!("replay-{}", std::process::id())).exists(),
            "work dir left behind"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// `--rate R --seconds S`: the summary's rate is over the trace's whole span (the
    /// last second released has its second too), not over the time the backlog took to
    /// drain; its counts are calls, every trace operation done once.
    #[test]
    fn the_summary_is_over_the_traces_span_and_counts_calls() {
        let dir = std::env::temp_dir().join(format!("cheferd-replay-span-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // 4 trace seconds at 10 per wall-clock second: a span of 0.4 s; the last
        // second is released at 0.3 s and takes a few ms.
        let options = ReplayOptions {
            seconds: ReplayOptions::constant(50, 4),
            dir: dir.clone(),
            threads: 2,
            speed: 10.0,
        };
        let mut out = Vec::new();
        let result = run(&options, &mut out).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8(out).unwrap();
        assert!(
            result.elapsed >= Duration::from_millis(400),
            "{result:?}\n{text}"
        );
        assert_eq!(result.operations, 200, "{text}");
        assert_eq!(
            result.per_second.iter().sum::<u64>(),
            result.total,
            "{text}"
        );
        // More closes than opens in the mix: a close with no descriptor of its worker's
        // to close is issued as two calls.
        let [open, close, ..] = options.seconds[0];
        assert!(close > open);
        assert!(
            (200 + 4 * (close - open)..=200 + 4 * close).contains(&result.total),
            "{text}"
        );
        let summary = text.lines().last().unwrap();
        let rate = result.total as f64 / result.elapsed.as_secs_f64();
        assert_eq!(
            summary,
            format!(
                "# total {} calls (200 operations) in {:.2} s = {rate:.1} calls/s",
                result.total,
                result.elapsed.as_secs_f64()
            )
        );
        assert!(rate <= result.total as f64 / 0.4, "{summary}");
    }

    #[test]
    fn interleaving_keeps_proportions() {
        let mut backlog = VecDeque::new();
        interleave(&[2, 0, 6, 0, 0, 0, 0], &mut backlog);
        let first_four: Vec<u8> = backlog.iter().take(4).copied().collect();
        assert_eq!(backlog.len(), 8);
        assert_eq!(
            first_four.iter().filter(|k| **k == 0).count(),
            1,
            "{first_four:?}"
        );
    }
}
