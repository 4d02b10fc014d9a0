//! Statistics records: what a stage reports per operation and per channel, the
//! JSON-lines file it writes at exit, and the table `padll stats` prints from it.

use crate::channel::ChannelInfo;
use crate::config::Identity;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Totals for one operation type.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpStats {
    /// Operation name (`open`, `read`, …).
    pub op: String,
    /// Calls seen.
    pub calls: u64,
    /// Calls whose target was under a registered mountpoint.
    pub managed: u64,
    /// Calls that went straight through (`calls - managed`).
    pub passthrough: u64,
    /// Managed calls that failed (the real call returned an error).
    pub errors: u64,
    /// Bytes moved by managed data calls (as returned by the real call).
    pub bytes: u64,
    /// Total time managed calls waited for tokens, in nanoseconds.
    pub wait_ns: u64,
}

/// One process' statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The program (`argv[0]`).
    pub program: String,
    /// Who ran it.
    pub identity: Identity,
    /// Per-operation counters (operations never called are left out).
    pub ops: Vec<OpStats>,
    /// Per-channel configuration and counters.
    pub channels: Vec<ChannelInfo>,
}

/// Renders reports as a table: one block per process, or a single `total` block
/// summing several.
pub fn table(reports: &[Report]) -> String {
    let mut out = String::new();
    for report in reports {
        let id = &report.identity;
        let _ = writeln!(
            out,
            "padll statistics: {} (pid {}, job {}, user {}, host {})",
            report.program, id.pid, id.job_id, id.user, id.hostname
        );
        write_ops(&mut out, &report.ops);
        write_channels(&mut out, &report.channels);
        out.push('\n');
    }
    out
}

/// Sums the operation counters of several reports (e.g. every process of a job).
pub fn total(reports: &[Report]) -> Vec<OpStats> {
    let mut totals: Vec<OpStats> = Vec::new();
    for row in reports.iter().flat_map(|r| &r.ops) {
        match totals.iter_mut().find(|t| t.op == row.op) {
            Some(t) => {
                t.calls += row.calls;
                t.managed += row.managed;
                t.passthrough += row.passthrough;
                t.errors += row.errors;
                t.bytes += row.bytes;
                t.wait_ns += row.wait_ns;
            }
            None => totals.push(row.clone()),
        }
    }
    totals
}

/// Writes the per-operation table.
pub fn write_ops(out: &mut String, ops: &[OpStats]) {
    let _ = writeln!(
        out,
        "  {:<12} {:>12} {:>12} {:>12} {:>8} {:>14} {:>10}",
        "operation", "calls", "managed", "passthrough", "errors", "bytes", "wait (s)"
    );
    for row in ops {
        let _ = writeln!(
            out,
            "  {:<12} {:>12} {:>12} {:>12} {:>8} {:>14} {:>10.3}",
            row.op,
            row.calls,
            row.managed,
            row.passthrough,
            row.errors,
            row.bytes,
            row.wait_ns as f64 / 1e9
        );
    }
}

fn write_channels(out: &mut String, channels: &[ChannelInfo]) {
    if channels.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  {:<40} {:>12} {:>16}",
        "channel", "admitted", "tokens"
    );
    for channel in channels {
        let _ = writeln!(
            out,
            "  {:<40} {:>12} {:>16}",
            channel.spec.to_string(),
            channel.admitted,
            channel.tokens
        );
    }
}

/// Parses a JSON-lines statistics file; errors name the line.
pub fn parse(text: &str) -> Result<Vec<Report>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Identity;

    #[test]
    fn json_round_trip_and_table() {
        let report = Report {
            program: "prog".into(),
            identity: Identity {
                job_id: "7".into(),
                ..Identity::default()
            },
            ops: vec![OpStats {
                op: "open".into(),
                calls: 3,
                managed: 2,
                passthrough: 1,
                ..OpStats::default()
            }],
            channels: vec![],
        };
        let line = serde_json::to_string(&report).unwrap();
        let parsed = parse(&format!("{line}\n{line}\n")).unwrap();
        assert_eq!(parsed, vec![report.clone(), report]);
        assert_eq!(total(&parsed)[0].calls, 6);
        let text = table(&parsed);
        assert!(text.contains("job 7") && text.contains("open"), "{text}");
        assert!(parse("{bad").unwrap_err().contains("line 1"));
    }
}
