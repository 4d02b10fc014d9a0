//! The stage ↔ local-controller protocol: JSON lines over a Unix socket.
//!
//! Each message is one JSON object on one line, at most [`MAX_MESSAGE_BYTES`] long,
//! tagged by `"type"`. The stage speaks first with [`StageMessage::Hello`] (carrying
//! [`PROTOCOL_VERSION`]); the controller answers [`ControlMessage::Welcome`] or
//! [`ControlMessage::Reject`]. Afterwards the stage pushes [`StageMessage::Usage`] every
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

use crate::channel::{ChannelInfo, ChannelSpec};
use crate::config::Identity;
use crate::report::OpStats;
use serde::{Deserialize, Serialize};

/// Version of this protocol; a controller rejects stages of another version.
pub const PROTOCOL_VERSION: u32 = 1;

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
    /// The stage is not accepted (e.g. version mismatch); it keeps its rules.
    Reject {
        /// Why.
        reason: String,
    },
    /// Send a [`StageMessage::Usage`] now.
    CollectUsage,
    /// Replace the stage's channels with exactly these (declarative: channels whose
    /// selector and unit match are re-rated in place, others added or removed).
    SetRules {
        /// Echoed in [`StageMessage::Applied`].
        seq: u64,
        /// The full set of channels.
        rules: Vec<ChannelSpec>,
    },
}

/// Encodes a message as one line (with its `\n`).
pub fn encode<T: Serialize>(message: &T) -> String {
    let mut line = serde_json::to_string(message).unwrap_or_default();
    line.push('\n');
    line
}

/// Decodes one line; errors say what is wrong without echoing a huge line back.
pub fn decode<'a, T: Deserialize<'a>>(line: &'a str) -> Result<T, String> {
    if line.len() > MAX_MESSAGE_BYTES {
        return Err(format!(
            "message of {} bytes exceeds {MAX_MESSAGE_BYTES}",
            line.len()
        ));
    }
    serde_json::from_str(line).map_err(|e| format!("malformed message: {}", short(&e.to_string())))
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
    use crate::channel::{Scope, Unit};
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
    }

    #[test]
    fn bad_lines_are_errors() {
        assert!(decode::<ControlMessage>("{\"type\":\"set_rules\"}")
            .unwrap_err()
            .contains("seq"));
        assert!(decode::<ControlMessage>("not json").is_err());
        assert!(decode::<ControlMessage>("{\"type\":\"nuke\"}")
            .unwrap_err()
            .contains("nuke"));
        // Errors never echo more than a short prefix of the input.
        let tag = "y".repeat(100_000);
        let error = decode::<StageMessage>(&format!("{{\"type\":\"{tag}\"}}")).unwrap_err();
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
        assert!(decode::<ControlMessage>(&huge)
            .unwrap_err()
            .contains("exceeds"));
    }
}
