//! Whether this global controller may control, and under which term: alone always (term
//! 0); with a standby (`crate::standby`), as the leader while its lease holds or etcd is
//! confirmed down for every standby. The gRPC service admits local controllers, stamps
//! messages with the term and records administrative changes through it; the standby
//! sets the role and the lease.

use super::term::{Generation, LeaderTerm};
use super::{Change, ChangeError, ChangeRefused};
use padll_wire::sync::lock;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;

/// The gRPC metadata key of a follower's refusal that names the leader's URL.
pub const LEADER_METADATA: &str = "padll-leader";

/// A leader as a global controller knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Leader {
    /// Its `--advertise` URL.
    pub url: String,
    /// Its term.
    pub term: u64,
    /// The generation its term counts in: known to the leader itself (a standby knows
    /// the leader from the election alone).
    pub generation: Option<Generation>,
}

impl Leader {
    /// Its place in the order of leaders.
    fn leader_term(&self) -> LeaderTerm {
        LeaderTerm {
            generation: self.generation,
            term: self.term,
        }
    }
}

/// This process' role, as the gRPC service and the admin socket see it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Role {
    /// No etcd: the only global controller (term 0).
    Single,
    /// Standing by; the leader once known.
    Follower(Option<Leader>),
    /// Leading (this process is the leader).
    Leader(Leader),
}

/// A role's name in `ctl status` and the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleName {
    /// No etcd: the only global controller.
    #[default]
    Single,
    /// Elected in etcd.
    Leader,
    /// Standing by.
    Follower,
}

impl RoleName {
    /// `single`, `leader` or `follower`.
    pub fn as_str(self) -> &'static str {
        match self {
            RoleName::Single => "single",
            RoleName::Leader => "leader",
            RoleName::Follower => "follower",
        }
    }
}

/// Who leads and whether etcd answers, as `ctl status` and the metrics show it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LeadershipStatus {
    /// This controller's role.
    pub role: RoleName,
    /// The leader's term (0 alone, or while no leader is known).
    pub term: u64,
    /// The generation of the etcd data it counts in (a leader's own).
    pub generation: Option<Generation>,
    /// The leader's URL, if known (a leader's own).
    pub leader: Option<String>,
    /// Whether etcd answered this controller's last request (`None` without etcd).
    pub etcd_reachable: Option<bool>,
    /// Since when it has not, seconds since the Unix epoch.
    pub etcd_unreachable_since: Option<u64>,
    /// Whether this leader's lease is valid by its clock (`None` unless leading).
    pub lease_valid: Option<bool>,
    /// Whether this controller sends rules now: alone, or leading with a valid lease,
    /// with every standby confirming that etcd is down, or knowing no standby.
    pub controlling: bool,
}

/// Whether this global controller may control, and under which term.
pub struct Leadership {
    role: Mutex<Role>,
    /// Until when the lease is valid by this process' clock: TTL after the last
    /// keep-alive etcd answered (sent, not answered: a slow answer only shortens it).
    lease_until: Mutex<Instant>,
    /// Until when every standby has confirmed that etcd is down for it too, or no
    /// standby is known ([`crate::standby::peers`]): a leader whose lease lapsed keeps
    /// controlling meanwhile.
    etcd_down_until: Mutex<Instant>,
    /// Since when etcd has not answered this process (`None`: its last call did).
    etcd_unreachable_since: Mutex<Option<SystemTime>>,
    /// Where applied administrative changes go to be persisted (leader only).
    changes: Mutex<Option<mpsc::UnboundedSender<Change>>>,
}

impl Default for Leadership {
    fn default() -> Self {
        Leadership {
            role: Mutex::new(Role::Single),
            lease_until: Mutex::new(Instant::now()),
            etcd_down_until: Mutex::new(Instant::now()),
            etcd_unreachable_since: Mutex::new(None),
            changes: Mutex::new(None),
        }
    }
}

