//! Placement of new files (issue 10 part 2) end to end in the stage, without Lustre: a
//! scripted controller answers the stage's placement requests, and a test double
//! preloaded after the stage (`ioctl` in a small C library built here with `cc`) records
//! every `LL_IOC_LOV_SETSTRIPE` with the layout it was given. A C program makes the
//! creation calls (`open`, `openat`, `creat`, an existing file, `O_EXCL` on it) and
//! prints what it saw; its output must be what it is natively, whatever the ioctl does.
//! The controller also records the sizes the stage reports at a placed file's last close.

use crate::util::*;
use padll_wire::control::{self, ControlMessage, StageMessage, PROTOCOL_VERSION};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The targets the scripted controller gives (the first `stripes` of them).
const TARGETS: [u32; 4] = [5, 1, 3, 0x1234];

/// Stands in for a Lustre client: `statfs` reports `LL_SUPER_MAGIC`; `F_GETFL` does not
/// show the layout-delay flags (Lustre clears them from the file at open); each
/// `LL_IOC_LOV_SETSTRIPE` is recorded as one line of hex (the whole layout) in
/// `$PLACEMENT_LOG`, then fails with `$PLACEMENT_ERRNO` if set, else succeeds. Anything
/// else goes to the real function.
const DOUBLE: &str = include_str!("lustre_double.c");

/// Creation calls, each followed by what the program can see of its result.
const PROGRAM: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
static void show(const char *what, int fd) {
    int saved = errno;
    int flags = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
    printf("%s: ok=%d errno=%d flags=%#x", what, fd >= 0, saved, flags);
    if (fd >= 0) printf(" wrote=%zd", write(fd, "data", 4));
    printf("\n");
    if (fd >= 0) close(fd);
}
int main(int argc, char **argv) {
    if (chdir(argv[1]) != 0) return 2;
    errno = 0; show("open", open("a", O_CREAT | O_WRONLY | O_EXCL, 0640));
    int dir = open(".", O_RDONLY | O_DIRECTORY);
    errno = 0; show("openat", openat(dir, "b", O_CREAT | O_RDWR | O_APPEND, 0600));
    errno = 0; show("creat", creat("c", 0600));
    errno = 0; show("existing", open("a", O_CREAT | O_WRONLY, 0600));
    errno = 0; show("exclusive", open("a", O_CREAT | O_EXCL | O_WRONLY, 0600));
    errno = 0; show("missing dir", open("no/such", O_CREAT | O_WRONLY, 0600));
    return 0;
}
"#;

/// A placed file written [`SIZED_BYTES`], duplicated (`dup`, `fcntl(F_DUPFD)`) and
/// closed three times, then closed once more (`EBADF`); a file that existed already
/// (not placed) written and closed; a placed file of 3 bytes duplicated by `dup2` and
/// closed by `close` then `close_range`; a placed file of 7 bytes left open at exit;
/// each close's result and `errno` printed.
const SIZES_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
static char data[12345];
static void closed(const char *what, int fd) {
    errno = 0;
    int result = close(fd);
    printf("%s: close=%d errno=%d\n", what, result, errno);
}
int main(int argc, char **argv) {
    if (chdir(argv[1]) != 0) return 2;
    int fd = open("sized", O_CREAT | O_WRONLY | O_EXCL, 0600);
    printf("write=%zd\n", write(fd, data, sizeof data));
    int copy = dup(fd);
    int third = fcntl(fd, F_DUPFD, 100);
    closed("first", fd);
    closed("copy", copy);
    printf("after=%zd\n", write(third, "x", 1));
    closed("third", third);
    closed("again", third);
    int plain = open("sized", O_WRONLY | O_APPEND);
    printf("plain write=%zd\n", write(plain, data, 10));
    closed("plain", plain);
    int ranged = open("ranged", O_CREAT | O_WRONLY | O_EXCL, 0600);
    printf("ranged write=%zd dup2=%d\n", write(ranged, data, 3), dup2(ranged, 200));
    closed("ranged", ranged);
    errno = 0;
    int result = close_range(200, 200, 0);
    printf("close_range=%d errno=%d\n", result, errno);
    int left = open("left", O_CREAT | O_WRONLY | O_EXCL, 0600);
    printf("left write=%zd\n", write(left, data, 7));
    return 0;
}
"#;

/// The size [`SIZES_PROGRAM`]'s placed file ends with.
const SIZED_BYTES: u64 = 12345 + 1;

/// What the scripted controller saw: the sizes stages reported, and how many of their
/// connections ended.
#[derive(Default)]
struct Seen {
    sizes: Vec<(String, u64)>,
    ended: usize,
}

