//! The stage ↔ local-controller protocol: JSON lines over a Unix socket.
//!
//! Each message is one JSON object on one line, at most [`MAX_MESSAGE_BYTES`] long,
//! tagged by `"type"`. The stage speaks first with [`StageMessage::Hello`] (carrying
//! [`PROTOCOL_VERSION`]); the controller answers [`ControlMessage::Welcome`] or
//! [`ControlMessage::Reject`] (with `"retry":true` when the rejection may change: the
//! stage tries again later). Afterwards the stage pushes [`StageMessage::Usage`] every
//! `report_interval_ms` (and on [`ControlMessage::CollectUsage`]), and applies
//! [`ControlMessage::SetRules`], acknowledging with [`StageMessage::Applied`].
//! Either side drops (and logs) a line that is malformed or too long; neither crashes.
//!
//! ```text
//! stage → {"type":"hello","version":1,"stage_name":"a.out","identity":{…},"mountpoints":["/scratch"]}
//! ctrl  → {"type":"welcome","version":1,"stage_id":7,"report_interval_ms":250}
//! stage → {"type":"usage","seq":1,"channels":[{"spec":{…},"admitted":10,"tokens":10}],"ops":[…]}
//! ctrl  → {"type":"set_rules","seq":3,"rules":[{"mount":"/scratch","scope":{"class":"metadata"},"rate":500,"unit":"requests","burst":5}]}
//! stage → {"type":"applied","seq":3,"error":null}
//! ```

use crate::channel::{ChannelInfo, ChannelSpec, MAX_CHANNELS};
use crate::config::Identity;
pub use crate::config::MAX_STRIPES;
use crate::latency::LatencyRow;
use crate::report::OpStats;
use serde::{Deserialize, Serialize};

/// Version of this protocol; a controller rejects stages of a version outside
/// [`OLDEST_PROTOCOL_VERSION`] ..= this. Version 2 added [`StageMessage::FileSize`].
pub const PROTOCOL_VERSION: u32 = 2;

/// The oldest stage version a controller still serves (a stage of version 1 never
/// sends [`StageMessage::FileSize`]; it needs nothing else).
pub const OLDEST_PROTOCOL_VERSION: u32 = 1;

/// Largest file size a [`StageMessage::FileSize`] may report, bytes (1 EiB: beyond any
/// file system's files; a larger value is a peer's error).
pub const MAX_FILE_BYTES: u64 = 1 << 60;

/// Longest line either side accepts, in bytes (a stage with the maximum 255 channels
/// reports well under this).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// Messages from a stage to its local controller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum StageMessage {
    /// First message: who this stage is.
    Hello {
        /// [`PROTOCOL_VERSION`] of the stage.
        version: u32,
        /// The program's name.
        stage_name: String,
        /// Job, user, host, pids.
        identity: Identity,
        /// Registered mountpoints.
        mountpoints: Vec<String>,
    },
    /// Cumulative counters (the controller derives rates from successive reports).
    Usage {
        /// Increases by one per report.
        seq: u64,
        /// Every channel with its cumulative admitted requests and tokens.
        channels: Vec<ChannelInfo>,
        /// Per-operation cumulative counters.
        ops: Vec<OpStats>,
        /// Service times of managed calls per mountpoint and class, cumulative (absent
        /// from stages that measure none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        latency: Vec<LatencyRow>,
    },
    /// Where should a new file on `mount` go? (Placement: answered with
    /// [`ControlMessage::Placed`].)
    Place {
        /// Echoed in the answer.
        id: u64,
        /// The mountpoint the file is created under.
        mount: String,
        /// Storage targets wanted (stripe count, 1 … [`MAX_STRIPES`]).
        stripes: u32,
    },
    /// A file this stage created placed on `mount` (after a [`StageMessage::Place`])
    /// held `bytes` when the stage closed its last descriptor of it (the size
    /// history behind the prediction of the next files' sizes). At most
    /// [`MAX_FILE_BYTES`].
    FileSize {
        /// The mountpoint the file is under (one of the stage's).
        mount: String,
        /// Its size, bytes.
        bytes: u64,
    },
    /// Outcome of a [`ControlMessage::SetRules`].
    Applied {
        /// The `seq` of the rules applied.
        seq: u64,
        /// Why the rules were refused (the previous rules stay in force).
        error: Option<String>,
    },
}

