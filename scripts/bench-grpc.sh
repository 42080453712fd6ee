#!/usr/bin/env bash
# gRPC (Envoy rate limit API) load, side by side with the HTTP API, with the
# in-memory store and with Redis, in one run on 127.0.0.1, with one and
# with four descriptors (rules) per call: examples/grpc_load.rs drives
# ShouldRateLimit (remote_address random over 100,000; with four, also
# user over 100,000, tenant over 1,000 and path over 100), wrk drives
# POST /v1/check with the equivalent rules (ip; user, tenant, path). Each
# line also gives the server's CPU time per call (user + system), which
# the shared cores make a steadier figure than the rates.
# Usage: scripts/bench-grpc.sh [SECONDS]   (SPILLWAY_BIN=FILE: another binary)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
secs=${1:-10}
command -v wrk >/dev/null || { echo "install wrk" >&2; exit 1; }
command -v redis-server >/dev/null || scripts/setup.sh
cargo build --release --locked -q -p spillway --bin spillway && cargo build --release --locked -q --example grpc_load -p spillway-server
bin=${SPILLWAY_BIN:-target/release/spillway}
start_redis
users_load "$work/load1.lua" ip 10.0.
cat > "$work/load4.lua" <<'LUA'
math.randomseed(os.time())
request = function()
  local n, m = math.random(0, 99999), math.random(0, 99999)
  local body = string.format('{"ip":"10.0.%d","user":"u%d","descriptors":{"tenant":"t%d","path":"/p%d"}}', n, m, m % 1000, n % 100)
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
LUA
for store in memory redis; do
  if [ "$store" = redis ]; then storeyaml="store: { redis: { url: \"redis://127.0.0.1:$rp\", timeout: 200ms } }"; else storeyaml="store: memory"; fi
  cat > "$work/rules-$store.yaml" <<YAML
$storeyaml
descriptors: [tenant, path]
rules:
  - name: per-ip
    by: ip
    limits:
      - fixed_window: { limit: 1000, window: 1m }
  - name: per-user
    by: user
    limits:
      - fixed_window: { limit: 1000, window: 1m }
  - name: per-tenant
    by: tenant
    limits:
      - fixed_window: { limit: 100000, window: 1m }
  - name: per-path
    by: path
    limits:
      - fixed_window: { limit: 1000000, window: 1m }
domains:
  - domain: bench
    descriptors:
      - key: remote_address
        rate_limit: { unit: minute, requests_per_unit: 1000 }
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 1000 }
      - key: tenant
        rate_limit: { unit: minute, requests_per_unit: 100000 }
      - key: path
        rate_limit: { unit: minute, requests_per_unit: 1000000 }
YAML
  hp=$(free_port); gp=$(free_port)
  RUST_LOG=warn "$bin" serve --config "$work/rules-$store.yaml" --listen "127.0.0.1:$hp" --grpc-listen "127.0.0.1:$gp" 2>/dev/null &
  pid=$!
  wait_port "$hp"; wait_port "$gp"; sleep 0.5
  hz=$(getconf CLK_TCK)
  for n in 1 4; do
    c0=$(cpu_ticks "$pid")
    out=$(target/release/examples/grpc_load "127.0.0.1:$gp" "$secs" 64 4 "$n")
    calls=$(sed -E 's/.*calls_per_s=([0-9]+).*/\1/' <<<"$out")
    cpu=$(( ($(cpu_ticks "$pid") - c0) * 1000000 / hz ))
    echo "[$store] $out server_cpu_us_per_call=$(awk -v c="$cpu" -v n="$calls" -v s="$secs" 'BEGIN { printf "%.1f", c / (n * s) }')"
    c0=$(cpu_ticks "$pid")
    out=$(wrk -t1 -c64 -d"${secs}s" --latency -s "$work/load$n.lua" "http://127.0.0.1:$hp/v1/check")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    cpu=$(( ($(cpu_ticks "$pid") - c0) * 1000000 / hz ))
    echo "[$store] http rules=$n rps=$rps p50=$(awk '$1=="50%" {print $2}' <<<"$out") p99=$(awk '$1=="99%" {print $2}' <<<"$out") server_cpu_us_per_call=$(awk -v c="$cpu" -v n="$rps" -v s="$secs" 'BEGIN { printf "%.1f", c / (n * s) }')"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
