//! The SPANK plugin's directory for a job user's files (`make_directory` in
//! `scripts/slurm/padll_spank.c`, which makes `/dev/shm/padll/<uid>` as root), driven
//! alone over what another local user planted under the name first: a C harness
//! includes the plugin's source with Slurm's functions stubbed, and makes `<dir>/<uid>`
//! in a directory of the test's.

use crate::util::run_with_timeout;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The job's user (any number: root may give files to a uid no account has).
const OWNER: u32 = 4242;
/// The other user, who planted something under the job user's name first.
const SQUATTER: u32 = 65534;

/// The plugin's source with Slurm's functions stubbed (`slurm_error` prints its line on
/// stderr, the others fail); a harness adds its `main`.
pub const STUBBED_PLUGIN: &str = r#"
#include "padll_spank.c"
#include <stdarg.h>

void slurm_error(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
}
const char *spank_strerror(spank_err_t err) { (void)err; return "stub"; }
spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{ (void)sp; (void)opt; return ESPANK_ERROR; }
spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{ (void)sp; (void)item; return ESPANK_ERROR; }
spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{ (void)sp; (void)var; (void)buf; (void)len; return ESPANK_ERROR; }
spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{ (void)sp; (void)var; (void)val; (void)overwrite; return ESPANK_ERROR; }
int spank_remote(spank_t sp) { (void)sp; return -1; }
"#;

/// A `main` that makes `argv[2]` under the directory `argv[1]` for the uid `argv[3]`
/// (its group the same number), mode 0700.
const MAIN: &str = r#"
int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    int parent = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    uid_t owner = (uid_t)strtoul(argv[3], NULL, 10);
    int made = parent < 0 ? -1 : make_directory(parent, argv[2], owner, (gid_t)owner, 0700);
    if (made < 0) {
        perror("make_directory");
        return 1;
    }
    return 0;
}
"#;

/// Builds the stubbed plugin with `main` in `dir`; returns the executable.
pub fn build_harness(dir: &Path, main: &str) -> PathBuf {
    let source = dir.join("harness.c");
    std::fs::write(&source, format!("{STUBBED_PLUGIN}{main}")).expect("harness source");
    let exe = dir.join("harness");
    let plugin_dir = crate::util::repository().join("scripts/slurm");
    let out = run_with_timeout(
        Command::new("cc")
            .args(["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror"])
            .arg("-DPADLL_DEFAULT_LIBRARY=\"/unused\"")
            .arg("-I")
            .arg(&plugin_dir)
            .arg("-o")
            .arg(&exe)
            .arg(&source),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs the harness: makes `parent/name` for [`OWNER`].
fn make_directory(harness: &Path, parent: &Path, name: &str) {
    let out = run_with_timeout(
        Command::new(harness)
            .arg(parent)
            .arg(name)
            .arg(OWNER.to_string()),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "make_directory {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `path` is a real directory (not a link) of [`OWNER`], mode 0700.
fn assert_owners_directory(path: &Path) {
    let meta = std::fs::symlink_metadata(path).expect("the made directory");
    assert!(meta.is_dir(), "{} is not a directory", path.display());
    assert_eq!(
        (meta.uid(), meta.gid()),
        (OWNER, OWNER),
        "{}",
        path.display()
    );
    assert_eq!(meta.mode() & 0o7777, 0o700, "{}", path.display());
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).expect("chown");
}

#[test]
#[cfg_attr(
    not(all(has_root, has_spank_h, has_cc)),
    ignore = "needs root, libslurm-dev (slurm/spank.h) and cc"
)]
fn the_plugin_moves_another_users_directory_aside_whole_and_follows_no_link() {
    let dir = tempfile::tempdir().expect("temp dir");
    let harness = build_harness(dir.path(), MAIN);
    let parent = dir.path().join("padll");
    std::fs::create_dir(&parent).expect("parent");
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o711)).expect("mode");

    // Another user's directory under the name, with a file of theirs in it: moved aside
    // whole to `<name>.squatted-by-<uid>-<inode>-<16 hex digits>`, nothing in it touched.
    let name = OWNER.to_string();
    let squat = parent.join(&name);
    std::fs::create_dir(&squat).expect("squat dir");
    std::fs::write(squat.join("theirs"), "planted").expect("squat file");
    chown(&squat.join("theirs"), SQUATTER);
    chown(&squat, SQUATTER);
    let squat_inode = std::fs::metadata(&squat).expect("squat").ino();
    make_directory(&harness, &parent, &name);
    assert_owners_directory(&squat);
    assert_eq!(
        std::fs::read_dir(&squat).expect("made").count(),
        0,
        "the made directory is new and empty"
    );
    let prefix = format!("{name}.squatted-by-{SQUATTER}-{squat_inode}-");
    let aside: Vec<PathBuf> = std::fs::read_dir(&parent)
        .expect("parent")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| {
            let file = path.file_name().unwrap().to_string_lossy();
            file.strip_prefix(&prefix).is_some_and(|random| {
                random.len() == 16 && random.bytes().all(|b| b.is_ascii_hexdigit())
            })
        })
        .collect();
    assert_eq!(
        aside.len(),
        1,
        "no `{prefix}<16 hex>` in {}",
        parent.display()
    );
    let moved = std::fs::metadata(&aside[0]).expect("moved");
    assert_eq!((moved.ino(), moved.uid()), (squat_inode, SQUATTER));
    let theirs = std::fs::metadata(aside[0].join("theirs")).expect("their file");
    assert_eq!(theirs.uid(), SQUATTER, "root walked into the squat");

    // A link under the name to a directory of root's: the link goes, its target stays
    // as it was (owner and mode).
    let victim = dir.path().join("victim");
    std::fs::create_dir(&victim).expect("victim");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).expect("mode");
    let linked = format!("{OWNER}-link");
    std::os::unix::fs::symlink(&victim, parent.join(&linked)).expect("symlink");
    chown(&parent.join(&linked), SQUATTER);
    make_directory(&harness, &parent, &linked);
    assert_owners_directory(&parent.join(&linked));
    let victim_meta = std::fs::metadata(&victim).expect("victim");
    assert_eq!(
        (victim_meta.uid(), victim_meta.mode() & 0o7777),
        (0, 0o755),
        "the link was followed"
    );

    // The owner's own directory, or root's, is kept (the same inode) and given the
    // owner and mode 0700.
    for (kept, uid) in [
        (format!("{OWNER}-own"), OWNER),
        (format!("{OWNER}-root"), 0),
    ] {
        let path = parent.join(&kept);
        std::fs::create_dir(&path).expect("kept dir");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("mode");
        chown(&path, uid);
        let inode = std::fs::metadata(&path).expect("kept").ino();
        make_directory(&harness, &parent, &kept);
        assert_owners_directory(&path);
        assert_eq!(
            std::fs::metadata(&path).expect("kept").ino(),
            inode,
            "{kept}"
        );
    }
}
