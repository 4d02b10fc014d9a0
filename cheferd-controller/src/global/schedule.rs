//! Report slots and the collect step: each node pushes its usage a lead before each
//! tick (told in a `Schedule`); a cycle waits, bounded, only for reports due and
//! missing, and re-schedules nodes whose reports miss their slot.

use super::node::{Node, NodeHandle};
use super::{Controller, State};
use crate::proto::{self, global_message, GlobalMessage};
use prost::Message;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::debug;

/// The latest a usage report is scheduled to arrive before the tick it is for.
const MAX_REPORT_LEAD: Duration = Duration::from_millis(100);

/// How long before a tick the usage reports for it are scheduled to arrive: time for
/// them to be received, and no older than needed.
pub(super) fn report_lead(interval: Duration) -> Duration {
    (interval / 4).min(MAX_REPORT_LEAD)
}

/// The average spacing the report slots keep between the nodes' reports at least:
/// receiving one costs the global ≈ 16 µs of CPU (docs/benchmarks.md), so reports
/// that come no closer take at most ≈ 40 % of a core to receive as they come, even
/// with the other core busy.
const REPORT_SPACING: Duration = Duration::from_micros(40);

/// The window the nodes' report slots spread over before the lead, for `nodes` attached
/// and the window `current`ly in force: ⅛ interval, doubled while `nodes` reports in it
/// would come closer than [`REPORT_SPACING`], up to the widest window whose slots stay
/// in slot (half an interval before the tick, [`in_slot`]). At a 1 s interval: 125 ms
/// up to 3 125 nodes, 250 ms, then 400 ms from 6 250 nodes (10 000 reports in 125 ms
/// took more than the whole machine to receive, so cycles waited for them and acks
/// came after the next tick). It shrinks only once twice the nodes would fit in a
/// narrower window, so a node count near a threshold does not re-schedule every node
/// back and forth.
pub(crate) fn spread_window(interval: Duration, nodes: usize, current: Duration) -> Duration {
    let widest = interval / 2 - report_lead(interval);
    let fitting = |nodes: usize| {
        let needed = REPORT_SPACING * nodes.min(u32::MAX as usize) as u32;
        let mut window = interval / 8;
        while window < needed && window < widest {
            window *= 2;
        }
        window.min(widest)
    };
    let grown = fitting(nodes);
    let shrunk = fitting(nodes.saturating_mul(2));
    if grown > current {
        grown
    } else if shrunk < current {
        shrunk
    } else {
        current
    }
}