/// `source` compiled with `cc` into `out` (`-shared` for a library).
fn build(dir: &Path, name: &str, source: &str, shared: bool) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let out = dir.join(name);
    let mut cc = Command::new("cc");
    if shared {
        cc.args(["-shared", "-fPIC"]);
    }
    let status = cc
        .arg("-O1")
        .arg("-o")
        .arg(&out)
        .arg(&c)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(status.success(), "cc {name} failed");
    out
}

/// A local controller that welcomes every stage (no limits) and answers each placement request
/// with the first `stripes` of [`TARGETS`] (or never, if `answer` is false). Runs until
/// the test ends; records what it is told in `seen`.
fn scripted_controller(socket: &Path, answer: bool, seen: Arc<Mutex<Seen>>) {
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let replies = match control::decode::<StageMessage>(&line) {
                        Ok(StageMessage::Hello { .. }) => vec![
                            ControlMessage::Welcome {
                                version: PROTOCOL_VERSION,
                                stage_id: 1,
                                report_interval_ms: 1000,
                            },
                            ControlMessage::SetRules {
                                seq: 1,
                                rules: Vec::new(),
                            },
                        ],
                        Ok(StageMessage::Place { id, stripes, .. }) if answer => {
                            vec![ControlMessage::Placed {
                                id,
                                targets: TARGETS[..stripes as usize].to_vec(),
                            }]
                        }
                        Ok(StageMessage::FileSize { mount, bytes }) => {
                            seen.lock().unwrap().sizes.push((mount, bytes));
                            Vec::new()
                        }
                        _ => Vec::new(),
                    };
                    for reply in replies {
                        let _ = writer.write_all(control::encode(&reply).as_bytes());
                    }
                }
                seen.lock().unwrap().ended += 1;
            });
        }
    });
}

/// One scenario's set-up: a scratch mount, the program, the double and a controller.
struct Setup {
    scratch: Scratch,
    /// The program's output when run natively.
    native: String,
    program: PathBuf,
    double: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    seen: Arc<Mutex<Seen>>,
}

impl Setup {
    fn new(name: &str, answer: bool) -> Setup {
        let scratch = Scratch::new(&format!("placement-{name}"));
        let tools = scratch.join("tools");
        std::fs::create_dir(&tools).unwrap();
        let program = build(&tools, "create", PROGRAM, false);
        let double = build(&tools, "libioctl-double.so", DOUBLE, true);
        let socket = tools.join("controller.sock");
        let seen = Arc::new(Mutex::new(Seen::default()));
        scripted_controller(&socket, answer, seen.clone());
        let log = tools.join("ioctl.log");
        let mut setup = Setup {
            scratch,
            native: String::new(),
            program,
            double,
            socket,
            log,
            seen,
        };
        setup.native = setup.run("native", None, false);
        setup
    }

    /// `PADLL_PLACEMENT` for the mount with `stripes`.
    fn placement(&self, stripes: u32) -> (&'static str, String) {
        let mount = self.scratch.path().display();
        ("PADLL_PLACEMENT", format!("{mount}={stripes}"))
    }

    /// The program's output in a fresh directory `name` under the mount, natively or
    /// under the stage (`stage` = extra variables, the double preloaded after it if
    /// `double`).
    fn run(&self, name: &str, stage: Option<&[(&str, &str)]>, double: bool) -> String {
        let (stdout, stderr) = self.run_with_stderr(name, stage, double);
        assert!(stderr.is_empty(), "{stderr}");
        stdout
    }

    /// [`Setup::run`], returning what the program wrote on stderr too.
    fn run_with_stderr(
        &self,
        name: &str,
        stage: Option<&[(&str, &str)]>,
        double: bool,
    ) -> (String, String) {
        self.run_program(&self.program, name, stage, double)
    }

