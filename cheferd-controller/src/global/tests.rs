//! The registry, report slots, the enforce step and administrative changes driven
//! directly: streams are outboxes read in the test, time is tokio's clock, paused and
//! advanced by the test (no processes, no network).

use super::node::{NodeHandle, Outbox};
use super::*;
use crate::config::{RateOfError, ResourceConfig};
use crate::outbox;
use crate::plan::JobShare;
use crate::proto::{self, global_message, local_message, GlobalMessage, LocalMessage};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use tokio_stream::Stream;

type Inbox = outbox::Receiver<Result<GlobalMessage, tonic::Status>>;

pub(super) fn controller() -> Arc<Controller> {
    controller_with("uniform")
}

/// A controller of `/scratch:metadata` (1 000 ops/s) under `policy`.
fn controller_with(policy: &str) -> Arc<Controller> {
    let resource = Resource::parse("/scratch:metadata").unwrap();
    Controller::new(GlobalConfig {
        resources: vec![ResourceConfig {
            max_rate: resource.own_tokens(1000),
            resource,
            policy: policy.into(),
            auto: None,
            weights: Default::default(),
        }],
        ..GlobalConfig::default()
    })
    .unwrap()
}

/// A node's stream: its handle and what the controller queues to it.
fn attach(controller: &Controller, node: &str) -> (NodeHandle, Inbox) {
    let (outbox, inbox) = outbox::channel();
    (
        controller
            .attach_node(node, "10.0.0.1:4000", Outbox::Direct(outbox))
            .unwrap(),
        inbox,
    )
}

fn send(controller: &Controller, node: &str, session: NodeHandle, body: local_message::Body) {
    controller.handle(node, session, LocalMessage { body: Some(body) });
}

fn join(
    controller: &Controller,
    node: &str,
    session: NodeHandle,
    stage_id: u64,
    pid: u32,
    job: &str,
) {
    join_as(controller, node, session, stage_id, pid, job, false);
}

/// [`join`], or the stage announced as its local controller's stream (re)started.
fn join_as(
    controller: &Controller,
    node: &str,
    session: NodeHandle,
    stage_id: u64,
    pid: u32,
    job: &str,
    announced: bool,
) {
    let stage = proto::Stage {
        stage_id,
        job_id: job.into(),
        job_size: 1,
        uid: 1000,
        gid: 1000,
        pid,
        mountpoints: vec!["/scratch".into()],
        ..proto::Stage::default()
    };
    send(
        controller,
        node,
        session,
        local_message::Body::StageJoined(proto::StageJoined {
            stage: Some(stage),
            announced,
        }),
    );
}

/// Reports usage for `cycle`: ops/s of `/scratch:metadata` per stage.
fn report(
    controller: &Controller,
    node: &str,
    session: NodeHandle,
    cycle: u64,
    rates: &[(u64, f64)],
) {
    let with_latency: Vec<_> = rates.iter().map(|&(s, r)| (s, r, Vec::new())).collect();
    report_timed(controller, node, session, cycle, &with_latency);
}

/// [`report`] with each stage's service times (counts per bucket).
fn report_timed(
    controller: &Controller,
    node: &str,
    session: NodeHandle,
    cycle: u64,
    rates: &[(u64, f64, Vec<u64>)],
) {
    let stages = rates
        .iter()
        .map(|(stage_id, rate, latency)| proto::StageUsage {
            stage_id: *stage_id,
            resources: vec![proto::ResourceUsage {
                resource: 0, // /scratch:metadata
                rate: *rate,
                limit: 0,
                latency: latency.clone(),
            }],
        })
        .collect();
    send(
        controller,
        node,
        session,
        local_message::Body::Usage(proto::Usage {
            cycle,
            stages,
            applied: 0,
        }),
    );
}

fn ack(controller: &Controller, node: &str, session: NodeHandle, cycle: u64) {
    send(
        controller,
        node,
        session,
        local_message::Body::Applied(proto::Applied { cycle, stages: 0 }),
    );
}

struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// The messages queued to a node since the last call.
fn queued(inbox: &mut Inbox) -> Vec<global_message::Body> {
    let waker = Waker::from(Arc::new(Noop));
    let mut context = Context::from_waker(&waker);
    let mut found = Vec::new();
    while let Poll::Ready(Some(message)) = Pin::new(&mut *inbox).poll_next(&mut context) {
        found.extend(message.unwrap().body);
    }
    found
}

/// The `Enforce`s queued to a node since the last call: (cycle, [(stage, rate)]).
fn enforced(inbox: &mut Inbox) -> Vec<(u64, Vec<(u64, u64)>)> {
    let enforces = queued(inbox).into_iter().filter_map(|body| match body {
        global_message::Body::Enforce(enforce) => Some(enforce),
        _ => None,
    });
    enforces
        .map(|enforce| {
            let stages = enforce
                .stages
                .iter()
                .map(|s| (s.stage_id, s.rules.first().map_or(0, |r| r.rate)))
                .collect();
            (enforce.cycle, stages)
        })
        .collect()
}

/// The `Schedule`s queued to a node since the last call: (first cycle to report for,
/// ms until its report is due).
fn schedules(inbox: &mut Inbox) -> Vec<(u64, u64)> {
    queued(inbox)
        .into_iter()
        .filter_map(|body| match body {
            global_message::Body::Schedule(s) => Some((s.cycle, s.report_in_ms)),
            _ => None,
        })
        .collect()
}

/// The `Schedule` of a node's report for `cycle`, due `report_in` from now.
fn slot(cycle: u64, report_in: Duration) -> (u64, u64) {
    (cycle, report_in.as_millis() as u64)
}

/// How long before a tick the node of `stream` reports (a few nodes attached: their
/// reports spread over ⅛ interval).
fn lead(interval: Duration, stream: NodeHandle) -> Duration {
    schedule::report_lead(interval) + schedule::report_spread(interval / 8, stream.session)
}

/// Moves the paused clock on to `at`.
async fn advance_to(at: Instant) {
    tokio::time::advance(at - Instant::now()).await;
}

const MS: Duration = Duration::from_millis(1);

fn assigned(controller: &Controller, job: &str) -> f64 {
    let snapshot = controller.snapshot();
    snapshot
        .shares
        .iter()
        .find(|s| s.job == job)
        .map(|s| s.assigned)
        .unwrap_or_else(|| panic!("no share of {job}: {:?}", snapshot.shares))
}

