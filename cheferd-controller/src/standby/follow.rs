//! A local controller's side of a standby: `cheferd local --global A,B,C` follows the
//! leader among them, and refuses rules of an older term than the newest it has seen
//! (terms ordered as [`LeaderTerm`] says, across a replaced etcd too).

use crate::global::{LeaderTerm, LEADER_METADATA};
use crate::proto::{global_message::Body, GlobalMessage};
use std::future::Future;
use std::time::Duration;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::Status;
use tracing::warn;

/// The longest a local controller waits between attempts to reach a global one (the
/// backoff doubles from 100 ms): a new leader waits as long before its first cycle
/// ([`super`]), so that every live node has re-attached by then.
pub const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(5);

/// How long opening a TCP connection to a global controller may take (its TLS
/// handshake has [`crate::tls::HANDSHAKE_TIMEOUT`]).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a connection to a global controller may stay silent before it is pinged.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(2);

/// How long a ping may go unanswered before the connection is given up.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The global controllers a local controller may attach to, the one it tries now, and
/// the newest leader term it has seen.
pub struct Globals {
    globals: Vec<(String, Endpoint)>,
    current: usize,
    newest: LeaderTerm,
}

/// What to do with a message from the global controller.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Handle it.
    Follow,
    /// An `Enforce` of an older term: drop it (fencing), saying why.
    Ignore(String),
    /// A `Registered` of an older term: this global controller was deposed; leave its
    /// stream, saying why.
    Leave(String),
}

/// Keeps one stream to the global controllers in `globals` (a local controller's or a
/// relay's): connects to the current one and runs `stream` on the channel until it
/// ends; it hands `globals` back and says whether the global controller took the
/// stream and whether the list wrapped in moving on. Backs off 100 ms, doubling to
/// [`MAX_RECONNECT_BACKOFF`] while the whole list fails.
pub async fn reconnecting<F>(
    mut globals: Globals,
    mut stream: impl FnMut(Globals, Channel) -> F,
) -> std::convert::Infallible
where
    F: Future<Output = (Globals, bool, bool)>,
{
    let mut backoff = Duration::from_millis(100);
    let mut reported_unreachable = false;
    loop {
        // Whether the whole list was tried without a stream (then back off longer).
        let wrapped = match globals.endpoint().connect().await {
            Ok(channel) => {
                let (taken, wrapped);
                (globals, taken, wrapped) = stream(globals, channel).await;
                if taken {
                    backoff = Duration::from_millis(100);
                    reported_unreachable = false;
                }
                wrapped
            }
            Err(e) => {
                if !reported_unreachable {
                    warn!(
                        global = %globals.url(),
                        "cannot reach the global controller ({}); retrying",
                        crate::tls::error_chain(&e)
                    );
                    reported_unreachable = true;
                }
                globals.move_on()
            }
        };
        tokio::time::sleep(backoff).await;
        if wrapped {
            backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
        }
    }
}

impl Globals {
    /// The comma-separated URLs of `--global`, each with `tls` (see
    /// [`crate::tls::endpoint`]). Connecting gives up after [`CONNECT_TIMEOUT`], and each
    /// connection is pinged (HTTP/2 keep-alive, [`KEEP_ALIVE_INTERVAL`]): a global
    /// controller that stopped answering (a frozen process, a network dropping packets)
    /// is left within [`KEEP_ALIVE_INTERVAL`] + [`KEEP_ALIVE_TIMEOUT`], for the next or,
    /// with one, to connect to it again. Without pings its stream would never break:
    /// the kernel keeps a stopped process's connections open.
    pub fn new(
        list: &str,
        tls: Option<ClientTlsConfig>,
    ) -> Result<Globals, crate::tls::EndpointError> {
        let globals = list
            .split(',')
            .map(str::trim)
            .map(|url| {
                if url.is_empty() {
                    return Err(crate::tls::EndpointError::EmptyInList(list.to_string()));
                }
                let endpoint = crate::tls::endpoint(url, tls.clone())?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
                    .keep_alive_timeout(KEEP_ALIVE_TIMEOUT);
                Ok((url.to_string(), endpoint))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Globals {
            globals,
            current: 0,
            newest: LeaderTerm::default(),
        })
    }

    /// The URL to attach to now.
    pub fn url(&self) -> &str {
        &self.globals[self.current].0
    }

    /// Its endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.globals[self.current].1
    }

    /// The stream was lost or could not be opened: try the next one. Returns whether
    /// the whole list has been tried since the last success (time to back off).
    pub fn move_on(&mut self) -> bool {
        self.current = (self.current + 1) % self.globals.len();
        self.current == 0
    }

    /// The global controller refused the stream: go to the leader it names if it is
    /// in the list (a URL from elsewhere is not followed), else to the next. Returns
    /// whether to back off before trying (no leader named).
    pub fn refused(&mut self, status: &Status) -> bool {
        let named = status
            .metadata()
            .get(LEADER_METADATA)
            .and_then(|v| v.to_str().ok());
        match named.and_then(|leader| self.globals.iter().position(|(url, _)| url == leader)) {
            Some(leader) if leader != self.current => {
                self.current = leader;
                false
            }
            _ => self.move_on(),
        }
    }

