//! `cheferd relay`: local controllers attach to it as to the global controller, and it
//! carries all their streams to the global controller in one (`Relay`): per interval
//! one message with every report, one with every rule, where the global controller
//! would have received and sent one per node. A relay per rack (or per few hundred
//! nodes) keeps the global controller's connections and messages per interval at the
//! number of relays (docs/benchmarks.md, "Relays").
//!
//! A relay interprets nothing: each node's stream is its own inside the relay's (it
//! registers, reports and is sent rules, terms and schedules as if attached directly),
//! and ends when the relay loses the global controller; its local controller then
//! re-attaches, through the relay once it has a stream again. With TLS a relay checks
//! each local controller's certificate as the global controller would, and the global
//! controller takes the relay's word for its nodes only if its configuration names the
//! relay (`relays`).

mod downstream;
mod upstream;

use crate::outbox;
use crate::proto::{GlobalMessage, Uplink};
use padll_wire::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;
use tonic::transport::{ClientTlsConfig, ServerTlsConfig};
use tonic::Status;

/// Local controllers one relay carries at once (as many as one relay stream may).
pub const MAX_LINKS: usize = crate::global::MAX_RELAY_LINKS;

/// What `cheferd relay` runs with.
pub struct RelayOptions {
    /// The global controllers (comma-separated URLs; the leader is followed).
    pub global: String,
    /// Its client side to the global controller (the relay's node certificate).
    pub upstream_tls: Option<ClientTlsConfig>,
    /// Its server side to the local controllers (checking their certificates).
    pub downstream_tls: Option<ServerTlsConfig>,
}

/// The local controllers' streams attached, and the relay's stream to the global
/// controller while it has one.
#[derive(Default)]
struct Relay {
    state: Mutex<Links>,
}

/// A relay's links, by number.
#[derive(Default)]
struct Links {
    /// The queue to the global controller's stream (`None` while there is none):
    /// each link's task holds its own handle to the stream it attached on.
    upstream: Option<Arc<outbox::Sender<Uplink>>>,
    /// The queue to each local controller's stream.
    downstream: HashMap<u32, outbox::Sender<Delivered>>,
    next: u32,
}

/// A message for a local controller and when the relay received it.
type Delivered = (Instant, Result<GlobalMessage, Status>);

/// A local controller's stream on the relay's.
struct Link {
    /// Its number in the relay's stream.
    number: u32,
    /// The queue to the stream to the global controller it is carried on.
    upstream: Arc<outbox::Sender<Uplink>>,
    /// The messages for the local controller.
    downstream: outbox::Receiver<Delivered>,
}

impl Relay {
    /// A new link on the stream to the global controller.
    fn open_link(&self) -> Result<Link, Status> {
        let mut links = lock(&self.state);
        let Some(upstream) = links.upstream.clone() else {
            return Err(Status::unavailable(
                "the relay has no stream to the global controller yet",
            ));
        };
        if links.downstream.len() >= MAX_LINKS {
            return Err(Status::resource_exhausted(format!(
                "the relay carries {MAX_LINKS} local controllers already"
            )));
        }
        let mut number = links.next;
        while links.downstream.contains_key(&number) {
            number = number.wrapping_add(1);
        }
        links.next = number.wrapping_add(1);
        let (sender, downstream) = outbox::channel();
        links.downstream.insert(number, sender);
        Ok(Link {
            number,
            upstream,
            downstream,
        })
    }

    /// Forgets a link whose local controller's stream ended.
    fn close_link(&self, link: u32) {
        lock(&self.state).downstream.remove(&link);
    }
}

/// Serves local controllers on `listener` and carries their streams to the global
/// controller, until the server fails.
pub async fn run(
    listener: tokio::net::TcpListener,
    options: RelayOptions,
) -> Result<(), RelayError> {
    let globals = crate::standby::follow::Globals::new(&options.global, options.upstream_tls)?;
    let relay = Arc::new(Relay::default());
    tokio::select! {
        never = upstream::keep(relay.clone(), globals) => match never {},
        served = downstream::serve(relay, listener, options.downstream_tls) => Ok(served?),
    }
}

/// Why a relay did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// A `--global` URL was refused.
    #[error(transparent)]
    Endpoint(#[from] crate::tls::EndpointError),
    /// Its server (to the local controllers) did not start or failed.
    #[error(transparent)]
    Serve(#[from] crate::global::ServeError),
}
