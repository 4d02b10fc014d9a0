//! The stage's behaviour on the calls a program makes, checked with `padll-probe`, which
//! makes exactly the libc calls a scenario names: rate accuracy per operation, class and
//! bytes; unmanaged paths not slowed; relative paths, `*at`, dup/fcntl, descriptors
//! closed where no hook sees it, `FILE*`, `DIR*`; errno; `mmap`; fork; exec; 256
//! threads; signals interrupting a throttled call, and a handler's own calls; a bad
//! configuration.
//!
//! Rates are measured over ≥ 2 s windows by the probe itself (operations / elapsed).
//! The issue asks for ±5 % and never above +5 %: the upper bound is what protects the
//! file system and is asserted as is; the lower bound only catches a stage throttling
//! far below its limit, as a loaded 2-core machine descheduling the probe can only
//! lose tokens, never add any.

use crate::util::*;

/// A scratch mountpoint with the probe's 4 MiB `file` in it.
fn mountpoint(name: &str) -> Scratch {
    let dir = Scratch::new(name);
    probe_run("setup", dir.path(), &[], &[]);
    dir
}

/// Runs a probe loop under `rules` and returns (achieved rate, statistics reports).
fn rate_under(
    dir: &Scratch,
    scenario: &str,
    args: &[&str],
    rules: &str,
    unit: &str,
) -> (f64, Vec<padll_wire::report::Report>) {
    let stats = dir.path().with_extension(format!("{scenario}.json"));
    let _ = std::fs::remove_file(&stats);
    let out = probe_run(
        scenario,
        dir.path(),
        args,
        &stage_env(dir.path(), rules, Some(&stats)),
    );
    let rate = out[unit] / out["seconds"];
    let reports = reports(&stats);
    let _ = std::fs::remove_file(&stats);
    (rate, reports)
}

/// Asserts `achieved` is within the accuracy window of `limit`.
fn assert_accurate(what: &str, achieved: f64, limit: f64) {
    assert!(
        achieved <= limit * 1.05,
        "{what}: {achieved:.0}/s is above the {limit:.0}/s limit + 5 %"
    );
    assert!(
        achieved >= limit * 0.5,
        "{what}: {achieved:.0}/s is far below the {limit:.0}/s limit"
    );
}

#[test]
fn operation_limits_are_accurate() {
    let _turn = crate::util::together();
    let dir = mountpoint("op-limits");
    let (rate, reports) = rate_under(&dir, "open-loop", &["2.5"], "open=1500/s", "ops");
    assert_accurate("open=1500/s", rate, 1500.0);
    assert!(op(&reports, "open").wait_ns > 0, "opens never waited");
    // close is a different operation: not limited by the open channel.
    assert_eq!(op(&reports, "close").wait_ns, 0);

    let (rate, reports) = rate_under(&dir, "stat-loop", &["2.5"], "getattr=1500/s", "ops");
    assert_accurate("getattr=1500/s", rate, 1500.0);
    let getattr = op(&reports, "getattr");
    assert_eq!(
        getattr.managed, getattr.calls,
        "every stat of the file is managed"
    );
}

#[test]
fn class_limit_covers_every_metadata_operation() {
    let _turn = crate::util::together();
    let dir = mountpoint("class-limit");
    // stat + open + close: three metadata operations per iteration, one bucket.
    let (rate, reports) = rate_under(&dir, "mixed-loop", &["2.5"], "metadata=2400/s", "ops");
    assert_accurate("metadata=2400/s", rate, 2400.0);
    for name in ["getattr", "open", "close"] {
        assert!(op(&reports, name).managed > 0, "{name} not managed");
    }
}

