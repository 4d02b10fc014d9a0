# Sourced by scripts/bench-realfs.sh and scripts/demo-realfs.sh (from the repository's
# root): the settings both take from the environment, their defaults and checks (a bad
# one is named in one line, exit 2), and the binaries and load they run.

STORM=${STORM:-4}
VICTIM_RATE=${VICTIM_RATE:-500}
TARGET_P50_MS=${TARGET_P50_MS:-0.2}
FLOOR=${FLOOR:-500}
CEILING=${CEILING:-30000}
POLICY=${POLICY:-psfa}
export STORM VICTIM_RATE TARGET_P50_MS FLOOR CEILING POLICY
BIN=$PWD/target/release
LOAD=$PWD/scripts/realfs/metadata-load.py

# Checks the shared settings and those named (whole numbers ≥ 1); `$1` names the script.
check_settings() {
  local script=$1 name
  shift
  for name in STORM VICTIM_RATE FLOOR CEILING "$@"; do
    [[ ${!name} =~ ^[1-9][0-9]*$ ]] || { echo "$script: $name must be a whole number ≥ 1, got '${!name}'" >&2; exit 2; }
  done
  [[ $TARGET_P50_MS =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "$script: TARGET_P50_MS must be a number of ms, got '$TARGET_P50_MS'" >&2; exit 2; }
  command -v python3 >/dev/null || { echo "$script: python3 not found" >&2; exit 1; }
}

# Builds the release binaries into BIN; where cargo is not on PATH (sudo's secure_path
# drops ~/.cargo/bin) takes those already built, or says to build first; `$1` names the
# script.
build_release() {
  if command -v cargo >/dev/null; then
    cargo build --release -q -p padll-stage -p cheferd-controller --bins
    cargo build --release -q -p padll-stage --lib
    return
  fi
  local file
  for file in "$BIN/padll" "$BIN/cheferd" "$(ls "$BIN/libpadll.so" "$BIN/deps/libpadll.so" 2>/dev/null | head -n 1)"; do
    [ -f "$file" ] || { echo "$1: ${file:-$BIN/libpadll.so} is missing and there is no cargo on PATH to build it (sudo drops ~/.cargo/bin): run \`cargo build --release\` first, without sudo" >&2; exit 2; }
  done
}
