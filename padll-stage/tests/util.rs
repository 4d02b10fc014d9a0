//! Helpers shared by the test modules: the built stage, scratch directories and a
//! scripted controller.

use padll_wire::channel::{ChannelSpec, Scope, Unit};
use padll_wire::control::{self, ControlMessage, StageMessage, PROTOCOL_VERSION};
use padll_wire::ops::Class;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::sync::OnceLock;

#[path = "../../scripts/test-cargo.rs"]
mod cargo;

/// The profile directory with `padll` and `libpadll.so` built in it, once per test
/// binary.
fn built() -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| cargo::build(&["-p", "padll-stage"]));
    cargo::profile_dir()
}

/// The `padll` binary under test.
pub fn padll() -> PathBuf {
    built().join("padll")
}

/// The `padll-bench` binary under test.
pub fn padll_bench() -> PathBuf {
    built().join("padll-bench")
}

/// The stage under test.
pub fn library() -> PathBuf {
    padll_wire::locate_stage_library(&built()).expect("libpadll.so after building it")
}

/// An empty directory of its own for a test: `name` must be unique in this binary (all
/// its tests share one pid).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("padll-stage-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether the stage can time calls here: the kernel keeps time with the x86-64
/// time-stamp counter (elsewhere it counts no service times).
pub fn calls_are_timed() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|source| source.trim() == "tsc")
}

/// `padll --version` under the stage with `env` (`PADLL_CONFIG` unset): the stage must
/// refuse its configuration in one line containing `expected`, and the program run
/// unchanged. Returns that line.
pub fn refused_in_one_line(env: &[(&str, &std::ffi::OsStr)], expected: &str) -> String {
    let output = std::process::Command::new(padll())
        .arg("--version")
        .env("LD_PRELOAD", library())
        .env_remove("PADLL_CONFIG")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(expected), "{stderr}");
    stderr
}

/// A rule of `rate` metadata operations per second on `mount`.
pub fn metadata_rule(mount: &Path, rate: u64, burst: u64) -> ChannelSpec {
    ChannelSpec {
        mount: Some(mount.display().to_string()),
        scope: Scope::Class(Class::Metadata),
        rate,
        unit: Unit::Requests,
        burst,
        costs: Default::default(),
    }
}

/// A controller at `socket` that welcomes every stage, gives it `rules` and reports
/// each rule set a stage applied.
pub fn controller_stub(socket: &Path, rules: Vec<ChannelSpec>) -> Receiver<()> {
    let listener = UnixListener::bind(socket).unwrap();
    let (applied, receiver) = channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let (rules, applied) = (rules.clone(), applied.clone());
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                let greeting = [
                    ControlMessage::Welcome {
                        version: PROTOCOL_VERSION,
                        stage_id: 1,
                        report_interval_ms: 100,
                    },
                    ControlMessage::SetRules { seq: 1, rules },
                ];
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    match control::decode(&line) {
                        Ok(StageMessage::Hello { .. }) => {
                            for message in &greeting {
                                let _ = writer.write_all(control::encode(message).as_bytes());
                            }
                        }
                        Ok(StageMessage::Applied { error: None, .. }) => {
                            let _ = applied.send(());
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    receiver
}
