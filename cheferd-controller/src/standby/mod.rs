//! A standby global controller (issue 11, part 2): two or three `cheferd global` with
//! `--etcd`, of which exactly one — the one holding etcd's election — leads.
//!
//! - **Who leads** is etcd's Election API ([`etcd`]): each process grants itself a
//!   lease (`--etcd-ttl`), keeps it alive, and campaigns with it under
//!   `PREFIX/leader`, proclaiming its `--advertise` URL. The winner's **term** is the
//!   etcd revision that created its election key: larger for every later leader.
//! - **Followers** run no control loop, refuse `Attach` (`UNAVAILABLE`, naming the
//!   leader's URL in the message and in the `padll-leader` metadata) and refuse `ctl`
//!   changes; local controllers given every global's URL move to the leader ([`follow`]).
//! - **What survives a leader** is what only it knew: every administrative change
//!   (`ctl set-policy`, `set-max-rate`, `set-job`), written to `PREFIX/changes/` guarded by
//!   its term ([`persist`]) and replayed, in order, by the next leader before its first
//!   cycle. Scheduled rules are in every global's configuration file. Job usage comes
//!   back with the next reports.
//! - **Fencing**: every `Registered` and `Enforce` carries the term ([`Leadership::stamp`]);
//!   a local controller refuses an older term than the newest it has seen. A leader
//!   counts its lease valid until TTL after the last keep-alive etcd answered; past that
//!   it sends no rules (stages keep their last ones, fail-static) until etcd answers
//!   again, and if etcd says the lease is gone it exits for its service manager to
//!   restart it as a follower. While etcd is down no one can be elected, so this leader
//!   is not replaced, and says so; it cannot tell that from being cut off from etcd
//!   while others reach it, which is why it freezes rules rather than go on deciding.

pub mod etcd;
pub mod follow;
pub mod persist;

use crate::global::{Change, Controller};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{info, warn};

/// The gRPC metadata key of a follower's refusal that names the leader's URL.
pub const LEADER_METADATA: &str = "padll-leader";

/// `cheferd global --etcd …`: where the election is and what to proclaim.
#[derive(Clone, Debug)]
pub struct StandbyOptions {
    /// etcd client URLs (`http://host:port`).
    pub endpoints: Vec<String>,
    /// The key prefix of this cluster's election and state (`/padll`).
    pub prefix: String,
    /// The URL local controllers reach this global controller by (as in their
    /// `--global` list).
    pub advertise: String,
    /// The lease's time to live: how long a dead leader keeps the leadership.
    pub ttl: Duration,
}

/// This process' role, as the gRPC service and the admin socket see it.
#[derive(Clone, Debug, PartialEq)]
enum Role {
    /// No etcd: the only global controller (term 0).
    Single,
    /// Standing by; the leader's URL once known.
    Follower(Option<String>),
    /// Leading in this term.
    Leader(u64),
}

/// Whether this global controller may control, and under which term.
pub struct Leadership {
    role: Mutex<Role>,
    /// Until when the lease is valid by this process' clock: TTL after the last
    /// keep-alive etcd answered (sent, not answered: a slow answer only shortens it).
    lease_until: Mutex<Instant>,
    /// Where applied administrative changes go to be persisted (leader only).
    changes: Mutex<Option<mpsc::UnboundedSender<Change>>>,
}

impl Default for Leadership {
    fn default() -> Self {
        Leadership {
            role: Mutex::new(Role::Single),
            lease_until: Mutex::new(Instant::now()),
            changes: Mutex::new(None),
        }
    }
}

