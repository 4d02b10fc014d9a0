/* A test double standing in for a Lustre client, preloaded after libpadll.so by the
 * placement tests (interpose-tests/tests/placement.rs, cheferd-controller/tests/placement.rs). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))
int statfs(const char *path, struct statfs *buf) {
    int result = REAL(statfs)(path, buf);
    buf->f_type = 0x0BD00BD0;
    return result;
}
int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    int result = REAL(fcntl)(fd, cmd, arg);
    return cmd == F_GETFL && result >= 0 ? result & ~(O_NOCTTY | O_ASYNC) : result;
}
int ioctl(int fd, unsigned long request, ...) {
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (request != 0x4008669aUL) {
        return REAL(ioctl)(fd, request, arg);
    }
    const unsigned char *lum = arg;
    unsigned short count;
    memcpy(&count, lum + 28, 2);
    FILE *log = fopen(getenv("PLACEMENT_LOG"), "a");
    for (size_t i = 0; i < 48 + 24 * (size_t)count; i++) fprintf(log, "%02x", lum[i]);
    fprintf(log, "\n");
    fclose(log);
    const char *fail = getenv("PLACEMENT_ERRNO");
    if (fail) { errno = atoi(fail); return -1; }
    return 0;
}
