/* open, close, dup, fchdir and chdir are async-signal-safe: a signal handler may call
   them while the thread it interrupted is inside malloc, holding the allocator's lock.
   The handler here does so on directories under a mountpoint, the mountpoint itself
   and a directory above it (whose descriptors and current directory the stage keeps
   paths of), while the main thread does nothing but malloc and free (and a second,
   idle thread makes malloc take its locks). It ends after `runs` handler runs, or
   after 60 seconds whatever it did; a stage that allocated in those calls hangs.
   Usage: signal_safety MOUNT/SUB MOUNT ABOVE RUNS */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const char *dirs[3];
static int home = -1;
static volatile sig_atomic_t handled, failed;

static void on_alarm(int sig) {
    (void)sig;
    const char *dir = dirs[handled % 3];
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
        failed = 1;
        return;
    }
    int copy = dup(fd);
    int inner = openat(copy, ".", O_RDONLY | O_DIRECTORY);
    if (inner >= 0)
        close(inner);
    if (copy >= 0)
        close(copy);
    if (fchdir(fd) != 0 || chdir(dir) != 0 || chdir("..") != 0 || fchdir(home) != 0)
        failed = 1;
    close(fd);
    handled++;
}

static void *idle(void *arg) {
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5)
        return 2;
    dirs[0] = argv[1];
    dirs[1] = argv[2];
    dirs[2] = argv[3];
    long runs = atol(argv[4]);
    home = open(".", O_RDONLY | O_DIRECTORY);
    if (home < 0)
        return 2;
    /* The idle thread blocks SIGALRM (it inherits the mask): the main thread, inside
       malloc or free nearly all the time, takes every signal. */
    sigset_t alarm_only;
    sigemptyset(&alarm_only);
    sigaddset(&alarm_only, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alarm_only, NULL);
    pthread_t thread;
    pthread_create(&thread, NULL, idle, NULL);
    pthread_sigmask(SIG_UNBLOCK, &alarm_only, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &every, NULL);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    unsigned seed = 1;
    void *kept[64] = {0};
    unsigned long allocations = 0;
    do {
        for (int i = 0; i < 1000; i++) {
            int k = rand_r(&seed) % 64;
            free(kept[k]);
            kept[k] = malloc(rand_r(&seed) % 3 ? 8 + rand_r(&seed) % 64
                                               : 2000 + rand_r(&seed) % 200000);
            allocations++;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (handled < runs && now.tv_sec - start.tv_sec < 60);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("ok failed=%d\n", (int)failed);
    return 0;
}
