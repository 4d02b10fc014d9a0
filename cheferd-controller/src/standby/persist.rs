//! What a leader keeps in etcd for the next one: every administrative change, one key
//! each, `PREFIX/changes/<term>-<sequence>` (zero-padded, so key order is the order
//! they were made in), written only while this leader's election key still exists
//! (an etcd transaction comparing its creation revision), so a deposed leader cannot
//! add to them. The next leader replays them in order before its first cycle: changes
//! are assignments (a policy, a capacity, a job's terms), so replaying them yields the
//! state they left. They are few (made by hand) and small; they are kept for the life
//! of the prefix (`etcdctl del --prefix PREFIX/changes/` after editing the
//! configuration file to match resets them).

use super::etcd::{pb::v3electionpb::LeaderKey, Etcd};
use crate::global::{Change, Controller};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// A leader's changes in etcd.
pub struct Store {
    etcd: Etcd,
    /// `PREFIX/changes/`.
    changes: String,
    /// This leader's election key, which guards every write.
    leader: LeaderKey,
}

impl Store {
    /// The store of the leader holding `leader`, under `prefix`.
    pub fn new(etcd: &Etcd, prefix: &str, leader: LeaderKey) -> Store {
        Store {
            etcd: etcd.clone(),
            changes: format!("{prefix}/changes/"),
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
                    Ok(false) => {
                        return "this controller's election key is gone from etcd: it no longer leads".to_string()
                    }
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
