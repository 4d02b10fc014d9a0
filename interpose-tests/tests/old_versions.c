/* A program linked as on glibc before 2.27 (x86-64): bound to the first versions of
 * `glob` and `realpath`, which glibc keeps for such programs. The old `glob` never
 * calls `gl_lstat` (a field programs of that time left unset: here a pointer that
 * crashes if called); the old `realpath` refuses a null buffer. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

__asm__(".symver glob,glob@GLIBC_2.2.5");
__asm__(".symver realpath,realpath@GLIBC_2.2.5");

static int plain_stat(const char *path, struct stat *st) { return stat(path, st); }

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    char path[4096];
    snprintf(path, sizeof path, "%s/file", argv[1]);
    glob_t found;
    memset(&found, 0, sizeof found);
    found.gl_opendir = (void *(*)(const char *))opendir;
    found.gl_readdir = (void *(*)(void *))readdir;
    found.gl_closedir = (void (*)(void *))closedir;
    found.gl_stat = (int (*)(const char *, void *))plain_stat;
    found.gl_lstat = (int (*)(const char *, void *))1;
    int matched = glob(path, GLOB_ALTDIRFUNC, NULL, &found);
    printf("glob=%d matches=%zu\n", matched, found.gl_pathc);
    errno = 0;
    char *resolved = realpath(argv[1], NULL);
    printf("realpath=%s errno=%d\n", resolved ? "allocated" : "null", errno);
    return 0;
}
