//! Stage overhead benchmark: cost per call of cheap file-system calls in three set-ups —
//! native, preloaded with the target unmanaged, preloaded and managed through a channel
//! whose rate never limits — at several thread counts, plus the cost of starting a
//! process under the stage.
//!
//! `padll-bench` (release build) prints a Markdown table. It re-runs itself as a
//! worker (`padll-bench worker CALL THREADS MILLIS DIR`) with the right environment
//! for each set-up.
//!
//! `padll-bench instructions` counts, deterministically, the user-space instructions
//! the stage adds per call: it runs `padll-bench count CALL N DIR` (exactly N calls on
//! one thread) under `valgrind --tool=callgrind` at N = 2 000 and 12 000, natively and
//! preloaded, and prints the slopes against the overhead targets, for the cases that
//! matter: unmanaged path calls far from the mountpoint (`/dev/shm/…`, mount under
//! `/tmp`) and beside it (`/tmp/x-u…` next to mount `/tmp/x-m…`), unmanaged fd calls,
//! and managed calls through a request channel that never limits (and a read through
//! a byte channel) — on short paths, and on path calls at realistic path lengths (32,
//! 64, 128 and 256 bytes below a `…/scratch` mountpoint).

use padll_wire::flags::whole;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CALLS: [&str; 4] = ["stat", "open+close", "pread4k", "fstat"];
/// Bounds of the numbers given in arguments and `PADLL_BENCH_*` variables: far above
/// any real use, low enough that no product of them overflows.
const MAX_MILLIS: u64 = 3_600_000;
const MAX_SECONDS: u64 = 86_400;
const MAX_BENCH_RATE: u64 = 1_000_000_000;
const MAX_CALLS: u64 = 1 << 40;
const THREADS: [usize; 4] = [1, 2, 8, 64];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("worker") => worker(&args[2..]),
        Some("count") => count(&args[2..]),
        Some("throttled") => throttled(),
        Some("instructions") => instructions(&args[2..]),
        None => driver(),
        Some(other) => {
            eprintln!("padll-bench: unknown mode '{other}' (use no argument, 'worker', 'count', 'instructions' or 'throttled')");
            std::process::exit(2);
        }
    }
}

/// `text`, the value of `what` (an argument or a `PADLL_BENCH_*` variable), as a whole
/// number in `range`; anything else is named in one line (exit 2).
fn number(what: &str, text: &str, range: RangeInclusive<u64>) -> u64 {
    whole(range)(text.trim()).unwrap_or_else(|why| {
        eprintln!("padll-bench: {what} {}: {why}", padll_wire::quote(text));
        std::process::exit(2);
    })
}

