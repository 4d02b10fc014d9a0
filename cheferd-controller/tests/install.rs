//! `scripts/install.sh` into a temporary prefix, from the binaries this test run built:
//! the installed `padll` preloads the installed stage, `--version` names the commit,
//! the man pages and completions are there, the units pass `systemd-analyze verify`;
//! the Debian package carries every file it stages.

use crate::util::{cheferd, repository, run_with_timeout, stage_library, wait_for};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Runs `command` (2 minutes at most).
fn run(command: &mut Command) -> Output {
    run_with_timeout(command, Duration::from_secs(120))
}

/// Copies the program `from` to `to`, and returns once `to` can be executed. A child
/// that another test's thread forked while the copy was being written holds the copy's
/// descriptor until its own `exec` (or exit), and until then executing the copy fails
/// with `ETXTBSY` ("Text file busy").
fn copy_executable(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
    wait_for(Duration::from_secs(30), "the copy to be executable", || {
        let ran = Command::new(to)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status();
        match ran {
            Err(error) if error.kind() == std::io::ErrorKind::ExecutableFileBusy => None,
            _ => Some(()),
        }
    });
}

/// The profile directory, with `cheferd`, `padll` and `libpadll.so` built in it.
fn profile_dir() -> PathBuf {
    cheferd();
    stage_library();
    crate::util::profile_dir()
}

