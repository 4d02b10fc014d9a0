//! `cheferd`'s and `cheferd-lab`'s command lines as a user meets them: the sample configurations in `etc/`
//! load; bad rates are refused naming the file, key and value; numeric flags out of
//! range or negative are refused naming the flag; a key that does not match its
//! certificate is named with it; a configuration without resources warns; `ctl`
//! mistakes get one clear line (nothing to set, a negative priority, the wrong socket)
//! and its views read well in a pipe.

use crate::util::{cheferd, cheferd_lab, run_with_timeout, wait_for, Cluster, START_TIMEOUT};
use cheferd_controller::config::GlobalConfig;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn etc(file: &str) -> PathBuf {
    crate::util::repository().join("etc").join(file)
}

/// `cheferd ARGS…`, to completion.
fn run(args: &[&str]) -> Output {
    run_program(&cheferd(), args)
}

/// `PROGRAM ARGS…` (`cheferd` or `cheferd-lab`), to completion.
fn run_program(program: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(program);
    command.args(args);
    run_with_timeout(&mut command, Duration::from_secs(30))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn sample_configurations_load() {
    let _turn = crate::util::together();
    let text = std::fs::read_to_string(etc("global.toml")).expect("etc/global.toml");
    let global = GlobalConfig::parse(&text, &cheferd_controller::policy::check)
        .unwrap_or_else(|e| panic!("etc/global.toml: {e}"));
    assert_eq!(global.resources.len(), 2);
    // Installed as /etc/cheferd/global.toml: an example job would limit a real one.
    assert!(global.jobs.is_empty() && global.rules.is_empty());
    assert!(global.warnings().is_empty());
    assert!(global.tls.cert.is_some());

    let path = etc("padll.toml");
    let stage = padll_wire::config::load(&|name| {
        (name == "PADLL_CONFIG").then(|| path.display().to_string())
    })
    .unwrap_or_else(|e| panic!("etc/padll.toml: {e}"));
    assert_eq!(stage.mounts, ["/scratch"]);
    assert_eq!(stage.limits.len(), 2);
    assert!(stage.controller.is_some());
}

/// `cheferd global` on `config` with nothing else to go wrong (plaintext, free port,
/// its own admin socket): it must refuse to start.
fn global_refuses(config: &str) -> (String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("global.toml");
    std::fs::write(&path, config).expect("config written");
    let admin = dir.path().join("admin.sock");
    let output = run(&[
        "global",
        "--config",
        path.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--admin-socket",
        admin.to_str().unwrap(),
        "--insecure-plaintext",
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    (stderr(&output), path.display().to_string())
}

#[test]
fn global_refuses_bad_rates_naming_file_key_and_value() {
    let _turn = crate::util::together();
    for (max_rate, why) in [
        (
            "\"20GiB/s\"",
            "resource[0].max_rate: '20GiB/s' is a rate of bytes, but /scratch:metadata counts operations",
        ),
        ("-5", "resource[0].max_rate: bad rate '-5': must not be negative"),
        ("inf", "resource[0].max_rate: bad rate 'inf': must be a finite number"),
        ("\"fast\"", "resource[0].max_rate: bad rate 'fast'"),
    ] {
        let (message, file) = global_refuses(&format!(
            "[[resource]]\nname = \"/scratch:metadata\"\nmax_rate = {max_rate}\npolicy = \"psfa\"\n"
        ));
        assert!(
            message.contains(&file) && message.contains(why),
            "{max_rate}: {message}"
        );
        assert_eq!(message.trim_end().lines().count(), 1, "{message}");
    }
}

#[test]
fn global_refuses_a_config_that_is_a_device_or_a_fifo_at_once() {
    let _turn = crate::util::together();
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("global.toml");
    let fifo_c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo_c.as_ptr(), 0o600) }, 0);
    let admin = dir.path().join("admin.sock");
    for config in ["/dev/zero", fifo.to_str().unwrap()] {
        let args = [
            "global",
            "--config",
            config,
            "--listen",
            "127.0.0.1:0",
            "--admin-socket",
            admin.to_str().unwrap(),
            "--insecure-plaintext",
        ];
        let expected = format!("cannot read --config {config}: not a regular file");
        assert_usage_error(&args, &run(&args), &expected);
    }
}

