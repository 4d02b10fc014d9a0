//! The gRPC endpoint: one `Attach` stream per local controller, its node's identity
//! checked against its TLS client certificate.
//!
//! The TLS handshake lets a client without a certificate through, so that a standby
//! can ask `Standing`; that is all such a client can do. Every connection is
//! provisional ([`crate::bounds::Incoming`]) until a node attaches on it with its
//! certificate: closed after [`crate::bounds::UNAUTHENTICATED_LIFETIME`], and closed to
//! make room when too many are open (in all, or from one address), so connections
//! without a certificate never hold descriptors an attaching node or the admin socket
//! needs. Plaintext (`--insecure-plaintext`) tells no one apart: only the total cap and
//! the lifetime hold there.

use super::node::Outbox;
use super::Controller;
use crate::bounds::Admission;
use crate::outbox;
use crate::proto::{self, global_message, local_message, GlobalMessage, LocalMessage};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::server::TlsConnectInfo;
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

/// Concurrent HTTP/2 streams on one connection: a node needs one (`Attach`), a standby
/// one (`Standing`).
const MAX_STREAMS_PER_CONNECTION: u32 = 16;

/// Warnings caused by what gRPC peers sent: at most 20 lines per 5 s.
pub(super) static GRPC_LOG: crate::bounds::LogLimit =
    crate::bounds::LogLimit::new(20, Duration::from_secs(5));

/// The gRPC service.
pub struct Service {
    /// The controller it serves.
    pub controller: Arc<Controller>,
    /// Whether a node's identity comes from its TLS client certificate (always with
    /// TLS); without, the name in `Register` is taken on trust (`--insecure-plaintext`).
    pub authenticate: bool,
}

#[tonic::async_trait]
impl proto::global_server::Global for Service {
    type AttachStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<GlobalMessage, Status>> + Send>>;

    type RelayStream = super::relay::Downlinks;

    async fn attach(
        &self,
        request: Request<Streaming<LocalMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let (name, mut inbound) = registered(request, self.authenticate).await?;
        self.controller.leadership().admit()?;
        let (outbox, receiver) = outbox::channel();
        let controller = self.controller.clone();
        let stream = controller.attach_node(&name, Outbox::Direct(outbox))?;
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(message)) => controller.handle(&name, stream, message),
                    Ok(None) => break,
                    Err(status) => {
                        debug!(node = %name, "stream error: {status}");
                        break;
                    }
                }
            }
            controller.detach_node(&name, stream);
        });
        // Every message goes out with the leader's term (fencing, `crate::standby`), a
        // `Schedule` with its wait counted from now.
        let controller = self.controller.clone();
        let stamped = tokio_stream::StreamExt::filter_map(receiver, move |message| match message {
            Ok(mut message) => {
                if let Some(global_message::Body::Schedule(schedule)) = &mut message.body {
                    controller.as_sent(stream, schedule);
                }
                controller.leadership().stamp(message).map(Ok)
            }
            Err(status) => Some(Err(status)),
        });
        Ok(Response::new(Box::pin(stamped)))
    }

    /// A relay's stream: the `Attach` streams of the nodes attached to it, in one
    /// (`super::relay`). Under TLS only a relay whose certificate carries a name in the
    /// configuration's `relays` may open one: it vouches for the nodes it carries, whose
    /// certificates it checked.
    async fn relay(
        &self,
        request: Request<Streaming<proto::RelayUp>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        if let Some(names) = certified(&request, self.authenticate)? {
            let relays = self.controller.config().relays;
            if !names.iter().any(|name| relays.contains(name)) {
                let name = padll_wire::control::short(&names[0]).to_string();
                crate::limited_warn!(
                    GRPC_LOG,
                    "refused a relay: its certificate is for node '{name}', which `relays` does not name"
                );
                return Err(Status::permission_denied(format!(
                    "node '{name}' is not a relay (`relays` in the global controller's configuration)"
                )));
            }
        }
        self.controller.leadership().admit()?;
        let mut inbound = request.into_inner();
        let (relay, downlinks) = self.controller.open_relay();
        let controller = self.controller.clone();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(up)) => controller.relayed(&relay, up),
                    Ok(None) => break,
                    Err(status) => {
                        debug!("relay stream error: {status}");
                        break;
                    }
                }
            }
            controller.close_relay(relay);
        });
        Ok(Response::new(downlinks))
    }

    /// Public facts (who leads, in which term, whether etcd answers): asked by a leader
    /// whose lease lapsed, with or without a client certificate (the only request a
    /// client without one can make).
    async fn standing(
        &self,
        _: Request<proto::StandingRequest>,
    ) -> Result<Response<proto::StandingReply>, Status> {
        Ok(Response::new(self.controller.leadership().standing()))
    }
}

