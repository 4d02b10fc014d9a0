//! Statistics records: what a stage reports per operation and per channel, the
//! JSON-lines file it writes at exit, and the table `padll stats` prints from it.

use crate::channel::{ChannelInfo, ChannelSpec, LimitScope};
use crate::config::Identity;
use crate::latency::{Histogram, LatencyRow, BUCKETS};
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
    /// Bytes moved by managed data calls (as returned by the real call). Calls that
    /// pass through are not counted: their hook hands them to libc without waiting
    /// for the result, so the bytes they move are never seen (the table's heading is
    /// `bytes (managed)`).
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
    /// Service times of managed calls per mountpoint and class (none in files written
    /// before they were measured).
    #[serde(default)]
    pub latency: Vec<LatencyRow>,
}

/// Renders reports as a table: one block per process, or a single `total` block
/// summing several.
pub fn table(reports: &[Report]) -> String {
    let mut out = String::new();
    for report in reports {
        let id = &report.identity;
        let _ = writeln!(
            out,
            "{TABLE_HEADING} {} (pid {}, job {}, user {}, host {})",
            report.program, id.pid, id.job_id, id.user, id.hostname
        );
        write_ops(&mut out, &report.ops);
        write_channels(&mut out, &report.channels);
        write_latency(&mut out, &report.latency);
        out.push('\n');
    }
    out
}

/// Sums the operation counters of several reports (e.g. every process of a job),
/// saturating: reports are read from a file, and a sum must not wrap.
pub fn total(reports: &[Report]) -> Vec<OpStats> {
    let mut totals: Vec<OpStats> = Vec::new();
    for row in reports.iter().flat_map(|r| &r.ops) {
        match totals.iter_mut().find(|t| t.op == row.op) {
            Some(t) => {
                t.calls = t.calls.saturating_add(row.calls);
                t.managed = t.managed.saturating_add(row.managed);
                t.passthrough = t.passthrough.saturating_add(row.passthrough);
                t.errors = t.errors.saturating_add(row.errors);
                t.bytes = t.bytes.saturating_add(row.bytes);
                t.wait_ns = t.wait_ns.saturating_add(row.wait_ns);
            }
            None => totals.push(row.clone()),
        }
    }
    totals
}

/// One channel summed over the processes of a job that had it. `binds` says whom its
/// rate held: the job's processes on the node together (`job`: they shared one bucket)
/// or each process (`process`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChannelTotal {
    /// The channel's selector and limit (channels are summed by equal spec and scope).
    pub spec: ChannelSpec,
    /// Whom the limit bound.
    pub binds: LimitScope,
    /// Processes that reported this channel.
    pub processes: u64,
    /// Requests admitted, summed.
    pub admitted: u64,
    /// Tokens consumed (requests or bytes), summed.
    pub tokens: u64,
}

/// Sums the channels of several reports, one row per distinct channel spec, in order
/// of first appearance (saturating, as [`total`]).
pub fn channel_totals(reports: &[Report]) -> Vec<ChannelTotal> {
    let mut totals: Vec<ChannelTotal> = Vec::new();
    for channel in reports.iter().flat_map(|r| &r.channels) {
        match totals
            .iter_mut()
            .find(|t| t.spec == channel.spec && t.binds == channel.binds)
        {
            Some(t) => {
                t.processes = t.processes.saturating_add(1);
                t.admitted = t.admitted.saturating_add(channel.admitted);
                t.tokens = t.tokens.saturating_add(channel.tokens);
            }
            None => totals.push(ChannelTotal {
                spec: channel.spec.clone(),
                binds: channel.binds,
                processes: 1,
                admitted: channel.admitted,
                tokens: channel.tokens,
            }),
        }
    }
    totals
}

