//! The *compute* step of a control cycle: from every stage's usage and the
//! configuration, each job's rate per resource (a policy from the `policies` crate) and
//! each stage's rate per resource. Deterministic given its inputs and the policies'
//! state, which it advances (AdapTBF keeps records across cycles): it runs once per
//! cycle. It knows nothing of tokio or protobuf.
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
//!
//! It runs every cycle over every stage, so it is O(stages + jobs) and allocates only a
//! few flat vectors: jobs arrive as small integer keys (the global controller interns
//! job ids when a stage joins, and reuses a key once its job is gone) and resources as
//! indices into the configuration.

use crate::config::Resource;
use crate::config::{GlobalConfig, JobConfig};
use crate::policy::{JobInput, JobKey, PolicyRunner};
use crate::prefetch::prefetch;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ops::Range;

/// A stage's usage of one resource.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageUsage {
    /// Tokens/s over the last report interval.
    pub rate: f64,
    /// Its limit (0 = none).
    pub limit: u64,
}

/// What the planner knows of one stage. The global controller keeps these between
/// cycles (see `global`), so they are owned.
#[derive(Clone, Debug)]
pub struct StageView {
    /// Index of its node (equal for stages of the same node).
    pub node: usize,
    /// Its job.
    pub job: JobKey,
    /// Owner uid and gid (from `SO_PEERCRED`).
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Nodes of the job, as the stage reports it.
    pub job_size: u32,
    /// Its mountpoints.
    pub mountpoints: Vec<String>,
    /// Its usage per resource over the last interval, by index into the configured
    /// resources.
    pub usage: Vec<(usize, StageUsage)>,
}

/// Where each stage's usage of each configured resource is, resolved once for a set of
/// stage views (mountpoints and the resources a stage reports do not change while its
/// view is kept): comparing mountpoint strings for every stage and resource was a good
/// part of every cycle. It keeps a copy of that usage, flat: reading it from each
/// view's own vector was a cache miss per stage, half of a cycle at 40 000 stages.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    resources: usize,
    stages: usize,
    /// `slots[stage * resources + resource]`: [`NOT_USED`], [`NO_USAGE`] or the index of
    /// the resource in the stage's `usage`.
    slots: Vec<u32>,
    /// `usage[stage * resources + resource]`: that usage (0 where not used or none).
    usage: Vec<StageUsage>,
}

/// The stage does not use the resource's mountpoint.
const NOT_USED: u32 = u32::MAX;
/// The stage uses the mountpoint but reported no usage of the resource.
const NO_USAGE: u32 = u32::MAX - 1;

impl Layout {
    /// Resolves the resources of `config` for `stages`.
    pub fn new(config: &GlobalConfig, stages: &[StageView]) -> Layout {
        let resources = config.resources.len();
        let mut slots = Vec::with_capacity(stages.len() * resources);
        for stage in stages {
            slots.extend(config.resources.iter().enumerate().map(|(ri, r)| {
                if !stage.mountpoints.contains(&r.resource.mount) {
                    return NOT_USED;
                }
                stage
                    .usage
                    .iter()
                    .position(|&(u, _)| u == ri)
                    .map_or(NO_USAGE, |i| i as u32)
            }));
        }
        let mut layout = Layout {
            resources,
            stages: stages.len(),
            usage: vec![StageUsage::default(); slots.len()],
            slots,
        };
        for i in 0..stages.len() {
            layout.refresh(stages, i);
        }
        layout
    }

    /// Takes stage `i`'s usage from its view again (after a report updated it).
    pub fn refresh(&mut self, stages: &[StageView], i: usize) {
        let row = i * self.resources..(i + 1) * self.resources;
        for (usage, &slot) in self.usage[row.clone()].iter_mut().zip(&self.slots[row]) {
            *usage = match slot {
                NOT_USED | NO_USAGE => StageUsage::default(),
                slot => stages[i].usage[slot as usize].1,
            };
        }
    }

    /// Asks for stage `i`'s row ([`crate::prefetch`]), which [`Layout::refresh`] will
    /// write.
    pub fn prefetch_row(&self, i: usize) {
        let at = i * self.resources;
        if at < self.slots.len() {
            prefetch(&self.slots[at]);
            prefetch(&self.usage[at]);
        }
    }

