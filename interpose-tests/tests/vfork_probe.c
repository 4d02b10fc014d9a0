/* vfork_probe DIR share|fail: what a process launcher does between vfork and exec, for
 * tests/vfork.rs. Prints key=value lines; exits 1 naming a call that misbehaved. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "vfork_probe: %s (errno %d)\n", what, errno);
        exit(1);
    }
}

/* The parent opens a file under DIR, then its vfork child closes that descriptor,
 * reuses its number, duplicates it, closes a range and changes directory before
 * _exit: none of it may change how the parent's later calls are seen. */
static int share(const char *dir) {
    struct stat st;
    char buf[64];
    check(chdir(dir) == 0, "chdir");
    int fd = open("file", O_RDONLY);
    check(fd >= 0, "open");
    check(pread(fd, buf, sizeof buf, 0) > 0, "pread before vfork");
    check(stat("file", &st) == 0, "stat before vfork");
    pid_t pid = vfork();
    if (pid == 0) {
        close(fd);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, fd + 1);
        close_range(fd + 1, fd + 1, 0);
        chdir("/");
        _exit(null == fd ? 0 : 3);
    }
    check(pid > 0, "vfork");
    int status;
    check(waitpid(pid, &status, 0) == pid, "waitpid");
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exit status");
    check(pread(fd, buf, sizeof buf, 0) > 0, "pread after vfork");
    check(stat("file", &st) == 0, "stat after vfork");
    check(close(fd) == 0, "close");
    printf("ok=1\n");
    return 0;
}

/* As a user allowed no more processes (RLIMIT_NPROC 0; needs root to become one),
 * vfork fails: the result and errno must be glibc's, and the stage must go on. */
static int fail(const char *dir) {
    struct stat st;
    check(setgid(65534) == 0 && setuid(65534) == 0, "become nobody");
    struct rlimit none = {0, 0};
    check(setrlimit(RLIMIT_NPROC, &none) == 0, "setrlimit");
    errno = 0;
    pid_t pid = vfork();
    if (pid == 0)
        _exit(0);
    int saved = errno;
    char file[4096];
    snprintf(file, sizeof file, "%s/file", dir);
    check(stat(file, &st) == 0, "stat after the failed vfork");
    printf("result=%d errno=%d\n", (int)pid, saved);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[2], "share") == 0)
        return share(argv[1]);
    if (argc == 3 && strcmp(argv[2], "fail") == 0)
        return fail(argv[1]);
    fprintf(stderr, "usage: vfork_probe DIR share|fail\n");
    return 2;
}