#[test]
fn byte_limit_is_accurate() {
    let _turn = crate::util::together();
    let dir = mountpoint("byte-limit");
    // 64 KiB preads at 16 MiB/s: 256 reads per second.
    let (rate, reports) = rate_under(
        &dir,
        "read-loop",
        &["2.5", "65536"],
        "read=16MiB/s",
        "bytes",
    );
    assert_accurate("read=16MiB/s", rate, 16.0 * 1024.0 * 1024.0);
    let read = op(&reports, "read");
    assert!(
        read.bytes >= (rate * 2.0) as u64,
        "bytes counted: {}",
        read.bytes
    );
}

#[test]
fn unmanaged_paths_are_not_slowed() {
    let _turn = crate::util::together();
    let managed = mountpoint("limited-mount");
    let elsewhere = mountpoint("elsewhere");
    // The mountpoint is limited to 50 ops/s; the probe works in another directory.
    let stats = elsewhere.path().with_extension("json");
    let _ = std::fs::remove_file(&stats);
    let out = probe_run(
        "stat-loop",
        elsewhere.path(),
        &["1"],
        &stage_env(managed.path(), "all=50/s", Some(&stats)),
    );
    // Far above the limit (a loaded machine slows the loop, never to 10 × the limit).
    let rate = out["ops"] / out["seconds"];
    assert!(
        rate > 10.0 * 50.0,
        "an unmanaged stat loop ran at only {rate:.0}/s"
    );
    let getattr = op(&reports(&stats), "getattr");
    assert_eq!(getattr.managed, 0);
    assert_eq!(getattr.wait_ns, 0);
    let _ = std::fs::remove_file(stats);
}

/// Runs a functional scenario under the stage and returns its statistics.
fn scenario(dir: &Scratch, name: &str) -> Vec<padll_wire::report::Report> {
    let stats = dir.path().with_extension(format!("{name}.json"));
    let _ = std::fs::remove_file(&stats);
    let out = probe_run(
        name,
        dir.path(),
        &[],
        &stage_env(dir.path(), "all=1M/s", Some(&stats)),
    );
    assert!(!out.is_empty(), "{name}: no output");
    let reports = reports(&stats);
    let _ = std::fs::remove_file(stats);
    reports
}

#[test]
fn relative_paths_resolve_against_the_current_directory() {
    let _turn = crate::util::together();
    let dir = mountpoint("relative");
    let reports = scenario(&dir, "relative");
    // file, ./file and ../<name>/file are inside; ".." (the parent) is not.
    let getattr = op(&reports, "getattr");
    assert_eq!(getattr.managed, 3, "{getattr:?}");
    assert!(getattr.passthrough >= 1, "stat .. was managed: {getattr:?}");
    assert_eq!(op(&reports, "open").managed, 1);
    assert_eq!(op(&reports, "chdir").managed, 1);
}

#[test]
fn at_calls_resolve_against_their_directory_descriptor() {
    let _turn = crate::util::together();
    let dir = mountpoint("at");
    let reports = scenario(&dir, "at");
    // fstatat(dirfd, "file"), fstatat(parent, "<name>/file") with the parent opened as
    // `parent` and as `parent/`, fstatat(dirfd, "", EMPTY_PATH).
    assert_eq!(op(&reports, "getattr").managed, 4);
    // The mountpoint's own directory and the openat through it; not the parent.
    assert_eq!(op(&reports, "open").managed, 2);
}

#[test]
fn duplicated_descriptors_stay_managed() {
    let _turn = crate::util::together();
    let dir = mountpoint("dup");
    let reports = scenario(&dir, "dup");
    // fstat on the original, dup, dup2 and F_DUPFD_CLOEXEC copies; the fstat on a
    // closed descriptor fails and is not managed.
    let getattr = op(&reports, "getattr");
    assert_eq!(getattr.managed, 4, "{getattr:?}");
    assert_eq!(op(&reports, "close").managed, 4);
}