    /// Checks a message's term against the newest seen (and records a newer one).
    pub fn check(&mut self, message: &GlobalMessage) -> Verdict {
        let (sent, registered) = match &message.body {
            Some(Body::Registered(r)) => (LeaderTerm::of(r.term, r.generation.as_ref()), true),
            Some(Body::Enforce(e)) => (LeaderTerm::of(e.term, e.generation.as_ref()), false),
            _ => return Verdict::Follow,
        };
        if let Some(newest) = sent.follows(self.newest) {
            self.newest = newest;
            return Verdict::Follow;
        }
        let why = format!("{} sent {}", self.url(), sent.refusal(self.newest));
        if registered {
            Verdict::Leave(why)
        } else {
            Verdict::Ignore(why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Enforce, Registered};

    fn globals() -> Globals {
        Globals::new("http://a:1,http://b:2,http://c:3", None).unwrap()
    }

    fn enforce(term: u64) -> GlobalMessage {
        GlobalMessage {
            body: Some(Body::Enforce(Enforce {
                term,
                ..Default::default()
            })),
        }
    }

    fn registered(term: u64) -> GlobalMessage {
        GlobalMessage {
            body: Some(Body::Registered(Registered {
                term,
                ..Default::default()
            })),
        }
    }

    #[test]
    fn an_older_term_is_refused_after_a_newer_one() {
        let mut g = globals();
        assert_eq!(g.check(&registered(7)), Verdict::Follow);
        assert_eq!(g.check(&enforce(7)), Verdict::Follow);
        assert_eq!(g.check(&enforce(9)), Verdict::Follow);
        assert!(matches!(g.check(&enforce(7)), Verdict::Ignore(_)));
        assert!(matches!(g.check(&registered(8)), Verdict::Leave(_)));
        assert_eq!(g.check(&registered(9)), Verdict::Follow);
    }

    fn registered_in(created_ms: u64, term: u64) -> GlobalMessage {
        GlobalMessage {
            body: Some(Body::Registered(Registered {
                term,
                generation: Some(crate::proto::Generation {
                    created_ms,
                    nonce: 1,
                }),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn the_leader_of_a_replaced_etcd_is_followed_and_the_old_data_refused_after() {
        let mut g = globals();
        assert_eq!(g.check(&registered_in(1_000, 18)), Verdict::Follow);
        assert_eq!(g.check(&registered_in(90_000, 2)), Verdict::Follow);
        assert_eq!(g.check(&enforce(2)), Verdict::Follow, "its Enforce");
        let Verdict::Leave(why) = g.check(&registered_in(1_000, 30)) else {
            panic!("a leader of the replaced data was followed");
        };
        assert!(
            why.starts_with(
                "http://a:1 sent term 30 of the etcd data of 1970-01-01 00:00:01.000 UTC"
            ),
            "{why}"
        );
        assert!(matches!(g.check(&enforce(1)), Verdict::Ignore(_)));
    }

    #[test]
    fn a_refusal_leads_to_the_named_leader_only_if_listed() {
        let mut g = globals();
        let mut status = Status::unavailable("standby");
        status
            .metadata_mut()
            .insert(LEADER_METADATA, "http://c:3".parse().unwrap());
        assert!(!g.refused(&status));
        assert_eq!(g.url(), "http://c:3");
        let mut stranger = Status::unavailable("standby");
        stranger
            .metadata_mut()
            .insert(LEADER_METADATA, "http://evil:9".parse().unwrap());
        assert!(g.refused(&stranger), "the list wrapped around");
        assert_eq!(g.url(), "http://a:1");
        assert!(!g.move_on());
        assert_eq!(g.url(), "http://b:2");
    }

    /// A lone global controller that stopped (`kill -STOP`: its kernel accepts the
    /// connection and keeps it, the process never answers) is left within the pings'
    /// timeout: without them the stream would wait forever.
    #[tokio::test]
    async fn a_lone_global_that_never_answers_is_left() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut connections = Vec::new();
            loop {
                connections.push(listener.accept().await.unwrap().0);
            }
        });
        let globals = Globals::new(&url, None).unwrap();
        let attach = async {
            let channel = globals.endpoint().connect().await?;
            let mut client = crate::proto::global_client::GlobalClient::new(channel);
            client
                .attach(tokio_stream::pending::<crate::proto::LocalMessage>())
                .await?;
            Ok::<_, Box<dyn std::error::Error>>(())
        };
        let waited = KEEP_ALIVE_INTERVAL + KEEP_ALIVE_TIMEOUT;
        let left = tokio::time::timeout(waited * 6, attach).await;
        assert!(
            matches!(left, Ok(Err(_))),
            "still waiting for the global controller after {:?}",
            waited * 6
        );
        held.abort();
    }

    #[test]
    fn an_empty_url_is_refused() {
        let error = Globals::new("http://a:1,,http://b:2", None).err().unwrap();
        assert!(
            matches!(&error, crate::tls::EndpointError::EmptyInList(list) if list == "http://a:1,,http://b:2"),
            "{error}"
        );
    }
}
