//! Job-wide limits: a limit given to the stage binds all the processes of the job on
//! the node together (their buckets are shared through a segment in `/dev/shm`, see
//! `padll_wire::node_files`).
//!
//! Each test starts several `padll-probe load …` processes at once and sums their
//! operations over the window from the first start to the last end (the probes print
//! it on the node-wide monotonic clock). The issue asks for −3 %/+2 % of the job's
//! limit, on tmpfs and on a file system whose calls are slowed deliberately; the tests
//! take turns (`serial`) so that two measurements never share the two cores.

use crate::util::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A scratch mountpoint with the probe's file in it, writable by every user (one test
/// runs a probe as another uid).
fn mountpoint(name: &str) -> Scratch {
    prepare(Scratch::new(name))
}

/// [`mountpoint`] on a tmpfs (`/dev/shm`), where calls cost the least.
fn tmpfs_mountpoint(name: &str) -> Scratch {
    prepare(Scratch::under(Path::new("/dev/shm"), name))
}

fn prepare(dir: Scratch) -> Scratch {
    probe_run("setup", dir.path(), &[], &[]);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// A job id unique to this test run. Its segment is removed when the test ends, also
/// when it fails half-way (a passing test finds it removed by the job's last process).
pub fn job(name: &str) -> Job {
    Job(format!("it-{name}-{}", std::process::id()))
}

pub struct Job(String);

impl std::ops::Deref for Job {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for files in padll_wire::node_files::both_places(uid(), &self.0) {
            let _ = std::fs::remove_file(files.segment);
        }
    }
}

/// The segment a job's processes share on this node (in the user's directory under
/// `/dev/shm/padll` when a root component made it, else flat in `/dev/shm`).
pub fn segment(job: &str) -> PathBuf {
    PathBuf::from(padll_wire::node_files::segment(uid(), job))
}

/// The node's online CPUs: a process that cannot share its job's buckets gets the
/// job's limit divided by them (as many processes as CPUs stay within the limit).
fn cpus() -> f64 {
    // SAFETY: sysconf reads a system setting; no memory of ours is touched.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as f64
}

fn uid() -> u32 {
    // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
    unsafe { libc::geteuid() }
}

/// The stage's environment for `job` with `rules` on `dir`.
pub fn job_env(dir: &Path, rules: &str, job: &str) -> Vec<(String, String)> {
    let mut env = stage_env(dir, rules, None);
    env.push(("PADLL_JOB_ID".into(), job.into()));
    env
}

/// One probe process running `load SECONDS THREADS KIND`.
fn start_load(
    dir: &Path,
    seconds: f64,
    threads: usize,
    kind: &str,
    env: &[(String, String)],
) -> Child {
    start_load_as(&[], dir, seconds, threads, kind, env)
}

/// [`start_load`] behind a command prefix (e.g. `setpriv` to run as another uid).
fn start_load_as(
    prefix: &[&str],
    dir: &Path,
    seconds: f64,
    threads: usize,
    kind: &str,
    env: &[(String, String)],
) -> Child {
    let (program, prefix_args) = match prefix.split_first() {
        Some((first, rest)) => (*first, rest),
        None => (probe(), &[][..]),
    };
    let mut command = Command::new(program);
    command.args(prefix_args).current_dir(dir);
    if !prefix.is_empty() {
        command.arg(probe());
    }
    spawn_load(command, dir, seconds, threads, kind, env)
}

/// `command` (the probe, or what runs it) with the probe's `load` arguments and `env`,
/// its output piped for [`finish`].
pub fn spawn_load(
    mut command: Command,
    dir: &Path,
    seconds: f64,
    threads: usize,
    kind: &str,
    env: &[(String, String)],
) -> Child {
    command
        .args(["load", dir.to_str().unwrap()])
        .args([&seconds.to_string(), &threads.to_string(), kind])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("padll-probe")
}

/// What a group of probes did: summed operations, the window from the first start to
/// the last end, and everything they wrote on stderr.
pub struct Group {
    pub ops: f64,
    pub seconds: f64,
    pub stderr: String,
}

impl Group {
    pub fn rate(&self) -> f64 {
        self.ops / self.seconds
    }
}

