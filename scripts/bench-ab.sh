#!/usr/bin/env bash
# Before/after benchmark of two spillway binaries on the hot paths, side by
# side in one run (alternating, same load, 127.0.0.1 only):
#  - api:          POST /v1/check, GCRA by user, random users over 100,000
#                  (the direct path of `spillway serve`);
#  - proxy-allow:  the proxy's direct path, random API keys, all admitted;
#  - proxy-deny:   the proxy's direct path, one API key far over its limit;
#  - hyper-allow / hyper-deny: the same through the proxy's hyper path
#                  (each request carries an empty chunked body, which both
#                  binaries hand to hyper).
# Each binary runs one worker thread on CPU 0; wrk and the upstream (the
# bare axum example) share CPU 1. Prints each run (requests/s, server CPU
# microseconds per request) and, per case, the median over rounds of the
# per-round NEW/OLD ratios.
# Needs wrk (apt-get install wrk).
# Usage: scripts/bench-ab.sh OLD_BINARY NEW_BINARY [SECONDS_PER_RUN] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
old=${1:?usage: bench-ab.sh OLD_BINARY NEW_BINARY [SECONDS] [ROUNDS]}
new=${2:?usage: bench-ab.sh OLD_BINARY NEW_BINARY [SECONDS] [ROUNDS]}
secs=${3:-5}
rounds=${4:-5}
command -v wrk >/dev/null || { echo "install wrk (apt-get install wrk)" >&2; exit 1; }
pin_srv=""; pin_load=""
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  pin_srv="taskset -c 0"; pin_load="taskset -c 1"
fi
cargo build --release --locked -q --example bare -p spillway-server
hz=$(getconf CLK_TCK)

up=$(free_port)
$pin_load target/release/examples/bare "127.0.0.1:$up" 2>/dev/null &
wait_port "$up"

ab_cases "$up"

start() { # binary mode -> sets $port $pid
  port=$(free_port)
  if [ "$2" = api ]; then
    RUST_LOG=warn $pin_srv "$1" serve --config "$work/api.yaml" --listen "127.0.0.1:$port" --threads 1 2>/dev/null &
  else
    RUST_LOG=warn $pin_srv "$1" proxy --config "$work/proxy.yaml" --listen "127.0.0.1:$port" --threads 1 2>/dev/null &
  fi
  pid=$!
  wait_port "$port"
}

run() { # label pid url script
  local c0; c0=$(cpu_ticks "$2")
  local out; out=$($pin_load wrk -t1 -c64 -d"${secs}s" -s "$4" "$3")
  local c1; c1=$(cpu_ticks "$2")
  local total; total=$(awk '/requests in/ {print $1}' <<<"$out")
  local us; us=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" -v n="$total" 'BEGIN {printf "%.2f", (b-a)/hz*1e6/n}')
  echo "$1 rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out") cpu_us_per_req=$us non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")"
}

results="$work/results"
cases="${CASES:-api proxy-allow proxy-deny hyper-allow hyper-deny}"
for r in $(seq "$rounds"); do
  for case in $cases; do
    mode=proxy; url_path=/api
    [ "$case" = api ] && { mode=api; url_path=/v1/check; }
    script="$work/$case.lua"; [ "$case" = api ] && script="$work/api.lua"
    # Alternate which binary goes first, so drift does not favour one.
    order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"
    for which in $order; do
      bin=$old; [ "$which" = new ] && bin=$new
      start "$bin" "$mode"
      run "$case $which" "$pid" "http://127.0.0.1:$port$url_path" "$script" | tee -a "$results"
      kill "$pid"; wait "$pid" 2>/dev/null || true
    done
  done
done

echo "--- per-round NEW/OLD ratios, median over $rounds rounds (${secs}s runs) ---"
for case in $cases; do
  for field in rps cpu_us_per_req; do
    med=$(paste <(grep "^$case new " "$results" | sed -E "s/.* $field=([^ ]+).*/\1/") \
                <(grep "^$case old " "$results" | sed -E "s/.* $field=([^ ]+).*/\1/") |
      awk '{printf "%.3f\n", $1 / $2}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "$case $field new/old: $med"
  done
done
