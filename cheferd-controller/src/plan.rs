//! The *compute* step of a control cycle, as a pure function: from every stage's usage
//! and the configuration, each job's rate per resource (a policy from the `policies`
//! crate) and each stage's rules.
//!
//! Stages with the same job id on different nodes are one job (PADLL paper §III-B,
//! "orchestrating stages of distributed jobs"). A job's rate is split across its stages
//! in proportion to their recent usage, after an even floor (`stage_floor` of the rate)
//! so an idle stage can ramp up — not the equal split of the C++ Cheferd.
//!
//! A job whose stages run at (≥ 90 % of) their limits is taken to *want* twice what it
//! got (`JobSnapshot::wanted`): the stages cannot report requests they never issued, and
//! policies that lend and borrow (AdapTBF) or fill need (ThemisIO, DRF) must see that the
//! job would use more.

use crate::config::GlobalConfig;
use crate::policy::{JobInput, PolicyRunner};
use crate::proto;
use crate::usage::Resource;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// A stage's usage of one resource.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageUsage {
    /// Tokens/s over the last report interval.
    pub rate: f64,
    /// Its limit (0 = none).
    pub limit: u64,
}

/// What the planner knows of one stage (borrowed from the registry: no copies).
#[derive(Clone, Debug)]
pub struct StageView<'a> {
    /// Its node.
    pub node: &'a str,
    /// Its id at that node.
    pub stage_id: u64,
    /// Job id.
    pub job_id: &'a str,
    /// Owner uid and gid (from `SO_PEERCRED`).
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Nodes of the job, as the stage reports it.
    pub job_size: u32,
    /// Its mountpoints.
    pub mountpoints: &'a [String],
    /// Its usage per resource over the last interval.
    pub usage: Option<&'a HashMap<Resource, StageUsage>>,
}

impl StageView<'_> {
    fn usage_of(&self, resource: &Resource) -> StageUsage {
        self.usage
            .and_then(|u| u.get(resource))
            .copied()
            .unwrap_or_default()
    }
}

/// One job's share of one resource in this cycle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobShare {
    /// Job id.
    pub job: String,
    /// The resource.
    pub resource: Resource,
    /// Usage over the last interval (sum of its stages).
    pub usage: f64,
    /// Its demand (the capacity when not configured).
    pub demand: f64,
    /// Its priority.
    pub priority: f64,
    /// A static limit in force, if any.
    pub static_limit: Option<f64>,
    /// The rate assigned this cycle.
    pub assigned: f64,
    /// Stages of the job using this resource's mountpoint.
    pub stages: usize,
    /// Distinct nodes those stages run on.
    pub nodes: usize,
}

/// The outcome of one compute step.
#[derive(Debug, Default)]
pub struct Plan {
    /// Every (job, resource) share.
    pub shares: Vec<JobShare>,
    /// Rules of each stage, by its index in the input slice.
    pub rules: Vec<Vec<proto::Rule>>,
}

