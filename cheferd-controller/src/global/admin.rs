//! Administrative changes (`cheferd ctl set-…`): a resource's policy or capacity, a
//! job's priority, demand or static limit.

use super::{Controller, State};
use crate::policy::PolicyRunner;
use crate::usage::Resource;
use serde::Serialize;

impl Controller {
    /// Applies an administrative change (validated first; nothing changes on error).
    pub fn change(&self, change: Change) -> Result<String, String> {
        let mut state = self.lock();
        let find = |state: &State, name: &str| -> Result<Resource, String> {
            let resource = Resource::parse(name)?;
            if state
                .config
                .resources
                .iter()
                .any(|r| r.resource == resource)
            {
                Ok(resource)
            } else {
                Err(format!("'{name}' is not a configured resource"))
            }
        };
        match change {
            Change::Policy { resource, policy } => {
                let resource = find(&state, &resource)?;
                let runner = PolicyRunner::new(&policy)?;
                state.policies.insert(resource.clone(), runner);
                for r in state
                    .config
                    .resources
                    .iter_mut()
                    .filter(|r| r.resource == resource)
                {
                    r.policy = policy.clone();
                }
                Ok(format!("{resource}: policy {policy}"))
            }
            Change::MaxRate { resource, rate } => {
                let resource = find(&state, &resource)?;
                let value = crate::config::rate_of("max_rate", &rate, &resource)?;
                for r in state
                    .config
                    .resources
                    .iter_mut()
                    .filter(|r| r.resource == resource)
                {
                    r.max_rate = value;
                }
                Ok(format!("{resource}: Max_R {value}"))
            }
            Change::Job {
                job,
                priority,
                resource,
                demand,
                limit,
            } => {
                // A typo must not silently configure a job that will never run.
                let known = state.config.jobs.contains_key(&job)
                    || state
                        .nodes
                        .values()
                        .any(|n| n.stages.values().any(|s| s.stage.job_id == job));
                if !known {
                    return Err(format!(
                        "unknown job '{job}': it is neither configured nor running (add it to the configuration file to set it before it starts)"
                    ));
                }
                let mut settings = state.config.job(&job);
                if let Some(p) = priority {
                    if !(p > 0.0 && p.is_finite()) {
                        return Err(format!("priority {p} must be positive"));
                    }
                    settings.priority = p;
                }
                if demand.is_some() || limit.is_some() {
                    let name = resource.ok_or("--resource is needed with --demand or --limit")?;
                    let r = find(&state, &name)?;
                    if let Some(d) = demand {
                        settings
                            .demand
                            .insert(r.clone(), crate::config::rate_of("demand", &d, &r)?);
                    }
                    match limit.as_deref() {
                        Some("none") => {
                            settings.limit.remove(&r);
                        }
                        Some(l) => {
                            let value = crate::config::rate_of("limit", l, &r)?;
                            settings.limit.insert(r, value);
                        }
                        None => {}
                    }
                }
                state.config.jobs.insert(job.clone(), settings);
                Ok(format!("job {job} updated"))
            }
        }
    }
}

/// An administrative change.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
#[serde(tag = "change", rename_all = "snake_case", deny_unknown_fields)]
pub enum Change {
    /// Switch a resource's policy (its state starts afresh).
    Policy {
        /// `MOUNT:CLASS`.
        resource: String,
        /// Policy name.
        policy: String,
    },
    /// Change a resource's capacity.
    MaxRate {
        /// `MOUNT:CLASS`.
        resource: String,
        /// A rate (`110k`, `20GiB/s`).
        rate: String,
    },
    /// Change a job's priority, or its demand / static limit on a resource.
    Job {
        /// Job id.
        job: String,
        /// New priority.
        priority: Option<f64>,
        /// The resource for `demand` / `limit`.
        resource: Option<String>,
        /// New demand.
        demand: Option<String>,
        /// New static limit, or `none`.
        limit: Option<String>,
    },
}
