//! Channels as the stage, its CLI and the controllers describe them: which requests a
//! channel serves ([`Scope`], optionally one mountpoint), its rate and what a token is.

use crate::ops::{Class, Op};
use serde::{Deserialize, Serialize};

/// Largest rate a channel can hold, tokens per second (2⁴⁸ ≈ 256 TiB/s in bytes).
pub const MAX_RATE: u64 = 1 << 48;

/// Which operations a channel serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every operation.
    All,
    /// Every operation of a class.
    Class(#[serde(with = "class_name")] Class),
    /// One operation type.
    Op(#[serde(with = "op_name")] Op),
}

impl Scope {
    /// True when this scope covers `op`.
    pub fn covers(self, op: Op) -> bool {
        match self {
            Scope::All => true,
            Scope::Class(class) => op.class() == class,
            Scope::Op(o) => o == op,
        }
    }

    /// Parses `all`, a class name or an operation name.
    pub fn parse(name: &str) -> Option<Scope> {
        if name == "all" {
            Some(Scope::All)
        } else if let Some(class) = Class::from_name(name) {
            Some(Scope::Class(class))
        } else {
            Op::from_name(name).map(Scope::Op)
        }
    }

    /// The name used in rules.
    pub fn name(self) -> &'static str {
        match self {
            Scope::All => "all",
            Scope::Class(c) => c.name(),
            Scope::Op(o) => o.name(),
        }
    }

    /// Whether a rate of bytes means anything here: some operation it covers moves
    /// bytes ([`Op::moves_bytes`]). True for `read`, `write`, `mmap`, `data` and `all`
    /// (mixed: its data calls are charged their bytes, the others pass freely, so
    /// `all=100MiB/s` limits the bytes moved, as `data=100MiB/s` does).
    pub fn moves_bytes(self) -> bool {
        Op::ALL
            .iter()
            .any(|op| self.covers(*op) && op.moves_bytes())
    }
}

pub(crate) mod class_name {
    use super::Class;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(c: &Class, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(c.name())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Class, D::Error> {
        let name = String::deserialize(d)?;
        Class::from_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!("unknown class {}", crate::quote(&name)))
        })
    }
}

mod op_name {
    use super::Op;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(o: &Op, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(o.name())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Op, D::Error> {
        let name = String::deserialize(d)?;
        Op::from_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!("unknown operation {}", crate::quote(&name)))
        })
    }
}

/// What a channel's tokens stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// One token per request.
    Requests,
    /// One token per byte transferred (requests that move no bytes pass freely).
    Bytes,
}

/// One token in thousandths: the unit of [`Costs`].
pub const MILLI_TOKENS: u32 = 1000;
/// The most one request may cost in a weighted channel: 1000 tokens.
pub const MAX_COST: u32 = 1000 * MILLI_TOKENS;

/// What each operation's request costs in a request channel, in thousandths of a token
/// (the control plane's `weights` of a resource: what a call costs the file system's
/// server); an operation not named costs one token. Sorted by operation, each once.
/// On the wire: `{"open": 3000, "close": 0}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Costs(Vec<(Op, u32)>);

impl Costs {
    /// The costs (thousandths of a token) of the operations named.
    pub fn new(costs: impl IntoIterator<Item = (Op, u32)>) -> Result<Costs, CostError> {
        let mut costs: Vec<(Op, u32)> = costs.into_iter().collect();
        if let Some(&(op, cost)) = costs.iter().find(|(_, cost)| *cost > MAX_COST) {
            return Err(CostError::TooHigh(op, cost));
        }
        costs.sort_by_key(|(op, _)| *op);
        if let Some(pair) = costs.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(CostError::Twice(pair[0].0));
        }
        Ok(Costs(costs))
    }

    /// Every request costs one token (no operation named).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What a request of `op` costs, thousandths of a token.
    pub fn of(&self, op: Op) -> u32 {
        self.0
            .iter()
            .find(|(named, _)| *named == op)
            .map_or(MILLI_TOKENS, |(_, cost)| *cost)
    }

    /// The operations named and their costs, in operation order.
    pub fn iter(&self) -> impl Iterator<Item = (Op, u32)> + '_ {
        self.0.iter().copied()
    }
}

/// Costs [`Costs::new`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CostError {
    /// More than [`MAX_COST`] (the operation and its cost).
    #[error("{0} costs {1} thousandths of a token, more than {MAX_COST}")]
    TooHigh(Op, u32),
    /// An operation named twice.
    #[error("{0} is given two costs")]
    Twice(Op),
}

