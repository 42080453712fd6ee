#!/usr/bin/env bash
# Reverse-proxy benchmark: spillway proxy vs Debian's nginx (one worker,
# limit_req keyed on the API-key header) in front of the same upstream (the
# bare axum example), side by side in one run, 127.0.0.1 only. nginx runs
# twice: as set up by the issue, and with the rate-limit headers spillway
# sends added ("nginx+h", see below).
#  - allow path: random API keys over 100,000, a generous limit: all admitted;
#  - deny path: one API key far over its limit: nearly all rejected (429);
#  - added latency at low load: one connection, upstream direct vs through each proxy.
# Prints requests/s, p50/p99 and proxy CPU microseconds per request.
# Needs wrk and nginx (apt-get install wrk nginx-light).
# spillway runs one worker thread, like nginx's one worker process (set
# SPILLWAY_THREADS=2 for its default on this machine).
# COUNTERS=1 also prints, per request, the proxy's user and kernel cycles
# and epoll_wait calls (perf stat, needs kernel.perf_event_paranoid <= 2),
# how often it went to sleep (voluntary context switches), and wrk's own
# user cycles (on the deny path wrk's core is the bottleneck).
# PATHS=allow (or deny) runs one path only; SPILLWAY_BIN=FILE measures
# another spillway binary (e.g. one built with a different setting).
# Usage: [COUNTERS=1] [PATHS=...] [SPILLWAY_BIN=...] scripts/bench-proxy.sh [SECONDS_PER_RUN] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
secs=${1:-10}
rounds=${2:-2}
threads=${SPILLWAY_THREADS:-1}
echo "spillway worker threads: $threads"
# The machine's two CPUs: the proxy under test on CPU 0, wrk and the
# upstream on CPU 1, so both proxies run alone on a core (unpinned, the
# scheduler now and then put a proxy beside wrk and halved its rate).
# PIN=0 to leave placement to the kernel.
pin_proxy=""; pin_load=""
if [ "${PIN:-1}" != 0 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  pin_proxy="taskset -c 0"; pin_load="taskset -c 1"
fi
command -v wrk >/dev/null || { echo "install wrk" >&2; exit 1; }
command -v nginx >/dev/null || { echo "install nginx (apt-get install nginx-light)" >&2; exit 1; }
cargo build --release --locked -q -p spillway --bin spillway && cargo build --release --locked -q --example bare -p spillway-server
hz=$(getconf CLK_TCK)

up=$(free_port); ng=$(free_port); sp=$(free_port)
$pin_load target/release/examples/bare "127.0.0.1:$up" 2>/dev/null &
pid_up=$!
# nginx twice: as the issue sets it up, and "nginx+h", the same with the
# headers spillway must send (RateLimit-Policy, RateLimit, X-RateLimit-*,
# and on 429 Retry-After and X-RateLimit-Retry-After; static values of the
# same length, nginx cannot compute them). On the deny path wrk's core is
# the bottleneck and parsing a response's head is most of wrk's own work
# per request, so the second shows what the proxies cost apart from the
# bytes the contract asks for.
nginx_conf() { # dir port extra-location-lines
  mkdir -p "$1/logs"
  cat > "$1/nginx.conf" <<NGINX
daemon off;
master_process off;
worker_processes 1;
error_log $1/logs/error.log crit;
pid $1/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $1/body;
  proxy_temp_path $1/proxy;
  limit_req_zone \$http_x_api_key zone=api:32m rate=100r/s;
  limit_req_status 429;
  map \$status \$retry_after { 429 1; default ""; }
  upstream up { server 127.0.0.1:$up; keepalive 64; }
  server {
    listen 127.0.0.1:$2;
    location / {
      limit_req zone=api burst=100 nodelay;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Host \$host;
      proxy_set_header X-Forwarded-Proto \$scheme;
$3
    }
  }
}
NGINX
}
nh=$(free_port)
nginx_conf "$work/ng" "$ng" ""
nginx_conf "$work/nh" "$nh" "      add_header RateLimit-Policy '\"api\";q=100;w=1' always;
      add_header RateLimit '\"api\";r=99;t=1' always;
      add_header X-RateLimit-Limit 100 always;
      add_header X-RateLimit-Remaining 99 always;
      add_header X-RateLimit-Reset 1 always;
      add_header Retry-After \$retry_after always;
      add_header X-RateLimit-Retry-After \$retry_after always;"
$pin_proxy nginx -p "$work/ng" -c "$work/ng/nginx.conf" &
pid_ng=$!
$pin_proxy nginx -p "$work/nh" -c "$work/nh/nginx.conf" &
pid_nh=$!
proxy_rules "$work/rules.yaml" "$up"
RUST_LOG=warn $pin_proxy "${SPILLWAY_BIN:-target/release/spillway}" proxy --config "$work/rules.yaml" --listen "127.0.0.1:$sp" \
  --threads "$threads" 2>/dev/null &
pid_sp=$!
wait_port "$up"; wait_port "$ng"; wait_port "$nh"; wait_port "$sp"

