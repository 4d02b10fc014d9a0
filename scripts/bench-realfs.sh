#!/usr/bin/env bash
# Protection of a real shared file system: a victim job doing metadata work at its own
# pace (VICTIM_RATE files a second: create, stat, unlink) beside a storm of STORM
# processes doing the same as fast as they can, on a throwaway MooseFS
# (scripts/moosefs.sh: one metadata server, one chunkserver, the FUSE client), in four
# cases, ROUNDS rounds interleaved:
#   alone   the victim alone;
#   storm   beside the storm;
#   static  the storm under `padll run --limit metadata=STATIC_LIMIT` (job-wide);
#   auto    both jobs under the control plane, Max_R of MOUNT:metadata set by
#           `max_rate = "auto"` to hold the calls' median service time at TARGET_P50_MS.
# Both jobs always run under the stage (`padll run`), so every case pays the same
# interception cost; the victim has no limit of its own. The load is
# scripts/realfs/metadata-load.py (open O_CREAT, close, stat, unlink, each call timed).
#
# Prints a Markdown table of every run: victim calls/s and p50/p99 (the p99 also without
# the victim's first 2 s, when a new job runs on its provisional share), the storm's
# calls/s, the metadata server's own requests/s from `mfscli`. Writes into OUT:
# runs.jsonl, table.md, and per auto round Max_R, service times and the jobs' usage per
# second (auto-<round>.csv) and their plot (auto-<round>.svg).
# Needs root, MooseFS (see scripts/moosefs.sh --help) and python3; builds the release
# binaries first (without cargo on PATH, as under sudo, takes those `cargo build
# --release` made). Settings (environment): ROUNDS (3), CASE_SECONDS (30), STORM (4),
# VICTIM_RATE (500), STATIC_LIMIT (1000/s), TARGET_P50_MS (0.2), FLOOR (500),
# CEILING (30000), POLICY (psfa; the victim's demand is 5 × VICTIM_RATE calls/s),
# OUT (/tmp/padll-realfs-<pid>).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
CASE_SECONDS=${CASE_SECONDS:-30}
STATIC_LIMIT=${STATIC_LIMIT:-1000/s}
export ROUNDS CASE_SECONDS STATIC_LIMIT
source scripts/realfs/settings.sh

if [ "${1:-}" != --inside ]; then
  check_settings bench-realfs.sh ROUNDS CASE_SECONDS
  export OUT=${OUT:-/tmp/padll-realfs-$$}
  mkdir -p "$OUT"
  build_release bench-realfs.sh
  exec scripts/moosefs.sh run -- "$0" --inside
fi

# Inside scripts/moosefs.sh's mount namespace: MFS_MOUNT is the file system.
MNT=$MFS_MOUNT
pids=()
source "$PWD/scripts/realfs/controllers.sh"
trap stop_all EXIT

master_total() { "$PWD/scripts/moosefs.sh" ops "$MFS_PID" | tr ' ' '\n' | sed -n 's/^total=//p'; }

# Runs one case: the victim and, unless alone, the storm; appends one JSON line.
run_case() {
  local case=$1 round=$2
  local victim=(--mount "$MNT" --job victim) storm=(--mount "$MNT" --job storm)
  case $case in
    static) storm+=(--limit "metadata=$STATIC_LIMIT") ;;
    auto)
      victim+=(--controller "$LOCAL")
      storm+=(--controller "$LOCAL")
      ;;
  esac
  mkdir -p "$MNT/victim" "$MNT/storm"
  local before started
  before=$(master_total)
  started=$(date +%s.%N)
  local sampler=
  if [ "$case" = auto ]; then
    python3 "$PWD/scripts/realfs/sample-ctl.py" "$BIN/cheferd" "$ADMIN" "$OUT/auto-$round.csv" &
    sampler=$!
  fi
  local storm_out=$OUT/storm-$case-$round.jsonl
  : >"$storm_out"
  local storm_pid=
  if [ "$case" != alone ]; then
    "$BIN/padll" run "${storm[@]}" -- bash -c \
      "for i in \$(seq $STORM); do python3 '$LOAD' '$MNT/storm' $CASE_SECONDS & done; wait" >"$storm_out" &
    storm_pid=$!
    # The storm runs first for a moment, as a storm would.
    sleep 2
  fi
  local victim_line
  victim_line=$("$BIN/padll" run "${victim[@]}" -- python3 "$LOAD" "$MNT/victim" $((CASE_SECONDS - 4)) "$VICTIM_RATE")
  [ -n "$storm_pid" ] && wait "$storm_pid"
  [ -n "$sampler" ] && { kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true; }
  local after
  after=$(master_total)
  python3 - "$case" "$round" "$victim_line" "$storm_out" "$before" "$after" "$started" "$(date +%s.%N)" <<'EOF' >>"$OUT/runs.jsonl"
import json, sys
case, round_, victim, storm_out, before, after, started, ended = sys.argv[1:]
seconds = float(ended) - float(started)
storm = [json.loads(l) for l in open(storm_out) if l.strip()]
print(json.dumps({
    "case": case, "round": int(round_), "victim": json.loads(victim),
    "storm_calls_per_s": round(sum(s["calls_per_s"] for s in storm), 1),
    "master_requests_per_s": round((int(after) - int(before)) / seconds, 1),
}))
EOF
}

start_controllers
: >"$OUT/runs.jsonl"
for round in $(seq "$ROUNDS"); do
  for case in alone storm static auto; do
    echo "round $round: $case" >&2
    run_case "$case" "$round"
  done
done

python3 - "$OUT" "$STORM" "$STATIC_LIMIT" "$TARGET_P50_MS" <<'EOF' | tee "$OUT/table.md"
import json, sys
out, storm, static, target = sys.argv[1:]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
alone = [r["victim"]["calls_per_s"] for r in runs if r["case"] == "alone"]
base = sum(alone) / len(alone)
names = {"alone": "victim alone", "storm": f"beside the storm ({storm} processes)",
         "static": f"storm under --limit metadata={static}",
         "auto": f"storm and victim under max_rate = \"auto\", target p50 {target} ms"}
print("| case | round | victim calls/s (× alone) | victim p50 | victim p99 (from 2 s) | storm calls/s | metadata server requests/s |")
print("|---|---:|---:|---:|---:|---:|---:|")
for r in runs:
    v = r["victim"]
    storm_rate = f"{r['storm_calls_per_s']:.0f}" if r["case"] != "alone" else "–"
    print(f"| {names[r['case']]} | {r['round']} | {v['calls_per_s']:.0f} ({v['calls_per_s'] / base:.2f}) "
          f"| {v['p50_us']:.0f} µs | {v['p99_us']:.0f} µs ({v['p99_from_2s_us']:.0f} µs) | {storm_rate} "
          f"| {r['master_requests_per_s']:.0f} |")
EOF
for csv in "$OUT"/auto-*.csv; do
  python3 "$PWD/scripts/realfs/plot.py" "$csv" "$TARGET_P50_MS" "${csv%.csv}.svg"
done
echo "runs: $OUT/runs.jsonl; Max_R, service times and usage per second under auto: $OUT/auto-*.csv, plots $OUT/auto-*.svg" >&2
