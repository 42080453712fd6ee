#!/usr/bin/env bash
# gRPC (Envoy rate limit API) load, side by side with the HTTP API, with the
# in-memory store and with Redis, in one run on 127.0.0.1:
# examples/grpc_load.rs drives ShouldRateLimit (random remote_address over
# 100,000, a fixed window of 1000/minute), wrk drives POST /v1/check with the
# equivalent rule. Usage: scripts/bench-grpc.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
secs=${1:-10}
command -v wrk >/dev/null || { echo "install wrk" >&2; exit 1; }
command -v redis-server >/dev/null || scripts/setup.sh
cargo build --release --locked -q --bin spillway --example grpc_load -p spillway-server
start_redis
users_load "$work/load.lua" ip 10.0.
for store in memory redis; do
  if [ "$store" = redis ]; then storeyaml="store: { redis: { url: \"redis://127.0.0.1:$rp\", timeout: 200ms } }"; else storeyaml="store: memory"; fi
  cat > "$work/rules-$store.yaml" <<YAML
$storeyaml
rules:
  - name: per-ip
    by: ip
    limits:
      - fixed_window: { limit: 1000, window: 1m }
domains:
  - domain: bench
    descriptors:
      - key: remote_address
        rate_limit: { unit: minute, requests_per_unit: 1000 }
YAML
  hp=$(free_port); gp=$(free_port)
  RUST_LOG=warn target/release/spillway serve --config "$work/rules-$store.yaml" --listen "127.0.0.1:$hp" --grpc-listen "127.0.0.1:$gp" 2>/dev/null &
  pid=$!
  wait_port "$hp"; wait_port "$gp"; sleep 0.5
  echo "[$store] $(target/release/examples/grpc_load "127.0.0.1:$gp" "$secs" 64 4)"
  out=$(wrk -t1 -c64 -d"${secs}s" --latency -s "$work/load.lua" "http://127.0.0.1:$hp/v1/check")
  echo "[$store] http rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out") p50=$(awk '$1=="50%" {print $2}' <<<"$out") p99=$(awk '$1=="99%" {print $2}' <<<"$out")"
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
