# Sourced by scripts/bench-realfs.sh and scripts/demo-realfs.sh: a global and a local
# controller on loopback (plaintext), the global sharing MNT:metadata by POLICY with
# `max_rate = "auto"`; the job `victim` has a demand (a QoS reservation) of 5 calls a
# second per file of VICTIM_RATE: what its 4 calls per file need, and a quarter more.
# Needs BIN, OUT, MNT, TARGET_P50_MS, FLOOR, CEILING, POLICY and VICTIM_RATE (BURST_MS,
# the stages' bucket depth, defaults to the controller's 10 ms); sets ADMIN
# and LOCAL (the sockets) and appends the controllers' pids to `pids`.

ADMIN=$OUT/admin.sock
LOCAL=$OUT/local.sock

start_controllers() {
  cat >"$OUT/global.toml" <<TOML
interval_ms = 1000
burst_ms = ${BURST_MS:-10}
[[resource]]
name = "$MNT:metadata"
max_rate = "auto"
target_p50_ms = $TARGET_P50_MS
floor = $FLOOR
ceiling = $CEILING
policy = "$POLICY"
[[job]]
id = "victim"
demand = { "$MNT:metadata" = $((5 * VICTIM_RATE)) }
TOML
  "$BIN/cheferd" global --config "$OUT/global.toml" --listen 127.0.0.1:50551 \
    --admin-socket "$ADMIN" --insecure-plaintext 2>"$OUT/global.log" &
  pids+=($!)
  "$BIN/cheferd" local --node realfs --socket "$LOCAL" --global http://127.0.0.1:50551 \
    --insecure-plaintext 2>"$OUT/local.log" &
  pids+=($!)
  local _
  for _ in $(seq 100); do
    [ -S "$ADMIN" ] && [ -S "$LOCAL" ] && return
    sleep 0.1
  done
  echo "the controllers did not start (see $OUT/global.log, $OUT/local.log)" >&2
  exit 1
}

stop_all() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
