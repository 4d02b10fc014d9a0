//! Administrative changes (`cheferd ctl set-…`): a resource's policy or capacity, a
//! job's priority, demand or static limit.

use super::{Controller, State};
use crate::config::{rate_of, RateOfError, Resource, ResourceError, ResourceRate};
use crate::policy::PolicyRunner;
use serde::Serialize;

impl Controller {
    /// Applies an administrative change (checked first; nothing changes on error). A
    /// standby refuses it; a leader records it for the next one (`crate::standby`).
    pub fn change(&self, change: Change) -> Result<String, ChangeRefused> {
        self.leadership
            .record(&change, || self.apply(&change, true))
    }

    /// Applies a change an earlier leader made (`crate::standby::persist`): as
    /// [`Controller::change`], but a job need not be known yet (its stages have not
    /// re-registered with this controller).
    pub fn restore(&self, mut change: Change) -> Result<String, ChangeError> {
        // Folds once split `set-job J --priority P --resource R --demand D` into a
        // priority that still named R: etcd may hold that form; R means nothing there.
        if let Change::Job {
            priority: Some(_),
            resource,
            demand: None,
            limit: None,
            ..
        } = &mut change
        {
            *resource = None;
        }
        self.apply(&change, false)
    }

    fn apply(&self, change: &Change, job_must_be_known: bool) -> Result<String, ChangeError> {
        let checked = change.checked()?;
        let mut state = self.lock();
        match checked {
            Checked::Policy {
                resource,
                policy,
                runner,
            } => {
                configured(&state, &resource)?;
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
            Checked::MaxRate { resource, rate } => {
                configured(&state, &resource)?;
                let i = state
                    .config
                    .resources
                    .iter()
                    .position(|r| r.resource == resource)
                    .unwrap_or_default();
                let State {
                    config, steering, ..
                } = &mut *state;
                match rate {
                    Some(rate) => {
                        let was_auto = steering.steers(i);
                        steering.stop(i);
                        config.resources[i].max_rate = rate;
                        Ok(if was_auto {
                            format!("{resource}: Max_R {rate}, static from now on (set-max-rate {resource} auto: steered by its service times again)")
                        } else {
                            format!("{resource}: Max_R {rate}")
                        })
                    }
                    None if steering.restart(config, i) => Ok(format!(
                        "{resource}: Max_R auto, from its ceiling {}",
                        config.resources[i].max_rate
                    )),
                    None => Err(ChangeError::NotAuto(resource)),
                }
            }
            Checked::Job {
                job,
                priority,
                terms,
            } => {
                // A typo must not silently configure a job that will never run.
                let known = !job_must_be_known
                    || state.config.jobs.contains_key(&job)
                    || state
                        .nodes
                        .values()
                        .any(|n| n.stages.values().any(|s| s.stage.job_id == job));
                if !known {
                    return Err(ChangeError::UnknownJob(job));
                }
                let mut settings = state.config.job(&job);
                if let Some(p) = priority {
                    settings.priority = p;
                }
                if let Some((resource, demand, limit)) = terms {
                    configured(&state, &resource)?;
                    if let Some(d) = demand {
                        settings.demand.insert(resource.clone(), d);
                    }
                    match limit {
                        Some(Some(l)) => settings.limit.insert(resource, l),
                        Some(None) => settings.limit.remove(&resource),
                        None => None,
                    };
                }
                state.config.jobs.insert(job.clone(), settings);
                Ok(format!("job {} updated", padll_wire::quote(&job)))
            }
        }
    }
}

/// `Ok` if the controller shares `resource`.
fn configured(state: &State, resource: &Resource) -> Result<(), ChangeError> {
    if state
        .config
        .resources
        .iter()
        .any(|r| &r.resource == resource)
    {
        Ok(())
    } else {
        Err(ChangeError::NotConfigured(resource.clone()))
    }
}

/// A change with its values parsed and checked.
enum Checked {
    Policy {
        resource: Resource,
        policy: String,
        runner: PolicyRunner,
    },
    MaxRate {
        resource: Resource,
        /// `None`: `auto`.
        rate: Option<ResourceRate>,
    },
    Job {
        job: String,
        priority: Option<f64>,
        /// The resource with a new demand and a new static limit (`Some(None)`: lifted).
        terms: Option<(Resource, Option<ResourceRate>, Option<Option<ResourceRate>>)>,
    },
}

/// Why [`Controller::change`] refused a change.
#[derive(Debug, thiserror::Error)]
pub enum ChangeRefused {
    /// This controller stands by; the leader's URL, if known.
    #[error(
        "this global controller is a standby; make changes on the leader ({})",
        .leader.as_deref().unwrap_or("not elected yet")
    )]
    Standby {
        /// The leader's URL.
        leader: Option<String>,
    },
    /// The change itself is wrong.
    #[error(transparent)]
    Invalid(#[from] ChangeError),
}

