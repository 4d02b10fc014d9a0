//! A standby global controller: two or three `cheferd global` with
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
//! - **Fencing**: every `Registered` and `Enforce` carries the term and the generation of
//!   the etcd data it counts in ([`Leadership::stamp`], [`LeaderTerm`]); a local controller
//!   refuses an older term than the newest it has seen, and follows the leader of a
//!   replaced etcd (a newer generation) whatever its term. A leader counts its lease
//!   valid until TTL after the last keep-alive etcd answered; past that it asks the
//!   standbys ([`peers`]): if none reaches etcd either, etcd is down, no one can be
//!   elected, and it keeps controlling, saying so; if it knows no standby, it keeps
//!   controlling too (a standby elected meanwhile has a newer term, which the local
//!   controllers follow); if a standby reaches etcd, or cannot be asked, this leader may
//!   be the one cut off and sends no rules (stages keep their last ones, fail-static)
//!   until etcd answers again; if etcd says the lease is gone or a standby knows a newer
//!   term, it exits for its service manager to restart it as a follower.
//!
//! Leases, confirmations and the standbys' answers are timed by tokio's clock
//! ([`tokio::time::Instant`]): the system's in production, paused in the tests.

pub mod etcd;
pub mod follow;
pub mod peers;
pub mod persist;

use crate::global::{Controller, Leader, LeaderTerm, Leadership, Role};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::ClientTlsConfig;
use tracing::{info, warn};

/// Why a standby global controller cannot start, or stops leading (the process then
/// exits, for its service manager to start it again as a follower).
#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    /// An `--etcd` URL that is not one, or not of the scheme TLS asks for.
    #[error("--etcd '{url}': {why}")]
    EtcdUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// No `--etcd` URL.
    #[error("--etcd: no URL given")]
    NoEtcd,
    /// etcd did not give what a new leader reads before its first cycle.
    #[error("cannot read {what} in etcd ({message})")]
    Read {
        /// What was read.
        what: &'static str,
        /// etcd's (or the connection's) message.
        message: String,
    },
    /// etcd did not take what a new leader writes before its first cycle.
    #[error("cannot write {what} to etcd ({message})")]
    Write {
        /// What was written.
        what: &'static str,
        /// etcd's (or the connection's) message.
        message: String,
    },
    /// etcd says this controller's lease is gone.
    #[error("etcd says lease {0:x} has expired: another global controller may lead now; exiting to start again as a standby")]
    LeaseExpired(i64),
    /// etcd refused a write guarded by this leader's election key.
    #[error("this controller's election key is gone from etcd: it no longer leads")]
    NoLongerLeads,
    /// A standby knows a newer term than this leader's ([`peers::decide`]).
    #[error("standby {standby} knows leader {leader} in {term:#}, newer than this controller's {mine:#}: another global controller leads; exiting to start again as a standby")]
    Deposed {
        /// The standby that said so.
        standby: String,
        /// The leader it knows.
        leader: String,
        /// That leader's term.
        term: LeaderTerm,
        /// This controller's term.
        mine: LeaderTerm,
    },
    /// What was to be written to etcd did not encode.
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// A change, or the policy state.
        what: &'static str,
        /// serde's reason.
        source: serde_json::Error,
    },
    /// The channel of applied changes closed (the controller is going away).
    #[error("the channel of changes closed")]
    ChangesClosed,
}

/// `cheferd global --etcd …`: where the election is and what to proclaim.
#[derive(Clone, Debug)]
pub struct StandbyOptions {
    /// etcd client URLs (`http://host:port`, `https://` with `etcd_tls`).
    pub endpoints: Vec<String>,
    /// TLS to etcd (`--etcd-ca`, and `--etcd-cert`/`--etcd-key` if it asks for a
    /// client certificate); `None`: plaintext.
    pub etcd_tls: Option<ClientTlsConfig>,
    /// The key prefix of this cluster's election and state (`/padll`).
    pub prefix: String,
    /// The URL local controllers reach this global controller by (as in their
    /// `--global` list).
    pub advertise: String,
    /// The lease's time to live: how long a dead leader keeps the leadership.
    pub ttl: Duration,
    /// How to check the other global controllers' server certificates when asking
    /// them about etcd (the site CA); `None` with plaintext gRPC.
    pub peer_tls: Option<ClientTlsConfig>,
}

