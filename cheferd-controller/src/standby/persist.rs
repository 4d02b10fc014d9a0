//! What a leader keeps in etcd for the next one, written only while its election key
//! still exists (an etcd transaction comparing its creation revision), so a deposed
//! leader cannot write:
//!
//! - every administrative change, one key each, `PREFIX/changes/<term>-<sequence>`
//!   (zero-padded, so key order is the order they were made in);
//! - the policies' state (AdapTBF's records and remainders, jobs by id) in
//!   `PREFIX/policy-state`, every [`POLICY_STATE_EVERY`] when it changed: a new leader
//!   starts from records at most that old;
//! - each application's file sizes (placement's history, `crate::placement_history`)
//!   in `PREFIX/placement-sizes`, written with the policies' state;
//! - the [`Generation`] of this etcd data, in `PREFIX/generation`, written by the first
//!   leader that finds none there (new, wiped or rebuilt data; [`Generation`]).
//!
//! The next leader replays the changes in order before its first cycle: changes are
//! assignments (a policy, a capacity, a job's priority, demand or limit), so replaying
//! them yields the state they left. Once more than [`FOLD_AFTER`] keys have gathered,
//! the leader folds them ([`fold`]: the last assignment of each target, in order) into
//! `PREFIX/changes-folded`, deleting those keys in the same guarded transaction; the
//! next leader replays the folded ones, then the keys written since. So the store holds
//! at most one change per target plus [`FOLD_AFTER`]; `etcdctl del --prefix
//! PREFIX/changes` after editing the configuration file to match resets them.

use super::etcd::{self, pb::v3electionpb::LeaderKey, Etcd};
use super::StandbyError;
use crate::global::{Change, Controller, Generation, PolicyState};
use crate::placement_history::SavedSizes;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// How often a leader saves the policies' state (when it changed).
pub const POLICY_STATE_EVERY: Duration = Duration::from_secs(5);

/// How many change keys gather before a leader folds them.
pub const FOLD_AFTER: usize = 64;

/// What a change assigns: a later change of the same target supersedes it.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Target {
    Policy(String),
    MaxRate(String),
    Priority(String),
    Demand(String, Option<String>),
    Limit(String, Option<String>),
}

/// A change as the assignments it makes, one change each (a `set-job` with a priority
/// and a demand is two).
fn assignments(change: Change) -> Vec<(Target, Change)> {
    let (job, priority, resource, demand, limit) = match change {
        Change::Policy { ref resource, .. } => {
            return vec![(Target::Policy(resource.clone()), change)]
        }
        Change::MaxRate { ref resource, .. } => {
            return vec![(Target::MaxRate(resource.clone()), change)]
        }
        Change::Job {
            job,
            priority,
            resource,
            demand,
            limit,
        } => (job, priority, resource, demand, limit),
    };
    // The priority is the job's, not the resource's: a priority-only change naming a
    // resource is refused (`--resource R needs --demand or --limit`).
    let only = |priority, resource, demand, limit| Change::Job {
        job: job.clone(),
        priority,
        resource,
        demand,
        limit,
    };
    let mut made = Vec::new();
    if priority.is_some() {
        made.push((
            Target::Priority(job.clone()),
            only(priority, None, None, None),
        ));
    }
    if demand.is_some() {
        let target = Target::Demand(job.clone(), resource.clone());
        made.push((target, only(None, resource.clone(), demand, None)));
    }
    if limit.is_some() {
        let target = Target::Limit(job.clone(), resource.clone());
        made.push((target, only(None, resource.clone(), None, limit)));
    }
    made
}

/// The assignments `changes` (in the order made) leave in force: the last of each
/// target, in the order they were made. Replaying them yields the same state.
pub fn fold(changes: Vec<Change>) -> Vec<Change> {
    let mut seen = HashSet::new();
    let mut kept: Vec<Change> = changes
        .into_iter()
        .flat_map(assignments)
        .rev()
        .filter(|(target, _)| seen.insert(target.clone()))
        .map(|(_, change)| change)
        .collect();
    kept.reverse();
    kept
}

/// A leader's changes and policy state in etcd.
pub struct Store {
    etcd: Etcd,
    /// `PREFIX/changes/`.
    changes: String,
    /// `PREFIX/changes-folded`.
    folded: String,
    /// How many keys are under `changes` (as restored, plus those written since).
    unfolded: AtomicUsize,
    /// `PREFIX/policy-state`.
    policy_state: String,
    /// `PREFIX/placement-sizes`.
    placement_sizes: String,
    /// `PREFIX/generation`.
    generation: String,
    /// This leader's election key, which guards every write.
    leader: LeaderKey,
}