/// Messages from a local controller to a stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlMessage {
    /// The stage is registered.
    Welcome {
        /// The controller's [`PROTOCOL_VERSION`].
        version: u32,
        /// The stage's id at this controller.
        stage_id: u64,
        /// How often to push [`StageMessage::Usage`].
        report_interval_ms: u64,
    },
    /// The stage is not accepted; it keeps its rules.
    Reject {
        /// Why.
        reason: String,
        /// Whether the rejection may change while the stage runs (a cap on connections
        /// or jobs, a byte budget, a slow hello): the stage retries on its slow backoff
        /// (≤ 5 s, with jitter). Absent or `false` (as from a controller before this
        /// field): it cannot (a protocol version or a stage the controller never takes);
        /// the stage gives up. Sent only when `true`, so a permanent rejection is the
        /// line it always was (a stage before this field does not decode one with it:
        /// it counts it as a failed handshake and retries, as it should).
        #[serde(default, skip_serializing_if = "is_false")]
        retry: bool,
    },
    /// Send a [`StageMessage::Usage`] now.
    CollectUsage,
    /// The targets (OST indices) for the new file of a [`StageMessage::Place`]; empty =
    /// no advice (the file is created as usual).
    Placed {
        /// The request's `id`.
        id: u64,
        /// Target indices, one per stripe (at most [`MAX_STRIPES`] are used).
        targets: Vec<u32>,
    },
    /// Replace the stage's channels with exactly these (declarative: channels whose
    /// selector and unit match are re-rated in place, others added or removed).
    SetRules {
        /// Echoed in [`StageMessage::Applied`].
        seq: u64,
        /// The full set of channels.
        rules: Vec<ChannelSpec>,
    },
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The rules a job's stages last received from the controller on this node, which the
/// job's processes starting while the controller is unreachable apply (fail closed).
/// The stage keeps them as JSON in a file only the job's uid can write.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LastRules {
    /// [`LAST_RULES_VERSION`].
    pub version: u32,
    /// The full channel set, as in [`ControlMessage::SetRules`].
    pub rules: Vec<ChannelSpec>,
}

/// Version of the [`LastRules`] format; a file of another version is not used.
pub const LAST_RULES_VERSION: u32 = 1;

/// Largest [`LastRules`] file read, in bytes (the maximum 255 channels fit in ≈ 30 KiB).
pub const MAX_LAST_RULES_BYTES: usize = 64 * 1024;

impl LastRules {
    /// The file's contents for `rules`.
    pub fn encode(rules: &[ChannelSpec]) -> String {
        encode(&LastRules {
            version: LAST_RULES_VERSION,
            rules: rules.to_vec(),
        })
    }

