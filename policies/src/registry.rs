//! Build policies by name (`"psfa:0.3"`, `"themis:group,user,size"`, ...).
//!
//! A spec is `NAME` or `NAME:PARAMS`. The names and their parameters:
//!
//! | spec | policy | paper |
//! |---|---|---|
//! | `baseline` | no control (rates are infinite) | PADLL §V-C *Baseline* |
//! | `uniform[:SLOTS]` | `Max_R / SLOTS` each (default: number of active jobs) | PADLL §IV-A |
//! | `priority` | each job's static `limit` (or `demand`), scaled down if over `Max_R` | PADLL §IV-A |
//! | `psharing[:weighted]` | max-min fair share over demands (equal shares; `weighted`: by `priority`) + leftover by demand | PADLL §IV-B |
//! | `psfa[:EPSILON]` | Algorithm 1 (default ε = 0.5) | PADLL §IV-B, Alg. 1 |
//! | `adaptbf[:INTERVAL_S]` | token lending/borrowing (default Δt = 1 s) | AdapTBF §III-C |
//! | `job-fair`, `size-fair`, `user-fair`, `priority-fair`, `group-fair` | ThemisIO primitives | ThemisIO §2.2.2 |
//! | `themis:L1,L2,...` | composite (e.g. `group,user,size`) | ThemisIO §3 |
//! | `drf[:MAX_DATA_RATE]` | dominant resource fairness over (ops/s, bytes/s) | PADLL mentions it |
//! | `mckp[:RESOLUTION]` | multiple-choice knapsack by DP (resolution ≤ 100 000) | Arbitration §3.1 |
//! | `mckp-static:NODES[,UNITS]` | STATIC baseline (`⌈C_a/R⌉` units) | Arbitration §3.2 |
//! | `mckp-size[:UNITS]` | SIZE baseline (`round(F·s_a/Σs)` units) | Arbitration §3.2 |

use std::fmt;

use crate::adaptbf::Adaptbf;
use crate::drf::Drf;
use crate::mckp::{Mckp, UnitBaseline, MAX_RESOLUTION};
use crate::sharing::{PSharing, Psfa};
use crate::statics::{Baseline, Priority, Uniform};
use crate::themis::{parse_levels, LevelsError, Themis};
use crate::util::parse_param;
use crate::Policy;

/// A policy or placer spec refused: what it was for, the spec as given and what is
/// wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// `policy` or `placer`.
    pub what: &'static str,
    /// The spec, trimmed.
    pub spec: String,
    /// What is wrong.
    pub kind: SpecErrorKind,
    /// The names accepted, listed when the name is unknown.
    pub known: &'static [&'static str],
}

/// What is wrong with a policy or placer spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecErrorKind {
    /// No policy or placer of that name.
    #[error("unknown name")]
    Unknown,
    /// Parameters given where none are taken (kept).
    #[error("takes no parameters (got `{0}`)")]
    NoParameters(String),
    /// A parameter out of its range or of the wrong type.
    #[error("bad {what} `{value}` ({expected})")]
    BadParameter {
        /// Which parameter.
        what: &'static str,
        /// As given.
        value: String,
        /// What it must be.
        expected: String,
    },
    /// A required parameter missing (what it is, with an example).
    #[error("needs {0}")]
    Missing(&'static str),
    /// Bad fairness levels (`themis:…`).
    #[error(transparent)]
    Levels(#[from] LevelsError),
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, spec) = (self.what, &self.spec);
        match &self.kind {
            SpecErrorKind::Unknown => {
                write!(
                    f,
                    "unknown {what} `{spec}` (known: {})",
                    self.known.join(", ")
                )
            }
            kind => write!(f, "{what} `{spec}`: {kind}"),
        }
    }
}

impl std::error::Error for SpecError {}

/// Every policy name [`build`] accepts (without parameters).
pub fn policy_names() -> &'static [&'static str] {
    &[
        "baseline",
        "uniform",
        "priority",
        "psharing",
        "psfa",
        "adaptbf",
        "job-fair",
        "size-fair",
        "user-fair",
        "priority-fair",
        "group-fair",
        "themis",
        "drf",
        "mckp",
        "mckp-static",
        "mckp-size",
    ]
}