/// Computes a plan. `static_limits` are the static limits in force (configuration and
/// scheduled rules); `policies` holds each resource's policy and its state.
pub fn compute(
    config: &GlobalConfig,
    static_limits: &BTreeMap<(String, Resource), f64>,
    policies: &mut HashMap<Resource, PolicyRunner>,
    stages: &[StageView],
) -> Plan {
    let mut plan = Plan {
        shares: Vec::new(),
        rules: vec![Vec::new(); stages.len()],
    };
    for resource_config in &config.resources {
        let resource = &resource_config.resource;
        let max_rate = resource_config.max_rate;
        // Jobs (in id order: deterministic) and the indices of their stages here.
        let mut jobs: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, stage) in stages.iter().enumerate() {
            if stage.mountpoints.contains(&resource.mount) {
                jobs.entry(stage.job_id).or_default().push(i);
            }
        }
        if jobs.is_empty() {
            continue;
        }
        let mut shares = Vec::with_capacity(jobs.len());
        let mut inputs = Vec::with_capacity(jobs.len());
        let mut dynamic = Vec::with_capacity(jobs.len());
        for (job, members) in &jobs {
            let settings = config.jobs.get(*job);
            let node_count = if members.len() == 1 {
                1
            } else {
                let mut nodes: Vec<&str> = members.iter().map(|&i| stages[i].node).collect();
                nodes.sort_unstable();
                nodes.dedup();
                nodes.len()
            };
            let usage = members.iter().map(|&i| stages[i].usage_of(resource));
            let static_limit = if static_limits.is_empty() {
                None
            } else {
                static_limits
                    .get(&(job.to_string(), resource.clone()))
                    .copied()
            };
            let share = JobShare {
                job: job.to_string(),
                resource: resource.clone(),
                usage: usage.clone().map(|u| u.rate).sum(),
                demand: settings
                    .and_then(|s| s.demand.get(resource))
                    .copied()
                    .unwrap_or(max_rate),
                priority: settings.map_or(1.0, |s| s.priority),
                static_limit,
                assigned: 0.0,
                stages: members.len(),
                nodes: node_count,
            };
            if share.static_limit.is_none() {
                let first = &stages[members[0]];
                dynamic.push(shares.len());
                inputs.push(JobInput {
                    id: job,
                    uid: first.uid,
                    gid: first.gid,
                    size: members
                        .iter()
                        .map(|&i| stages[i].job_size)
                        .max()
                        .unwrap_or(1)
                        .max(share.nodes as u32),
                    priority: share.priority,
                    demand: share.demand,
                    usage: share.usage,
                    wanted: usage
                        .map(|u| {
                            if u.limit > 0 && u.rate >= 0.9 * u.limit as f64 {
                                2.0 * u.rate
                            } else {
                                u.rate
                            }
                        })
                        .sum(),
                });
            }
            shares.push(share);
        }

        // Static limits are fixed; the policy shares what they leave.
        let reserved: f64 = shares.iter().filter_map(|s| s.static_limit).sum();
        let rates = match policies.get_mut(resource) {
            Some(policy) => policy.allocate((max_rate - reserved).max(0.0), &inputs),
            None => vec![0.0; inputs.len()],
        };
        for (&i, rate) in dynamic.iter().zip(rates) {
            shares[i].assigned = rate.max(0.0);
        }
        for share in &mut shares {
            if let Some(limit) = share.static_limit {
                share.assigned = limit;
            }
        }

        let mut usage = Vec::new();
        for (share, members) in shares.iter().zip(jobs.values()) {
            usage.clear();
            usage.extend(members.iter().map(|&i| stages[i].usage_of(resource).rate));
            for (&i, rate) in members
                .iter()
                .zip(split(share.assigned, &usage, config.stage_floor))
            {
                let rate = rate
                    .round()
                    .clamp(1.0, padll_wire::channel::MAX_RATE as f64)
                    as u64;
                plan.rules[i].push(proto::Rule {
                    mount: resource.mount.clone(),
                    class: resource.class.name().to_string(),
                    rate,
                    bytes: resource.counts_bytes(),
                    burst: ((rate as u128 * config.burst_ms as u128) / 1000).max(1) as u64,
                });
            }
        }
        plan.shares.extend(shares);
    }
    plan
}

