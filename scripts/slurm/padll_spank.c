/*
 * padll_spank.c: a SPANK plugin that runs a Slurm job's tasks under the PADLL stage.
 *
 * It gives users `sbatch/srun/salloc --padll[=on|off]` and admins a site-wide default
 * (plugstack.conf arguments below). For each task of an enabled job, slurmstepd calls
 * slurm_spank_task_init() as the job's user just before exec; it appends libpadll.so to
 * LD_PRELOAD and sets the stage's controller socket and the job's identity from Slurm:
 *
 *   PADLL_CONTROLLER      the local controller's socket (socket=)
 *   PADLL_JOB_ID          Slurm's job id
 *   PADLL_JOB_SIZE        Slurm's node count of the job
 *   PADLL_CONFIG          the site's stage configuration, e.g. its mountpoints (config=)
 *   PADLL_CONTROLLER_UID  the uid `cheferd local` runs as, if not root (controller_uid=):
 *                         the stage takes rules only from root, this uid or its own
 *
 * The controller does not take the identity on trust: it reads the task's job from its
 * cgroup and its size from scontrol. The environment is for the stage's own use (its
 * job-wide segment, its logs).
 *
 * Before that, as root (slurm_spank_task_init_privileged), it makes the job user's own
 * directory for the job's files in /dev/shm: /dev/shm/padll (root's, 0711) and in it
 * <uid> (the user's, 0700), so that no other user can occupy the names of the job's
 * shared buckets and last rules (padll-wire/src/node_files.rs does the same in Rust;
 * docs/security.md, "The job's segment"). What occupied a name is cleared away: a file,
 * symlink or FIFO removed, another user's directory moved aside whole. When it cannot,
 * slurmd's log says why and the stage keeps the files flat in /dev/shm.
 *
 * plugstack.conf:
 *   optional /usr/local/lib/padll/padll_spank.so [default=off|on|always] [library=PATH]
 *            [socket=PATH] [config=PATH] [controller_uid=UID|USER]
 *
 *   default=off     jobs run under PADLL only with --padll (the default)
 *   default=on      every job does, unless it asks --padll=off
 *   default=always  every job does; --padll=off is refused
 *
 * controller_uid=cheferd for the packaged cheferd-local.service (User=cheferd): a name
 * is resolved in slurmstepd, as root.
 *
 * A job is never broken by PADLL being absent: when the library or config= cannot be read
 * the task runs without it after one line on its stderr (a missing config= is also in
 * slurmd's log). A bad plugstack.conf argument is logged and leaves PADLL off for the
 * job.
 *
 * Built by scripts/slurm/build.sh, which compiles the default library path in.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE 1
#endif

#include <slurm/spank.h>

SPANK_PLUGIN(padll, 1);

#ifndef PADLL_DEFAULT_LIBRARY
#define PADLL_DEFAULT_LIBRARY "/usr/local/lib/padll/libpadll.so"
#endif
#define PADLL_DEFAULT_SOCKET "/run/cheferd/local.sock"

enum site_default { SITE_OFF, SITE_ON, SITE_ALWAYS };

/* Plugstack arguments: one configuration per process that loads the plugin. */
static enum site_default site_default = SITE_OFF;
static int misconfigured;
static char library[PATH_MAX] = PADLL_DEFAULT_LIBRARY;
static char socket_path[PATH_MAX] = PADLL_DEFAULT_SOCKET;
static char config[PATH_MAX];
static char controller_uid[16]; /* decimal */

/* The user's --padll: -1 not given, 0 off, 1 on. */
static int user_choice = -1;

static int padll_option(int val, const char *optarg, int remote);

static struct spank_option padll_spank_option = {
    "padll",
    "[on|off]",
    "Run the job's tasks under PADLL I/O control (default: the site's choice)",
    2, /* the argument is optional */
    0,
    padll_option,
};

