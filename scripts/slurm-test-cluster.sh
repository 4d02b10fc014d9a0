#!/bin/bash
# A throwaway Slurm (Debian 12's Slurm 22.05 + munge) on this machine for tests, without
# systemd, as root, in about a second; one node, or several slurmd on this host:
#
#   scripts/slurm-test-cluster.sh up BASE [linuxproc|cgroup]
#   export SLURM_CONF=BASE/etc/slurm.conf      # then sbatch, srun, squeue, scontrol work
#   scripts/slurm-test-cluster.sh down BASE
#
# Everything lives in BASE (configuration, state, logs, munge key and socket). `down`
# cancels the cluster's jobs, then stops only the daemons `up` started (by the PIDs it
# recorded) and, in cgroup mode, whatever is left in its nodes' own cgroups.
#
# `cgroup` mode uses proctrack/cgroup: a task's /proc/PID/cgroup then names its job
# (…/slurm_NODE/uid_U/job_N/step_S/… on cgroup v1), which `cheferd local` reads.
#
# Environment (optional):
#   CTLD_PORT, SLURMD_PORT  ports of slurmctld and the first slurmd (default 26817,
#                           26818: not the packaged 6817/6818, so a site's Slurm is left
#                           alone); the k-th slurmd listens on SLURMD_PORT + k - 1
#   NODE                    the node's name for `up` (default padll-test; its cgroups
#                           are slurm_NODE, so a real slurmd's are never touched)
#   NODES                   how many nodes (default 1): NODE, NODE-2, …, NODE-N, each a
#                           slurmd of this host claiming all its CPUs
#   PLUGSTACK               lines for BASE/etc/plugstack.conf (SPANK plugins)
#   FIRST_JOB_ID            the first job's id (default 1); two clusters on one host
#                           given apart ranges never hand out the same job id
# `up` exits 3 when a daemon could not listen on its port (another process took it):
# the caller may try again with other ports.
# Needs: slurmctld slurmd slurm-client munge (Debian packages).
set -euo pipefail

usage() {
  echo "usage: $0 up BASE [linuxproc|cgroup] | down BASE" >&2
  exit 2
}
[ $# -ge 2 ] || usage
ACTION=$1
BASE=$2
MODE=${3:-linuxproc}
# `down` uses the node names `up` recorded.
if [ "$ACTION" = down ] && [ -f "$BASE/run/nodes" ]; then
  read -r -a NAMES <"$BASE/run/nodes"
else
  NAMES=("${NODE:-padll-test}")
  for i in $(seq 2 "${NODES:-1}"); do NAMES+=("${NAMES[0]}-$i"); done
fi
case "$MODE" in linuxproc | cgroup) ;; *) echo "$0: unknown mode '$MODE' (linuxproc or cgroup)" >&2; exit 2 ;; esac

# Stops the daemon whose PID `up` recorded in BASE/run/NAME.bgpid.
stop() {
  local file="$BASE/run/$1.bgpid" pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$file"
}

