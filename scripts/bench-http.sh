#!/usr/bin/env bash
# HTTP load benchmark: spillway's POST /v1/check (GCRA by user, random users
# over 100,000) side by side with (a) a bare axum server that answers without
# parsing (the ceiling) and (b) throttlecrab-server on the same GCRA, one
# after the other in rounds, same load generator, 127.0.0.1 only.
#
# Needs: wrk (Debian package), and for the peer `cargo install
# throttlecrab-server` (set THROTTLECRAB=/path/to/binary, or skip it with
# THROTTLECRAB=none). Prints one line per run and the medians.
#
# SPILLWAY_BIN=FILE measures another spillway binary (e.g. an older build).
# Usage: [SPILLWAY_BIN=...] scripts/bench-http.sh [SECONDS_PER_RUN] [ROUNDS] [CONNECTIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
secs=${1:-10}
rounds=${2:-3}
conns=${3:-64}
command -v wrk >/dev/null || { echo "install wrk (apt-get install wrk)" >&2; exit 1; }
tc=${THROTTLECRAB:-$(command -v throttlecrab-server || echo none)}

cargo build --release --locked -q --bin spillway --example bare


bench_rules "$work/rules.yaml"

# wrk script: random user over 100,000 per request; the body template is
# chosen by the BODY env var (spillway, throttlecrab, bare).
cat > "$work/load.lua" <<'LUA'
local kind = os.getenv("BODY") or "spillway"
math.randomseed(os.time())
request = function()
  local u = math.random(1, 100000)
  local body
  if kind == "throttlecrab" then
    body = '{"key":"u' .. u .. '","max_burst":100,"count_per_period":100,"period":1}'
  else
    body = '{"user":"u' .. u .. '"}'
  end
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
LUA

hz=$(getconf CLK_TCK)

run_one() { # name pid url body
  local name=$1 pid=$2 url=$3 body=$4
  local c0; c0=$(cpu_ticks "$pid")
  local out; out=$(BODY=$body wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$work/load.lua" "$url")
  local c1; c1=$(cpu_ticks "$pid")
  local rps; rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  local p50; p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  local p99; p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  local total; total=$(awk '/requests in/ {print $1}' <<<"$out")
  local cpu; cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN {print (b-a)/hz}')
  local per_cpu; per_cpu=$(awk -v n="$total" -v c="$cpu" 'BEGIN { if (c > 0) printf "%.0f", n/c; else print 0 }')
  local non2xx; non2xx=$(awk '/Non-2xx/ {print $4}' <<<"$out")
  echo "$name rps=$rps p50=$p50 p99=$p99 server_cpu_s=$cpu requests_per_cpu_s=$per_cpu non2xx=${non2xx:-0}"
}


p_sp=$(free_port); p_bare=$(free_port); p_tc=$(free_port)
RUST_LOG=warn "${SPILLWAY_BIN:-target/release/spillway}" serve --config "$work/rules.yaml" --listen "127.0.0.1:$p_sp" 2>/dev/null & pid_sp=$!
target/release/examples/bare "127.0.0.1:$p_bare" 2>/dev/null & pid_bare=$!
pid_tc=""
if [ "$tc" != none ]; then
  "$tc" --http --http-host 127.0.0.1 --http-port "$p_tc" --log-level warn >/dev/null 2>&1 & pid_tc=$!
fi
wait_port "$p_sp"; wait_port "$p_bare"; [ -z "$pid_tc" ] || wait_port "$p_tc"

results="$work/results"
for r in $(seq "$rounds"); do
  run_one bare "$pid_bare" "http://127.0.0.1:$p_bare/" bare | tee -a "$results"
  run_one spillway "$pid_sp" "http://127.0.0.1:$p_sp/v1/check" spillway | tee -a "$results"
  [ -z "$pid_tc" ] || run_one throttlecrab "$pid_tc" "http://127.0.0.1:$p_tc/throttle" throttlecrab | tee -a "$results"
done

echo "--- medians over $rounds rounds (${secs}s each, $conns connections, wrk -t1) ---"
# The machine's speed drifts between runs; a ratio within one round (runs
# seconds apart) drifts less than a ratio of medians.
ratio() { # name base: median over rounds of name's rps / base's rps
  paste <(grep "^$1 " "$results" | sed -E 's/.* rps=([^ ]+).*/\1/') \
        <(grep "^$2 " "$results" | sed -E 's/.* rps=([^ ]+).*/\1/') |
    awk '{printf "%.3f\n", $1 / $2}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
for name in bare spillway throttlecrab; do
  grep "^$name " "$results" >/dev/null 2>&1 || continue
  med() { grep "^$name " "$results" | sed -E "s/.* $1=([^ ]+).*/\1/" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  echo "$name rps=$(med rps) p50=$(med p50) p99=$(med p99) requests_per_cpu_s=$(med requests_per_cpu_s)"
done
echo "spillway/bare per-round median ratio: $(ratio spillway bare)"
grep "^throttlecrab " "$results" >/dev/null 2>&1 &&
  echo "spillway/throttlecrab per-round median ratio: $(ratio spillway throttlecrab)"
