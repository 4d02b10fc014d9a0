//! Which of two leaders is the newer: what local controllers fence with, and what a
//! leader steps down for.
//!
//! A term is the etcd revision that created the leader's election key, so terms order
//! the leaders of one etcd's data only: a wiped, rebuilt or replaced etcd counts
//! revisions from 1 again, and its first leader's term is smaller than the terms the
//! local controllers have seen. Each leader therefore also sends the [`Generation`] of
//! the data it was elected in: made, with its creation time, by the first leader
//! elected in data that has none (`PREFIX/generation`, [`crate::standby::persist`]). Leaders are
//! ordered by generation, then by term:
//!
//! - a leader of a **newer generation** (created later) is followed whatever its term:
//!   the etcd it was elected in replaced the one the older terms count in;
//! - within one generation, the **newer term** is followed, as without generations;
//! - a leader of an **older generation** is refused: a deposed leader of replaced data
//!   can never take a node back, so a node moves forward only and never flip-flops;
//! - a message **without a generation** (a global controller of an earlier release, or
//!   without etcd) counts in the newest generation seen: its term alone decides.
//!
//! Generations compare their creators' clocks, which differ by far less than the time
//! between two etcd data sets (a rebuild takes minutes at least).

use crate::proto;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::SystemTime;

/// The etcd data a term counts in: when it was created, and a random number that tells
/// apart two created in the same millisecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    /// Milliseconds since the Unix epoch, by its creator's clock.
    pub created_ms: u64,
    /// Random.
    pub nonce: u64,
}

impl Generation {
    /// A new generation, created now.
    pub fn now() -> Generation {
        use std::hash::BuildHasher;
        let created_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Generation {
            created_ms,
            // Keyed with random keys per process: a random number without a dependency.
            nonce: std::hash::RandomState::new().hash_one(created_ms),
        }
    }
}

impl From<&proto::Generation> for Generation {
    fn from(g: &proto::Generation) -> Self {
        Generation {
            created_ms: g.created_ms,
            nonce: g.nonce,
        }
    }
}

impl From<Generation> for proto::Generation {
    fn from(g: Generation) -> Self {
        proto::Generation {
            created_ms: g.created_ms,
            nonce: g.nonce,
        }
    }
}

impl fmt::Display for Generation {
    /// `2026-11-26 09:14:05.123 UTC`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = time::OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(self.created_ms) * 1_000_000,
        )
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        write!(
            f,
            "{} {:02}:{:02}:{:02}.{:03} UTC",
            at.date(),
            at.hour(),
            at.minute(),
            at.second(),
            at.millisecond()
        )
    }
}

/// A leader's place in the order of leaders: its generation (`None`: not given), then
/// its term. The derived order puts "not given" before every generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeaderTerm {
    /// The etcd data it was elected in.
    pub generation: Option<Generation>,
    /// Its term in that data.
    pub term: u64,
}

impl LeaderTerm {
    /// The term `term` of `generation` as a message carries them.
    pub fn of(term: u64, generation: Option<&proto::Generation>) -> LeaderTerm {
        LeaderTerm {
            generation: generation.map(Generation::from),
            term,
        }
    }

    /// This term, counted in `newest`'s generation if it gives none.
    fn in_generation_of(self, newest: LeaderTerm) -> LeaderTerm {
        LeaderTerm {
            generation: self.generation.or(newest.generation),
            term: self.term,
        }
    }

    /// Whether a node that has seen `newest` may follow a leader of this term; if so,
    /// the newest it has seen then.
    pub fn follows(self, newest: LeaderTerm) -> Option<LeaderTerm> {
        let sent = self.in_generation_of(newest);
        (sent >= newest).then_some(sent)
    }

    /// Whether a leader of this term is newer than `mine` (one known to a standby,
    /// against the asking leader's).
    pub fn newer_than(self, mine: LeaderTerm) -> bool {
        self.in_generation_of(mine) > mine
    }

    /// Why a leader of this term is refused by a node that has seen `newest`.
    pub fn refusal(self, newest: LeaderTerm) -> String {
        if self.in_generation_of(newest).generation == newest.generation {
            format!("{self}, older than {newest} already seen: a deposed leader")
        } else {
            format!(
                "{self:#}, older than {newest:#} already seen: a leader of etcd data since replaced"
            )
        }
    }
}

impl fmt::Display for LeaderTerm {
    /// `term 18`; with `{:#}`, its generation too: `term 18 of the etcd data of 2026-…`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "term {}", self.term)?;
        match self.generation {
            Some(generation) if f.alternate() => write!(f, " of the etcd data of {generation}"),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generation(created_ms: u64) -> Option<Generation> {
        Some(Generation {
            created_ms,
            nonce: 7,
        })
    }

    fn term(generation: Option<Generation>, term: u64) -> LeaderTerm {
        LeaderTerm { generation, term }
    }

    #[test]
    fn within_a_generation_the_newer_term_is_followed_and_an_older_refused() {
        let seen = term(generation(1_000), 18);
        assert_eq!(term(generation(1_000), 18).follows(seen), Some(seen));
        assert_eq!(
            term(generation(1_000), 20).follows(seen),
            Some(term(generation(1_000), 20))
        );
        let deposed = term(generation(1_000), 17);
        assert_eq!(deposed.follows(seen), None);
        assert!(deposed.refusal(seen).contains("a deposed leader"));
    }

    #[test]
    fn a_newer_generation_is_followed_whatever_its_term_and_never_undone() {
        let old = term(generation(1_000), 18);
        let rebuilt = term(generation(90_000), 2);
        let newest = rebuilt
            .follows(old)
            .expect("the rebuilt etcd's leader is followed");
        assert_eq!(newest, rebuilt);
        // The old data's leader cannot take the node back, whatever its term.
        let stale = term(generation(1_000), 99);
        assert_eq!(stale.follows(newest), None);
        let why = stale.refusal(newest);
        assert!(
            why.contains("since replaced") && why.contains("1970-01-01 00:01:30.000 UTC"),
            "{why}"
        );
    }

    #[test]
    fn two_generations_of_the_same_millisecond_are_told_apart() {
        let a = Some(Generation {
            created_ms: 5,
            nonce: 1,
        });
        let b = Some(Generation {
            created_ms: 5,
            nonce: 2,
        });
        assert_eq!(term(a, 9).follows(term(b, 3)), None);
        assert!(term(b, 3).follows(term(a, 9)).is_some());
        assert_ne!(Generation::now().nonce, Generation::now().nonce);
    }

    #[test]
    fn without_a_generation_a_term_counts_in_the_newest_generation_seen() {
        let seen = term(generation(1_000), 18);
        assert_eq!(
            term(None, 20).follows(seen),
            Some(term(generation(1_000), 20)),
            "an earlier release's leader of a newer term"
        );
        assert_eq!(term(None, 0).follows(seen), None, "a global without etcd");
        // A first generation after terms without one is newer than all of them.
        assert!(term(generation(1_000), 2).follows(term(None, 18)).is_some());
    }

    #[test]
    fn a_standby_knowing_a_newer_generation_or_term_deposes_the_leader() {
        let mine = term(generation(1_000), 18);
        assert!(term(generation(90_000), 2).newer_than(mine));
        assert!(term(None, 19).newer_than(mine));
        assert!(!term(None, 18).newer_than(mine));
        assert!(!term(generation(500), 40).newer_than(mine));
    }
}