impl Store {
    /// The store of the leader holding `leader`, under `prefix`.
    pub fn new(etcd: &Etcd, prefix: &str, leader: LeaderKey) -> Store {
        Store {
            etcd: etcd.clone(),
            changes: format!("{prefix}/changes/"),
            folded: format!("{prefix}/changes-folded"),
            unfolded: AtomicUsize::new(0),
            policy_state: format!("{prefix}/policy-state"),
            placement_sizes: format!("{prefix}/placement-sizes"),
            generation: format!("{prefix}/generation"),
            leader,
        }
    }

    /// The generation of the etcd data this leader was elected in: the one stored, or a
    /// new one stored now if there is none (or it does not decode, saying so).
    pub async fn generation(&self) -> Result<Generation, StandbyError> {
        let key = &self.generation;
        let stored = self
            .etcd
            .get(key)
            .await
            .map_err(|e| read_failed("the generation", &e))?;
        if let Some(stored) = stored {
            match serde_json::from_slice(&stored) {
                Ok(generation) => return Ok(generation),
                Err(e) => {
                    warn!(%key, "the stored generation does not decode ({e}): making a new one")
                }
            }
        }
        let generation = Generation::now();
        let value = serde_json::to_vec(&generation).map_err(|source| StandbyError::Encode {
            what: "the generation",
            source,
        })?;
        match self
            .etcd
            .put_guarded(&self.leader.key, self.leader.rev, key, value)
            .await
        {
            Ok(true) => {
                info!(%key, %generation, "no generation in etcd (new, wiped or rebuilt data): made one; local controllers follow its leaders whatever terms they saw before");
                Ok(generation)
            }
            Ok(false) => Err(StandbyError::NoLongerLeads),
            Err(e) => Err(StandbyError::Write {
                what: "the generation",
                message: e.message().to_string(),
            }),
        }
    }

    /// Replays the changes earlier leaders made into `controller` (the folded ones,
    /// then the keys written since); returns how many. One that no longer applies (the
    /// configuration file changed since) is skipped, naming it; unreadable ones too.
    pub async fn restore(&self, controller: &Controller) -> Result<usize, StandbyError> {
        let folded = self.folded().await?;
        let stored = self
            .etcd
            .range_prefix(&self.changes)
            .await
            .map_err(|e| read_failed("the changes", &e))?;
        self.unfolded.store(stored.len(), Ordering::Relaxed);
        let folded = folded
            .into_iter()
            .map(|change| (self.folded.clone(), Some(change)));
        let stored = stored.into_iter().map(|kv| {
            let key = String::from_utf8_lossy(&kv.key).into_owned();
            let change = serde_json::from_slice::<Change>(&kv.value)
                .map_err(|e| warn!(%key, "a stored change does not decode: {e}"))
                .ok();
            (key, change)
        });
        let mut restored = 0;
        for (key, change) in folded.chain(stored) {
            let Some(change) = change else { continue };
            match controller.restore(change) {
                Ok(what) => {
                    info!(%key, "restored: {what}");
                    restored += 1;
                }
                Err(e) => warn!(%key, "a stored change was not restored: {e}"),
            }
        }
        Ok(restored)
    }

    /// The folded changes (none if there are none, or they do not decode, saying so).
    async fn folded(&self) -> Result<Vec<Change>, StandbyError> {
        let folded = self
            .etcd
            .get(&self.folded)
            .await
            .map_err(|e| read_failed("the folded changes", &e))?;
        let Some(folded) = folded else {
            return Ok(Vec::new());
        };
        Ok(serde_json::from_slice(&folded).unwrap_or_else(|e| {
            warn!(key = %self.folded, "the folded changes were not restored: {e}");
            Vec::new()
        }))
    }

    /// Folds the change keys into the folded changes, deleting them, in one transaction
    /// guarded by this leader's key; `Ok(false)` if it no longer leads. Keys that do
    /// not decode are dropped (a restore would skip them too).
    async fn fold_keys(&self) -> Result<bool, StandbyError> {
        let mut changes = self.folded().await?;
        let stored = self
            .etcd
            .range_prefix(&self.changes)
            .await
            .map_err(|e| read_failed("the changes", &e))?;
        let Some(last) = stored.last() else {
            return Ok(true);
        };
        // Up to the last key read: nothing is written meanwhile (this leader is the
        // only writer, and writes in turn with folding).
        let mut end = last.key.clone();
        end.push(0);
        let count = stored.len();
        changes.extend(
            stored
                .iter()
                .filter_map(|kv| serde_json::from_slice::<Change>(&kv.value).ok()),
        );
        let folded = fold(changes);
        let value = serde_json::to_vec(&folded).map_err(|source| StandbyError::Encode {
            what: "the folded changes",
            source,
        })?;
        let operations = vec![
            etcd::put(&self.folded, value),
            etcd::delete_range(&self.changes, end),
        ];
        let done = self
            .etcd
            .txn_guarded(&self.leader.key, self.leader.rev, operations)
            .await
            .map_err(|e| read_failed("the changes to fold", &e))?;
        if done {
            self.unfolded.fetch_sub(count, Ordering::Relaxed);
            info!(
                keys = count,
                folded = folded.len(),
                "folded the stored changes"
            );
        }
        Ok(done)
    }