static int padll_option(int val, const char *optarg, int remote)
{
    (void)val;
    /* Slurm 22.05 hands a bare --padll on to job steps (srun inside sbatch) as the
     * text "(null)". */
    if (optarg == NULL || *optarg == '\0' || strcmp(optarg, "(null)") == 0 ||
        strcmp(optarg, "on") == 0) {
        user_choice = 1;
    } else if (strcmp(optarg, "off") == 0) {
        if (site_default == SITE_ALWAYS) {
            /* Refused at submission; a job submitted before the site switched to
             * `always` still starts, under PADLL. */
            if (remote)
                return 0;
            slurm_error("padll: --padll=off: this site runs every job under PADLL");
            return -1;
        }
        user_choice = 0;
    } else {
        slurm_error("padll: --padll=%s: expected on or off", optarg);
        return -1;
    }
    return 0;
}

/* Copies the path `value` into `dest` (PATH_MAX bytes) if it fits and is absolute; 0 on
 * success. */
static int set_path(char *dest, const char *name, const char *value)
{
    if (strlen(value) >= PATH_MAX || value[0] != '/') {
        slurm_error("padll: plugstack.conf: %s=%s must be an absolute path", name, value);
        return -1;
    }
    strcpy(dest, value);
    return 0;
}

/* controller_uid=: a uid below (uid_t)-1, or a user name, into `controller_uid` as a
 * number; 0 on success. A name is resolved only when `resolve` (in slurmstepd, as root,
 * on the compute node, where `cheferd local` runs): srun and sbatch may run where that
 * user does not exist, and do not use it. */
static int set_controller_uid(const char *value, int resolve)
{
    if (*value != '\0' && strspn(value, "0123456789") == strlen(value)) {
        errno = 0;
        unsigned long long uid = strtoull(value, NULL, 10);
        if (errno != 0 || uid >= (uid_t)-1) {
            slurm_error("padll: plugstack.conf: controller_uid=%s: out of range (a uid is "
                        "below %u)",
                        value, (unsigned)(uid_t)-1);
            return -1;
        }
        snprintf(controller_uid, sizeof controller_uid, "%llu", uid);
        return 0;
    }
    if (*value == '\0') {
        slurm_error("padll: plugstack.conf: controller_uid=: expected a uid or a user name");
        return -1;
    }
    if (!resolve)
        return 0;
    struct passwd pw, *found = NULL;
    char buf[16384];
    int rc = getpwnam_r(value, &pw, buf, sizeof buf, &found);
    if (found == NULL) {
        slurm_error("padll: plugstack.conf: controller_uid=%s: %s", value,
                    rc ? strerror(rc) : "no such user");
        return -1;
    }
    snprintf(controller_uid, sizeof controller_uid, "%u", (unsigned)pw.pw_uid);
    return 0;
}

/* One plugstack.conf argument; `remote`: in slurmstepd. 0 on success. */
static int parse_argument(const char *arg, int remote)
{
    const char *eq = strchr(arg, '=');
    const char *value = eq ? eq + 1 : "";
    size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);

#define IS(name) (name_len == strlen(name) && strncmp(arg, name, name_len) == 0)
    if (IS("default")) {
        if (strcmp(value, "off") == 0)
            site_default = SITE_OFF;
        else if (strcmp(value, "on") == 0)
            site_default = SITE_ON;
        else if (strcmp(value, "always") == 0)
            site_default = SITE_ALWAYS;
        else {
            slurm_error("padll: plugstack.conf: default=%s: expected off, on or always",
                        value);
            return -1;
        }
        return 0;
    }
    if (IS("library")) {
        /* LD_PRELOAD splits at these. */
        if (strpbrk(value, " \t\n:")) {
            slurm_error("padll: plugstack.conf: library=%s must not contain a space or ':'",
                        value);
            return -1;
        }
        return set_path(library, "library", value);
    }
    if (IS("socket"))
        return set_path(socket_path, "socket", value);
    if (IS("config"))
        return set_path(config, "config", value);
    if (IS("controller_uid"))
        return set_controller_uid(value, remote);
#undef IS
    slurm_error("padll: plugstack.conf: unknown argument '%s' (default=, library=, socket=, "
                "config=, controller_uid=)",
                arg);
    return -1;
}

