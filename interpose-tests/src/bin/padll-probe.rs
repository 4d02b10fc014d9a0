//! `padll-probe SCENARIO DIR [ARGS]`: makes exactly the libc calls a scenario names, so
//! the interposition tests know what the stage must have seen. Prints one line of
//! `key=value` pairs; exits 1 with a message if a call does not behave as it natively
//! would.

use std::ffi::CString;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::time::Instant;

fn c(path: &str) -> CString {
    CString::new(path).expect("path without NUL")
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(ok: bool, what: &str) {
    if !ok {
        eprintln!("padll-probe: {what} (errno {})", errno());
        std::process::exit(1);
    }
}

fn stat(path: &CString) -> i32 {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `path` is a NUL-terminated CString borrowed for the call; `st` is a valid out-
    // pointer of `struct stat`'s size.
    unsafe { libc::stat(path.as_ptr(), st.as_mut_ptr()) }
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the node.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live local `timespec`: a valid out-pointer of the size clock_gettime
    // writes.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Runs `op` until `seconds` pass; returns (operations, elapsed seconds).
fn timed(seconds: f64, ops_per_call: u64, mut op: impl FnMut()) -> (u64, f64) {
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed().as_secs_f64() < seconds {
        op();
        n += ops_per_call;
    }
    (n, start.elapsed().as_secs_f64())
}

/// A listening Unix socket (abstract name `padll-probe-<pid>-<n>`) with one client
/// connected to it, waiting to be accepted: (listener, client).
///
/// # Safety
/// Plain socket calls on descriptors made here.
unsafe fn listener_with_client(n: usize) -> (libc::c_int, libc::c_int) {
    // SAFETY: socket calls on descriptors made here, with an address of the stated size.
    unsafe {
        let mut address: libc::sockaddr_un = std::mem::zeroed();
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let name = format!("padll-probe-{}-{n}", std::process::id());
        // Abstract: a NUL first, nothing in the file system.
        for (slot, byte) in address.sun_path[1..].iter_mut().zip(name.bytes()) {
            *slot = byte as libc::c_char;
        }
        let length = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
        let address = (&address as *const libc::sockaddr_un).cast::<libc::sockaddr>();
        let listener = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        check(listener >= 0, "socket (listener)");
        check(libc::bind(listener, address, length) == 0, "bind");
        check(libc::listen(listener, 1) == 0, "listen");
        let client = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        check(client >= 0, "socket (client)");
        check(libc::connect(client, address, length) == 0, "connect");
        (listener, client)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: padll-probe SCENARIO DIR [ARGS]");
        std::process::exit(2);
    }
    let dir = args[2].clone();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_string());
    let file = c(&format!("{dir}/file"));
    // SAFETY: (this whole function) plain libc calls on valid, NUL-terminated paths,
    // buffers of the stated sizes and descriptors we own.
    unsafe {
        match args[1].as_str() {
            "setup" => {
                std::fs::write(format!("{dir}/file"), vec![b'x'; 4 << 20]).expect("setup");
                println!("ok=1");
            }
            "stat-loop" => {
                let (n, t) = timed(arg(3, "2").parse().unwrap(), 1, || {
                    check(stat(&file) == 0, "stat")
                });
                println!("ops={n} seconds={t:.3}");
            }
            "stat-loop-signals" => {
                // The stat loop, while SIGALRM every 2 ms runs a handler that stats the
                // same file (a handler's calls share the thread's bucket and credit).
                static FILE: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
                static HANDLED: AtomicU64 = AtomicU64::new(0);
                extern "C" fn on_alarm(_: i32) {
                    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
                    // SAFETY: the probe's file name, alive until the timer stops; stat is
                    // async-signal-safe.
                    if unsafe { libc::stat(FILE.load(Ordering::Relaxed), st.as_mut_ptr()) } == 0 {
                        HANDLED.fetch_add(1, Ordering::Relaxed);
                    }
                }
                FILE.store(file.as_ptr().cast_mut(), Ordering::Relaxed);
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_alarm as *const () as usize;
                action.sa_flags = libc::SA_RESTART;
                check(
                    libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut()) == 0,
                    "sigaction",
                );
                let every = |usec| libc::itimerval {
                    it_interval: libc::timeval {
                        tv_sec: 0,
                        tv_usec: usec,
                    },
                    it_value: libc::timeval {
                        tv_sec: 0,
                        tv_usec: usec,
                    },
                };
                check(
                    libc::setitimer(libc::ITIMER_REAL, &every(2000), std::ptr::null_mut()) == 0,
                    "setitimer",
                );
                let (n, t) = timed(arg(3, "3").parse().unwrap(), 1, || {
                    check(stat(&file) == 0, "stat")
                });
                libc::setitimer(libc::ITIMER_REAL, &every(0), std::ptr::null_mut());
                let handled = HANDLED.load(Ordering::Relaxed);
                println!("ops={} seconds={t:.3} handled={handled}", n + handled);
            }
            "open-loop" => {
                let (n, t) = timed(arg(3, "2").parse().unwrap(), 1, || {
                    let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                    check(fd >= 0, "open");
                    libc::close(fd);
                });
                println!("ops={n} seconds={t:.3}");
            }
            "mixed-loop" => {
                let (n, t) = timed(arg(3, "2").parse().unwrap(), 3, || {
                    check(stat(&file) == 0, "stat");
                    let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                    check(fd >= 0, "open");
                    libc::close(fd);
                });
                println!("ops={n} seconds={t:.3}");
            }
            "read-loop" => {
                let block: usize = arg(4, "65536").parse().unwrap();
                let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                check(fd >= 0, "open");
                let mut buf = vec![0u8; block];
                let mut offset = 0i64;
                let (n, t) = timed(arg(3, "2").parse().unwrap(), block as u64, || {
                    let got = libc::pread(fd, buf.as_mut_ptr().cast(), block, offset);
                    check(got == block as isize, "pread");
                    offset = (offset + block as i64) % (4 << 20);
                });
                println!("bytes={n} seconds={t:.3}");
            }
            "relative" => {
                // chdir into the mountpoint: relative paths are managed; `..` out is not.
                check(libc::chdir(c(&dir).as_ptr()) == 0, "chdir");
                check(stat(&c("file")) == 0, "stat file");
                check(stat(&c("./file")) == 0, "stat ./file");
                let name = std::path::Path::new(&dir)
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                check(
                    stat(&c(&format!("../{name}/file"))) == 0,
                    "stat ../dir/file",
                );
                check(stat(&c("..")) == 0, "stat ..");
                let fd = libc::open(c("file").as_ptr(), libc::O_RDONLY);
                check(fd >= 0, "open file");
                libc::close(fd);
                println!("ok=1");
            }
            "at" => {
                // dirfd of the mountpoint, and of its parent (an ancestor) + "name/file".
                let dirfd = libc::open(c(&dir).as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
                check(dirfd >= 0, "open dir");
                let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
                check(
                    libc::fstatat(dirfd, c("file").as_ptr(), st.as_mut_ptr(), 0) == 0,
                    "fstatat",
                );
                let fd = libc::openat(dirfd, c("file").as_ptr(), libc::O_RDONLY);
                check(fd >= 0, "openat");
                libc::close(fd);
                let path = std::path::Path::new(&dir);
                let parent = libc::open(
                    c(path.parent().unwrap().to_str().unwrap()).as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY,
                );
                check(parent >= 0, "open parent");
                let name = path.file_name().unwrap().to_str().unwrap();
                check(
                    libc::fstatat(
                        parent,
                        c(&format!("{name}/file")).as_ptr(),
                        st.as_mut_ptr(),
                        0,
                    ) == 0,
                    "fstatat via ancestor",
                );
                // The parent spelled with a trailing `/`, as `find <parent>/` opens it.
                let slashed = libc::open(
                    c(&format!("{}/", path.parent().unwrap().display())).as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY,
                );
                check(slashed >= 0, "open parent/");
                check(
                    libc::fstatat(
                        slashed,
                        c(&format!("{name}/file")).as_ptr(),
                        st.as_mut_ptr(),
                        0,
                    ) == 0,
                    "fstatat via ancestor/",
                );
                libc::close(slashed);
                // AT_EMPTY_PATH on the directory descriptor itself.
                check(
                    libc::fstatat(dirfd, c("").as_ptr(), st.as_mut_ptr(), libc::AT_EMPTY_PATH) == 0,
                    "fstatat empty",
                );
                libc::close(parent);
                libc::close(dirfd);
                println!("ok=1");
            }
            "dup" => {
                let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                check(fd >= 0, "open");
                let a = libc::dup(fd);
                let b = libc::dup2(fd, 100);
                let d = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 200);
                check(a >= 0 && b == 100 && d >= 200, "dup family");
                let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
                for f in [fd, a, b, d] {
                    check(libc::fstat(f, st.as_mut_ptr()) == 0, "fstat dup");
                    libc::close(f);
                }
                check(
                    libc::fstat(b, st.as_mut_ptr()) == -1 && errno() == libc::EBADF,
                    "fstat closed fd: EBADF",
                );
                println!("ok=1");
            }
            "stdio" => {
                let path = c(&format!("{dir}/stdio.txt"));
                let f = libc::fopen(path.as_ptr(), c("w").as_ptr());
                check(!f.is_null(), "fopen w");
                let line = b"hello padll\n";
                check(
                    libc::fwrite(line.as_ptr().cast(), 1, line.len(), f) == line.len(),
                    "fwrite",
                );
                check(libc::fputs(c("second line\n").as_ptr(), f) >= 0, "fputs");
                check(libc::fclose(f) == 0, "fclose");
                let f = libc::fopen(path.as_ptr(), c("r").as_ptr());
                check(!f.is_null(), "fopen r");
                let mut buf = [0u8; 64];
                check(
                    !libc::fgets(buf.as_mut_ptr().cast(), 64, f).is_null(),
                    "fgets",
                );
                check(buf.starts_with(b"hello padll\n"), "fgets content");
                check(libc::fgetc(f) == b's' as i32, "fgetc");
                let n = libc::fread(buf.as_mut_ptr().cast(), 1, 64, f);
                check(n == "econd line\n".len(), "fread");
                check(libc::fclose(f) == 0, "fclose r");
                println!("ok=1");
            }
            "dirent" => {
                let d = libc::opendir(c(&dir).as_ptr());
                check(!d.is_null(), "opendir");
                let mut entries = 0;
                while !libc::readdir(d).is_null() {
                    entries += 1;
                }
                check(libc::closedir(d) == 0, "closedir");
                println!("entries={entries}");
            }
            "errno" => {
                let missing = c(&format!("{dir}/missing"));
                check(
                    libc::open(missing.as_ptr(), libc::O_RDONLY) == -1 && errno() == libc::ENOENT,
                    "open missing: ENOENT",
                );
                check(
                    stat(&missing) == -1 && errno() == libc::ENOENT,
                    "stat missing: ENOENT",
                );
                check(
                    libc::mkdir(c(&dir).as_ptr(), 0o755) == -1 && errno() == libc::EEXIST,
                    "mkdir existing: EEXIST",
                );
                // Pointers no string or array can be at (the null page, the kernel's
                // half): the kernel's EFAULT, as without the stage, for a path checked
                // on the fast path, a second path, one resolved in full and an iovec.
                let kernel = usize::MAX as *const libc::c_char;
                let null_page = 8 as *const libc::c_char;
                let mut st: libc::stat = std::mem::zeroed();
                for (result, what) in [
                    (libc::stat(kernel, &mut st), "stat of a kernel address"),
                    (
                        libc::open(null_page, libc::O_RDONLY),
                        "open in the null page",
                    ),
                    (
                        libc::rename(kernel, file.as_ptr()),
                        "rename from a kernel address",
                    ),
                    (
                        libc::rename(file.as_ptr(), null_page),
                        "rename to the null page",
                    ),
                    (
                        libc::fstatat(libc::AT_FDCWD, kernel, &mut st, 0),
                        "fstatat of a kernel address",
                    ),
                ] {
                    check(result == -1 && errno() == libc::EFAULT, what);
                }
                let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                check(
                    libc::readv(fd, usize::MAX as *const libc::iovec, 1) == -1
                        && errno() == libc::EFAULT,
                    "readv of a kernel address",
                );
                libc::close(fd);
                // A successful call leaves errno as it was.
                *libc::__errno_location() = 12345;
                check(stat(&file) == 0, "stat");
                check(errno() == 12345, "errno untouched by a successful call");
                *libc::__errno_location() = 54321;
                let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                libc::close(fd);
                check(errno() == 54321, "errno untouched by open+close");
                // Streams of no file: glibc's `fileno` fails on them (setting EBADF).
                let mut text: *mut libc::c_char = std::ptr::null_mut();
                let mut size = 0;
                let memory = libc::open_memstream(&mut text, &mut size);
                check(!memory.is_null(), "open_memstream");
                *libc::__errno_location() = 4242;
                check(libc::fputs(c("in memory\n").as_ptr(), memory) >= 0, "fputs");
                check(libc::fflush(memory) == 0, "fflush");
                check(libc::fclose(memory) == 0, "fclose");
                libc::free(text.cast());
                let mut source = *b"a\nbc";
                let memory =
                    libc::fmemopen(source.as_mut_ptr().cast(), source.len(), c("r").as_ptr());
                check(!memory.is_null(), "fmemopen");
                let mut line = [0 as libc::c_char; 8];
                check(
                    !libc::fgets(line.as_mut_ptr(), 8, memory).is_null(),
                    "fgets",
                );
                check(libc::fgetc(memory) == b'b' as i32, "fgetc");
                check(libc::fclose(memory) == 0, "fclose");
                check(errno() == 4242, "errno untouched by streams of no file");
                // A relative path that is not clean, from a current directory that was
                // removed: the stage's own look at the directory fails in the kernel.
                let gone = c(&format!("{dir}.gone-{}", std::process::id()));
                check(libc::mkdir(gone.as_ptr(), 0o755) == 0, "mkdir beside");
                check(libc::chdir(gone.as_ptr()) == 0, "chdir beside");
                check(
                    libc::rmdir(gone.as_ptr()) == 0,
                    "rmdir the current directory",
                );
                *libc::__errno_location() = 777;
                check(stat(&c("./")) == 0, "stat ./ in a removed directory");
                check(errno() == 777, "errno untouched in a removed directory");
                println!("ok=1");
            }
            "load" => {
                // THREADS threads each repeating KIND (stat, or mixed: stat + open +
                // close, mdtest-like) for SECONDS; the window is printed on the
                // node-wide monotonic clock so several processes' runs can be summed.
                let seconds: f64 = arg(3, "2").parse().unwrap();
                let threads: usize = arg(4, "1").parse().unwrap();
                let mixed = arg(5, "stat") == "mixed";
                let start_ns = monotonic_ns();
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let file = file.clone();
                        std::thread::spawn(move || {
                            timed(seconds, if mixed { 3 } else { 1 }, || {
                                check(stat(&file) == 0, "stat");
                                if mixed {
                                    let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                                    check(fd >= 0, "open");
                                    libc::close(fd);
                                }
                            })
                            .0
                        })
                    })
                    .collect();
                let ops: u64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
                let end_ns = monotonic_ns();
                println!(
                    "ops={ops} seconds={:.3} start_ns={start_ns} end_ns={end_ns}",
                    (end_ns - start_ns) as f64 / 1e9
                );
            }
            "threads" => {
                let threads: usize = arg(3, "256").parse().unwrap();
                let each: u64 = arg(4, "20").parse().unwrap();
                let done = std::sync::Arc::new(AtomicU64::new(0));
                let start = Instant::now();
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let done = done.clone();
                        let file = file.clone();
                        std::thread::spawn(move || {
                            for _ in 0..each {
                                check(stat(&file) == 0, "stat in thread");
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                        })
                    })
                    .collect();
                for h in handles {
                    h.join().expect("thread");
                }
                println!(
                    "ops={} seconds={:.3}",
                    done.load(Ordering::Relaxed),
                    start.elapsed().as_secs_f64()
                );
            }
            "signal" => {
                // SIGALRM every 5 ms, handler installed without SA_RESTART, while stats wait
                // in a slow channel: every stat still succeeds and the handler runs.
                static HANDLED: AtomicU64 = AtomicU64::new(0);
                extern "C" fn on_alarm(_: i32) {
                    HANDLED.fetch_add(1, Ordering::Relaxed);
                }
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_alarm as *const () as usize;
                check(
                    libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut()) == 0,
                    "sigaction",
                );
                let tick = libc::timeval {
                    tv_sec: 0,
                    tv_usec: 5000,
                };
                let timer = libc::itimerval {
                    it_interval: tick,
                    it_value: tick,
                };
                check(
                    libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut()) == 0,
                    "setitimer",
                );
                let count: u64 = arg(3, "40").parse().unwrap();
                for _ in 0..count {
                    *libc::__errno_location() = 0;
                    check(stat(&file) == 0, "stat interrupted by signals");
                    check(errno() == 0, "errno after an interrupted wait");
                }
                let off = libc::itimerval {
                    it_interval: libc::timeval {
                        tv_sec: 0,
                        tv_usec: 0,
                    },
                    it_value: libc::timeval {
                        tv_sec: 0,
                        tv_usec: 0,
                    },
                };
                libc::setitimer(libc::ITIMER_REAL, &off, std::ptr::null_mut());
                println!("stats={count} signals={}", HANDLED.load(Ordering::Relaxed));
            }
            "mmap" => {
                let anon = libc::mmap(
                    std::ptr::null_mut(),
                    1 << 20,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                check(anon != libc::MAP_FAILED, "anonymous mmap");
                *(anon as *mut u8) = 7;
                libc::munmap(anon, 1 << 20);
                let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                let mapped = libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE,
                    fd,
                    0,
                );
                check(
                    mapped != libc::MAP_FAILED && *(mapped as *const u8) == b'x',
                    "file mmap",
                );
                libc::munmap(mapped, 4096);
                libc::close(fd);
                println!("ok=1");
            }
            "received" => {
                // Descriptors of a file on the mountpoint that come from elsewhere: over
                // a Unix socket (`recvmsg`, `recvmmsg`) and from a process (`pidfd_getfd`,
                // here this one's own). The original is closed before each copy's
                // `pread`: only the copy can carry the place.
                extern "C" {
                    fn pidfd_open(pid: libc::pid_t, flags: libc::c_uint) -> libc::c_int;
                    fn pidfd_getfd(
                        pidfd: libc::c_int,
                        target: libc::c_int,
                        flags: libc::c_uint,
                    ) -> libc::c_int;
                }
                let mut byte = [0u8; 1];
                for way in ["recvmsg", "recvmmsg", "pidfd_getfd"] {
                    let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                    check(fd >= 0, "open");
                    let copy = match way {
                        "pidfd_getfd" => {
                            let pidfd = pidfd_open(libc::getpid(), 0);
                            check(pidfd >= 0, "pidfd_open");
                            let copy = pidfd_getfd(pidfd, fd, 0);
                            libc::close(pidfd);
                            copy
                        }
                        _ => passed_over_a_socket(fd, way == "recvmmsg"),
                    };
                    check(copy >= 0 && copy != fd, way);
                    check(libc::close(fd) == 0, "close");
                    check(
                        libc::pread(copy, byte.as_mut_ptr().cast(), 1, 0) == 1,
                        "pread of the copy",
                    );
                    check(libc::close(copy) == 0, "close of the copy");
                }
                println!("ok=1");
            }
            "close_range" => {
                // Calls of `close_range` that close nothing for the process: refused by
                // the kernel (an unknown flag, first > last), or closing in the calling
                // thread's own copy of the table (`CLOSE_RANGE_UNSHARE`). The file stays
                // open, and managed: one `pread` after each.
                let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                check(fd >= 0, "open");
                extern "C" {
                    fn close_range(
                        first: libc::c_uint,
                        last: libc::c_uint,
                        flags: libc::c_int,
                    ) -> libc::c_int;
                }
                let fd_u = fd as libc::c_uint;
                let mut byte = [0u8; 1];
                let mut read = || {
                    check(
                        libc::pread(fd, byte.as_mut_ptr().cast(), 1, 0) == 1,
                        "pread",
                    )
                };
                check(
                    close_range(fd_u, fd_u, 0x4000_0000) == -1 && errno() == libc::EINVAL,
                    "unknown flag refused",
                );
                read();
                check(
                    close_range(fd_u + 1, fd_u, 0) == -1 && errno() == libc::EINVAL,
                    "first > last refused",
                );
                read();
                let unshared = std::thread::spawn(move || {
                    close_range(fd_u, fd_u, libc::CLOSE_RANGE_UNSHARE as libc::c_int)
                });
                check(
                    unshared.join().unwrap() == 0,
                    "close_range with CLOSE_RANGE_UNSHARE in a thread",
                );
                read();
                // A process of one thread (a forked child) closes with it for
                // itself: the number is gone, and a read of it is no read of the file.
                let child = libc::fork();
                if child == 0 {
                    let closed =
                        close_range(fd_u, fd_u, libc::CLOSE_RANGE_UNSHARE as libc::c_int) == 0;
                    let gone = libc::pread(fd, byte.as_mut_ptr().cast(), 1, 0) == -1
                        && errno() == libc::EBADF;
                    libc::exit(if closed && gone { 0 } else { 1 });
                }
                let mut status = 0;
                check(
                    libc::waitpid(child, &mut status, 0) == child
                        && libc::WIFEXITED(status)
                        && libc::WEXITSTATUS(status) == 0,
                    "close_range with CLOSE_RANGE_UNSHARE in a process of one thread",
                );
                // A kernel without `close_range` (before Linux 5.9) or a seccomp filter
                // refusing it: a forked child whose filter answers `ENOSYS` closes
                // nothing, and its file stays managed.
                let child = libc::fork();
                if child == 0 {
                    let refused = refuse_close_range()
                        && close_range(fd_u, fd_u, 0) == -1
                        && errno() == libc::ENOSYS;
                    let kept = libc::pread(fd, byte.as_mut_ptr().cast(), 1, 0) == 1;
                    libc::exit(if refused && kept { 0 } else { 1 });
                }
                check(
                    libc::waitpid(child, &mut status, 0) == child
                        && libc::WIFEXITED(status)
                        && libc::WEXITSTATUS(status) == 0,
                    "close_range refused with ENOSYS keeps the descriptor",
                );
                check(libc::close(fd) == 0, "close");
                println!("ok=1");
            }
            "entry_points" => {
                // Entry points reached by fortified, large-file or older code, each once
                // on the mountpoint.
                extern "C" {
                    fn __readlink_chk(
                        path: *const libc::c_char,
                        buf: *mut libc::c_char,
                        len: usize,
                        buflen: usize,
                    ) -> isize;
                    fn lchmod(path: *const libc::c_char, mode: libc::mode_t) -> libc::c_int;
                    fn getdents64(fd: libc::c_int, buf: *mut libc::c_void, len: usize) -> isize;
                    fn scandirat64(
                        dirfd: libc::c_int,
                        path: *const libc::c_char,
                        list: *mut *mut *mut libc::dirent64,
                        filter: *const libc::c_void,
                        compare: *const libc::c_void,
                    ) -> libc::c_int;
                }
                let link = c(&format!("{dir}/link"));
                check(
                    libc::symlink(c("file").as_ptr(), link.as_ptr()) == 0,
                    "symlink",
                );
                let mut target = [0 as libc::c_char; 64];
                check(
                    __readlink_chk(link.as_ptr(), target.as_mut_ptr(), 64, 64) == 4,
                    "__readlink_chk",
                );
                check(lchmod(file.as_ptr(), 0o644) == 0, "lchmod");
                let listed = libc::open(c(&dir).as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
                check(listed >= 0, "open dir");
                let mut entries = [0u8; 4096];
                check(
                    getdents64(listed, entries.as_mut_ptr().cast(), entries.len()) > 0,
                    "getdents64",
                );
                let mut list: *mut *mut libc::dirent64 = std::ptr::null_mut();
                let n = scandirat64(
                    listed,
                    c(".").as_ptr(),
                    &mut list,
                    std::ptr::null(),
                    std::ptr::null(),
                );
                check(n >= 3, "scandirat64");
                for i in 0..n as usize {
                    libc::free((*list.add(i)).cast());
                }
                libc::free(list.cast());
                libc::close(listed);
                let stream = libc::opendir(c(&dir).as_ptr());
                let mut entry: libc::dirent = std::mem::zeroed();
                let mut found: *mut libc::dirent = std::ptr::null_mut();
                check(
                    libc::readdir_r(stream, &mut entry, &mut found) == 0 && !found.is_null(),
                    "readdir_r",
                );
                libc::closedir(stream);
                // `getline` to the end: the end is no failure.
                let lines = c(&format!("{dir}/lines"));
                std::fs::write(format!("{dir}/lines"), "one\ntwo\n").expect("lines");
                let stream = libc::fopen(lines.as_ptr(), c("r").as_ptr());
                let (mut line, mut size) = (std::ptr::null_mut(), 0);
                let mut read = 0;
                while libc::getline(&mut line, &mut size, stream) >= 0 {
                    read += 1;
                }
                check(read == 2, "getline");
                libc::free(line.cast());
                libc::fclose(stream);
                // `remove` of a directory: glibc's `unlink` (refused), then its `rmdir`.
                let removed = c(&format!("{dir}/removed"));
                check(libc::mkdir(removed.as_ptr(), 0o755) == 0, "mkdir");
                check(libc::remove(removed.as_ptr()) == 0, "remove a directory");
                check(libc::remove(link.as_ptr()) == 0, "remove a link");
                println!("ok=1");
            }
            "daemon" => {
                // Standard output on a file of the mountpoint and the current directory
                // in it, then `daemon(0, 0)`, which moves both inside libc: to `/dev/null`
                // and `/`. The detached child writes 10 bytes to its standard output and
                // stats `file` relatively, neither on the mountpoint any more; it prints
                // nothing (its output is `/dev/null`), its statistics say it all.
                let out = c(&format!("{dir}/daemon-out"));
                let fd = libc::open(out.as_ptr(), libc::O_WRONLY | libc::O_CREAT, 0o644);
                check(
                    fd >= 0 && libc::dup2(fd, 1) == 1 && libc::close(fd) == 0,
                    "stdout on the mount",
                );
                check(libc::chdir(c(&dir).as_ptr()) == 0, "chdir into the mount");
                check(libc::daemon(0, 0) == 0, "daemon");
                for _ in 0..10 {
                    libc::write(1, b"x".as_ptr().cast(), 1);
                }
                check(stat(&c("file")) == -1, "file is not in /");
            }
            "stale" => {
                // A managed descriptor closed where no hook sees it (`closefrom`'s
                // internal `close_range` before the hook existed, a raw system call),
                // then its number reused by a call that makes a descriptor of no file:
                // the new descriptor is not the old file.
                extern "C" {
                    fn closefrom(first: libc::c_int);
                }
                let managed = || {
                    let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
                    check(fd >= 0, "open");
                    fd
                };
                let fd = managed();
                closefrom(fd);
                let mut pair = [-1; 2];
                check(libc::pipe(pair.as_mut_ptr()) == 0, "pipe");
                check(pair[0] == fd, "pipe reuses the closed number");
                let mut byte = [b'x'];
                check(
                    libc::write(pair[1], byte.as_ptr().cast(), 1) == 1,
                    "write pipe",
                );
                check(
                    libc::read(pair[0], byte.as_mut_ptr().cast(), 1) == 1,
                    "read pipe",
                );
                libc::close(pair[0]);
                libc::close(pair[1]);
                let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
                // Each maker is handed a listening socket with a client waiting.
                type Maker<'a> = &'a dyn Fn(libc::c_int) -> libc::c_int;
                let pair = |make: &dyn Fn(*mut libc::c_int) -> libc::c_int| {
                    let mut pair = [-1; 2];
                    check(make(pair.as_mut_ptr()) == 0, "pair");
                    pair[0]
                };
                let makers: [(&str, Maker); 13] = [
                    ("socket", &|_| {
                        libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0)
                    }),
                    ("accept", &|l| {
                        libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut())
                    }),
                    ("accept4", &|l| {
                        libc::accept4(l, std::ptr::null_mut(), std::ptr::null_mut(), 0)
                    }),
                    ("socketpair", &|_| {
                        pair(&|fds| libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds))
                    }),
                    ("pipe2", &|_| pair(&|fds| libc::pipe2(fds, 0))),
                    ("eventfd", &|_| libc::eventfd(0, 0)),
                    ("epoll_create", &|_| libc::epoll_create(1)),
                    ("epoll_create1", &|_| libc::epoll_create1(0)),
                    ("memfd_create", &|_| {
                        libc::memfd_create(c"probe".as_ptr(), 0)
                    }),
                    ("timerfd_create", &|_| {
                        libc::timerfd_create(libc::CLOCK_MONOTONIC, 0)
                    }),
                    ("inotify_init", &|_| libc::inotify_init()),
                    ("inotify_init1", &|_| libc::inotify_init1(0)),
                    ("signalfd", &|_| {
                        let mut mask = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
                        libc::sigemptyset(mask.as_mut_ptr());
                        libc::signalfd(-1, mask.as_ptr(), 0)
                    }),
                ];
                for (n, (name, make)) in makers.into_iter().enumerate() {
                    let (listener, client) = listener_with_client(n);
                    let fd = managed();
                    check(libc::syscall(libc::SYS_close, fd) == 0, "raw close");
                    let made = make(listener);
                    check(made == fd, &format!("{name} reuses the closed number"));
                    // An unmanaged call, unless the old file's entry was kept.
                    check(
                        libc::fstat(made, st.as_mut_ptr()) == 0,
                        &format!("fstat {name}"),
                    );
                    // The maker's descriptors are `made` and above; the socket's below.
                    libc::close_range(made as libc::c_uint, libc::c_uint::MAX, 0);
                    libc::close(client);
                    libc::close(listener);
                }
                println!("ok=1");
            }
            "fork" => {
                // Fork without exec: both processes keep doing managed stats.
                let seconds: f64 = arg(3, "1.5").parse().unwrap();
                let pid = libc::fork();
                check(pid >= 0, "fork");
                let (n, _) = timed(seconds, 1, || check(stat(&file) == 0, "stat after fork"));
                if pid == 0 {
                    // exit, not _exit: like a real program, the child runs its destructors.
                    libc::exit(if n > 0 { 0 } else { 3 });
                }
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
                check(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "child",
                );
                println!("parent_ops={n}");
            }
            other => {
                eprintln!("padll-probe: unknown scenario '{other}'");
                std::process::exit(2);
            }
        }
    }
}

