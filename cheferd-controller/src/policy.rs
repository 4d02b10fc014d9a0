//! The controller's side of the `policies` crate: builds policies by name and feeds them
//! job snapshots. Jobs come as the global controller's interned keys (stable while the
//! job runs), which the policies key their state by.

use padll_wire::channel::MAX_RATE;

/// A job id, interned: dense from 0, stable while a stage or orphan of the job is left
/// (the global controller's `jobs` module interns them, and gives a released key to
/// another job only after a cycle planned without the first; policies key their state
/// by it).
pub type JobKey = u32;

/// What the planner tells a policy about one job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobInput {
    /// The job's interned key.
    pub id: JobKey,
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

/// One resource's policy, with its state and buffers reused across cycles.
pub struct PolicyRunner {
    policy: Box<dyn policies::Policy>,
    /// The policy divides the capacity by what jobs use (PSFA and PSharing, PADLL
    /// §IV-B): jobs without I/O are left out of it (see `plan::IDLE_SHARE`). The static
    /// policies share by job, size or priority whatever the load, and AdapTBF keeps
    /// per-job records across cycles and handles idle jobs itself.
    by_usage: bool,
    snapshots: Vec<policies::JobSnapshot>,
    rates: Vec<f64>,
}

impl PolicyRunner {
    /// Builds the named policy (`psfa`, `adaptbf`, `themis:group,user,size`, …).
    pub fn new(name: &str) -> Result<PolicyRunner, policies::SpecError> {
        let policy = policies::build(name)?;
        let family = name.split(':').next().unwrap_or_default();
        Ok(PolicyRunner {
            by_usage: matches!(family, "psfa" | "psharing"),
            policy,
            snapshots: Vec::new(),
            rates: Vec::new(),
        })
    }

    /// The policy's name.
    pub fn name(&self) -> String {
        self.policy.name()
    }

    /// The state the policy carries between cycles (`null` for most; AdapTBF's records).
    pub fn state(&self) -> serde_json::Value {
        self.policy.state()
    }

    /// Restores a state [`PolicyRunner::state`] gave.
    pub fn load_state(&mut self, state: &serde_json::Value) -> Result<(), policies::StateError> {
        self.policy.load_state(state)
    }

    /// Whether the policy shares by usage among active jobs only (see
    /// `plan::IDLE_SHARE`).
    pub fn by_usage(&self) -> bool {
        self.by_usage
    }

    /// One rate per job, in order, each within `0..=MAX_RATE` (the baseline's
    /// "unlimited" becomes the largest representable rate).
    pub fn allocate(&mut self, max_rate: f64, jobs: &[JobInput]) -> &[f64] {
        self.snapshots.clear();
        for job in jobs {
            let mut snapshot = policies::JobSnapshot::new(job.id.into(), job.demand, job.usage);
            snapshot.user = job.uid;
            snapshot.group = job.gid;
            snapshot.size = job.size.max(1);
            snapshot.priority = job.priority;
            snapshot.wanted = Some(job.wanted.max(job.usage));
            self.snapshots.push(snapshot);
        }
        self.policy
            .allocate_into(max_rate, &self.snapshots, &mut self.rates);
        for rate in &mut self.rates {
            *rate = if rate.is_finite() {
                rate.clamp(0.0, MAX_RATE as f64)
            } else {
                MAX_RATE as f64
            };
        }
        &self.rates
    }
}

/// `Ok` if `name` builds a policy, else the reason (naming the bad value).
pub fn check(name: &str) -> Result<(), policies::SpecError> {
    policies::build(name).map(|_| ())
}
