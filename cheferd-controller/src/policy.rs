//! The controller's side of the `policies` crate: builds policies by name and feeds them
//! job snapshots. Job ids (strings from the batch system) are interned to the numeric
//! ids the policies key their state by, stable for the controller's lifetime.

use padll_wire::channel::MAX_RATE;
use std::collections::HashMap;

/// What the planner tells a policy about one job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobInput<'a> {
    /// Job id as the stages report it.
    pub id: &'a str,
    /// Owner's uid (as the kernel reported it for the job's first stage).
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Nodes of the job.
    pub size: u32,
    /// Priority / weight.
    pub priority: f64,
    /// Demand (reservation), tokens/s.
    pub demand: f64,
    /// Usage over the last interval, tokens/s.
    pub usage: f64,
    /// What it would have used (≥ usage; see `plan`).
    pub wanted: f64,
}

/// One resource's policy, with its state and the job-id interning table.
pub struct PolicyRunner {
    policy: Box<dyn policies::Policy>,
    ids: HashMap<String, u64>,
    snapshots: Vec<policies::JobSnapshot>,
    rates: Vec<f64>,
}

impl PolicyRunner {
    /// Builds the named policy (`psfa`, `adaptbf`, `themis:group,user,size`, …).
    pub fn new(name: &str) -> Result<PolicyRunner, String> {
        let policy = policies::build(name).map_err(|e| e.to_string())?;
        Ok(PolicyRunner {
            policy,
            ids: HashMap::new(),
            snapshots: Vec::new(),
            rates: Vec::new(),
        })
    }

    /// The policy's name.
    pub fn name(&self) -> String {
        self.policy.name()
    }

    /// One rate per job, in order, each within `0..=MAX_RATE` (the baseline's
    /// "unlimited" becomes the largest representable rate).
    pub fn allocate(&mut self, max_rate: f64, jobs: &[JobInput]) -> Vec<f64> {
        self.snapshots.clear();
        for job in jobs {
            let id = match self.ids.get(job.id) {
                Some(id) => *id,
                None => {
                    let id = self.ids.len() as u64 + 1;
                    self.ids.insert(job.id.to_string(), id);
                    id
                }
            };
            let mut snapshot = policies::JobSnapshot::new(id, job.demand, job.usage);
            snapshot.user = job.uid;
            snapshot.group = job.gid;
            snapshot.size = job.size.max(1);
            snapshot.priority = job.priority;
            snapshot.wanted = Some(job.wanted.max(job.usage));
            self.snapshots.push(snapshot);
        }
        self.policy
            .allocate_into(max_rate, &self.snapshots, &mut self.rates);
        self.rates
            .iter()
            .map(|r| {
                if r.is_finite() {
                    r.clamp(0.0, MAX_RATE as f64)
                } else {
                    MAX_RATE as f64
                }
            })
            .collect()
    }
}

/// `Ok` if `name` builds a policy, else the reason (naming the bad value).
pub fn check(name: &str) -> Result<(), String> {
    policies::build(name).map(|_| ()).map_err(|e| e.to_string())
}
