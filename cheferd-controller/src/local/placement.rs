//! Stages' placement requests (`place`), relayed to the global controller: at most
//! [`PLACE_RATE_PER_STAGE`] and [`PLACE_RATE_PER_UID`] a second, [`MAX_IN_FLIGHT_PER_UID`]
//! waiting for their answer per uid (and the relay's own caps per stage and node). Over a
//! limit, or without a global controller, a request is answered "no advice" at once: the
//! file is created as usual, and the stage does not wait.
//!
//! The final sizes of placed files (`file_size`) go upstream too, at most
//! [`PLACE_RATE_PER_STAGE`] a second per stage (a stage reports one per file it
//! placed), [`SIZE_RATE_PER_UID`] per uid and [`SIZE_RATE_PER_NODE`] per node; sizes of
//! one stage and mountpoint still unread are sent together (`super::upstream_queue`).
//! A size over a rate, of a mountpoint the stage did not register, beyond
//! [`MAX_FILE_BYTES`], or without room for advice in the queue to the global controller
//! is dropped, naming why.
//!
//! Requests and sizes are advice: they never cost the node its stream to the global
//! controller (`Upstream::offer`).

use super::Local;
use crate::placement_service::Relay;
use crate::proto::{self, local_message};
use padll_wire::control::{ControlMessage, MAX_FILE_BYTES};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Placement requests a stage may make per second (and at once, after a quiet second).
pub const PLACE_RATE_PER_STAGE: u32 = 1000;
/// The same for all the stages of one uid.
pub const PLACE_RATE_PER_UID: u32 = 4000;
/// File sizes all the stages of one uid may report per second (and at once).
pub const SIZE_RATE_PER_UID: u32 = 4000;
/// The same for every stage of the node.
pub const SIZE_RATE_PER_NODE: u32 = 8000;
/// Requests of one uid's stages waiting for the global controller's answer, at most
/// (a quarter of what the node relays: other users still get answers).
pub const MAX_IN_FLIGHT_PER_UID: usize = 1024;

/// A token bucket: `per_second` tokens a second, as many at most.
#[derive(Debug)]
pub(super) struct Rate {
    per_second: f64,
    tokens: f64,
    at: Instant,
}

impl Rate {
    /// A full bucket.
    pub(super) fn new(per_second: u32) -> Rate {
        Rate {
            per_second: per_second.into(),
            tokens: per_second.into(),
            at: Instant::now(),
        }
    }

    /// Takes a token if there is one at `now`.
    pub(super) fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.per_second);
        self.at = now.max(self.at);
        let taken = self.tokens >= 1.0;
        if taken {
            self.tokens -= 1.0;
        }
        taken
    }
}

/// Requests relayed upstream and waiting for their answer, counted per uid.
#[derive(Default)]
pub(super) struct Placements {
    relay: Relay,
    in_flight: Mutex<InFlight>,
}

#[derive(Default)]
struct InFlight {
    per_uid: HashMap<u32, usize>,
    uid_of: HashMap<u64, u32>,
}

impl Placements {
    /// The upstream id for request `id` of stage `stage` of `uid`; `None` when too many
    /// wait (from this uid, this stage or this node).
    fn ask(&self, stage: u64, uid: u32, id: u64) -> Option<u64> {
        let mut in_flight = padll_wire::sync::lock(&self.in_flight);
        let waiting = in_flight.per_uid.get(&uid).copied().unwrap_or(0);
        if waiting >= MAX_IN_FLIGHT_PER_UID {
            return None;
        }
        let request = self.relay.ask(stage, id)?;
        in_flight.uid_of.insert(request, uid);
        in_flight.per_uid.insert(uid, waiting + 1);
        Some(request)
    }

    /// Who asked upstream request `request` (stage, its id), once.
    pub(super) fn answered(&self, request: u64) -> Option<(u64, u64)> {
        let mut in_flight = padll_wire::sync::lock(&self.in_flight);
        if let Some(uid) = in_flight.uid_of.remove(&request) {
            if let Some(waiting) = in_flight.per_uid.get_mut(&uid) {
                *waiting -= 1;
                if *waiting == 0 {
                    in_flight.per_uid.remove(&uid);
                }
            }
        }
        self.relay.answered(request)
    }

    /// Forgets every request (the stream they went on ended).
    pub(super) fn clear(&self) {
        let mut in_flight = padll_wire::sync::lock(&self.in_flight);
        *in_flight = InFlight::default();
        self.relay.clear();
    }
}

