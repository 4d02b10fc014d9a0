//! Coverage of the interception table: every file-touching libc function that real
//! binaries import (coreutils, bash, python3, tar, rsync, fio, stress-ng, dbench,
//! sqlite3) is exported by `libpadll.so`, unless it is listed below with the reason it
//! needs no hook.

use crate::util::library;
use std::collections::BTreeSet;
use std::process::Command;

/// Name prefixes of the libc functions that can touch a file or a directory.
const FILE_API_PREFIXES: &[&str] = &[
    "open",
    "__open",
    "creat",
    "close",
    "dup",
    "fcntl",
    "read",
    "__read",
    "write",
    "pread",
    "__pread",
    "pwrite",
    "preadv",
    "pwritev",
    "copy_file_range",
    "sendfile",
    "splice",
    "aio_",
    "lio_",
    "fsync",
    "fdatasync",
    "sync",
    "truncate",
    "ftruncate",
    "fallocate",
    "posix_fallocate",
    "fopen",
    "freopen",
    "fclose",
    "fread",
    "__fread",
    "fwrite",
    "fgets",
    "__fgets",
    "fputs",
    "fgetc",
    "fputc",
    "getc",
    "putc",
    "_IO_getc",
    "_IO_putc",
    "getline",
    "getdelim",
    "__getdelim",
    "fflush",
    "mmap",
    "stat",
    "lstat",
    "fstat",
    "statx",
    "__xstat",
    "__lxstat",
    "__fxstat",
    "access",
    "faccessat",
    "euidaccess",
    "eaccess",
    "mkdir",
    "rmdir",
    "unlink",
    "rename",
    "link",
    "symlink",
    "readlink",
    "chmod",
    "fchmod",
    "chown",
    "lchown",
    "fchown",
    "utime",
    "futime",
    "lutime",
    "mknod",
    "__xmknod",
    "mkfifo",
    "statfs",
    "fstatfs",
    "statvfs",
    "fstatvfs",
    "opendir",
    "fdopendir",
    "readdir",
    "closedir",
    "scandir",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "chdir",
    "fchdir",
    "mkstemp",
    "mkostemp",
    "mkdtemp",
    "remove",
    "realpath",
    "__realpath",
    "canonicalize_file_name",
    "glob",
    "flock",
    "lockf",
    "name_to_handle_at",
    "readahead",
];

/// Matches of the prefixes above that need no hook, and why.
const NOT_HOOKED: &[(&str, &str)] = &[
    (
        "aio_error",
        "status query of a submitted request: no file-system request",
    ),
    ("aio_error64", "status query of a submitted request"),
    ("aio_return", "status query of a submitted request"),
    ("aio_return64", "status query of a submitted request"),
    ("aio_suspend", "waits for submitted requests"),
    ("aio_suspend64", "waits for submitted requests"),
    ("aio_cancel", "cancels submitted requests"),
    ("aio_cancel64", "cancels submitted requests"),
    ("globfree", "frees memory"),
    ("globfree64", "frees memory"),
    ("openlog", "syslog socket, not a file"),
    ("openpty", "terminal, not a file"),
    ("opendir_r", "not a glibc function"),
    ("closelog", "syslog socket, not a file"),
    ("readline", "terminal input (libreadline)"),
    (
        "read_history",
        "libreadline; its file I/O goes through hooked open/read",
    ),
    (
        "write_history",
        "libreadline; its file I/O goes through hooked open/write",
    ),
    ("getcon", "SELinux context"),
    ("getcontext", "CPU context"),
    ("getcpu", "CPU number"),
    (
        "getcwd",
        "answered by the kernel from the process' cwd, no file-system request",
    ),
    ("open_memstream", "memory stream, no file"),
    (
        "putchar",
        "formatted/stdout output family (printf, puts, putchar) is not intercepted: see docs/stage.md",
    ),
    ("__freading", "queries a stream's state in memory"),
    ("flockfile", "stdio's in-process stream lock"),
    (
        "fdopen",
        "creates no descriptor and touches no file; the stream is followed through its fd",
    ),
];

fn dynamic_symbols(path: &str, undefined: bool) -> Option<BTreeSet<String>> {
    let flag = if undefined {
        "--undefined-only"
    } else {
        "--defined-only"
    };
    let out = Command::new("nm").args(["-D", flag, path]).output().ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.split_whitespace().last())
            .map(|name| name.split('@').next().unwrap_or(name).to_string())
            .collect()
    })
}