/// How much earlier than [`report_lead`] the node of `session` reports: its place in
/// the spread `window`. With one slot for all, 10 000 reports arrived in one burst that
/// the global took longer than the lead to receive, so every cycle waited ≈ 120 ms for
/// them; spread over the window, they are received as they come, before the tick.
pub(super) fn report_spread(window: Duration, session: u64) -> Duration {
    // Sessions are consecutive: the golden ratio's multiples spread any run of them
    // evenly over [0, 1).
    let place = (session.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as f64 / (1u64 << 53) as f64;
    window.mul_f64(place)
}

/// The control loop's ticks, as far as report slots need them.
#[derive(Clone, Copy)]
pub(super) struct Ticks {
    interval: Duration,
    /// The window report slots spread over ([`spread_window`]).
    spread: Duration,
    /// The last cycle run, and the next tick (`None` before the first cycle).
    cycle: u64,
    next_tick: Option<Instant>,
}

impl Ticks {
    pub(super) fn of(state: &State) -> Ticks {
        Ticks {
            interval: Duration::from_millis(state.config.interval_ms),
            spread: state.spread,
            cycle: state.cycle,
            next_tick: state.next_tick,
        }
    }

    /// The first report slot (a lead and its spread before a tick) that the node of
    /// `session` told now can still make: the cycle of that tick and the time until
    /// the slot.
    pub(super) fn next_slot(self, now: Instant, session: u64) -> (u64, Duration) {
        let interval = self.interval;
        let lead = report_lead(interval) + report_spread(self.spread, session);
        let Some(mut tick) = self.next_tick else {
            // No cycle has run: the first one is about to, unscheduled; report for the
            // one after it (re-scheduled onto its slot after the first cycles if early).
            return (self.cycle + 2, interval - lead);
        };
        let mut cycle = self.cycle + 1;
        // Half a lead for the schedule to reach the node and the report to come back.
        while tick < now + lead + lead / 2 {
            tick += interval;
            cycle += 1;
        }
        (cycle, tick - lead - now)
    }
}

/// Tells a node when to report, starting with `cycle`'s report `report_in` from `now`.
pub(super) fn schedule(
    node: &mut Node,
    cycle: u64,
    now: Instant,
    report_in: Duration,
    interval_ms: u64,
) {
    node.due = cycle;
    node.report_at = Some(now + report_in);
    let schedule = GlobalMessage {
        body: Some(global_message::Body::Schedule(proto::Schedule {
            cycle,
            report_in_ms: report_in.as_millis() as u64,
            interval_ms,
        })),
    };
    node.bytes_out += schedule.encoded_len() as u64;
    let _ = node.outbox.send(Ok(schedule));
}

/// Marks which attached nodes' reports `cycle` waits for.
pub(super) fn start_collect(state: &mut State, cycle: u64) {
    let mut awaiting = 0;
    for node in state.nodes.values_mut().filter(|n| !n.detached) {
        // A node that missed its last report (one that never reports, say) is
        // not waited for again until it reports for a cycle not yet collected
        // (`registry`): it cannot stall every cycle.
        node.pending = node.due <= cycle && node.reported < cycle && !node.missed;
        awaiting += node.pending as usize;
    }
    state.collecting = Some(cycle);
    state.awaiting = awaiting;
}

/// Counts an awaited report (once per node and cycle).
pub(super) fn answered(state: &mut State, replies: &Notify) {
    state.awaiting = state.awaiting.saturating_sub(1);
    if state.awaiting == 0 {
        replies.notify_waiters();
    }
}

impl Controller {
    /// `schedule` as it leaves on a node's `stream`: how long to wait
    /// counted from now, not from when it was queued. Re-spreading 10 000 nodes queued
    /// 10 000 `Schedule`s at once, which took ≈ 150 ms to go out; counted from the
    /// queueing, each node would have kept its message's wait in that queue as a lag of
    /// its slot, cycle after cycle (its reports still came before the tick, so nothing
    /// re-scheduled them), and the last ones came at the tick.
    pub(super) fn as_sent(&self, stream: NodeHandle, schedule: &mut proto::Schedule) {
        let state = self.lock();
        let Some(node) = state.nodes.get(stream) else {
            return;
        };
        // An older `Schedule` still queued keeps its own wait (the latest one overrides it).
        if let Some(at) = node.report_at.filter(|_| node.due == schedule.cycle) {
            schedule.report_in_ms = at.saturating_duration_since(Instant::now()).as_millis() as u64;
        }
    }

    /// Waits until every awaited report arrived, or the deadline.
    pub(super) async fn wait_for_replies(&self, deadline: Instant) {
        loop {
            let notified = self.replies.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().awaiting == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}

/// Fits the report slots' window to the nodes attached now ([`spread_window`]); when it
/// changes, every attached node is told its slot in the new one, from `now`.
pub(super) fn adapt_spread(state: &mut State, now: Instant) {
    let interval_ms = state.config.interval_ms;
    let attached = state.nodes.values().filter(|n| !n.detached).count();
    let window = spread_window(Duration::from_millis(interval_ms), attached, state.spread);
    if window == state.spread {
        return;
    }
    debug!(
        nodes = attached,
        window_ms = window.as_millis() as u64,
        "report slots re-spread"
    );
    state.spread = window;
    let ticks = Ticks::of(state);
    for node in state.nodes.values_mut().filter(|n| !n.detached) {
        let (next, report_in) = ticks.next_slot(now, node.slot_session());
        schedule(node, next, now, report_in, interval_ms);
    }
}

/// Whether `node`'s report for the cycle of `tick` came in its slot: at most half a lead
/// after the time it was given (a later one eats into the time the global has to receive
/// the reports before the tick; a `Schedule` delayed on its way leaves such a lag for
/// good), and at most half an interval before the tick (older usage would be stale).
fn in_slot(node: &Node, cycle: u64, tick: Instant, ticks: Ticks) -> bool {
    let lead = report_lead(ticks.interval);
    let slot = tick - lead - report_spread(ticks.spread, node.slot_session());
    node.reported >= cycle
        && node
            .reported_at
            .is_some_and(|at| at <= slot + lead / 2 && tick - at <= ticks.interval / 2)
}

/// Re-schedules, from `now`, the nodes whose report for `cycle` (ticking at `tick`)
/// missed its slot: it came more than half a lead late (after the tick, the cycle waited
/// for it), not at all, or more than half an interval early. Clocks of different machines drift, and a node's
/// first slot may be a guess.
pub(super) fn reschedule_off_slot(state: &mut State, cycle: u64, tick: Instant, now: Instant) {
    let interval_ms = state.config.interval_ms;
    let ticks = Ticks::of(state);
    for node in state.nodes.values_mut() {
        if node.detached || node.due > cycle {
            continue;
        }
        node.missed = node.reported < cycle;
        if !in_slot(node, cycle, tick, ticks) {
            debug!(node = %padll_wire::control::short(&node.name), cycle, "usage report off its slot; re-scheduled");
            let (next, report_in) = ticks.next_slot(now, node.slot_session());
            schedule(node, next, now, report_in, interval_ms);
        }
        node.pending = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GlobalConfig;

    #[test]
    fn reports_are_scheduled_a_lead_before_a_tick_they_can_make() {
        let config = GlobalConfig {
            interval_ms: 1000,
            ..GlobalConfig::default()
        };
        let controller = Controller::new(config).unwrap();
        let mut state = controller.lock();
        let now = Instant::now();
        let ms = Duration::from_millis;
        // Session 0's spread is none. No cycle yet: the report for the one after the
        // first, an interval less a lead from now.
        assert_eq!(Ticks::of(&state).next_slot(now, 0), (2, ms(900)));
        state.cycle = 7;
        state.next_tick = Some(now + ms(500));
        assert_eq!(Ticks::of(&state).next_slot(now, 0), (8, ms(400)));
        // Another session reports its spread earlier: its place in the window of a few
        // nodes, ⅛ interval.
        let spread = report_spread(ms(125), 5);
        assert!(spread > Duration::ZERO);
        assert_eq!(Ticks::of(&state).next_slot(now, 5), (8, ms(400) - spread));
        // The next tick's slot is too close to make: the following tick's.
        state.next_tick = Some(now + ms(120));
        assert_eq!(Ticks::of(&state).next_slot(now, 0), (9, ms(1020)));
        assert_eq!(report_lead(ms(200)), ms(50));
    }

    #[test]
    fn consecutive_sessions_spread_their_reports_evenly_over_the_window() {
        let window = Duration::from_millis(400);
        let mut tenths = [0; 10];
        for session in 1..=1000 {
            let spread = report_spread(window, session);
            assert!(spread < window);
            tenths[(spread.as_secs_f64() / 0.04) as usize] += 1;
        }
        assert!(
            tenths.iter().all(|&n| (90..=110).contains(&n)),
            "{tenths:?}"
        );
    }

    #[test]
    fn the_window_widens_with_the_nodes_up_to_what_stays_in_slot_and_narrows_late() {
        let ms = Duration::from_millis;
        let second = ms(1000);
        let window = |nodes, current| spread_window(second, nodes, current);
        // ⅛ interval while 40 µs apart fit in it, then doubled, at most half an interval
        // less the lead.
        assert_eq!(window(0, Duration::ZERO), ms(125));
        assert_eq!(window(3_125, ms(125)), ms(125));
        assert_eq!(window(3_126, ms(125)), ms(250));
        assert_eq!(window(6_250, ms(250)), ms(250));
        assert_eq!(window(6_251, ms(250)), ms(400));
        assert_eq!(window(100_000, ms(400)), ms(400));
        // Narrower only once twice the nodes fit the narrower one.
        assert_eq!(window(5_000, ms(400)), ms(400));
        assert_eq!(window(3_125, ms(400)), ms(250));
        assert_eq!(window(1_000, ms(400)), ms(125));
        // At the default 200 ms interval the widest is 50 ms (100 ms less a 50 ms lead).
        assert_eq!(spread_window(ms(200), 10_000, ms(25)), ms(50));
        for nodes in [0, 1, 700, 5_000, 20_000] {
            for interval in [ms(10), ms(200), second, ms(60_000)] {
                let lead_and_window =
                    report_lead(interval) + spread_window(interval, nodes, interval);
                assert!(
                    lead_and_window <= interval / 2,
                    "{nodes} nodes at {interval:?}"
                );
            }
        }
    }
}
