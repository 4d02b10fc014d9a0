//! `cheferd-lab bench` with 2 000 simulated local controllers, each a real gRPC stream:
//! what the control cycle's design promises at scale, without timing this machine —
//! while nothing changes rules go only to the few local controllers whose
//! acknowledgement came late (none on an idle machine); when every rule changes,
//! every local controller is sent them once per cycle; and the bytes per local
//! controller and interval stay those of one report and one `Enforce`; and the same
//! reads and writes on plain TCP connections (the floor) are measured. All of it holds
//! with the local controllers attached through relays too. The report slots
//! and acknowledgements themselves are checked on tokio's paused clock
//! (`global/tests.rs`), where no load can move them.

use crate::util::{cheferd_lab, run_with_timeout};
use std::process::Command;
use std::time::Duration;

/// One row of the benchmark's table, by column.
struct Row(Vec<String>);

impl Row {
    fn number(&self, column: usize) -> f64 {
        self.0[column]
            .parse()
            .unwrap_or_else(|_| panic!("column {column} of {:?}", self.0))
    }
}

/// `cheferd-lab bench` at 2 000 local controllers, attached directly or through
/// `relays`: its steady and changing rows, and its whole output.
fn bench_rows(relays: usize) -> (Row, Row, String) {
    // 2 000 streams take both cores: no test measuring rates runs beside them.
    let _turn = crate::util::alone();
    let mut command = Command::new(cheferd_lab());
    command.args([
        "bench",
        "--locals",
        "2000",
        "--relays",
        &relays.to_string(),
        "--cycles",
        "2",
        "--interval-ms",
        "1000",
    ]);
    // Generous: attaching 2 000 streams beside a busy machine's other work takes
    // minutes (the bench waits while they keep coming).
    let output = run_with_timeout(&mut command, Duration::from_secs(900));
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut rows: Vec<Row> = stdout
        .lines()
        .filter(|line| line.starts_with("| 2000 |"))
        .map(|line| Row(line.split('|').map(|c| c.trim().to_string()).collect()))
        .collect();
    assert_eq!(rows.len(), 2, "two rows expected:\n{stdout}");
    let changing = rows.pop().expect("two rows");
    let steady = rows.pop().expect("two rows");
    // Columns: 3 rules change, 17 relays.
    assert_eq!(
        (&steady.0[3][..], &changing.0[3][..]),
        ("never", "every cycle")
    );
    assert_eq!(steady.number(17), relays as f64, "{stdout}");
    (steady, changing, stdout)
}

/// What both ways of attaching promise: columns 14 (locals sent rules) and 15 (bytes
/// per local per interval).
fn assert_rules_only_when_they_change(steady: &Row, changing: &Row, stdout: &str) {
    // While nothing changes, rules go only to local controllers whose acknowledgement
    // (carried by their next report) came more than a cycle late: they are sent their
    // rules again. None on an idle machine, a few under load (78 of 2 000 a cycle once,
    // the whole suite running beside `stress-ng --cpu 2`); never most of them — unless
    // the machine is so loaded that acknowledgements were still missing at the next
    // cycle (column 10, "until all acks", `inf`: 1 089 of 2 000 once, at a load
    // average of 8 on 2 cores, with cycles of 1.1 s for a 1 s interval). Even then not
    // every local controller.
    let acks_late = steady.0[10] == "inf";
    assert!(
        steady.number(14) < if acks_late { 2000.0 } else { 500.0 },
        "rules while nothing changes:\n{stdout}"
    );
    assert_eq!(
        changing.number(14),
        2000.0,
        "every local controller, every cycle"
    );
    // A report of 4 stages is ≈ 160 bytes and an `Enforce` of 4 stages' rules ≈ 45.
    assert!(steady.number(15) < 200.0, "{stdout}");
    assert!(changing.number(15) < 250.0, "{stdout}");
}

#[test]
fn two_thousand_local_controllers_are_sent_rules_only_when_they_change() {
    let (steady, changing, stdout) = bench_rows(0);
    assert_rules_only_when_they_change(&steady, &changing, &stdout);
    // Column 16: the plain TCP floor, measured for both modes after them (a number, not
    // "-": its 2 000 connections were all made, read and written to).
    for row in [&steady, &changing] {
        assert!(row.number(16) >= 0.0, "{stdout}");
    }
}

#[test]
fn through_twenty_relays_too() {
    let (steady, changing, stdout) = bench_rows(20);
    assert_rules_only_when_they_change(&steady, &changing, &stdout);
    // No floor: it stands for direct connections only.
    assert_eq!((&steady.0[16][..], &changing.0[16][..]), ("-", "-"));
}