#[test]
fn a_descriptor_closed_unseen_does_not_make_its_successor_managed() {
    let _turn = crate::util::together();
    let dir = mountpoint("stale");
    let reports = scenario(&dir, "stale");
    // The file is opened 14 times, and closed by `closefrom` once and by a raw system
    // call 13 times; the pipe, sockets, eventfd, … that reuse its number are not it.
    assert_eq!(op(&reports, "open").managed, 14);
    let read = op(&reports, "read");
    assert_eq!(read.managed, 0, "the pipe's read was managed: {read:?}");
    assert_eq!(op(&reports, "write").managed, 0);
    let getattr = op(&reports, "getattr");
    assert_eq!(
        getattr.managed, 0,
        "an fstat of a new descriptor was managed: {getattr:?}"
    );
    assert_eq!(getattr.passthrough, 13, "{getattr:?}");
}

#[test]
fn descriptors_received_over_a_socket_or_from_a_process_stay_managed() {
    let _turn = crate::util::together();
    let dir = mountpoint("received");
    let reports = scenario(&dir, "received");
    // One `pread` of a copy received with `recvmsg`, one with `recvmmsg`, one taken
    // with `pidfd_getfd`, each after the original was closed.
    let read = op(&reports, "read");
    assert_eq!((read.managed, read.passthrough), (3, 0), "{read:?}");
}

#[test]
fn a_close_range_that_closes_nothing_for_the_process_keeps_its_files_managed() {
    let _turn = crate::util::together();
    let dir = mountpoint("close-range");
    let reports = scenario(&dir, "close_range");
    // One `pread` after a refused flag, after first > last, and after another thread's
    // close in its own copy of the table (`CLOSE_RANGE_UNSHARE`); and a forked child's,
    // of one thread, after its own `CLOSE_RANGE_UNSHARE` closed the file for it; and
    // another child's, after its `close_range` failed with `ENOSYS` (a seccomp filter
    // standing for a kernel before 5.9).
    let read = op(&reports, "read");
    assert_eq!((read.managed, read.passthrough), (4, 1), "{read:?}");
    assert_eq!(op(&reports, "close").managed, 1);
}

#[test]
fn fortified_large_file_and_reentrant_entry_points_are_managed() {
    let _turn = crate::util::together();
    let dir = mountpoint("entry-points");
    let reports = scenario(&dir, "entry_points");
    assert_eq!(op(&reports, "readlink").managed, 1, "__readlink_chk");
    assert_eq!(op(&reports, "setattr").managed, 1, "lchmod");
    // getdents64, scandirat64, readdir_r.
    let readdir = op(&reports, "readdir");
    assert_eq!(readdir.managed, 3, "{readdir:?}");
    let read = op(&reports, "read");
    assert_eq!(
        (read.managed, read.errors),
        (3, 0),
        "getline to the end: {read:?}"
    );
    // `remove` of a directory is its refused `unlink` and its `rmdir`; of a link, an
    // `unlink`.
    let unlink = op(&reports, "unlink");
    assert_eq!((unlink.managed, unlink.errors), (2, 1), "{unlink:?}");
    assert_eq!(op(&reports, "rmdir").managed, 1);
}

#[test]
fn a_daemon_leaves_its_mountpoint_behind() {
    let _turn = crate::util::together();
    let dir = mountpoint("daemon");
    let stats = dir.path().with_extension("daemon.json");
    let _ = std::fs::remove_file(&stats);
    let env = stage_env(dir.path(), "all=1M/s", Some(&stats));
    let parent = run(
        probe(),
        &["daemon", dir.path().to_str().unwrap()],
        dir.path(),
        &env,
    );
    assert!(parent.status.success(), "{parent:?}");
    // The detached child reports when it ends (its parent ends inside `daemon`).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !stats.exists() || std::fs::read_to_string(&stats).is_ok_and(|t| !t.ends_with('\n')) {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon never reported"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let reports = reports(&stats);
    let write = op(&reports, "write");
    assert_eq!((write.managed, write.passthrough), (0, 10), "{write:?}");
    let getattr = op(&reports, "getattr");
    assert_eq!(
        (getattr.managed, getattr.passthrough),
        (0, 1),
        "{getattr:?}"
    );
    let _ = std::fs::remove_file(stats);
}