/// Build a policy from its spec (see the module docs for the grammar).
pub fn build(spec: &str) -> Result<Box<dyn Policy>, SpecError> {
    let spec = spec.trim();
    let (name, params) = match spec.split_once(':') {
        Some((n, p)) => (n.trim(), Some(p.trim())),
        None => (spec, None),
    };
    let err = |kind| SpecError {
        what: "policy",
        spec: spec.to_string(),
        kind,
        known: policy_names(),
    };
    let bad = |what, value: &dyn fmt::Display, expected| {
        err(SpecErrorKind::BadParameter {
            what,
            value: value.to_string(),
            expected: String::from(expected),
        })
    };
    let num = |what| -> Result<Option<f64>, SpecError> {
        params
            .map(|p| parse_param(p).ok_or_else(|| bad(what, &p, "expected a non-negative number")))
            .transpose()
    };
    let int = |what, v: &str| -> Result<u32, SpecError> {
        v.trim()
            .parse::<u32>()
            .ok()
            .filter(|&x| x > 0)
            .ok_or_else(|| bad(what, &v, "expected a positive integer"))
    };
    let no_params = || -> Result<(), SpecError> {
        match params {
            None => Ok(()),
            Some(p) => Err(err(SpecErrorKind::NoParameters(p.to_string()))),
        }
    };
    let themis = |levels: &str| -> Result<Box<dyn Policy>, SpecError> {
        let l = parse_levels(levels).map_err(|e| err(e.into()))?;
        Ok(Box::new(Themis::new(l, spec)))
    };
    Ok(match name {
        "baseline" | "none" => {
            no_params()?;
            Box::new(Baseline)
        }
        "uniform" => Box::new(Uniform {
            slots: params
                .map(|p| int("slot count", p))
                .transpose()?
                .map(|s| s as usize),
        }),
        "priority" => {
            no_params()?;
            Box::new(Priority)
        }
        "psharing" => match params {
            None => Box::new(PSharing::default()),
            Some("weighted") => Box::new(PSharing::weighted()),
            Some(p) => {
                return Err(bad(
                    "variant",
                    &p,
                    "expected `psharing` or `psharing:weighted`",
                ))
            }
        },
        "psfa" => match num("epsilon")? {
            Some(e) if e > 1.0 => return Err(bad("epsilon", &e, "must be in [0, 1]")),
            Some(e) => Box::new(Psfa::new(e)),
            None => Box::new(Psfa::default()),
        },
        "adaptbf" => match num("interval")? {
            Some(i) if i <= 0.0 => return Err(bad("interval", &i, "must be > 0 seconds")),
            Some(i) => Box::new(Adaptbf::new(i)),
            None => Box::new(Adaptbf::default()),
        },
        "job-fair" | "size-fair" | "user-fair" | "priority-fair" | "group-fair" => {
            no_params()?;
            themis(name.trim_end_matches("-fair"))?
        }
        "themis" => match params {
            Some(p) => themis(p)?,
            None => {
                return Err(err(SpecErrorKind::Missing(
                    "levels, e.g. `themis:group,user,size`",
                )))
            }
        },
        "drf" => Box::new(Drf::new(num("max data rate")?.unwrap_or(f64::INFINITY))),
        "mckp" => {
            let resolution = params
                .map(|p| int("resolution", p))
                .transpose()?
                .unwrap_or(1000) as usize;
            if resolution > MAX_RESOLUTION {
                return Err(bad(
                    "resolution",
                    &resolution,
                    "expected at most 100000 quanta",
                ));
            }
            Box::new(Mckp::new(resolution))
        }
        "mckp-static" => {
            let p = params.ok_or_else(|| {
                err(SpecErrorKind::Missing(
                    "the machine's node count, e.g. `mckp-static:384`",
                ))
            })?;
            let (c, f) = match p.split_once(',') {
                Some((c, f)) => (int("node count", c)?, int("unit count", f)?),
                None => (int("node count", p)?, 100),
            };
            Box::new(UnitBaseline::fixed(c, f))
        }
        "mckp-size" => Box::new(UnitBaseline::size(
            params
                .map(|p| int("unit count", p))
                .transpose()?
                .unwrap_or(100),
        )),
        _ => return Err(err(SpecErrorKind::Unknown)),
    })
}