impl Leadership {
    pub(crate) fn set(&self, role: Role) {
        *lock(&self.role) = role;
    }

    /// The lease is valid until `until` (etcd answered a keep-alive).
    pub(crate) fn renewed(&self, until: Instant) {
        *lock(&self.lease_until) = until;
    }

    /// etcd answered a keep-alive, the lease then valid until `until` (`None`: it did
    /// not answer, and the lease stays valid until the last answer said).
    pub(crate) fn keep_alive_answered(&self, until: Option<Instant>) {
        self.etcd_answered(until.is_some());
        if let Some(until) = until {
            self.renewed(until);
        }
    }

    /// Records whether etcd answered a call.
    pub(crate) fn etcd_answered(&self, answered: bool) {
        let mut since = lock(&self.etcd_unreachable_since);
        match (answered, *since) {
            (true, _) => *since = None,
            (false, None) => *since = Some(SystemTime::now()),
            (false, Some(_)) => {}
        }
    }

    /// Every standby confirmed that etcd is down for it too: keep controlling until
    /// `until` without a lease.
    pub(crate) fn etcd_down_confirmed(&self, until: Instant) {
        *lock(&self.etcd_down_until) = until;
    }

    pub(crate) fn lease_valid(&self) -> bool {
        self.lease_valid_for(Duration::ZERO)
    }

    /// Whether the lease is still valid `ahead` from now.
    pub(crate) fn lease_valid_for(&self, ahead: Duration) -> bool {
        Instant::now() + ahead < *lock(&self.lease_until)
    }

    /// Whether etcd did not answer this process' last call.
    pub(crate) fn etcd_unreachable(&self) -> bool {
        lock(&self.etcd_unreachable_since).is_some()
    }

    /// `Ok` if local controllers may attach here (single or leader); a follower's
    /// refusal names the leader.
    pub fn admit(&self) -> Result<(), Status> {
        match &*lock(&self.role) {
            Role::Single | Role::Leader(_) => Ok(()),
            Role::Follower(leader) => Err(refusal(leader.as_ref().map(|l| l.url.as_str()))),
        }
    }

    /// The term this controller leads in (0 alone, `None` as a follower), and whether
    /// it may send rules now (alone, or leading with a valid lease or with etcd
    /// confirmed down).
    pub(crate) fn term(&self) -> (Option<LeaderTerm>, bool) {
        match &*lock(&self.role) {
            Role::Single => (Some(LeaderTerm::default()), true),
            Role::Leader(me) => (
                Some(me.leader_term()),
                self.lease_valid() || Instant::now() < *lock(&self.etcd_down_until),
            ),
            Role::Follower(_) => (None, false),
        }
    }

    /// Whether rules may be sent now.
    pub(crate) fn enforcing(&self) -> bool {
        self.term().1
    }

    /// Who leads, whether etcd answers, whether this controller controls.
    pub fn status(&self) -> LeadershipStatus {
        let role = lock(&self.role).clone();
        let controlling = self.enforcing();
        let since = *lock(&self.etcd_unreachable_since);
        let (name, leader) = match role {
            Role::Single => {
                return LeadershipStatus {
                    controlling,
                    ..Default::default()
                }
            }
            Role::Follower(leader) => (RoleName::Follower, leader),
            Role::Leader(me) => (RoleName::Leader, Some(me)),
        };
        LeadershipStatus {
            role: name,
            term: leader.as_ref().map_or(0, |l| l.term),
            generation: leader.as_ref().and_then(|l| l.generation),
            leader: leader.map(|l| l.url),
            etcd_reachable: Some(since.is_none()),
            etcd_unreachable_since: since.map(unix_seconds),
            lease_valid: (name == RoleName::Leader).then(|| self.lease_valid()),
            controlling,
        }
    }

    /// The answer to a peer's `Standing` question.
    pub fn standing(&self) -> crate::proto::StandingReply {
        let status = self.status();
        crate::proto::StandingReply {
            leader: status.leader.unwrap_or_default(),
            term: status.term,
            etcd_reachable: status.etcd_reachable.unwrap_or(false),
            generation: status.generation.map(Into::into),
        }
    }

