//! Capped TCP listeners: every connection counted, provisional ones evicted oldest
//! first or at their lifetime, kept ones never closed to make room ([`Incoming`]).

use super::accept::{raise_nofile, AcceptBackoff};
use super::log_limit::LogLimit;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a connection to the gRPC port may stay open before a node attaches on it
/// with its certificate: the TLS handshake and a standby's `Standing` question take
/// milliseconds.
pub const UNAUTHENTICATED_LIFETIME: Duration = Duration::from_secs(5);
/// Most gRPC connections not yet authenticated, at any descriptor limit.
pub const MAX_UNAUTHENTICATED: usize = 1024;
/// Most of them from one source address (an IPv6 /64).
pub const MAX_UNAUTHENTICATED_PER_SOURCE: usize = 64;
/// Most gRPC connections in all: the nodes (`max_nodes` by default) and the
/// unauthenticated ones.
pub const MAX_GRPC_CONNECTIONS: usize = 16_384 + MAX_UNAUTHENTICATED;
/// Most metrics connections at once.
pub const MAX_METRICS_CONNECTIONS: usize = 64;
/// How long a metrics connection may stay open (one request each).
pub const METRICS_LIFETIME: Duration = Duration::from_secs(10);
/// Most admin connections at once.
pub const MAX_ADMIN_CONNECTIONS: usize = 256;

/// Caps on one TCP listener's connections ([`Incoming`]). A connection is
/// *provisional* until its handler keeps it ([`Admission::keep`]): it is closed at
/// `lifetime`, and when a newcomer would exceed `per_source`, `provisional` or `total`,
/// the oldest provisional connection of the newcomer's address (or of the busiest
/// address) is closed to make room, so a flood closes its own connections and does not
/// lock a newcomer out. Kept connections (attached nodes) are never closed to make
/// room: a newcomer is refused when they hold every place. With `provisional` below
/// `total`, `total − provisional` places are always left for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionCaps {
    /// Connections open at once, kept and provisional.
    pub total: usize,
    /// Provisional connections open at once.
    pub provisional: usize,
    /// Provisional connections from one address.
    pub per_source: usize,
    /// How long a provisional connection stays open.
    pub lifetime: Duration,
}

impl ConnectionCaps {
    /// The caps where nothing tells a node's connection from any other before it
    /// attaches (plaintext gRPC, `--insecure-plaintext`: anyone may attach): only
    /// `total` and `lifetime` hold.
    pub fn without_authentication(self) -> ConnectionCaps {
        ConnectionCaps {
            provisional: self.total,
            per_source: self.total,
            ..self
        }
    }
}

/// How a global controller shares its descriptor limit between its listeners: a
/// sixteenth (16 to 1024) stays for its own files, etcd and the runtime, the admin
/// socket has an eighth (at most [`MAX_ADMIN_CONNECTIONS`]), metrics a sixteenth (at
/// most [`MAX_METRICS_CONNECTIONS`]) and the gRPC port the rest (at most
/// [`MAX_GRPC_CONNECTIONS`]). Together they stay below the limit, so a flood of one
/// listener never takes the descriptors another needs: no `EMFILE`, and `cheferd ctl`
/// and attached nodes keep working.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerCaps {
    /// The gRPC port (provisional: until a node attaches with its certificate).
    pub grpc: ConnectionCaps,
    /// Admin socket connections.
    pub admin: usize,
    /// The metrics endpoint (every connection provisional).
    pub metrics: ConnectionCaps,
}

impl ListenerCaps {
    /// The caps under a descriptor limit of `descriptors`.
    pub fn for_descriptors(descriptors: u64) -> ListenerCaps {
        let n = usize::try_from(descriptors).unwrap_or(usize::MAX);
        let own = (n / 16).clamp(16, 1024);
        let admin = (n / 8).clamp(4, MAX_ADMIN_CONNECTIONS);
        let metrics = (n / 16).clamp(2, MAX_METRICS_CONNECTIONS);
        let grpc = n
            .saturating_sub(own + admin + metrics)
            .clamp(8, MAX_GRPC_CONNECTIONS);
        let unauthenticated = (grpc / 4).clamp(2, MAX_UNAUTHENTICATED);
        ListenerCaps {
            grpc: ConnectionCaps {
                total: grpc,
                provisional: unauthenticated,
                per_source: (unauthenticated / 4).clamp(1, MAX_UNAUTHENTICATED_PER_SOURCE),
                lifetime: UNAUTHENTICATED_LIFETIME,
            },
            admin,
            metrics: ConnectionCaps {
                total: metrics,
                provisional: metrics,
                per_source: (metrics / 2).max(1),
                lifetime: METRICS_LIFETIME,
            },
        }
    }