    /// [`Setup::run_with_stderr`] of another `program`.
    fn run_program(
        &self,
        program: &Path,
        name: &str,
        stage: Option<&[(&str, &str)]>,
        double: bool,
    ) -> (String, String) {
        let dir = self.scratch.join(name);
        std::fs::create_dir(&dir).unwrap();
        let mut env: Vec<(String, String)> = Vec::new();
        if let Some(vars) = stage {
            env = stage_env(self.scratch.path(), "", None);
            env.push(("PADLL_CONTROLLER".into(), self.socket.display().to_string()));
            // The scripted controller answers at once, but runs beside other tests:
            // a creation waits for it as long as a loaded machine may need.
            env.push(("PADLL_PLACEMENT_WAIT_MS".into(), "10000".into()));
            env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        }
        if double {
            let preload = env
                .iter()
                .find(|(k, _)| k == "LD_PRELOAD")
                .map_or(String::new(), |(_, v)| format!("{v} "));
            env.retain(|(k, _)| k != "LD_PRELOAD");
            env.push((
                "LD_PRELOAD".into(),
                format!("{preload}{}", self.double.display()),
            ));
            env.push(("PLACEMENT_LOG".into(), self.log.display().to_string()));
        }
        let program = program.to_str().unwrap();
        let out = run(program, &[dir.to_str().unwrap()], &dir, &env);
        assert!(out.status.success());
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The layouts the double recorded, as hex lines.
    fn recorded(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .map(|text| text.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }
}

/// The layout for `targets` as the double prints it: the `lov_user_md_v3` fields at
/// lustre_user.h's offsets, little-endian, then one `lov_user_ost_data_v1` per target.
fn expected_layout(targets: &[u32]) -> String {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&0x0BD5_0BD0u32.to_le_bytes()); // LOV_USER_MAGIC_SPECIFIC
    bytes.extend_from_slice(&[0; 4 + 16 + 4]); // pattern, lmm_oi, stripe size
    bytes.extend_from_slice(&(targets.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&(targets[0] as u16).to_le_bytes()); // stripe offset
    bytes.extend_from_slice(&[0; 16]); // pool name
    for target in targets {
        bytes.extend_from_slice(&[0; 16 + 4]); // l_ost_oi, l_ost_gen
        bytes.extend_from_slice(&target.to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn created_files_get_the_controllers_targets_and_nothing_else_changes() {
    let _turn = crate::util::together();
    let setup = Setup::new("placed", true);
    let (name, value) = setup.placement(3);
    assert_eq!(
        setup.run("placed", Some(&[(name, &value)]), true),
        setup.native
    );
    // open, openat and creat made a new file: one layout each, the controller's three
    // targets; the existing file, the refused O_EXCL and the missing directory none.
    let layout = expected_layout(&TARGETS[..3]);
    assert_eq!(
        setup.recorded(),
        vec![layout.clone(), layout.clone(), layout]
    );
}

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn without_placement_no_layout_call_is_made() {
    let _turn = crate::util::together();
    let setup = Setup::new("unplaced", true);
    assert_eq!(setup.run("managed", Some(&[]), true), setup.native);
    assert!(setup.recorded().is_empty(), "{:?}", setup.recorded());
}

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn layout_errors_never_reach_the_program() {
    let _turn = crate::util::together();
    let setup = Setup::new("refused", true);
    let (name, value) = setup.placement(2);
    let failing = [(name, value.as_str()), ("PLACEMENT_ERRNO", "22")];
    assert_eq!(setup.run("einval", Some(&failing), true), setup.native);
    assert_eq!(setup.recorded().len(), 3);
}

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn a_file_system_without_the_interface_sees_no_change() {
    let _turn = crate::util::together();
    let setup = Setup::new("not-lustre", true);
    let (name, value) = setup.placement(2);
    let (stdout, stderr) = setup.run_with_stderr("plain", Some(&[(name, &value)]), false);
    assert_eq!(stdout, setup.native);
    let mount = setup.scratch.path().display();
    assert!(
        stderr.contains(&format!(
            "no placement on {mount}: not a Lustre file system"
        )) && stderr.lines().count() == 1,
        "{stderr}"
    );
}

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn without_an_answer_files_are_created_as_usual() {
    let _turn = crate::util::together();
    let setup = Setup::new("silent", false);
    let (name, value) = setup.placement(2);
    let started = Instant::now();
    let placed = setup.run(
        "silent",
        Some(&[(name, &value), ("PADLL_PLACEMENT_WAIT_MS", "100")]),
        true,
    );
    assert_eq!(placed, setup.native);
    assert!(setup.recorded().is_empty());
    // Three creations waited 100 ms each for an answer, and no longer.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn a_placed_file_reports_its_size_once_at_its_last_close() {
    let _turn = crate::util::together();
    let setup = Setup::new("sizes", true);
    let tools = setup.scratch.join("tools");
    let program = build(&tools, "sizes", SIZES_PROGRAM, false);
    let (native, stderr) = setup.run_program(&program, "sizes-native", None, false);
    assert!(stderr.is_empty(), "{stderr}");
    assert!(native.contains("again: close=-1 errno=9"), "{native}");
    let (name, value) = setup.placement(1);
    let (placed, stderr) =
        setup.run_program(&program, "sizes-placed", Some(&[(name, &value)]), true);
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(placed, native, "close results and errno unchanged");
    assert_eq!(setup.recorded().len(), 3, "three files were created placed");
    // The stage's connection ends with the process: everything it sent has been read.
    let deadline = Instant::now() + Duration::from_secs(30);
    while setup.seen.lock().unwrap().ended == 0 {
        assert!(Instant::now() < deadline, "the stage never disconnected");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mount = setup.scratch.path().display().to_string();
    assert_eq!(
        setup.seen.lock().unwrap().sizes,
        vec![(mount.clone(), SIZED_BYTES), (mount.clone(), 3), (mount, 7)],
        "one size per placed file, at its last close or at exit"
    );
}