impl Local {
    /// Relays placement request `id` of stage `stage_id` of `uid` to the global
    /// controller, or answers "no advice" at once (see the module documentation).
    pub(super) fn relay_placement(
        &self,
        stage_id: u64,
        uid: u32,
        id: u64,
        mount: String,
        stripes: u32,
    ) {
        let upstream = self.lock_upstream().clone();
        let Some((to, request)) =
            upstream.and_then(|to| Some((to, self.placements.ask(stage_id, uid, id)?)))
        else {
            return self.placed(stage_id, id, Vec::new());
        };
        let body = local_message::Body::PlaceRequest(proto::PlaceRequest {
            request,
            mount,
            stripes,
            stage_id,
        });
        if !to.offer(body) {
            self.placements.answered(request);
            self.placed(stage_id, id, Vec::new());
        }
    }

    /// Relays the final size of a file stage `stage_id` created placed on `mount`
    /// upstream, within the stage's `rate`, its uid's `uid_rate` and the node's
    /// (dropped without a global controller: sizes are advice for later files).
    pub(super) fn relay_file_size(
        &self,
        stage_id: u64,
        rate: &mut Rate,
        uid_rate: &Mutex<Rate>,
        mount: String,
        bytes: u64,
    ) -> Result<(), SizeRefused> {
        if bytes > MAX_FILE_BYTES {
            return Err(SizeRefused::TooLarge(bytes));
        }
        let registered = self
            .lock_stages()
            .get(&stage_id)
            .is_some_and(|entry| entry.info.mountpoints.contains(&mount));
        if !registered {
            return Err(SizeRefused::Mount(padll_wire::control::short(&mount)));
        }
        let now = Instant::now();
        if !rate.take(now) {
            return Err(SizeRefused::Rate);
        }
        if !padll_wire::sync::lock(uid_rate).take(now) {
            return Err(SizeRefused::UidRate);
        }
        if !padll_wire::sync::lock(&self.size_rate).take(now) {
            return Err(SizeRefused::NodeRate);
        }
        let body = local_message::Body::FileSizes(proto::FileSizes {
            stage_id,
            mount,
            bytes: vec![bytes],
        });
        // No stream: nothing to tell (sizes are advice); a full queue is counted there.
        let _ = self.offer_upstream(body);
        Ok(())
    }

    /// Hands a stage the answer to its placement request `id`.
    pub(super) fn placed(&self, stage_id: u64, id: u64, targets: Vec<u32>) {
        if let Some(entry) = self.lock_stages().get(&stage_id) {
            // A stage closed meanwhile needs no answer.
            let _ = entry.outbox.send(&ControlMessage::Placed { id, targets });
        }
    }
}

/// A stage's `file_size` dropped, and why.
#[derive(Debug, thiserror::Error)]
pub(super) enum SizeRefused {
    /// Beyond [`MAX_FILE_BYTES`] (the size).
    #[error("{0} bytes is beyond {MAX_FILE_BYTES}")]
    TooLarge(u64),
    /// A mountpoint the stage did not register (shortened).
    #[error("mount '{0}' is not one of the stage's")]
    Mount(String),
    /// Over the stage's rate.
    #[error("more than {PLACE_RATE_PER_STAGE} a second")]
    Rate,
    /// Over its uid's rate.
    #[error("more than {SIZE_RATE_PER_UID} a second from its uid")]
    UidRate,
    /// Over the node's rate.
    #[error("more than {SIZE_RATE_PER_NODE} a second from this node")]
    NodeRate,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_rate_allows_a_second_at_once_then_its_rate() {
        let start = Instant::now();
        let mut rate = Rate::new(100);
        rate.at = start;
        assert_eq!((0..150).filter(|_| rate.take(start)).count(), 100);
        let later = start + Duration::from_millis(500);
        assert_eq!((0..150).filter(|_| rate.take(later)).count(), 50);
        let much_later = later + Duration::from_secs(60);
        assert_eq!((0..150).filter(|_| rate.take(much_later)).count(), 100);
    }

    #[test]
    fn one_uid_cannot_take_every_slot() {
        let placements = Placements::default();
        let mut requests = Vec::new();
        for stage in 0.. {
            let asked: Vec<u64> = (0..64)
                .map_while(|id| placements.ask(stage, 1000, id))
                .collect();
            if asked.is_empty() {
                break;
            }
            requests.extend(asked);
        }
        assert_eq!(requests.len(), MAX_IN_FLIGHT_PER_UID);
        // Another uid still gets its requests relayed.
        let other = placements
            .ask(9999, 1001, 1)
            .expect("another uid is relayed");
        // Answers free the uid's slots.
        assert_eq!(placements.answered(requests[0]), Some((0, 0)));
        assert!(placements.ask(9998, 1000, 1).is_some());
        assert!(placements.ask(9998, 1000, 2).is_none());
        placements.clear();
        assert_eq!(placements.answered(other), None);
        assert!(placements.ask(9997, 1000, 1).is_some(), "cleared");
    }
}
