//! The caps on who may hold what on the stage socket: connections per node and per uid,
//! pending partial-line bytes, queued bytes, placement requests and file sizes per uid, jobs per
//! uid, and which uid runs each job.

use super::placement::{Rate, PLACE_RATE_PER_UID, SIZE_RATE_PER_UID};
use super::{outbox, trim, Local};
use crate::bounds::Budget;
use padll_wire::control;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Connections and jobs of one uid.
struct UserState {
    connections: usize,
    pending: Arc<Budget>,
    queued: Arc<Budget>,
    place_rate: Arc<Mutex<Rate>>,
    size_rate: Arc<Mutex<Rate>>,
    /// Its stages' job ids, with how many stages each.
    jobs: HashMap<String, usize>,
}

/// Who is connected, for the caps.
#[derive(Default)]
pub(super) struct Peers {
    connections: usize,
    users: HashMap<u32, UserState>,
    /// Which uid runs each job on this node (the uid of its first stage).
    job_owner: HashMap<String, u32>,
}

/// A connection counted in [`Peers`]; uncounted (and its job released) when dropped.
pub(super) struct Admission {
    local: Arc<Local>,
    uid: u32,
    job: Option<String>,
    /// The partial-line budget of its uid.
    pub(super) pending: Arc<Budget>,
    /// The budget of bytes queued to its uid's stages.
    pub(super) queued: Arc<Budget>,
    /// The placement requests its uid may make.
    pub(super) place_rate: Arc<Mutex<Rate>>,
    /// The file sizes its uid may report.
    pub(super) size_rate: Arc<Mutex<Rate>>,
}

impl Admission {
    /// Its uid.
    pub(super) fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut peers = self.local.lock_peers();
        peers.connections = peers.connections.saturating_sub(1);
        let mut release_job = false;
        let mut remove_user = false;
        if let Some(user) = peers.users.get_mut(&self.uid) {
            user.connections = user.connections.saturating_sub(1);
            if let Some(job) = &self.job {
                if let Some(count) = user.jobs.get_mut(job) {
                    *count -= 1;
                    if *count == 0 {
                        user.jobs.remove(job);
                        release_job = true;
                    }
                }
            }
            remove_user = user.connections == 0;
        }
        if remove_user {
            peers.users.remove(&self.uid);
        }
        if let (true, Some(job)) = (release_job, &self.job) {
            if peers.job_owner.get(job) == Some(&self.uid) {
                peers.job_owner.remove(job);
            }
        }
        // Buffers of a connection that held a large line go back to the allocator's
        // free lists; give them back to the system soon.
        trim::wanted();
    }
}

impl Local {
    /// Counts a new connection of `uid`, or says which cap refuses it.
    pub(super) fn admit(self: &Arc<Self>, uid: u32) -> Result<Admission, Refusal> {
        let limits = &self.options.limits;
        let mut peers = self.lock_peers();
        if peers.connections >= limits.max_connections {
            return Err(Refusal::NodeConnections(peers.connections));
        }
        let per_uid = limits.max_pending_bytes_per_uid;
        let user = peers.users.entry(uid).or_insert_with(|| UserState {
            connections: 0,
            pending: Budget::new(per_uid),
            queued: Budget::new(outbox::MAX_BYTES_PER_UID),
            place_rate: Arc::new(Mutex::new(Rate::new(PLACE_RATE_PER_UID))),
            size_rate: Arc::new(Mutex::new(Rate::new(SIZE_RATE_PER_UID))),
            jobs: HashMap::new(),
        });
        if user.connections >= limits.max_connections_per_uid {
            return Err(Refusal::UidConnections {
                uid,
                connections: user.connections,
            });
        }
        user.connections += 1;
        let admission = Admission {
            local: self.clone(),
            uid,
            job: None,
            pending: user.pending.clone(),
            queued: user.queued.clone(),
            place_rate: user.place_rate.clone(),
            size_rate: user.size_rate.clone(),
        };
        peers.connections += 1;
        Ok(admission)
    }

    /// Records that the connection of `admission` is a stage of `job`, or says why not:
    /// the job runs under another uid on this node, or its uid has too many jobs.
    pub(super) fn join_job(&self, admission: &mut Admission, job: &str) -> Result<(), Refusal> {
        let max_jobs = self.options.limits.max_jobs_per_uid;
        let mut peers = self.lock_peers();
        let uid = admission.uid;
        if let Some(&owner) = peers.job_owner.get(job) {
            if owner != uid && uid != 0 {
                return Err(Refusal::OtherOwner {
                    job: job.to_string(),
                    owner,
                    uid,
                });
            }
        }
        let Some(user) = peers.users.get_mut(&uid) else {
            return Err(Refusal::NotCounted);
        };
        if !user.jobs.contains_key(job) && user.jobs.len() >= max_jobs {
            return Err(Refusal::UidJobs {
                uid,
                jobs: user.jobs.len(),
            });
        }
        *user.jobs.entry(job.to_string()).or_insert(0) += 1;
        peers.job_owner.entry(job.to_string()).or_insert(uid);
        admission.job = Some(job.to_string());
        Ok(())
    }
}

/// Why a stage's connection or job was refused (it is told, and it is logged).
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    /// The node has as many connections as it takes.
    #[error("{0} connections on this node (the limit)")]
    NodeConnections(usize),
    /// The uid has as many connections as it may.
    #[error("uid {uid} has {connections} connections (the limit per uid)")]
    UidConnections { uid: u32, connections: usize },
    /// The job runs under another uid on this node.
    #[error(
        "job '{}' runs under uid {owner} on this node, not uid {uid}",
        control::short(job)
    )]
    OtherOwner { job: String, owner: u32, uid: u32 },
    /// The connection was never admitted.
    #[error("connection not counted")]
    NotCounted,
    /// The uid has as many jobs on this node as it may.
    #[error("uid {uid} already has {jobs} jobs on this node (the limit per uid)")]
    UidJobs { uid: u32, jobs: usize },
}
