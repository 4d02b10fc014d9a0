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
        Class::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown class '{name}'")))
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
        Op::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown operation '{name}'")))
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
#[error("bad limit scope '{0}' (use job or process)")]
pub struct LimitScopeError(pub String);

/// A channel's identity within this stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChannelId(pub u8);

/// Most channels a stage can hold (a [`ChannelId`] and a route entry are one byte).
pub const MAX_CHANNELS: usize = 255;
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
