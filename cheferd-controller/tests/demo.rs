//! The README's main command, shortened: `cheferd-lab demo` runs its embedded controllers
//! and jobs under the stage, prints the live table and the summary (per job: demand,
//! assigned rate, operations, when it ran), writes the plot, and keeps the aggregate
//! under `Max_R`. Its results go to `--out`, or by default to a directory under the
//! temporary directory it prints, never to the current directory.

use std::path::{Path, PathBuf};

/// `cheferd-lab demo` with two jobs at `Max_R` 3000 ops/s, in `cwd` with `TMPDIR=tmp`: its
/// standard output, once it succeeded.
fn demo(out: Option<&Path>, cwd: &Path, tmp: &Path) -> String {
    // The demo looks for the stage beside itself (or in the profile's deps/).
    crate::util::stage_library();
    let mut command = std::process::Command::new(crate::util::cheferd_lab());
    command
        .args(["demo", "--seconds", "8", "--stagger", "2", "--jobs", "2"])
        .args(["--max-rate", "3000"])
        .current_dir(cwd)
        .env("TMPDIR", tmp);
    if let Some(out) = out {
        command.arg("--out").arg(out);
    }
    let output = crate::util::run_with_timeout(&mut command, std::time::Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed: {stderr}\n{stdout}");
    // Its own teardown is no failure: no warning that its local controller detached.
    assert!(!stderr.contains("detached"), "{stderr}");
    stdout
}

/// The summary of a demo's output, checked: no window above `Max_R` + 5 %, and per job
/// its demand (the shares of PADLL Table I's 15 and 25), about half the operations each
/// (they replay equal parts of the trace whatever their shares), and a finished run.
fn check_summary(stdout: &str) {
    assert!(
        stdout.contains("job-1") && stdout.contains("job-2") && stdout.contains("mutual TLS"),
        "{stdout}"
    );
    let summary = stdout
        .split("\nsummary")
        .nth(1)
        .unwrap_or_else(|| panic!("no summary: {stdout}"));
    assert!(
        summary.contains(" 0 of "),
        "windows above Max_R + 5 %: {summary}"
    );
    let demands = [15.0, 25.0];
    for (j, demand) in demands.iter().enumerate() {
        let name = format!("job-{}", j + 1);
        let row = summary
            .lines()
            .find(|line| line.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row of {name}: {summary}"));
        let expected_demand = format!(
            "{:.0}/s ({:.1} %)",
            3000.0 * demand / 110.0,
            100.0 * demand / demands.iter().sum::<f64>()
        );
        assert!(row.contains(&expected_demand), "{expected_demand}: {row}");
        // The shares in the row, in parentheses: demand, assigned (if every job ran at
        // once), operations.
        let shares: Vec<f64> = row
            .split('(')
            .skip(1)
            .filter_map(|part| part.split(" %)").next()?.parse().ok())
            .collect();
        let operations = *shares.last().unwrap_or(&0.0);
        assert!(
            (40.0..=60.0).contains(&operations),
            "{name} did {operations} % of the operations: {row}"
        );
        assert!(
            row.trim_end().ends_with(" s") && row.contains('–'),
            "{name} did not finish: {row}"
        );
    }
}

/// The demo's pid, from the directory it names (`…/cheferd-demo-<pid>/run/…`).
fn pid_of(stdout: &str) -> u32 {
    stdout
        .split("cheferd-demo-")
        .nth(1)
        .and_then(|rest| rest.split('/').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no cheferd-demo-<pid> in {stdout}"))
}

fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect()
}

fn assert_written(paths: &[PathBuf]) {
    for path in paths {
        assert!(
            path.metadata().is_ok_and(|m| m.len() > 0),
            "{} not written",
            path.display()
        );
    }
}

#[test]
fn the_demo_runs_and_keeps_the_aggregate_under_max_r() {
    let _turn = crate::util::alone();
    let (cwd, tmp, out) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let stdout = demo(Some(out.path()), cwd.path(), tmp.path());
    check_summary(&stdout);
    assert_written(&["rates.csv", "rates.png", "rates.svg"].map(|file| out.path().join(file)));
    // Its certificates, scratch directory and trace are gone; nothing went elsewhere,
    // nor stayed in /dev/shm for its jobs (`job-N.<pid>`).
    assert_eq!(files(tmp.path()), Vec::<PathBuf>::new());
    assert_eq!(files(cwd.path()), Vec::<PathBuf>::new());
    let pid = pid_of(&stdout);
    // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let user_directory = format!("{}/{uid}", padll_wire::node_files::NODE_DIRECTORY);
    let left: Vec<PathBuf> = [padll_wire::node_files::DIRECTORY, &user_directory]
        .into_iter()
        .filter(|dir| Path::new(dir).exists())
        .flat_map(|dir| files(Path::new(dir)))
        .filter(|f| f.to_string_lossy().ends_with(&format!(".{pid}")))
        .collect();
    assert_eq!(left, Vec::<PathBuf>::new());
}

#[test]
fn by_default_the_results_go_under_the_temporary_directory_and_are_named() {
    let _turn = crate::util::alone();
    let (cwd, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let stdout = demo(None, cwd.path(), tmp.path());
    assert_eq!(files(cwd.path()), Vec::<PathBuf>::new(), "{stdout}");
    // One directory of results, the rest of the run removed.
    let [results] = &files(tmp.path())[..] else {
        panic!("{:?}: {stdout}", files(tmp.path()));
    };
    let mut written = files(results);
    written.sort();
    let expected = ["rates.csv", "rates.png", "rates.svg"].map(|file| results.join(file));
    assert_eq!(written, expected);
    assert_written(&expected);
    for path in &expected {
        assert!(
            stdout.contains(&path.display().to_string()),
            "{} not printed: {stdout}",
            path.display()
        );
    }
}

/// The pids of `parent`'s children (from `/proc`).
fn children(parent: u32) -> Vec<u32> {
    files(Path::new("/proc"))
        .iter()
        .filter_map(|dir| {
            let pid = dir.file_name()?.to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            // `pid (comm) state ppid …`: comm may hold spaces, not a `)` last.
            let ppid: u32 = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

/// Starts a long demo of three jobs in a process group of its own, with `TMPDIR=tmp`,
/// stops it with `signal` (to the group when `group`) once its three jobs run, and
/// checks that it exits with `code` after one line, its jobs gone and nothing of it
/// left under the temporary directory.
fn stop_the_demo(signal: libc::c_int, group: bool, code: i32) {
    use std::io::BufRead;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::time::{Duration, Instant};
    crate::util::stage_library();
    let tmp = tempfile::tempdir().unwrap();
    let mut demo = std::process::Command::new(crate::util::cheferd_lab())
        .args(["demo", "--seconds", "120", "--stagger", "0", "--jobs", "3"])
        .env("TMPDIR", tmp.path())
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = demo.id();
    // Its first row of rates comes once its jobs started.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = std::io::BufReader::new(demo.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut shown = String::new();
    while !shown.lines().any(|line| line.starts_with("   1 ")) {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no first row: {shown}"));
        shown += &line;
        shown.push('\n');
    }
    let jobs = children(pid);
    assert_eq!(jobs.len(), 3, "the demo's children: {jobs:?}");
    let target = if group { -(pid as i32) } else { pid as i32 };
    // SAFETY: kill takes plain integers and touches no memory.
    assert_eq!(unsafe { libc::kill(target, signal) }, 0);

    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = demo.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the demo did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut demo.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(
        (status.code(), status.signal()),
        (Some(code), None),
        "{stderr}"
    );
    let name = if signal == libc::SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    assert!(
        stderr.contains(&format!("cheferd-lab: stopped by {name}")),
        "{stderr}"
    );
    for job in jobs {
        assert!(
            !Path::new(&format!("/proc/{job}")).exists(),
            "job {job} still runs"
        );
    }
    assert_eq!(files(tmp.path()), Vec::<PathBuf>::new());
}

#[test]
fn ctrl_c_stops_the_demo_and_removes_its_files() {
    let _turn = crate::util::alone();
    stop_the_demo(libc::SIGINT, true, 130);
}

#[test]
fn sigterm_to_the_demo_alone_stops_its_jobs_and_removes_its_files() {
    let _turn = crate::util::alone();
    stop_the_demo(libc::SIGTERM, false, 143);
}