cat > "$work/allow.lua" <<'LUA'
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/api", {["X-Api-Key"] = "k" .. math.random(1, 100000)})
end
LUA
cat > "$work/deny.lua" <<'LUA'
request = function()
  return wrk.format("GET", "/api", {["X-Api-Key"] = "one-key"})
end
LUA

# Voluntary context switches (times the process went to sleep), all threads.
sleeps() { cat /proc/"$1"/task/*/status | awk '/^voluntary_ctxt/ {s+=$2} END {print s}'; }
run() { # name pid port script conns
  local c0; c0=$(cpu_ticks "$2")
  local u0; u0=$(cpu_ticks "$pid_up")
  local v0; v0=$(sleeps "$2")
  if [ -n "${COUNTERS:-}" ]; then
    # perf stat over the whole run: user and kernel cycles, epoll_wait calls.
    perf stat -x, -e cycles:u,cycles:k,syscalls:sys_enter_epoll_wait -p "$2" -o "$work/perf.$2" &
    local perf_pid=$!
  fi
  local wrk_stat=()
  [ -n "${COUNTERS:-}" ] && wrk_stat=(perf stat -x, -e cycles:u -o "$work/perf.wrk" --)
  local out; out=$($pin_load "${wrk_stat[@]}" wrk -t1 -c"$5" -d"${secs}s" --latency -s "$work/$4" "http://127.0.0.1:$3/api")
  local c1; c1=$(cpu_ticks "$2")
  local u1; u1=$(cpu_ticks "$pid_up")
  local v1; v1=$(sleeps "$2")
  local total; total=$(awk '/requests in/ {print $1}' <<<"$out")
  local counters=""
  if [ -n "${COUNTERS:-}" ]; then
    kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true
    counters=" sleeps_per_req=$(awk -v a="$v0" -v b="$v1" -v n="$total" 'BEGIN {printf "%.3f", (b-a)/n}')"
    counters+=$(awk -F, -v n="$total" '
      $3 == "cycles:u" {printf " user_cycles_per_req=%.0f", $1/n}
      $3 == "cycles:k" {printf " kernel_cycles_per_req=%.0f", $1/n}
      $3 ~ /epoll_wait/ {printf " epoll_waits_per_req=%.3f", $1/n}' "$work/perf.$2")
    counters+=$(awk -F, -v n="$total" '$3 == "cycles:u" {printf " wrk_user_cycles_per_req=%.0f", $1/n}' "$work/perf.wrk")
  fi
  local us; us=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" -v n="$total" 'BEGIN {printf "%.1f", (b-a)/hz*1e6/n}')
  local uus; uus=$(awk -v a="$u0" -v b="$u1" -v hz="$hz" -v n="$total" 'BEGIN {printf "%.1f", (b-a)/hz*1e6/n}')
  echo "$1 ${4%.lua} rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out") p50=$(awk '$1=="50%" {print $2}' <<<"$out") p99=$(awk '$1=="99%" {print $2}' <<<"$out") proxy_cpu_us_per_req=$us upstream_cpu_us_per_req=$uus$counters non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")"
}
results="$work/results"
paths=${PATHS:-allow deny}
for r in $(seq "$rounds"); do
  for path in $paths; do
    run nginx "$pid_ng" "$ng" "$path.lua" 64 | tee -a "$results"
    run nginx+h "$pid_nh" "$nh" "$path.lua" 64 | tee -a "$results"
    run spillway "$pid_sp" "$sp" "$path.lua" 64 | tee -a "$results"
  done
done
# The machine's speed drifts between runs; each round's spillway/nginx
# ratio compares runs seconds apart. Medians over the rounds:
ratio() { # path field [baseline]
  paste <(grep "^spillway $1 " "$results" | sed -E "s/.* $2=([^ ]+).*/\1/") \
        <(grep "^${3:-nginx} $1 " "$results" | sed -E "s/.* $2=([^ ]+).*/\1/") |
    awk '{printf "%.3f\n", $1 / $2}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
for path in $paths; do
  echo "$path: spillway/nginx per-round median: rps $(ratio "$path" rps), cpu per request $(ratio "$path" proxy_cpu_us_per_req)"
  echo "$path: spillway/nginx+h (same headers) per-round median: rps $(ratio "$path" rps nginx+h), cpu per request $(ratio "$path" proxy_cpu_us_per_req nginx+h)"
done
direct=$($pin_load wrk -t1 -c1 -d"${secs}s" --latency "http://127.0.0.1:$up/api" | awk '$1=="50%" {print $2}')
echo "direct upstream rps(allow, 64 conns)=$($pin_load wrk -t1 -c64 -d"${secs}s" -s "$work/allow.lua" "http://127.0.0.1:$up/api" | awk '/Requests\/sec/ {print $2}')"
echo "low load (1 connection) p50: direct=$direct nginx=$($pin_load wrk -t1 -c1 -d"${secs}s" --latency -s "$work/allow.lua" "http://127.0.0.1:$ng/api" | awk '$1=="50%" {print $2}') spillway=$($pin_load wrk -t1 -c1 -d"${secs}s" --latency -s "$work/allow.lua" "http://127.0.0.1:$sp/api" | awk '$1=="50%" {print $2}')"