    /// Loads the policies' state the last leader saved; returns for how many resources
    /// (a state that does not decode is skipped, saying so).
    pub async fn restore_policy_states(
        &self,
        controller: &Controller,
    ) -> Result<usize, StandbyError> {
        let saved = self
            .etcd
            .get(&self.policy_state)
            .await
            .map_err(|e| read_failed("the policy state", &e))?;
        let Some(saved) = saved else { return Ok(0) };
        match serde_json::from_slice::<Vec<PolicyState>>(&saved) {
            Ok(states) => Ok(controller.load_policy_states(states)),
            Err(e) => {
                warn!(key = %self.policy_state, "the saved policy state was not restored: {e}");
                Ok(0)
            }
        }
    }

    /// Loads the file sizes the last leader saved; returns for how many applications
    /// (a history that does not decode or is out of bounds is skipped, saying so).
    pub async fn restore_placement_sizes(
        &self,
        controller: &Controller,
    ) -> Result<usize, StandbyError> {
        let saved = self
            .etcd
            .get(&self.placement_sizes)
            .await
            .map_err(|e| read_failed("the placement sizes", &e))?;
        let Some(saved) = saved else { return Ok(0) };
        let loaded = serde_json::from_slice::<Vec<SavedSizes>>(&saved)
            .map_err(|e| e.to_string())
            .and_then(|sizes| {
                controller
                    .load_placement_sizes(sizes)
                    .map_err(|e| e.to_string())
            });
        Ok(loaded.unwrap_or_else(|e| {
            warn!(key = %self.placement_sizes, "the saved placement sizes were not restored: {}", padll_wire::control::short(&e));
            0
        }))
    }

    /// Saves the policies' state (and placement's file sizes) every [`POLICY_STATE_EVERY`] when it changed; fails
    /// when etcd refuses it because this controller no longer leads.
    pub async fn keep_policy_states(&self, controller: &Controller) -> StandbyError {
        let mut written = (Vec::new(), Vec::new());
        let mut said = false;
        loop {
            tokio::time::sleep(POLICY_STATE_EVERY).await;
            let saved = (controller.policy_states(), controller.placement_sizes());
            if saved == written {
                continue;
            }
            let (states, sizes) = match (serde_json::to_vec(&saved.0), serde_json::to_vec(&saved.1))
            {
                (Ok(states), Ok(sizes)) => (states, sizes),
                (Err(source), _) | (_, Err(source)) => {
                    return StandbyError::Encode {
                        what: "the policy state",
                        source,
                    }
                }
            };
            let puts = vec![
                etcd::put(&self.policy_state, states),
                etcd::put(&self.placement_sizes, sizes),
            ];
            match self
                .etcd
                .txn_guarded(&self.leader.key, self.leader.rev, puts)
                .await
            {
                Ok(true) => {
                    written = saved;
                    said = false;
                }
                Ok(false) => return StandbyError::NoLongerLeads,
                Err(e) if !said => {
                    warn!(
                        "cannot save the policy state in etcd ({}); retrying",
                        e.message()
                    );
                    said = true;
                }
                Err(_) => {}
            }
        }
    }

