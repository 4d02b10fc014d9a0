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

use super::admit::{certified, register_name, registered, GRPC_LOG};
use super::node::Outbox;
use super::Controller;
use crate::outbox;
use crate::proto::{self, global_message, GlobalMessage, LocalMessage};
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

/// Concurrent HTTP/2 streams on one connection: a node needs one (`Attach`), a standby
/// one (`Standing`).
const MAX_STREAMS_PER_CONNECTION: u32 = 16;

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
        let peer = request
            .remote_addr()
            .map_or_else(|| "an unknown address".into(), |addr| addr.to_string());
        let (name, mut inbound) = registered(request, self.authenticate).await?;
        self.controller.leadership().admit()?;
        let (outbox, receiver) = outbox::channel();
        let controller = self.controller.clone();
        let stream = controller.attach_node(&name, &peer, Outbox::Direct(outbox))?;
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(message)) => controller.handle(&name, stream, message),
                    Ok(None) => break,
                    Err(status) => {
                        debug!(node = %padll_wire::control::short(&name), "stream error: {status}");
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
        let stream = self.attach_node(&name, "a fed stream", Outbox::Direct(outbox))?;
        for message in messages {
            self.handle(&name, stream, message);
        }
        self.detach_node(&name, stream);
        drop(receiver);
        Ok(())
    }
}
