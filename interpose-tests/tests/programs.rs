//! Real programs under the stage behave exactly as natively: same stdout, stderr and
//! exit code, same resulting files — and the stage really did manage their calls.
//!
//! Each case runs a shell script twice in fresh directories with the same contents:
//! once natively, once with the directory registered as the mountpoint (under a
//! generous limit, and for the core cases also under a tight metadata limit).

use crate::util::*;
use std::path::Path;
use std::process::Output;

/// (name, script). Scripts use relative paths only, and avoid output that legitimately
/// differs between runs (times, inode numbers). Each case is one test below, which
/// names the programs it needs.
const CASES: &[(&str, &str)] = &[
    (
        "bash pipelines and redirections",
        r#"set -e
printf 'b\na\nc\nb\n' > list.txt
sort list.txt | uniq -c > counted.txt
cat < counted.txt >> log.txt 2>&1
( cd sub && echo "in a subshell" > inside.txt )
cat <<END > heredoc.txt
line one
line two
END
while read -r n word; do echo "$word=$n"; done < counted.txt > pairs.txt
exec 3< pairs.txt; read -r first <&3; exec 3<&-; echo "first: $first"
[ -e missing.txt ] || echo "no missing.txt" 1>&2
wc -l heredoc.txt pairs.txt | tail -1
"#,
    ),
    (
        "coreutils",
        r#"set -e
mkdir -p a/b/c
for i in 1 2 3 4 5; do echo "file $i" > a/b/c/f$i.txt; done
cp -r a copy
mv copy/b copy/moved
ln -s ../a/b/c/f1.txt copy/link
chmod 600 a/b/c/f2.txt
touch -d 2020-01-01 a/b/c/f3.txt
cat a/b/c/f*.txt copy/link
ls -lR --time-style=+%Y a copy | sed 's/ [0-9]* [a-z]* [a-z]* / /'
find . -name 'f*' | sort
du -ab a | sort -k2
stat -c '%n %s %a %F' a/b/c/f2.txt copy/link
tar --mtime=@0 --sort=name -cf archive.tar a
mkdir extracted && tar xf archive.tar -C extracted
diff -r a extracted/a && echo same
rm -r copy
ls
"#,
    ),
    (
        "python3 file I/O",
        r#"python3 - <<'END'
import os, shutil
os.makedirs("py/x/y", exist_ok=True)
with open("py/data.bin", "wb") as f:
    f.write(bytes(range(256)) * 100)
with open("py/data.bin", "rb") as f:
    print(len(f.read()))
for i in range(20):
    with open(f"py/x/y/{i}.txt", "w") as f:
        f.write(str(i) * i)
print(sorted(os.listdir("py/x/y"))[:5])
print(sum(len(files) for _, _, files in os.walk("py")))
shutil.copytree("py", "py2")
os.rename("py2/data.bin", "py2/renamed.bin")
print(os.stat("py2/renamed.bin").st_size, os.path.exists("py2/data.bin"))
try:
    open("py/nope.txt")
except FileNotFoundError as e:
    print("error", e.errno)
END
"#,
    ),
    (
        "sqlite3",
        r#"sqlite3 db.sqlite 'create table t(id integer primary key, name text);'
for i in 1 2 3 4 5 6 7 8; do sqlite3 db.sqlite "insert into t(name) values ('row$i');"; done
sqlite3 db.sqlite 'select count(*), max(name) from t;'
sqlite3 db.sqlite 'pragma integrity_check;'
"#,
    ),
    (
        "rsync",
        r#"mkdir -p src/d && for i in 1 2 3; do echo $i > src/d/$i; done
rsync -a src/ dst/ && ls dst/d && cat dst/d/3
"#,
    ),
    (
        "fio with verification",
        r#"set -e
fio --name=verify --directory=. --size=2M --bs=4k --rw=randwrite --verify=crc32c \
    --ioengine=psync --numjobs=1 --minimal >/dev/null
echo fio-ok
rm -f verify.*
"#,
    ),
];

/// Fills a directory with the same starting contents for every run.
pub fn fixture(dir: &Path) {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("seed.txt"), "seed\n").unwrap();
}

/// The native run succeeded, and the staged one exited, printed and complained alike.
pub fn assert_same_outcome(name: &str, native: &Output, staged: &Output) {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    assert!(
        native.status.success(),
        "{name} failed natively: {}",
        text(&native.stderr)
    );
    assert_eq!(
        native.status.code(),
        staged.status.code(),
        "{name}: exit codes differ; stderr: {}",
        text(&staged.stderr)
    );
    assert_eq!(
        text(&native.stdout),
        text(&staged.stdout),
        "{name}: stdout differs"
    );
    assert_eq!(
        text(&native.stderr),
        text(&staged.stderr),
        "{name}: stderr differs"
    );
}