/* Takes plugstack.conf's arguments; `remote`: in slurmstepd, as root. */
static void configure(int ac, char **av, int remote)
{
    for (int i = 0; i < ac; i++) {
        if (parse_argument(av[i], remote) != 0)
            misconfigured = 1;
    }
    /* Without its configuration the stage knows no mountpoint and ignores the
     * controller: the admin hears of it here, in slurmd's log, and each task on its
     * stderr (slurm_spank_task_init). */
    if (remote && *config && access(config, R_OK) != 0)
        slurm_error("padll: plugstack.conf: config=%s: %s; tasks run without PADLL I/O "
                    "control",
                    config, strerror(errno));
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    configure(ac, av, spank_remote(sp) == 1);
    if (spank_option_register(sp, &padll_spank_option) != ESPANK_SUCCESS)
        slurm_error("padll: cannot register --padll");
    return 0;
}

static int enabled(void)
{
    if (misconfigured)
        return 0;
    if (site_default == SITE_ALWAYS)
        return 1;
    if (user_choice >= 0)
        return user_choice;
    return site_default == SITE_ON;
}

/* Sets a variable of the task's environment; 0 on success. */
static int set_env(spank_t sp, const char *name, const char *value)
{
    spank_err_t rc = spank_setenv(sp, name, value, 1);
    if (rc != ESPANK_SUCCESS) {
        fprintf(stderr, "padll: cannot set %s: %s; this task runs without PADLL\n", name,
                spank_strerror(rc));
        return -1;
    }
    return 0;
}

/* LD_PRELOAD with the library appended (once: an srun inside a batch script inherits
 * it), or NULL when it cannot be read whole or the result does not fit. */
static char *preload_with_library(spank_t sp)
{
    static char preload[8192];
    char current[sizeof preload];
    spank_err_t rc = spank_getenv(sp, "LD_PRELOAD", current, sizeof current);
    if (rc == ESPANK_ENV_NOEXIST)
        current[0] = '\0';
    else if (rc != ESPANK_SUCCESS)
        return NULL; /* longer than the buffer: never drop the user's preloads */
    const char *sep = " :";
    char copy[sizeof current];
    strcpy(copy, current);
    for (char *save = NULL, *word = strtok_r(copy, sep, &save); word;
         word = strtok_r(NULL, sep, &save)) {
        if (strcmp(word, library) == 0) {
            strcpy(preload, current);
            return preload;
        }
    }
    int n = snprintf(preload, sizeof preload, "%s%s%s", current, *current ? " " : "",
                     library);
    return n < 0 || (size_t)n >= sizeof preload ? NULL : preload;
}

/* Makes `name` under the directory `parent` a directory of owner:group with `mode` and
 * returns it opened, or -1 with errno set. One that exists is kept if root's or the
 * owner's (only root makes entries there) and given that owner and mode; anything else
 * is cleared away and the name made anew. Nothing is followed: every change goes
 * through a descriptor. */
