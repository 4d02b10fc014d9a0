//! The placement service end to end (issue 10 part 2): a stage's `place` on its local
//! controller's socket is relayed over the gRPC stream to the global controller, whose
//! mapper answers from the per-target load feed the operator pointed it at; the answer
//! comes back as `placed`. Without a service, or without a global controller, the answer
//! is "no advice" (empty), at once. The whole chain, from a shell creating files under
//! the stage to the layout given to the file system, runs with the test double of a
//! Lustre client that `interpose-tests` uses. The sizes stages report for the files
//! they placed reach the global's history under the configured application, predict
//! the next file's size, and survive a standby's takeover.

use crate::util::*;
use padll_wire::config::Identity;
use padll_wire::control::{self, ControlMessage, StageMessage, PROTOCOL_VERSION};
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Two servers of three targets; the emptiest are OST 0x4 (server 1) and OST 0x1
/// (server 0), the fullest OST 0x0.
const FEED: &str = "\
oss=0 cpu=10 memory=20
obdfilter.lustre-OST0000.kbytestotal=1000000
obdfilter.lustre-OST0000.kbytesavail=100000
obdfilter.lustre-OST0001.kbytestotal=1000000
obdfilter.lustre-OST0001.kbytesavail=900000
obdfilter.lustre-OST0002.kbytestotal=1000000
obdfilter.lustre-OST0002.kbytesavail=500000
oss=1 cpu=10 memory=20
obdfilter.lustre-OST0003.kbytestotal=1000000
obdfilter.lustre-OST0003.kbytesavail=400000
obdfilter.lustre-OST0004.kbytestotal=1000000
obdfilter.lustre-OST0004.kbytesavail=950000
obdfilter.lustre-OST0005.kbytestotal=1000000
obdfilter.lustre-OST0005.kbytesavail=300000
";

/// A stage's side of the socket, registered as a process of `job` on `mount` (it reads
/// what the controller sends; also the well-behaved stage of `trust_local.rs`).
pub(crate) struct Stage {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Stage {
    pub(crate) fn register(socket: &Path, job: &str, mount: &Path) -> Stage {
        Stage::register_as(socket, job, "placement-test", mount)
    }

    /// [`Stage::register`] as a process of `program`.
    fn register_as(socket: &Path, job: &str, program: &str, mount: &Path) -> Stage {
        Stage::register_claiming(socket, job, program, "", mount)
    }

    /// [`Stage::register_as`], claiming to be `user` (`PADLL_USER`).
    fn register_claiming(
        socket: &Path,
        job: &str,
        program: &str,
        user: &str,
        mount: &Path,
    ) -> Stage {
        let mut stream = UnixStream::connect(socket).expect("connect to the stage socket");
        let hello = StageMessage::Hello {
            version: PROTOCOL_VERSION,
            stage_name: program.into(),
            identity: Identity {
                job_id: job.into(),
                job_size: 1,
                user: user.into(),
                ..Identity::default()
            },
            mountpoints: vec![mount.display().to_string()],
        };
        stream
            .write_all(control::encode(&hello).as_bytes())
            .unwrap();
        let mut stage = Stage {
            reader: BufReader::new(stream.try_clone().unwrap()),
            stream,
        };
        let welcome = stage.next();
        assert!(
            matches!(welcome, ControlMessage::Welcome { .. }),
            "{welcome:?}"
        );
        stage
    }

    fn next(&mut self) -> ControlMessage {
        let line = read_line_with_timeout(&mut self.reader, Duration::from_secs(20))
            .expect("the controller closed the connection");
        control::decode(line.trim_end()).unwrap()
    }

    /// Reports that a file it placed on `mount` ended with `bytes`.
    fn file_size(&mut self, mount: &Path, bytes: u64) {
        let size = StageMessage::FileSize {
            mount: mount.display().to_string(),
            bytes,
        };
        self.stream
            .write_all(control::encode(&size).as_bytes())
            .unwrap();
    }