fn compare(name: &str, script: &str, rules: &str) {
    // Tests run in parallel, and a case runs under several limits: one directory each.
    let slug = format!(
        "{}-{}",
        name.replace(' ', "-"),
        rules.replace([',', '/', '='], "-")
    );
    let native = Scratch::new(&format!("native-{slug}"));
    let staged = Scratch::new(&format!("staged-{slug}"));
    fixture(native.path());
    fixture(staged.path());
    let stats = staged.path().with_extension("json");
    let _ = std::fs::remove_file(&stats);

    let a = run("bash", &["-c", script], native.path(), &[]);
    let b = run(
        "bash",
        &["-c", script],
        staged.path(),
        &stage_env(staged.path(), rules, Some(&stats)),
    );

    assert_same_outcome(name, &a, &b);
    assert_eq!(
        tree(native.path()),
        tree(staged.path()),
        "{name}: resulting files differ"
    );

    // Interception really happened.
    let reports = reports(&stats);
    let managed: u64 = ["open", "getattr", "read", "write"]
        .iter()
        .map(|o| op(&reports, o).managed)
        .sum();
    assert!(managed > 0, "{name}: the stage managed no call");
    let _ = std::fs::remove_file(&stats);
}

/// Runs case `name` natively and under a generous limit.
fn case(name: &str) {
    let (_, script) = CASES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no case '{name}'"));
    compare(name, script, "all=1M/s");
}

#[test]
#[cfg_attr(not(has_bash), ignore = "bash not installed")]
fn bash_pipelines_behave_as_natively() {
    let _turn = crate::util::together();
    case("bash pipelines and redirections");
}

#[test]
#[cfg_attr(not(all(has_bash, has_tar)), ignore = "tar or bash not installed")]
fn coreutils_behave_as_natively() {
    let _turn = crate::util::together();
    case("coreutils");
}

#[test]
#[cfg_attr(
    not(all(has_bash, has_python3)),
    ignore = "python3 or bash not installed"
)]
fn python3_behaves_as_natively() {
    let _turn = crate::util::together();
    case("python3 file I/O");
}

#[test]
#[cfg_attr(
    not(all(has_bash, has_sqlite3)),
    ignore = "sqlite3 or bash not installed"
)]
fn sqlite3_behaves_as_natively() {
    let _turn = crate::util::together();
    case("sqlite3");
}

#[test]
#[cfg_attr(not(all(has_bash, has_rsync)), ignore = "rsync or bash not installed")]
fn rsync_behaves_as_natively() {
    let _turn = crate::util::together();
    case("rsync");
}

#[test]
#[cfg_attr(not(all(has_bash, has_fio)), ignore = "fio or bash not installed")]
fn fio_verifies_its_data_under_the_stage() {
    let _turn = crate::util::together();
    case("fio with verification");
}

#[test]
#[cfg_attr(not(all(has_bash, has_tar)), ignore = "tar or bash not installed")]
fn core_cases_under_a_tight_metadata_limit() {
    let _turn = crate::util::together();
    for (name, script) in &CASES[..2] {
        compare(name, script, "metadata=20k/s,data=200MiB/s");
    }
}

/// stress-ng's bogo-ops per second (real time) of one stressor run, from its YAML report.
fn stress_ng_rate(dir: &Path, stressor: &str, env: &[(String, String)]) -> f64 {
    let yaml = dir.join(format!("{stressor}.yaml"));
    let out = run(
        "stress-ng",
        &[
            "--temp-path",
            ".",
            &format!("--{stressor}"),
            "1",
            "--timeout",
            "2s",
            "--metrics",
            "--yaml",
            yaml.to_str().unwrap(),
        ],
        dir,
        env,
    );
    assert!(
        out.status.success(),
        "stress-ng --{stressor}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(&yaml).expect("stress-ng YAML report");
    let _ = std::fs::remove_file(yaml);
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix("bogo-ops-per-second-real-time:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no rate in the report:\n{report}"))
}

