#!/usr/bin/env bash
# Live: a real shared file system protected by its own health. On a throwaway MooseFS
# (scripts/moosefs.sh: metadata server, chunkserver, FUSE client, in namespaces of
# their own), the control plane shares MOUNT:metadata with `max_rate = "auto"`: a
# victim job does metadata work at its own pace, and after 10 s a storm of STORM
# processes starts doing the same as fast as it can. Every 2 s it prints `cheferd ctl
# jobs` (Max_R moving, the file system's service times against the target, each job's
# usage and share); after SECONDS_TOTAL everything stops, nothing is left behind but
# OUT (the victim's own view, Max_R and usage per second, their plot).
#
# usage: sudo scripts/demo-realfs.sh
# Settings (environment): SECONDS_TOTAL (60), STORM (4), VICTIM_RATE (500 files/s),
# TARGET_P50_MS (0.2), FLOOR (500), CEILING (30000), POLICY (psfa; the victim's demand is
# 5 × VICTIM_RATE calls/s), OUT (/tmp/padll-demo-realfs-<pid>).
# Needs root, MooseFS (scripts/moosefs.sh --help names the packages) and python3;
# builds the release binaries first (without cargo on PATH, as under sudo, takes those
# `cargo build --release` made).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TOTAL=${SECONDS_TOTAL:-60}
export SECONDS_TOTAL
source scripts/realfs/settings.sh

if [ "${1:-}" != --inside ]; then
  case "${1:-}" in
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) echo "demo-realfs.sh: unexpected argument '$1' (settings are environment variables: --help)" >&2; exit 2 ;;
  esac
  check_settings demo-realfs.sh SECONDS_TOTAL
  [ "$SECONDS_TOTAL" -gt 20 ] || { echo "demo-realfs.sh: SECONDS_TOTAL must be above 20 (the storm starts at 10 s), got $SECONDS_TOTAL" >&2; exit 2; }
  export OUT=${OUT:-/tmp/padll-demo-realfs-$$}
  mkdir -p "$OUT"
  echo "building the release binaries…" >&2
  build_release demo-realfs.sh
  echo "starting MooseFS…" >&2
  exec scripts/moosefs.sh run -- "$0" --inside
fi

MNT=$MFS_MOUNT
pids=()
source "$PWD/scripts/realfs/controllers.sh"
trap stop_all EXIT
start_controllers
mkdir -p "$MNT/victim" "$MNT/storm"
python3 "$PWD/scripts/realfs/sample-ctl.py" "$BIN/cheferd" "$ADMIN" "$OUT/auto.csv" &
pids+=($!)
echo "MooseFS at $MNT; $MNT:metadata has max_rate = \"auto\", target p50 $TARGET_P50_MS ms, $FLOOR–$CEILING calls/s"
"$BIN/padll" run --mount "$MNT" --job victim --controller "$LOCAL" -- \
  python3 "$LOAD" "$MNT/victim" "$SECONDS_TOTAL" "$VICTIM_RATE" >"$OUT/victim.json" &
victim=$!
pids+=("$victim")
started=$(date +%s)
storm_started=
while [ $(($(date +%s) - started)) -lt "$SECONDS_TOTAL" ]; do
  sleep 2
  elapsed=$(($(date +%s) - started))
  if [ -z "$storm_started" ] && [ "$elapsed" -ge 10 ]; then
    echo "── t=${elapsed}s: the storm starts ($STORM processes, as fast as they can) ──"
    "$BIN/padll" run --mount "$MNT" --job storm --controller "$LOCAL" -- bash -c \
      "for i in \$(seq $STORM); do python3 '$LOAD' '$MNT/storm' $((SECONDS_TOTAL - elapsed)) & done; wait" \
      >"$OUT/storm.jsonl" &
    storm=$!
    pids+=("$storm")
    storm_started=$elapsed
  fi
  echo "── t=${elapsed}s ──"
  "$BIN/cheferd" ctl --socket "$ADMIN" jobs | sed -n '3,$p'
done
# The loads end on their own; the file system must outlive them.
wait "$victim" 2>/dev/null || true
[ -n "$storm_started" ] && { wait "$storm" 2>/dev/null || true; }
echo
echo "victim (paced at $VICTIM_RATE files/s, 4 calls each): $(cat "$OUT/victim.json")"
python3 "$PWD/scripts/realfs/plot.py" "$OUT/auto.csv" "$TARGET_P50_MS" "$OUT/auto.svg" &&
  echo "Max_R, usage and service times per second: $OUT/auto.csv, plot $OUT/auto.svg"