pub fn finish(children: Vec<Child>) -> Group {
    let mut runs: Vec<BTreeMap<String, f64>> = Vec::new();
    let mut stderr = String::new();
    for child in children {
        let out = child.wait_with_output().expect("padll-probe");
        stderr.push_str(&String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success(),
            "padll-probe failed: {}{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        runs.push(
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(f64::NAN)))
                .collect(),
        );
    }
    let first = runs.iter().map(|r| r["start_ns"]).fold(f64::MAX, f64::min);
    let last = runs.iter().map(|r| r["end_ns"]).fold(0.0, f64::max);
    Group {
        ops: runs.iter().map(|r| r["ops"]).sum(),
        seconds: (last - first) / 1e9,
        stderr,
    }
}

/// `processes` probes at once, all under `env`.
fn run_group(
    dir: &Path,
    processes: usize,
    threads: usize,
    kind: &str,
    env: &[(String, String)],
) -> Group {
    let children = (0..processes)
        .map(|_| start_load(dir, 3.0, threads, kind, env))
        .collect();
    finish(children)
}

/// The window for a job-wide limit is −3 %/+2 %. The upper bound is what protects the
/// file system and is always asserted; below, a loaded machine descheduling the probes
/// can only make them slower, so by default only a job far under its limit fails.
/// `PADLL_STRICT_RATES=1` asserts the whole window (on a quiet machine).
pub fn assert_job_accurate(what: &str, achieved: f64, limit: f64) {
    assert!(
        achieved <= limit * 1.02,
        "{what}: {achieved:.0}/s is above the {limit:.0}/s job limit + 2 %"
    );
    let strict = std::env::var_os("PADLL_STRICT_RATES").is_some_and(|v| v == "1");
    let floor = if strict { 0.97 } else { 0.5 };
    assert!(
        achieved >= limit * floor,
        "{what}: {achieved:.0}/s is below {floor} × the {limit:.0}/s job limit"
    );
}

#[test]
fn a_job_limit_binds_its_processes_together() {
    let _turn = alone();
    let dir = tmpfs_mountpoint("jw-sum");
    for processes in [2, 4] {
        let job = job(&format!("sum{processes}"));
        let group = run_group(
            dir.path(),
            processes,
            1,
            "mixed",
            &job_env(dir.path(), "metadata=2000/s", &job),
        );
        assert!(group.stderr.is_empty(), "{}", group.stderr);
        assert_job_accurate(
            &format!("{processes} processes of one job"),
            group.rate(),
            2000.0,
        );
        assert!(
            !segment(&job).exists(),
            "the last process leaves no segment behind"
        );
    }
    // Per-process limits stay available when asked for: each process gets the rate.
    let job = job("per-process");
    let mut env = job_env(dir.path(), "metadata=2000/s", &job);
    env.push(("PADLL_LIMIT_SCOPE".into(), "process".into()));
    let group = run_group(dir.path(), 2, 1, "mixed", &env);
    assert!(group.stderr.is_empty(), "{}", group.stderr);
    assert!(group.rate() <= 2.0 * 2000.0 * 1.02, "{:.0}/s", group.rate());
    // More than one shared limit could admit (2 000/s + 2 %).
    assert!(
        group.rate() > 2000.0 * 1.05,
        "per-process limits were shared: {:.0}/s",
        group.rate()
    );
    assert!(
        !segment(&job).exists(),
        "per-process limits need no segment"
    );
}

#[test]
fn two_jobs_on_a_node_each_get_their_own_limit() {
    let _turn = alone();
    let dir = mountpoint("jw-two");
    let (a, b) = (job("two-a"), job("two-b"));
    let children_a: Vec<Child> = (0..2)
        .map(|_| {
            start_load(
                dir.path(),
                3.0,
                1,
                "stat",
                &job_env(dir.path(), "getattr=1500/s", &a),
            )
        })
        .collect();
    let children_b: Vec<Child> = (0..2)
        .map(|_| {
            start_load(
                dir.path(),
                3.0,
                1,
                "stat",
                &job_env(dir.path(), "getattr=1500/s", &b),
            )
        })
        .collect();
    for (name, group) in [("job a", finish(children_a)), ("job b", finish(children_b))] {
        assert!(group.stderr.is_empty(), "{}", group.stderr);
        assert_job_accurate(name, group.rate(), 1500.0);
    }
}