    /// Writes each change received, in order, until the channel closes; fails when
    /// etcd refuses it because this controller no longer leads.
    pub async fn persist(&self, mut changes: mpsc::UnboundedReceiver<Change>) -> StandbyError {
        let mut sequence = 0u64;
        while let Some(change) = changes.recv().await {
            sequence += 1;
            let key = format!("{}{:020}-{sequence:08}", self.changes, self.leader.rev);
            let value = match serde_json::to_vec(&change) {
                Ok(value) => value,
                Err(source) => {
                    return StandbyError::Encode {
                        what: "a change",
                        source,
                    }
                }
            };
            // etcd unreachable: retried until it answers (ctl has been answered; the
            // change is in force here and written as soon as etcd is back).
            let mut said = false;
            loop {
                match self
                    .etcd
                    .put_guarded(&self.leader.key, self.leader.rev, &key, value.clone())
                    .await
                {
                    Ok(true) => {
                        self.unfolded.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Ok(false) => return StandbyError::NoLongerLeads,
                    Err(e) => {
                        if !said {
                            let why = e.message();
                            warn!(%key, "cannot write a change to etcd ({why}); retrying");
                            said = true;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                }
            }
            if self.unfolded.load(Ordering::Relaxed) > FOLD_AFTER {
                // Failing (etcd unreachable) is tried again after the next change.
                match self.fold_keys().await {
                    Ok(true) => {}
                    Ok(false) => return StandbyError::NoLongerLeads,
                    Err(e) => warn!("cannot fold the stored changes ({e}); later"),
                }
            }
        }
        StandbyError::ChangesClosed
    }
}

/// etcd did not answer a read (or the fold) a leader needs.
fn read_failed(what: &'static str, status: &tonic::Status) -> StandbyError {
    StandbyError::Read {
        what,
        message: status.message().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_rate(resource: &str, rate: &str) -> Change {
        Change::MaxRate {
            resource: resource.into(),
            rate: rate.into(),
        }
    }

    /// `set-job j1`, naming the resource when there is a demand or limit for it (as
    /// `cheferd ctl` requires).
    fn job(priority: Option<f64>, demand: Option<&str>, limit: Option<&str>) -> Change {
        let terms = demand.is_some() || limit.is_some();
        Change::Job {
            job: "j1".into(),
            priority,
            resource: terms.then(|| "/scratch:metadata".into()),
            demand: demand.map(Into::into),
            limit: limit.map(Into::into),
        }
    }

    /// Folds `changes`, checking each folded one as a restore does.
    fn fold_checked(changes: Vec<Change>) -> Vec<Change> {
        let folded = fold(changes);
        for change in &folded {
            change
                .check()
                .unwrap_or_else(|e| panic!("folded {change:?} is refused: {e}"));
        }
        folded
    }

    /// A controller of `/scratch:metadata` configuring job j1.
    fn controller() -> std::sync::Arc<Controller> {
        let text = "interval_ms = 1000\n[[resource]]\nname = \"/scratch:metadata\"\nmax_rate = \"1000\"\npolicy = \"psharing:weighted\"\n[[job]]\nid = \"j1\"\n";
        let config = crate::config::GlobalConfig::parse(text, &crate::policy::check).unwrap();
        Controller::new(config).unwrap()
    }

    #[test]
    fn folding_keeps_the_last_assignment_of_each_target_in_the_order_made() {
        let policy = Change::Policy {
            resource: "/scratch:metadata".into(),
            policy: "drf".into(),
        };
        let changes = vec![
            max_rate("/scratch:metadata", "1k"),
            job(Some(2.0), Some("500"), None),
            policy.clone(),
            max_rate("/scratch:data", "1GiB/s"),
            max_rate("/scratch:metadata", "2k"),
            job(None, None, Some("100")),
            job(Some(3.0), None, None),
        ];
        assert_eq!(
            fold_checked(changes),
            vec![
                job(None, Some("500"), None),
                policy,
                max_rate("/scratch:data", "1GiB/s"),
                max_rate("/scratch:metadata", "2k"),
                job(None, None, Some("100")),
                job(Some(3.0), None, None),
            ]
        );
    }

    #[test]
    fn folding_is_bounded_by_the_targets_and_stable() {
        let changes: Vec<Change> = (0..1000)
            .map(|i| max_rate(&format!("/m{}:metadata", i % 3), &i.to_string()))
            .collect();
        let folded = fold_checked(changes);
        assert_eq!(folded.len(), 3);
        assert_eq!(
            fold(folded.clone()),
            folded,
            "folding again changes nothing"
        );
    }

    /// `set-job j1 --priority 5 --resource R --demand 500`, folded, then restored by the
    /// next leader: the priority survives with the demand.
    #[test]
    fn a_folded_priority_set_with_a_demand_is_restored() {
        let change = job(Some(5.0), Some("500"), None);
        change.check().unwrap();
        let next_leader = controller();
        for change in fold_checked(vec![change]) {
            next_leader.restore(change).unwrap();
        }
        let j1 = next_leader.config().job("j1");
        assert_eq!(j1.priority, 5.0);
        assert_eq!(j1.demand.len(), 1, "{j1:?}");
    }

    /// A priority folded before the fix, still naming the resource (no demand nor
    /// limit), as etcd may hold it: restored, not refused.
    #[test]
    fn a_priority_folded_with_a_leftover_resource_is_restored() {
        let stored = Change::Job {
            job: "j1".into(),
            priority: Some(5.0),
            resource: Some("/scratch:metadata".into()),
            demand: None,
            limit: None,
        };
        let next_leader = controller();
        next_leader.restore(stored).unwrap();
        assert_eq!(next_leader.config().job("j1").priority, 5.0);
    }
}