/// Runs `controller` as one of several global controllers: stands by until elected,
/// then restores the administrative changes and runs the control loop while the lease
/// holds (or etcd is down for every global controller it knows). Returns (an error) only when
/// leadership is lost for good: the process then exits and its service manager starts
/// it again, as a follower.
pub async fn run(controller: Arc<Controller>, options: StandbyOptions) -> Result<(), StandbyError> {
    let leadership = controller.leadership();
    leadership.set(Role::Follower(None));
    let etcd = etcd::Etcd::new(&options.endpoints, options.etcd_tls.clone())?;
    let lease = etcd.grant_retrying(options.ttl).await;
    leadership.renewed(Instant::now() + options.ttl);
    info!(
        lease,
        ttl_s = options.ttl.as_secs_f64(),
        "standing by: campaigning for leadership in etcd"
    );
    let answered = |until| leadership.keep_alive_answered(until);
    tokio::select! {
        lost = etcd.keep_alive(lease, options.ttl, answered) => Err(lost),
        ended = lead(&etcd, &controller, &options, lease) => ended,
    }
}

/// Campaigns (following the leader meanwhile), then leads: restores the changes,
/// persists new ones, runs the control loop and, while the lease has lapsed, asks the
/// standbys whether etcd is down ([`peers`]).
async fn lead(
    etcd: &etcd::Etcd,
    controller: &Arc<Controller>,
    options: &StandbyOptions,
    lease: i64,
) -> Result<(), StandbyError> {
    let leadership = controller.leadership();
    let election = format!("{}/leader", options.prefix);
    let key = tokio::select! {
        won = etcd.campaign(&election, lease, &options.advertise) => won,
        never = follow_leader(etcd, &election, leadership) => match never {},
    };
    let term = key.rev as u64;
    let store = persist::Store::new(etcd, &options.prefix, key);
    let generation = store.generation().await?;
    let restored = store.restore(controller).await?;
    let policy_states = store.restore_policy_states(controller).await?;
    let placement_apps = store.restore_placement_sizes(controller).await?;
    let (sender, receiver) = mpsc::unbounded_channel();
    leadership.persist_changes_to(sender);
    leadership.set(Role::Leader(Leader {
        url: options.advertise.clone(),
        term,
        generation: Some(generation),
    }));
    info!(term, %generation, restored, policy_states, placement_apps, advertise = %options.advertise, "elected leader");
    let standbys = peers::Standbys::new(options.peer_tls.clone(), &options.advertise);
    tokio::select! {
        failed = store.persist(receiver) => Err(failed),
        failed = store.keep_policy_states(controller) => Err(failed),
        deposed = standbys.watch(etcd, &election, leadership, options.ttl) => Err(deposed),
        never = control(controller) => match never {},
    }
}

/// Keeps a follower's idea of the leader current (for its refusals and its answers
/// to `Standing`), polling etcd.
async fn follow_leader(etcd: &etcd::Etcd, election: &str, leadership: &Leadership) -> Infallible {
    let mut known = None;
    loop {
        let leader = etcd.leader(election).await;
        leadership.etcd_answered(leader.is_ok());
        if let Ok(leader) = leader {
            if leader != known {
                info!(
                    leader = leader.as_ref().map_or("none", |l| l.url.as_str()),
                    term = leader.as_ref().map_or(0, |l| l.term),
                    "following"
                );
                leadership.set(Role::Follower(leader.clone()));
                known = leader;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A leader's control loop: a cycle per interval while it may control; otherwise
/// cycles pause and the stages keep their last rules.
///
/// A new leader first listens for [`MAX_RECONNECT_BACKOFF`](follow::MAX_RECONNECT_BACKOFF)
/// and one interval: the local controllers come back one by one as their retries reach
/// it, and a cycle planned over the first few would hand them the whole `Max_R` while
/// the others still run under the last leader's rules. Meanwhile every stage keeps those
/// rules (fail-static), which kept the aggregate within `Max_R`.
async fn control(controller: &Arc<Controller>) -> Infallible {
    let grace = follow::MAX_RECONNECT_BACKOFF + controller.interval();
    info!(
        ?grace,
        "listening before the first cycle while local controllers re-attach"
    );
    tokio::time::sleep(grace).await;
    let leadership = controller.leadership();
    let mut frozen = false;
    let mut tick = tokio::time::Instant::now();
    loop {
        if leadership.enforcing() {
            if frozen {
                info!("controlling again");
                frozen = false;
            }
            controller.cycle_at(tick).await;
        } else if !frozen {
            warn!(
                "the lease has lapsed: no rules are sent, stages keep their last ones, until \
                 etcd renews it or every standby confirms that etcd is down"
            );
            frozen = true;
        }
        tick = controller.next_tick(tick);
        tokio::time::sleep_until(tick).await;
    }
}