impl Serialize for Costs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (op, cost) in &self.0 {
            map.serialize_entry(op.name(), cost)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Costs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let named = std::collections::BTreeMap::<String, u32>::deserialize(deserializer)?;
        let costs = named
            .into_iter()
            .map(|(name, cost)| {
                Op::from_name(&name).map(|op| (op, cost)).ok_or_else(|| {
                    D::Error::custom(format!("unknown operation {}", crate::quote(&name)))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Costs::new(costs).map_err(D::Error::custom)
    }
}

/// A channel's selector and limit, as configured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChannelSpec {
    /// The mountpoint (as registered) this channel is confined to; `None` = all of them.
    pub mount: Option<String>,
    /// The operations it serves.
    pub scope: Scope,
    /// Tokens per second.
    pub rate: u64,
    /// What a token is.
    pub unit: Unit,
    /// Bucket depth in tokens.
    pub burst: u64,
    /// What each operation's request costs, for a channel of requests given weights by
    /// the control plane (empty: one token each; always empty for bytes).
    #[serde(default, skip_serializing_if = "Costs::is_empty")]
    pub costs: Costs,
}

impl ChannelSpec {
    /// How many bucket units one of its tokens is: a weighted channel (requests with
    /// costs) counts thousandths of a token, so that an operation may cost a
    /// fraction; every other channel counts whole tokens (requests or bytes).
    pub fn units_per_token(&self) -> u64 {
        if self.unit == Unit::Requests && !self.costs.is_empty() {
            MILLI_TOKENS as u64
        } else {
            1
        }
    }

    /// The highest rate it may have: [`MAX_RATE`] bucket units a second.
    pub fn max_rate(&self) -> u64 {
        MAX_RATE / self.units_per_token()
    }
}

/// Whom a configured limit binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitScope {
    /// All the processes of the job on this node together (ranks, children, later
    /// processes of the batch script): their buckets are shared through the node's
    /// memory.
    Job,
    /// Each process on its own.
    Process,
}

impl LimitScope {
    /// Parses `job` or `process`.
    pub fn parse(text: &str) -> Result<LimitScope, LimitScopeError> {
        match text.trim() {
            "job" => Ok(LimitScope::Job),
            "process" => Ok(LimitScope::Process),
            other => Err(LimitScopeError(other.to_string())),
        }
    }

    /// The name used in settings and statistics.
    pub fn name(self) -> &'static str {
        match self {
            LimitScope::Job => "job",
            LimitScope::Process => "process",
        }
    }
}

/// A limit scope [`LimitScope::parse`] refused (the text, trimmed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad limit scope {} (use job or process)", crate::quote(.0))]
pub struct LimitScopeError(pub String);

/// A channel's identity within this stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChannelId(pub u8);

/// Most channels a stage can hold (a [`ChannelId`] and a route entry are one byte).
pub const MAX_CHANNELS: usize = 255;
/// Most channels that can apply to one request (a mountpoint and an operation): a
/// route packs four channel ids.
pub const MAX_CHANNELS_PER_REQUEST: usize = 4;
/// Most mountpoints a stage manages (the columns of its route table; the controller
/// takes no more from a stage either).
pub const MAX_MOUNTS: usize = 64;
/// Slots in the stage's tables indexed by channel (its channel table and each thread's
/// counters and credit): one more than [`MAX_CHANNELS`] (the last is never used), so
/// that any byte of a route minus one indexes them without a bounds check.
pub const SLOT_COUNT: usize = MAX_CHANNELS + 1;

/// A channel's configuration and counters, for statistics and the control plane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChannelInfo {
    /// Its identity.
    pub id: ChannelId,
    /// Its selector and limit.
    pub spec: ChannelSpec,
    /// Requests admitted so far.
    pub admitted: u64,
    /// Tokens consumed so far (requests or bytes, per `spec.unit`).
    pub tokens: u64,
    /// Whom its limit binds: `job` when its bucket is shared by the job's processes
    /// on this node, `process` when this process has its own.
    #[serde(default = "per_process")]
    pub binds: LimitScope,
}

fn per_process() -> LimitScope {
    LimitScope::Process
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_thousandths_of_a_token_one_per_operation() {
        let costs = Costs::new([(Op::Close, 0), (Op::Open, 3 * MILLI_TOKENS)]).unwrap();
        let half = Costs::new([(Op::Getattr, MILLI_TOKENS / 10)]).unwrap();
        assert_eq!(half.of(Op::Getattr), 100);
        assert_eq!(costs.of(Op::Open), 3000);
        assert_eq!(costs.of(Op::Close), 0);
        assert_eq!(costs.of(Op::Getattr), MILLI_TOKENS, "not named: one token");
        let text = serde_json::to_string(&costs).unwrap();
        assert_eq!(text, r#"{"open":3000,"close":0}"#);
        assert_eq!(serde_json::from_str::<Costs>(&text).unwrap(), costs);
        assert_eq!(
            Costs::new([(Op::Open, 1), (Op::Open, 2)]),
            Err(CostError::Twice(Op::Open))
        );
        assert_eq!(
            Costs::new([(Op::Open, MAX_COST + 1)]),
            Err(CostError::TooHigh(Op::Open, MAX_COST + 1))
        );
        for bad in [r#"{"create":3}"#, r#"{"open":-1}"#, r#"{"open":1000001}"#] {
            assert!(serde_json::from_str::<Costs>(bad).is_err(), "{bad}");
        }
        // A spec without costs reads and writes as before.
        let spec: ChannelSpec = serde_json::from_str(
            r#"{"mount":"/s","scope":{"class":"metadata"},"rate":5,"unit":"requests","burst":1}"#,
        )
        .unwrap();
        assert!(spec.costs.is_empty());
        assert!(!serde_json::to_string(&spec).unwrap().contains("costs"));
        let weighted = ChannelSpec { costs, ..spec };
        assert_eq!(
            weighted.to_string(),
            "/s:metadata=5/s weighing open=3, close=0"
        );
    }
}
