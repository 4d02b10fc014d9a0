//! Walks that change directory inside glibc (`nftw` with `FTW_CHDIR`, `fts` without
//! `FTS_NOCHDIR`): the relative names they hand the program are managed exactly when
//! the files they name are under the mountpoint, wherever the program started
//! (`padll-stage/src/walks.rs`).

use crate::util::{compile_c, op, reports, run, stage_env, together, Scratch};
use std::path::Path;

const PROGRAM: &str = include_str!("walks.c");

/// What `walks.c` prints when every one of its stats succeeds: 3 files in the tree,
/// each stat'ed in four walks, 2 in the other tree, the marker after each walk.
const ALL_FOUND: &str = "nftw=0:3 fts=3:1:0 fts64=3:0 nested=0:3:2 markers=4\n";

/// Three files in `tree`, two in `other`, a `marker` in `start`.
fn files(tree: &Path, other: &Path, start: &Path) {
    for dir in [tree.join("a/b"), other.join("c"), start.to_path_buf()] {
        std::fs::create_dir_all(dir).unwrap();
    }
    for file in [
        tree.join("f1"),
        tree.join("a/f2"),
        tree.join("a/b/f3"),
        other.join("g1"),
        other.join("c/g2"),
        start.join("marker"),
    ] {
        std::fs::write(file, b"x").unwrap();
    }
}

/// Runs the program natively and under the stage, managing `mount`, in `start`; the
/// managed and passthrough `getattr`s it made under the stage.
fn walk(program: &Path, mount: &Path, tree: &Path, other: &Path, start: &Path) -> (u64, u64) {
    let stats = mount.with_extension("json");
    let _ = std::fs::remove_file(&stats);
    let args = [tree.to_str().unwrap(), other.to_str().unwrap()];
    let program = program.to_str().unwrap();
    let native = run(program, &args, start, &[]);
    let staged = run(program, &args, start, &stage_env(mount, "", Some(&stats)));
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    assert!(native.status.success(), "natively: {native:?}");
    assert_eq!(text(&native.stdout), ALL_FOUND);
    assert!(staged.status.success(), "under the stage: {staged:?}");
    assert_eq!(text(&staged.stdout), ALL_FOUND);
    assert!(staged.stderr.is_empty(), "{}", text(&staged.stderr));
    let getattr = op(&reports(&stats), "getattr");
    let _ = std::fs::remove_file(stats);
    (getattr.managed, getattr.passthrough)
}

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn relative_names_from_walks_that_change_directory_are_resolved_where_they_lie() {
    let _turn = together();
    let mount = Scratch::new("walks-mount");
    let elsewhere = Scratch::new("walks-elsewhere");
    let build = Scratch::new("walks-build");
    let program = compile_c(PROGRAM, build.path(), "walks");

    // The tree under the mountpoint, started from an unrelated directory: the 12 stats
    // of its files are managed; the nested walk's 2 and the 4 markers are not.
    let (tree, other, start) = (
        mount.join("tree"),
        elsewhere.join("other"),
        elsewhere.join("start"),
    );
    files(&tree, &other, &start);
    assert_eq!(walk(&program, mount.path(), &tree, &other, &start), (12, 6));

    // The other way round: a tree elsewhere, started from inside the mountpoint.
    let (tree, other, start) = (
        elsewhere.join("tree2"),
        mount.join("other2"),
        mount.join("start2"),
    );
    files(&tree, &other, &start);
    assert_eq!(walk(&program, mount.path(), &tree, &other, &start), (6, 12));
}