    /// Whether it was resolved for as many stages and resources.
    pub fn fits(&self, config: &GlobalConfig, stages: &[StageView]) -> bool {
        self.resources == config.resources.len() && self.stages == stages.len()
    }

    /// What resource `ri` served over the last interval: every stage's usage of it.
    pub fn served(&self, ri: usize) -> f64 {
        (0..self.stages)
            .filter_map(|i| self.usage(i, ri))
            .map(|usage| usage.rate)
            .sum()
    }

    /// Stage `i`'s usage of resource `ri`, if it uses its mountpoint.
    fn usage(&self, i: usize, ri: usize) -> Option<StageUsage> {
        let at = i * self.resources + ri;
        (self.slots[at] != NOT_USED).then(|| self.usage[at])
    }
}

/// The per-job terms in force, by job key.
#[derive(Debug, Default)]
pub struct JobTerms<'a> {
    /// Configured settings (priority, demand); none: defaults.
    pub settings: HashMap<JobKey, &'a JobConfig>,
    /// Static limits (configuration and scheduled rules), by job and resource index.
    pub limits: HashMap<(JobKey, usize), f64>,
}

/// One job's share of one resource in this cycle: keyed by [`JobKey`] and resource
/// index in the planner, by name ([`JobShare`]) for the admin CLI and metrics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Share<J = JobKey, R = usize> {
    /// The job.
    pub job: J,
    /// The resource.
    pub resource: R,
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

/// A [`Share`] with names, as the admin CLI and metrics show it.
pub type JobShare = Share<String, Resource>;

impl Share {
    /// This share under the job's id and the resource's name.
    pub fn named(&self, job: &str, resource: &Resource) -> JobShare {
        Share {
            job: job.to_string(),
            resource: resource.clone(),
            usage: self.usage,
            demand: self.demand,
            priority: self.priority,
            static_limit: self.static_limit,
            assigned: self.assigned,
            stages: self.stages,
            nodes: self.nodes,
        }
    }
}

/// The outcome of one compute step.
#[derive(Debug, Default)]
pub struct Plan {
    /// Every (job, resource) share, resource by resource, jobs in key order.
    pub shares: Vec<Share>,
    /// Each stage's rate per resource: `rates[stage * resources + resource]`, 0 where
    /// the stage does not use the resource (a rule's rate is at least 1).
    pub rates: Vec<u64>,
}

impl Plan {
    /// The rates of stage `i` (one per configured resource).
    pub fn stage_rates(&self, i: usize, resources: usize) -> &[u64] {
        &self.rates[i * resources..(i + 1) * resources]
    }
}

