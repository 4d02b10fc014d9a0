//! The *compute* step of a control cycle, as a pure function: from every stage's usage
//! and the configuration, each job's rate per resource (a policy from the `policies`
//! crate) and each stage's rules.
//!
//! Stages with the same job id on different nodes are one job (PADLL paper §III-B,
//! "orchestrating stages of distributed jobs"). A job's rate is split across its stages
//! in proportion to their recent usage, after an even floor (`stage_floor` of the rate)
//! so an idle stage can ramp up — not the equal split of the C++ Cheferd.

use crate::config::GlobalConfig;
use crate::policy::{JobInput, PolicyRunner};
use crate::proto;
use crate::usage::Resource;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// What the planner knows of one stage.
#[derive(Clone, Debug)]
pub struct StageView {
    /// Its node.
    pub node: String,
    /// Its id at that node.
    pub stage_id: u64,
    /// Job, user, account, size.
    pub job_id: String,
    /// Owner uid and gid (from `SO_PEERCRED`).
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Nodes of the job, as the stage reports it.
    pub job_size: u32,
    /// Its mountpoints.
    pub mountpoints: Vec<String>,
    /// Its usage rate per resource over the last interval.
    pub usage: HashMap<Resource, f64>,
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
    /// Rules per (node, stage id).
    pub rules: BTreeMap<(String, u64), Vec<proto::Rule>>,
}