    /// Asks where a new file with `stripes` stripes on `mount` goes; the targets.
    pub(crate) fn place(&mut self, id: u64, mount: &Path, stripes: u32) -> Vec<u32> {
        let ask = StageMessage::Place {
            id,
            mount: mount.display().to_string(),
            stripes,
        };
        self.stream
            .write_all(control::encode(&ask).as_bytes())
            .unwrap();
        loop {
            // Rules the global sends the new stage may come first.
            match self.next() {
                ControlMessage::Placed {
                    id: answered,
                    targets,
                } if answered == id => return targets,
                ControlMessage::SetRules { .. } | ControlMessage::CollectUsage => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

fn cluster(placement: &str) -> Cluster {
    let mut cluster = unstarted(placement);
    cluster.start_global();
    cluster.start_local("n1");
    wait_for(Duration::from_secs(20), "the node attached", || {
        cluster
            .try_snapshot()
            .filter(|s| s.nodes.iter().any(|n| n.node == "n1" && n.attached))
    });
    cluster
}

/// A cluster configured with `placement`, nothing started.
fn unstarted(placement: &str) -> Cluster {
    Cluster::new(&format!(
        r#"
interval_ms = 500
[[resource]]
name = "{{scratch}}:metadata"
max_rate = "1000"
policy = "psfa"
{placement}
"#
    ))
}

#[test]
fn new_files_go_to_the_emptiest_targets_of_the_feed() {
    let _turn = alone();
    let feed = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(feed.path(), FEED).unwrap();
    let mut cluster = cluster(&format!(
        "[placement]\nmount = \"{{scratch}}\"\nplacer = \"mcmf\"\nfeed = \"{}\"\n",
        feed.path().display()
    ));
    let mut stage = Stage::register(&cluster.local_socket("n1"), "placed", &cluster.scratch);
    let mut first = stage.place(1, &cluster.scratch, 2);
    first.sort();
    assert_eq!(first, vec![1, 4], "the emptiest target of each server");
    // Another mountpoint is not the service's: no advice.
    assert!(stage.place(2, Path::new("/elsewhere"), 1).is_empty());
    assert!(cluster.controllers_alive());
}

#[test]
fn without_a_service_or_a_global_controller_the_answer_is_empty_at_once() {
    let _turn = alone();
    let mut cluster = cluster("");
    let mut stage = Stage::register(&cluster.local_socket("n1"), "unplaced", &cluster.scratch);
    assert!(stage.place(1, &cluster.scratch, 2).is_empty());
    cluster.kill_global();
    // The local controller notices the stream ended, then answers by itself.
    wait_for(
        START_TIMEOUT,
        "the local controller to lose the global one",
        || {
            let log = cluster.local_log("n1");
            log.contains("lost the global controller").then_some(())
        },
    );
    let asked = Instant::now();
    assert!(stage.place(2, &cluster.scratch, 2).is_empty());
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
}

/// The OST indices of a `lov_user_md_v3` the double recorded (hex): stripe count at byte
/// 28, each `lov_user_ost_data_v1` (24 bytes from byte 48) with its index at byte 20.
fn recorded_targets(hex: &str) -> Vec<u32> {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let count = u16::from_le_bytes([bytes[28], bytes[29]]) as usize;
    (0..count)
        .map(|i| {
            let at = 48 + 24 * i + 20;
            u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
        })
        .collect()
}

#[test]
#[cfg_attr(not(all(has_cc, has_bash)), ignore = "cc or bash not installed")]
fn files_a_shell_creates_get_the_services_targets() {
    let _turn = alone();
    let feed = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(feed.path(), FEED).unwrap();
    let cluster = cluster(&format!(
        "[placement]\nmount = \"{{scratch}}\"\nplacer = \"mcmf\"\nfeed = \"{}\"\n",
        feed.path().display()
    ));
    let tools = tempfile::tempdir().unwrap();
    let source = tools.path().join("lustre_double.c");
    std::fs::write(
        &source,
        include_str!("../../interpose-tests/tests/lustre_double.c"),
    )
    .unwrap();
    let double = tools.path().join("liblustre-double.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&double)
        .arg(&source)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(built.success(), "cc failed");
    let log = tools.path().join("layouts.log");
    let out = run_with_timeout(
        Command::new("bash")
            .args([
                "-c",
                "echo one > first && echo two > second && echo again > first",
            ])
            .current_dir(&cluster.scratch)
            .env(
                "LD_PRELOAD",
                format!("{} {}", stage_library().display(), double.display()),
            )
            .env("PADLL_MOUNTS", &cluster.scratch)
            .env("PADLL_CONTROLLER", cluster.local_socket("n1"))
            .env("PADLL_JOB_ID", job_id("placed-by-shell"))
            .env(
                "PADLL_PLACEMENT",
                format!("{}=2", cluster.scratch.display()),
            )
            .env("PADLL_PLACEMENT_WAIT_MS", "5000")
            .env("PLACEMENT_LOG", &log),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.is_empty(), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(cluster.scratch.join("first")).unwrap(),
        "again\n"
    );
    // Two files created (the third redirection opens an existing one): each laid out on
    // the two emptiest targets, one per server.
    let layouts = std::fs::read_to_string(&log).unwrap();
    let layouts: Vec<Vec<u32>> = layouts.lines().map(recorded_targets).collect();
    assert_eq!(layouts.len(), 2, "{layouts:?}");
    for mut targets in layouts {
        targets.sort();
        assert_eq!(targets, vec![1, 4]);
    }
}

/// OST 0 has the most room but is on a busy server; OSTs 1 and 2, on an idle one, have
/// 600 MB and 500 MB free: a small file goes to OST 1, one of [`BIG`] fits only on OST 0
/// (which holds nine).
const NEARLY_FULL: &str = "\
oss=0 cpu=90 memory=90
obdfilter.lustre-OST0000.kbytestotal=8000000
obdfilter.lustre-OST0000.kbytesavail=7600000
oss=1 cpu=0 memory=0
obdfilter.lustre-OST0001.kbytestotal=1000000
obdfilter.lustre-OST0001.kbytesavail=600000
obdfilter.lustre-OST0002.kbytestotal=1000000
obdfilter.lustre-OST0002.kbytesavail=500000
";

/// The size of the files the big writer's history holds.
const BIG: u64 = 800 << 20;

/// `[placement]` on the scratch mount over `feed`, applications named `application`.
fn placement_section(feed: &Path, application: &str) -> String {
    format!(
        "[placement]\nmount = \"{{scratch}}\"\nplacer = \"mcmf\"\nfeed = \"{}\"\napplication = \"{application}\"\n",
        feed.display()
    )
}

/// Reports five [`BIG`] files of `stage` (more than the chain's order, 3), then waits
/// for a placement of its own: the sizes went up the same stream before it, so the
/// global has them.
fn report_big_files(stage: &mut Stage, mount: &Path) -> Vec<u32> {
    for _ in 0..5 {
        stage.file_size(mount, BIG);
    }
    stage.place(100, mount, 1)
}

#[test]
fn sizes_predict_the_next_file_of_the_same_application() {
    let _turn = alone();
    let feed = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(feed.path(), NEARLY_FULL).unwrap();
    let mut cluster = cluster(&placement_section(feed.path(), "job"));
    let socket = cluster.local_socket("n1");
    let mount = cluster.scratch.clone();
    let mut writer = Stage::register_as(&socket, &job_id("big"), "writer", &mount);
    assert_eq!(
        writer.place(1, &mount, 1),
        vec![1],
        "no history: a small file"
    );
    assert_eq!(
        report_big_files(&mut writer, &mount),
        vec![0],
        "predicted big"
    );
    // `application = "job"`: another program of the job has the job's history; the
    // same program in another job has none.
    let mut same_job = Stage::register_as(&socket, &job_id("big"), "reader", &mount);
    assert_eq!(same_job.place(1, &mount, 1), vec![0]);
    let mut other_job = Stage::register_as(&socket, &job_id("small"), "writer", &mount);
    assert_eq!(other_job.place(1, &mount, 1), vec![1]);
    // Hostile sizes are dropped, naming why; the controllers carry on.
    writer.file_size(&mount, padll_wire::control::MAX_FILE_BYTES + 1);
    writer.file_size(Path::new("/elsewhere"), 1);
    wait_for(Duration::from_secs(20), "the refusals logged", || {
        let log = cluster.local_log("n1");
        (log.contains("dropped a file size: 1152921504606846977 bytes is beyond")
            && log.contains("dropped a file size: mount '/elsewhere' is not one of the stage's"))
        .then_some(())
    });
    assert_eq!(
        writer.place(2, &mount, 1),
        vec![0],
        "the history is unchanged"
    );
    assert!(cluster.controllers_alive());
}

#[test]
fn with_the_program_as_application_its_runs_share_a_history() {
    let _turn = alone();
    let feed = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(feed.path(), NEARLY_FULL).unwrap();
    let cluster = cluster(&placement_section(feed.path(), "program"));
    let socket = cluster.local_socket("n1");
    let mount = cluster.scratch.clone();
    let mut first_run = Stage::register_as(&socket, &job_id("run1"), "writer", &mount);
    assert_eq!(report_big_files(&mut first_run, &mount), vec![0]);
    let mut next_run = Stage::register_as(&socket, &job_id("run2"), "writer", &mount);
    assert_eq!(next_run.place(1, &mount, 1), vec![0]);
    let mut other = Stage::register_as(&socket, &job_id("run1"), "other", &mount);
    assert_eq!(other.place(1, &mount, 1), vec![1]);
}

#[test]
#[cfg_attr(not(has_etcd), ignore = "etcd not installed")]
fn the_size_history_survives_a_standby_takeover() {
    use crate::standby::{leader_and_standby, Etcd, ETCD_PREFIX};
    let _turn = alone();
    let feed = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(feed.path(), NEARLY_FULL).unwrap();
    let mut cluster = unstarted(&placement_section(feed.path(), "program"));
    let etcd = Etcd::start(cluster.dir.path(), 1, None);
    let (a, b) = leader_and_standby(&mut cluster, &etcd);
    cluster.start_local("n1");
    let mount = cluster.scratch.clone();
    let socket = cluster.local_socket("n1");
    let mut writer = wait_for(Duration::from_secs(20), "placement through A", || {
        let mut stage = Stage::register_as(&socket, &job_id("w"), "writer", &mount);
        (stage.place(1, &mount, 1) == vec![1]).then_some(stage)
    });
    assert_eq!(report_big_files(&mut writer, &mount), vec![0]);
    let key = format!("{ETCD_PREFIX}/placement-sizes");
    wait_for(Duration::from_secs(20), "the sizes in etcd", || {
        etcd.get(&key)
            .filter(|saved| String::from_utf8_lossy(saved).contains("\"writer\""))
    });
    drop(a);
    b.wait_for_log(Duration::from_secs(30), "elected leader");
    assert!(b.log().contains("placement_apps=1"), "{}", b.log());
    // The local controller follows B; its stages are announced again, and the
    // writer's next file is predicted from the history A saved.
    let mut id = 10;
    wait_for(Duration::from_secs(30), "placement through B", || {
        id += 1;
        (writer.place(id, &mount, 1) == vec![0]).then_some(())
    });
    let mut other = Stage::register_as(&socket, &job_id("w"), "other", &mount);
    assert_eq!(other.place(1, &mount, 1), vec![1]);
}

/// Audit (local, 3): with `application = "user+program"` the user was the stage's
/// claim (`PADLL_USER`), so anyone could fill another user's history ("user": "alice",
/// "stage_name": "/home/alice/bin/wrf", then huge sizes). Now the user is the one the
/// kernel names (`SO_PEERCRED`): a claimed user chooses no history, and stages of one
/// uid share theirs whatever they claim.
#[test]
fn a_claimed_user_does_not_choose_the_history() {
    let _turn = alone();
    let feed = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(feed.path(), NEARLY_FULL).unwrap();
    let cluster = cluster(&placement_section(feed.path(), "user+program"));
    let socket = cluster.local_socket("n1");
    let mount = cluster.scratch.clone();
    let mut poisoner = Stage::register_claiming(&socket, &job_id("p"), "wrf", "alice", &mount);
    assert_eq!(report_big_files(&mut poisoner, &mount), vec![0]);
    // Another claim by the same uid: the same (kernel's) user, so the same history.
    let mut same_uid = Stage::register_claiming(&socket, &job_id("q"), "wrf", "bob", &mount);
    assert_eq!(
        same_uid.place(1, &mount, 1),
        vec![0],
        "the uid's own history"
    );
    let mut other = Stage::register_claiming(&socket, &job_id("q"), "other", "alice", &mount);
    assert_eq!(
        other.place(1, &mount, 1),
        vec![1],
        "another program: no history"
    );
}
