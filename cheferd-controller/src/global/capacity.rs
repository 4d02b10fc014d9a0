//! `max_rate = "auto"`: each cycle, before the policies share it, the `Max_R` of such a
//! resource follows the file system's service times of the interval that ended
//! (`policies::capacity`'s estimator; ARCHITECTURE.md, "Delay-based capacity").

use super::service_times::ServiceTimes;
use crate::config::GlobalConfig;
use policies::capacity::{CapacityEstimator, Observation, SettingsError};

/// One estimator per resource configured with `max_rate = "auto"` (by index), `None`
/// for the others and for one an administrator set a static `Max_R` on.
#[derive(Debug)]
pub struct Steering {
    estimators: Vec<Option<CapacityEstimator>>,
}

impl Steering {
    /// Estimators for the resources of `config` with `max_rate = "auto"`.
    pub fn new(config: &GlobalConfig) -> Result<Steering, SettingsError> {
        let estimators = config
            .resources
            .iter()
            .map(|r| {
                r.auto
                    .as_ref()
                    .map(|auto| CapacityEstimator::new(auto.settings()))
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        Ok(Steering { estimators })
    }

    /// Moves the `Max_R` of every steered resource of `config` after an interval:
    /// `served(i)` is what resource `i` served in it (every stage's usage), `service`
    /// its service times.
    pub fn steer(
        &mut self,
        config: &mut GlobalConfig,
        service: &ServiceTimes,
        served: impl Fn(usize) -> f64,
    ) {
        for (i, estimator) in self.estimators.iter_mut().enumerate() {
            let (Some(estimator), Some(resource), Some(times)) = (
                estimator.as_mut(),
                config.resources.get_mut(i),
                service.last(i),
            ) else {
                continue;
            };
            let next = estimator.update(&Observation {
                served: served(i),
                p50: times.quantile(0.5),
                p99: times.quantile(0.99),
                samples: times.total(),
                max_rate: resource.max_rate.tokens(),
            });
            resource.max_rate = resource.resource.own_tokens(next.round() as u64);
        }
    }

    /// Whether resource `i`'s `Max_R` follows the service times now.
    pub fn steers(&self, i: usize) -> bool {
        self.estimators.get(i).is_some_and(Option::is_some)
    }

    /// Stops steering resource `i` (an administrator set its `Max_R`).
    pub fn stop(&mut self, i: usize) {
        if let Some(estimator) = self.estimators.get_mut(i) {
            *estimator = None;
        }
    }

    /// Steers resource `i` again from its configured settings, from its ceiling; false
    /// if it has none (it was not configured with `max_rate = "auto"`).
    pub fn restart(&mut self, config: &mut GlobalConfig, i: usize) -> bool {
        let (Some(slot), Some(resource)) =
            (self.estimators.get_mut(i), config.resources.get_mut(i))
        else {
            return false;
        };
        let Some(auto) = &resource.auto else {
            return false;
        };
        match CapacityEstimator::new(auto.settings()) {
            Ok(estimator) => {
                resource.max_rate = auto.ceiling;
                *slot = Some(estimator);
                true
            }
            Err(_) => false,
        }
    }
}