    /// The caps of this process, its soft descriptor limit raised to the hard one first.
    pub fn of_this_process() -> ListenerCaps {
        ListenerCaps::for_descriptors(raise_nofile())
    }
}

/// Peers' connections closed to make room: at most 5 lines per 5 s.
static CROWDED_LOG: LogLimit = LogLimit::new(5, Duration::from_secs(5));

/// The open connections of one listener.
struct Connections {
    what: &'static str,
    caps: ConnectionCaps,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    /// Provisional connections by source, oldest first (no empty queue).
    provisional: HashMap<IpAddr, VecDeque<Arc<Connection>>>,
    provisional_count: usize,
    kept: usize,
}

/// One connection, shared by its stream and its [`Admission`].
struct Connection {
    source: IpAddr,
    /// Closed to make room for a newer one.
    evicted: AtomicBool,
    /// Kept open beyond the provisional lifetime (changed under the table's lock).
    kept: AtomicBool,
    /// The task that last used the stream: woken when it is evicted.
    waker: Mutex<Option<Waker>>,
}

/// The address a connection counts against: an IPv4 address, or an IPv6 /64 (what one
/// host is usually given).
fn source_of(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

impl Connections {
    fn lock(&self) -> MutexGuard<'_, Table> {
        padll_wire::sync::lock(&self.table)
    }

    /// Counts a new provisional connection from `address`, closing the oldest of its
    /// address (or of the busiest one) if it would exceed a cap; `None` (refused) when
    /// kept connections hold every place.
    fn admit(&self, address: IpAddr) -> Option<Arc<Connection>> {
        let source = source_of(address);
        let mut table = self.lock();
        let from_source = table.provisional.get(&source).map_or(0, VecDeque::len);
        let full = table.provisional_count >= self.caps.provisional
            || table.provisional_count + table.kept >= self.caps.total;
        let crowded = if from_source >= self.caps.per_source {
            Some(source)
        } else if full {
            table
                .provisional
                .iter()
                .max_by_key(|(_, queue)| queue.len())
                .map(|(source, _)| *source)
        } else {
            None
        };
        let evicted = crowded.and_then(|source| table.remove_oldest(source));
        if full && evicted.is_none() {
            drop(table);
            crate::limited_warn!(
                CROWDED_LOG,
                "{}: refused a connection from {address}: its {} connections are all kept",
                self.what,
                self.caps.total
            );
            return None;
        }
        let connection = Arc::new(Connection {
            source,
            evicted: AtomicBool::new(false),
            kept: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        table
            .provisional
            .entry(source)
            .or_default()
            .push_back(connection.clone());
        table.provisional_count += 1;
        drop(table);
        if let Some(evicted) = evicted {
            evicted.evict();
            crate::limited_warn!(
                CROWDED_LOG,
                "{}: at its cap of {} connections not yet authenticated ({} per address): closed the oldest from {}",
                self.what,
                self.caps.provisional,
                self.caps.per_source,
                evicted.source
            );
        }
        Some(connection)
    }

    /// Keeps `connection` open for good (it keeps its place); false if it was closed
    /// already.
    fn keep(&self, connection: &Arc<Connection>) -> bool {
        let mut table = self.lock();
        if connection.kept.load(Ordering::Acquire) {
            return true;
        }
        if !table.remove(connection) {
            return false;
        }
        table.kept += 1;
        connection.kept.store(true, Ordering::Release);
        true
    }

    /// Forgets a closed connection.
    fn release(&self, connection: &Arc<Connection>) {
        let mut table = self.lock();
        if connection.kept.load(Ordering::Acquire) {
            table.kept -= 1;
        } else {
            table.remove(connection);
        }
    }
}

impl Table {
    /// Removes a provisional connection; false if it is not (any more) counted.
    fn remove(&mut self, connection: &Arc<Connection>) -> bool {
        let Some(queue) = self.provisional.get_mut(&connection.source) else {
            return false;
        };
        let Some(at) = queue.iter().position(|c| Arc::ptr_eq(c, connection)) else {
            return false;
        };
        queue.remove(at);
        if queue.is_empty() {
            self.provisional.remove(&connection.source);
        }
        self.provisional_count -= 1;
        true
    }

    /// Removes the oldest provisional connection from `source`.
    fn remove_oldest(&mut self, source: IpAddr) -> Option<Arc<Connection>> {
        let oldest = self.provisional.get(&source)?.front()?.clone();
        self.remove(&oldest);
        Some(oldest)
    }
}

impl Connection {
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        let waker = padll_wire::sync::lock(&self.waker).take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// What a connection's handlers know of it (tonic puts it in every request's
/// extensions, under TLS also inside `TlsConnectInfo`).
#[derive(Clone)]
pub struct Admission {
    /// The peer's address.
    pub peer: SocketAddr,
    connection: Arc<Connection>,
    connections: Arc<Connections>,
}

impl Admission {
    /// Keeps the connection open beyond the provisional lifetime, never to be closed to
    /// make room (for gRPC: a node attached with its certificate). False if it was
    /// closed already.
    pub fn keep(&self) -> bool {
        self.connections.keep(&self.connection)
    }
}

/// An accepted TCP connection, counted against its listener's caps until dropped:
/// reads and writes fail once it is evicted or, still provisional, its lifetime is
/// over, so whoever serves it closes it.
pub struct Limited {
    stream: tokio::net::TcpStream,
    admission: Admission,
    /// Till when it may stay provisional (`None` once it is kept).
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Limited {
    /// Whether the connection may still be used; registers the task to wake when it is
    /// evicted or its lifetime ends. A kept connection is neither.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        // Seen kept already (kept for good): nothing to read from the shared record, a
        // cache miss on every read and write at thousands of connections.
        if self.deadline.is_none() {
            return Ok(());
        }
        let connection = &self.admission.connection;
        if connection.kept.load(Ordering::Acquire) {
            self.deadline = None;
            return Ok(());
        }
        {
            let mut waker = padll_wire::sync::lock(&connection.waker);
            if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
        }
        if connection.evicted.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for newer connections",
            ));
        }
        let expired = self
            .deadline
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
        if expired {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "not authenticated within its lifetime",
            ));
        }
        Ok(())
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        self.admission
            .connections
            .release(&self.admission.connection);
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Limited {
    type ConnectInfo = Admission;

    fn connect_info(&self) -> Admission {
        self.admission.clone()
    }
}