#[test]
fn streams_and_directory_streams_are_followed() {
    let _turn = crate::util::together();
    let dir = mountpoint("streams");
    let reports = scenario(&dir, "stdio");
    assert_eq!(op(&reports, "open").managed, 2, "two fopen");
    assert!(op(&reports, "write").bytes >= 24, "fwrite + fputs");
    assert!(op(&reports, "read").managed >= 2, "fgets, fgetc, fread");
    assert_eq!(op(&reports, "close").managed, 2, "two fclose");

    let reports = scenario(&dir, "dirent");
    assert_eq!(op(&reports, "opendir").managed, 1);
    assert!(op(&reports, "readdir").managed >= 3, ". .. file");
    assert_eq!(op(&reports, "closedir").managed, 1);
}

#[test]
fn errno_and_results_are_exactly_the_real_calls() {
    let _turn = crate::util::together();
    let dir = mountpoint("errno");
    let reports = scenario(&dir, "errno");
    assert!(op(&reports, "open").errors >= 1);
    assert!(op(&reports, "mkdir").errors >= 1);
    // Also when the call had to wait for tokens.
    probe_run(
        "errno",
        dir.path(),
        &[],
        &stage_env(dir.path(), "metadata=200/s", None),
    );
}

#[test]
fn file_mappings_are_counted_and_anonymous_ones_pass_through() {
    let _turn = crate::util::together();
    let dir = mountpoint("mmap");
    let reports = scenario(&dir, "mmap");
    assert_eq!(op(&reports, "mmap").managed, 1);
}

#[test]
fn a_forked_child_keeps_working_and_reports_on_its_own() {
    let _turn = crate::util::together();
    let dir = mountpoint("fork");
    let stats = dir.path().with_extension("json");
    let _ = std::fs::remove_file(&stats);
    let out = probe_run(
        "fork",
        dir.path(),
        &["1.5"],
        &stage_env(dir.path(), "getattr=400/s", Some(&stats)),
    );
    // Each process has its own stage and bucket: the parent alone is held at 400/s.
    assert_accurate("parent after fork", out["parent_ops"] / 1.5, 400.0);
    let reports = reports(&stats);
    assert_eq!(reports.len(), 2, "parent and child each write statistics");
    assert_ne!(reports[0].identity.pid, reports[1].identity.pid);
    for report in &reports {
        let getattr = report
            .ops
            .iter()
            .find(|o| o.op == "getattr")
            .expect("getattr row");
        assert!(getattr.managed > 0 && getattr.wait_ns > 0, "{getattr:?}");
    }
    let _ = std::fs::remove_file(stats);
}