    /// A message about to go down a stream, with this leader's term and its generation
    /// in `Registered` and `Enforce`; `None` for an `Enforce` that must not be sent (the
    /// lease has lapsed and etcd is not confirmed down, or leadership is lost).
    pub fn stamp(
        &self,
        mut message: crate::proto::GlobalMessage,
    ) -> Option<crate::proto::GlobalMessage> {
        use crate::proto::global_message::Body;
        let (term, enforcing) = self.term();
        let generation = || term.and_then(|t| t.generation).map(Into::into);
        match &mut message.body {
            Some(Body::Registered(registered)) => {
                registered.term = term?.term;
                registered.generation = generation();
            }
            Some(Body::Enforce(_)) if !enforcing => return None,
            Some(Body::Enforce(enforce)) => {
                enforce.term = term?.term;
                enforce.generation = generation();
            }
            _ => {}
        }
        Some(message)
    }

    /// Hands every administrative change applied from now on to `persister` (the
    /// leader's, in the order they were applied).
    pub(crate) fn persist_changes_to(&self, persister: mpsc::UnboundedSender<Change>) {
        *lock(&self.changes) = Some(persister);
    }

    /// Applies an administrative change with `apply` and hands it to the persister
    /// (leader only), changes in the order they were applied; a follower refuses them
    /// (they would be lost), naming the leader.
    pub fn record(
        &self,
        change: &Change,
        apply: impl FnOnce() -> Result<String, ChangeError>,
    ) -> Result<String, ChangeRefused> {
        if let Role::Follower(leader) = &*lock(&self.role) {
            return Err(ChangeRefused::Standby {
                leader: leader.as_ref().map(|l| l.url.clone()),
            });
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

/// Seconds since the Unix epoch.
fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `unix_seconds` (seconds since the Unix epoch) as `HH:MM:SS UTC`.
pub(crate) fn utc(unix_seconds: u64) -> String {
    let seconds = unix_seconds % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

impl LeadershipStatus {
    /// `ctl status`: one line per fact.
    pub fn render(&self) -> String {
        let etcd = match (self.etcd_reachable, self.etcd_unreachable_since) {
            (None, _) => "not used (a single global controller)".to_string(),
            (Some(true), _) => "reachable".to_string(),
            (Some(false), Some(since)) => format!("unreachable since {}", utc(since)),
            (Some(false), None) => "unreachable".to_string(),
        };
        let lease = match self.lease_valid {
            None => "-",
            Some(true) => "valid",
            Some(false) => "lapsed",
        };
        let term = match self.generation {
            Some(generation) => format!("{} (etcd data of {generation})", self.term),
            None => self.term.to_string(),
        };
        format!(
            "role         {}\nterm         {term}\nleader       {}\netcd         {etcd}\nlease        {lease}\ncontrolling  {}\n",
            self.role.as_str(),
            self.leader.as_deref().unwrap_or("-"),
            if self.controlling { "yes" } else { "no (stages keep their last rules)" },
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{global_message::Body, Enforce, GlobalMessage, Registered};

    fn enforce() -> GlobalMessage {
        GlobalMessage {
            body: Some(Body::Enforce(Enforce::default())),
        }
    }

    fn leader_of_term_42() -> Role {
        Role::Leader(Leader {
            url: "https://g1:50051".into(),
            term: 42,
            generation: Some(Generation {
                created_ms: 1_000,
                nonce: 3,
            }),
        })
    }

    fn term_of(message: Option<GlobalMessage>) -> Option<u64> {
        match message?.body? {
            Body::Enforce(e) => Some(e.term),
            Body::Registered(r) => Some(r.term),
            _ => None,
        }
    }

    fn generation_of(message: Option<GlobalMessage>) -> Option<u64> {
        match message?.body? {
            Body::Enforce(e) => Some(e.generation?.created_ms),
            Body::Registered(r) => Some(r.generation?.created_ms),
            _ => None,
        }
    }

    #[test]
    fn the_status_says_role_term_leader_etcd_and_lease() {
        let leadership = Leadership::default();
        let alone = leadership.status();
        assert_eq!(
            (alone.role, alone.etcd_reachable, alone.controlling),
            (RoleName::Single, None, true)
        );
        leadership.set(leader_of_term_42());
        leadership.renewed(Instant::now() + Duration::from_secs(60));
        leadership.etcd_answered(false);
        let leading = leadership.status();
        assert_eq!(leading.role, RoleName::Leader);
        assert_eq!(leading.term, 42);
        assert_eq!(leading.leader.as_deref(), Some("https://g1:50051"));
        assert_eq!(leading.etcd_reachable, Some(false));
        assert!(leading.etcd_unreachable_since.is_some());
        assert_eq!(leading.lease_valid, Some(true));
        let text = leading.render();
        assert!(text.contains("role         leader\n"), "{text}");
        assert!(
            text.contains("term         42 (etcd data of 1970-01-01 00:00:01.000 UTC)\n"),
            "{text}"
        );
        assert!(text.contains("etcd         unreachable since "), "{text}");
        let standing = leadership.standing();
        assert_eq!((standing.term, standing.etcd_reachable), (42, false));
        assert_eq!(standing.generation.map(|g| g.created_ms), Some(1_000));
        leadership.etcd_answered(true);
        assert_eq!(leadership.status().etcd_unreachable_since, None);
    }

    #[test]
    fn a_leader_whose_lease_lapsed_controls_while_etcd_is_confirmed_down() {
        let leadership = Leadership::default();
        leadership.set(leader_of_term_42());
        leadership.renewed(Instant::now());
        assert!(!leadership.status().controlling);
        leadership.etcd_down_confirmed(Instant::now() + Duration::from_secs(60));
        let status = leadership.status();
        assert_eq!(
            (status.lease_valid, status.controlling),
            (Some(false), true)
        );
        assert_eq!(term_of(leadership.stamp(enforce())), Some(42));
    }

    #[test]
    fn utc_shows_the_time_of_day() {
        assert_eq!(utc(86_400 * 3 + 3_723), "01:02:03 UTC");
    }

    #[test]
    fn alone_every_message_goes_with_term_0() {
        let leadership = Leadership::default();
        assert!(leadership.admit().is_ok());
        assert_eq!(term_of(leadership.stamp(enforce())), Some(0));
        assert_eq!(generation_of(leadership.stamp(enforce())), None);
    }

    #[test]
    fn a_follower_refuses_naming_the_leader_and_sends_no_rules() {
        let leadership = Leadership::default();
        leadership.set(Role::Follower(Some(Leader {
            url: "https://g2:50051".into(),
            term: 7,
            generation: None,
        })));
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
        assert!(matches!(
            refused,
            Err(ChangeRefused::Standby { leader: Some(url) }) if url == "https://g2:50051"
        ));
        assert_eq!(leadership.stamp(enforce()), None);
    }

    #[test]
    fn a_leader_stamps_its_term_and_sends_no_rules_once_its_lease_lapsed() {
        let leadership = Leadership::default();
        leadership.set(leader_of_term_42());
        leadership.renewed(Instant::now() + Duration::from_secs(60));
        assert_eq!(term_of(leadership.stamp(enforce())), Some(42));
        assert_eq!(generation_of(leadership.stamp(enforce())), Some(1_000));
        leadership.renewed(Instant::now());
        assert_eq!(leadership.stamp(enforce()), None);
        let registered = GlobalMessage {
            body: Some(Body::Registered(Registered::default())),
        };
        assert_eq!(
            term_of(leadership.stamp(registered.clone())),
            Some(42),
            "its term all the same"
        );
        assert_eq!(generation_of(leadership.stamp(registered)), Some(1_000));
    }
}
