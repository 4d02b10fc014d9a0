//! Stage overhead benchmark: cost per call of cheap file-system calls in three set-ups —
//! native, preloaded with the target unmanaged, preloaded and managed through a channel
//! whose rate never limits — at several thread counts, plus the cost of starting a
//! process under the stage.
//!
//! `padll-bench` (release build) prints a Markdown table. It re-runs itself as a
//! worker (`padll-bench worker CALL THREADS MILLIS DIR`) with the right environment
//! for each set-up. For instruction counts, run the worker under callgrind with two
//! iteration counts (`scripts/bench-stage.sh` does this).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CALLS: [&str; 4] = ["stat", "open+close", "pread4k", "fstat"];
const THREADS: [usize; 4] = [1, 2, 8, 64];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("worker") => worker(&args[2..]),
        Some("count") => count(&args[2..]),
        Some("throttled") => throttled(),
        None => driver(),
        Some(other) => {
            eprintln!("padll-bench: unknown mode '{other}' (use no argument, 'worker', 'count' or 'throttled')");
            std::process::exit(2);
        }
    }
}

/// The three set-ups: name and the environment they add.
fn setups(
    library: &Path,
    managed_dir: &Path,
    unmanaged_mount: &Path,
) -> Vec<(&'static str, Vec<(String, String)>)> {
    let preload = ("LD_PRELOAD".to_string(), library.display().to_string());
    vec![
        ("native", vec![]),
        (
            "unmanaged",
            vec![
                preload.clone(),
                ("PADLL_MOUNTS".into(), unmanaged_mount.display().to_string()),
            ],
        ),
        (
            "managed",
            vec![
                preload,
                ("PADLL_MOUNTS".into(), managed_dir.display().to_string()),
                ("PADLL_RULES".into(), "all=100G/s".into()),
            ],
        ),
    ]
}

/// The stage library beside this binary (exits if there is none).
fn stage_library(exe: &Path) -> PathBuf {
    padll_wire::locate_stage_library(exe.parent().expect("exe dir")).unwrap_or_else(|| {
        eprintln!(
            "padll-bench: {} not found beside this binary; build with `cargo build --release -p padll-stage`",
            padll_wire::STAGE_LIBRARY
        );
        std::process::exit(2);
    })
}

fn driver() {
    let exe = std::env::current_exe().expect("current exe");
    let library = stage_library(&exe);
    let base = std::env::temp_dir().join(format!("padll-bench-{}", std::process::id()));
    let dir = base.join("data");
    std::fs::create_dir_all(&dir).expect("bench dir");
    std::fs::write(dir.join("file"), vec![7u8; 1 << 20]).expect("bench file");
    // A mountpoint elsewhere in the tree, as /scratch is for a job working in $HOME.
    let elsewhere = Path::new("/nonexistent/scratch");
    let millis: u64 = std::env::var("PADLL_BENCH_MILLIS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let setups = setups(&library, &dir, elsewhere);

    println!("| call | threads | native ns/call | unmanaged ns/call | managed ns/call | unmanaged − native | managed − native | native Mops/s | managed Mops/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for call in CALLS {
        for threads in THREADS {
            let ns: Vec<f64> = setups
                .iter()
                .map(|(_, env)| {
                    let out = Command::new(&exe)
                        .args(["worker", call, &threads.to_string(), &millis.to_string()])
                        .arg(&dir)
                        .envs(env.iter().cloned())
                        .output()
                        .expect("worker");
                    String::from_utf8_lossy(&out.stdout)
                        .trim()
                        .parse::<f64>()
                        .unwrap_or(f64::NAN)
                })
                .collect();
            // ns per call as seen by one thread; aggregate throughput = threads / ns.
            println!(
                "| {call} | {threads} | {:.1} | {:.1} | {:.1} | {:+.1} | {:+.1} | {:.2} | {:.2} |",
                ns[0],
                ns[1],
                ns[2],
                ns[1] - ns[0],
                ns[2] - ns[0],
                threads as f64 / ns[0] * 1e3,
                threads as f64 / ns[2] * 1e3
            );
        }
    }

    println!();
    println!("| process start (`/bin/true`) | mean ms | added ms |");
    println!("|---|---:|---:|");
    let mut native = 0.0;
    for (name, env) in &setups {
        let runs = 200;
        let start = Instant::now();
        for _ in 0..runs {
            Command::new("/bin/true")
                .envs(env.iter().cloned())
                .status()
                .expect("true");
        }
        let mean = start.elapsed().as_secs_f64() * 1e3 / runs as f64;
        if *name == "native" {
            native = mean;
        }
        println!("| {name} | {mean:.3} | {:+.3} |", mean - native);
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// One benchmark call on `dir/file`, as a closure per thread.
fn make_call(call: &str, dir: &Path) -> Box<dyn FnMut() + Send> {
    let path = CString::new(dir.join("file").into_os_string().into_encoded_bytes()).expect("path");
    match call {
        "stat" => Box::new(move || {
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: valid path and buffer.
            assert_eq!(unsafe { libc::stat(path.as_ptr(), st.as_mut_ptr()) }, 0);
        }),
        "open+close" => Box::new(move || {
            // SAFETY: valid path.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
            assert!(fd >= 0);
            // SAFETY: fd just opened.
            unsafe { libc::close(fd) };
        }),
        "pread4k" | "fstat" => {
            // SAFETY: valid path.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
            assert!(fd >= 0);
            let mut buf = vec![0u8; 4096];
            if call == "fstat" {
                Box::new(move || {
                    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
                    // SAFETY: open fd, valid buffer.
                    assert_eq!(unsafe { libc::fstat(fd, st.as_mut_ptr()) }, 0);
                })
            } else {
                Box::new(move || {
                    // SAFETY: open fd, valid buffer.
                    assert_eq!(
                        unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), 4096, 0) },
                        4096
                    );
                })
            }
        }
        other => {
            eprintln!(
                "padll-bench: unknown call '{other}' (use {})",
                CALLS.join(", ")
            );
            std::process::exit(2);
        }
    }
}