#[test]
#[cfg_attr(not(has_bash), ignore = "bash not installed")]
fn children_of_a_batch_script_are_throttled_too() {
    let _turn = crate::util::together();
    let dir = mountpoint("exec");
    let stats = dir.path().with_extension("json");
    let _ = std::fs::remove_file(&stats);
    // bash execs the probe, which inherits LD_PRELOAD and the stage's variables.
    let script = format!(
        "'{}' stat-loop '{}' 2 | tee result.txt",
        probe(),
        dir.path().display()
    );
    let out = run(
        "bash",
        &["-c", &script],
        dir.path(),
        &stage_env(dir.path(), "getattr=500/s", Some(&stats)),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| -> f64 {
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {text}"))
    };
    assert_accurate(
        "probe exec'd by bash",
        field("ops") / field("seconds"),
        500.0,
    );
    let programs: Vec<String> = reports(&stats).iter().map(|r| r.program.clone()).collect();
    assert!(
        programs.iter().any(|p| p.contains("padll-probe")),
        "{programs:?}"
    );
    assert!(programs.iter().any(|p| p.contains("bash")), "{programs:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("result.txt")).unwrap(),
        text
    );
    let _ = std::fs::remove_file(stats);
}

#[test]
fn many_threads_share_one_bucket() {
    let _turn = crate::util::together();
    let dir = mountpoint("threads");
    // 256 threads × 12 stats under a 1500/s limit: ≈ 2 s.
    let (rate, reports) = rate_under(&dir, "threads", &["256", "12"], "getattr=1500/s", "ops");
    assert_accurate("256 threads at getattr=1500/s", rate, 1500.0);
    assert_eq!(op(&reports, "getattr").managed, 256 * 12);
}

#[test]
fn signals_interrupting_a_throttled_call_do_not_fail_it() {
    let _turn = crate::util::together();
    let dir = mountpoint("signals");
    // 30 stats at 20/s (1.5 s) while SIGALRM arrives every 5 ms without SA_RESTART:
    // every stat succeeds with errno untouched, and the handler keeps running.
    let out = probe_run(
        "signal",
        dir.path(),
        &["30"],
        &stage_env(dir.path(), "getattr=20/s", None),
    );
    assert_eq!(out["stats"], 30.0);
    assert!(
        out["signals"] > 50.0,
        "the handler ran {} times",
        out["signals"]
    );
}

#[test]
fn a_signal_handlers_calls_are_throttled_with_its_threads() {
    let _turn = crate::util::together();
    let dir = mountpoint("handler-calls");
    // A stat loop limited to 1000/s, and a handler stating the same file every 2 ms
    // (500/s offered): together they get the limit, not more, and not much less (a
    // handler's token or batch lost while its thread sleeps would cost the thread its
    // rate; the loop sleeps most of the time, so a loaded machine slows it little).
    let (rate, reports) = rate_under(&dir, "stat-loop-signals", &["4"], "getattr=1000/s", "ops");
    assert_accurate(
        "a stat loop and its signal handler at getattr=1000/s",
        rate,
        1000.0,
    );
    assert!(
        rate >= 800.0,
        "{rate:.0}/s: the handler's calls cost the thread its rate"
    );
    assert_eq!(op(&reports, "getattr").passthrough, 0);
}

#[test]
fn a_bad_configuration_runs_the_program_unthrottled_with_one_line() {
    let _turn = crate::util::together();
    let dir = mountpoint("bad-config");
    let mut env = stage_env(dir.path(), "open=fast", None);
    env.push(("PADLL_LOG".into(), "error".into()));
    let out = run(
        probe(),
        &["stat-loop", dir.path().to_str().unwrap(), "0.3"],
        dir.path(),
        &env,
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("fast"), "the bad value is named: {stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ops="));
}

/// A mistyped variable (`PADLL_RULE`) and limits without a mountpoint meant no limits
/// without a word: each is said in one line, and the program runs.
#[test]
fn a_mistyped_variable_or_limits_without_a_mountpoint_are_said_in_one_line() {
    let _turn = crate::util::together();
    let dir = mountpoint("mistyped");
    let mount = dir.path().display().to_string();
    let preload = ("LD_PRELOAD", library().display().to_string());
    let said = |env: &[(&str, &str)]| {
        let mut env: Vec<(String, String)> = (env.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push((preload.0.into(), preload.1.clone()));
        let out = run(probe(), &["stat-loop", &mount, "0.1"], dir.path(), &env);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("ops="));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let mut lines: Vec<String> = stderr.lines().map(String::from).collect();
        lines.sort();
        lines
    };
    let pid_and = |line: &str| line.split_once(": ").map(|(_, rest)| rest.to_string());
    let typos = said(&[("PADLL_RULE", "metadata=10/s"), ("PADLL_MOUNT", &mount)]);
    assert_eq!(
        typos.iter().filter_map(|l| pid_and(l)).collect::<Vec<_>>(),
        [
            "PADLL_MOUNT is no PADLL variable: it is ignored (did you mean PADLL_MOUNTS?)",
            "PADLL_RULE is no PADLL variable: it is ignored (did you mean PADLL_RULES?)",
        ],
        "{typos:?}"
    );
    let no_mount = said(&[("PADLL_RULES", "metadata=10/s")]);
    assert_eq!(
        no_mount
            .iter()
            .filter_map(|l| pid_and(l))
            .collect::<Vec<_>>(),
        [
            "the limit 'metadata=10/s' limits nothing: no mountpoint is registered \
             (PADLL_MOUNTS, or mounts in PADLL_CONFIG); every call passes through"
        ],
        "{no_mount:?}"
    );
    assert_eq!(said(&[("PADLL_RULE", "x"), ("PADLL_LOG", "off")]), [""; 0]);
}