/// Sums the service times of several reports: one row per mountpoint and class, in
/// order of first appearance.
pub fn latency_totals(reports: &[Report]) -> Vec<LatencyRow> {
    let mut totals: Vec<(String, crate::ops::Class, Histogram)> = Vec::new();
    for row in reports.iter().flat_map(|r| &r.latency) {
        // `parse` refuses rows with more buckets than the layout.
        let Ok(histogram) = Histogram::from_counts(&row.counts) else {
            continue;
        };
        match totals
            .iter_mut()
            .find(|(mount, class, _)| *mount == row.mount && *class == row.class)
        {
            Some((_, _, sum)) => sum.merge(&histogram),
            None => totals.push((row.mount.clone(), row.class, histogram)),
        }
    }
    totals
        .into_iter()
        .map(|(mount, class, histogram)| LatencyRow {
            mount,
            class,
            counts: histogram.counts().to_vec(),
        })
        .collect()
}

/// Writes the service-time table: calls timed, median and 99th percentile per
/// mountpoint and class (nothing when no call was timed).
pub fn write_latency(out: &mut String, rows: &[LatencyRow]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  {:<40} {:<9} {:>12} {:>10} {:>10}",
        "service time (managed)", "class", "timed", "p50", "p99"
    );
    for row in rows {
        let Ok(histogram) = Histogram::from_counts(&row.counts) else {
            continue;
        };
        let quantile = |q| histogram.quantile(q).map_or("-".into(), seconds);
        let _ = writeln!(
            out,
            "  {:<40} {:<9} {:>12} {:>10} {:>10}",
            row.mount,
            row.class.name(),
            histogram.total(),
            quantile(0.5),
            quantile(0.99)
        );
    }
}

/// A duration for a table: three significant digits in s, ms or µs.
fn seconds(value: f64) -> String {
    let (scaled, unit) = match value {
        v if v >= 1.0 => (v, "s"),
        v if v >= 1e-3 => (v * 1e3, "ms"),
        v => (v * 1e6, "µs"),
    };
    let decimals = if scaled >= 100.0 {
        0
    } else if scaled >= 10.0 {
        1
    } else {
        2
    };
    format!("{scaled:.decimals$} {unit}")
}

/// Writes the job-total channel table (nothing when there are no channels).
pub fn write_channel_totals(out: &mut String, channels: &[ChannelTotal]) {
    if channels.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  {:<40} {:>8} {:>9} {:>12} {:>16}",
        "channel", "limit of", "processes", "admitted", "tokens"
    );
    for channel in channels {
        let _ = writeln!(
            out,
            "  {:<40} {:>8} {:>9} {:>12} {:>16}",
            channel.spec.to_string(),
            channel.binds.name(),
            channel.processes,
            channel.admitted,
            channel.tokens
        );
    }
}

