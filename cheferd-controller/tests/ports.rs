//! Ports for the daemons that must be told theirs before they listen: a global
//! controller restarted on the port its local controllers know, etcd's peer URLs,
//! Slurm's `slurm.conf`. (A daemon that can listen on port 0 and say which port it got
//! is started that way instead.)
//!
//! They are picked below the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`), which `bind` to port 0 and `connect` never
//! hand out, so no neighbour takes one by accident; each is held by an exclusive `flock`
//! on a file named after it in a directory every test run on the machine shares, so two
//! runs never pick the same one; and each is checked free. Something else on the machine
//! may still listen on one later: a daemon that says "address already in use"
//! ([`in_use`]) is started again on others ([`start_on_fresh_ports`]).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// Attempts at starting a daemon before the test gives up.
pub const ATTEMPTS: usize = 10;
/// Ports below this are left to well-known services (Slurm's 6817, etcd's 2379, …).
const LOWEST: u16 = 10_000;

/// `count` consecutive ports, reserved until dropped.
pub struct Ports {
    first: u16,
    count: u16,
    _locks: Vec<File>,
}

impl Ports {
    /// Reserves `count` consecutive free ports.
    pub fn reserve(count: u16) -> Ports {
        let (low, high) = candidates(count);
        let mut random = seed();
        for _ in 0..1000 {
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            let first = low + (random % u64::from(high - low)) as u16;
            if let Some(locks) = (first..first + count).map(claim).collect() {
                return Ports {
                    first,
                    count,
                    _locks: locks,
                };
            }
        }
        panic!("no {count} consecutive free ports in {low}..{high}");
    }

    /// The `i`-th port (from 0).
    pub fn get(&self, i: u16) -> u16 {
        assert!(i < self.count, "port {i} of {}", self.count);
        self.first + i
    }
}

/// Whether a daemon's log says it could not listen because a port was taken.
pub fn in_use(log: &str) -> bool {
    log.to_ascii_lowercase().contains("address already in use")
}

/// Runs `start` with `count` fresh ports until it starts: it returns `None` when the
/// daemon found a port taken (it exited saying so, see [`in_use`]), after stopping
/// whatever it started, and keeps the ports in what it returns otherwise.
pub fn start_on_fresh_ports<T>(
    count: u16,
    what: &str,
    mut start: impl FnMut(Ports) -> Option<T>,
) -> T {
    for _ in 0..ATTEMPTS {
        if let Some(started) = start(Ports::reserve(count)) {
            return started;
        }
        eprintln!("{what}: a port was taken, starting again on others");
    }
    panic!("{what}: a port was taken in each of {ATTEMPTS} attempts");
}

/// The range to pick a block of `count` from: below the ephemeral range, or above it
/// where it starts too low to leave room.
fn candidates(count: u16) -> (u16, u16) {
    let (start, end) = ephemeral_range();
    if start >= LOWEST + 1000 + count {
        (LOWEST, start - count)
    } else {
        assert!(
            end <= u16::MAX - 1000 - count,
            "the ephemeral range {start}-{end} leaves no room for the tests' ports"
        );
        (end + 1, u16::MAX - count)
    }
}

/// The kernel's ephemeral port range (Linux's default if it cannot be read).
fn ephemeral_range() -> (u16, u16) {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .unwrap_or_else(|_| "32768 60999".into());
    let mut bounds = text
        .split_whitespace()
        .filter_map(|v| v.parse::<u16>().ok());
    (
        bounds.next().unwrap_or(32768),
        bounds.next().unwrap_or(60999),
    )
}

/// Holds `port` (its lock file, exclusively) if no other test run holds it and
/// nothing listens on it.
fn claim(port: u16) -> Option<File> {
    let path = lock_dir().join(port.to_string());
    // Opened for reading: another user's lock file serves as well as ours.
    let file = File::open(&path).or_else(|_| {
        let file = File::options().append(true).create(true).open(&path)?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666));
        Ok::<File, std::io::Error>(file)
    });
    let file = file.ok()?;
    // SAFETY: flock on a descriptor we own; released when the file is closed.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    let free = locked && std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
    free.then_some(file)
}

/// The directory of the lock files, shared by every user's test runs (sticky, like
/// `/tmp`).
fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("padll-test-ports");
    if std::fs::create_dir(&dir).is_ok() {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
    }
    dir
}

/// A seed that differs between processes and calls.
fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ (u64::from(std::process::id()) << 32)) | 1
}

#[test]
fn reserved_ports_lie_outside_the_ephemeral_range_and_are_held() {
    let _turn = crate::util::together();
    let (start, end) = ephemeral_range();
    let ports = Ports::reserve(3);
    for i in 0..3 {
        let port = ports.get(i);
        assert!(port < start || port > end, "{port} is in {start}-{end}");
        assert!(claim(port).is_none(), "{port} was reserved twice");
    }
}

#[test]
fn a_global_controller_whose_port_was_taken_starts_on_others() {
    let _turn = crate::util::alone();
    let mut cluster = crate::util::Cluster::new("interval_ms = 1000\n");
    // What a process outside the tests may do: listen on the port reserved for it.
    let taken = cluster.port;
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", taken)).expect("a free port");
    cluster.start_global();
    assert_ne!(cluster.port, taken, "started on the taken port");
    // The local controllers follow it to its new port.
    cluster.start_local("n1");
    cluster.wait_for_stages(std::time::Duration::from_secs(30), &[("n1", 0)]);
}