#[test]
#[cfg_attr(not(has_stress_ng), ignore = "stress-ng not installed")]
fn stress_ng_file_stressors_succeed_and_are_throttled() {
    let _turn = crate::util::together();
    // Correctness: the file stressors verify their data and exit 0 under the stage.
    // (Their workers leave with _exit, which writes no statistics, so what the stage
    // managed is shown by throttling below rather than by counters.)
    let dir = Scratch::new("stress-ng");
    let args = [
        "--temp-path",
        ".",
        "--hdd",
        "1",
        "--hdd-bytes",
        "1M",
        "--dir",
        "1",
        "--rename",
        "1",
        "--open",
        "1",
        "--timeout",
        "2s",
        "--verify",
        "--quiet",
    ];
    let out = run(
        "stress-ng",
        &args,
        dir.path(),
        &stage_env(dir.path(), "all=1M/s", None),
    );
    assert!(
        out.status.success(),
        "stress-ng: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Throttling: every rename bogo-op is several metadata calls, so under 300 ops/s
    // the stressor cannot exceed 300 bogo-ops/s, whatever the machine does natively.
    let native = stress_ng_rate(dir.path(), "rename", &[]);
    let limited = stress_ng_rate(
        dir.path(),
        "rename",
        &stage_env(dir.path(), "metadata=300/s", None),
    );
    assert!(
        limited > 0.0,
        "the rename stressor made no progress under the stage"
    );
    assert!(
        limited <= 315.0,
        "rename ran at {limited:.0} bogo-ops/s under metadata=300/s"
    );
    assert!(
        limited < native / 2.0,
        "not throttled: {limited:.0}/s under the limit, {native:.0}/s natively"
    );
}

#[test]
#[cfg_attr(not(has_dbench), ignore = "dbench not installed")]
fn dbench_succeeds() {
    let _turn = crate::util::together();
    let dir = Scratch::new("dbench");
    let out = run(
        "dbench",
        &["-t", "3", "-D", ".", "2"],
        dir.path(),
        &stage_env(dir.path(), "all=1M/s", None),
    );
    assert!(
        out.status.success(),
        "dbench: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `script` with `others` preloaded, and again with the stage inserted into that
/// preload list at `position`, and expects the same output; the scratch directory is
/// the mountpoint.
fn same_with_preload(
    name: &str,
    script: &str,
    others: &[&str],
    position: usize,
    extra_env: &[(String, String)],
) {
    let (native_dir, dir) = (Scratch::new(&format!("native-{name}")), Scratch::new(name));
    fixture(native_dir.path());
    fixture(dir.path());
    let mut native_env = extra_env.to_vec();
    if !others.is_empty() {
        native_env.push(("LD_PRELOAD".into(), others.join(":")));
    }
    let native = run("bash", &["-c", script], native_dir.path(), &native_env);
    let stage = library().display().to_string();
    let mut preload: Vec<&str> = others.to_vec();
    preload.insert(position, &stage);
    let mut env = stage_env(dir.path(), "metadata=50k/s", None);
    env[0].1 = preload.join(":");
    env.extend_from_slice(extra_env);
    let staged = run("bash", &["-c", script], dir.path(), &env);
    assert_same_outcome(name, &native, &staged);
}

#[test]
#[cfg_attr(
    not(all(has_libjemalloc, has_bash, has_python3)),
    ignore = "libjemalloc2, python3 or bash not installed"
)]
fn jemalloc_mapping_memory_before_the_stage_is_loaded() {
    let _turn = crate::util::together();
    // jemalloc maps its arenas with mmap while initialising, before and during our
    // constructor: a stage resolving the real mmap lazily (dlsym allocates) deadlocks.
    let jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    assert!(Path::new(jemalloc).is_file(), "{jemalloc} not installed");
    let script = "ls -lR --time-style=+%Y . | sed 's/ [0-9]* [a-z]* [a-z]* / /'; python3 -c 'print(sum(range(10**5)))'";
    same_with_preload("jemalloc-first", script, &[jemalloc], 1, &[]);
    same_with_preload("jemalloc-last", script, &[jemalloc], 0, &[]);
}

#[test]
#[cfg_attr(not(all(has_bash, has_rustc)), ignore = "rustc or bash not installed")]
fn rustc_resolving_its_own_path_at_start_up() {
    let _turn = crate::util::together();
    // rustc resolves its own path with readlink at start-up (a naive Rust readlink hook
    // hung it).
    same_with_preload("rustc", "rustc --version && cargo --version", &[], 0, &[]);
}

#[test]
#[cfg_attr(not(all(has_bash, has_cc)), ignore = "cc or bash not installed")]
fn calls_made_before_the_stage_is_initialised_pass_through() {
    let _turn = crate::util::together();
    // A preloaded library whose constructor touches files in the mountpoint: depending
    // on the order, it runs before or after the stage's constructor. Both must work.
    let build = Scratch::new("early-lib");
    let source = build.join("early.c");
    std::fs::write(
        &source,
        r#"#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
__attribute__((constructor)) static void early(void) {
    const char *path = getenv("EARLY_PATH");
    struct stat st;
    if (!path) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0 || write(fd, "x", 1) != 1 || close(fd) != 0 || stat(path, &st) != 0) abort();
}
"#,
    )
    .unwrap();
    let early = build.join("libearly.so");
    let cc = run(
        "cc",
        &[
            "-shared",
            "-fPIC",
            "-o",
            early.to_str().unwrap(),
            source.to_str().unwrap(),
        ],
        build.path(),
        &[],
    );
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let early = early.display().to_string();
    let marker = [("EARLY_PATH".to_string(), "marker.txt".to_string())];
    for (name, position) in [("early-first", 1), ("early-last", 0)] {
        same_with_preload(
            name,
            "cat seed.txt marker.txt; echo; ls",
            &[&early],
            position,
            &marker,
        );
    }
}
