#!/usr/bin/env bash
# Rules at scale (issue 36): for each rule count, a generated rules file of
# mixed algorithms, keys, modes and one or two limits (scripts/gen-rules.sh)
# served by the release binary, measuring
#   load_s     seconds from start until /healthz answers,
#   B/rule     RSS over the one-rule server, divided by the rules,
#   reload_ms  the longest a client deciding every 5 ms waited during a
#              SIGHUP reload of the whole file (p50_ms: its median wait),
#   p50, rps   wrk's median latency and rate of POST /v1/check on a rule
#              in the middle of the file (1 connection, keep-alive).
#
# Needs wrk and python3. SPILLWAY_BIN=FILE measures another binary
# (default target/release/spillway, built if missing).
# Usage: scripts/bench-rules.sh [COUNTS...]   (default 1 10000 100000 1000000)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
bin=${SPILLWAY_BIN:-target/release/spillway}
[ -x "$bin" ] || cargo build --release --locked -q --bin spillway
command -v wrk >/dev/null || { echo "install wrk (apt-get install wrk)" >&2; exit 1; }
counts=("$@"); [ ${#counts[@]} -gt 0 ] || counts=(1 10000 100000 1000000)
secs=${SECS:-5}

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# The request rule number $1 of a generated file decides: its route, keys.
body_of() { # i
  local i=$1 m=$(( $1 % 1000 )) method=GET
  [ $(( i % 3 )) -eq 0 ] && method=POST
  echo "{\"api\":\"$method /svc$m/v1/res$i\",\"user\":\"u1\",\"ip\":\"10.0.0.1\",\"headers\":{\"x-api-key\":\"k\"}}"
}

base_rss=
printf '%-9s %8s %8s %10s %8s %10s %10s\n' rules load_s B/rule reload_ms p50_ms p50 rps
for n in "${counts[@]}"; do
  scripts/gen-rules.sh "$n" "$work/rules.yaml"
  port=$(free_port)
  t0=$(date +%s.%N)
  "$bin" serve --config "$work/rules.yaml" --listen "127.0.0.1:$port" >"$work/log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$port/healthz" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$work/log" >&2; exit 1; }
    sleep 0.02
  done
  t1=$(date +%s.%N)
  load=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b-a}')
  sleep 1
  rss=$(rss_kb "$pid")
  [ -n "$base_rss" ] || base_rss=$rss
  per=$(awk -v r="$rss" -v b="$base_rss" -v n="$n" 'BEGIN { if (n > 1) printf "%.0f", (r-b)*1024/n; else print "-" }')
  mid=$(( n / 2 ))
  body=$(body_of "$mid")
  curl -sf -X POST -H 'content-type: application/json' -d "$body" "http://127.0.0.1:$port/v1/check" \
    | grep -q "svc$(( mid % 1000 ))-rule-$mid\"" || { echo "rule $mid did not decide" >&2; exit 1; }
  # A client deciding every 5 ms on its own connection during a reload.
  RELOAD_WATCH=${RELOAD_WATCH:-8} python3 - "$port" "$body" > "$work/waits" <<'PY' &
import http.client, os, sys, time
port, body = int(sys.argv[1]), sys.argv[2]
c = http.client.HTTPConnection("127.0.0.1", port)
waits, end = [], time.time() + float(os.environ["RELOAD_WATCH"])
while time.time() < end:
    t = time.perf_counter()
    c.request("POST", "/v1/check", body, {"content-type": "application/json"})
    r = c.getresponse(); r.read()
    assert r.status in (200, 429), r.status
    waits.append(time.perf_counter() - t)
    time.sleep(0.005)
waits.sort()
print(f"{waits[-1]*1000:.1f} {waits[len(waits)//2]*1000:.2f}")
PY
  watcher=$!
  sleep 1
  kill -HUP "$pid"
  wait "$watcher"
  read -r max_wait p50_wait < "$work/waits"
  printf 'wrk.method="POST"\nwrk.body=[[%s]]\nwrk.headers["Content-Type"]="application/json"\n' "$body" > "$work/one.lua"
  out=$(wrk -t1 -c1 -d"${secs}s" --latency -s "$work/one.lua" "http://127.0.0.1:$port/v1/check")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  printf '%-9s %8s %8s %10s %8s %10s %10s\n' "$n" "$load" "$per" "$max_wait" "$p50_wait" "$p50" "$rps"
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