#[test]
fn ctl_usage_errors_are_one_clear_line() {
    let _turn = crate::util::together();
    for (args, expected) in [
        (
            &["ctl", "set-job", "jobA"][..],
            "set-job jobA: nothing to change",
        ),
        (
            &["ctl", "set-job", "jobA", "--priority", "-1"],
            "--priority -1: must be from 0.000001 to 1000000",
        ),
        (
            &["ctl", "set-job", "jobA", "--priority", "2e6"],
            "--priority 2000000: must be from 0.000001 to 1000000",
        ),
        (
            &["ctl", "set-job", "jobA", "--resource", "/scratch:metadata"],
            "set-job jobA: nothing to change",
        ),
        (
            &[
                "ctl",
                "set-job",
                "jobA",
                "--priority",
                "2",
                "--resource",
                "/scratch:metadata",
            ],
            "needs --demand or --limit",
        ),
        (
            &[
                "ctl",
                "set-job",
                "jobA",
                "--resource",
                "/scratch:metadata",
                "--demand",
                "-5",
            ],
            "--demand: bad rate '-5': must not be negative",
        ),
        (
            &["ctl", "set-max-rate", "/scratch:metadata", "20GiB/s"],
            "is a rate of bytes, but /scratch:metadata counts operations",
        ),
    ] {
        assert_usage_error(args, &run(args), expected);
    }
    // --socket is accepted after the subcommand too (here: nobody listens on it).
    let output = run(&["ctl", "nodes", "--socket", "/nonexistent/admin.sock"]);
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("/nonexistent/admin.sock"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn the_daemon_names_cheferd_lab_for_the_tools_it_no_longer_carries() {
    for tool in [
        "demo", "bench", "replay", "simulate", "allocate", "trace", "place",
    ] {
        let args = [tool, "--help"];
        let output = run(&args);
        assert_usage_error(&args, &output, &format!("cheferd-lab {tool}"));
        assert!(
            run_program(&cheferd_lab(), &args).status.success(),
            "{tool}"
        );
    }
    let output = run(&["dmeo"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        !stderr(&output).contains("cheferd-lab"),
        "{}",
        stderr(&output)
    );
}

/// A typo'd flag or subcommand, or a missing argument, is one line naming it (with
/// clap's suggestion) and the help of the command it was given to, in both binaries;
/// `--help` and `--version` still print in full (exit 0).
#[test]
fn command_line_mistakes_are_one_line_naming_them_and_the_commands_help() {
    let (cheferd, lab) = (cheferd(), cheferd_lab());
    for (program, args, expected) in [
        (
            &cheferd,
            &["global", "--confg", "x"][..],
            "cheferd: unexpected argument '--confg' found (a similar argument exists: \
             '--config'); see 'cheferd global --help'",
        ),
        (
            &cheferd,
            &["ctl", "stauts"],
            "cheferd: unrecognized subcommand 'stauts' (some similar subcommands exist: \
             'stages', 'status'); see 'cheferd ctl --help'",
        ),
        (&cheferd, &["ctl", "stau\nts"], "'stau\\nts'"),
        (&cheferd, &["certs", "nod"], "see 'cheferd certs --help'"),
        (
            &cheferd,
            &["local", "--bogus"],
            "see 'cheferd local --help'",
        ),
        (&cheferd, &["--bogus"], "see 'cheferd --help'"),
        (
            &lab,
            &["demo", "--polcy", "psfa"],
            "cheferd-lab: unexpected argument '--polcy' found (a similar argument exists: \
             '--policy'); see 'cheferd-lab demo --help'",
        ),
        (
            &lab,
            &["replay", "--dir", "/tmp"],
            "cheferd-lab: the following required arguments were not provided: --trace <FILE>; \
             see 'cheferd-lab replay --help'",
        ),
    ] {
        let output = run_program(program, args);
        assert_usage_error(args, &output, expected);
    }
    for (program, args) in [
        (&cheferd, &["--help"][..]),
        (&cheferd, &["global", "--help"]),
        (&cheferd, &["--version"]),
        (&lab, &["demo", "--help"]),
        (&lab, &["--version"]),
    ] {
        let output = run_program(program, args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(stderr(&output).is_empty(), "{args:?}: {}", stderr(&output));
        let lines = stdout(&output).lines().count();
        assert!(
            lines >= 1 && (args[0] == "--version" || lines > 5),
            "{args:?}"
        );
    }
}

/// Asserts a usage error: exit 2, one line, containing `expected`, no clap tip.
fn assert_usage_error(args: &[&str], output: &Output, expected: &str) {
    let message = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {message}");
    assert!(message.contains(expected), "{args:?}: {message}");
    assert_eq!(message.trim_end().lines().count(), 1, "{args:?}: {message}");
    assert!(!message.contains("tip"), "{args:?}: {message}");
}

#[test]
fn numeric_flags_out_of_range_or_negative_name_the_flag() {
    let _turn = crate::util::together();
    // A command, and one of its integer flags with a value out of its range.
    type Row<'a> = (&'a [&'a str], &'a str, &'a str);
    let lab: &[Row] = &[
        (&["demo"], "--jobs", "0"),
        (&["demo"], "--jobs", "-1"),
        (&["demo"], "--jobs", "5"),
        (&["demo"], "--seconds", "0"),
        (&["demo"], "--seconds", "99999999999999999999999"),
        (&["demo"], "--stagger", "-1"),
        (&["demo"], "--stagger", "100000"),
        (&["bench"], "--interval-ms", "-1"),
        (
            &[
                "bench-floor-locals",
                "--address",
                "127.0.0.1:1",
                "--locals",
                "1",
            ],
            "--report-bytes",
            "0",
        ),
        (
            &[
                "bench-floor-locals",
                "--address",
                "127.0.0.1:1",
                "--report-bytes",
                "1",
            ],
            "--locals",
            "100001",
        ),
        (&["replay", "--dir", "/"], "--rate", "-5"),
        (&["replay", "--rate", "5", "--dir", "/"], "--threads", "-2"),
    ];
    let daemon: &[Row] = &[
        (&["local", "--insecure-plaintext"], "--report-ms", "-1"),
        (&["local", "--insecure-plaintext"], "--max-connections", "0"),
        (&["certs", "ca", "--out", "/nonexistent"], "--days", "-3"),
    ];
    for (program, rows) in [(cheferd_lab(), lab), (cheferd(), daemon)] {
        for &(command, flag, value) in rows {
            let args = [command, &[flag, value]].concat();
            let expected = format!("{flag} '{value}': must be a whole number from ");
            assert_usage_error(&args, &run_program(&program, &args), &expected);
        }
    }
    let lab: &[(&[&str], &str)] = &[
        (&["bench", "--locals", "10,0"], "--locals '0': must be"),
        (
            &["demo", "--max-rate", "-5"],
            "--max-rate: bad rate '-5': must not be negative",
        ),
        (
            &["demo", "--max-rate", "1G"],
            "--max-rate '1G': must be from",
        ),
        (&["demo", "--max-rate", "5"], "--max-rate '5': must be from"),
        (
            &["replay", "--rate", "5", "--speed", "-2", "--dir", "/"],
            "--speed -2 must be positive",
        ),
    ];
    let daemon: &[(&[&str], &str)] = &[(
        &["ctl", "set-max-rate", "/scratch:metadata", "-5"],
        "bad rate '-5': must not be negative",
    )];
    for (program, rows) in [(cheferd_lab(), lab), (cheferd(), daemon)] {
        for (args, expected) in rows {
            assert_usage_error(args, &run_program(&program, args), expected);
        }
    }
}

#[test]
fn local_names_the_files_of_a_key_that_does_not_match_as_global_does() {
    let _turn = crate::util::together();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (ca, nodes, server) = (path("ca"), path("nodes"), path("server"));
    for args in [
        &["certs", "ca", "--out", &ca][..],
        &["certs", "node", "n1", "n2", "--ca", &ca, "--out", &nodes],
        &[
            "certs",
            "server",
            "127.0.0.1",
            "--ca",
            &ca,
            "--out",
            &server,
        ],
    ] {
        let output = run(args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    }
    let config = path("global.toml");
    std::fs::write(
        &config,
        "[[resource]]\nname = \"/scratch:metadata\"\nmax_rate = 1000\npolicy = \"psfa\"\n",
    )
    .expect("config written");
    let (node_cert, server_cert) = (path("nodes/node-n1.pem"), path("server/server.pem"));
    // The key of another node's certificate.
    let key = path("nodes/node-n2.key");
    let ca_cert = path("ca/ca.pem");
    let local: &[&str] = &[
        "local",
        "--socket",
        &path("local.sock"),
        "--global",
        "https://127.0.0.1:1",
        "--tls-cert",
        &node_cert,
        "--tls-key",
        &key,
        "--tls-ca",
        &ca_cert,
    ];
    let global: &[&str] = &[
        "global",
        "--config",
        &config,
        "--listen",
        "127.0.0.1:0",
        "--admin-socket",
        &path("admin.sock"),
        "--tls-cert",
        &server_cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca_cert,
    ];
    for (args, cert) in [(local, &node_cert), (global, &server_cert)] {
        let expected = format!("--tls-cert {cert}: unusable with --tls-key {key} (");
        assert_usage_error(args, &run(args), &expected);
    }
    // A relay has both: each named by its own flags.
    let relay = |server_key: &str, node_key: &str| -> Vec<String> {
        [
            "relay",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &server_cert,
            "--tls-key",
            server_key,
            "--node-cert",
            &node_cert,
            "--node-key",
            node_key,
            "--tls-ca",
            &ca_cert,
        ]
        .map(String::from)
        .to_vec()
    };
    let (server_key, node_key) = (path("server/server.key"), path("nodes/node-n1.key"));
    for (args, expected) in [
        (
            relay(&key, &node_key),
            format!("--tls-cert {server_cert}: unusable with --tls-key {key} ("),
        ),
        (
            relay(&server_key, &key),
            format!("--node-cert {node_cert}: unusable with --node-key {key} ("),
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_usage_error(&args, &run(&args), &expected);
    }
}

#[test]
fn relay_usage_errors_name_the_flag() {
    let _turn = crate::util::together();
    for (args, expected) in [
        (
            &["relay", "--insecure-plaintext", "--global", "ftp://head"][..],
            "--global 'ftp://head' must be a URL",
        ),
        (&["relay"][..], "--insecure-plaintext"),
        (
            &["relay", "--insecure-plaintext", "--tls-ca", "ca.pem"][..],
            "--insecure-plaintext conflicts with the TLS files given",
        ),
        (
            &[
                "relay",
                "--tls-cert",
                "a",
                "--tls-key",
                "b",
                "--tls-ca",
                "c",
            ][..],
            "mutual TLS needs --node-cert as well",
        ),
        (
            &["relay", "--insecure-plaintext", "--listen", "nowhere"][..],
            "--listen nowhere:",
        ),
    ] {
        assert_usage_error(args, &run(args), expected);
    }
}

#[test]
fn global_without_resources_warns_at_start() {
    let _turn = crate::util::alone();
    let mut cluster = Cluster::new("interval_ms = 1000\n");
    cluster.start_global();
    wait_for(START_TIMEOUT, "the warning", || {
        cluster
            .global_log()
            .lines()
            .find(|l| l.contains("WARN") && l.contains("no [[resource]]"))
            .map(|l| assert!(l.contains("global.toml"), "{l}"))
    });
}

#[test]
fn ctl_views_and_the_wrong_socket() {
    let _turn = crate::util::alone();
    let mut cluster = Cluster::new(
        "[[resource]]\nname = \"{scratch}:metadata\"\nmax_rate = 1000\npolicy = \"psfa\"\n",
    );
    cluster.start_global();
    cluster.start_local("n1");
    let admin = cluster.admin.to_str().unwrap().to_string();

    // An idle resource: nothing used, written 0 (an empty float sum is -0.0). A number
    // starts after a space; "-0" alone also matches temporary names (`cheferd-e2e-0c5u…`).
    let jobs = run(&["ctl", "jobs", "--socket", &admin]);
    assert!(jobs.status.success(), "{}", stderr(&jobs));
    assert!(
        stdout(&jobs).contains("used 0 (0 %)") && !stdout(&jobs).contains(" -0"),
        "{}",
        stdout(&jobs)
    );
    assert!(
        !cluster.global_log().contains("no [[resource]]"),
        "a configuration with a resource warned"
    );

    // A local controller's socket is named as such, not answered with a decoding error.
    let local = cluster.local_socket("n1");
    let output = run(&["ctl", "jobs", "--socket", local.to_str().unwrap()]);
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{message}");
    assert!(
        message.contains("local controller") && message.contains("--admin-socket"),
        "{message}"
    );

    // `top` into a pipe: a table a second, no terminal control codes.
    let mut top = Command::new(cheferd())
        .args(["ctl", "top", "--socket", &admin])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ctl top starts");
    let mut pipe = top.stdout.take().expect("piped");
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut buf) {
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    wait_for(Duration::from_secs(30), "two tables from ctl top", || {
        let tables = text
            .lock()
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("cycle "))
            .count();
        (tables >= 2).then_some(())
    });
    let _ = top.kill();
    let _ = top.wait();
    let text = text.lock().unwrap();
    assert!(!text.contains('\x1b'), "{text:?}");

    // A reader that goes away (`ctl top | head -1`) ends ctl quietly, exit 0.
    for view in [&["top"][..], &["top", "--json"], &["dump"], &["jobs"]] {
        let mut ctl = Command::new(cheferd())
            .arg("ctl")
            .args(view)
            .args(["--socket", &admin])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ctl starts");
        drop(ctl.stdout.take());
        let status = wait_for(Duration::from_secs(10), "ctl to end", || {
            ctl.try_wait().unwrap()
        });
        let mut message = String::new();
        let _ = ctl.stderr.take().unwrap().read_to_string(&mut message);
        assert!(
            status.success() && message.is_empty(),
            "ctl {view:?}: {status}: {message}"
        );
    }
}

/// A local controller whose socket file is removed, or replaced by another file, says so
/// and exits 1 (its service manager makes it anew): it went on serving the stages
/// attached, silently, while every new process failed to reach it and ran on its own
/// limits (none by default).
#[test]
fn a_local_controller_whose_socket_file_goes_away_says_so_and_exits() {
    for replace in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("local.sock");
        let mut local = Command::new(cheferd())
            .args([
                "local",
                "--insecure-plaintext",
                "--global",
                "http://127.0.0.1:1",
            ])
            .arg("--socket")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cheferd local runs");
        wait_for(START_TIMEOUT, "the socket", || {
            socket.exists().then_some(())
        });
        std::fs::remove_file(&socket).expect("socket removed");
        if replace {
            std::fs::write(&socket, "").expect("a file in its place");
        }
        let status = wait_for(
            Duration::from_secs(60),
            "the local controller to exit",
            || local.try_wait().expect("wait"),
        );
        let mut said = String::new();
        local
            .stderr
            .take()
            .expect("stderr piped")
            .read_to_string(&mut said)
            .expect("stderr read");
        assert_eq!(status.code(), Some(1), "replaced {replace}: {said}");
        let expected = format!("the socket {} was removed or replaced", socket.display());
        assert!(said.contains(&expected), "replaced {replace}: {said}");
        if replace {
            assert!(socket.is_file(), "the file put there is left alone");
        }
    }
}
