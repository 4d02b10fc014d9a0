//! The relay's server: local controllers attach to it as to a global controller.

use super::Relay;
use crate::proto::{self, global_message, local_message, GlobalMessage, LocalMessage, Uplink};
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::ServerTlsConfig;
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

/// The largest message a local controller may send a relay: what it carries goes on
/// in a `RelayUp`, which the global controller decodes up to the default 4 MiB.
const MAX_MESSAGE_BYTES: usize = 3 << 20;

/// The `Global` service as a relay serves it: `Attach` only.
struct Downstream {
    relay: Arc<Relay>,
    authenticate: bool,
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl proto::global_server::Global for Downstream {
    type AttachStream = Boxed<GlobalMessage>;
    type RelayStream = Boxed<proto::RelayDown>;

    /// A local controller's stream, checked as a global controller checks it (its
    /// certificate names the node it registers), carried on the relay's stream.
    async fn attach(
        &self,
        request: Request<Streaming<LocalMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let (name, mut inbound) = crate::global::registered(request, self.authenticate).await?;
        let super::Link {
            number: link,
            upstream,
            downstream,
        } = self.relay.open_link()?;
        let register = LocalMessage {
            body: Some(local_message::Body::Register(proto::Register {
                node: name.clone(),
                version: proto::VERSION,
            })),
        };
        let uplink = move |message| Uplink { link, message };
        if upstream.send(uplink(Some(register))).is_err() {
            self.relay.close_link(link);
            return Err(Status::unavailable("the relay lost the global controller"));
        }
        let relay = self.relay.clone();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(message)) => {
                        if upstream.send(uplink(Some(message))).is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        debug!(node = %name, "stream error: {status}");
                        break;
                    }
                }
            }
            let _ = upstream.send(uplink(None));
            relay.close_link(link);
        });
        Ok(Response::new(Box::pin(downstream.map(as_sent))))
    }

    async fn relay(
        &self,
        _: Request<Streaming<proto::RelayUp>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        Err(Status::unimplemented(
            "this is a relay: relays attach to the global controller",
        ))
    }

    async fn standing(
        &self,
        _: Request<proto::StandingRequest>,
    ) -> Result<Response<proto::StandingReply>, Status> {
        Err(Status::unimplemented(
            "this is a relay, not a global controller",
        ))
    }
}

/// A message as it leaves for its local controller: a `Schedule`'s wait counted from
/// now, not from when the relay received it. Nodes attaching by the thousand queue
/// their first `Schedule`s behind one another; each would keep its message's wait in
/// that queue as a lag of its report, cycle after cycle, and the reports of a relay's
/// nodes, due together, would come tens of milliseconds apart.
fn as_sent((received, message): super::Delivered) -> Result<GlobalMessage, Status> {
    let mut message = message?;
    if let Some(global_message::Body::Schedule(schedule)) = &mut message.body {
        let waited = received.elapsed().as_millis() as u64;
        schedule.report_in_ms = schedule.report_in_ms.saturating_sub(waited);
    }
    Ok(message)
}

/// Serves local controllers on `listener`: with mutual TLS when `tls` is given (each
/// must present a certificate for the node it registers), plaintext otherwise; its
/// connections capped as a global controller's are.
pub(super) async fn serve(
    relay: Arc<Relay>,
    listener: tokio::net::TcpListener,
    tls: Option<ServerTlsConfig>,
) -> Result<(), crate::global::ServeError> {
    use crate::global::ServeError;
    let mut caps = crate::bounds::ListenerCaps::of_this_process().grpc;
    let authenticate = tls.is_some();
    if !authenticate {
        caps = caps.without_authentication();
    }
    let incoming = crate::bounds::Incoming::new(listener, "relay listener", caps);
    let mut builder = tonic::transport::Server::builder().max_concurrent_streams(4);
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(ServeError::Tls)?;
    }
    let service = proto::global_server::GlobalServer::new(Downstream {
        relay,
        authenticate,
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    builder
        .add_service(service)
        .serve_with_incoming(incoming)
        .await
        .map_err(ServeError::Failed)
}