/// `worker CALL THREADS MILLIS DIR`: prints the mean ns per call per thread.
fn worker(args: &[String]) {
    let [call, threads, millis, dir] = args else {
        eprintln!("usage: padll-bench worker CALL THREADS MILLIS DIR");
        std::process::exit(2);
    };
    let threads: usize = threads.parse().expect("threads");
    let duration = Duration::from_millis(millis.parse().expect("millis"));
    let dir = PathBuf::from(dir);
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let busy_ns = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (stop, total, busy_ns) = (stop.clone(), total.clone(), busy_ns.clone());
            let mut one = make_call(call, &dir);
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        one();
                    }
                    n += 64;
                }
                total.fetch_add(n, Ordering::Relaxed);
                busy_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("thread");
    }
    println!(
        "{:.2}",
        busy_ns.load(Ordering::Relaxed) as f64 / total.load(Ordering::Relaxed) as f64
    );
}

/// `count CALL N DIR`: makes exactly N calls on one thread (for callgrind).
fn count(args: &[String]) {
    let [call, n, dir] = args else {
        eprintln!("usage: padll-bench count CALL N DIR");
        std::process::exit(2);
    };
    let mut one = make_call(call, Path::new(dir));
    for _ in 0..n.parse::<u64>().expect("N") {
        one();
    }
}

/// `throttled`: the CPU a throttled call costs. Processes make `stat` calls on a managed
/// file as fast as they can under `getattr=RATE/s` (one process, or two processes of one
/// job sharing the limit); the same number of calls is made natively; user + system time
/// comes from `getrusage(RUSAGE_CHILDREN)`. Prints a Markdown table.
fn throttled() {
    let exe = std::env::current_exe().expect("current exe");
    let library = stage_library(&exe);
    let base = std::env::temp_dir().join(format!("padll-bench-throttled-{}", std::process::id()));
    let dir = base.join("data");
    std::fs::create_dir_all(&dir).expect("bench dir");
    std::fs::write(dir.join("file"), b"x").expect("bench file");
    let seconds: u64 = std::env::var("PADLL_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!("| limit (stat/s) | processes | calls | achieved /s | native CPU µs/call | throttled CPU µs/call | extra CPU µs/call | sleeps per 100 calls |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for rate in [1_000u64, 20_000, 100_000] {
        for processes in [1u64, 2] {
            let calls = rate * seconds;
            let stage = [
                ("LD_PRELOAD".to_string(), library.display().to_string()),
                ("PADLL_MOUNTS".into(), dir.display().to_string()),
                ("PADLL_RULES".into(), format!("getattr={rate}/s")),
                (
                    "PADLL_JOB_ID".into(),
                    format!("bench-{}-{rate}-{processes}", std::process::id()),
                ),
            ];
            let native = run_counting(&exe, &dir, calls, processes, &[]);
            let throttled = run_counting(&exe, &dir, calls, processes, &stage);
            let per_call = |cpu: f64| cpu / calls as f64 * 1e6;
            println!(
                "| {rate} | {processes} | {calls} | {:.0} | {:.2} | {:.2} | {:+.2} | {:.1} |",
                calls as f64 / throttled.wall,
                per_call(native.cpu),
                per_call(throttled.cpu),
                per_call(throttled.cpu - native.cpu),
                (throttled.sleeps - native.sleeps) as f64 * 100.0 / calls as f64
            );
        }
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// What children cost: CPU seconds (user + system), voluntary context switches (each
/// one a sleep), and wall-clock seconds until the last one ended.
struct Cost {
    cpu: f64,
    sleeps: i64,
    wall: f64,
}

/// Runs `processes` children making `calls` stat calls between them.
fn run_counting(
    exe: &Path,
    dir: &Path,
    calls: u64,
    processes: u64,
    env: &[(String, String)],
) -> Cost {
    let before = children_usage();
    let start = Instant::now();
    let children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new(exe)
                .args(["count", "stat", &(calls / processes).to_string()])
                .arg(dir)
                .envs(env.iter().cloned())
                .spawn()
                .expect("count")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().expect("count").success(), "count failed");
    }
    let wall = start.elapsed().as_secs_f64();
    let after = children_usage();
    Cost {
        cpu: after.cpu - before.cpu,
        sleeps: after.sleeps - before.sleeps,
        wall,
    }
}

/// CPU seconds and voluntary context switches of every waited-for child so far.
fn children_usage() -> Cost {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) };
    // SAFETY: zero-initialised and filled by getrusage.
    let usage = unsafe { usage.assume_init() };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Cost {
        cpu: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        sleeps: usage.ru_nvcsw,
        wall: 0.0,
    }
}