down() {
  export SLURM_CONF="$BASE/etc/slurm.conf"
  if [ -f "$BASE/run/slurmctld.bgpid" ] && [ -f "$SLURM_CONF" ]; then
    scancel --full --quiet $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    for _ in $(seq 1 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  local name
  for name in "${NAMES[@]}"; do stop "slurmd-$name"; done
  stop slurmctld
  stop munged
  # Job steps (slurmstepd and tasks) outlive slurmd: in cgroup mode they are exactly the
  # processes in its nodes' cgroups. Kill them, then remove the empty cgroups.
  local dir pids
  for dir in $(for name in "${NAMES[@]}"; do echo /sys/fs/cgroup/*/slurm_"$name"; done); do
    [ -d "$dir" ] || continue
    pids=$(find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    for _ in $(seq 1 20); do
      find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [ -d "$dir" ] || break
      sleep 0.1
    done
  done
  echo "slurm test cluster in $BASE stopped"
}

up() {
  local host cpus mem_mb ctld_port slurmd_port key sock t0
  host=$(hostname -s)
  cpus=$(nproc)
  mem_mb=$(($(awk '/^MemTotal:/{print $2}' /proc/meminfo) / 1024 * 9 / 10))
  ctld_port=${CTLD_PORT:-26817}
  slurmd_port=${SLURMD_PORT:-26818}
  t0=$(date +%s.%N)
  if [ -f "$BASE/run/slurmctld.bgpid" ] && kill -0 "$(cat "$BASE/run/slurmctld.bgpid")" 2>/dev/null; then
    echo "$0: a test cluster already runs in $BASE (stop it with: $0 down $BASE)" >&2
    exit 1
  fi
  mkdir -p "$BASE"/{etc,state,log,run} "$BASE"/munge/{etc,run,lib,log}
  for name in "${NAMES[@]}"; do mkdir -p "$BASE/spool/$name"; done
  echo "${NAMES[*]}" >"$BASE/run/nodes"
  # munged refuses key and state directories others can write (or read, for the key).
  chmod 700 "$BASE"/munge/etc "$BASE"/munge/lib "$BASE"/munge/log
  chmod 755 "$BASE" "$BASE"/munge "$BASE"/munge/run

  key="$BASE/munge/etc/munge.key"
  [ -s "$key" ] || mungekey -c -k "$key"
  chmod 400 "$key"
  sock="$BASE/munge/run/munge.sock"
  munged -F --key-file="$key" --socket="$sock" \
    --pid-file="$BASE/munge/run/munged.pid" --seed-file="$BASE/munge/lib/munged.seed" \
    --log-file="$BASE/munge/log/munged.log" >"$BASE/log/munged.out" 2>&1 &
  echo $! >"$BASE/run/munged.bgpid"
  for _ in $(seq 1 50); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || { echo "munged did not start:" >&2; cat "$BASE/log/munged.out" >&2; exit 1; }

  local proctrack task select
  if [ "$MODE" = cgroup ]; then
    proctrack=proctrack/cgroup task=task/cgroup select=CR_Core_Memory
    cat >"$BASE/etc/cgroup.conf" <<EOF
CgroupPlugin=autodetect
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=no
EOF
    # On cgroup v2 Slurm 22.05 asks systemd for its scope unless told not to (only v1
    # was at hand when this was written: the v2 branch is untested).
    if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
      echo "IgnoreSystemd=yes" >>"$BASE/etc/cgroup.conf"
    fi
  else
    proctrack=proctrack/linuxproc task=task/none select=CR_Core
  fi
  # Jobs take 100 MB unless they ask, and up to 4 share a core: a 2-core test machine
  # runs several small jobs at once.
  cat >"$BASE/etc/slurm.conf" <<EOF
ClusterName=padll-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=$proctrack
TaskPlugin=$task
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=$select
DefMemPerCPU=100
FirstJobId=${FIRST_JOB_ID:-1}
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
EOF
  local i=0
  for name in "${NAMES[@]}"; do
    echo "NodeName=$name NodeHostname=$host NodeAddr=127.0.0.1 Port=$((slurmd_port + i)) CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN" >>"$BASE/etc/slurm.conf"
    i=$((i + 1))
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP" >>"$BASE/etc/slurm.conf"
  printf '%s\n' "${PLUGSTACK:-}" >"$BASE/etc/plugstack.conf"

  export SLURM_CONF="$BASE/etc/slurm.conf"
  slurmctld -D -c -f "$SLURM_CONF" >"$BASE/log/slurmctld.out" 2>&1 &
  echo $! >"$BASE/run/slurmctld.bgpid"
  for name in "${NAMES[@]}"; do
    slurmd -D -N "$name" -f "$SLURM_CONF" >"$BASE/log/slurmd-$name.out" 2>&1 &
    echo $! >"$BASE/run/slurmd-$name.bgpid"
  done
  local daemon
  for _ in $(seq 1 300); do
    if [ "$(sinfo -h -N -t idle -o '%N' 2>/dev/null | wc -l)" = "${#NAMES[@]}" ]; then
      echo "slurm test cluster of ${#NAMES[@]} node(s) up in $(awk "BEGIN{print $(date +%s.%N)-$t0}") s ($MODE): export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    for daemon in slurmctld "${NAMES[@]/#/slurmd-}"; do
      kill -0 "$(cat "$BASE/run/$daemon.bgpid")" 2>/dev/null && continue
      tail -n 20 "$BASE/log/$daemon".* >&2 || true
      down >/dev/null
      if grep -qi "address already in use" "$BASE/log/$daemon".*; then
        echo "$0: $daemon could not listen: its port is in use" >&2
        exit 3
      fi
      echo "$0: $daemon exited" >&2
      exit 1
    done
    sleep 0.2
  done
  echo "slurm's nodes did not all become idle within 60 s; logs:" >&2
  tail -n 20 "$BASE"/log/*.out "$BASE"/log/*.log >&2 || true
  down >/dev/null
  exit 1
}

case "$ACTION" in
  up) up ;;
  down) down ;;
  *) usage ;;
esac
