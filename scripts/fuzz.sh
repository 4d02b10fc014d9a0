#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (see its targets.rs) for MINUTES each
# (default 1) with libFuzzer, and prints per target the executions per second and the
# coverage reached (libFuzzer's final `cov:` and `ft:`), plus any crash it found.
#
#   scripts/fuzz.sh [MINUTES] [TARGET...]
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`); without them
# it says so and exits 0 — CI runs the corpora and a bounded pass through the same
# target bodies with stable (`cargo test -p cheferd-tests fuzz_corpus::`).
# New inputs libFuzzer finds go to a scratch corpus (the committed seeds stay as they
# are; copy a useful one into fuzz/corpus/<target>/ by hand); crashes go to
# fuzz/artifacts/<target>/.
set -u
minutes=${1:-1}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz="$root/fuzz"
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "fuzz.sh: no nightly toolchain (rustup toolchain install nightly); nothing run"
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz not installed (cargo install cargo-fuzz); nothing run"
    exit 0
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cd "$fuzz/fuzz_targets" && ls *.rs | sed 's/\.rs$//')
fi
seconds=$(awk "BEGIN { s = int($minutes * 60); print (s < 1 ? 1 : s) }")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/padll-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cd "$root" || exit 2
cargo +nightly fuzz build -O >/dev/null 2>"$scratch/build.log" || {
    cat "$scratch/build.log"; exit 2; }
failed=0
printf '| target | seconds | runs | execs/s | cov | ft | corpus | result |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---|\n'
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t"
    log="$scratch/$t.log"
    # -rss_limit_mb/-timeout: an input that needs > 2 GiB or > 10 s is a finding.
    cargo +nightly fuzz run -O "$t" "$scratch/$t" "$fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
        -print_final_stats=1 >"$log" 2>&1
    status=$?
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    # The last status line (`#N DONE cov: C ft: F corp: K/…`) holds the final coverage.
    last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1)
    cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.*corp: \([0-9]*\).*/\1/p' <<<"$last")
    if [ $status -eq 0 ]; then
        result=ok
    else
        failed=1
        result="FAILED (exit $status): $(grep -m1 -oE 'artifact_prefix.*|Test unit written to .*' "$log" | tail -1)"
        cp "$log" "$fuzz/artifacts/$t.log" 2>/dev/null || true
    fi
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$seconds" "${runs:-?}" \
        "${speed:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
done
exit $failed
