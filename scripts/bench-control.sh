#!/usr/bin/env bash
# The control cycle at 10 000 nodes, as many runs as asked, every run reported:
# `cheferd-lab bench --locals LOCALS --cycles CYCLES --interval-ms INTERVAL_MS` (release
# build) RUNS times, each on a machine left as it is (`quiet`) and, with LOAD=1, each
# also beside `stress-ng --cpu 1` (one core kept busy: a machine at load ≈ 1 more).
# Prints one Markdown table: run, load, the machine's 1-minute load average before the
# run, then the benchmark's columns for both modes (rules steady, rules changing every
# cycle). Settings (environment): RUNS (5), LOAD (1: both conditions; 0: quiet only),
# LOCALS (10000), CYCLES (10), INTERVAL_MS (1000), RELAYS (0: every local controller
# attached directly; N: through N relays, `--relays N`).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
LOAD=${LOAD:-1}
LOCALS=${LOCALS:-10000}
CYCLES=${CYCLES:-10}
INTERVAL_MS=${INTERVAL_MS:-1000}
RELAYS=${RELAYS:-0}
for setting in RUNS LOCALS CYCLES INTERVAL_MS; do
  [[ ${!setting} =~ ^[1-9][0-9]*$ ]] || { echo "bench-control: $setting='${!setting}' is not a positive whole number" >&2; exit 2; }
done
[[ $RELAYS =~ ^(0|[1-9][0-9]*)$ ]] || { echo "bench-control: RELAYS='$RELAYS' is not a whole number" >&2; exit 2; }
[[ $LOAD == 0 || $LOAD == 1 ]] || { echo "bench-control: LOAD='$LOAD' must be 0 or 1" >&2; exit 2; }
if [[ $LOAD == 1 ]] && ! command -v stress-ng >/dev/null; then
  echo "bench-control: LOAD=1 needs stress-ng (apt-get install stress-ng), or run with LOAD=0" >&2
  exit 2
fi
cargo build --release -q -p cheferd-controller --bin cheferd-lab
lab=target/release/cheferd-lab

stress=
trap '[[ -n $stress ]] && kill "$stress" 2>/dev/null; true' EXIT
conditions=(quiet)
[[ $LOAD == 1 ]] && conditions+=(stress-ng)
header=
for run in $(seq 1 "$RUNS"); do
  for condition in "${conditions[@]}"; do
    if [[ $condition == stress-ng ]]; then
      stress-ng --cpu 1 --quiet &
      stress=$!
      sleep 2
    fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    table=$("$lab" bench --locals "$LOCALS" --relays "$RELAYS" --cycles "$CYCLES" --interval-ms "$INTERVAL_MS")
    if [[ -n $stress ]]; then
      kill "$stress"
      wait "$stress" 2>/dev/null || true
      stress=
    fi
    if [[ -z $header ]]; then
      header=1
      echo "| run | beside | load before |$(sed -n 1p <<<"$table" | cut -c2-)"
      echo "|---:|:---|---:|$(sed -n 2p <<<"$table" | cut -c2-)"
    fi
    tail -n +3 <<<"$table" | sed "s/^|/| $run | $condition | $load |/"
  done
done
