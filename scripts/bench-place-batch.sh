#!/usr/bin/env bash
# The README's batch placement table (policies/README.md, "Benchmark (a batch)"): for
# each size N×M, a seeded batch from `--example place_batch`, then `policies place`
# with each placer under `/usr/bin/time -v` (wall seconds, peak RSS) and a time cap,
# and the answer's spread (targets used, max and mean stripes per target).
#
#   scripts/bench-place-batch.sh [SIZES...]     # default: 1000x1000 10000x1000
#
# PLACERS (default "mcmf:0 mcmf round-robin random"), CAP (seconds, default 300),
# POLICIES (a `policies` binary; default the release build of this tree).
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1000x1000 10000x1000)
read -r -a placers <<< "${PLACERS:-mcmf:0 mcmf round-robin random}"
cap=${CAP:-300}
cargo build --release -q -p policies --bin policies --example place_batch
policies=${POLICIES:-target/release/policies}
example=target/release/examples/place_batch
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
echo "| N × M | placer | seconds | peak RSS (MB) | targets used | max / mean stripes per target |"
echo "|---|---|---:|---:|---:|---:|"
for size in "${sizes[@]}"; do
  n=${size%x*} m=${size#*x}
  "$example" "$n" "$m" > "$work/in.json"
  for placer in "${placers[@]}"; do
    status=0
    /usr/bin/time -v -o "$work/time" timeout "$cap" "$policies" place --placer "$placer" \
      < "$work/in.json" > "$work/out.json" 2> "$work/err" || status=$?
    secs=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; printf "%.3f", s}' "$work/time")
    rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$work/time")
    if [ "$status" -eq 0 ]; then
      spread=$("$example" --spread "$m" < "$work/out.json")
      used=$(sed -E 's/.*targets used ([0-9]+) of.*/\1/' <<< "$spread")
      ratio=$(sed -E 's/.*max ([0-9]+), mean ([0-9.]+), max\/mean ([0-9.]+)/\1 \/ \2 = \3/' <<< "$spread")
    elif [ "$status" -eq 124 ]; then
      used="stopped at ${cap} s" ratio="—"
    else
      used="failed: $(head -c 200 "$work/err")" ratio="—"
    fi
    echo "| ${n} × ${m} | \`${placer}\` | ${secs} | ${rss} | ${used} | ${ratio} |"
  done
done