/// Computes a plan. `static_limits` are the static limits in force (configuration and
/// scheduled rules); `policies` holds each resource's policy and its state.
pub fn compute(
    config: &GlobalConfig,
    static_limits: &BTreeMap<(String, Resource), f64>,
    policies: &mut HashMap<Resource, PolicyRunner>,
    stages: &[StageView],
) -> Plan {
    let mut plan = Plan::default();
    for (stage_key, _) in stages.iter().map(|s| ((s.node.clone(), s.stage_id), ())) {
        plan.rules.entry(stage_key).or_default();
    }
    for resource_config in &config.resources {
        let resource = &resource_config.resource;
        let max_rate = resource_config.max_rate;
        // Jobs (in id order: deterministic) and their stages on this mountpoint.
        let mut jobs: BTreeMap<&str, Vec<&StageView>> = BTreeMap::new();
        for stage in stages
            .iter()
            .filter(|s| s.mountpoints.iter().any(|m| *m == resource.mount))
        {
            jobs.entry(stage.job_id.as_str()).or_default().push(stage);
        }
        if jobs.is_empty() {
            continue;
        }
        let mut shares: Vec<JobShare> = jobs
            .iter()
            .map(|(job, members)| {
                let settings = config.job(job);
                let mut nodes: Vec<&str> = members.iter().map(|s| s.node.as_str()).collect();
                nodes.sort_unstable();
                nodes.dedup();
                JobShare {
                    job: job.to_string(),
                    resource: resource.clone(),
                    usage: members
                        .iter()
                        .map(|s| s.usage.get(resource).copied().unwrap_or(0.0))
                        .sum(),
                    demand: settings.demand.get(resource).copied().unwrap_or(max_rate),
                    priority: settings.priority,
                    static_limit: static_limits
                        .get(&(job.to_string(), resource.clone()))
                        .copied(),
                    assigned: 0.0,
                    stages: members.len(),
                    nodes: nodes.len(),
                }
            })
            .collect();

        // Static limits are fixed; the policy shares what they leave.
        let reserved: f64 = shares.iter().filter_map(|s| s.static_limit).sum();
        let dynamic: Vec<usize> = (0..shares.len())
            .filter(|i| shares[*i].static_limit.is_none())
            .collect();
        let inputs: Vec<JobInput> = dynamic
            .iter()
            .map(|&i| {
                let share = &shares[i];
                let first = jobs[share.job.as_str()][0];
                JobInput {
                    id: share.job.clone(),
                    uid: first.uid,
                    gid: first.gid,
                    size: jobs[share.job.as_str()]
                        .iter()
                        .map(|s| s.job_size)
                        .max()
                        .unwrap_or(1)
                        .max(share.nodes as u32),
                    priority: share.priority,
                    demand: share.demand,
                    usage: share.usage,
                }
            })
            .collect();
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

        for share in &shares {
            let members = &jobs[share.job.as_str()];
            for (stage, rate) in
                members
                    .iter()
                    .zip(split(share.assigned, members, resource, config.stage_floor))
            {
                let rate = rate
                    .round()
                    .clamp(1.0, padll_wire::channel::MAX_RATE as f64)
                    as u64;
                plan.rules
                    .entry((stage.node.clone(), stage.stage_id))
                    .or_default()
                    .push(proto::Rule {
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
pub fn split(rate: f64, stages: &[&StageView], resource: &Resource, floor: f64) -> Vec<f64> {
    let n = stages.len() as f64;
    let usage: Vec<f64> = stages
        .iter()
        .map(|s| s.usage.get(resource).copied().unwrap_or(0.0).max(0.0))
        .collect();
    let total: f64 = usage.iter().sum();
    usage
        .iter()
        .map(|u| {
            let proportional = if total > 0.0 { u / total } else { 1.0 / n };
            rate * (floor / n + (1.0 - floor) * proportional)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ResourceConfig;

    fn stage(node: &str, id: u64, job: &str, usage: f64) -> StageView {
        StageView {
            node: node.into(),
            stage_id: id,
            job_id: job.into(),
            uid: 1000,
            gid: 1000,
            job_size: 1,
            mountpoints: vec!["/scratch".into()],
            usage: HashMap::from([(Resource::parse("/scratch:metadata").unwrap(), usage)]),
        }
    }

    fn config(policy: &str) -> GlobalConfig {
        GlobalConfig {
            resources: vec![ResourceConfig {
                resource: Resource::parse("/scratch:metadata").unwrap(),
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
        let stages = vec![
            stage("n1", 1, "a", 300.0),
            stage("n2", 7, "a", 100.0),
            stage("n1", 2, "b", 0.0),
        ];
        let plan = compute(&config, &BTreeMap::new(), &mut policies(&config), &stages);
        let a = plan.shares.iter().find(|s| s.job == "a").unwrap();
        assert_eq!((a.stages, a.nodes, a.usage), (2, 2, 400.0));
        // Uniform: 500 each; job a's 500 split 10 % evenly, 90 % by usage (3:1).
        assert_eq!(a.assigned, 500.0);
        let r1 = plan.rules[&("n1".to_string(), 1)][0].rate;
        let r7 = plan.rules[&("n2".to_string(), 7)][0].rate;
        assert_eq!((r1, r7), (363, 138));
        assert_eq!(plan.rules[&("n1".to_string(), 2)][0].rate, 500);
        let total: u64 = plan.rules.values().flatten().map(|r| r.rate).sum();
        assert!(total <= 1001, "{total}");
    }

    #[test]
    fn static_limits_are_kept_and_the_rest_is_shared() {
        let config = config("uniform");
        let stages = vec![stage("n1", 1, "a", 10.0), stage("n1", 2, "b", 10.0)];
        let limits = BTreeMap::from([(
            (
                "a".to_string(),
                Resource::parse("/scratch:metadata").unwrap(),
            ),
            100.0,
        )]);
        let plan = compute(&config, &limits, &mut policies(&config), &stages);
        let rate = |job: &str| plan.shares.iter().find(|s| s.job == job).unwrap().assigned;
        assert_eq!((rate("a"), rate("b")), (100.0, 900.0));
    }

    #[test]
    fn stages_off_the_mountpoint_get_no_rules() {
        let config = config("uniform");
        let mut other = stage("n1", 3, "c", 0.0);
        other.mountpoints = vec!["/home".into()];
        let plan = compute(&config, &BTreeMap::new(), &mut policies(&config), &[other]);
        assert!(plan.shares.is_empty());
        assert!(plan.rules[&("n1".to_string(), 3)].is_empty());
    }
}
