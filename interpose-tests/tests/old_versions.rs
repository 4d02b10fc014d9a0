//! Programs linked against an older glibc bind to the first versions of a few
//! functions, which glibc keeps with their old behaviour: under the stage they must
//! reach those, not the new ones (`padll-stage/src/hooks.rs`, "Versioned entry
//! points"). x86-64 only, as the versions named are.

use crate::util::{compile_c, op, reports, run, stage_env, together, Scratch};

const PROGRAM: &str = include_str!("old_versions.c");

#[test]
#[cfg_attr(not(has_cc), ignore = "cc not installed")]
fn a_program_bound_to_old_versions_gets_them() {
    let _turn = together();
    let mount = Scratch::new("old-versions");
    std::fs::write(mount.join("file"), b"contents\n").unwrap();
    let build = Scratch::new("old-versions-build");
    let program = compile_c(PROGRAM, build.path(), "old_versions");

    let stats = mount.path().with_extension("json");
    let _ = std::fs::remove_file(&stats);
    let args = [mount.path().to_str().unwrap()];
    let native = run(program.to_str().unwrap(), &args, mount.path(), &[]);
    let staged = run(
        program.to_str().unwrap(),
        &args,
        mount.path(),
        &stage_env(mount.path(), "all=1M/s", Some(&stats)),
    );
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    assert!(native.status.success(), "natively: {native:?}");
    assert_eq!(
        text(&native.stdout),
        "glob=0 matches=1\nrealpath=null errno=22\n"
    );
    assert!(staged.status.success(), "under the stage: {staged:?}");
    assert_eq!(text(&staged.stdout), text(&native.stdout));
    // Both still managed: the glob as a listing; the realpath as a lookup, beside the
    // `stat` the old glob made through `gl_stat`.
    let reports = reports(&stats);
    assert_eq!(op(&reports, "readdir").managed, 1);
    assert_eq!(op(&reports, "getattr").managed, 2);
    let _ = std::fs::remove_file(stats);
}