/// Installs a seccomp filter on the calling thread that answers `close_range` with
/// `ENOSYS`, as a kernel before Linux 5.9 does, and allows every other call.
///
/// # Safety
/// Only for a process that needs no `close_range` after it (a forked child).
unsafe fn refuse_close_range() -> bool {
    let statement = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let mut filter = [
        // The system call's number: the first word of `struct seccomp_data`.
        statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        statement(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            1,
            libc::SYS_close_range as u32,
        ),
        statement(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        statement(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: `prctl` with a filter program that lives across the call (the kernel
    // copies it).
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog,
            ) == 0
    }
}

/// `fd` sent to this process over a new socket pair (`SCM_RIGHTS`) and received with
/// `recvmsg`, or with `recvmmsg`: the received copy's number.
///
/// # Safety
/// `fd` is an open descriptor.
unsafe fn passed_over_a_socket(fd: libc::c_int, many: bool) -> libc::c_int {
    // SAFETY: socket calls on descriptors made here, with headers and control buffers of
    // the sizes they state, built with libc's control-message macros.
    unsafe {
        let space = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize;
        let mut pair = [0; 2];
        check(
            libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) == 0,
            "socketpair",
        );
        let mut byte = [b'x'];
        let mut io = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut control = vec![0u8; space];
        let mut header: libc::msghdr = std::mem::zeroed();
        header.msg_iov = &mut io;
        header.msg_iovlen = 1;
        header.msg_control = control.as_mut_ptr().cast();
        header.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&header);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        libc::CMSG_DATA(cmsg)
            .cast::<libc::c_int>()
            .write_unaligned(fd);
        check(libc::sendmsg(pair[0], &header, 0) == 1, "sendmsg");
        let mut received = vec![0u8; space];
        let mut answer: libc::msghdr = std::mem::zeroed();
        answer.msg_iov = &mut io;
        answer.msg_iovlen = 1;
        answer.msg_control = received.as_mut_ptr().cast();
        answer.msg_controllen = space as _;
        if many {
            let mut messages = [libc::mmsghdr {
                msg_hdr: answer,
                msg_len: 0,
            }];
            check(
                libc::recvmmsg(pair[1], messages.as_mut_ptr(), 1, 0, std::ptr::null_mut()) == 1,
                "recvmmsg",
            );
            answer = messages[0].msg_hdr;
        } else {
            check(libc::recvmsg(pair[1], &mut answer, 0) == 1, "recvmsg");
        }
        let cmsg = libc::CMSG_FIRSTHDR(&answer);
        check(
            !cmsg.is_null() && (*cmsg).cmsg_type == libc::SCM_RIGHTS,
            "a descriptor received",
        );
        let copy = libc::CMSG_DATA(cmsg).cast::<libc::c_int>().read_unaligned();
        libc::close(pair[0]);
        libc::close(pair[1]);
        copy
    }
}
