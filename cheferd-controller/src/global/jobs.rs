//! Job ids interned to the planner's keys (released once their jobs are gone), and the
//! terms (configured settings, static and scheduled limits) in force for them.

use crate::config::Resource;
use crate::config::{GlobalConfig, JobConfig, ScheduledRule};
use crate::plan::JobTerms;
use crate::policy::JobKey;
use std::collections::{BTreeSet, HashMap};

/// Job ids interned to dense keys. Policies keep state by key, and the last shares name
/// jobs by key, so a key is released only once a cycle has planned without its job
/// ([`JobIds::release_all_but`]); released keys are reused smallest first, so that
/// keys stay dense however many jobs came and went.
#[derive(Default)]
pub(super) struct JobIds {
    keys: HashMap<String, JobKey>,
    /// `names[key]` is the id; `None` while the key is released.
    names: Vec<Option<String>>,
    /// The released keys (all below `names.len()`), taken smallest first.
    free: BTreeSet<JobKey>,
    /// `seen[key]`: the last sweep that found a stage of the job.
    seen: Vec<u64>,
    sweeps: u64,
}

impl JobIds {
    /// The key of `job`, made on its first use (since its last key was released).
    pub(super) fn intern(&mut self, job: &str) -> JobKey {
        if let Some(&key) = self.keys.get(job) {
            return key;
        }
        let key = match self.free.pop_first() {
            Some(key) => {
                self.names[key as usize] = Some(job.to_string());
                key
            }
            None => {
                self.names.push(Some(job.to_string()));
                self.seen.push(0);
                (self.names.len() - 1) as JobKey
            }
        };
        self.keys.insert(job.to_string(), key);
        key
    }

    /// The key of `job`, if it has one.
    pub(super) fn key(&self, job: &str) -> Option<JobKey> {
        self.keys.get(job).copied()
    }

    /// The id of `key`, if it is one.
    pub(super) fn name_of(&self, key: JobKey) -> Option<&str> {
        self.names.get(key as usize)?.as_deref()
    }

    /// Releases the keys of every job but those of `live` (the jobs of every stage and
    /// orphan, just planned: the policies have written the others off — AdapTBF drops
    /// a job absent from its input — and the new shares name none of them).
    pub(super) fn release_all_but(&mut self, live: impl Iterator<Item = JobKey>) {
        self.sweeps += 1;
        for key in live {
            self.seen[key as usize] = self.sweeps;
        }
        let JobIds {
            keys,
            names,
            free,
            seen,
            sweeps,
        } = self;
        keys.retain(|_, &mut key| {
            let kept = seen[key as usize] == *sweeps;
            if !kept {
                names[key as usize] = None;
                free.insert(key);
            }
            kept
        });
        // After a flood of short-lived jobs, the tables shrink back to the jobs left.
        while names.last().is_some_and(Option::is_none) {
            names.pop();
        }
        seen.truncate(names.len());
        free.split_off(&(names.len() as JobKey));
        if keys.capacity() > 2 * keys.len() + 64 {
            keys.shrink_to_fit();
            names.shrink_to_fit();
            seen.shrink_to_fit();
        }
    }

    /// The terms in force `elapsed` seconds after start.
    pub(super) fn terms<'a>(&self, config: &'a GlobalConfig, elapsed: f64) -> JobTerms<'a> {
        JobTerms {
            settings: self.settings(config),
            limits: self.static_limits(config, elapsed),
        }
    }

    /// Each interned job's configured settings, by key.
    fn settings<'a>(&self, config: &'a GlobalConfig) -> HashMap<JobKey, &'a JobConfig> {
        // A configured job no stage runs has no key, and nothing to plan.
        config
            .jobs
            .iter()
            .filter_map(|(job, terms)| Some((self.key(job)?, terms)))
            .collect()
    }

    /// Static limits in force `elapsed` seconds after start, by job key and resource
    /// index: the configuration's, then the scheduled rules that have come due, in time
    /// order.
    fn static_limits(&self, config: &GlobalConfig, elapsed: f64) -> HashMap<(JobKey, usize), f64> {
        // Limits of jobs no stage runs, or of unconfigured resources, apply to nothing.
        let key = |job: &str, resource: &Resource| {
            let index = config
                .resources
                .iter()
                .position(|r| &r.resource == resource)?;
            Some((self.key(job)?, index))
        };
        let mut limits = HashMap::new();
        for (job, settings) in &config.jobs {
            for (resource, limit) in &settings.limit {
                if let Some(key) = key(job, resource) {
                    limits.insert(key, limit.tokens());
                }
            }
        }
        for ScheduledRule {
            job,
            resource,
            limit,
            ..
        } in config.rules.iter().filter(|r| r.at <= elapsed)
        {
            let Some(key) = key(job, resource) else {
                continue;
            };
            match limit {
                Some(l) => limits.insert(key, l.tokens()),
                None => limits.remove(&key),
            };
        }
        limits
    }
}