/// Splits a job's rate over its stages: `floor` of it evenly, the rest in proportion to
/// each stage's usage (evenly too when none used anything).
pub fn split(rate: f64, usage: &[f64], floor: f64) -> Vec<f64> {
    let n = usage.len() as f64;
    let total: f64 = usage.iter().map(|u| u.max(0.0)).sum();
    usage
        .iter()
        .map(|u| {
            let proportional = if total > 0.0 {
                u.max(0.0) / total
            } else {
                1.0 / n
            };
            rate * (floor / n + (1.0 - floor) * proportional)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ResourceConfig;

    fn metadata() -> Resource {
        Resource::parse("/scratch:metadata").unwrap()
    }

    struct Owned {
        node: String,
        id: u64,
        job: String,
        mounts: Vec<String>,
        usage: HashMap<Resource, StageUsage>,
    }

    fn stage(node: &str, id: u64, job: &str, rate: f64, limit: u64) -> Owned {
        Owned {
            node: node.into(),
            id,
            job: job.into(),
            mounts: vec!["/scratch".into()],
            usage: HashMap::from([(metadata(), StageUsage { rate, limit })]),
        }
    }

    fn views(owned: &[Owned]) -> Vec<StageView<'_>> {
        owned
            .iter()
            .map(|o| StageView {
                node: &o.node,
                stage_id: o.id,
                job_id: &o.job,
                uid: 1000,
                gid: 1000,
                job_size: 1,
                mountpoints: &o.mounts,
                usage: Some(&o.usage),
            })
            .collect()
    }

    fn config(policy: &str) -> GlobalConfig {
        GlobalConfig {
            resources: vec![ResourceConfig {
                resource: metadata(),
                max_rate: 1000.0,
                policy: policy.into(),
            }],
            ..GlobalConfig::default()
        }
    }

    fn policies(config: &GlobalConfig) -> HashMap<Resource, PolicyRunner> {
        config
            .resources
            .iter()
            .map(|r| (r.resource.clone(), PolicyRunner::new(&r.policy).unwrap()))
            .collect()
    }

    #[test]
    fn jobs_span_nodes_and_rates_follow_usage() {
        let config = config("uniform");
        let owned = vec![
            stage("n1", 1, "a", 300.0, 0),
            stage("n2", 7, "a", 100.0, 0),
            stage("n1", 2, "b", 0.0, 0),
        ];
        let plan = compute(
            &config,
            &BTreeMap::new(),
            &mut policies(&config),
            &views(&owned),
        );
        let a = plan.shares.iter().find(|s| s.job == "a").unwrap();
        assert_eq!((a.stages, a.nodes, a.usage), (2, 2, 400.0));
        // Uniform: 500 each; job a's 500 split 10 % evenly, 90 % by usage (3:1).
        assert_eq!(a.assigned, 500.0);
        assert_eq!((plan.rules[0][0].rate, plan.rules[1][0].rate), (363, 138));
        assert_eq!(plan.rules[2][0].rate, 500);
        let total: u64 = plan.rules.iter().flatten().map(|r| r.rate).sum();
        assert!(total <= 1001, "{total}");
    }

    #[test]
    fn psfa_shares_by_demand_and_conserves_work() {
        let mut config = config("psfa");
        config.jobs.insert(
            "small".into(),
            crate::config::JobConfig {
                priority: 1.0,
                demand: [(metadata(), 100.0)].into(),
                ..Default::default()
            },
        );
        let owned = vec![
            stage("n1", 1, "small", 100.0, 100),
            stage("n1", 2, "big", 900.0, 900),
        ];
        let plan = compute(
            &config,
            &BTreeMap::new(),
            &mut policies(&config),
            &views(&owned),
        );
        let total: f64 = plan.shares.iter().map(|s| s.assigned).sum();
        assert!((total - 1000.0).abs() < 1.0, "{:?}", plan.shares);
        let small = plan
            .shares
            .iter()
            .find(|s| s.job == "small")
            .unwrap()
            .assigned;
        assert!(small >= 99.0, "{small}");
    }

    #[test]
    fn static_limits_are_kept_and_the_rest_is_shared() {
        let config = config("uniform");
        let owned = vec![stage("n1", 1, "a", 10.0, 0), stage("n1", 2, "b", 10.0, 0)];
        let limits = BTreeMap::from([(("a".to_string(), metadata()), 100.0)]);
        let plan = compute(&config, &limits, &mut policies(&config), &views(&owned));
        let rate = |job: &str| plan.shares.iter().find(|s| s.job == job).unwrap().assigned;
        assert_eq!((rate("a"), rate("b")), (100.0, 900.0));
    }

    #[test]
    fn stages_off_the_mountpoint_get_no_rules() {
        let config = config("uniform");
        let mut other = stage("n1", 3, "c", 0.0, 0);
        other.mounts = vec!["/home".into()];
        let plan = compute(
            &config,
            &BTreeMap::new(),
            &mut policies(&config),
            &views(&[other]),
        );
        assert!(plan.shares.is_empty());
        assert!(plan.rules[0].is_empty());
    }

    #[test]
    fn split_floor_and_idle_stages() {
        assert_eq!(split(100.0, &[0.0, 0.0], 0.1), vec![50.0, 50.0]);
        let parts = split(100.0, &[10.0, 0.0], 0.2);
        assert_eq!(parts, vec![90.0, 10.0]);
    }
}