#[test]
#[cfg_attr(not(has_bash), ignore = "bash not installed")]
fn six_hundred_short_lived_processes_hold_the_job_limit() {
    let _turn = alone();
    let dir = mountpoint("jw-short");
    let stats = dir.path().with_extension("short.json");
    let _ = std::fs::remove_file(&stats);
    let mut env = job_env(dir.path(), "metadata=1000/s", &job("short"));
    env.push(("PADLL_STATS".into(), stats.display().to_string()));
    let started = std::time::Instant::now();
    let out = run(
        "bash",
        &["-c", "for i in $(seq 600); do touch f$i; done"],
        dir.path(),
        &env,
    );
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports = reports(&stats);
    let _ = std::fs::remove_file(&stats);
    assert!(
        reports.len() > 600,
        "bash and 600 touch processes report: {}",
        reports.len()
    );
    let metadata: u64 = padll_wire::report::total(&reports)
        .iter()
        .filter(|row| {
            padll_wire::ops::Op::from_name(&row.op)
                .is_some_and(|op| op.class() == padll_wire::ops::Class::Metadata)
        })
        .map(|row| row.managed)
        .sum();
    assert!(
        metadata >= 1800,
        "only {metadata} metadata operations were managed"
    );
    // The whole run is one job: one burst (10 ms of the rate) and one batch (16 ms) at
    // most above the rate, whatever the number of processes.
    let allowed = 1000.0 * elapsed * 1.02 + 10.0 + 16.0;
    assert!(
        metadata as f64 <= allowed,
        "{metadata} metadata operations in {elapsed:.2} s exceed the 1000/s job limit"
    );
}

#[test]
#[cfg_attr(
    not(has_cc),
    ignore = "cc not installed (it builds the slow file system)"
)]
fn slow_calls_do_not_loosen_the_job_limit() {
    let _turn = alone();
    let dir = mountpoint("jw-slow");
    // A "file system" whose stat calls take a random 0–20 ms, preloaded after the stage
    // so that the stage's real stat is this one.
    let source = dir.path().with_extension("slowfs.c");
    let slowfs = dir.path().with_extension("slowfs.so");
    std::fs::write(
        &source,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
static void slow(void) {
    static __thread unsigned seed;
    if (!seed) seed = (unsigned)(uintptr_t)&seed ^ (unsigned)time(0);
    struct timespec t = {0, (long)(rand_r(&seed) % 21) * 1000000L};
    nanosleep(&t, 0);
}
int stat(const char *path, struct stat *st) {
    static int (*real)(const char *, struct stat *);
    if (!real) real = (int (*)(const char *, struct stat *))dlsym(RTLD_NEXT, "stat");
    slow();
    return real(path, st);
}
"#,
    )
    .unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&slowfs)
        .arg(&source)
        .status()
        .expect("cc");
    assert!(built.success(), "cc failed");
    let mut env = job_env(dir.path(), "getattr=500/s", &job("slow"));
    env.retain(|(key, _)| key != "LD_PRELOAD");
    env.push((
        "LD_PRELOAD".into(),
        format!("{} {}", library().display(), slowfs.display()),
    ));
    // 2 processes × 8 threads, each stat 10 ms on average: the job could do ~1 600/s.
    let children = (0..2)
        .map(|_| start_load(dir.path(), 4.0, 8, "stat", &env))
        .collect();
    let group = finish(children);
    let _ = std::fs::remove_file(&source);
    let _ = std::fs::remove_file(&slowfs);
    assert!(group.stderr.is_empty(), "{}", group.stderr);
    assert_job_accurate(
        "16 threads of slow stat calls in one job",
        group.rate(),
        500.0,
    );
}

/// The probe's first line on stderr, and that it is the only one.
fn single_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {stderr}");
    lines[0]
}

