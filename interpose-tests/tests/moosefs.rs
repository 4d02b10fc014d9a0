//! On a real shared file system, MooseFS (`scripts/moosefs.sh`): real programs behave
//! under the stage exactly as without it, and a job-wide limit binds the job's
//! processes together. Each test starts a MooseFS of its own, registered whole as the
//! stage's mountpoint, and runs every command in its mount namespace.

use crate::jobwide::{assert_job_accurate, finish, job, job_env, segment, spawn_load};
use crate::programs::{assert_same_outcome, fixture};
use crate::util::moosefs::MooseFs;
use crate::util::*;
use std::path::Path;

/// (name, script): programs a shared file system's users run, on a tree the script
/// builds itself. Only relative paths, and no output that differs between runs.
const CASES: &[(&str, &str)] = &[
    (
        "tar",
        r#"set -e
mkdir -p src/a/b src/c
for i in $(seq 60); do printf 'file %s\n%0*d\n' $i $((i * 37)) 0 > src/a/b/f$i; done
for i in $(seq 20); do head -c $((i * 1000)) /dev/zero | tr '\0' "$((i % 10))" > src/c/z$i; done
ln -s a/b/f1 src/link
# MooseFS clients cache attributes for a second: a directory written just before may
# show tar a new ctime while it reads it ("file changed as we read it").
sleep 1.1
tar --mtime=@0 --sort=name --owner=0 --group=0 -cf src.tar src
mkdir out && tar -xf src.tar -C out
diff -r src out/src && echo same
tar -tvf src.tar | awk '{print $1, $3, $6}' | head -5
"#,
    ),
    (
        "cp and rsync",
        r#"set -e
mkdir -p src/x/y
for i in $(seq 80); do echo "line $i" > src/x/y/$i.txt; done
ln -s x/y/1.txt src/first
cp -r src copy
rsync -a src/ mirror/
echo changed > src/x/y/5.txt && rm src/x/y/6.txt
rsync -a --delete --checksum src/ mirror/
diff -r src mirror && ls mirror/x/y | wc -l && cat mirror/x/y/5.txt
diff -r src/x copy/x | sort
"#,
    ),
    (
        "sqlite3 in WAL mode",
        r#"set -e
sqlite3 db.sqlite 'pragma journal_mode=wal; create table t(id integer primary key, name text);'
for i in $(seq 30); do sqlite3 db.sqlite "insert into t(name) values ('row$i');"; done
sqlite3 db.sqlite 'begin; update t set name = upper(name) where id % 3 = 0; commit;'
sqlite3 db.sqlite 'select count(*), max(name), sum(id) from t; pragma integrity_check; pragma journal_mode;'
"#,
    ),
    (
        "git",
        r#"set -e
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.org GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.org
export GIT_AUTHOR_DATE="2000-01-01T00:00:00Z" GIT_COMMITTER_DATE="2000-01-01T00:00:00Z" GIT_CONFIG_NOSYSTEM=1 HOME=$PWD
git init -q -b main repo && cd repo
for i in $(seq 40); do echo "content $i" > f$i.txt; done
mkdir d && echo nested > d/n.txt
git add . && git commit -q -m first
git mv f1.txt d/moved.txt && git rm -q f2.txt && git commit -q -m second
git fsck --strict --no-progress && git log --format='%H %s' && git status --short
# The index records inode numbers and times, which differ between any two runs.
rm .git/index
"#,
    ),
    (
        "fio file engines",
        r#"set -e
fio_files() {
  fio --name=files --ioengine=$1 --directory=fio --filename_format='f.$jobnum.$filenum' \
    --nrfiles=150 --filesize=4k --bs=4k --openfiles=1 $2 --minimal >/dev/null
  echo "$1: $(ls fio | wc -l) files"
}
mkdir fio
fio_files filecreate --create_on_open=1
fio_files filestat
fio_files filedelete
"#,
    ),
];