/// Writes the per-operation table.
pub fn write_ops(out: &mut String, ops: &[OpStats]) {
    let _ = writeln!(
        out,
        "  {:<12} {:>12} {:>12} {:>12} {:>8} {:>15} {:>10}",
        "operation", "calls", "managed", "passthrough", "errors", "bytes (managed)", "wait (s)"
    );
    for row in ops {
        let _ = writeln!(
            out,
            "  {:<12} {:>12} {:>12} {:>12} {:>8} {:>15} {:>10.3}",
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
        "  {:<40} {:>8} {:>12} {:>16}",
        "channel", "limit of", "admitted", "tokens"
    );
    for channel in channels {
        let _ = writeln!(
            out,
            "  {:<40} {:>8} {:>12} {:>16}",
            channel.spec.to_string(),
            channel.binds.name(),
            channel.admitted,
            channel.tokens
        );
    }
}

/// The statistics file a process writes (`PADLL_STATS`): `%p` becomes its pid, `%j` its
/// job id, `%h` its host name.
pub fn expand_path(path: &str, identity: &Identity) -> String {
    path.replace("%p", &identity.pid.to_string())
        .replace("%j", &identity.job_id)
        .replace("%h", &identity.hostname)
}

/// First line of every table block [`table`] writes.
const TABLE_HEADING: &str = "padll statistics:";

/// Parses a JSON-lines statistics file; errors name the line, and say whether the text
/// is no statistics file at all (its first line is no report), the table format (what
/// a statistics file whose name does not end in `.json` gets) or a damaged one.
pub fn parse(text: &str) -> Result<Vec<Report>, ReportError> {
    let mut reports = Vec::new();
    let lines = text.lines().enumerate().map(|(i, line)| (i + 1, line));
    for (line, content) in lines.filter(|(_, content)| !content.trim().is_empty()) {
        if content.starts_with(TABLE_HEADING) {
            return Err(ReportError::TableFormat { line });
        }
        match serde_json::from_str::<Report>(content) {
            Ok(report) => {
                if let Some(row) = report.latency.iter().find(|r| r.counts.len() > BUCKETS) {
                    return Err(ReportError::Json {
                        line,
                        error: format!(
                            "the service times of {} ({}) have {} buckets (the layout has {BUCKETS})",
                            row.mount,
                            row.class,
                            row.counts.len()
                        ),
                    });
                }
                reports.push(report)
            }
            Err(error) if reports.is_empty() => {
                return Err(ReportError::NotReports {
                    line,
                    error: error.to_string(),
                })
            }
            Err(error) => {
                return Err(ReportError::Json {
                    line,
                    error: error.to_string(),
                })
            }
        }
    }
    Ok(reports)
}

/// A statistics file [`parse`] refused, naming the line (1-based).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The table format where JSON lines were expected.
    #[error("holds statistics in the table format (line {line}), not JSON lines: only a statistics file whose name ends in .json is written as JSON (e.g. --stats job.json)")]
    TableFormat {
        /// The table's heading line.
        line: usize,
    },
    /// The first line is no report: not a statistics file (serde's reason).
    #[error("is not a statistics file: line {line} is not a process' report, as --stats FILE.json writes ({error})")]
    NotReports {
        /// The line.
        line: usize,
        /// Why.
        error: String,
    },
    /// A line after reports that is no report: a damaged file (serde's reason).
    #[error("line {line}: {error}")]
    Json {
        /// The line.
        line: usize,
        /// Why.
        error: String,
    },
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
            latency: vec![],
        };
        let line = serde_json::to_string(&report).unwrap();
        let parsed = parse(&format!("{line}\n{line}\n")).unwrap();
        assert_eq!(parsed, vec![report.clone(), report]);
        assert_eq!(total(&parsed)[0].calls, 6);
        let text = table(&parsed);
        assert!(text.contains("job 7") && text.contains("open"), "{text}");
        let bad = parse(&format!("{line}\n{{bad")).unwrap_err();
        assert!(matches!(bad, ReportError::Json { line: 2, .. }), "{bad:?}");
        assert!(bad.to_string().starts_with("line 2: "), "{bad}");
        for not_reports in ["\nhello world", "\n{\"program\": 1}", "[1, 2]"] {
            let error = parse(not_reports).unwrap_err();
            assert!(
                matches!(error, ReportError::NotReports { line, .. } if line == not_reports.lines().count()),
                "{not_reports:?}: {error:?}"
            );
            assert!(
                error
                    .to_string()
                    .starts_with("is not a statistics file: line "),
                "{error}"
            );
        }
        assert_eq!(parse(" \n\n"), Ok(vec![]));
        let err = parse(&text).unwrap_err();
        assert_eq!(err, ReportError::TableFormat { line: 1 });
        let err = err.to_string();
        assert!(
            err.contains("table format") && err.contains(".json"),
            "{err}"
        );
    }

    #[test]
    fn channels_are_summed_per_spec() {
        use crate::channel::{ChannelId, Scope, Unit};
        let spec = |rate| ChannelSpec {
            mount: Some("/scratch".into()),
            scope: Scope::All,
            rate,
            unit: Unit::Requests,
            burst: 1,
            costs: Default::default(),
        };
        let channel = |rate, admitted| ChannelInfo {
            id: ChannelId(0),
            spec: spec(rate),
            admitted,
            tokens: admitted,
            binds: LimitScope::Job,
        };
        let process = |channels| Report {
            program: "p".into(),
            identity: Identity::default(),
            ops: vec![],
            channels,
            latency: vec![],
        };
        let own = ChannelInfo {
            binds: LimitScope::Process,
            ..channel(100, 3)
        };
        let reports = [
            process(vec![channel(100, 5)]),
            process(vec![channel(100, 7), channel(200, 1)]),
            process(vec![own]),
        ];
        let totals = channel_totals(&reports);
        assert_eq!(
            totals.len(),
            3,
            "summed by spec and by whom the limit bound"
        );
        assert_eq!(
            (totals[0].processes, totals[0].admitted, totals[0].tokens),
            (2, 12, 12)
        );
        assert_eq!((totals[1].spec.rate, totals[1].processes), (200, 1));
        assert_eq!(
            (totals[2].binds, totals[2].admitted),
            (LimitScope::Process, 3)
        );
        let mut out = String::new();
        write_channel_totals(&mut out, &totals);
        let row = out.lines().nth(1).unwrap();
        assert!(
            row.contains("/scratch:all=100/s") && row.contains(" job "),
            "{out}"
        );
        assert!(out.lines().nth(3).unwrap().contains(" process "), "{out}");
    }

    #[test]
    fn sums_of_huge_counters_saturate() {
        use crate::channel::{ChannelId, Scope, Unit};
        let max = u64::MAX;
        let report = Report {
            program: "p".into(),
            identity: Identity::default(),
            ops: vec![OpStats {
                op: "open".into(),
                calls: max,
                managed: max,
                passthrough: max,
                errors: max,
                bytes: max,
                wait_ns: max,
            }],
            channels: vec![ChannelInfo {
                id: ChannelId(0),
                spec: ChannelSpec {
                    mount: None,
                    scope: Scope::All,
                    rate: 1,
                    unit: Unit::Requests,
                    burst: 1,
                    costs: Default::default(),
                },
                admitted: max,
                tokens: max,
                binds: LimitScope::Job,
            }],
            latency: vec![],
        };
        let reports = [report.clone(), report];
        let ops = &total(&reports)[0];
        assert_eq!(
            [
                ops.calls,
                ops.managed,
                ops.passthrough,
                ops.errors,
                ops.bytes,
                ops.wait_ns
            ],
            [max; 6]
        );
        let channels = &channel_totals(&reports)[0];
        assert_eq!((channels.admitted, channels.tokens), (max, max));
    }

    #[test]
    fn service_times_are_summed_per_mountpoint_and_class() {
        use crate::latency::bucket_of;
        use crate::ops::Class;
        let row = |mount: &str, class, ns: u64, calls: u64| {
            let mut counts = vec![0; bucket_of(ns) + 1];
            counts[bucket_of(ns)] = calls;
            LatencyRow {
                mount: mount.into(),
                class,
                counts,
            }
        };
        let process = |latency| Report {
            program: "p".into(),
            identity: Identity::default(),
            ops: vec![],
            channels: vec![],
            latency,
        };
        let reports = [
            process(vec![
                row("/scratch", Class::Metadata, 100_000, 90),
                row("/scratch", Class::Data, 2_000_000, 5),
            ]),
            process(vec![row("/scratch", Class::Metadata, 50_000_000, 10)]),
        ];
        let totals = latency_totals(&reports);
        assert_eq!(totals.len(), 2);
        assert_eq!(totals[0].counts.iter().sum::<u64>(), 100);
        let mut out = String::new();
        write_latency(&mut out, &totals);
        let metadata = out.lines().nth(1).unwrap();
        // p50 in the 100 µs bucket, p99 in the 50 ms one.
        assert!(
            metadata.contains("/scratch")
                && metadata.contains(" metadata ")
                && metadata.contains(" 100 "),
            "{out}"
        );
        assert!(
            metadata.contains(" µs ") && metadata.ends_with(" ms"),
            "{out}"
        );
        // Old files have no service times; a row with too many buckets is refused.
        let mut old: serde_json::Value = serde_json::to_value(&reports[0]).unwrap();
        old.as_object_mut().unwrap().remove("latency");
        assert_eq!(parse(&old.to_string()).unwrap()[0].latency, vec![]);
        let mut bad = reports[1].clone();
        bad.latency[0].counts = vec![1; BUCKETS + 1];
        let error = parse(&serde_json::to_string(&bad).unwrap()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "line 1: the service times of /scratch (metadata) have 49 buckets (the layout has 48)"
        );
    }
}
