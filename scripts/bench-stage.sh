#!/usr/bin/env bash
# Stage overhead benchmark (release build): wall-clock cost per call in three set-ups
# (native / preloaded-unmanaged / preloaded-managed with a non-limiting channel) at
# 1, 2, 8 and 64 threads, process start-up cost, and — deterministic — user-space
# instructions per call counted by callgrind as the slope between two iteration counts
# (`padll-bench instructions`: unmanaged path calls far from and beside the mountpoint,
# unmanaged fd calls, managed calls; short paths, and path calls at 32, 64, 128 and 256
# bytes; each against its overhead target), and the CPU a
# throttled call costs (`padll-bench throttled`, against the same calls made natively,
# back to back and paced by plain sleeps).
#
#   scripts/bench-stage.sh            # both tables, Markdown, on stdout
#   SKIP_CALLGRIND=1 scripts/bench-stage.sh
#   SKIP_WALLCLOCK=1 scripts/bench-stage.sh   # the instruction table only
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p padll-stage
bench=target/release/padll-bench

if [ -z "${SKIP_WALLCLOCK:-}" ]; then
  echo "## Wall clock (ns per call per thread; Mops/s aggregate)"
  echo
  "$bench"
  echo
  echo "## CPU while throttled (user + system per call; PADLL_BENCH_SECONDS per run)"
  echo
  "$bench" throttled
fi

if [ -n "${SKIP_CALLGRIND:-}" ] || ! command -v valgrind >/dev/null; then
  echo; echo "(callgrind table skipped: ${SKIP_CALLGRIND:+SKIP_CALLGRIND set}$(command -v valgrind >/dev/null || echo 'valgrind not installed'))"
  exit 0
fi

echo
echo "## User-space instructions added per call (callgrind, slope between 2 000 and 12 000 calls; short paths and 32–256-byte paths)"
echo
"$bench" instructions