/// Computes a plan. `terms` are the jobs' settings and static limits; `policies` holds
/// each resource's policy and its state; `layout` is the stages' [`Layout`], kept between
/// cycles (resolved again here if it does not fit them).
pub fn compute(
    config: &GlobalConfig,
    terms: &JobTerms,
    policies: &mut HashMap<Resource, PolicyRunner>,
    stages: &[StageView],
    layout: &Layout,
) -> Plan {
    let fresh;
    let layout = if layout.fits(config, stages) {
        layout
    } else {
        fresh = Layout::new(config, stages);
        &fresh
    };
    let resources = config.resources.len();
    let (order, by_job) = group_by_job(stages);
    // Sized up front: growing these by doubling copied them over and over.
    let mut plan = Plan {
        shares: Vec::with_capacity(by_job.len() * resources),
        rates: vec![0; stages.len() * resources],
    };
    // Reused for every resource: the members of each job using it with their usage of
    // it (looked up once: the lookup compares mountpoints), flat, and per job (its key
    // and its range in `members`).
    let mut members: Vec<(usize, StageUsage)> = Vec::with_capacity(stages.len());
    let mut jobs: Vec<(JobKey, Range<usize>)> = Vec::with_capacity(by_job.len());
    let mut inputs: Vec<JobInput> = Vec::with_capacity(by_job.len());
    let mut dynamic: Vec<usize> = Vec::with_capacity(by_job.len());
    let mut nodes: Vec<usize> = Vec::new();
    for (ri, resource_config) in config.resources.iter().enumerate() {
        let resource = &resource_config.resource;
        let max_rate = resource_config.max_rate.tokens();
        members.clear();
        jobs.clear();
        for (job, group) in &by_job {
            let start = members.len();
            members.extend(
                order[group.clone()]
                    .iter()
                    .filter_map(|&i| Some((i, layout.usage(i, ri)?))),
            );
            if members.len() > start {
                jobs.push((*job, start..members.len()));
            }
        }
        let first_share = plan.shares.len();
        inputs.clear();
        dynamic.clear();
        for (job, range) in &jobs {
            let group = &members[range.clone()];
            let settings = terms.settings.get(job).copied();
            let node_count = if group.len() == 1 {
                1
            } else {
                nodes.clear();
                nodes.extend(group.iter().map(|&(i, _)| stages[i].node));
                nodes.sort_unstable();
                nodes.dedup();
                nodes.len()
            };
            let usage = group.iter().map(|&(_, u)| u);
            let share = Share {
                job: *job,
                resource: ri,
                usage: usage.clone().map(|u| u.rate).sum(),
                demand: settings
                    .and_then(|s| s.demand.get(resource))
                    .map_or(max_rate, |d| d.tokens()),
                priority: settings.map_or(1.0, |s| s.priority),
                static_limit: terms.limits.get(&(*job, ri)).copied(),
                assigned: 0.0,
                stages: group.len(),
                nodes: node_count,
            };
            if share.static_limit.is_none() {
                let first = &stages[group[0].0];
                dynamic.push(plan.shares.len());
                inputs.push(JobInput {
                    id: *job,
                    uid: first.uid,
                    gid: first.gid,
                    size: group
                        .iter()
                        .map(|&(i, _)| stages[i].job_size)
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
            plan.shares.push(share);
        }

        // Static limits are fixed; the policy shares what they leave.
        let reserved: f64 = plan.shares[first_share..]
            .iter()
            .filter_map(|s| s.static_limit)
            .sum();
        // Called without jobs too: a policy writes off the state of jobs gone from its
        // input (AdapTBF's records), before their keys go to new jobs.
        if let Some(policy) = policies.get_mut(resource) {
            let capacity = (max_rate - reserved).max(0.0);
            let idle = inputs
                .iter()
                .filter(|j| j.usage <= 0.0 && j.wanted <= 0.0)
                .count();
            if idle == 0 || idle == inputs.len() || !policy.by_usage() {
                let rates = policy.allocate(capacity, &inputs);
                for (&i, rate) in dynamic.iter().zip(rates) {
                    plan.shares[i].assigned = rate.max(0.0);
                }
            } else {
                // Under PSFA and PSharing, jobs that did no I/O in the last interval are
                // not active (PADLL Alg. 1 shares among "Active" jobs; AdapTBF §III-C1
                // defines them: jobs that submitted requests). They share IDLE_SHARE of
                // the capacity evenly, so that idle registrations cannot dilute the jobs
                // doing I/O (without it, 50 idle jobs cut a busy one to 20 of 1 000 ops/s
                // under PSFA), and the policy shares the rest among the active jobs.
                let pool = capacity * IDLE_SHARE;
                let is_idle: Vec<bool> = inputs
                    .iter()
                    .map(|j| j.usage <= 0.0 && j.wanted <= 0.0)
                    .collect();
                inputs.retain(|j| j.usage > 0.0 || j.wanted > 0.0);
                let mut rates = policy.allocate(capacity - pool, &inputs).iter();
                for (&i, idle_job) in dynamic.iter().zip(&is_idle) {
                    plan.shares[i].assigned = if *idle_job {
                        pool / idle as f64
                    } else {
                        rates.next().copied().unwrap_or(0.0).max(0.0)
                    };
                }
            }
        }
        let shares = &mut plan.shares[first_share..];
        for share in shares.iter_mut() {
            if let Some(limit) = share.static_limit {
                share.assigned = limit;
            }
        }

        for (share, (_, range)) in shares.iter().zip(&jobs) {
            let group = &members[range.clone()];
            let total: f64 = group.iter().map(|(_, u)| u.rate.max(0.0)).sum();
            for &(i, usage) in group {
                let rate = split_one(
                    share.assigned,
                    usage.rate,
                    total,
                    group.len(),
                    config.stage_floor,
                );
                plan.rates[i * resources + ri] = rate
                    .round()
                    .clamp(1.0, padll_wire::channel::MAX_RATE as f64)
                    as u64;
            }
        }
    }
    plan
}

/// The part of a resource's capacity that jobs without I/O in the last interval share
/// (evenly), when some jobs are active: enough for an idle job to start again (its next
/// report makes it active), too little for idle registrations to crowd out busy jobs.
pub const IDLE_SHARE: f64 = 0.05;

/// Stage indices grouped by job (`order`), and each job with its range in `order`: jobs
/// in key order, a job's stages in input order. A counting sort over the dense job keys.
fn group_by_job(stages: &[StageView]) -> (Vec<usize>, Vec<(JobKey, Range<usize>)>) {
    let keys = stages.iter().map(|s| s.job as usize + 1).max().unwrap_or(0);
    if keys > 2 * stages.len() + 64 {
        return group_by_sparse_job(stages);
    }
    // bounds[k]..bounds[k + 1] is job k's range once the counts are summed up.
    let mut bounds = vec![0usize; keys + 1];
    for stage in stages {
        bounds[stage.job as usize + 1] += 1;
    }
    for k in 1..=keys {
        bounds[k] += bounds[k - 1];
    }
    let mut cursor = bounds.clone();
    let mut order = vec![0; stages.len()];
    for (i, stage) in stages.iter().enumerate() {
        let slot = &mut cursor[stage.job as usize];
        order[*slot] = i;
        *slot += 1;
    }
    let mut jobs = Vec::with_capacity(keys);
    jobs.extend(
        (0..keys)
            .filter(|&k| bounds[k + 1] > bounds[k])
            .map(|k| (k as JobKey, bounds[k]..bounds[k + 1])),
    );
    (order, jobs)
}

/// [`group_by_job`] by sorting: for keys too sparse to count over (released keys are
/// reused smallest first, but a job may keep a key issued while many others ran).
fn group_by_sparse_job(stages: &[StageView]) -> (Vec<usize>, Vec<(JobKey, Range<usize>)>) {
    let mut sorted: Vec<(JobKey, usize)> = stages.iter().map(|s| s.job).zip(0..).collect();
    sorted.sort_unstable();
    let mut jobs: Vec<(JobKey, Range<usize>)> = Vec::new();
    for (at, &(job, _)) in sorted.iter().enumerate() {
        match jobs.last_mut() {
            Some((last, range)) if *last == job => range.end = at + 1,
            _ => jobs.push((job, at..at + 1)),
        }
    }
    (sorted.into_iter().map(|(_, i)| i).collect(), jobs)
}

/// A stage's part of its job's `rate`: `floor` of it evenly over the job's `stages`, the
/// rest in proportion to the stage's `usage` of the job's `total` (evenly too when none
/// used anything).
pub fn split_one(rate: f64, usage: f64, total: f64, stages: usize, floor: f64) -> f64 {
    let n = stages as f64;
    let proportional = if total > 0.0 {
        usage.max(0.0) / total
    } else {
        1.0 / n
    };
    rate * (floor / n + (1.0 - floor) * proportional)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan with the stages' layout resolved afresh.
    fn plan_of(
        config: &GlobalConfig,
        terms: &JobTerms,
        policies: &mut HashMap<Resource, PolicyRunner>,
        stages: &[StageView],
    ) -> Plan {
        compute(
            config,
            terms,
            policies,
            stages,
            &Layout::new(config, stages),
        )
    }
    use crate::config::ResourceConfig;

    fn metadata() -> Resource {
        Resource::parse("/scratch:metadata").unwrap()
    }

    struct Owned {
        node: usize,
        job: JobKey,
        mounts: Vec<String>,
        usage: Vec<(usize, StageUsage)>,
    }

    fn stage(node: usize, job: JobKey, rate: f64, limit: u64) -> Owned {
        Owned {
            node,
            job,
            mounts: vec!["/scratch".into()],
            usage: vec![(0, StageUsage { rate, limit })],
        }
    }

    fn views(owned: &[Owned]) -> Vec<StageView> {
        owned
            .iter()
            .map(|o| StageView {
                node: o.node,
                job: o.job,
                uid: 1000,
                gid: 1000,
                job_size: 1,
                mountpoints: o.mounts.clone(),
                usage: o.usage.clone(),
            })
            .collect()
    }

    fn config(policy: &str) -> GlobalConfig {
        GlobalConfig {
            resources: vec![ResourceConfig {
                resource: metadata(),
                max_rate: metadata().own_tokens(1000),
                policy: policy.into(),
                auto: None,
                weights: Default::default(),
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

    fn assigned(plan: &Plan, job: JobKey) -> f64 {
        plan.shares.iter().find(|s| s.job == job).unwrap().assigned
    }

    const A: JobKey = 0;
    const B: JobKey = 1;

    #[test]
    fn jobs_span_nodes_and_rates_follow_usage() {
        let config = config("uniform");
        let owned = vec![
            stage(1, A, 300.0, 0),
            stage(2, A, 100.0, 0),
            stage(1, B, 0.0, 0),
        ];
        let plan = plan_of(
            &config,
            &JobTerms::default(),
            &mut policies(&config),
            &views(&owned),
        );
        let a = plan.shares.iter().find(|s| s.job == A).unwrap();
        assert_eq!((a.stages, a.nodes, a.usage), (2, 2, 400.0));
        // Uniform: 500 each; job a's 500 split 10 % evenly, 90 % by usage (3:1).
        assert_eq!(a.assigned, 500.0);
        assert_eq!(plan.rates, vec![363, 138, 500]);
        let total: u64 = plan.rates.iter().sum();
        assert!(total <= 1001, "{total}");
    }

    #[test]
    fn jobs_are_grouped_whatever_the_stage_order() {
        let config = config("uniform");
        let owned = vec![
            stage(1, B, 10.0, 0),
            stage(1, A, 10.0, 0),
            stage(2, B, 10.0, 0),
        ];
        let plan = plan_of(
            &config,
            &JobTerms::default(),
            &mut policies(&config),
            &views(&owned),
        );
        let jobs: Vec<(JobKey, usize, usize)> = plan
            .shares
            .iter()
            .map(|s| (s.job, s.stages, s.nodes))
            .collect();
        assert_eq!(jobs, vec![(A, 1, 1), (B, 2, 2)]);
        assert_eq!(plan.rates, vec![250, 500, 250]);
    }

    #[test]
    fn jobs_of_sparse_keys_are_grouped_as_those_of_dense_ones() {
        let config = config("uniform");
        let plan = |b: JobKey| {
            let owned = [
                stage(1, b, 10.0, 0),
                stage(1, A, 10.0, 0),
                stage(2, b, 30.0, 0),
            ];
            plan_of(
                &config,
                &JobTerms::default(),
                &mut policies(&config),
                &views(&owned),
            )
        };
        let (dense, sparse) = (plan(B), plan(1_000_000));
        assert_eq!(sparse.rates, dense.rates);
        let jobs = |plan: &Plan| -> Vec<(JobKey, usize, usize)> {
            plan.shares
                .iter()
                .map(|s| (s.job, s.stages, s.nodes))
                .collect()
        };
        assert_eq!(jobs(&dense), [(A, 1, 1), (B, 2, 2)]);
        assert_eq!(jobs(&sparse), [(A, 1, 1), (1_000_000, 2, 2)]);
    }

    #[test]
    fn a_cycle_without_jobs_reaches_every_policy_and_adaptbf_forgets_the_jobs_gone() {
        // Every policy: those that need parameters, with some.
        let specs = policies::policy_names().iter().copied();
        let specs = specs.chain(["themis:group,user,size", "mckp-static:384"]);
        for name in specs.filter(|spec| PolicyRunner::new(spec).is_ok()) {
            let config = config(name);
            let mut runners = policies(&config);
            let owned = [stage(1, A, 100.0, 0), stage(1, B, 10.0, 0)];
            plan_of(&config, &JobTerms::default(), &mut runners, &views(&owned));
            let plan = plan_of(&config, &JobTerms::default(), &mut runners, &[]);
            assert!(plan.shares.is_empty() && plan.rates.is_empty(), "{name}");
            let state = runners[&metadata()].state();
            assert!(
                state.is_null() || state["jobs"] == serde_json::json!([]),
                "{name}: {state}"
            );
        }
    }

    #[test]
    fn psfa_shares_by_demand_and_conserves_work() {
        let config = config("psfa");
        let small = crate::config::JobConfig {
            priority: 1.0,
            demand: [(metadata(), metadata().own_tokens(100))].into(),
            ..Default::default()
        };
        let terms = JobTerms {
            settings: HashMap::from([(A, &small)]),
            ..JobTerms::default()
        };
        let owned = vec![stage(1, A, 100.0, 100), stage(1, B, 900.0, 900)];
        let plan = plan_of(&config, &terms, &mut policies(&config), &views(&owned));
        let total: f64 = plan.shares.iter().map(|s| s.assigned).sum();
        assert!((total - 1000.0).abs() < 1.0, "{:?}", plan.shares);
        assert!(assigned(&plan, A) >= 99.0, "{}", assigned(&plan, A));
    }

    #[test]
    fn idle_jobs_cannot_dilute_a_busy_one() {
        // 50 jobs that do no I/O and one with a demand of 700.
        for policy in ["psfa", "psharing", "adaptbf"] {
            let config = config(policy);
            let mut owned: Vec<Owned> = (0..50).map(|j| stage(1, j + 2, 0.0, 0)).collect();
            owned.push(stage(2, A, 700.0, 700));
            let mut runners = policies(&config);
            let mut plan = plan_of(&config, &JobTerms::default(), &mut runners, &views(&owned));
            if policy == "adaptbf" {
                // AdapTBF allocates from the last cycle's allocation: a second cycle.
                plan = plan_of(&config, &JobTerms::default(), &mut runners, &views(&owned));
            }
            let total: f64 = plan.shares.iter().map(|s| s.assigned).sum();
            assert!(total <= 1000.0 + 1e-6, "{policy}: {total}");
            assert!(
                assigned(&plan, A) >= 1000.0 * (1.0 - IDLE_SHARE) - 1.0,
                "{policy}: the busy job got {} of 1000",
                assigned(&plan, A)
            );
            for idle in 2..52 {
                assert!(assigned(&plan, idle) <= 1000.0 * IDLE_SHARE / 50.0 + 1e-6);
            }
        }
        // All idle: the capacity is shared as before.
        let config = config("psfa");
        let owned: Vec<Owned> = (0..4).map(|j| stage(1, j, 0.0, 0)).collect();
        let plan = plan_of(
            &config,
            &JobTerms::default(),
            &mut policies(&config),
            &views(&owned),
        );
        assert!(
            (assigned(&plan, 0) - 250.0).abs() < 1.0,
            "{:?}",
            plan.shares
        );
    }

    #[test]
    fn static_limits_are_kept_and_the_rest_is_shared() {
        let config = config("uniform");
        let owned = vec![stage(1, A, 10.0, 0), stage(1, B, 10.0, 0)];
        let terms = JobTerms {
            limits: HashMap::from([((A, 0), 100.0)]),
            ..JobTerms::default()
        };
        let plan = plan_of(&config, &terms, &mut policies(&config), &views(&owned));
        assert_eq!((assigned(&plan, A), assigned(&plan, B)), (100.0, 900.0));
    }

    #[test]
    fn stages_off_the_mountpoint_get_no_rules() {
        let config = config("uniform");
        let mut other = stage(1, 2, 0.0, 0);
        other.mounts = vec!["/home".into()];
        let plan = plan_of(
            &config,
            &JobTerms::default(),
            &mut policies(&config),
            &views(&[other]),
        );
        assert!(plan.shares.is_empty());
        assert_eq!(plan.rates, vec![0]);
    }

    #[test]
    fn split_floor_and_idle_stages() {
        assert_eq!(split_one(100.0, 0.0, 0.0, 2, 0.1), 50.0);
        assert_eq!(split_one(100.0, 10.0, 10.0, 2, 0.2), 90.0);
        assert_eq!(split_one(100.0, 0.0, 10.0, 2, 0.2), 10.0);
    }
}