#[test]
fn a_corrupt_segment_in_use_falls_back_to_a_cpus_share_of_the_limit() {
    let _turn = alone();
    let dir = mountpoint("jw-corrupt");
    let job = job("corrupt");
    let path = segment(&job);
    let env = job_env(dir.path(), "getattr=1500/s", &job);
    for (what, content) in [
        ("truncated", vec![0u8; 100]),
        ("not PADLL's", vec![0x5au8; 32_896]),
    ] {
        // The segment as another live process would hold it: our open file
        // description keeps a shared lock on byte 1, as an attached stage does.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        std::fs::write(&path, &content).unwrap();
        hold_shared_lock(&file);
        let group = run_group(dir.path(), 1, 1, "stat", &env);
        let line = single_line(&group.stderr);
        assert!(
            line.contains("job-wide limits unavailable") && line.contains(path.to_str().unwrap()),
            "{what}: {line}"
        );
        assert_job_accurate(
            &format!("{what} segment, a CPU's share of the limit"),
            group.rate(),
            1500.0 / cpus(),
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            content,
            "{what}: the segment was changed"
        );
        drop(file);
    }
    // No one holds it any more: it is stale, reset, used and removed by its last user.
    let group = run_group(dir.path(), 2, 1, "stat", &env);
    assert!(group.stderr.is_empty(), "{}", group.stderr);
    assert_job_accurate("a reset segment", group.rate(), 1500.0);
    assert!(!path.exists(), "the last process removes the segment");
}

use std::os::unix::fs::OpenOptionsExt;

/// Takes a shared OFD lock on byte 1 of `file` (what an attached stage holds).
fn hold_shared_lock(file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: flock is plain data.
    let mut request: libc::flock = unsafe { std::mem::zeroed() };
    request.l_type = libc::F_RDLCK as i16;
    request.l_whence = libc::SEEK_SET as i16;
    request.l_start = 1;
    request.l_len = 1;
    // SAFETY: our open file and a valid flock.
    let held = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &request) };
    assert_eq!(held, 0, "cannot lock the test segment");
}

#[test]
fn a_segment_left_by_a_killed_job_is_reset_for_the_next() {
    let _turn = alone();
    let dir = mountpoint("jw-killed");
    let job = job("killed");
    let env = job_env(dir.path(), "getattr=1500/s", &job);
    let mut victim = start_load(dir.path(), 30.0, 1, "stat", &env);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !segment(&job).exists() {
        assert!(std::time::Instant::now() < deadline, "no segment appeared");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(
        segment(&job).exists(),
        "a killed process cannot remove the segment"
    );
    let group = run_group(dir.path(), 2, 1, "stat", &env);
    assert!(group.stderr.is_empty(), "{}", group.stderr);
    assert_job_accurate("the next job with the same id", group.rate(), 1500.0);
    assert!(!segment(&job).exists());
}

#[test]
#[cfg_attr(
    not(all(has_root, has_setpriv)),
    ignore = "needs root and setpriv to run a probe as another uid"
)]
fn another_user_can_neither_join_nor_squat_a_job() {
    let _turn = alone();
    let dir = mountpoint("jw-uid");
    let job = job("uid");
    let env = job_env(dir.path(), "getattr=1500/s", &job);
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    // Same job id, same limit, another uid: two jobs, each with the whole limit.
    let ours = start_load(dir.path(), 3.0, 1, "stat", &env);
    let theirs = start_load_as(&nobody, dir.path(), 3.0, 1, "stat", &env);
    for (who, group) in [
        ("root's job", finish(vec![ours])),
        ("uid 65534", finish(vec![theirs])),
    ] {
        assert!(group.stderr.is_empty(), "{who}: {}", group.stderr);
        assert_job_accurate(who, group.rate(), 1500.0);
    }
    // A file planted by uid 65534 under root's segment name, open to all: refused,
    // never used, never changed.
    let path = segment(&job);
    std::fs::write(&path, b"").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    let group = run_group(dir.path(), 1, 1, "stat", &env);
    let line = single_line(&group.stderr);
    assert!(line.contains("owned by uid 65534"), "{line}");
    assert_job_accurate(
        "root's job beside a squatted segment, a CPU's share",
        group.rate(),
        1500.0 / cpus(),
    );
    let meta = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (meta.uid(), meta.len()),
        (65534, 0),
        "the planted file was changed"
    );
    std::fs::remove_file(&path).unwrap();
}

// The program's descriptors: the stage keeps its segment open (its lock) in the
// program's descriptor table; the program may take that number, and then it is the
// program's, in every child too.