/// A TCP listener as a stream of [`Limited`] connections (for tonic, or a loop of our
/// own) whose accept errors never end the server nor make it spin: it backs off (10 ms
/// doubling to 1 s) while accepting fails (e.g. `EMFILE`), logging once per burst.
pub struct Incoming {
    listener: tokio::net::TcpListener,
    connections: Arc<Connections>,
    backoff: AcceptBackoff,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Incoming {
    /// Wraps a bound listener, named `what` in logs, with `caps`.
    pub fn new(
        listener: tokio::net::TcpListener,
        what: &'static str,
        caps: ConnectionCaps,
    ) -> Incoming {
        Incoming {
            listener,
            connections: Arc::new(Connections {
                what,
                caps,
                table: Mutex::default(),
            }),
            backoff: AcceptBackoff::default(),
            sleep: None,
        }
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<Limited>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let what = self.connections.what;
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, peer))) => {
                    self.backoff.succeeded(what);
                    let connections = self.connections.clone();
                    // Refused: closed at once (dropped).
                    let Some(connection) = connections.admit(peer.ip()) else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let deadline = tokio::time::sleep(connections.caps.lifetime);
                    return Poll::Ready(Some(Ok(Limited {
                        stream,
                        admission: Admission {
                            peer,
                            connection,
                            connections,
                        },
                        deadline: Some(Box::pin(deadline)),
                    })));
                }
                Poll::Ready(Err(e)) => {
                    let delay = self.backoff.failed(what, &e);
                    self.sleep = Some(Box::pin(tokio::time::sleep(delay)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    fn caps(total: usize, provisional: usize, per_source: usize) -> ConnectionCaps {
        ConnectionCaps {
            total,
            provisional,
            per_source,
            lifetime: Duration::from_millis(300),
        }
    }

    fn table(caps: ConnectionCaps) -> Connections {
        Connections {
            what: "test listener",
            caps,
            table: Mutex::default(),
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn evicted(connection: &Connection) -> bool {
        connection.evicted.load(Ordering::Acquire)
    }

    #[test]
    fn a_crowded_address_loses_its_oldest_connection_first() {
        let connections = table(caps(10, 4, 2));
        let admit = |address| connections.admit(ip(address)).unwrap();
        let a1 = admit("10.0.0.1");
        let a2 = admit("10.0.0.1");
        let a3 = admit("10.0.0.1");
        assert!(evicted(&a1) && !evicted(&a2) && !evicted(&a3));
        let b1 = admit("10.0.0.2");
        let c1 = admit("10.0.0.3");
        // Four open, the cap: the newcomer closes the oldest of the busiest address.
        let d1 = admit("10.0.0.4");
        assert!(evicted(&a2) && !evicted(&a3));
        assert!([&b1, &c1, &d1].iter().all(|c| !evicted(c)));
        assert_eq!(connections.lock().provisional_count, 4);
        for c in [&a1, &a2, &a3, &b1, &c1, &d1] {
            connections.release(c);
        }
        let table = connections.lock();
        assert_eq!((table.provisional_count, table.provisional.len()), (0, 0));
    }

    #[test]
    fn kept_connections_are_never_closed_to_make_room() {
        let connections = table(caps(4, 2, 2));
        let admit = |address| connections.admit(ip(address));
        let node = admit("10.0.0.1").unwrap();
        assert!(connections.keep(&node) && connections.keep(&node));
        for _ in 0..10 {
            admit("10.0.0.1").unwrap();
        }
        assert!(!evicted(&node));
        for address in ["10.0.0.2", "10.0.0.3", "10.0.0.4"] {
            let another = admit(address).unwrap();
            assert!(connections.keep(&another));
        }
        assert!(!evicted(&node));
        // Every place is a node's: a newcomer is refused.
        assert!(admit("10.0.0.5").is_none());
        connections.release(&node);
        // Room again, but a connection closed meanwhile cannot be kept.
        let first = admit("10.0.0.5").unwrap();
        admit("10.0.0.5").unwrap();
        assert!(evicted(&first) && !connections.keep(&first));
        assert_eq!(connections.lock().kept, 3);
    }

    #[test]
    fn an_ipv6_host_counts_as_its_64() {
        let connections = table(caps(10, 8, 2));
        let admit = |address| connections.admit(ip(address)).unwrap();
        let first = admit("2001:db8::1");
        admit("2001:db8::2");
        admit("2001:db8::ffff:1");
        assert!(evicted(&first));
        let mapped = admit("::ffff:10.0.0.1");
        admit("10.0.0.1");
        admit("10.0.0.1");
        assert!(evicted(&mapped));
    }

    #[test]
    fn listeners_together_stay_below_the_descriptor_limit() {
        for limit in [40, 64, 256, 1024, 4096, 20_000, 65_536, 1 << 20, u64::MAX] {
            let caps = ListenerCaps::for_descriptors(limit);
            let used = (caps.grpc.total + caps.admin + caps.metrics.total) as u128;
            // At least 16, or a sixteenth, left for the controller's own files.
            let left = u128::from(limit) - used;
            assert!(
                left >= 16 && 16 * left >= u128::from(limit).min(16 * 1024),
                "{limit}: {caps:?}"
            );
            assert!(caps.grpc.provisional < caps.grpc.total, "{limit}: {caps:?}");
            assert!(
                caps.grpc.per_source <= caps.grpc.provisional,
                "{limit}: {caps:?}"
            );
            assert!(caps.metrics.per_source <= caps.metrics.provisional);
        }
        let caps = ListenerCaps::for_descriptors(1 << 20);
        assert_eq!(caps.grpc.total - caps.grpc.provisional, 16_384, "max_nodes");
        assert_eq!(caps.grpc.provisional, MAX_UNAUTHENTICATED);
        assert_eq!(caps.grpc.per_source, MAX_UNAUTHENTICATED_PER_SOURCE);
        assert_eq!(caps.admin, MAX_ADMIN_CONNECTIONS);
    }

    /// The server side of one client connection accepted by `incoming`.
    async fn accept(incoming: &mut Incoming, port: u16) -> (Limited, tokio::net::TcpStream) {
        let client = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        (incoming.next().await.unwrap().unwrap(), client)
    }

    #[tokio::test]
    async fn provisional_connections_end_at_their_lifetime_or_when_evicted() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut incoming = Incoming::new(listener, "test listener", caps(8, 2, 1));
        let mut byte = [0u8; 1];
        // Its lifetime ends while a read waits.
        let (mut server, _client) = accept(&mut incoming, port).await;
        let error = server.read(&mut byte).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        drop(server);
        // A newer connection from the same address closes a waiting one at once.
        let (mut first, _c1) = accept(&mut incoming, port).await;
        let waiting = tokio::spawn(async move { first.read(&mut [0u8; 1]).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (kept, mut client) = accept(&mut incoming, port).await;
        let error = waiting.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
        // A kept one outlives its lifetime.
        assert!(kept.admission.keep());
        let mut kept = kept;
        tokio::time::sleep(Duration::from_millis(600)).await;
        client.write_all(b"x").await.unwrap();
        assert_eq!(kept.read(&mut byte).await.unwrap(), 1);
    }
}