/// Each case natively and under a metadata limit, in two directories of the mount:
/// same exit code, output and resulting tree, and the stage managed the calls.
#[test]
#[cfg_attr(
    not(all(
        has_moosefs,
        has_bash,
        has_tar,
        has_rsync,
        has_sqlite3,
        has_git,
        has_fio
    )),
    ignore = "needs MooseFS (root, /dev/fuse), bash, tar, rsync, sqlite3, git and fio"
)]
fn real_programs_on_moosefs_behave_as_natively_under_the_stage() {
    let _turn = together();
    let mfs = MooseFs::start();
    let stats = Scratch::new("moosefs-programs");
    for (name, script) in CASES {
        let slug = name.replace(' ', "-");
        let (native, staged) = (
            mfs.mount().join(format!("native-{slug}")),
            mfs.mount().join(format!("staged-{slug}")),
        );
        fixture(&mfs.outside(&native));
        fixture(&mfs.outside(&staged));
        let stats = stats.join(&format!("{slug}.json"));
        let run_in = |dir: &Path, env: &[(String, String)]| {
            mfs.command_in(dir, "bash")
                .args(["-c", script])
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .output()
                .unwrap_or_else(|e| panic!("{name}: cannot run bash: {e}"))
        };
        let a = run_in(&native, &[]);
        let b = run_in(
            &staged,
            &stage_env(mfs.mount(), "metadata=5k/s,data=200MiB/s", Some(&stats)),
        );
        assert_same_outcome(name, &a, &b);
        let files = tree(&mfs.outside(&native));
        assert!(
            files.len() > 1,
            "{name}: no files seen on the mount: {files:?}"
        );
        assert_eq!(
            files,
            tree(&mfs.outside(&staged)),
            "{name}: resulting files differ"
        );
        let reports = reports(&stats);
        let managed: u64 = ["open", "getattr", "mkdir", "unlink"]
            .iter()
            .map(|o| op(&reports, o).managed)
            .sum();
        assert!(managed > 0, "{name}: the stage managed no call on MooseFS");
    }
}

/// Four processes of one job under one limit: together they stay within it, and so
/// do the operations that reach the MooseFS master.
#[test]
#[cfg_attr(not(has_moosefs), ignore = "needs MooseFS (root, /dev/fuse)")]
fn a_job_limit_binds_its_processes_together_on_moosefs() {
    let _turn = alone();
    let mfs = MooseFs::start();
    let dir = mfs.mount().join("job");
    std::fs::create_dir(mfs.outside(&dir)).expect("a directory on the mount");
    let setup = mfs
        .command_in(&dir, probe())
        .args(["setup", dir.to_str().unwrap()])
        .output()
        .expect("padll-probe setup");
    assert!(setup.status.success(), "padll-probe setup: {setup:?}");

    const LIMIT: f64 = 1000.0;
    let job = job("moosefs");
    let env = job_env(mfs.mount(), &format!("metadata={LIMIT}/s"), &job);
    let before = mfs.master_ops();
    let children = (0..4)
        .map(|_| spawn_load(mfs.command_in(&dir, probe()), &dir, 3.0, 1, "mixed", &env))
        .collect();
    let group = finish(children);
    let reached = mfs.master_ops().since(&before);
    assert!(group.stderr.is_empty(), "{}", group.stderr);
    assert_job_accurate("4 processes of one job on MooseFS", group.rate(), LIMIT);
    assert!(
        !segment(&job).exists(),
        "the last process leaves no segment behind"
    );
    // stat, open and close: a lookup, a lookup and an open, nothing (docs/tests.md).
    let master = reached["lookup"] + reached["open"];
    eprintln!(
        "stage: {:.0} ops in {:.2} s; master: {reached:?}",
        group.ops, group.seconds
    );
    assert!(
        master as f64 >= group.ops * 0.5,
        "the master saw {master} lookups and opens for {:.0} calls",
        group.ops
    );
    assert!(
        master as f64 <= LIMIT * group.seconds * 1.02 + 100.0,
        "the master saw {master} lookups and opens in {:.2} s under a {LIMIT}/s limit",
        group.seconds
    );
}