#[test]
fn the_stage_is_silent_and_leaves_no_files() {
    let _turn = crate::util::together();
    let dir = mountpoint("silence");
    let before = tree(dir.path());
    let out = run(
        probe(),
        &["mixed-loop", dir.path().to_str().unwrap(), "0.2"],
        dir.path(),
        &stage_env(dir.path(), "metadata=100k/s", None),
    );
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().count(),
        1,
        "only the probe's own line: {stdout}"
    );
    assert_eq!(tree(dir.path()), before);
}

#[test]
#[cfg_attr(not(has_bash), ignore = "bash not installed")]
fn copies_are_paced_by_the_bytes_they_move() {
    let _turn = crate::util::together();
    // cp and cat ask copy_file_range for up to SSIZE_MAX bytes at a time: the stage
    // must charge what is moved (4 MiB read + 4 MiB written at 8 MiB/s ≈ 1 s), not
    // what was asked for (which would block the channel for ever).
    let dir = mountpoint("copies");
    for script in ["cp file copy", "cat file > copy", "cat < file >> copy"] {
        let started = std::time::Instant::now();
        let out = run(
            "bash",
            &["-c", script],
            dir.path(),
            &stage_env(dir.path(), "data=8MiB/s", None),
        );
        let seconds = started.elapsed().as_secs_f64();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Paced (not faster than 8 MiB/s), and done: charging what was asked for would
        // block for ever (a loaded machine takes longer, not minutes).
        assert!(
            (0.7..60.0).contains(&seconds),
            "{script} took {seconds:.2} s at 8 MiB/s"
        );
        assert_eq!(
            std::fs::metadata(dir.join("copy")).unwrap().len() % (4 << 20),
            0
        );
        let _ = std::fs::remove_file(dir.join("copy"));
    }
}

#[test]
fn the_stages_own_io_is_never_throttled() {
    let _turn = crate::util::together();
    // Statistics written at exit into the managed mountpoint, whose every operation is
    // limited to 1/s and exhausted by the loop, and writes to 32 bytes a second: were
    // the stage's own open, write and close managed, the exit would wait 3 s for them
    // and the write of its report (over 512 bytes) 16 s more.
    let dir = mountpoint("own-io");
    let stats = dir.join("stats.json");
    let out = probe_run(
        "load",
        dir.path(),
        &["1", "1", "stat"],
        &stage_env(dir.path(), "all=1/s,write=32B/s", Some(&stats)),
    );
    // From the loop's end to the process' exit, on the clock the probe printed its end
    // on (its start-up, which a loaded machine makes long, is not in it).
    let now = clocks::now(libc::CLOCK_MONOTONIC).as_nanos() as f64;
    let exit = (now - out["end_ns"]) / 1e9;
    assert!(exit < 10.0, "exit took {exit:.2} s after the loop");
    let written = std::fs::metadata(&stats).map_or(0, |m| m.len());
    assert!(written > 512, "a report of {written} bytes");
    let reports = reports(&stats);
    assert!(
        op(&reports, "getattr").wait_ns > 0,
        "the loop was not throttled"
    );
    assert_eq!(
        op(&reports, "open").calls,
        0,
        "the stage counted its own open"
    );
}