fn node(controller: &Controller, name: &str) -> NodeSnapshot {
    let snapshot = controller.snapshot();
    snapshot
        .nodes
        .into_iter()
        .find(|n| n.node == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

/// Node A's stage, orphaned by `orphan` (A's stream ended, or was replaced), keeps its
/// job's share until exactly the grace ends; then B's job has it all.
async fn orphan_released_at_the_grace(
    orphan: impl FnOnce(&Controller, NodeHandle),
) -> Arc<Controller> {
    let controller = controller();
    let (a, _inbox_a) = attach(&controller, "a");
    let (b, _inbox_b) = attach(&controller, "b");
    join(&controller, "a", a, 1, 100, "A");
    join(&controller, "b", b, 1, 200, "B");
    controller.cycle().await;
    assert_eq!(assigned(&controller, "B"), 500.0);

    orphan(&controller, a);
    let orphaned_at = Instant::now();
    // A tick before the grace ends, A's stage still runs on its last rules: B cannot
    // have its share.
    advance_to(orphaned_at + ORPHAN_GRACE - MS).await;
    report(&controller, "b", b, 2, &[(1, 10.0)]);
    controller.cycle().await;
    assert_eq!(assigned(&controller, "B"), 500.0);
    assert_eq!(node(&controller, "a").orphans, 1);

    // At the grace, the orphan is presumed gone.
    advance_to(orphaned_at + ORPHAN_GRACE).await;
    report(&controller, "b", b, 3, &[(1, 10.0)]);
    controller.cycle().await;
    assert_eq!(assigned(&controller, "B"), 1000.0);
    controller
}

#[tokio::test(start_paused = true)]
async fn orphans_keep_their_share_until_exactly_the_grace_ends() {
    let controller = orphan_released_at_the_grace(|controller, a| {
        controller.detach_node("a", a);
        let detached = node(controller, "a");
        assert_eq!(
            (detached.attached, detached.stages, detached.orphans),
            (false, 0, 1)
        );
    })
    .await;
    // A detached node is forgotten with its last orphan.
    assert!(controller.snapshot().nodes.iter().all(|n| n.node != "a"));
}

/// A node whose stream is replaced (re-attached while the old one seemed alive) leaves
/// its stages as orphans too, released at the grace like a detached node's.
#[tokio::test(start_paused = true)]
async fn orphans_of_a_replaced_stream_are_released_at_the_grace() {
    let controller = orphan_released_at_the_grace(|controller, _| {
        attach(controller, "a");
    })
    .await;
    assert_eq!(node(&controller, "a").orphans, 0);
}

/// Report slots: a node is told when to report; a report at most half a lead after its
/// slot and at most half an interval before its tick keeps the slot, any other is
/// re-scheduled from when the cycle saw it.
#[tokio::test(start_paused = true)]
async fn a_report_within_half_a_lead_of_its_slot_keeps_it_and_a_later_one_is_re_scheduled() {
    let controller = controller();
    let interval = controller.interval();
    let (a, mut inbox) = attach(&controller, "a");
    // No cycle has run: the report for the second, an interval less its lead from now.
    let lead = lead(interval, a);
    assert_eq!(schedules(&mut inbox), vec![slot(2, interval - lead)]);
    let first = Instant::now();
    controller.cycle().await;

    // Cycle 2's report comes half a lead after its slot: in it.
    let half_lead = schedule::report_lead(interval) / 2;
    advance_to(first + interval - lead + half_lead).await;
    report(&controller, "a", a, 2, &[]);
    advance_to(first + interval).await;
    controller.cycle().await;
    assert_eq!(schedules(&mut inbox), vec![]);

    // Cycle 3's comes a millisecond later than that, still before its tick: its slot
    // from the tick.
    let tick = first + 2 * interval;
    advance_to(tick - lead + half_lead + MS).await;
    report(&controller, "a", a, 3, &[]);
    advance_to(tick).await;
    controller.cycle().await;
    assert_eq!(schedules(&mut inbox), vec![slot(4, interval - lead)]);

    // Cycle 4's comes a millisecond after its tick, while the cycle waits for it.
    let tick = first + 3 * interval;
    advance_to(tick).await;
    let late = tokio::spawn({
        let controller = controller.clone();
        async move {
            tokio::time::sleep(MS).await;
            report(&controller, "a", a, 4, &[]);
        }
    });
    controller.cycle().await;
    late.await.unwrap();
    assert_eq!(Instant::now(), tick + MS, "the cycle waited for it");
    assert_eq!(
        schedules(&mut inbox),
        vec![slot(5, interval - lead - MS)],
        "the next tick's slot, from when it came"
    );
}

/// Ticks stay on their grid: a wake-up that comes late moves neither the next tick nor
/// what the cycle judges reports by. (Counted from each wake-up, the ticks drifted by
/// its lateness; at 10 000 nodes thousands of reports then fell off their slots and
/// were re-scheduled.)
#[tokio::test(start_paused = true)]
async fn a_cycle_woken_late_keeps_the_ticks_and_the_report_slots_on_their_grid() {
    let controller = controller();
    let interval = controller.interval();
    let (a, mut inbox) = attach(&controller, "a");
    let lead = lead(interval, a);
    schedules(&mut inbox);
    let first = Instant::now();
    controller.cycle_at(first).await;

    // Cycle 2's report comes in its slot; the wake-up for its tick comes half an
    // interval late (counted from then, the report would be more than half an interval
    // old, and re-scheduled).
    let tick = controller.next_tick(first);
    assert_eq!(tick, first + interval);
    advance_to(tick - lead).await;
    report(&controller, "a", a, 2, &[]);
    advance_to(tick + interval / 2).await;
    controller.cycle_at(tick).await;
    assert_eq!(schedules(&mut inbox), vec![]);

    // Cycle 3's report comes in its slot on the grid, as does the tick.
    let tick = controller.next_tick(tick);
    assert_eq!(tick, first + 2 * interval);
    advance_to(tick - lead).await;
    report(&controller, "a", a, 3, &[]);
    advance_to(tick).await;
    controller.cycle_at(tick).await;
    assert_eq!(schedules(&mut inbox), vec![]);

    // After a cycle that overran its interval, the next one runs at once.
    advance_to(tick + interval + MS).await;
    assert_eq!(controller.next_tick(tick), Instant::now());
}

#[tokio::test(start_paused = true)]
async fn a_report_more_than_half_an_interval_before_its_tick_is_re_scheduled() {
    let controller = controller();
    let interval = controller.interval();
    let (a, mut inbox) = attach(&controller, "a");
    schedules(&mut inbox);
    let first = Instant::now();
    controller.cycle().await;

    // Cycle 2's report comes half an interval before its tick: in its slot.
    advance_to(first + interval / 2).await;
    report(&controller, "a", a, 2, &[]);
    advance_to(first + interval).await;
    controller.cycle().await;
    assert_eq!(schedules(&mut inbox), vec![]);

    // Cycle 3's comes a tick earlier: its usage would be stale.
    advance_to(first + interval + interval / 2 - MS).await;
    report(&controller, "a", a, 3, &[]);
    advance_to(first + 2 * interval).await;
    controller.cycle().await;
    assert_eq!(
        schedules(&mut inbox),
        vec![slot(4, interval - lead(interval, a))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_report_is_waited_for_once_within_the_deadline_then_re_scheduled() {
    let controller = controller();
    let interval = controller.interval();
    let (a, mut inbox) = attach(&controller, "a");
    schedules(&mut inbox);
    let first = Instant::now();
    controller.cycle().await;

    // No report for cycle 2: it waits half an interval (500 ms at most) for it.
    let tick = first + interval;
    advance_to(tick).await;
    controller.cycle().await;
    let waited = interval / 2;
    assert_eq!(Instant::now(), tick + waited);
    let lead = lead(interval, a);
    assert_eq!(
        schedules(&mut inbox),
        vec![slot(3, interval - waited - lead)]
    );

    // A node that missed its report does not stall the next cycle.
    let tick = tick + interval;
    advance_to(tick).await;
    controller.cycle().await;
    assert_eq!(Instant::now(), tick, "the cycle did not wait");
    assert_eq!(schedules(&mut inbox), vec![slot(4, interval - lead)]);

    // Reporting again, it is waited for again.
    advance_to(tick + interval - lead).await;
    report(&controller, "a", a, 4, &[]);
    advance_to(tick + interval).await;
    controller.cycle().await;
    assert_eq!(schedules(&mut inbox), vec![]);
    advance_to(tick + 2 * interval).await;
    controller.cycle().await;
    assert_eq!(Instant::now(), tick + 2 * interval + waited);
}

/// A node that reports, but for a cycle long gone (0, every 100 ms), is not waited for
/// once it missed a report: its reports count for no cycle collected, so they do not
/// clear its miss (each cleared it, and every cycle waited its whole bound for the
/// node); a cycle going backwards does not undo a report that counted.
#[tokio::test(start_paused = true)]
async fn reports_for_a_cycle_gone_do_not_stall_every_cycle() {
    let controller = controller();
    let interval = controller.interval();
    let (a, _inbox) = attach(&controller, "a");
    let first = Instant::now();
    controller.cycle().await;
    let tick = first + interval;
    advance_to(tick).await;
    controller.cycle().await;
    assert_eq!(Instant::now(), tick + interval / 2, "cycle 2 waits once");
    for cycle in 3..8 {
        let tick = first + (cycle - 1) as u32 * interval;
        while Instant::now() + 100 * MS < tick {
            report(&controller, "a", a, 0, &[]);
            tokio::time::advance(100 * MS).await;
        }
        advance_to(tick).await;
        controller.cycle().await;
        assert_eq!(
            Instant::now(),
            tick,
            "cycle {cycle} waited for a stale report"
        );
    }
    report(&controller, "a", a, 8, &[]);
    report(&controller, "a", a, 0, &[]);
    assert_eq!(controller.lock().nodes.iter().next().unwrap().1.reported, 8);
}

/// A job id with control characters (or a line separator) is ignored by the global as
/// a local controller refuses it: it would forge log lines and reach an administrator's
/// terminal (`docs/security.md`, stage fields).
#[tokio::test(start_paused = true)]
async fn a_job_id_with_control_characters_is_ignored_by_the_global() {
    let controller = controller();
    let (a, _inbox) = attach(&controller, "a");
    join(
        &controller,
        "a",
        a,
        1,
        100,
        "x\u{1b}[2J\u{1b}[31mRED\nFAKE LINE",
    );
    join(&controller, "a", a, 2, 200, "x\u{2028}y");
    assert_eq!(node(&controller, "a").stages, 0);
    join(&controller, "a", a, 3, 300, "ok");
    assert_eq!(node(&controller, "a").stages, 1);
}

/// A stage's record keeps of its mountpoints the configured ones only, each once, and a
/// node's stages and orphans together at most `MAX_STAGE_BYTES_PER_NODE` of names and
/// mountpoints: past it a stage is ignored. Bytes come back as stages leave and as
/// orphans re-register or are released.
#[tokio::test(start_paused = true)]
async fn a_node_s_stages_keep_only_used_mountpoints_within_a_byte_budget() {
    let controller = controller();
    let (a, _inbox) = attach(&controller, "a");
    let long = "n".repeat(crate::bounds::MAX_NAME_BYTES);
    let stage = |id: u64| proto::Stage {
        stage_id: id,
        job_id: "J".into(),
        pid: id as u32,
        user: long.clone(),
        account: long.clone(),
        hostname: long.clone(),
        stage_name: long.clone(),
        mountpoints: (0..64)
            .map(|m| match m % 2 {
                0 => "/scratch".into(),
                _ => format!("/{m}-{}", "x".repeat(4000)),
            })
            .collect(),
        ..proto::Stage::default()
    };
    let joined = |id| {
        local_message::Body::StageJoined(proto::StageJoined {
            stage: Some(stage(id)),
            announced: false,
        })
    };
    let bytes = || controller.lock().nodes.iter().next().unwrap().1.stage_bytes;
    for id in 0..4096 {
        send(&controller, "a", a, joined(id));
    }
    let kept = 1 + 4 * long.len() + "/scratch".len();
    let fit = crate::bounds::MAX_STAGE_BYTES_PER_NODE / kept;
    let snapshot = controller.snapshot();
    assert_eq!(snapshot.stages.len(), fit);
    assert!(snapshot
        .stages
        .iter()
        .all(|s| s.mountpoints == ["/scratch"]));
    assert_eq!(bytes(), fit * kept);
    // The same stage again, or an orphan re-registering, takes the place it held.
    send(&controller, "a", a, joined(0));
    let (a, _inbox) = attach(&controller, "a");
    assert_eq!(bytes(), fit * kept);
    send(&controller, "a", a, joined(1));
    assert_eq!((node(&controller, "a").stages, bytes()), (1, fit * kept));
    send(
        &controller,
        "a",
        a,
        local_message::Body::StageLeft(proto::StageLeft { stage_id: 1 }),
    );
    assert_eq!(bytes(), (fit - 1) * kept);
    advance_to(Instant::now() + ORPHAN_GRACE).await;
    controller.cycle().await;
    assert_eq!(bytes(), 0);
    // Two stages of one pid leave one orphan, and its bytes only.
    let (a, _inbox) = attach(&controller, "a");
    join(&controller, "a", a, 1, 100, "J");
    join(&controller, "a", a, 2, 100, "J");
    attach(&controller, "a");
    assert_eq!(node(&controller, "a").orphans, 1);
    assert_eq!(bytes(), "J".len() + "/scratch".len());
}

/// Both jobs of `SCHEDULED` busy: the shares of jobs A and B in a cycle ticking `at`
/// after `started`, their usage reported for it.
async fn busy_cycle_at(
    controller: &Controller,
    session: NodeHandle,
    started: Instant,
    at: Duration,
) -> (f64, f64) {
    advance_to(started + at).await;
    let cycle = controller.snapshot().cycle + 1;
    report(
        controller,
        "n1",
        session,
        cycle,
        &[(1, 1500.0), (2, 1500.0)],
    );
    controller.cycle().await;
    (assigned(controller, "A"), assigned(controller, "B"))
}

/// Job A limited at 15 s, lifted at 25 s (`[[rule]]`s, Cheferd's time-scheduled rules).
const SCHEDULED: &str = r#"interval_ms = 1000
[[resource]]
name = "/scratch:metadata"
max_rate = "2000"
policy = "psfa"
[[job]]
id = "A"
demand = { "/scratch:metadata" = "1000" }
[[job]]
id = "B"
demand = { "/scratch:metadata" = "1000" }
[[rule]]
at = 15
job = "A"
resource = "/scratch:metadata"
limit = "150"
[[rule]]
at = 25
job = "A"
resource = "/scratch:metadata"
limit = "none"
"#;

#[tokio::test(start_paused = true)]
async fn scheduled_rules_apply_at_their_time_and_are_lifted_at_theirs() {
    let config = GlobalConfig::parse(SCHEDULED, &crate::policy::check).unwrap();
    let controller = Controller::new(config).unwrap();
    let started = Instant::now();
    let (n1, _inbox) = attach(&controller, "n1");
    join(&controller, "n1", n1, 1, 101, "A");
    join(&controller, "n1", n1, 2, 102, "B");
    let at = |seconds: u64| Duration::from_secs(seconds);
    let cycle_at = |when| busy_cycle_at(&controller, n1, started, when);

    // Before the rule, PSFA gives both busy jobs their demand.
    assert_eq!(cycle_at(at(15) - MS).await, (1000.0, 1000.0));
    // From its time, A is held at its limit and B gets what A cannot use.
    assert_eq!(cycle_at(at(15)).await, (150.0, 1850.0));
    assert_eq!(controller.snapshot().uptime_s, 15.0);
    assert_eq!(cycle_at(at(25) - MS).await, (150.0, 1850.0));
    // Lifted at its time.
    assert_eq!(cycle_at(at(25)).await, (1000.0, 1000.0));
}

#[tokio::test(start_paused = true)]
async fn the_control_loop_runs_a_cycle_per_interval_and_the_metrics_count_each() {
    let controller = controller();
    let interval = controller.interval();
    let looping = tokio::spawn(controller.clone().run_loop());
    // Cycles tick at 0, 1, …, 10 intervals.
    tokio::time::sleep(interval * 10 + interval / 2).await;
    looping.abort();
    let metrics = controller.metrics();
    assert_eq!(metrics.snapshot.cycle, 11);
    let text = crate::metrics::render(&metrics);
    for line in [
        "cheferd_cycles_total 11",
        "cheferd_cycle_latency_seconds_count 11",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
}

#[tokio::test]
async fn a_report_naming_a_resource_not_configured_is_refused_and_the_next_is_taken() {
    let controller = controller();
    let (session, _inbox) = attach(&controller, "a");
    join(&controller, "a", session, 1, 100, "A");
    report(&controller, "a", session, 1, &[(1, 80.0)]);
    let usage = |controller: &Controller| controller.snapshot().stages[0].usage.clone();
    let before = usage(&controller);
    assert_eq!(before["/scratch:metadata"], 80.0);
    // Index 1 is past the one configured resource; index 0 twice names it twice.
    for resources in [vec![1], vec![0, 1], vec![0, 0], vec![u32::MAX]] {
        let stages = vec![proto::StageUsage {
            stage_id: 1,
            resources: resources
                .into_iter()
                .map(|resource| proto::ResourceUsage {
                    resource,
                    rate: 5.0,
                    ..Default::default()
                })
                .collect(),
        }];
        let body = local_message::Body::Usage(proto::Usage {
            cycle: 2,
            stages,
            applied: 0,
        });
        send(&controller, "a", session, body);
        assert_eq!(usage(&controller), before);
    }
    // The stage keeps its place: its next good report is taken, and it is planned.
    report(&controller, "a", session, 3, &[(1, 40.0)]);
    assert_eq!(usage(&controller)["/scratch:metadata"], 40.0);
    controller.cycle().await;
    assert_eq!(controller.snapshot().shares.len(), 1);
}

#[tokio::test]
async fn an_orphan_that_re_registers_keeps_its_usage_and_is_sent_its_rules_again() {
    let controller = controller();
    let (first, mut inbox) = attach(&controller, "a");
    join(&controller, "a", first, 1, 100, "A");
    // A new job's stage gets a provisional rule at once: 1 % of Max_R.
    assert_eq!(enforced(&mut inbox), vec![(0, vec![(1, 10)])]);
    report(&controller, "a", first, 2, &[(1, 80.0)]);
    controller.cycle().await;
    assert_eq!(enforced(&mut inbox), vec![(1, vec![(1, 1000)])]);

    controller.detach_node("a", first);
    let (second, mut inbox) = attach(&controller, "a");
    assert_eq!(node(&controller, "a").orphans, 1);
    // The same process (pid) under a new stage id: it runs on its last rules, so no
    // provisional rule, and its usage carries over.
    join(&controller, "a", second, 7, 100, "A");
    assert_eq!(enforced(&mut inbox), vec![]);
    report(&controller, "a", second, 2, &[(7, 80.0)]);
    let snapshot = controller.snapshot();
    assert_eq!(snapshot.nodes[0].orphans, 0);
    assert_eq!(snapshot.stages[0].stage_id, 7);
    assert_eq!(snapshot.stages[0].usage["/scratch:metadata"], 80.0);
    // Its rules are sent again although they did not change.
    controller.cycle().await;
    assert_eq!(enforced(&mut inbox), vec![(2, vec![(7, 1000)])]);
}

#[tokio::test]
async fn only_changed_rules_are_sent_and_all_of_them_again_without_an_ack() {
    let controller = controller();
    let (a, mut inbox) = attach(&controller, "a");
    // Job A's two stages split its share by usage; job B's stage has all of B's.
    join(&controller, "a", a, 1, 100, "A");
    join(&controller, "a", a, 2, 101, "A");
    join(&controller, "a", a, 3, 102, "B");
    enforced(&mut inbox);
    let usage = |one: f64| [(1, one), (2, 100.0), (3, 100.0)];
    controller.cycle().await;
    assert_eq!(enforced(&mut inbox)[0].1.len(), 3);
    ack(&controller, "a", a, 1);
    assert!(controller.phases(1)[0].acked.is_some());

    // Nothing changed: nothing is sent.
    report(&controller, "a", a, 2, &usage(100.0));
    controller.cycle().await;
    report(&controller, "a", a, 3, &usage(100.0));
    controller.cycle().await;
    assert_eq!(enforced(&mut inbox), vec![]);
    assert_eq!(controller.phases(1)[0].enforced, 0);

    // A's split moves: only A's stages are sent, B's is not.
    report(&controller, "a", a, 4, &usage(300.0));
    controller.cycle().await;
    let changed = enforced(&mut inbox);
    let stages: Vec<u64> = changed[0].1.iter().map(|&(s, _)| s).collect();
    assert_eq!((changed[0].0, stages), (4, vec![1, 2]));
    assert_eq!(node(&controller, "a").unacked_cycle, Some(4));
    assert_eq!(controller.phases(1)[0].acked, None);

    // Not acknowledged by the next cycle: every stage's rules again.
    report(&controller, "a", a, 5, &usage(300.0));
    controller.cycle().await;
    let resent = enforced(&mut inbox);
    let stages: Vec<u64> = resent[0].1.iter().map(|&(s, _)| s).collect();
    assert_eq!((resent[0].0, stages), (5, vec![1, 2, 3]));
    // Acknowledged in the next usage report.
    send(
        &controller,
        "a",
        a,
        local_message::Body::Usage(proto::Usage {
            cycle: 6,
            stages: Vec::new(),
            applied: 5,
        }),
    );
    assert_eq!(node(&controller, "a").unacked_cycle, None);
}

/// Job A's static limit on `/scratch:metadata`.
fn limit_of_a(limit: &str) -> Change {
    Change::Job {
        job: "A".into(),
        priority: None,
        resource: Some("/scratch:metadata".into()),
        demand: None,
        limit: Some(limit.into()),
    }
}

#[tokio::test]
async fn admin_changes_are_checked_and_applied_whole() {
    let controller = controller();
    let (a, _inbox) = attach(&controller, "a");
    join(&controller, "a", a, 1, 100, "A");
    join(&controller, "a", a, 2, 101, "B");
    let before = controller.config();
    let refused = [
        Change::Policy {
            resource: "/home:metadata".into(),
            policy: "psfa".into(),
        },
        Change::Policy {
            resource: "/scratch:metadata".into(),
            policy: "fastest".into(),
        },
        Change::MaxRate {
            resource: "/scratch:metadata".into(),
            rate: "20GiB/s".into(),
        },
        Change::Job {
            job: "nobody".into(),
            priority: Some(2.0),
            resource: None,
            demand: None,
            limit: None,
        },
        Change::Job {
            job: "A".into(),
            priority: Some(-1.0),
            resource: None,
            demand: None,
            limit: None,
        },
        Change::Job {
            job: "A".into(),
            priority: None,
            resource: None,
            demand: None,
            limit: Some("100".into()),
        },
    ];
    for change in refused {
        assert!(controller.change(change.clone()).is_err(), "{change:?}");
    }
    assert_eq!(controller.config(), before);

    controller
        .change(Change::MaxRate {
            resource: "/scratch:metadata".into(),
            rate: "2k".into(),
        })
        .unwrap();
    controller.change(limit_of_a("300")).unwrap();
    controller.cycle().await;
    assert_eq!(
        (assigned(&controller, "A"), assigned(&controller, "B")),
        (300.0, 1700.0)
    );

    controller.change(limit_of_a("none")).unwrap();
    controller.cycle().await;
    assert_eq!(assigned(&controller, "A"), 1000.0);
    controller
        .change(Change::Policy {
            resource: "/scratch:metadata".into(),
            policy: "priority".into(),
        })
        .unwrap();
    assert_eq!(controller.snapshot().resources[0].policy, "priority");
    assert_eq!(controller.config().resources[0].policy, "priority");
}

/// A job id is echoed quoted with its control characters escaped: a newline in it
/// cannot forge a line of `ctl`'s answer.
#[tokio::test]
async fn admin_answers_escape_the_job_id() {
    let controller = controller();
    let set = |job: &str, priority| Change::Job {
        job: job.into(),
        priority,
        resource: None,
        demand: None,
        limit: None,
    };
    let priority = |job: &str| set(job, Some(2.0));
    assert_eq!(
        controller.restore(priority("A\nB")).unwrap(),
        "job 'A\\nB' updated"
    );
    let refused = controller.change(priority("C\nD")).unwrap_err().to_string();
    assert!(refused.starts_with("unknown job 'C\\nD': "), "{refused}");
    assert!(set("E\nF", None)
        .check()
        .unwrap_err()
        .to_string()
        .starts_with("set-job E\\nF: "));
}

/// A bytes rate never configures the metadata resource, whichever change carries it
/// (`ctl set-max-rate`, `set-job --demand`, `--limit`), made here or replayed from an
/// earlier leader: one line naming the key, the rate and the resource.
#[tokio::test]
async fn no_change_gives_a_bytes_rate_to_an_operations_resource() {
    let controller = controller();
    let (a, _inbox) = attach(&controller, "a");
    join(&controller, "a", a, 1, 100, "A");
    let before = controller.config();
    let demand_of_a = Change::Job {
        job: "A".into(),
        priority: None,
        resource: Some("/scratch:metadata".into()),
        demand: Some("1MiB/s".into()),
        limit: None,
    };
    let max_rate = Change::MaxRate {
        resource: "/scratch:metadata".into(),
        rate: "1MiB/s".into(),
    };
    for (change, key) in [
        (max_rate, "rate"),
        (demand_of_a, "--demand"),
        (limit_of_a("1MiB/s"), "--limit"),
    ] {
        let expected =
            format!("{key}: '1MiB/s' is a rate of bytes, but /scratch:metadata counts operations");
        let checked = change.check().unwrap_err();
        assert!(
            matches!(checked, ChangeError::BadRate(RateOfError::WrongUnit { .. })),
            "{checked:?}"
        );
        assert_eq!(checked.to_string(), expected);
        let refused = controller.change(change.clone()).unwrap_err();
        assert!(
            matches!(refused, ChangeRefused::Invalid(ChangeError::BadRate(_))),
            "{refused:?}"
        );
        assert_eq!(refused.to_string(), expected);
        assert_eq!(
            controller.restore(change).unwrap_err().to_string(),
            expected
        );
    }
    assert_eq!(controller.config(), before);
}

/// A stage joining now gets provisional rules at once; one announced as its local
/// controller's stream (re)started — a new leader's view filling up after a failover —
/// already runs on rules and gets none (a new leader, knowing no orphans, once cut every
/// job to the provisional share until its first cycle).
#[tokio::test]
async fn announced_stages_keep_their_rules_and_joining_ones_get_provisional_ones() {
    let controller = controller();
    let (session, mut inbox) = attach(&controller, "n1");
    join_as(&controller, "n1", session, 1, 101, "job-a", true);
    assert!(
        enforced(&mut inbox).is_empty(),
        "an announced stage was sent rules"
    );
    join(&controller, "n1", session, 2, 102, "job-b");
    let sent = enforced(&mut inbox);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].1[0].0, 2, "{sent:?}");
}

#[tokio::test(start_paused = true)]
async fn service_times_of_every_node_merge_per_resource_and_interval() {
    let controller = controller();
    let (a, _inbox_a) = attach(&controller, "a");
    let (b, _inbox_b) = attach(&controller, "b");
    join(&controller, "a", a, 1, 100, "j1");
    join(&controller, "b", b, 1, 200, "j2");
    let slow = padll_wire::latency::bucket_of(2_000_000); // 2 ms
    let fast = padll_wire::latency::bucket_of(100_000); // 100 µs
    let counts = |bucket: usize, n: u64| {
        let mut counts = vec![0; bucket + 1];
        counts[bucket] = n;
        counts
    };
    report_timed(&controller, "a", a, 1, &[(1, 10.0, counts(fast, 30))]);
    report_timed(&controller, "b", b, 1, &[(1, 10.0, counts(slow, 70))]);
    // A report of more buckets than the layout is refused whole.
    report_timed(&controller, "b", b, 1, &[(1, 10.0, vec![1; 49])]);
    controller.cycle().await;
    let service = controller.snapshot().resources[0].service;
    assert_eq!(service.calls, 100);
    let (p50, p99) = (service.p50_ms.unwrap(), service.p99_ms.unwrap());
    assert!((1.5..3.1).contains(&p50), "{p50}");
    assert!((1.5..3.1).contains(&p99), "{p99}");
    // The next interval starts empty: only what is reported for it counts.
    report_timed(&controller, "a", a, 2, &[(1, 10.0, counts(fast, 5))]);
    controller.cycle().await;
    let service = controller.snapshot().resources[0].service;
    assert_eq!(service.calls, 5);
    assert!(service.p99_ms.unwrap() < 0.2, "{service:?}");
    let metrics = controller.metrics();
    assert_eq!(metrics.service_times[0].total(), 105);
}

/// A controller of one metadata resource whose `Max_R` is `auto` (target p50 1 ms,
/// floor 100, ceiling 10 000).
fn auto_controller() -> Arc<Controller> {
    let text = "[[resource]]\nname = \"/scratch:metadata\"\npolicy = \"uniform\"\n\
                max_rate = \"auto\"\ntarget_p50_ms = 1\nfloor = 100\nceiling = 10000";
    let config = GlobalConfig::parse(text, &crate::policy::check).unwrap();
    Controller::new(config).unwrap()
}

/// Calls so slow (the histogram's last bucket, ≥ 8.6 s) that fewer than 20 complete an
/// interval still bring an auto `Max_R` down from the ceiling to the floor.
#[tokio::test(start_paused = true)]
async fn an_auto_max_rate_falls_when_too_few_calls_complete_an_interval() {
    let controller = auto_controller();
    let (a, _inbox) = attach(&controller, "a");
    join(&controller, "a", a, 1, 100, "j1");
    let mut slow = vec![0; padll_wire::latency::BUCKETS];
    slow[padll_wire::latency::BUCKETS - 1] = 19;
    for cycle in 1..=10 {
        report_timed(&controller, "a", a, cycle, &[(1, 19.0, slow.clone())]);
        controller.cycle().await;
    }
    let resource = &controller.snapshot().resources[0];
    assert_eq!(resource.max_rate, 100.0, "{:?}", resource.service);
}

#[tokio::test(start_paused = true)]
async fn an_auto_max_rate_follows_the_service_times_and_an_administrator_can_fix_it() {
    let controller = auto_controller();
    let (a, _inbox) = attach(&controller, "a");
    join(&controller, "a", a, 1, 100, "j1");
    let max_rate = || controller.snapshot().resources[0].max_rate;
    assert_eq!(max_rate(), 10_000.0, "starts at the ceiling");
    let at = |ns: u64, n: u64| {
        let bucket = padll_wire::latency::bucket_of(ns);
        let mut counts = vec![0; bucket + 1];
        counts[bucket] = n;
        counts
    };
    // Calls take 5 ms against a 1 ms target while the stage uses all of Max_R: it falls,
    // never below the floor.
    let mut last = max_rate();
    for cycle in 1..=12 {
        report_timed(
            &controller,
            "a",
            a,
            cycle,
            &[(1, last, at(5_000_000, 1000))],
        );
        controller.cycle().await;
        let now = max_rate();
        assert!(
            now < last || now == 100.0,
            "cycle {cycle}: {now} after {last}"
        );
        last = now;
    }
    assert!(last < 2_000.0, "{last}");
    let snapshot = controller.snapshot();
    let auto = snapshot.resources[0].auto.unwrap();
    assert_eq!(
        (auto.target_p50_ms, auto.floor, auto.ceiling),
        (Some(1.0), 100.0, 10_000.0)
    );
    // Fast calls again, demand at Max_R: it climbs back.
    for cycle in 13..=30 {
        report_timed(&controller, "a", a, cycle, &[(1, last, at(200_000, 1000))]);
        controller.cycle().await;
        last = max_rate();
    }
    assert!(last > 5_000.0, "{last}");
    // A static Max_R stops the steering; `auto` starts it again, from the ceiling.
    let set = |rate: &str| {
        controller.change(Change::MaxRate {
            resource: "/scratch:metadata".into(),
            rate: rate.into(),
        })
    };
    assert!(set("3000").unwrap().contains("static from now on"));
    report_timed(&controller, "a", a, 31, &[(1, 3000.0, at(5_000_000, 1000))]);
    controller.cycle().await;
    assert_eq!(max_rate(), 3000.0);
    assert_eq!(controller.snapshot().resources[0].auto, None);
    assert!(set("auto").unwrap().contains("from its ceiling 10000"));
    assert_eq!(max_rate(), 10_000.0);
    // A resource configured with a static Max_R has nothing to steer by.
    let fixed = self::controller();
    let refused = fixed
        .change(Change::MaxRate {
            resource: "/scratch:metadata".into(),
            rate: "auto".into(),
        })
        .unwrap_err();
    assert!(
        refused.to_string().contains("no latency target"),
        "{refused}"
    );
}

/// The control cycle's design at scale, on tokio's paused clock (no timing of this
/// machine in it): 4 000 nodes, each following its `Schedule` as a local controller does
/// and acknowledging the latest `Enforce` in its next report. Their reports spread over
/// the window fitted to them instead of coming in one burst, every one in its slot (no
/// cycle waits for any, none is re-scheduled), one message per node and interval each
/// way, no rules sent while nothing changes, and rules changed every cycle all
/// acknowledged before the next tick. `cheferd-lab bench` measures the same on loopback.
#[tokio::test(start_paused = true)]
async fn four_thousand_nodes_report_spread_in_their_slots_and_ack_within_the_interval() {
    const NODES: usize = 4_000;
    const WARM_UP: u64 = 4;
    const CYCLES: u64 = 12;
    let controller = controller();
    let interval = controller.interval();
    // (node, the cycle a report is for, when it was sent, the `Enforce` it acknowledges)
    let reports = Arc::new(std::sync::Mutex::new(Vec::new()));
    // (node, when a `Schedule` or an `Enforce` reached it)
    let schedules = Arc::new(std::sync::Mutex::new(Vec::new()));
    let enforces = Arc::new(std::sync::Mutex::new(Vec::new()));
    for n in 0..NODES {
        let name = format!("node{n:04}");
        let (session, mut inbox) = attach(&controller, &name);
        join(&controller, &name, session, 1, 100, &format!("job{n}"));
        let (controller, reports) = (controller.clone(), reports.clone());
        let (schedules, enforces) = (schedules.clone(), enforces.clone());
        tokio::spawn(async move {
            let mut clock = crate::local::ReportClock::default();
            let mut applied = 0;
            loop {
                tokio::select! {
                    message = tokio_stream::StreamExt::next(&mut inbox) => {
                        match message.and_then(|m| m.ok()).and_then(|m| m.body) {
                            Some(global_message::Body::Schedule(schedule)) => {
                                clock.schedule(&schedule);
                                schedules.lock().unwrap().push((n, Instant::now()));
                            }
                            Some(global_message::Body::Enforce(enforce)) => {
                                applied = applied.max(enforce.cycle);
                                enforces.lock().unwrap().push((n, enforce.cycle));
                            }
                            Some(_) => {}
                            None => return,
                        }
                    }
                    cycle = clock.next() => {
                        reports.lock().unwrap().push((n, cycle, Instant::now(), applied));
                        let usage = proto::Usage {
                            cycle,
                            applied,
                            stages: vec![proto::StageUsage {
                                stage_id: 1,
                                resources: vec![proto::ResourceUsage {
                                    resource: 0,
                                    rate: 1.0,
                                    ..Default::default()
                                }],
                            }],
                        };
                        send(&controller, &format!("node{n:04}"), session, local_message::Body::Usage(usage));
                    }
                }
            }
        });
    }

    // Steady cycles, then cycles that change every node's rules.
    let mut ticks = std::collections::BTreeMap::new();
    let mut tick = Instant::now();
    // Each job's share must change: 250 ↔ 225 of the uniform policy.
    let mut max_rate = 1_000_000;
    for changing in [false, true] {
        for _ in 0..WARM_UP + CYCLES {
            tokio::time::sleep_until(tick).await;
            if changing {
                max_rate = if max_rate == 1_000_000 {
                    900_000
                } else {
                    1_000_000
                };
                controller
                    .change(Change::MaxRate {
                        resource: "/scratch:metadata".into(),
                        rate: max_rate.to_string(),
                    })
                    .unwrap();
            }
            controller.cycle().await;
            ticks.insert(controller.lock().cycle, tick);
            tick += interval;
        }
    }
    tokio::time::sleep_until(tick).await;
    let phases = controller.phases(usize::MAX);
    let measured = |range: std::ops::Range<u64>| {
        phases
            .iter()
            .filter(move |p| range.contains(&p.cycle))
            .copied()
    };
    let steady = WARM_UP + 1..WARM_UP + CYCLES + 1;
    let changing = steady.end + WARM_UP..steady.end + WARM_UP + CYCLES;

    // At 1 s, 4 000 reports 40 µs apart need 160 ms: a window of 250 ms (¼ interval),
    // before a lead of 100 ms.
    assert_eq!(interval, 1000 * MS);
    let (lead, window) = (100 * MS, 250 * MS);
    let first_measured = ticks[&steady.start] - interval;
    let reports = reports.lock().unwrap().clone();
    let mut per_cycle = std::collections::BTreeMap::<u64, usize>::new();
    let mut tenths = [0usize; 10];
    for &(_, cycle, at, _) in reports.iter().filter(|r| r.2 >= first_measured) {
        let Some(&due) = ticks.get(&cycle) else {
            continue;
        };
        *per_cycle.entry(cycle).or_default() += 1;
        let before = due - at;
        assert!(
            before >= lead && before <= lead + window,
            "a report for cycle {cycle} came {before:?} before its tick"
        );
        tenths[((before - lead).as_secs_f64() / window.as_secs_f64() * 10.0).min(9.0) as usize] +=
            1;
    }
    assert!(
        per_cycle.values().all(|&n| n == NODES),
        "one report per node and cycle: {per_cycle:?}"
    );
    let average = tenths.iter().sum::<usize>() / 10;
    assert!(
        tenths.iter().all(|&n| n <= average * 5 / 4),
        "reports spread evenly over the window, not in bursts: {tenths:?}"
    );
    assert!(
        schedules
            .lock()
            .unwrap()
            .iter()
            .all(|&(_, at)| at < first_measured),
        "no node re-scheduled once settled"
    );
    for p in measured(steady.clone()).chain(measured(changing.clone())) {
        assert_eq!(
            p.collect,
            Duration::ZERO,
            "cycle {} waited for reports",
            p.cycle
        );
    }
    assert!(measured(steady.clone()).all(|p| p.enforced == 0));
    let enforces = enforces.lock().unwrap().clone();
    for p in measured(changing.clone()) {
        assert_eq!(p.enforced, NODES, "cycle {}", p.cycle);
        let acked = p
            .acked
            .unwrap_or_else(|| panic!("cycle {} not all acked", p.cycle));
        assert!(
            acked < interval,
            "cycle {} acked {acked:?} after its tick",
            p.cycle
        );
        assert_eq!(
            enforces.iter().filter(|e| e.1 == p.cycle).count(),
            NODES,
            "one Enforce per node in cycle {}",
            p.cycle
        );
    }
}

/// A `Schedule` that waited in its stream's queue tells the wait left when it leaves,
/// so the node's slot does not lag by the time it spent there; an older one still
/// queued keeps its own.
#[tokio::test(start_paused = true)]
async fn a_schedule_tells_its_wait_as_it_leaves_not_as_it_was_queued() {
    let controller = controller();
    let interval = controller.interval();
    let (a, mut inbox) = attach(&controller, "a");
    let queued = queued(&mut inbox);
    let [global_message::Body::Registered(_), global_message::Body::Schedule(mut schedule)] =
        &queued[..]
    else {
        panic!("Registered and a Schedule expected: {queued:?}")
    };
    let wait = interval - lead(interval, a);
    assert_eq!(schedule.report_in_ms, wait.as_millis() as u64);
    tokio::time::advance(150 * MS).await;
    let mut older = proto::Schedule {
        cycle: schedule.cycle - 1,
        ..schedule
    };
    controller.as_sent(a, &mut schedule);
    controller.as_sent(a, &mut older);
    assert_eq!(schedule.report_in_ms, (wait - 150 * MS).as_millis() as u64);
    assert_eq!(older.report_in_ms, wait.as_millis() as u64);
    // Past its slot: report at once (and be re-scheduled if that is late).
    tokio::time::advance(interval).await;
    controller.as_sent(a, &mut schedule);
    assert_eq!(schedule.report_in_ms, 0);
}

/// A stream replaced by its node's new one ends with a status saying so, naming the node
/// and where the new one came from (two local controllers running as one node knocked
/// each other off every 100 ms, neither told why); the new one is the node's.
#[tokio::test(start_paused = true)]
async fn a_replaced_stream_ends_naming_its_replacement() {
    let controller = controller();
    let (_first, mut old_inbox) = attach(&controller, "a");
    let (second, _inbox) = attach(&controller, "a");
    let waker = Waker::from(Arc::new(Noop));
    let mut context = Context::from_waker(&waker);
    let mut ended = None;
    while let Poll::Ready(Some(message)) = Pin::new(&mut old_inbox).poll_next(&mut context) {
        if let Err(status) = message {
            ended = Some(status);
        }
    }
    let status = ended.expect("the replaced stream ended with a status");
    assert_eq!(status.code(), tonic::Code::Aborted);
    assert_eq!(
        status.message(),
        format!("{REPLACED} for node 'a' from 10.0.0.1:4000")
    );
    join(&controller, "a", second, 1, 100, "A");
    assert_eq!(node(&controller, "a").stages, 1);
}

/// A stream replaced by its node's new one, or whose node is gone, is heard no more:
/// not even once another node took the place its node had.
#[tokio::test(start_paused = true)]
async fn a_replaced_or_ended_stream_reaches_no_node() {
    let controller = controller();
    let (first, _old_inbox) = attach(&controller, "a");
    let (second, _inbox) = attach(&controller, "a");
    join(&controller, "a", first, 1, 100, "A");
    assert_eq!(node(&controller, "a").stages, 0);
    join(&controller, "a", second, 2, 200, "A");
    assert_eq!(node(&controller, "a").stages, 1);
    controller.detach_node("a", first);
    assert!(node(&controller, "a").attached);

    // b ended without stages: forgotten at the next cycle, and c registers after.
    let (b, _inbox_b) = attach(&controller, "b");
    controller.detach_node("b", b);
    controller.cycle().await;
    assert!(controller.snapshot().nodes.iter().all(|n| n.node != "b"));
    let (c, _inbox_c) = attach(&controller, "c");
    join(&controller, "c", c, 3, 300, "C");
    let before = node(&controller, "c");
    assert_eq!((before.attached, before.stages), (true, 1));
    join(&controller, "b", b, 4, 400, "B");
    send(
        &controller,
        "b",
        b,
        local_message::Body::StageLeft(proto::StageLeft { stage_id: 3 }),
    );
    controller.detach_node("b", b);
    let after = node(&controller, "c");
    assert_eq!(
        (after.attached, after.stages, after.bytes_in),
        (true, 1, before.bytes_in)
    );
    assert!(controller.snapshot().nodes.iter().all(|n| n.node != "b"));
}

/// A job's key is released once no stage or orphan of it is left and a cycle has run
/// without it, and reused smallest first: stages that come and go under ever new job
/// ids (any user may set `PADLL_JOB_ID`, scoped to its uid) grew the controller's
/// memory and every cycle's work without bound, with no stage left.
#[tokio::test(start_paused = true)]
async fn job_keys_are_released_once_no_stage_or_orphan_is_left_and_reused() {
    let controller = controller();
    let (n1, _inbox_1) = attach(&controller, "n1");
    let (n2, _inbox_2) = attach(&controller, "n2");
    join(&controller, "n1", n1, 1, 1, "live@uid1000");
    join(&controller, "n2", n2, 1, 2, "orphaned@uid1000");
    controller.detach_node("n2", n2);
    let churn = |i| format!("churn-{i}@uid1000");
    for i in 0..1000 {
        join(&controller, "n1", n1, 10 + i, 10 + i as u32, &churn(i));
        send(
            &controller,
            "n1",
            n1,
            local_message::Body::StageLeft(proto::StageLeft { stage_id: 10 + i }),
        );
    }
    let key = |job: &str| controller.lock().jobs.key(job);
    assert_eq!(key(&churn(999)), Some(1001));
    controller.cycle().await;
    assert!((0..1000).all(|i| key(&churn(i)).is_none()));
    assert_eq!(
        (key("live@uid1000"), key("orphaned@uid1000")),
        (Some(0), Some(1))
    );
    // The keys issued since are free again: the next job takes the one after the last
    // kept.
    join(&controller, "n1", n1, 2, 3, "next@uid1000");
    assert_eq!(key("next@uid1000"), Some(2));

    // The orphan's job keeps its key until the orphan is presumed ended.
    tokio::time::advance(ORPHAN_GRACE).await;
    controller.cycle().await;
    assert_eq!(key("orphaned@uid1000"), None);
    join(&controller, "n1", n1, 3, 4, "again@uid1000");
    assert_eq!(key("again@uid1000"), Some(1));
}

/// Two jobs under AdapTBF, `lender` using little of its share and `borrower` all of it,
/// so that their records move apart; both then leave.
async fn adaptbf_records_apart(controller: &Controller) -> (NodeHandle, Inbox) {
    let (n1, inbox) = attach(controller, "n1");
    join(controller, "n1", n1, 1, 1, "lender");
    join(controller, "n1", n1, 2, 2, "borrower");
    for cycle in 1..=3 {
        report(controller, "n1", n1, cycle, &[(1, 50.0), (2, 500.0)]);
        controller.cycle().await;
    }
    let records: Vec<i64> = controller.policy_states()[0]
        .jobs
        .iter()
        .map(|job| job.record)
        .collect();
    assert!(records.iter().all(|&record| record != 0), "{records:?}");
    for stage_id in [1, 2] {
        send(
            controller,
            "n1",
            n1,
            local_message::Body::StageLeft(proto::StageLeft { stage_id }),
        );
    }
    (n1, inbox)
}

/// New jobs `a` and `b` run two cycles; their shares and AdapTBF's records then.
async fn new_jobs_run(
    controller: &Controller,
    n1: NodeHandle,
) -> (Vec<JobShare>, Vec<PolicyState>) {
    join(controller, "n1", n1, 3, 3, "a");
    join(controller, "n1", n1, 4, 4, "b");
    let first = controller.lock().cycle + 1;
    for cycle in first..first + 2 {
        report(controller, "n1", n1, cycle, &[(3, 400.0), (4, 40.0)]);
        controller.cycle().await;
    }
    (controller.snapshot().shares, controller.policy_states())
}

/// A reused key starts afresh: the policy wrote off the state of the job gone before
/// its key went to a new job (AdapTBF kept the records of jobs gone while no job used
/// the resource, and a new job on their key inherited them).
#[tokio::test(start_paused = true)]
async fn a_reused_job_key_inherits_nothing_of_the_job_gone() {
    let controller = controller_with("adaptbf");
    let (n1, _inbox) = adaptbf_records_apart(&controller).await;
    controller.cycle().await;
    let (lender, borrower) = {
        let state = controller.lock();
        (state.jobs.key("lender"), state.jobs.key("borrower"))
    };
    assert_eq!((lender, borrower), (None, None));
    let reused = new_jobs_run(&controller, n1).await;
    assert_eq!(controller.lock().jobs.key("a"), Some(0), "the lender's key");

    let fresh = controller_with("adaptbf");
    let (n1, _inbox) = attach(&fresh, "n1");
    assert_eq!(reused, new_jobs_run(&fresh, n1).await);
}