/// Runs `install.sh ARGS… --from` the profile directory; it must succeed.
fn install_sh(args: &[&std::ffi::OsStr]) {
    let out = run(Command::new("bash")
        .arg(repository().join("scripts/install.sh"))
        .args(args)
        .arg("--from")
        .arg(profile_dir()));
    assert!(
        out.status.success(),
        "install.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A prefix with everything installed into it.
struct Installed {
    _dir: tempfile::TempDir,
    prefix: PathBuf,
}

impl Installed {
    fn new() -> Installed {
        let dir = tempfile::Builder::new()
            .prefix("padll-install-")
            .tempdir()
            .unwrap();
        let prefix = dir.path().join("usr");
        install_sh(&["--prefix".as_ref(), prefix.as_ref()]);
        Installed { _dir: dir, prefix }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.prefix.join(relative)
    }
}

/// `LD_PRELOAD` as the program `padll run` ran saw it: `padll_run` with the program
/// (`printenv`) added; fails the test unless it succeeds.
fn preloaded_by(padll_run: &mut Command) -> String {
    let out = run(padll_run
        .args(["--", "printenv", "LD_PRELOAD"])
        .env_remove("LD_PRELOAD"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// What `--version` must print: the crate's version and the commit (when git can tell).
fn expected_version(program: &str) -> String {
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(repository())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or("unknown".into(), |o| {
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        });
    format!(
        "{program} {} (commit {commit})\n",
        env!("CARGO_PKG_VERSION")
    )
}

#[test]
fn installed_padll_runs_a_program_under_the_installed_stage() {
    let _turn = crate::util::together();
    let installed = Installed::new();
    let library = installed.path("lib/padll/libpadll.so");
    assert!(library.is_file());
    let scratch = installed.prefix.parent().unwrap().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let stats = scratch.parent().unwrap().join("stats.json");
    let preloaded = preloaded_by(
        Command::new(installed.path("bin/padll"))
            .args(["run", "--limit", "metadata=1000/s", "--mount"])
            .arg(&scratch)
            .arg("--stats")
            .arg(&stats)
            .env_remove("PADLL_LIBRARY"),
    );
    assert_eq!(preloaded, library.display().to_string());
    // The stage ran in the program: it wrote its statistics at exit.
    let report = std::fs::read_to_string(&stats).expect("the stage wrote its statistics");
    assert!(report.contains("\"program\":\"printenv\""), "{report}");
}

#[test]
fn installed_binaries_print_their_version_and_commit() {
    let _turn = crate::util::together();
    let installed = Installed::new();
    for program in ["padll", "cheferd", "cheferd-lab"] {
        let out = run(Command::new(installed.path(&format!("bin/{program}"))).arg("--version"));
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            expected_version(program)
        );
    }
}

#[test]
fn man_pages_and_completions_are_installed() {
    let _turn = crate::util::together();
    let installed = Installed::new();
    for page in [
        "padll",
        "padll-run",
        "padll-stats",
        "cheferd",
        "cheferd-local",
        "cheferd-global",
        "cheferd-relay",
        "cheferd-ctl",
        "cheferd-certs-node",
        "cheferd-lab",
        "cheferd-lab-demo",
        "cheferd-lab-bench",
    ] {
        let path = installed.path(&format!("share/man/man1/{page}.1"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            text.starts_with(".ie") || text.contains("\n.TH "),
            "{} is not a man page",
            path.display()
        );
    }
    for program in ["padll", "cheferd", "cheferd-lab"] {
        for file in [
            format!("share/bash-completion/completions/{program}"),
            format!("share/zsh/site-functions/_{program}"),
            format!("share/fish/vendor_completions.d/{program}.fish"),
        ] {
            let text = std::fs::read_to_string(installed.path(&file))
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            // Each completes the subcommands.
            let subcommand = match program {
                "padll" => "stats",
                "cheferd" => "local",
                _ => "demo",
            };
            assert!(
                text.contains(subcommand),
                "{file} does not complete '{subcommand}'"
            );
        }
    }
}

/// The sections clap cannot write: every command's page says its exit status, the
/// main ones their files and examples.
#[test]
fn man_pages_say_exit_status_files_and_examples() {
    let _turn = crate::util::together();
    let installed = Installed::new();
    let pages = std::fs::read_dir(installed.path("share/man/man1")).expect("man1");
    let mut count = 0;
    for page in pages {
        let path = page.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("page");
        assert!(
            text.contains("\n.SH \"EXIT STATUS\"\n"),
            "{} has no EXIT STATUS",
            path.display()
        );
        count += 1;
    }
    assert!(count > 20, "only {count} pages");
    for page in [
        "padll-run",
        "cheferd-global",
        "cheferd-local",
        "cheferd-relay",
        "cheferd-ctl",
    ] {
        let text = std::fs::read_to_string(installed.path(&format!("share/man/man1/{page}.1")))
            .expect("page");
        for section in ["\n.SH FILES\n", "\n.SH EXAMPLES\n"] {
            assert!(text.contains(section), "{page}.1 has no {section:?}");
        }
    }
    // `ctl`'s own codes, on its subcommands' pages too.
    let status =
        std::fs::read_to_string(installed.path("share/man/man1/cheferd-ctl-jobs.1")).expect("page");
    assert!(
        status.contains("\\fB69\\fR"),
        "cheferd-ctl-jobs.1:\n{status}"
    );
}

/// `padll.toml(5)` and `global.toml(5)` name every key of the sample configurations.
#[test]
fn configuration_pages_name_every_key() {
    let _turn = crate::util::together();
    let installed = Installed::new();
    for (page, sample) in [
        ("padll.toml", "etc/padll.toml"),
        ("global.toml", "etc/global.toml"),
    ] {
        let text = std::fs::read_to_string(installed.path(&format!("share/man/man5/{page}.5")))
            .unwrap_or_else(|e| panic!("{page}.5: {e}"));
        let sample = std::fs::read_to_string(repository().join(sample)).expect("sample");
        let table: toml::Table = sample.parse().expect("the sample is TOML");
        let mut keys = Vec::new();
        collect_keys(&table, &mut keys);
        assert!(keys.len() > 5, "{keys:?}");
        for key in keys {
            assert!(
                text.contains(&format!("\\fB{key}\\fR")),
                "{page}.5 does not describe '{key}'"
            );
        }
    }
}

/// groff formats every page without a warning.
#[test]
#[cfg_attr(
    not(has_groff),
    ignore = "groff not installed (Debian package groff-base)"
)]
fn man_pages_format_without_warnings() {
    let _turn = crate::util::together();
    let installed = Installed::new();
    for section in ["man1", "man5"] {
        for page in std::fs::read_dir(installed.path(&format!("share/man/{section}"))).expect("dir")
        {
            let path = page.expect("entry").path();
            // -k: the pages are UTF-8, as man(1) reads them; -ww: every warning.
            let out = run(Command::new("groff")
                .args(["-k", "-man", "-ww", "-z", "-Tutf8"])
                .arg(&path));
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Every key of a TOML table and of its sections (`[tls]`, each `[[limit]]`), whose
/// names are headings rather than keys; a table keyed by resources (`demand = {
/// "/scratch:metadata" = … }`) is one key.
fn collect_keys(table: &toml::Table, keys: &mut Vec<String>) {
    let section = |value: &toml::Value| match value {
        toml::Value::Table(inner) => !inner.keys().any(|k| k.contains('/')),
        _ => false,
    };
    for (key, value) in table {
        match value {
            toml::Value::Array(items) if !items.is_empty() && items.iter().all(section) => {
                items
                    .iter()
                    .filter_map(toml::Value::as_table)
                    .for_each(|inner| collect_keys(inner, keys));
            }
            toml::Value::Table(inner) if section(value) => collect_keys(inner, keys),
            _ => keys.push(key.clone()),
        }
    }
}

#[test]
#[cfg_attr(not(has_systemd_analyze), ignore = "systemd-analyze not installed")]
fn installed_units_pass_systemd_analyze_verify() {
    let _turn = crate::util::together();
    let installed = Installed::new();
    let units: Vec<PathBuf> = [
        "cheferd-local.service",
        "cheferd-global.service",
        "cheferd-relay.service",
    ]
    .iter()
    .map(|u| installed.path(&format!("lib/systemd/system/{u}")))
    .collect();
    // `verify` checks that ExecStart= exists and Documentation=man:… pages are found.
    let out = run(Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .env("MANPATH", installed.path("share/man")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify:\n{stderr}"
    );
    for unit in &units {
        let text = std::fs::read_to_string(unit).unwrap();
        assert!(text.contains(&format!(
            "ExecStart={}",
            installed.path("bin/cheferd").display()
        )));
    }
}

/// Without an installed layout `padll` names every place it looked; `--library` is
/// preloaded; an explicit library that does not exist is named.
#[test]
fn padll_without_its_library_says_where_it_looked() {
    let _turn = crate::util::together();
    let dir = tempfile::tempdir().unwrap();
    // In a bin/ of its own, so that ../lib/padll/ is inside the temporary directory too.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let padll = bin.join("padll");
    copy_executable(&profile_dir().join("padll"), &padll);
    let out = run(Command::new(&padll)
        .args(["run", "--mount", "/tmp", "--", "true"])
        .env_remove("PADLL_LIBRARY"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for looked in [
        "libpadll.so",
        "deps/libpadll.so",
        "../lib/padll/libpadll.so",
    ] {
        assert!(
            stderr.contains(&bin.join(looked).display().to_string()),
            "{stderr}"
        );
    }
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // --library names it.
    let library = padll_wire::find_stage_library(&profile_dir()).expect("built");
    let preloaded = preloaded_by(
        Command::new(&padll)
            .args(["run", "--mount", "/tmp", "--library"])
            .arg(&library),
    );
    assert_eq!(
        preloaded,
        library.canonicalize().unwrap().display().to_string()
    );
    let missing = dir.path().join("missing.so");
    let out = run(Command::new(&padll)
        .args(["run", "--mount", "/tmp", "--", "true"])
        .env("PADLL_LIBRARY", &missing));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("PADLL_LIBRARY '{}'", missing.display())),
        "{stderr}"
    );
}

#[test]
fn install_sh_refuses_bad_arguments_naming_them() {
    let _turn = crate::util::together();
    for (args, needle) in [
        (
            vec!["--prefix", "relative/dir"],
            "'relative/dir' is not an absolute path",
        ),
        (vec!["--prefix"], "--prefix needs a value"),
        (vec!["--bogus"], "unknown argument '--bogus'"),
    ] {
        let out = run(Command::new("bash")
            .arg(repository().join("scripts/install.sh"))
            .args(&args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// Whether the cargo-deb asset source `pattern` (`dir/*`: a file in `dir`; `dir/**/*`: a
/// file anywhere under it; else the file itself) takes the file `path`.
fn asset_takes(pattern: &str, path: &str) -> bool {
    if let Some(dir) = pattern.strip_suffix("/**/*") {
        path.strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
    } else if let Some(dir) = pattern.strip_suffix("/*") {
        path.strip_prefix(dir)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|name| !name.contains('/'))
    } else {
        pattern == path
    }
}

/// The Debian package (`cargo deb -p cheferd-controller --no-build` after `install.sh
/// --prefix /usr --destdir target/release/deb-root`, README "Deploying on a cluster")
/// carries every file `install.sh` stages, in the same place — the tmpfiles.d line
/// making `/dev/shm/padll` too — and its `postinst` makes that directory at install.
#[test]
fn the_debian_package_carries_every_file_install_sh_stages() {
    let _turn = crate::util::together();
    let manifest: toml::Table =
        std::fs::read_to_string(repository().join("cheferd-controller/Cargo.toml"))
            .unwrap()
            .parse()
            .unwrap();
    let assets: Vec<(String, String)> = manifest["package"]["metadata"]["deb"]["assets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|asset| {
            let asset = asset.as_array().unwrap();
            let text = |i: usize| asset[i].as_str().unwrap().to_string();
            (text(0), text(1))
        })
        .collect();

    let dir = tempfile::Builder::new()
        .prefix("padll-deb-root-")
        .tempdir()
        .unwrap();
    install_sh(&[
        "--prefix".as_ref(),
        "/usr".as_ref(),
        "--destdir".as_ref(),
        dir.path().as_ref(),
    ]);
    let mut staged = Vec::new();
    let mut pending = vec![dir.path().to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir.path()).unwrap();
                staged.push(relative.to_str().unwrap().to_string());
            }
        }
    }
    assert!(
        staged.contains(&"usr/lib/tmpfiles.d/padll.conf".to_string()),
        "{staged:?}"
    );
    for file in &staged {
        // The binaries and the stage come from target/release itself, the rest from the
        // staged tree; either way to the same place.
        let name = file.rsplit('/').next().unwrap();
        let taken = assets.iter().any(|(source, target)| {
            let from_tree = format!("target/release/deb-root/{file}");
            let directory = &file[..file.len() - name.len()];
            asset_takes(source, &from_tree) && file.starts_with(target.as_str())
                || source == &format!("target/release/{name}") && target == directory
        });
        assert!(
            taken,
            "the Debian package does not carry {file}: {assets:?}"
        );
    }

    let postinst =
        std::fs::read_to_string(repository().join("cheferd-controller/debian/postinst")).unwrap();
    assert!(
        postinst.contains("systemd-tmpfiles --create padll.conf"),
        "{postinst}"
    );
}

/// `PATH` without the directories that hold `cargo` (as under sudo's `secure_path`).
fn path_without_cargo() -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::env::split_paths(&path).filter(|dir| !dir.join("cargo").exists()))
        .unwrap()
}

#[test]
fn install_sh_without_cargo_installs_what_is_built_or_says_to_build_first() {
    let _turn = crate::util::together();
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    let install_sh = || {
        run(Command::new("bash")
            .arg(repository().join("scripts/install.sh"))
            .arg("--prefix")
            .arg(dir.path().join("usr"))
            .env("PATH", path_without_cargo())
            .env("CARGO_TARGET_DIR", &target))
    };

    // Nothing built: one line saying to build first, without sudo.
    let out = install_sh();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no cargo on PATH")
            && stderr.contains("`cargo build --release` first, without sudo"),
        "{stderr}"
    );

    // Built: installed as it is.
    let release = target.join("release");
    std::fs::create_dir_all(&release).unwrap();
    let profile = profile_dir();
    for program in ["padll", "cheferd", "cheferd-lab"] {
        std::os::unix::fs::symlink(profile.join(program), release.join(program)).unwrap();
    }
    std::os::unix::fs::symlink(stage_library(), release.join("libpadll.so")).unwrap();
    let out = install_sh();
    assert!(
        out.status.success(),
        "install.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("usr/bin/cheferd").is_file());
    assert!(dir.path().join("usr/lib/padll/libpadll.so").is_file());
}
