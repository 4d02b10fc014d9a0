//! Job ids interned to the planner's keys, and the terms (configured settings, static
//! and scheduled limits) in force for them.

use crate::config::Resource;
use crate::config::{GlobalConfig, JobConfig, ScheduledRule};
use crate::plan::JobTerms;
use crate::policy::JobKey;
use std::collections::HashMap;

/// Job ids interned to dense keys, never forgotten: policies keep state by key.
#[derive(Default)]
pub(super) struct JobIds {
    keys: HashMap<String, JobKey>,
    /// `names[key]` is the id.
    names: Vec<String>,
}

impl JobIds {
    /// The key of `job`, made on its first use.
    pub(super) fn intern(&mut self, job: &str) -> JobKey {
        if let Some(&key) = self.keys.get(job) {
            return key;
        }
        let key = self.names.len() as JobKey;
        self.names.push(job.to_string());
        self.keys.insert(job.to_string(), key);
        key
    }

    /// The key of `job`, if a stage of it ever ran.
    pub(super) fn key(&self, job: &str) -> Option<JobKey> {
        self.keys.get(job).copied()
    }

    /// The id of `key`.
    pub(super) fn name(&self, key: JobKey) -> &str {
        &self.names[key as usize]
    }

    /// The id of `key`, if it is one.
    pub(super) fn name_of(&self, key: JobKey) -> Option<&str> {
        self.names.get(key as usize).map(String::as_str)
    }

    /// The terms in force `elapsed` seconds after start.
    pub(super) fn terms<'a>(&self, config: &'a GlobalConfig, elapsed: f64) -> JobTerms<'a> {
        JobTerms {
            settings: self.settings(config),
            limits: self.static_limits(config, elapsed),
        }
    }

    /// Each interned job's configured settings, by key.
    fn settings<'a>(&self, config: &'a GlobalConfig) -> Vec<Option<&'a JobConfig>> {
        let mut settings = Vec::new();
        for (job, terms) in &config.jobs {
            // A configured job no stage ever ran has no key, and nothing to plan.
            if let Some(key) = self.key(job) {
                let key = key as usize;
                if settings.len() <= key {
                    settings.resize(key + 1, None);
                }
                settings[key] = Some(terms);
            }
        }
        settings
    }

    /// Static limits in force `elapsed` seconds after start, by job key and resource
    /// index: the configuration's, then the scheduled rules that have come due, in time
    /// order.
    fn static_limits(&self, config: &GlobalConfig, elapsed: f64) -> HashMap<(JobKey, usize), f64> {
        // Limits of jobs no stage ever ran, or of unconfigured resources, apply to nothing.
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