/// A Python program finding the descriptor the stage keeps its job's segment on
/// (`sys.argv[1]`, the segment's path): `n`.
const FIND_SEGMENT_FD: &str = r#"
import os, sys
def stage_fd(target):
    for name in os.listdir('/proc/self/fd'):
        try:
            if os.readlink('/proc/self/fd/' + name) == target:
                return int(name)
        except OSError:
            pass
    sys.exit('no descriptor of the stage on ' + target)
n = stage_fd(sys.argv[1])
"#;

#[test]
#[cfg_attr(not(has_bash), ignore = "bash not installed")]
fn a_script_keeps_its_descriptor_3_in_every_child() {
    let _turn = together();
    let dir = mountpoint("jw-fd3");
    let job = job("fd3");
    let log = dir.join("log");
    // A batch script logging on descriptor 3 from itself, a subshell and a command.
    let script = r#"exec 3>"$1"
echo "from the script" >&3
( echo "from a subshell" >&3 )
/bin/echo "from an external command" >&3
echo "again from the script" >&3
exec 3>&-
cat "$1""#;
    let out = run(
        "bash",
        &["-c", script, "fd3", log.to_str().unwrap()],
        dir.path(),
        &job_env(dir.path(), "getattr=100/s", &job),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.is_empty(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from the script\nfrom a subshell\nfrom an external command\nagain from the script\n"
    );
    assert!(
        !segment(&job).exists(),
        "the last process removes the segment"
    );
}

#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn a_program_that_takes_the_stages_descriptor_keeps_it_in_its_children() {
    let _turn = together();
    let dir = mountpoint("jw-takefd");
    let job = job("takefd");
    let log = dir.join("log");
    // The program puts its log on the very number of the stage's descriptor, then
    // writes to it from itself, a forked child and the command that child runs.
    let script = format!(
        r#"{FIND_SEGMENT_FD}
log = sys.argv[2]
f = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.dup2(f, n)
os.close(f)
os.write(n, b'from the program\n')
pid = os.fork()
if pid == 0:
    os.write(n, b'from a forked child\n')
    os.execv(sys.executable, [sys.executable, '-c', 'import os; os.write(%d, b"from its command\\n")' % n])
_, status = os.waitpid(pid, 0)
os.write(n, b'again from the program\n')
os.close(n)
sys.stdout.write(open(log).read())
sys.exit(status)
"#
    );
    let path = segment(&job);
    let out = run(
        "python3",
        &["-c", &script, path.to_str().unwrap(), log.to_str().unwrap()],
        dir.path(),
        &job_env(dir.path(), "getattr=100/s", &job),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.is_empty(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from the program\nfrom a forked child\nfrom its command\nagain from the program\n"
    );
    // Its segment is left (the process could not tell it was the last): the job's
    // drop removes it, as an epilog would.
}

#[test]
#[cfg_attr(not(has_python3), ignore = "python3 not installed")]
fn a_process_that_closes_every_descriptor_leaves_the_segment_to_the_others() {
    let _turn = together();
    let dir = mountpoint("jw-closefrom");
    let job = job("closefrom");
    let env = job_env(dir.path(), "getattr=1500/s", &job);
    let path = segment(&job);
    let other = start_load(dir.path(), 4.0, 1, "stat", &env);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let inode = loop {
        if let Ok(meta) = std::fs::metadata(&path) {
            break std::os::unix::fs::MetadataExt::ino(&meta);
        }
        assert!(std::time::Instant::now() < deadline, "no segment appeared");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    // A process of the job closes every descriptor above 2 (as daemons and launchers
    // do) and opens a file of its own on the number the stage's was.
    let own = dir.join("own");
    let script = format!(
        r#"{FIND_SEGMENT_FD}
os.closerange(3, 1 << 16)
f = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o644)
if f != n:
    os.dup2(f, n)
os.stat(sys.argv[3])
"#
    );
    let out = run(
        "python3",
        &[
            "-c",
            &script,
            path.to_str().unwrap(),
            own.to_str().unwrap(),
            dir.path().to_str().unwrap(),
        ],
        dir.path(),
        &env,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.is_empty(), "{stderr}");
    let still = std::fs::metadata(&path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    assert_eq!(
        still.ok(),
        Some(inode),
        "the segment was removed while another process of the job used it"
    );
    let group = finish(vec![other]);
    assert!(group.stderr.is_empty(), "{}", group.stderr);
    assert!(!path.exists(), "the job's last process removes the segment");
}
