//! Each application's history of file sizes (Paul et al., paper 004 §III-B: the
//! statistics of an application's requests, which its Markov chain predicts the next
//! sizes from). Stages report the final size of every file they created placed
//! (`FileSizes`); the global controller keeps them per application, as
//! `[placement] application` names it from the stage's identity ([`ApplicationKey`]).
//!
//! Bounded: at most [`MAX_SIZES_PER_APP`] sizes per application (the oldest dropped
//! first) and [`MAX_APPS`] applications (the one whose
//! latest size is oldest is dropped for a new one). The history goes to the next leader
//! with the policies' state ([`SavedSizes`], checked against the same bounds on load).

use crate::proto;
use padll_wire::control::MAX_FILE_BYTES;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

/// Sizes kept per application: four times the longest training length the paper
/// chooses (16, §III-B).
pub const MAX_SIZES_PER_APP: usize = 64;
/// Applications kept. With [`MAX_SIZES_PER_APP`] sizes of up to 19 digits and names of
/// up to 513 bytes (`user+program`), the saved history stays under 1 MiB, within
/// etcd's default request limit (1.5 MiB).
pub const MAX_APPS: usize = 512;
/// Sizes in one `FileSizes` message.
pub const MAX_FILE_SIZES: usize = 64;
/// Longest application name loaded from a saved history, bytes (a live one is made of
/// a stage's fields, which `bounds::check_stage` bounds).
pub const MAX_APP_BYTES: usize = 1024;

/// What makes a stage's files one application's (`[placement] application`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApplicationKey {
    /// The program's name (`stage_name`): every run of a code is one application.
    #[default]
    Program,
    /// The job (`job_id`): each job learns on its own.
    Job,
    /// The user and the program: one user's runs of a code.
    UserProgram,
}

impl ApplicationKey {
    /// The names `[placement] application` accepts.
    pub const NAMES: &'static str = "program, job, user+program";

    /// The key `name` names, if any.
    pub fn parse(name: &str) -> Option<ApplicationKey> {
        match name {
            "program" => Some(ApplicationKey::Program),
            "job" => Some(ApplicationKey::Job),
            "user+program" => Some(ApplicationKey::UserProgram),
            _ => None,
        }
    }

    /// The application `stage` belongs to.
    pub fn of(self, stage: &proto::Stage) -> String {
        match self {
            ApplicationKey::Program => stage.stage_name.clone(),
            ApplicationKey::Job => stage.job_id.clone(),
            ApplicationKey::UserProgram => format!("{}+{}", stage.user, stage.stage_name),
        }
    }
}

/// A `FileSizes` message or a saved history refused, naming what is wrong.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SizesRefused {
    /// No size, or more than [`MAX_FILE_SIZES`] (their number).
    #[error("{0} sizes in one message (1 to {MAX_FILE_SIZES})")]
    Count(usize),
    /// A size beyond [`MAX_FILE_BYTES`].
    #[error("a size of {0} bytes is beyond {MAX_FILE_BYTES}")]
    TooLarge(u64),
    /// From a stage the controller does not know (its id).
    #[error("unknown stage id {0}")]
    UnknownStage(u64),
    /// A saved history too large: more applications than [`MAX_APPS`], more sizes
    /// than [`MAX_SIZES_PER_APP`] or a name longer than [`MAX_APP_BYTES`].
    #[error("saved size history out of bounds: {0}")]
    Saved(String),
}

/// Checks a `FileSizes` message's sizes.
pub fn check(sizes: &[u64]) -> Result<(), SizesRefused> {
    if sizes.is_empty() || sizes.len() > MAX_FILE_SIZES {
        return Err(SizesRefused::Count(sizes.len()));
    }
    match sizes.iter().find(|&&b| b > MAX_FILE_BYTES) {
        Some(&bad) => Err(SizesRefused::TooLarge(bad)),
        None => Ok(()),
    }
}

/// One application's sizes, as a leader saves them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedSizes {
    /// The application.
    pub app: String,
    /// Its sizes, oldest first.
    pub bytes: Vec<u64>,
}

/// Every application's sizes (see the module documentation).
#[derive(Debug, Default)]
pub struct SizeHistory {
    apps: HashMap<String, AppSizes>,
    /// Counts every recording: an application's `latest` orders evictions.
    clock: u64,
}

#[derive(Debug)]
struct AppSizes {
    bytes: VecDeque<u64>,
    latest: u64,
}

