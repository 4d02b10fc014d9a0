//! The SPANK plugin's plugstack.conf arguments (`configure` in
//! `scripts/slurm/padll_spank.c`), driven alone: the harness of
//! [`crate::spank_directory`] with a `main` that takes the arguments as slurmstepd
//! (`remote`) or srun and sbatch (`local`) do and prints what it kept.

use crate::spank_directory::build_harness;
use crate::util::run_with_timeout;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `argv[1]` is `remote` or `local`, the rest plugstack.conf's arguments; prints
/// `misconfigured=0|1 controller_uid=UID` (empty when unset).
const MAIN: &str = r#"
int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    configure(argc - 2, argv + 2, strcmp(argv[1], "remote") == 0);
    printf("misconfigured=%d controller_uid=%s\n", misconfigured, controller_uid);
    return 0;
}
"#;

/// What the plugin kept from `args` (stdout) and its error lines (stderr).
fn configure(harness: &Path, context: &str, args: &[&str]) -> (String, String) {
    let out = run_with_timeout(
        Command::new(harness).arg(context).args(args),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "harness: {out:?}");
    (
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
#[cfg_attr(
    not(all(has_spank_h, has_cc)),
    ignore = "needs libslurm-dev (slurm/spank.h) and cc"
)]
fn controller_uid_takes_a_number_or_a_user_name_and_refuses_the_rest_in_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let harness = build_harness(dir.path(), MAIN);

    for (value, uid) in [("980", "980"), ("0", "0"), ("4294967294", "4294967294")] {
        let arg = format!("controller_uid={value}");
        assert_eq!(
            configure(&harness, "remote", &[&arg]),
            (
                format!("misconfigured=0 controller_uid={uid}"),
                String::new()
            ),
            "{arg}"
        );
    }
    // A name, resolved in slurmstepd (as root); srun and sbatch keep it unresolved,
    // as its user may not exist on a login node.
    assert_eq!(
        configure(&harness, "remote", &["controller_uid=root"]),
        (
            "misconfigured=0 controller_uid=0".to_string(),
            String::new()
        )
    );
    assert_eq!(
        configure(&harness, "local", &["controller_uid=padll-no-such-user"]),
        ("misconfigured=0 controller_uid=".to_string(), String::new())
    );

    // Out of uid_t's range ((uid_t)-1 is no uid), or no such user: one line naming it,
    // and PADLL off.
    for (value, why) in [
        ("4294967296", "out of range"),
        ("4294967295", "out of range"),
        ("99999999999999999999999", "out of range"),
        ("padll-no-such-user", "no such user"),
        ("", "expected a uid or a user name"),
    ] {
        let arg = format!("controller_uid={value}");
        let (kept, errors) = configure(&harness, "remote", &[&arg]);
        assert_eq!(kept, "misconfigured=1 controller_uid=", "{arg}");
        assert_eq!(errors.lines().count(), 1, "{arg}: {errors}");
        assert!(
            errors.contains(&format!("plugstack.conf: {arg}")) && errors.contains(why),
            "{arg}: {errors}"
        );
    }
}

#[test]
#[cfg_attr(
    not(all(has_spank_h, has_cc)),
    ignore = "needs libslurm-dev (slurm/spank.h) and cc"
)]
fn a_missing_config_file_is_named_in_slurmds_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let harness = build_harness(dir.path(), MAIN);
    let missing = dir.path().join("padll.toml");
    let arg = format!("config={}", missing.display());

    // In slurmstepd (as root): one line naming the file; the arguments stand, and each
    // task says it runs without PADLL.
    let (kept, errors) = configure(&harness, "remote", &[&arg]);
    assert_eq!(kept, "misconfigured=0 controller_uid=");
    assert_eq!(errors.lines().count(), 1, "{errors}");
    assert!(
        errors.contains(&format!("plugstack.conf: {arg}: No such file or directory")),
        "{errors}"
    );

    // srun and sbatch do not look: a login node need not have it.
    assert_eq!(
        configure(&harness, "local", &[&arg]),
        ("misconfigured=0 controller_uid=".to_string(), String::new())
    );

    std::fs::write(&missing, "mounts = [\"/scratch\"]\n").expect("config");
    assert_eq!(
        configure(&harness, "remote", &[&arg]),
        ("misconfigured=0 controller_uid=".to_string(), String::new())
    );
}

#[test]
#[cfg_attr(
    not(all(has_spank_h, has_cc)),
    ignore = "needs libslurm-dev (slurm/spank.h) and cc"
)]
fn a_library_path_that_would_split_ld_preload_is_refused_in_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let harness = build_harness(dir.path(), MAIN);
    for library in ["/opt/a b.so", "/opt/a:b.so"] {
        let arg = format!("library={library}");
        let (kept, errors) = configure(&harness, "local", &[&arg]);
        assert_eq!(kept, "misconfigured=1 controller_uid=", "{arg}");
        assert_eq!(errors.lines().count(), 1, "{arg}: {errors}");
        assert!(
            errors.contains(&format!("plugstack.conf: {arg} must not contain")),
            "{errors}"
        );
    }
    assert_eq!(
        configure(&harness, "local", &["library=/opt/a\"b.so"]),
        ("misconfigured=0 controller_uid=".to_string(), String::new())
    );

    // build.sh compiles the path into a C string: a quote or backslash is refused too,
    // before the compiler sees it.
    for library in ["/opt/a b.so", "/opt/a:b.so", "/opt/a\"b.so", "/opt/a\\b.so"] {
        let out = run_with_timeout(
            Command::new("bash")
                .arg(crate::util::repository().join("scripts/slurm/build.sh"))
                .arg(dir.path().join("out"))
                .args(["--library", library]),
            Duration::from_secs(60),
        );
        let errors = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{library}: {errors}");
        assert_eq!(errors.lines().count(), 1, "{library}: {errors}");
        assert!(
            errors.contains(&format!("--library '{library}' must not contain")),
            "{errors}"
        );
    }
}