/// Locks `mutex`; nothing panics while these are held, so a poisoned one is whole.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Leadership {
    fn set(&self, role: Role) {
        *lock(&self.role) = role;
    }

    /// The lease is valid until `until` (etcd answered a keep-alive).
    fn renewed(&self, until: Instant) {
        *lock(&self.lease_until) = until;
    }

    /// `Ok` if local controllers may attach here (single or leader); a follower's
    /// refusal names the leader.
    pub fn admit(&self) -> Result<(), Status> {
        match &*lock(&self.role) {
            Role::Single | Role::Leader(_) => Ok(()),
            Role::Follower(leader) => Err(refusal(leader.as_deref())),
        }
    }

    /// The term this controller leads in (0 alone, `None` as a follower), and whether
    /// it may send rules now (alone, or leading with a valid lease).
    fn term(&self) -> (Option<u64>, bool) {
        match &*lock(&self.role) {
            Role::Single => (Some(0), true),
            Role::Leader(term) => (Some(*term), Instant::now() < *lock(&self.lease_until)),
            Role::Follower(_) => (None, false),
        }
    }

    /// Whether rules may be sent now.
    fn enforcing(&self) -> bool {
        self.term().1
    }

    /// A message about to go down a stream, with this leader's term in `Registered`
    /// and `Enforce`; `None` for an `Enforce` that must not be sent (the lease has
    /// lapsed, or leadership is lost).
    pub fn stamp(
        &self,
        mut message: crate::proto::GlobalMessage,
    ) -> Option<crate::proto::GlobalMessage> {
        use crate::proto::global_message::Body;
        let (term, enforcing) = self.term();
        match &mut message.body {
            Some(Body::Registered(registered)) => registered.term = term?,
            Some(Body::Enforce(_)) if !enforcing => return None,
            Some(Body::Enforce(enforce)) => enforce.term = term?,
            _ => {}
        }
        Some(message)
    }

    /// Applies an administrative change with `apply` and hands it to the persister
    /// (leader only), changes in the order they were applied; a follower refuses them
    /// (they would be lost), naming the leader.
    pub fn record(
        &self,
        change: &Change,
        apply: impl FnOnce() -> Result<String, String>,
    ) -> Result<String, String> {
        if let Role::Follower(leader) = &*lock(&self.role) {
            return Err(format!(
                "this global controller is a standby; make changes on the leader ({})",
                leader.as_deref().unwrap_or("not elected yet")
            ));
        }
        // Held across both, so the next leader replays changes in the order made here.
        let persister = lock(&self.changes);
        let done = apply()?;
        if let Some(sender) = &*persister {
            let _ = sender.send(change.clone());
        }
        Ok(done)
    }
}

/// A follower's answer to `Attach`: `UNAVAILABLE`, naming the leader.
fn refusal(leader: Option<&str>) -> Status {
    let Some(leader) = leader else {
        return Status::unavailable(
            "this global controller is a standby; no leader is elected yet",
        );
    };
    let mut status = Status::unavailable(format!(
        "this global controller is a standby; the leader is {leader}"
    ));
    if let Ok(value) = leader.parse() {
        status.metadata_mut().insert(LEADER_METADATA, value);
    }
    status
}

/// Runs `controller` as one of several global controllers: stands by until elected,
/// then restores the administrative changes and runs the control loop while the lease
/// holds. Returns (an error) only when leadership is lost for good: the process then
/// exits and its service manager starts it again, as a follower.
pub async fn run(controller: Arc<Controller>, options: StandbyOptions) -> Result<(), String> {
    let leadership = controller.leadership();
    leadership.set(Role::Follower(None));
    let etcd = etcd::Etcd::new(&options.endpoints)?;
    let lease = etcd.grant_retrying(options.ttl).await;
    leadership.renewed(Instant::now() + options.ttl);
    info!(
        lease,
        ttl_s = options.ttl.as_secs_f64(),
        "standing by: campaigning for leadership in etcd"
    );
    tokio::select! {
        lost = etcd.keep_alive(lease, options.ttl, |until| leadership.renewed(until)) => Err(lost),
        ended = lead(&etcd, &controller, &options, lease) => ended,
    }
}