impl SizeHistory {
    /// Adds `sizes` (checked) to `app`'s history.
    pub fn record(&mut self, app: &str, sizes: &[u64]) {
        self.clock += 1;
        if !self.apps.contains_key(app) && self.apps.len() >= MAX_APPS {
            let oldest = self
                .apps
                .iter()
                .min_by_key(|(_, a)| a.latest)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                self.apps.remove(&oldest);
            }
        }
        let entry = self
            .apps
            .entry(app.to_string())
            .or_insert_with(|| AppSizes {
                bytes: VecDeque::new(),
                latest: 0,
            });
        entry.latest = self.clock;
        for &size in sizes {
            if entry.bytes.len() == MAX_SIZES_PER_APP {
                entry.bytes.pop_front();
            }
            entry.bytes.push_back(size);
        }
    }

    /// `app`'s sizes, oldest first (empty if it has none).
    pub fn of(&self, app: &str) -> Vec<f64> {
        self.apps
            .get(app)
            .map(|a| a.bytes.iter().map(|&b| b as f64).collect())
            .unwrap_or_default()
    }

    /// Every application's sizes, the least recently reported first.
    pub fn saved(&self) -> Vec<SavedSizes> {
        let mut apps: Vec<(&String, &AppSizes)> = self.apps.iter().collect();
        apps.sort_by_key(|(_, a)| a.latest);
        apps.into_iter()
            .map(|(app, a)| SavedSizes {
                app: app.clone(),
                bytes: a.bytes.iter().copied().collect(),
            })
            .collect()
    }

    /// The history a previous leader saved, checked against the bounds.
    pub fn load(saved: Vec<SavedSizes>) -> Result<SizeHistory, SizesRefused> {
        if saved.len() > MAX_APPS {
            return Err(SizesRefused::Saved(format!(
                "{} applications (at most {MAX_APPS})",
                saved.len()
            )));
        }
        let mut history = SizeHistory::default();
        for app in saved {
            if app.app.len() > MAX_APP_BYTES || app.bytes.len() > MAX_SIZES_PER_APP {
                return Err(SizesRefused::Saved(format!(
                    "application '{}' with {} sizes (names of at most {MAX_APP_BYTES} bytes, at most {MAX_SIZES_PER_APP} sizes)",
                    padll_wire::control::short(&app.app),
                    app.bytes.len()
                )));
            }
            if let Some(&bad) = app.bytes.iter().find(|&&b| b > MAX_FILE_BYTES) {
                return Err(SizesRefused::TooLarge(bad));
            }
            history.record(&app.app, &app.bytes);
        }
        Ok(history)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_applications_are_bounded_oldest_first() {
        let mut history = SizeHistory::default();
        let sizes: Vec<u64> = (0..MAX_SIZES_PER_APP as u64 + 10).collect();
        for chunk in sizes.chunks(MAX_FILE_SIZES) {
            history.record("a", chunk);
        }
        let kept = history.of("a");
        assert_eq!(kept.len(), MAX_SIZES_PER_APP);
        assert_eq!(kept[0], 10.0, "the oldest went first");
        for app in 0..MAX_APPS {
            history.record(&format!("app{app}"), &[1]);
        }
        assert!(
            history.of("a").is_empty(),
            "the least recent application went"
        );
        assert_eq!(history.of("app0"), vec![1.0]);
        history.record("a", &[5]);
        assert!(history.of("app0").is_empty());
        assert_eq!(history.saved().len(), MAX_APPS);
        assert_eq!(history.saved().last().unwrap().app, "a");
    }

    #[test]
    fn messages_and_saved_histories_out_of_bounds_are_refused() {
        assert_eq!(check(&[]), Err(SizesRefused::Count(0)));
        assert_eq!(
            check(&[1; MAX_FILE_SIZES + 1]),
            Err(SizesRefused::Count(MAX_FILE_SIZES + 1))
        );
        assert_eq!(
            check(&[1, MAX_FILE_BYTES + 1]),
            Err(SizesRefused::TooLarge(MAX_FILE_BYTES + 1))
        );
        assert_eq!(check(&[0, MAX_FILE_BYTES]), Ok(()));
        let saved = |app: &str, n: usize| SavedSizes {
            app: app.into(),
            bytes: vec![7; n],
        };
        let loaded = SizeHistory::load(vec![saved("x", 3), saved("y", 1)]).unwrap();
        assert_eq!(loaded.of("x"), vec![7.0; 3]);
        assert_eq!(loaded.saved(), vec![saved("x", 3), saved("y", 1)]);
        for bad in [
            vec![saved("x", MAX_SIZES_PER_APP + 1)],
            vec![saved(&"n".repeat(MAX_APP_BYTES + 1), 1)],
            vec![saved("x", 1); MAX_APPS + 1],
        ] {
            let error = SizeHistory::load(bad).unwrap_err().to_string();
            assert!(
                error.starts_with("saved size history out of bounds"),
                "{error}"
            );
        }
    }

    #[test]
    fn application_keys_are_named_by_the_operator() {
        let stage = proto::Stage {
            job_id: "42".into(),
            user: "ana".into(),
            stage_name: "ior".into(),
            ..Default::default()
        };
        let key = |name| ApplicationKey::parse(name).unwrap().of(&stage);
        assert_eq!(key("program"), "ior");
        assert_eq!(key("job"), "42");
        assert_eq!(key("user+program"), "ana+ior");
        assert_eq!(ApplicationKey::parse("host"), None);
    }
}