/// The node names the client's certificate speaks for (verified against the site CA
/// in the handshake); `None` without TLS (`authenticate` false). A stream on a kept
/// connection only.
fn certified<T>(request: &Request<T>, authenticate: bool) -> Result<Option<Vec<String>>, Status> {
    let certified = if authenticate {
        let certs = request
            .extensions()
            .get::<TlsConnectInfo<Admission>>()
            .and_then(|info| info.peer_certs())
            .filter(|c| !c.is_empty());
        let Some(certs) = certs else {
            return Err(Status::unauthenticated(
                "a node certificate is required (mutual TLS)",
            ));
        };
        let names = crate::tls::node_names(&certs[0])
            .map_err(|e| Status::unauthenticated(e.to_string()))?;
        Some(names)
    } else {
        None
    };
    // A node's or relay's connection stays open for good.
    let kept = request
        .extensions()
        .get::<Admission>()
        .is_none_or(Admission::keep);
    if !kept {
        return Err(Status::unavailable("the connection was closed"));
    }
    Ok(certified)
}

/// An `Attach` stream once its first message registered a node its certificate (if
/// `authenticate`) speaks for: the node's name, and the rest of the stream. Both a
/// global controller and a relay take a local controller's stream so.
pub(crate) async fn registered(
    request: Request<Streaming<LocalMessage>>,
    authenticate: bool,
) -> Result<(String, Streaming<LocalMessage>), Status> {
    let certified = certified(&request, authenticate)?;
    let mut inbound = request.into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no register message within 10 s"))??;
    let name = register_name(first)?;
    if let Some(names) = certified.filter(|names| !names.contains(&name)) {
        let short = |n: &str| padll_wire::control::short(n).to_string();
        crate::limited_warn!(
            GRPC_LOG,
            "refused a local controller: its certificate is for node '{}', it registered as '{}'",
            short(&names[0]),
            short(&name)
        );
        return Err(Status::permission_denied(format!(
            "the client certificate is for node '{}'; it cannot register as '{}'",
            short(&names[0]),
            short(&name)
        )));
    }
    Ok((name, inbound))
}

/// The node name of a stream's first message: a `Register` of this protocol version
/// with a name of 1 to [`crate::bounds::MAX_NAME_BYTES`] bytes.
pub(super) fn register_name(first: Option<LocalMessage>) -> Result<String, Status> {
    match first.and_then(|m| m.body) {
        Some(local_message::Body::Register(proto::Register { node, version }))
            if version == proto::VERSION && node.len() > crate::bounds::MAX_NAME_BYTES =>
        {
            Err(Status::invalid_argument(format!(
                "node name of {} bytes exceeds {}",
                node.len(),
                crate::bounds::MAX_NAME_BYTES
            )))
        }
        Some(local_message::Body::Register(proto::Register { node, version }))
            if version == proto::VERSION && !node.is_empty() =>
        {
            Ok(node)
        }
        Some(local_message::Body::Register(proto::Register { version, .. })) => {
            Err(Status::invalid_argument(format!(
                "protocol version {version} (or empty node name) not supported; expected {}",
                proto::VERSION
            )))
        }
        _ => Err(Status::invalid_argument(
            "the first message must be register",
        )),
    }
}

/// Serves the gRPC endpoint on an already-bound listener (so callers can bind port 0):
/// with mutual TLS when `tls` is given (a node's identity is then its certificate's),
/// plaintext otherwise. Its connections are capped by the descriptor limit
/// ([`crate::bounds::ListenerCaps`]).
pub async fn serve(
    controller: Arc<Controller>,
    listener: tokio::net::TcpListener,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> Result<(), ServeError> {
    let mut caps = crate::bounds::ListenerCaps::of_this_process().grpc;
    let authenticate = tls.is_some();
    if !authenticate {
        caps = caps.without_authentication();
    }
    let incoming = crate::bounds::Incoming::new(listener, "gRPC listener", caps);
    let mut builder =
        tonic::transport::Server::builder().max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(ServeError::Tls)?;
    }
    builder
        .add_service(proto::global_server::GlobalServer::new(Service {
            controller,
            authenticate,
        }))
        .serve_with_incoming(incoming)
        .await
        .map_err(ServeError::Failed)
}

/// Why the gRPC server did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Its TLS configuration was refused.
    #[error("TLS configuration: {0}")]
    Tls(tonic::transport::Error),
    /// It failed while serving.
    #[error("gRPC server failed: {0}")]
    Failed(tonic::transport::Error),
}

impl Controller {
    /// Feeds one stream's messages through what `Attach` does with them after the TLS
    /// check (the register check, attach, each message, detach), without a network:
    /// for the fuzz targets (`fuzz/`). Returns the stream's refusal, if any.
    #[doc(hidden)]
    pub fn feed_stream(
        &self,
        messages: impl IntoIterator<Item = LocalMessage>,
    ) -> Result<(), Status> {
        let mut messages = messages.into_iter();
        let name = register_name(messages.next())?;
        let (outbox, receiver) = outbox::channel();
        let stream = self.attach_node(&name, Outbox::Direct(outbox))?;
        for message in messages {
            self.handle(&name, stream, message);
        }
        self.detach_node(&name, stream);
        drop(receiver);
        Ok(())
    }
}
