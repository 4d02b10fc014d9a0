//! Who may open a gRPC stream: the node names a client's certificate speaks for, on a
//! connection then kept; a stream's first message, a `Register` of this protocol
//! version naming one of them. A global controller's `Attach` and `Relay`, and a
//! relay's `Attach`, admit their streams here.

use crate::bounds::Admission;
use crate::proto::{self, local_message, LocalMessage};
use std::time::Duration;
use tonic::transport::server::TlsConnectInfo;
use tonic::{Request, Status, Streaming};

/// Warnings caused by what gRPC peers sent: at most 20 lines per 5 s.
pub(super) static GRPC_LOG: crate::bounds::LogLimit =
    crate::bounds::LogLimit::new(20, Duration::from_secs(5));

/// The node names the client's certificate speaks for (verified against the site CA
/// in the handshake); `None` without TLS (`authenticate` false). A stream on a kept
/// connection only.
pub(super) fn certified<T>(
    request: &Request<T>,
    authenticate: bool,
) -> Result<Option<Vec<String>>, Status> {
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