static int make_directory(int parent, const char *name, uid_t owner, gid_t group, mode_t mode)
{
    for (int attempt = 0; attempt < 4; attempt++) {
        if (mkdirat(parent, name, mode) != 0 && errno != EEXIST)
            return -1;
        int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT)
                continue;
            if (errno != ENOTDIR && errno != ELOOP)
                return -1;
            /* A file, symlink, FIFO…: unlinking a symlink removes the link only. */
            if (unlinkat(parent, name, 0) != 0 && errno != ENOENT)
                return -1;
            continue;
        }
        struct stat st;
        if (fstat(fd, &st) != 0)
            goto fail;
        if (st.st_uid == 0 || st.st_uid == owner) {
            if ((st.st_uid != owner || st.st_gid != group) && fchown(fd, owner, group) != 0)
                goto fail;
            if ((st.st_mode & 07777) != mode && fchmod(fd, mode) != 0)
                goto fail;
            return fd;
        }
        close(fd);
        /* Another user's directory: moved aside whole, never walked into as root, to a
         * name its owner cannot have taken first (64 random bits; a known name, taken,
         * made the move fail). */
        int moved = -1;
        for (int tries = 0; moved != 0 && tries < 4; tries++) {
            uint64_t random = 0;
            if (getrandom(&random, sizeof random, 0) != (ssize_t)sizeof random) {
                struct timespec now;
                clock_gettime(CLOCK_MONOTONIC, &now);
                random = (uint64_t)now.tv_sec << 30 ^ (uint64_t)now.tv_nsec;
            }
            char aside[96];
            snprintf(aside, sizeof aside, "%s.squatted-by-%u-%ju-%016" PRIx64, name,
                     (unsigned)st.st_uid, (uintmax_t)st.st_ino, random);
            moved = (int)syscall(SYS_renameat2, parent, name, parent, aside, RENAME_NOREPLACE);
            if (moved != 0 && errno != EEXIST)
                return -1;
        }
        if (moved != 0)
            return -1;
        continue;
    fail:;
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    errno = EEXIST;
    return -1;
}

/* /dev/shm/padll/<uid>, the user's own directory for the job's files (see the top). */
static void make_user_directory(uid_t uid, gid_t gid)
{
    char path[32];
    snprintf(path, sizeof path, "/dev/shm/padll/%u", (unsigned)uid);
    const char *failed = path, *why = NULL;
    int node = -1, user = -1;
    struct stat st;
    int shm = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (shm < 0 || fstat(shm, &st) != 0)
        failed = "/dev/shm";
    else if (st.st_uid != 0) {
        failed = "/dev/shm";
        why = "not owned by root";
    } else if ((node = make_directory(shm, "padll", 0, 0, 0711)) < 0)
        failed = "/dev/shm/padll";
    else
        user = make_directory(node, path + strlen("/dev/shm/padll/"), uid, gid, 0700);
    if (user < 0)
        slurm_error("padll: %s: %s; the job's files stay flat in /dev/shm", failed,
                    why ? why : strerror(errno));
    if (user >= 0)
        close(user);
    if (node >= 0)
        close(node);
    if (shm >= 0)
        close(shm);
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    uid_t uid;
    gid_t gid;
    if (!enabled() || spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
        return 0;
    make_user_directory(uid, gid);
    return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!enabled())
        return 0;
    /* As the job's user: a configuration only root can read is as good as none. */
    const char *unreadable = NULL;
    if (access(library, R_OK) != 0)
        unreadable = library;
    else if (*config && access(config, R_OK) != 0)
        unreadable = config;
    if (unreadable) {
        fprintf(stderr, "padll: %s: %s; this task runs without PADLL I/O control\n",
                unreadable, strerror(errno));
        return 0;
    }
    uint32_t job_id = 0, nodes = 0;
    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_NNODES, &nodes) != ESPANK_SUCCESS) {
        fprintf(stderr, "padll: Slurm did not give the job's id and size; this task runs "
                        "without PADLL I/O control\n");
        return 0;
    }
    char *preload = preload_with_library(sp);
    if (preload == NULL) {
        fprintf(stderr, "padll: LD_PRELOAD is too long; this task runs without PADLL I/O "
                        "control\n");
        return 0;
    }
    char id[16], size[16];
    snprintf(id, sizeof id, "%" PRIu32, job_id);
    snprintf(size, sizeof size, "%" PRIu32, nodes ? nodes : 1);
    /* The library goes last, once everything else is set: a task left half set up
     * runs without it. */
    if (set_env(sp, "PADLL_CONTROLLER", socket_path) || set_env(sp, "PADLL_JOB_ID", id) ||
        set_env(sp, "PADLL_JOB_SIZE", size) ||
        (*config && set_env(sp, "PADLL_CONFIG", config)) ||
        (*controller_uid && set_env(sp, "PADLL_CONTROLLER_UID", controller_uid)))
        return 0;
    set_env(sp, "LD_PRELOAD", preload);
    return 0;
}
