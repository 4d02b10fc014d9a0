#!/usr/bin/env bash
# A throwaway MooseFS (one master, one chunkserver, mfsmount) for tests, benchmarks and
# demos. Its daemons listen only inside a network namespace of their own, and the mount
# exists only in a mount namespace of its own: run commands on it with
# `nsenter --target PID --mount CMD…` (PID from the ready line). Everything runs in a
# pid namespace that dies with this script, SIGKILL included; only the base directory
# can remain then (the ready line names it).
set -euo pipefail
SELF=$(readlink -f "$0")

# Inside the namespaces: loopback, fixed address and ports (the namespace is ours alone).
# The chunkserver refuses 127.x, any other address on lo does.
HOST=10.77.0.1
PORT=19500 # +0 metaloggers, +1 chunkservers, +2 clients (mfsmount, mfscli), +3 chunkserver
CLIENT_PORT=$((PORT + 2))
START_TIMEOUT=${MFS_START_TIMEOUT:-60}
COUNTERS=(statfs getattr setattr lookup mkdir rmdir symlink readlink mknod unlink rename link readdir open read write total)

usage() {
  cat <<EOF
usage: scripts/moosefs.sh [start]       start MooseFS and hold it until killed
       scripts/moosefs.sh run -- CMD... start it, run CMD with \$MFS_MOUNT set, stop it
       scripts/moosefs.sh ops PID       the master's operation counters of the mount
       scripts/moosefs.sh --help

start prints one line once the file system is usable, then waits:
  moosefs ready mount=MOUNT pid=PID base=BASE master=$HOST:$CLIENT_PORT
MOUNT exists only in PID's mount namespace: nsenter --target PID --mount CMD...
(/tmp and /dev/shm there are the host's). SIGTERM or SIGINT stop it and remove BASE;
after SIGKILL everything stops too, and the caller removes BASE.

run starts it the same way, runs CMD in its mount namespace with MFS_MOUNT=MOUNT and
MFS_PID=PID in the environment, stops it and exits with CMD's status.

ops prints the master's operation counters of the mount (PID from the ready line),
counted since it came up (exact for its first hour: the master keeps two clock hours):
  ${COUNTERS[*]/%/=N}

Needs root, /dev/fuse, and mfsmaster, mfschunkserver, mfsmount, mfscli,
mfssettrashtime, mfssetgoal (Debian: moosefs-master moosefs-chunkserver moosefs-client
moosefs-cli), unshare, nsenter, setpriv (util-linux) and ip (iproute2).
MFS_START_TIMEOUT: seconds to wait for it to come up (default 60).
EOF
}

die() {
  echo "moosefs.sh: $*" >&2
  exit 1
}

check_machine() {
  local program
  for program in mfsmaster mfschunkserver mfsmount mfscli mfssettrashtime mfssetgoal unshare nsenter setpriv ip; do
    command -v "$program" >/dev/null || die "$program not found on PATH (see --help for the packages)"
  done
  [ "$(id -u)" = 0 ] || die "must run as root (it mounts a FUSE file system and creates namespaces)"
  [ -c /dev/fuse ] || die "no /dev/fuse (load the fuse module, or pass the device to the container)"
  (exec 3<>/dev/fuse) 2>/dev/null || die "cannot open /dev/fuse for reading and writing"
}

# Runs as the pid namespace's init: sets up loopback, configs and daemons in BASE,
# mounts BASE/mnt, writes BASE/ready and sleeps until the namespace is killed.
inside() {
  local base=$1
  ip link set lo up
  ip addr add "$HOST/32" dev lo
  mkdir -p "$base/master" "$base/cs/data" "$base/cs/hdd" "$base/mnt"
  # The daemons run as user mfs: their directories are its own.
  chown mfs:mfs "$base/master" "$base/cs/data" "$base/cs/hdd"
  printf '*\t/\trw,alldirs,admin,maproot=0:0\n' >"$base/exports.cfg"
  : >"$base/topology.cfg"
  printf 'MFSM NEW' >"$base/master/metadata.mfs"
  chown mfs:mfs "$base/master/metadata.mfs"
  cat >"$base/master.cfg" <<EOF
WORKING_USER = mfs
WORKING_GROUP = mfs
SYSLOG_IDENT = mfsmaster-test
DATA_PATH = $base/master
EXPORTS_FILENAME = $base/exports.cfg
TOPOLOGY_FILENAME = $base/topology.cfg
MATOML_LISTEN_HOST = $HOST
MATOML_LISTEN_PORT = $PORT
MATOCS_LISTEN_HOST = $HOST
MATOCS_LISTEN_PORT = $((PORT + 1))
MATOCL_LISTEN_HOST = $HOST
MATOCL_LISTEN_PORT = $CLIENT_PORT
INODE_REUSE_DELAY = 0
EOF
  echo "$base/cs/hdd" >"$base/cs/hdd.cfg"
  cat >"$base/cs/cs.cfg" <<EOF
WORKING_USER = mfs
WORKING_GROUP = mfs
SYSLOG_IDENT = mfschunkserver-test
DATA_PATH = $base/cs/data
HDD_CONF_FILENAME = $base/cs/hdd.cfg
HDD_LEAVE_SPACE_DEFAULT = 64MiB
MASTER_HOST = $HOST
MASTER_PORT = $((PORT + 1))
BIND_HOST = $HOST
CSSERV_LISTEN_HOST = $HOST
CSSERV_LISTEN_PORT = $((PORT + 3))
EOF
  mfsmaster -a -c "$base/master.cfg" start >"$base/master.log" 2>&1 ||
    { tail -5 "$base/master.log" >&2; die "mfsmaster did not start"; }
  mfschunkserver -c "$base/cs/cs.cfg" start >"$base/chunkserver.log" 2>&1 ||
    { tail -5 "$base/chunkserver.log" >&2; die "mfschunkserver did not start"; }
  # mfsioretries: with the default (30) a call blocks minutes when the master is gone.
  mfsmount "$base/mnt" -o "mfsmaster=$HOST,mfsport=$CLIENT_PORT,mfsioretries=3" >"$base/mount.log" 2>&1 ||
    { tail -5 "$base/mount.log" >&2; die "mfsmount did not mount"; }
  # Data written before the chunkserver has registered its disk is lost silently:
  # wait until the master counts its space, then check a write reads back.
  until mfscli -H "$HOST" -P "$CLIENT_PORT" -SCS 2>/dev/null |
    awk -F'\t' '$1 == "chunk servers:" && $11 > 0 { found = 1 } END { exit !found }'; do
    sleep 0.1
  done
  echo probe >"$base/mnt/.probe" && [ "$(cat "$base/mnt/.probe")" = probe ] ||
    die "a write to the new mount did not read back"
  rm "$base/mnt/.probe"
  # Deleted files go at once (no trash), and one copy of each chunk is all one
  # chunkserver can hold.
  mfssettrashtime 0 "$base/mnt" >/dev/null
  mfssetgoal 1 "$base/mnt" >/dev/null
  : >"$base/ready"
  exec sleep infinity
}

# Starts the namespaces in the background; sets HOLDER (the pid to nsenter) and BASE,
# and returns once MooseFS is usable. Exits non-zero if it never is.
start() {
  check_machine
  BASE=$(mktemp -d "${TMPDIR:-/tmp}/moosefs.XXXXXX")
  chmod 755 "$BASE" # the daemons' user must reach its directories
  # pdeathsig: if this script is SIGKILLed, unshare gets SIGKILL too, and with
  # --kill-child takes the pid namespace (every daemon, the mount) with it. No
  # --mount-proc: commands entering only the mount namespace keep a /proc that knows them.
  setpriv --pdeathsig KILL unshare --net --mount --pid --fork --kill-child \
    "$SELF" __inside "$BASE" </dev/null &
  HOLDER=$!
  trap stop EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  local waited=0
  until [ -e "$BASE/ready" ]; do
    kill -0 "$HOLDER" 2>/dev/null || die "MooseFS did not come up"
    [ "$waited" -lt $((START_TIMEOUT * 10)) ] || die "MooseFS not up within ${START_TIMEOUT} s (MFS_START_TIMEOUT)"
    sleep 0.1
    waited=$((waited + 1))
  done
}

stop() {
  kill -KILL "$HOLDER" 2>/dev/null || true
  wait "$HOLDER" 2>/dev/null || true
  # The namespace's processes die just after the holder, the master maybe still writing.
  local tries=0
  until rm -rf "$BASE" 2>/dev/null || [ $((tries += 1)) -ge 50 ]; do sleep 0.1; done
}

ops() {
  local pid=$1 hour
  [[ "$pid" =~ ^[1-9][0-9]*$ ]] || { echo "moosefs.sh ops: '$pid' is not a process id" >&2; exit 2; }
  [ -e "/proc/$pid/ns/net" ] || die "no process $pid"
  # The master keeps each mount's counters of the last (-m 0) and the current (-m 1)
  # clock hour: their sum is everything since the mount while it is under an hour old.
  # Columns after the label, host and mountpoint: the counters, in COUNTERS' order.
  for hour in 0 1; do
    nsenter --target "$pid" --net mfscli -H "$HOST" -P "$CLIENT_PORT" -SMO -m "$hour"
  done | awk -F'\t' -v names="${COUNTERS[*]}" '
      BEGIN { n = split(names, name, " ") }
      /^active mounts, operations:/ { rows++; for (i = 1; i <= n; i++) sum[i] += $(i + 3) }
      END {
        if (!rows) { print "moosefs.sh: the master lists no mount" > "/dev/stderr"; exit 1 }
        for (i = 1; i <= n; i++) printf "%s%s=%d", (i > 1 ? " " : ""), name[i], sum[i]
        print ""
      }'
}

case "${1:-start}" in
  -h | --help) usage ;;
  __inside) inside "$2" ;;
  start)
    [ $# -le 1 ] || { echo "moosefs.sh: start takes no arguments (got '$2'); see --help" >&2; exit 2; }
    start
    echo "moosefs ready mount=$BASE/mnt pid=$HOLDER base=$BASE master=$HOST:$CLIENT_PORT"
    wait "$HOLDER" || true
    die "MooseFS stopped"
    ;;
  run)
    [ "${2:-}" = -- ] && [ $# -ge 3 ] || { echo "moosefs.sh: usage: run -- CMD..." >&2; exit 2; }
    shift 2
    start
    status=0
    MFS_MOUNT=$BASE/mnt MFS_PID=$HOLDER nsenter --target "$HOLDER" --mount --wd="$PWD" -- "$@" || status=$?
    exit "$status"
    ;;
  ops)
    [ $# -eq 2 ] || { echo "moosefs.sh: usage: ops PID" >&2; exit 2; }
    ops "$2"
    ;;
  *)
    echo "moosefs.sh: unknown command '$1'; see --help" >&2
    exit 2
    ;;
esac