fn which(program: &str) -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && path.starts_with('/')).then_some(path)
}

/// The stage's exported symbols.
fn exported() -> BTreeSet<String> {
    let library = library();
    dynamic_symbols(library.to_str().unwrap(), false)
        .unwrap_or_else(|| panic!("nm -D {} failed (binutils installed?)", library.display()))
}

/// Under CI every program must be there to be checked.
fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

#[test]
#[cfg_attr(not(has_nm), ignore = "nm (binutils) not installed")]
fn real_binaries_file_imports_are_all_hooked() {
    let library = library();
    let hooked = exported();
    assert!(
        hooked.contains("open") && hooked.contains("__xstat"),
        "{} exports no hooks",
        library.display()
    );
    let excluded: BTreeSet<&str> = NOT_HOOKED.iter().map(|(name, _)| *name).collect();
    let mut missing = BTreeSet::new();
    let mut checked = 0;
    let mut not_installed = Vec::new();
    for program in [
        "ls",
        "cp",
        "mv",
        "rm",
        "mkdir",
        "find",
        "du",
        "stat",
        "tar",
        "cat",
        "ln",
        "chmod",
        "touch",
        "bash",
        "python3",
        "rsync",
        "fio",
        "stress-ng",
        "dbench",
        "sqlite3",
    ] {
        let Some(path) = which(program) else {
            not_installed.push(program);
            continue;
        };
        let Some(imports) = dynamic_symbols(&path, true) else {
            continue;
        };
        checked += 1;
        for name in imports {
            let file_api = FILE_API_PREFIXES.iter().any(|p| name.starts_with(p));
            if file_api && !hooked.contains(&name) && !excluded.contains(name.as_str()) {
                missing.insert(format!("{name} (imported by {program})"));
            }
        }
    }
    assert!(checked > 0, "no binary could be inspected");
    assert!(
        !ci() || not_installed.is_empty(),
        "CI is set but these programs are not installed, so not checked: {not_installed:?}"
    );
    assert!(
        missing.is_empty(),
        "file API imported but not intercepted: {missing:#?}"
    );
}

#[test]
#[cfg_attr(not(has_nm), ignore = "nm (binutils) not installed")]
fn the_issue_list_is_exported() {
    let hooked = exported();
    let required = "open open64 openat openat64 creat creat64 __open_2 __open64_2 __openat_2 __openat64_2 \
        mkstemp mkostemp mkstemps mkostemps mkstemp64 mkostemp64 mkstemps64 mkostemps64 close close_range dup dup2 dup3 \
        fcntl fcntl64 read write pread pwrite pread64 pwrite64 readv writev preadv pwritev preadv2 pwritev2 preadv64 \
        pwritev64 preadv64v2 pwritev64v2 __read_chk __pread_chk __pread64_chk copy_file_range sendfile sendfile64 splice \
        aio_read aio_write lio_listio aio_read64 aio_write64 lio_listio64 fsync fdatasync sync syncfs truncate ftruncate \
        fallocate posix_fallocate truncate64 ftruncate64 fallocate64 posix_fallocate64 fopen fopen64 freopen freopen64 \
        fclose fread fwrite fgets fputs fgetc fputc fflush __fread_chk __fgets_chk fread_unlocked fwrite_unlocked \
        fgets_unlocked fputs_unlocked fgetc_unlocked fputc_unlocked mmap mmap64 stat lstat fstat fstatat stat64 lstat64 \
        fstat64 fstatat64 statx __xstat __lxstat __fxstat __fxstatat __xstat64 __lxstat64 __fxstat64 __fxstatat64 access \
        faccessat euidaccess mkdir mkdirat rmdir unlink unlinkat rename renameat renameat2 link linkat symlink symlinkat \
        readlink readlinkat chmod fchmod fchmodat chown lchown fchown fchownat utime utimes utimensat futimens mknod \
        mknodat __xmknod __xmknodat statfs fstatfs statvfs fstatvfs statfs64 fstatfs64 statvfs64 fstatvfs64 opendir \
        fdopendir readdir readdir64 closedir scandir scandir64 getxattr lgetxattr fgetxattr setxattr lsetxattr fsetxattr \
        listxattr llistxattr flistxattr removexattr lremovexattr fremovexattr chdir fchdir";
    let missing: Vec<&str> = required
        .split_whitespace()
        .filter(|name| !hooked.contains(*name))
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}
