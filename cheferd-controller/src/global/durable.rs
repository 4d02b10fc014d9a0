//! The policies' state a leader hands to the next one (`crate::standby`): AdapTBF's
//! records, remainders and last allocations, its jobs named by id (each controller
//! interns job ids to keys of its own, `jobs.rs`).

use super::Controller;
use policies::adaptbf::{AdaptbfState, JobEntry};
use serde::{Deserialize, Serialize};

/// One resource's policy state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyState {
    /// `MOUNT:CLASS`.
    pub resource: String,
    /// The policy it belongs to (loaded only into the same policy).
    pub policy: String,
    /// Its jobs, in the policy's order.
    pub jobs: Vec<SavedJob>,
}

/// One job's AdapTBF entry ([`JobEntry`]), named by its id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedJob {
    /// The job id.
    pub job: String,
    /// Tokens lent (> 0) or borrowed (< 0) so far.
    pub record: i64,
    /// Fractional token carried to the next allocation.
    pub remainder: f64,
    /// Tokens allocated in the last cycle.
    pub allocated: u64,
}

impl Controller {
    /// The state of every resource whose policy keeps one across cycles (AdapTBF), in
    /// resource order.
    pub fn policy_states(&self) -> Vec<PolicyState> {
        let state = self.lock();
        let mut saved: Vec<PolicyState> = state
            .policies
            .iter()
            .filter_map(|(resource, runner)| {
                let kept: AdaptbfState = serde_json::from_value(runner.state()).ok()?;
                let jobs = kept
                    .jobs
                    .into_iter()
                    .filter_map(|entry| {
                        let name = state.jobs.name_of(u32::try_from(entry.id).ok()?)?;
                        Some(SavedJob {
                            job: name.to_string(),
                            record: entry.record,
                            remainder: entry.remainder,
                            allocated: entry.allocated,
                        })
                    })
                    .collect();
                Some(PolicyState {
                    resource: resource.to_string(),
                    policy: runner.name(),
                    jobs,
                })
            })
            .collect();
        saved.sort_by(|a, b| a.resource.cmp(&b.resource));
        saved
    }

    /// Loads states a previous leader saved into the resources that run the same
    /// policy now (the job ids interned here); returns how many were loaded.
    pub fn load_policy_states(&self, saved: Vec<PolicyState>) -> usize {
        let mut state = self.lock();
        let state = &mut *state;
        let mut loaded = 0;
        for saved in saved {
            let Some(runner) = state
                .policies
                .iter_mut()
                .find(|(r, runner)| {
                    r.to_string() == saved.resource && runner.name() == saved.policy
                })
                .map(|(_, runner)| runner)
            else {
                continue;
            };
            let jobs = saved
                .jobs
                .into_iter()
                .map(|job| JobEntry {
                    id: state.jobs.intern(&job.job).into(),
                    record: job.record,
                    remainder: job.remainder,
                    allocated: job.allocated,
                })
                .collect();
            let kept = serde_json::to_value(AdaptbfState { jobs }).unwrap_or_default();
            if runner.load_state(&kept).is_ok() {
                loaded += 1;
            }
        }
        state.restored |= loaded > 0;
        loaded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GlobalConfig;

    fn controller(policy: &str) -> std::sync::Arc<Controller> {
        let text = format!(
            "[[resource]]\nname = \"/scratch:metadata\"\nmax_rate = \"1000\"\npolicy = \"{policy}\"\n"
        );
        Controller::new(GlobalConfig::parse(&text, &crate::policy::check).unwrap()).unwrap()
    }

    fn saved() -> Vec<PolicyState> {
        let entry = |job: &str, record, remainder, allocated| SavedJob {
            job: job.into(),
            record,
            remainder,
            allocated,
        };
        vec![PolicyState {
            resource: "/scratch:metadata".into(),
            policy: "adaptbf".into(),
            jobs: vec![entry("4242", -37, 0.25, 180), entry("77", 37, -0.5, 820)],
        }]
    }

    #[test]
    fn adaptbf_state_moves_to_another_controller_by_job_id() {
        let next = controller("adaptbf");
        // Its keys differ from the last leader's: another job was interned first.
        next.lock().jobs.intern("other");
        assert_eq!(next.load_policy_states(saved()), 1);
        let keys: Vec<u64> = {
            let state = next.lock();
            ["4242", "77"]
                .map(|j| state.jobs.key(j).unwrap().into())
                .to_vec()
        };
        assert_eq!(keys, [1, 2]);
        assert_eq!(next.policy_states(), saved());
    }

    #[tokio::test]
    async fn a_state_outlasts_the_cycles_before_the_nodes_attach() {
        let next = controller("adaptbf");
        assert_eq!(next.load_policy_states(saved()), 1);
        for _ in 0..3 {
            next.cycle().await;
        }
        assert_eq!(next.policy_states(), saved());
        let state = next.lock();
        assert!(state.jobs.key("4242").is_some() && state.jobs.key("77").is_some());
    }

    #[test]
    fn a_state_is_not_loaded_into_another_policy() {
        let next = controller("psfa");
        assert_eq!(next.load_policy_states(saved()), 0);
        assert!(next.policy_states().is_empty());
    }
}