/// A change refused: one line naming the bad value.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// A resource name that is no `MOUNT:CLASS`.
    #[error(transparent)]
    BadResource(#[from] ResourceError),
    /// A policy name that builds no policy.
    #[error(transparent)]
    BadPolicy(#[from] policies::SpecError),
    /// A rate that is no rate, or of the wrong unit for its resource.
    #[error(transparent)]
    BadRate(#[from] RateOfError),
    /// `set-job` with nothing to change (the job id).
    #[error("set-job {}: nothing to change: give --priority P, or --resource R with --demand D or --limit L|none", padll_wire::escape(.0))]
    NothingToChange(String),
    /// A priority out of range (`policies::PRIORITY_RANGE`).
    #[error("--priority {0}: {range}", range = policies::PRIORITY_RANGE)]
    BadPriority(f64),
    /// `--resource` without `--demand` or `--limit`.
    #[error("--resource {0} needs --demand or --limit (what to change on it)")]
    NoTerms(Resource),
    /// `--demand` or `--limit` without `--resource`.
    #[error("--resource is needed with --demand or --limit")]
    NoResource,
    /// A resource the controller does not share.
    #[error("'{0}' is not a configured resource")]
    NotConfigured(Resource),
    /// `set-max-rate R auto` for a resource configured without `max_rate = "auto"`.
    #[error("{0} has no latency target to steer by: configure it with max_rate = \"auto\" (and target_p50_ms or target_p99_ms, floor, ceiling)")]
    NotAuto(Resource),
    /// A job neither configured nor running (a typo must not configure a job that
    /// will never run).
    #[error("unknown job {}: it is neither configured nor running (add it to the configuration file to set it before it starts)", padll_wire::quote(.0))]
    UnknownJob(String),
}

impl Change {
    /// Checks every value the change carries (resource names, the policy, rates and
    /// their units, the priority), naming the bad one. What only the running controller
    /// can judge — whether it shares the resource, whether the job exists — is checked
    /// when [`Controller::change`] applies it. `cheferd ctl` checks before it sends.
    pub fn check(&self) -> Result<(), ChangeError> {
        self.checked().map(|_| ())
    }

    fn checked(&self) -> Result<Checked, ChangeError> {
        Ok(match self {
            Change::Policy { resource, policy } => Checked::Policy {
                resource: Resource::parse(resource)?,
                policy: policy.clone(),
                runner: PolicyRunner::new(policy)?,
            },
            Change::MaxRate { resource, rate } => {
                let resource = Resource::parse(resource)?;
                Checked::MaxRate {
                    rate: match rate.as_str() {
                        "auto" => None,
                        rate => Some(rate_of("rate", rate, &resource)?),
                    },
                    resource,
                }
            }
            Change::Job {
                job,
                priority,
                resource,
                demand,
                limit,
            } => {
                if priority.is_none() && demand.is_none() && limit.is_none() {
                    return Err(ChangeError::NothingToChange(job.clone()));
                }
                if let Some(p) = priority.filter(|p| !policies::priority_ok(*p)) {
                    return Err(ChangeError::BadPriority(p));
                }
                let resource = resource.as_deref().map(Resource::parse).transpose()?;
                let terms = match resource {
                    Some(r) if demand.is_none() && limit.is_none() => {
                        return Err(ChangeError::NoTerms(r))
                    }
                    Some(r) => {
                        let demand = demand.as_deref().map(|d| rate_of("--demand", d, &r));
                        let limit = match limit.as_deref() {
                            Some("none") => Some(None),
                            Some(l) => Some(Some(rate_of("--limit", l, &r)?)),
                            None => None,
                        };
                        Some((r, demand.transpose()?, limit))
                    }
                    None if demand.is_some() || limit.is_some() => {
                        return Err(ChangeError::NoResource)
                    }
                    None => None,
                };
                Checked::Job {
                    job: job.clone(),
                    priority: *priority,
                    terms,
                }
            }
        })
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
