#!/usr/bin/env bash
# Redis store benchmark, side by side in one run on one redis-server:
#  1. redis-benchmark calling a minimal GCRA script by EVALSHA, unpipelined
#     and pipelined 16 deep (the ceilings);
#  2. spillway's Redis store in-process (examples/redis_bench.rs);
#  3. spillway serve on that Redis over HTTP (wrk, random users over 100,000),
#     twice: with its default worker threads (one per core) and with one
#     (`--threads 1`: a single event loop that spins a moment before
#     sleeping while script calls are under way), next to a bare axum
#     server (the HTTP ceiling). Redis is emptied first: the memory part
#     of (2) leaves 1,000,000 states in its buckets.
# 127.0.0.1 only, bounded in time. SPILLWAY_BIN=FILE measures another
# spillway binary, SPILLWAY_THREADS=N sets the first server's worker threads.
# Usage: [ROUNDS=3] scripts/bench-redis.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
secs=${1:-10}
command -v redis-server >/dev/null || scripts/setup.sh
command -v wrk >/dev/null || { echo "install wrk (apt-get install wrk)" >&2; exit 1; }
cargo build --release --locked -q -p spillway --bin spillway && cargo build --release --locked -q --example bare -p spillway-server
cargo build --release --locked -q --example redis_bench -p spillway-redis


start_redis

# The ceiling's script: the least a GCRA decision can do in Redis.
cat > "$work/min.lua" <<'LUA'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
if tat + 10000 - now > 1000000 then return 0 end
redis.call('SET', KEYS[1], string.format('%.0f', tat + 10000), 'PX', 1000)
return 1
LUA
sha=$(redis-cli -p "$rp" SCRIPT LOAD "$(cat "$work/min.lua")")
n=$((secs * 60000))
for depth in 1 16; do
  rps=$(redis-benchmark -p "$rp" -c 50 -n "$n" -r 100000 -P "$depth" -q EVALSHA "$sha" 1 'k:__rand_int__' | tr '\r' '\n' | awk '/requests per second/ {print $(NF-5)}' | tail -1)
  echo "redis-benchmark EVALSHA minimal GCRA, 50 clients, pipeline $depth: $rps/s"
done

target/release/examples/redis_bench "redis://127.0.0.1:$rp" "$secs" 50

bench_rules "$work/rules.yaml" "{ redis: { url: \"redis://127.0.0.1:$rp\", timeout: 200ms } }"
users_load "$work/load.lua"
redis-cli -p "$rp" FLUSHALL >/dev/null
sp=$(free_port); sp1=$(free_port); bp=$(free_port)
RUST_LOG=warn "${SPILLWAY_BIN:-target/release/spillway}" serve --config "$work/rules.yaml" --listen "127.0.0.1:$sp" \
  ${SPILLWAY_THREADS:+--threads "$SPILLWAY_THREADS"} 2>/dev/null &
pid_sp=$!
RUST_LOG=warn "${SPILLWAY_BIN:-target/release/spillway}" serve --config "$work/rules.yaml" --listen "127.0.0.1:$sp1" \
  --threads 1 2>/dev/null &
pid_sp1=$!
target/release/examples/bare "127.0.0.1:$bp" 2>/dev/null &
wait_port "$sp"; wait_port "$sp1"; wait_port "$bp"; sleep 0.5
# 64 connections, and 256: a decision on Redis waits for a script call, so
# a closed loop needs more requests in flight to keep the two CPUs busy
# (the bare server runs as fast at either). The machine's speed drifts
# between runs: ROUNDS interleaved rounds, and the median of each round's
# spillway/bare ratio.
rounds=${ROUNDS:-3}
hz=$(getconf CLK_TCK)
# Microseconds Redis has spent running the decision script so far.
script_usec() { redis-cli -p "$rp" INFO commandstats | tr -d '\r' | awk -F'[=,]' '/^cmdstat_evalsha:/ {print $4}' | grep . || echo 0; }
results="$work/http-results"
for r in $(seq "$rounds"); do
  for conns in 64 256; do
    for name in bare spillway-redis spillway-redis-1t; do
      case $name in
        bare) url="http://127.0.0.1:$bp/"; pid=$pid_sp ;;
        spillway-redis) url="http://127.0.0.1:$sp/v1/check"; pid=$pid_sp ;;
        *) url="http://127.0.0.1:$sp1/v1/check"; pid=$pid_sp1 ;;
      esac
      s0=$(cpu_ticks "$pid"); r0=$(cpu_ticks "$pid_redis"); e0=$(script_usec)
      out=$(wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$work/load.lua" "$url")
      s1=$(cpu_ticks "$pid"); r1=$(cpu_ticks "$pid_redis"); e1=$(script_usec)
      n=$(awk '/requests in/ {print $1}' <<<"$out")
      cpu=""
      if [ "$name" != bare ]; then
        # CPU per request of spillway and of redis-server, and the time
        # Redis spent inside the script per decision.
        cpu=$(awk -v n="$n" -v hz="$hz" -v s="$((s1 - s0))" -v r="$((r1 - r0))" -v e="$((e1 - e0))" \
          'BEGIN {printf " spillway_cpu_us_per_req=%.2f redis_cpu_us_per_req=%.2f script_us_per_decision=%.2f", s/hz*1e6/n, r/hz*1e6/n, e/n}')
      fi
      echo "$name http conns=$conns rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out") p50=$(awk '$1=="50%" {print $2}' <<<"$out") p99=$(awk '$1=="99%" {print $2}' <<<"$out")$cpu non2xx=$(awk '/Non-2xx/ {print $4}' <<<"$out")" | tee -a "$results"
    done
  done
done
for name in spillway-redis spillway-redis-1t; do
  for conns in 64 256; do
    echo "HTTP on Redis / bare, $name, $conns connections: $(ratios_median "$results" "$name http conns=$conns " "bare http conns=$conns ")"
  done
done
