//! The transport floor of `cheferd-lab bench`, measured in the same run: the same
//! reads and writes on plain TCP connections, one per simulated local controller —
//! each connection's report in every interval, spread over the window the global
//! controller would fit for that many nodes, and while rules change one write of an
//! `Enforce`'s size to every connection at every tick — read by one task per
//! connection on the global controller's runtime, with no HTTP/2, gRPC or controller
//! behind them. What the global controller spends above it is the protocol's and its
//! own; the floor itself (the kernel's TCP work and the runtime's wake-ups per
//! connection) only fewer connections per process would lower.

use super::{cpu_time, ms, raise_descriptor_limit, BenchError, BenchRow, LocalsProcess};
use crate::global::spread_window;
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep_until, timeout, Instant};

/// Ticks before measuring: the connections' first reports and buffers are settled.
const WARM_UP: usize = 2;
/// How long a floor connection waits for the listener's welcome before it connects
/// again.
const WELCOME: Duration = Duration::from_secs(60);
/// Ticks measured at most per mode: the floor's CPU per interval varies little, and
/// the default bench's 50 cycles would double its run.
const MAX_CYCLES: usize = 10;

/// Measures the floor of `rows` (one number of local controllers, both modes, as
/// `super::run` returned them) and records it in each row's `floor_cpu_ms`. Run it in
/// a runtime of its own after theirs, so none of their connections is still open.
pub async fn measure(rows: &mut [BenchRow]) -> Result<(), BenchError> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let (locals, interval) = (first.locals, Duration::from_millis(first.interval_ms));
    let cycles = first.cycles.min(MAX_CYCLES);
    let bytes = |changing: bool| {
        rows.iter()
            .find(|r| r.changing == changing)
            .map_or(0.0, |r| r.bytes_per_local)
    };
    // Whole bytes, at least one: a report, and an `Enforce` (what changing rules add).
    let report = bytes(false).round().max(1.0) as usize;
    let enforce = (bytes(true) - bytes(false)).round().max(1.0) as usize;

    raise_descriptor_limit(locals + 256)?;
    let listener = listen().map_err(io("listen for the floor's connections"))?;
    let address = listener
        .local_addr()
        .map_err(io("read the floor's address"))?;
    let _child = LocalsProcess(
        Command::new(std::env::current_exe().map_err(io("locate this executable"))?)
            .args(["bench-floor-locals", "--address", &address.to_string()])
            .args(["--locals", &locals.to_string()])
            .args(["--report-bytes", &report.to_string()])
            .args(["--interval-ms", &first.interval_ms.to_string()])
            .stdin(Stdio::null())
            .spawn()
            .map_err(io("start the floor's connections"))?,
    );
    let mut writers = Vec::with_capacity(locals);
    while writers.len() < locals {
        let (stream, _) = timeout(Duration::from_secs(120), listener.accept())
            .await
            .map_err(|_| BenchError::NotAttached {
                attached: writers.len(),
                locals,
            })?
            .map_err(io("accept a floor connection"))?;
        // As the gRPC server's connections (tonic sets `TCP_NODELAY`).
        stream
            .set_nodelay(true)
            .map_err(io("set TCP_NODELAY on a floor connection"))?;
        let (reader, mut writer) = stream.into_split();
        // The connection's one byte of welcome (see `floor_local`); a peer gone already
        // is not counted.
        if writer.write_all(&[1]).await.is_err() {
            continue;
        }
        tokio::spawn(drain(reader));
        writers.push(writer);
    }

    let enforce = vec![0; enforce];
    let mut tick = Instant::now();
    for row in rows.iter_mut() {
        let mut run_tick = async |tick: &mut Instant| {
            sleep_until(*tick).await;
            *tick += interval;
            if row.changing {
                for writer in &mut writers {
                    writer
                        .write_all(&enforce)
                        .await
                        .map_err(io("write to a floor connection"))?;
                }
            }
            Ok::<_, BenchError>(())
        };
        for _ in 0..WARM_UP {
            run_tick(&mut tick).await?;
        }
        sleep_until(tick).await;
        let before = cpu_time();
        for _ in 0..cycles {
            run_tick(&mut tick).await?;
        }
        sleep_until(tick).await;
        row.floor_cpu_ms = Some(ms(cpu_time() - before) / cycles as f64);
    }
    Ok(())
}

/// `cheferd-lab bench-floor-locals`: `locals` connections to `address`, each writing
/// `report_bytes` once per interval at its place in the report window and reading
/// whatever comes, until killed.
pub async fn run_locals(
    address: String,
    locals: usize,
    report_bytes: usize,
    interval: Duration,
) -> Result<(), BenchError> {
    raise_descriptor_limit(locals + 256)?;
    let window = spread_window(interval, locals, Duration::ZERO);
    let start = Instant::now();
    let tasks: Vec<_> = (0..locals)
        .map(|i| {
            let address = address.clone();
            let place = window.mul_f64(i as f64 / locals as f64);
            tokio::spawn(floor_local(address, report_bytes, start + place, interval))
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    Ok(())
}

/// One connection: its report every `interval` from `first`.
async fn floor_local(address: String, report_bytes: usize, first: Instant, interval: Duration) {
    // Thousands of simultaneous connects overflow the listen queues: a connect can
    // succeed here while the listener dropped its last step (a byte sent completes it
    // once there is room). Connected is welcomed (one byte back, within WELCOME);
    // anything else is tried again.
    let stream = loop {
        if let Ok(mut stream) = TcpStream::connect(&address).await {
            let mut welcome = [0];
            if stream.write_all(&[1]).await.is_ok()
                && matches!(timeout(WELCOME, stream.read(&mut welcome)).await, Ok(Ok(1)))
            {
                break stream;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = stream.set_nodelay(true);
    let (reader, mut writer) = stream.into_split();
    tokio::spawn(drain(reader));
    let report = vec![0; report_bytes];
    let mut next = first;
    loop {
        sleep_until(next).await;
        next += interval;
        if writer.write_all(&report).await.is_err() {
            return;
        }
    }
}

/// Reads what comes on a connection, and drops it, until the connection ends.
async fn drain(mut reader: OwnedReadHalf) {
    let mut buffer = [0; 4096];
    while matches!(reader.read(&mut buffer).await, Ok(n) if n > 0) {}
}

/// A listener on loopback whose queue holds as many connections as the system allows
/// (the kernel caps it at `net.core.somaxconn`), so fewer connects are dropped.
fn listen() -> std::io::Result<TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((std::net::Ipv4Addr::LOCALHOST, 0).into())?;
    socket.listen(u16::MAX.into())
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> BenchError {
    move |error| BenchError::Io { what, error }
}
