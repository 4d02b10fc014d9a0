//! What a leader keeps in etcd for the next one, written only while its election key
//! still exists (an etcd transaction comparing its creation revision), so a deposed
//! leader cannot write:
//!
//! - every administrative change, one key each, `PREFIX/changes/<term>-<sequence>`
//!   (zero-padded, so key order is the order they were made in);
//! - the policies' state (AdapTBF's records and remainders, jobs by id) in
//!   `PREFIX/policy-state`, every [`POLICY_STATE_EVERY`] when it changed: a new leader
//!   starts from records at most that old.
//!
//! The next leader replays the changes in order before its first cycle: changes are
//! assignments (a policy, a capacity, a job's terms), so replaying them yields the
//! state they left. They are few (made by hand) and small; they are kept for the life
//! of the prefix (`etcdctl del --prefix PREFIX/changes/` after editing the
//! configuration file to match resets them).

use super::etcd::{pb::v3electionpb::LeaderKey, Etcd};
use crate::global::{Change, Controller, PolicyState};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Why a leader's write was refused.
const NO_LONGER_LEADS: &str =
    "this controller's election key is gone from etcd: it no longer leads";

/// How often a leader saves the policies' state (when it changed).
pub const POLICY_STATE_EVERY: Duration = Duration::from_secs(5);

/// A leader's changes and policy state in etcd.
pub struct Store {
    etcd: Etcd,
    /// `PREFIX/changes/`.
    changes: String,
    /// `PREFIX/policy-state`.
    policy_state: String,
    /// This leader's election key, which guards every write.
    leader: LeaderKey,
}

impl Store {
    /// The store of the leader holding `leader`, under `prefix`.
    pub fn new(etcd: &Etcd, prefix: &str, leader: LeaderKey) -> Store {
        Store {
            etcd: etcd.clone(),
            changes: format!("{prefix}/changes/"),
            policy_state: format!("{prefix}/policy-state"),
            leader,
        }
    }

    /// Replays the changes earlier leaders made into `controller`; returns how many.
    /// One that no longer applies (the configuration file changed since) is skipped,
    /// naming it; unreadable ones too.
    pub async fn restore(&self, controller: &Controller) -> Result<usize, String> {
        let stored = self
            .etcd
            .range_prefix(&self.changes)
            .await
            .map_err(|e| format!("cannot read the changes in etcd ({e})"))?;
        let mut restored = 0;
        for kv in stored {
            let key = String::from_utf8_lossy(&kv.key).into_owned();
            let applied = serde_json::from_slice::<Change>(&kv.value)
                .map_err(|e| e.to_string())
                .and_then(|change| controller.restore(change));
            match applied {
                Ok(what) => {
                    info!(%key, "restored: {what}");
                    restored += 1;
                }
                Err(e) => warn!(%key, "a stored change was not restored: {e}"),
            }
        }
        Ok(restored)
    }

    /// Loads the policies' state the last leader saved; returns for how many resources
    /// (a state that does not decode is skipped, saying so).
    pub async fn restore_policy_states(&self, controller: &Controller) -> Result<usize, String> {
        let saved = self
            .etcd
            .get(&self.policy_state)
            .await
            .map_err(|e| format!("cannot read the policy state in etcd ({e})"))?;
        let Some(saved) = saved else { return Ok(0) };
        match serde_json::from_slice::<Vec<PolicyState>>(&saved) {
            Ok(states) => Ok(controller.load_policy_states(states)),
            Err(e) => {
                warn!(key = %self.policy_state, "the saved policy state was not restored: {e}");
                Ok(0)
            }
        }
    }

    /// Saves the policies' state every [`POLICY_STATE_EVERY`] when it changed; fails
    /// when etcd refuses it because this controller no longer leads.
    pub async fn keep_policy_states(&self, controller: &Controller) -> String {
        let mut written = Vec::new();
        let mut said = false;
        loop {
            tokio::time::sleep(POLICY_STATE_EVERY).await;
            let states = controller.policy_states();
            if states == written {
                continue;
            }
            let value = match serde_json::to_vec(&states) {
                Ok(value) => value,
                Err(e) => return format!("cannot encode the policy state: {e}"),
            };
            match self
                .etcd
                .put_guarded(&self.leader.key, self.leader.rev, &self.policy_state, value)
                .await
            {
                Ok(true) => {
                    written = states;
                    said = false;
                }
                Ok(false) => return NO_LONGER_LEADS.to_string(),
                Err(e) if !said => {
                    warn!("cannot save the policy state in etcd ({e}); retrying");
                    said = true;
                }
                Err(_) => {}
            }
        }
    }

    /// Writes each change received, in order, until the channel closes; fails when
    /// etcd refuses it because this controller no longer leads.
    pub async fn persist(&self, mut changes: mpsc::UnboundedReceiver<Change>) -> String {
        let mut sequence = 0u64;
        while let Some(change) = changes.recv().await {
            sequence += 1;
            let key = format!("{}{:020}-{sequence:08}", self.changes, self.leader.rev);
            let value = match serde_json::to_vec(&change) {
                Ok(value) => value,
                Err(e) => return format!("cannot encode a change: {e}"),
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
                    Ok(true) => break,
                    Ok(false) => return NO_LONGER_LEADS.to_string(),
                    Err(e) => {
                        if !said {
                            warn!(%key, "cannot write a change to etcd ({e}); retrying");
                            said = true;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                }
            }
        }
        "the channel of changes closed".to_string()
    }
}
