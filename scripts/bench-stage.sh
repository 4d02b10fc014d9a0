#!/usr/bin/env bash
# Stage overhead benchmark (release build): wall-clock cost per call in three set-ups
# (native / preloaded-unmanaged / preloaded-managed with a non-limiting channel) at
# 1, 2, 8 and 64 threads, process start-up cost, and — deterministic — user-space
# instructions per call counted by callgrind as the slope between two iteration counts.
#
#   scripts/bench-stage.sh            # both tables, Markdown, on stdout
#   SKIP_CALLGRIND=1 scripts/bench-stage.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p padll-stage
bench=target/release/padll-bench
lib=$PWD/target/release/libpadll.so

echo "## Wall clock (ns per call per thread; Mops/s aggregate)"
echo
"$bench"

if [ -n "${SKIP_CALLGRIND:-}" ] || ! command -v valgrind >/dev/null; then
  echo; echo "(callgrind table skipped: ${SKIP_CALLGRIND:+SKIP_CALLGRIND set}$(command -v valgrind >/dev/null || echo 'valgrind not installed'))"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/data"
head -c 1048576 /dev/zero > "$work/data/file"

# Instructions executed by `padll-bench count CALL N` under the given environment.
instructions() {
  env "${@:3}" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    "$bench" count "$1" "$2" "$work/data" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
slope() { # CALL ENV... → instructions per call
  local a b
  a=$(instructions "$1" 2000 "${@:2}")
  b=$(instructions "$1" 12000 "${@:2}")
  echo $(( (b - a) / 10000 ))
}

echo
echo "## User-space instructions per call (callgrind, slope between 2 000 and 12 000 calls)"
echo
echo "| call | native | unmanaged | managed | added unmanaged | added managed |"
echo "|---|---:|---:|---:|---:|---:|"
for call in stat open+close pread4k fstat; do
  n=$(slope "$call" PADLL_BENCH=1)
  u=$(slope "$call" LD_PRELOAD="$lib" PADLL_MOUNTS=/nonexistent/scratch)
  m=$(slope "$call" LD_PRELOAD="$lib" PADLL_MOUNTS="$work/data" PADLL_RULES=all=100G/s)
  echo "| $call | $n | $u | $m | +$((u - n)) | +$((m - n)) |"
done
