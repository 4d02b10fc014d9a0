/* Walks that change directory inside glibc: `nftw`/`nftw64` with FTW_CHDIR and `fts`
 * without FTS_NOCHDIR hand the program names relative to the directory glibc moved
 * into (`path + ftw->base`, `fts_accpath`). Every file of TREE is stat'ed by such a
 * name four times (nftw, fts, fts64, nftw64 with an nftw of OTHER nested in its
 * first callback), and `marker` in the starting directory after each walk. Prints
 * how many of each succeeded. Usage: walks TREE OTHER (run in a directory holding
 * `marker`). */
#define _GNU_SOURCE
#include <ftw.h>
#include <fts.h>
#include <stdio.h>
#include <sys/stat.h>

static int plain, outer, inner;
static const char *other;

static int count(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    struct stat st;
    if (type == FTW_F && stat(path + ftw->base, &st) == 0) plain++;
    return 0;
}

static int count_inner(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    struct stat st;
    if (type == FTW_F && stat(path + ftw->base, &st) == 0) inner++;
    return 0;
}

static int count_outer(const char *path, const struct stat64 *sb, int type, struct FTW *ftw) {
    struct stat st;
    if (ftw->level == 0 && nftw(other, count_inner, 16, FTW_CHDIR | FTW_PHYS) != 0) return 1;
    if (type == FTW_F && stat(path + ftw->base, &st) == 0) outer++;
    return 0;
}

static int marker(void) {
    struct stat st;
    return stat("marker", &st) == 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    other = argv[2];
    struct stat st;
    int markers = 0;

    int walked = nftw(argv[1], count, 16, FTW_CHDIR | FTW_PHYS);
    markers += marker();

    char *roots[] = {argv[1], NULL};
    int listed = 0, children = 0;
    FTS *fts = fts_open(roots, FTS_PHYSICAL, NULL);
    FTSENT *e;
    while ((e = fts_read(fts)))
        if (e->fts_info == FTS_F && stat(e->fts_accpath, &st) == 0) listed++;
        else if (e->fts_info == FTS_D && e->fts_level == 0 && fts_children(fts, FTS_NAMEONLY)) children++;
    int closed = fts_close(fts);
    markers += marker();

    int listed64 = 0;
    FTS64 *fts64 = fts64_open(roots, FTS_PHYSICAL, NULL);
    FTSENT64 *e64;
    while ((e64 = fts64_read(fts64)))
        if (e64->fts_info == FTS_F && stat(e64->fts_accpath, &st) == 0) listed64++;
    int closed64 = fts64_close(fts64);
    markers += marker();

    int nested = nftw64(argv[1], count_outer, 16, FTW_CHDIR | FTW_PHYS);
    markers += marker();

    printf("nftw=%d:%d fts=%d:%d:%d fts64=%d:%d nested=%d:%d:%d markers=%d\n", walked, plain,
           listed, children, closed, listed64, closed64, nested, outer, inner, markers);
    return 0;
}