/// The variable `name` as a whole number in `range`, `default` when it is not set.
fn env_number(name: &str, default: u64, range: RangeInclusive<u64>) -> u64 {
    match std::env::var_os(name) {
        Some(value) => number(name, &value.to_string_lossy(), range),
        None => default,
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
    let millis = env_number("PADLL_BENCH_MILLIS", 400, 1..=MAX_MILLIS);
    let exe = std::env::current_exe().expect("current exe");
    let library = stage_library(&exe);
    let base = std::env::temp_dir().join(format!("padll-bench-{}", std::process::id()));
    let dir = base.join("data");
    std::fs::create_dir_all(&dir).expect("bench dir");
    std::fs::write(dir.join("file"), vec![7u8; 1 << 20]).expect("bench file");
    // A mountpoint elsewhere in the tree, as /scratch is for a job working in $HOME.
    let elsewhere = Path::new("/nonexistent/scratch");
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

/// A path starting on a 64-byte boundary, NUL-terminated. The stage reads a path in
/// 16- and 32-byte blocks, so what a call costs depends on where its path starts; a
/// `CString` starts wherever the allocator put it (16-byte aligned, and the allocations
/// before it move that between builds), a path here always at the same place.
#[repr(C, align(64))]
struct AlignedPath([u8; 4096]);

impl AlignedPath {
    fn new(path: &Path) -> Box<AlignedPath> {
        let bytes = path.as_os_str().as_encoded_bytes();
        assert!(bytes.len() < 4096 && !bytes.contains(&0), "path");
        let mut aligned = Box::new(AlignedPath([0; 4096]));
        aligned.0[..bytes.len()].copy_from_slice(bytes);
        aligned
    }

    fn as_ptr(&self) -> *const libc::c_char {
        self.0.as_ptr().cast()
    }
}

/// One benchmark call on the file at `file`, as a closure per thread.
fn make_call(call: &str, file: &Path) -> Box<dyn FnMut() + Send> {
    let path = AlignedPath::new(file);
    match call {
        "stat" => Box::new(move || {
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: `path` is NUL-terminated (zero-filled past its bytes) and moved into
            // this closure; `st` is a valid out-pointer of `struct stat`'s size.
            assert_eq!(unsafe { libc::stat(path.as_ptr(), st.as_mut_ptr()) }, 0);
        }),
        "open+close" => Box::new(move || {
            // SAFETY: `path` is NUL-terminated and moved into this closure.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
            assert!(fd >= 0);
            // SAFETY: our own descriptor, just opened (asserted valid) and closed once.
            unsafe { libc::close(fd) };
        }),
        "pread4k" | "fstat" => {
            // SAFETY: `path` is NUL-terminated and alive across the call.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
            assert!(fd >= 0);
            let mut buf = vec![0u8; 4096];
            if call == "fstat" {
                Box::new(move || {
                    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
                    // SAFETY: our own descriptor (opened above, never closed); `st` is a valid
                    // out-pointer of `struct stat`'s size.
                    assert_eq!(unsafe { libc::fstat(fd, st.as_mut_ptr()) }, 0);
                })
            } else {
                Box::new(move || {
                    assert_eq!(
                        // SAFETY: our own descriptor (opened above, never closed) and
                        // our 4096-byte buffer, moved into this closure.
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
    let threads = number("THREADS", threads, 1..=4096) as usize;
    let duration = Duration::from_millis(number("MILLIS", millis, 1..=MAX_MILLIS));
    let dir = PathBuf::from(dir);
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let busy_ns = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (stop, total, busy_ns) = (stop.clone(), total.clone(), busy_ns.clone());
            let mut one = make_call(call, &dir.join("file"));
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

/// `count CALL N FILE [PER_SECOND GROUP]`: makes exactly N calls on one thread (for
/// callgrind) — back to back, or paced natively at PER_SECOND calls a second in groups
/// of GROUP, one sleep per group (what a throttled thread's batches look like, without
/// the stage: the cost of sleeping alone).
fn count(args: &[String]) {
    let (call, n, file, pace) = match args {
        [call, n, file] => (call, n, file, None),
        [call, n, file, per_second, group] => (
            call,
            n,
            file,
            Some((
                number("PER_SECOND", per_second, 1..=MAX_BENCH_RATE),
                number("GROUP", group, 1..=MAX_CALLS),
            )),
        ),
        _ => {
            eprintln!("usage: padll-bench count CALL N FILE [PER_SECOND GROUP]");
            std::process::exit(2);
        }
    };
    let mut one = make_call(call, Path::new(file));
    let start = Instant::now();
    for i in 0..number("N", n, 0..=MAX_CALLS) {
        one();
        if let Some((per_second, group)) = pace {
            if (i + 1) % group == 0 {
                let due = Duration::from_secs_f64((i + 1) as f64 / per_second as f64);
                std::thread::sleep(due.saturating_sub(start.elapsed()));
            }
        }
    }
}

/// `throttled`: the CPU a throttled call costs. Processes make `stat` calls on a managed
/// file as fast as they can under `getattr=RATE/s` (one process, or two processes of one
/// job sharing the limit); the same number of calls is made natively, back to back and
/// paced by as many plain sleeps as the throttled processes took (what sleeping itself
/// costs on this machine); user + system time comes from `getrusage(RUSAGE_CHILDREN)`.
/// `PADLL_BENCH_SECONDS` sets the run length (3), `PADLL_BENCH_RATES` the limits
/// (`1000,20000,100000`). Prints a Markdown table.
fn throttled() {
    // The settings first: a bad one is named before anything is made or printed.
    let seconds = env_number("PADLL_BENCH_SECONDS", 3, 1..=MAX_SECONDS);
    let rates: Vec<u64> = match std::env::var_os("PADLL_BENCH_RATES") {
        Some(list) => list
            .to_string_lossy()
            .split(',')
            .map(|rate| number("PADLL_BENCH_RATES", rate, 1..=MAX_BENCH_RATE))
            .collect(),
        None => vec![1_000, 20_000, 100_000],
    };
    let exe = std::env::current_exe().expect("current exe");
    let library = stage_library(&exe);
    let base = std::env::temp_dir().join(format!("padll-bench-throttled-{}", std::process::id()));
    let dir = base.join("data");
    std::fs::create_dir_all(&dir).expect("bench dir");
    std::fs::write(dir.join("file"), b"x").expect("bench file");
    println!("| limit (stat/s) | processes | calls | achieved /s | native CPU µs/call | native paced CPU µs/call | throttled CPU µs/call | extra CPU µs/call | extra over paced | sleeps per 100 calls |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for rate in rates {
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
            let native = run_counting(&exe, &dir, calls, processes, &[], None);
            let throttled = run_counting(&exe, &dir, calls, processes, &stage, None);
            // The same calls paced by plain sleeps, as many as the throttled processes
            // slept (one per batch).
            let sleeps = (throttled.sleeps - native.sleeps).max(1) as u64;
            let group = (calls / sleeps).max(1);
            let paced = run_counting(
                &exe,
                &dir,
                calls,
                processes,
                &[],
                Some((rate / processes, group)),
            );
            let per_call = |cpu: f64| cpu / calls as f64 * 1e6;
            println!(
                "| {rate} | {processes} | {calls} | {:.0} | {:.2} | {:.2} | {:.2} | {:+.2} | {:+.2} | {:.1} |",
                calls as f64 / throttled.wall,
                per_call(native.cpu),
                per_call(paced.cpu),
                per_call(throttled.cpu),
                per_call(throttled.cpu - native.cpu),
                per_call(throttled.cpu - paced.cpu),
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

/// Runs `processes` children making `calls` stat calls between them (each paced at
/// `pace` = (calls per second, calls per sleep) if given).
fn run_counting(
    exe: &Path,
    dir: &Path,
    calls: u64,
    processes: u64,
    env: &[(String, String)],
    pace: Option<(u64, u64)>,
) -> Cost {
    let before = children_usage();
    let start = Instant::now();
    let children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new(exe)
                .args(["count", "stat", &(calls / processes).to_string()])
                .arg(dir.join("file"))
                .args(pace.map_or(vec![], |(rate, group)| {
                    vec![rate.to_string(), group.to_string()]
                }))
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
    // SAFETY: `usage` is a live local `rusage`: a valid out-pointer of the size getrusage
    // writes.
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

/// Where a callgrind case's file lies relative to the one mountpoint.
#[derive(Clone, Copy, PartialEq)]
enum Where {
    /// Under `/dev/shm`: no byte in common with the mountpoint after the first `/`.
    Far,
    /// Beside the mountpoint: shares its first component and more (`/tmp/x-u…` next
    /// to `/tmp/x-m…`; `…/projects/…` next to `…/scratch`).
    Sibling,
    /// Inside the mountpoint, through a channel that never limits (`all=100G/s`).
    Managed,
}

impl Where {
    fn name(self) -> &'static str {
        match self {
            Where::Far => "far",
            Where::Sibling => "sibling",
            Where::Managed => "managed",
        }
    }
}

/// One row of the instruction table: a call, where its file is, how long its path is
/// (`None`: the short layout, `/tmp/x-m<pid>/file`; `Some(n)`: the HPC layout, a path of
/// exactly n bytes), the stage's rules, and the most instructions the stage may add
/// to it (the overhead targets; `None`: no target).
#[derive(Clone, Copy)]
struct Case {
    call: &'static str,
    place: Where,
    length: Option<usize>,
    rules: &'static str,
    what: &'static str,
    target: Option<u64>,
}

/// The rules of every case but one: a request channel that never limits (`G` without
/// `B` counts requests).
const NEVER_LIMITS: &str = "all=100G/s";

/// A case of the short layout with the usual rules.
const fn short(call: &'static str, place: Where, what: &'static str, target: Option<u64>) -> Case {
    Case {
        call,
        place,
        length: None,
        rules: NEVER_LIMITS,
        what,
        target,
    }
}

/// Cases of the short layout, each with its own overhead target.
const SHORT_CASES: [Case; 11] = [
    short(
        "stat",
        Where::Far,
        "unmanaged path call, far from the mountpoint",
        Some(60),
    ),
    short(
        "stat",
        Where::Sibling,
        "unmanaged path call, beside the mountpoint",
        Some(100),
    ),
    short(
        "open+close",
        Where::Far,
        "unmanaged path call + fd call, far",
        Some(80),
    ),
    short(
        "open+close",
        Where::Sibling,
        "unmanaged path call + fd call, beside",
        Some(120),
    ),
    short("pread4k", Where::Sibling, "unmanaged fd call", Some(20)),
    short("fstat", Where::Sibling, "unmanaged fd call", Some(20)),
    short("stat", Where::Managed, "managed path call", Some(150)),
    short(
        "open+close",
        Where::Managed,
        "managed open + close",
        Some(300),
    ),
    short(
        "pread4k",
        Where::Managed,
        "managed 4 KiB read (request channel; bytes counted in the statistics)",
        Some(150),
    ),
    Case {
        rules: "read=100GiB/s",
        ..short(
            "pread4k",
            Where::Managed,
            "managed 4 KiB read through a byte channel",
            Some(150),
        )
    },
    short("fstat", Where::Managed, "managed fd call", None),
];

/// Path lengths of the HPC layout (bytes, without the NUL).
const LENGTHS: [usize; 4] = [32, 64, 128, 256];

/// Up to this path length a path call's target holds as is; past it, one instruction
/// more per byte.
const TARGET_LENGTH: usize = 128;

/// The path call + call rows of the HPC layout at `length` bytes: `stat` and
/// `open`+`close`, far from, beside and inside the mountpoint. Their targets are the
/// short layout's for the same call and place, plus one instruction per byte past
/// [`TARGET_LENGTH`] for managed calls (whose targets hold up to it) and past the
/// short layout's path (`short_length` of the place) for unmanaged ones (every byte of
/// a path is read: a `..` may lead anywhere).
fn hpc_cases(length: usize, short_length: impl Fn(Where) -> usize) -> Vec<Case> {
    let mut cases = Vec::new();
    for call in ["stat", "open+close"] {
        for place in [Where::Far, Where::Sibling, Where::Managed] {
            let base = SHORT_CASES
                .iter()
                .find(|c| c.call == call && c.place == place && c.rules == NEVER_LIMITS)
                .expect("a short case for every HPC case");
            let free = match place {
                Where::Managed => TARGET_LENGTH,
                _ => short_length(place),
            };
            cases.push(Case {
                length: Some(length),
                target: base.target.map(|t| t + length.saturating_sub(free) as u64),
                ..*base
            });
        }
    }
    cases
}

/// A path of exactly `length` bytes under `dir`, laid out as an HPC job's output
/// (`<dir>/user042/project-x/run-0042/…/out_000…123.h5`): as many directory levels as
/// fit, then a file name padded to the length (at least `dir` + 8 bytes).
fn hpc_path(dir: &Path, length: usize) -> PathBuf {
    const LEVELS: [&str; 6] = [
        "user042",
        "project-x",
        "run-0042",
        "checkpoints",
        "rank-00017",
        "step-000123",
    ];
    let mut path = dir.to_path_buf();
    let mut used = dir.as_os_str().len();
    // A level is added while the shortest file name (`/out_1.h5`, 9 bytes) still fits.
    for level in LEVELS.iter().cycle() {
        if used + 1 + level.len() + 9 > length {
            break;
        }
        path.push(level);
        used += 1 + level.len();
    }
    let digits = length
        .checked_sub(used + 8)
        .filter(|d| *d >= 1)
        .expect("path too short");
    let number = format!("{:0>width$}", 123, width = digits.max(3));
    path.push(format!("out_{}.h5", &number[number.len() - digits..]));
    assert_eq!(path.as_os_str().len(), length, "{}", path.display());
    path
}

/// The process id as five base-36 digits (pids stay below 36⁵): a name unique to this
/// run whose length is the same in every run, so are the paths'.
fn run_tag(pid: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    (0..5)
        .rev()
        .map(|place| digits[(pid / 36u32.pow(place) % 36) as usize] as char)
        .collect()
}

/// Iteration counts whose difference gives the per-call slope.
const COUNTS: [u64; 2] = [2_000, 12_000];

/// `instructions [CALL|far|sibling|managed|LENGTH …]`: the callgrind table (all cases,
/// or those whose call, place or path length is named).
fn instructions(filter: &[String]) {
    let exe = std::env::current_exe().expect("current exe");
    let library = stage_library(&exe);
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("padll-bench: valgrind not installed; no instruction counts");
        std::process::exit(2);
    }
    let tag = run_tag(std::process::id());
    // The short layout: one short mountpoint and files right below it.
    let mount = PathBuf::from(format!("/tmp/x-m{tag}"));
    let sibling = PathBuf::from(format!("/tmp/x-u{tag}"));
    let shm = Path::new("/dev/shm");
    let far = if shm.is_dir() {
        shm.join(format!("padll-bench-{tag}"))
    } else {
        eprintln!("padll-bench: no /dev/shm; the far case uses /var/tmp");
        PathBuf::from(format!("/var/tmp/padll-bench-{tag}"))
    };
    // The HPC layout: a file system root with the job's mountpoint (`scratch`, 20
    // bytes: longer than a 16-byte vector) and another tree beside it, and paths of
    // fixed lengths below them.
    let root = PathBuf::from(format!("/tmp/fs{tag}"));
    let hpc_mount = root.join("scratch");
    let hpc_sibling = root.join("projects");
    let hpc_far = far.with_file_name(format!("fs{tag}"));
    let short_file = |place: Where| {
        match place {
            Where::Far => &far,
            Where::Sibling => &sibling,
            Where::Managed => &mount,
        }
        .join("file")
    };
    let hpc_file = |place: Where, length: usize| {
        let dir = match place {
            Where::Far => &hpc_far,
            Where::Sibling => &hpc_sibling,
            Where::Managed => &hpc_mount,
        };
        hpc_path(dir, length)
    };
    let short_length = |place| short_file(place).as_os_str().len();
    let mut cases: Vec<Case> = SHORT_CASES.to_vec();
    for length in LENGTHS {
        cases.extend(hpc_cases(length, short_length));
    }
    let file_of = |case: &Case| match case.length {
        None => short_file(case.place),
        Some(length) => hpc_file(case.place, length),
    };
    for case in &cases {
        let file = file_of(case);
        std::fs::create_dir_all(file.parent().expect("a file in a directory")).expect("bench dir");
        std::fs::write(&file, vec![7u8; 1 << 20]).expect("bench file");
    }
    // One configuration per layout for every preloaded run (a job with a channel, most
    // of whose calls are elsewhere); only where the file lies changes, and for one case
    // the rule.
    let preload = |case: &Case| {
        let mount = if case.length.is_some() {
            &hpc_mount
        } else {
            &mount
        };
        [
            ("LD_PRELOAD", library.display().to_string()),
            ("PADLL_MOUNTS", mount.display().to_string()),
            ("PADLL_RULES", case.rules.to_string()),
        ]
    };
    // Instructions of the extra calls between the two runs (exact integers).
    let span = (COUNTS[1] - COUNTS[0]) as i64;
    let delta = |call: &str, file: &Path, env: &[(&str, String)]| -> i64 {
        let [a, b] = COUNTS.map(|n| callgrind(&exe, call, n, file, env));
        b as i64 - a as i64
    };

    println!(
        "Short layout: mountpoint {}; far file {}/file; sibling file {}/file.",
        mount.display(),
        far.display(),
        sibling.display()
    );
    println!(
        "HPC layout: mountpoint {}; files of the lengths given below it, beside it in {} and far in {}; e.g. {}.",
        hpc_mount.display(),
        hpc_sibling.display(),
        hpc_far.display(),
        hpc_file(Where::Managed, 64).display()
    );
    println!("Rules {NEVER_LIMITS} unless named.");
    println!();
    println!(
        "| call | target file | path bytes | case | native | preloaded | added | target | met |"
    );
    println!("|---|---|---:|---|---:|---:|---:|---:|:---:|");
    for case in &cases {
        let place = case.place.name();
        let length = case.length.map_or("short".to_string(), |l| l.to_string());
        if !filter.is_empty()
            && !filter
                .iter()
                .any(|f| f == case.call || f == place || *f == length)
        {
            continue;
        }
        let file = file_of(case);
        let native = delta(case.call, &file, &[]);
        let staged = delta(case.call, &file, &preload(case));
        let added = staged - native;
        if std::env::var_os("PADLL_BENCH_RAW").is_some() {
            eprintln!(
                "{} {place} {length}: native {native}, preloaded {staged} instructions over {span} calls",
                case.call
            );
        }
        let (target, met) = match case.target {
            Some(t) => (
                format!("≤ +{t}"),
                // Judged on the slope rounded to 0.1 instruction: the two runs differ
                // by a few dozen instructions besides the calls (start-up, exit).
                if (added as f64 / span as f64 * 10.0).round() <= t as f64 * 10.0 {
                    "yes"
                } else {
                    "**no**"
                },
            ),
            None => ("–".to_string(), ""),
        };
        let rules = if case.rules == NEVER_LIMITS {
            String::new()
        } else {
            format!(" (`{}`)", case.rules)
        };
        let shown = match (case.length, case.place) {
            (None, Where::Far) => "`/dev/shm/…`",
            (None, Where::Sibling) => "`/tmp/x-u…`",
            (None, Where::Managed) => "`/tmp/x-m…` (mount)",
            (Some(_), Where::Far) => "`/dev/shm/fs…/…`",
            (Some(_), Where::Sibling) => "`…/projects/…`",
            (Some(_), Where::Managed) => "`…/scratch/…` (mount)",
        };
        println!(
            "| {} | {shown} | {} | {}{rules} | {:.1} | {:.1} | {:+.1} | {target} | {met} |",
            case.call,
            file.as_os_str().len(),
            case.what,
            native as f64 / span as f64,
            staged as f64 / span as f64,
            added as f64 / span as f64,
        );
    }
    for dir in [&mount, &sibling, &far, &root, &hpc_far] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Instructions `padll-bench count CALL N FILE` executes under callgrind with `env`.
fn callgrind(exe: &Path, call: &str, n: u64, file: &Path, env: &[(&str, String)]) -> u64 {
    let out = Command::new("valgrind")
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(exe)
        .args(["count", call, &n.to_string()])
        .arg(file)
        .env_remove("LD_PRELOAD")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("valgrind");
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .find_map(|line| line.split("Collected : ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| {
            eprintln!("padll-bench: no instruction count from callgrind:\n{stderr}");
            std::process::exit(1);
        })
}
