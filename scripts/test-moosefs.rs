//! A throwaway MooseFS for a test (`#[path = "../../scripts/test-moosefs.rs"] mod
//! moosefs;` in a crate's `tests/util.rs`): `scripts/moosefs.sh` runs a master, a
//! chunkserver and the mount in namespaces of their own, and dropping the [`MooseFs`]
//! stops all of it. Tests that use it need `cfg(has_moosefs)` (`scripts/test-tools.rs`).
//!
//! The mount exists in its own mount namespace only: commands run there through
//! [`MooseFs::command`], and the test reads files through [`MooseFs::outside`]. Every other
//! path (`/tmp`, `/dev/shm`, the target directory) is the same in both.

#![allow(dead_code)] // each test package uses what its tests need

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long the file system may take to come up (2–3 s on an idle machine).
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the script may take to stop it after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running MooseFS, stopped (and its directory removed) on drop.
pub struct MooseFs {
    script: Child,
    mount: PathBuf,
    pid: u32,
    base: PathBuf,
}

/// `scripts/moosefs.sh` of this repository.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("scripts/moosefs.sh"))
        .find(|script| script.is_file())
        .expect("scripts/moosefs.sh in a directory above the package")
}

impl MooseFs {
    /// Starts one and waits until it is usable; fails the test, with the script's
    /// error, if it never is.
    pub fn start() -> MooseFs {
        let mut script = Command::new(script())
            .arg("start")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("scripts/moosefs.sh runs");
        let stdout = script.stdout.take().expect("piped");
        let (sender, ready) = mpsc::channel();
        // The pipe stays open while the file system runs: only its first line matters.
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = sender.send(line);
        });
        let (line, timed_out) = match ready.recv_timeout(START_TIMEOUT) {
            Ok(line) => (line, false),
            Err(_) => (String::new(), true),
        };
        let fields: BTreeMap<&str, &str> = line
            .strip_prefix("moosefs ready ")
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|field| field.split_once('='))
            .collect();
        let (Some(mount), Some(pid), Some(base)) = (
            fields.get("mount"),
            fields.get("pid").and_then(|pid| pid.parse().ok()),
            fields.get("base"),
        ) else {
            stop(&mut script);
            let mut stderr = String::new();
            if let Some(mut pipe) = script.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            let what = if timed_out {
                format!("not up within {START_TIMEOUT:?}")
            } else {
                format!("failed (it printed {line:?})")
            };
            panic!("scripts/moosefs.sh start {what}: {}", stderr.trim());
        };
        MooseFs {
            mount: PathBuf::from(mount),
            pid,
            base: PathBuf::from(base),
            script,
        }
    }

    /// The mountpoint, as commands from [`MooseFs::command`] see it.
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// The process whose mount namespace holds the mount (`nsenter --target PID --mount`).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `path` of the mount namespace as this process reaches it (through
    /// `/proc/PID/root`), for reading and writing files on the mount from the test.
    pub fn outside(&self, path: &Path) -> PathBuf {
        let relative = path.strip_prefix("/").unwrap_or(path);
        PathBuf::from(format!("/proc/{}/root", self.pid)).join(relative)
    }

    /// `program` run in the mount's namespace, in the mount's root directory.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        self.command_in(&self.mount, program)
    }

    /// `program` run in the mount's namespace, in `dir` (a path as the namespace sees
    /// it: on the mount, or anywhere else). Do not set the command's `current_dir`:
    /// entering the namespace moves the process to its root, then to `dir`.
    pub fn command_in(&self, dir: &Path, program: impl AsRef<OsStr>) -> Command {
        let namespace = std::fs::File::open(format!("/proc/{}/ns/mnt", self.pid))
            .expect("the MooseFS mount namespace");
        let dir = CString::new(dir.as_os_str().as_bytes()).expect("a path without NUL");
        let mut command = Command::new(program);
        // SAFETY: between fork and exec, only async-signal-safe calls on data the closure
        // owns: setns on an open descriptor (closed at exec), chdir on a C string.
        unsafe {
            command.pre_exec(move || {
                use std::os::fd::AsRawFd;
                if libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNS) != 0
                    || libc::chdir(dir.as_ptr()) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command
    }

    /// The master's operation counters of the mount since it came up (`moosefs.sh ops`):
    /// compare two with [`MasterOps::since`].
    pub fn master_ops(&self) -> MasterOps {
        let output = Command::new(script())
            .args(["ops", &self.pid.to_string()])
            .output()
            .expect("scripts/moosefs.sh ops runs");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "moosefs.sh ops: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let counters: BTreeMap<String, u64> = text
            .split_whitespace()
            .filter_map(|field| field.split_once('='))
            .map(|(name, value)| {
                let value = value
                    .parse()
                    .unwrap_or_else(|_| panic!("moosefs.sh ops: counter {name}={value}"));
                (name.to_string(), value)
            })
            .collect();
        assert!(
            counters.contains_key("total"),
            "moosefs.sh ops printed no total: {text}"
        );
        MasterOps(counters)
    }
}

/// SIGTERM makes the script stop everything and remove its directory; should it not
/// exit in time, SIGKILL takes the namespaces down (the directory stays).
fn stop(script: &mut Child) {
    // SAFETY: kill sends a signal to our own child, which we have not reaped yet.
    unsafe { libc::kill(script.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + STOP_TIMEOUT;
    while matches!(script.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = script.kill();
    let _ = script.wait();
}

impl Drop for MooseFs {
    fn drop(&mut self) {
        stop(&mut self.script);
        // Left if the script was SIGKILLed; the daemons die just after it: retry while
        // they finish writing.
        for _ in 0..50 {
            if !self.base.exists() || std::fs::remove_dir_all(&self.base).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The master's operation counters of one mount (`statfs`, `getattr`, `setattr`,
/// `lookup`, `mkdir`, `rmdir`, `symlink`, `readlink`, `mknod`, `unlink`, `rename`,
/// `link`, `readdir`, `open`, `read`, `write`, `total`): what reached the master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterOps(BTreeMap<String, u64>);

impl MasterOps {
    /// Operations counted from `earlier` to this reading.
    pub fn since(&self, earlier: &MasterOps) -> MasterOps {
        MasterOps(
            self.0
                .iter()
                .map(|(name, now)| {
                    let before = earlier.0.get(name).copied().unwrap_or(0);
                    (name.clone(), now.saturating_sub(before))
                })
                .collect(),
        )
    }
}

impl std::ops::Index<&str> for MasterOps {
    type Output = u64;

    fn index(&self, name: &str) -> &u64 {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("no MooseFS counter {name:?} in {:?}", self.0))
    }
}
