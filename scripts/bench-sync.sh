#!/usr/bin/env bash
# The sync modes side by side in one run, one spillway at a time on one
# redis-server: /v1/check requests per second and p99 (wrk, 64
# connections) with the memory store, the per-decision Redis store, and
# the eventual and lease modes; over 10,000 active keys (random users) and
# over one hot key; round trips to Redis per decision (script calls sent:
# INFO commandstats' evalsha and eval calls over the run, exchanges and
# heartbeats included) and the commands Redis ran per decision (INFO
# stats' total_commands_processed, which counts those inside scripts). ROUNDS
# interleaved rounds; the median of each mode's rps / memory's rps.
# 127.0.0.1 only, bounded in time. SPILLWAY_BIN=FILE measures another
# binary. Over-admission against the bounds is measured by the end-to-end
# tests (cargo test -p spillway --test it sync -- --nocapture).
# Usage: [ROUNDS=3] scripts/bench-sync.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
secs=${1:-5}
rounds=${ROUNDS:-3}
command -v redis-server >/dev/null || scripts/setup.sh
command -v wrk >/dev/null || { echo "install wrk (apt-get install wrk)" >&2; exit 1; }
cargo build --release --locked -q --bin spillway -p spillway
bin=${SPILLWAY_BIN:-target/release/spillway}

start_redis
url="redis://127.0.0.1:$rp/0"

# One rules file per mode; the rule is the benchmarks' usual GCRA by user,
# generous enough that most requests are admitted.
store_of() {
  case $1 in
    memory) echo "memory" ;;
    redis) echo "{ redis: { url: \"$url\", timeout: 200ms } }" ;;
    eventual) echo "{ redis: { url: \"$url\", timeout: 200ms, sync: { mode: eventual, interval: 100ms } } }" ;;
    lease) echo "{ redis: { url: \"$url\", timeout: 200ms, sync: { mode: lease, interval: 100ms } } }" ;;
  esac
}
modes="memory redis eventual lease"
for m in $modes; do
  cat > "$work/$m.yaml" <<YAML
store: $(store_of "$m")
rules:
  - name: bench
    by: user
    limits:
      - gcra: { rate: 100000/1s, burst: 100000 }
YAML
done

# 10,000 active keys, and one hot key.
cat > "$work/keys.lua" <<'LUA'
math.randomseed(os.time())
request = function()
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, '{"user":"u' .. math.random(1, 10000) .. '"}')
end
LUA
cat > "$work/hot.lua" <<'LUA'
request = function()
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, '{"user":"hot"}')
end
LUA

hz=$(getconf CLK_TCK)
commands() { redis-cli -p "$rp" INFO stats | tr -d '\r' | awk -F: '/^total_commands_processed:/ {print $2}'; }
calls() { redis-cli -p "$rp" INFO commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_evalsha:|^cmdstat_eval:/ {n += $3} END {print n + 0}'; }
results="$work/results"
for r in $(seq "$rounds"); do
  for load in keys hot; do
    for m in $modes; do
      redis-cli -p "$rp" FLUSHALL >/dev/null
      sp=$(free_port)
      RUST_LOG=warn "$bin" serve --config "$work/$m.yaml" --listen "127.0.0.1:$sp" 2>/dev/null &
      pid=$!
      wait_port "$sp"
      # Warm up: the keys' first leases and exchanges, the connections.
      wrk -t1 -c64 -d1s -s "$work/$load.lua" "http://127.0.0.1:$sp/v1/check" >/dev/null
      c0=$(commands); k0=$(calls); s0=$(cpu_ticks "$pid"); r0=$(cpu_ticks "$pid_redis")
      out=$(wrk -t1 -c64 -d"${secs}s" --latency -s "$work/$load.lua" "http://127.0.0.1:$sp/v1/check")
      c1=$(commands); k1=$(calls); s1=$(cpu_ticks "$pid"); r1=$(cpu_ticks "$pid_redis")
      kill "$pid"; wait "$pid" 2>/dev/null || true
      n=$(awk '/requests in/ {print $1}' <<<"$out")
      per=$(awk -v c="$((c1 - c0))" -v n="$n" 'BEGIN {printf "%.4f", (n > 0 ? c / n : 0)}')
      trips=$(awk -v c="$((k1 - k0))" -v n="$n" 'BEGIN {printf "%.5f", (n > 0 ? c / n : 0)}')
      # CPU per decision of spillway and of redis-server: on this 2-core
      # machine they share the cores with wrk, so Redis's work costs
      # decisions per second even when no decision waits for it.
      cpu=$(awk -v n="$n" -v hz="$hz" -v s="$((s1 - s0))" -v r="$((r1 - r0))" \
        'BEGIN {printf "spillway_cpu_us=%.2f redis_cpu_us=%.2f", s/hz*1e6/n, r/hz*1e6/n}')
      echo "$m $load rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out") p50=$(awk '$1=="50%" {print $2}' <<<"$out") p99=$(awk '$1=="99%" {print $2}' <<<"$out") round_trips_per_decision=$trips redis_commands_per_decision=$per $cpu non2xx=$(awk '/Non-2xx/ {print $4}' <<<"$out")" | tee -a "$results"
    done
  done
done
for load in keys hot; do
  for m in redis eventual lease; do
    echo "$m / memory, $load: $(ratios_median "$results" "$m $load " "memory $load ")"
  done
done