/// Campaigns (following the leader meanwhile), then leads: restores the changes,
/// persists new ones and runs the control loop.
async fn lead(
    etcd: &etcd::Etcd,
    controller: &Arc<Controller>,
    options: &StandbyOptions,
    lease: i64,
) -> Result<(), String> {
    let leadership = controller.leadership();
    let election = format!("{}/leader", options.prefix);
    let key = tokio::select! {
        won = etcd.campaign(&election, lease, &options.advertise) => won,
        never = follow_leader(etcd, &election, leadership) => match never {},
    };
    let term = key.rev;
    let store = persist::Store::new(etcd, &options.prefix, key);
    let restored = store.restore(controller).await?;
    let policy_states = store.restore_policy_states(controller).await?;
    let (sender, receiver) = mpsc::unbounded_channel();
    *lock(&leadership.changes) = Some(sender);
    leadership.set(Role::Leader(term as u64));
    info!(term, restored, policy_states, advertise = %options.advertise, "elected leader");
    tokio::select! {
        failed = store.persist(receiver) => Err(failed),
        failed = store.keep_policy_states(controller) => Err(failed),
        never = control(controller) => match never {},
    }
}

/// Keeps a follower's idea of the leader current (for its refusals), polling etcd.
async fn follow_leader(etcd: &etcd::Etcd, election: &str, leadership: &Leadership) -> Infallible {
    let mut known = None;
    loop {
        if let Ok(leader) = etcd.leader(election).await {
            if leader != known {
                info!(leader = leader.as_deref().unwrap_or("none"), "following");
                leadership.set(Role::Follower(leader.clone()));
                known = leader;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A leader's control loop: a cycle per interval while the lease is valid; while it
/// has lapsed (etcd unreachable) cycles pause and the stages keep their last rules.
async fn control(controller: &Arc<Controller>) -> Infallible {
    let leadership = controller.leadership();
    let mut frozen = false;
    loop {
        let next = tokio::time::Instant::now() + controller.interval();
        if leadership.enforcing() {
            if frozen {
                info!("etcd renewed the lease again: controlling");
                frozen = false;
            }
            controller.cycle().await;
        } else if !frozen {
            warn!(
                "the lease has lapsed (etcd has not renewed it): no rules are sent, stages keep \
                 their last ones, until etcd answers; while etcd is down no other leader can be \
                 elected"
            );
            frozen = true;
        }
        tokio::time::sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{global_message::Body, Enforce, GlobalMessage, Registered};

    fn enforce() -> GlobalMessage {
        GlobalMessage {
            body: Some(Body::Enforce(Enforce::default())),
        }
    }

    fn term_of(message: Option<GlobalMessage>) -> Option<u64> {
        match message?.body? {
            Body::Enforce(e) => Some(e.term),
            Body::Registered(r) => Some(r.term),
            _ => None,
        }
    }

    #[test]
    fn alone_every_message_goes_with_term_0() {
        let leadership = Leadership::default();
        assert!(leadership.admit().is_ok());
        assert_eq!(term_of(leadership.stamp(enforce())), Some(0));
    }

    #[test]
    fn a_follower_refuses_naming_the_leader_and_sends_no_rules() {
        let leadership = Leadership::default();
        leadership.set(Role::Follower(Some("https://g2:50051".into())));
        let refusal = leadership.admit().unwrap_err();
        assert_eq!(refusal.code(), tonic::Code::Unavailable);
        assert!(refusal.message().contains("https://g2:50051"));
        assert_eq!(
            refusal.metadata().get(LEADER_METADATA).unwrap(),
            "https://g2:50051"
        );
        let change = Change::MaxRate {
            resource: "/scratch:metadata".into(),
            rate: "1k".into(),
        };
        let refused = leadership.record(&change, || unreachable!("a standby applies nothing"));
        assert!(refused.unwrap_err().contains("https://g2:50051"));
        assert_eq!(leadership.stamp(enforce()), None);
    }

    #[test]
    fn a_leader_stamps_its_term_and_sends_no_rules_once_its_lease_lapsed() {
        let leadership = Leadership::default();
        leadership.set(Role::Leader(42));
        leadership.renewed(Instant::now() + Duration::from_secs(60));
        assert_eq!(term_of(leadership.stamp(enforce())), Some(42));
        leadership.renewed(Instant::now());
        assert_eq!(leadership.stamp(enforce()), None);
        let registered = GlobalMessage {
            body: Some(Body::Registered(Registered::default())),
        };
        assert_eq!(
            term_of(leadership.stamp(registered)),
            Some(42),
            "its term all the same"
        );
    }
}