    /// Reads a file's contents back: at most [`MAX_LAST_RULES_BYTES`], this version, at
    /// most [`MAX_CHANNELS`] rules, each with a rate in 1 … [`ChannelSpec::max_rate`] and a burst of
    /// at least 1. Whether their mountpoints are the stage's is the stage's to check.
    pub fn decode(bytes: &[u8]) -> Result<Vec<ChannelSpec>, LastRulesError> {
        if bytes.len() > MAX_LAST_RULES_BYTES {
            return Err(LastRulesError::TooLong(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| LastRulesError::NotUtf8)?;
        let saved: LastRules = decode(text.trim_end())?;
        if saved.version != LAST_RULES_VERSION {
            return Err(LastRulesError::Version(saved.version));
        }
        if saved.rules.len() > MAX_CHANNELS {
            return Err(LastRulesError::TooMany(saved.rules.len()));
        }
        if let Some(bad) = saved
            .rules
            .iter()
            .find(|r| r.rate == 0 || r.rate > r.max_rate() || r.burst == 0)
        {
            return Err(LastRulesError::OutOfRange(bad.clone()));
        }
        Ok(saved.rules)
    }
}

/// A [`LastRules`] file refused, and what about it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LastRulesError {
    /// Longer than [`MAX_LAST_RULES_BYTES`] (its length).
    #[error("{0} bytes exceeds {MAX_LAST_RULES_BYTES}")]
    TooLong(usize),
    /// Not text.
    #[error("not UTF-8 text")]
    NotUtf8,
    /// Not a [`LastRules`] line.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// Another format version (the file's).
    #[error("format version {0} (this stage reads {LAST_RULES_VERSION})")]
    Version(u32),
    /// More rules than a stage holds (their number).
    #[error("{0} rules (a stage holds at most {MAX_CHANNELS})")]
    TooMany(usize),
    /// A rule with a rate or burst out of range (kept).
    #[error("rule '{0}' has a rate or burst out of range")]
    OutOfRange(ChannelSpec),
}

/// A message line [`decode`] refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Longer than [`MAX_MESSAGE_BYTES`] (its length).
    #[error("message of {0} bytes exceeds {MAX_MESSAGE_BYTES}")]
    TooLong(usize),
    /// Not JSON of a known message: serde's reason, [`short`]ened (a peer's bytes it
    /// echoes are never logged at length).
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// Encodes a message as one line (with its `\n`).
pub fn encode<T: Serialize>(message: &T) -> String {
    let mut line = serde_json::to_string(message).unwrap_or_default();
    line.push('\n');
    line
}

/// Decodes one line; errors say what is wrong without echoing a huge line back.
pub fn decode<'a, T: Deserialize<'a>>(line: &'a str) -> Result<T, DecodeError> {
    if line.len() > MAX_MESSAGE_BYTES {
        return Err(DecodeError::TooLong(line.len()));
    }
    serde_json::from_str(line).map_err(|e| DecodeError::Malformed(short(&e.to_string())))
}

/// Longest piece of an error message that may come from a peer's input (serde echoes
/// unknown tags and field names): hostile input is never echoed at length into a log.
pub const MAX_ECHO_CHARS: usize = 160;

/// `text` cut to [`MAX_ECHO_CHARS`] characters (marked with `…` and the full length),
/// control characters replaced, so a peer's bytes cannot flood or forge log lines.
pub fn short(text: &str) -> String {
    let count = text.chars().count();
    let mut out: String = text
        .chars()
        .take(MAX_ECHO_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if count > MAX_ECHO_CHARS {
        out.push_str(&format!("… ({count} characters)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{Scope, Unit, MAX_RATE};
    use crate::ops::Class;

    #[test]
    fn round_trip() {
        let rules = ControlMessage::SetRules {
            seq: 3,
            rules: vec![ChannelSpec {
                mount: Some("/scratch".into()),
                scope: Scope::Class(Class::Metadata),
                rate: 500,
                unit: Unit::Requests,
                burst: 5,
                costs: Default::default(),
            }],
        };
        let line = encode(&rules);
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        assert_eq!(decode::<ControlMessage>(line.trim_end()).unwrap(), rules);
        let hello = StageMessage::Hello {
            version: PROTOCOL_VERSION,
            stage_name: "a.out".into(),
            identity: Identity::default(),
            mountpoints: vec!["/scratch".into()],
        };
        assert_eq!(
            decode::<StageMessage>(encode(&hello).trim_end()).unwrap(),
            hello
        );
        let size = StageMessage::FileSize {
            mount: "/lustre".into(),
            bytes: 4096,
        };
        let line = encode(&size);
        assert_eq!(
            line,
            "{\"type\":\"file_size\",\"mount\":\"/lustre\",\"bytes\":4096}\n"
        );
        assert_eq!(decode::<StageMessage>(line.trim_end()).unwrap(), size);
    }

    #[test]
    fn a_reject_says_whether_to_retry_compatibly() {
        // A permanent rejection is the line it always was; absent means permanent.
        let permanent = ControlMessage::Reject {
            reason: "protocol version 9 is not supported".into(),
            retry: false,
        };
        assert_eq!(
            encode(&permanent),
            "{\"type\":\"reject\",\"reason\":\"protocol version 9 is not supported\"}\n"
        );
        assert_eq!(
            decode::<ControlMessage>(
                "{\"type\":\"reject\",\"reason\":\"protocol version 9 is not supported\"}"
            )
            .unwrap(),
            permanent
        );
        let temporary = ControlMessage::Reject {
            reason: "uid 1000 has 20 connections (the limit per uid)".into(),
            retry: true,
        };
        let line = encode(&temporary);
        assert!(line.contains("\"retry\":true"), "{line}");
        assert_eq!(
            decode::<ControlMessage>(line.trim_end()).unwrap(),
            temporary
        );
        assert!(
            decode::<ControlMessage>("{\"type\":\"reject\",\"reason\":\"x\",\"retry\":1}").is_err()
        );
        // A stage before the field does not decode a retried rejection (it counts it as
        // a failed handshake and retries), and decodes a permanent one as always.
        #[derive(Debug, Deserialize)]
        #[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
        enum Before {
            Reject {
                #[allow(dead_code)]
                reason: String,
            },
        }
        assert!(decode::<Before>(line.trim_end()).is_err());
        assert!(decode::<Before>(encode(&permanent).trim_end()).is_ok());
    }

    #[test]
    fn last_rules_are_bounded_and_checked() {
        let rule = ChannelSpec {
            mount: Some("/scratch".into()),
            scope: Scope::Class(Class::Metadata),
            rate: 300,
            unit: Unit::Requests,
            burst: 3,
            costs: Default::default(),
        };
        let text = LastRules::encode(std::slice::from_ref(&rule));
        assert_eq!(
            LastRules::decode(text.as_bytes()).unwrap(),
            vec![rule.clone()]
        );
        assert_eq!(
            LastRules::decode(LastRules::encode(&[]).as_bytes()).unwrap(),
            vec![]
        );
        let with = |version: u32, rules: Vec<ChannelSpec>| {
            LastRules::decode(encode(&LastRules { version, rules }).as_bytes()).unwrap_err()
        };
        assert!(matches!(with(2, vec![]), LastRulesError::Version(2)));
        let too_many = with(1, vec![rule.clone(); MAX_CHANNELS + 1]);
        assert!(too_many.to_string().contains("256 rules"), "{too_many}");
        let weighted = ChannelSpec {
            costs: crate::channel::Costs::new([(crate::ops::Op::Open, 3000)]).unwrap(),
            ..rule.clone()
        };
        for (rate, burst, spec) in [
            (0, 1, &rule),
            (MAX_RATE + 1, 1, &rule),
            (1, 0, &rule),
            // A weighted channel's bucket counts thousandths of a token.
            (MAX_RATE / 1000 + 1, 1, &weighted),
        ] {
            let bad = ChannelSpec {
                rate,
                burst,
                ..spec.clone()
            };
            assert!(
                matches!(with(1, vec![bad.clone()]), LastRulesError::OutOfRange(b) if b == bad)
            );
        }
        let big = vec![b' '; MAX_LAST_RULES_BYTES + 1];
        assert!(matches!(
            LastRules::decode(&big),
            Err(LastRulesError::TooLong(n)) if n == big.len()
        ));
        assert!(matches!(
            LastRules::decode(b"\xff"),
            Err(LastRulesError::NotUtf8)
        ));
        assert!(LastRules::decode(b"{\"version\":1}")
            .unwrap_err()
            .to_string()
            .contains("rules"));
    }

    #[test]
    fn bad_lines_are_errors() {
        assert!(decode::<ControlMessage>("{\"type\":\"set_rules\"}")
            .unwrap_err()
            .to_string()
            .contains("seq"));
        assert!(decode::<ControlMessage>("not json").is_err());
        assert!(decode::<ControlMessage>("{\"type\":\"nuke\"}")
            .unwrap_err()
            .to_string()
            .contains("nuke"));
        // Errors never echo more than a short prefix of the input.
        let tag = "y".repeat(100_000);
        let error = decode::<StageMessage>(&format!("{{\"type\":\"{tag}\"}}"))
            .unwrap_err()
            .to_string();
        assert!(error.len() < MAX_ECHO_CHARS + 100, "{} bytes", error.len());
        // Non-finite, negative or out-of-range numbers are not numbers the protocol has.
        for bad in [
            "NaN",
            "Infinity",
            "-1",
            "1e400",
            "1.5",
            "18446744073709551616",
        ] {
            let line = format!("{{\"type\":\"usage\",\"seq\":{bad},\"channels\":[],\"ops\":[]}}");
            assert!(decode::<StageMessage>(&line).is_err(), "{bad} accepted");
        }
        let huge = format!("\"{}\"", "x".repeat(MAX_MESSAGE_BYTES));
        assert!(matches!(
            decode::<ControlMessage>(&huge),
            Err(DecodeError::TooLong(n)) if n == huge.len()
        ));
    }
}
