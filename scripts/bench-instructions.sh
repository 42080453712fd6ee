#!/usr/bin/env bash
# Instructions per request of two spillway binaries on the hot paths,
# counted by valgrind's callgrind: unlike requests per second on a shared
# 2-core machine (which drift by 10-20 % between runs of one binary), the
# count is nearly the same from run to run, so a difference of a few
# percent between two builds is visible. Cases as in bench-ab.sh: api,
# proxy-allow, proxy-deny (direct path), hyper-allow, hyper-deny (hyper
# path). Each server runs under callgrind with one worker thread; counting
# starts after a warm-up and covers a fixed wrk run (8 connections). The
# server's total instructions over that run, divided by the requests wrk
# completed, is the figure (the upstream runs outside valgrind).
# Needs valgrind and wrk (apt-get install valgrind wrk).
# Usage: scripts/bench-instructions.sh OLD_BINARY NEW_BINARY [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
old=${1:?usage: bench-instructions.sh OLD NEW [SECONDS]}
new=${2:?usage: bench-instructions.sh OLD NEW [SECONDS]}
secs=${3:-5}
for t in valgrind callgrind_control wrk; do
  command -v "$t" >/dev/null || { echo "install $t (apt-get install valgrind wrk)" >&2; exit 1; }
done
cargo build --release --locked -q --example bare -p spillway-server

up=$(free_port)
target/release/examples/bare "127.0.0.1:$up" 2>/dev/null &
wait_port "$up"
ab_cases "$up"

measure() { # binary case -> prints instructions per request
  local bin=$1 case=$2 port mode=proxy path=/api script="$work/$2.lua"
  [ "$case" = api ] && { mode=api; path=/v1/check; script="$work/api.lua"; }
  port=$(free_port)
  local cfg="$work/proxy.yaml" sub=proxy
  [ "$mode" = api ] && { cfg="$work/api.yaml"; sub=serve; }
  local out="$work/cg.$RANDOM"
  RUST_LOG=warn valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
    "$bin" "$sub" --config "$cfg" --listen "127.0.0.1:$port" --threads 1 2>/dev/null &
  local pid=$!
  for _ in $(seq 300); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  wrk -t1 -c8 -d2s -s "$script" "http://127.0.0.1:$port$path" >/dev/null
  callgrind_control --instr=on "$pid" >/dev/null 2>&1
  local res; res=$(wrk -t1 -c8 -d"${secs}s" -s "$script" "http://127.0.0.1:$port$path")
  callgrind_control --instr=off "$pid" >/dev/null 2>&1
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
  local n; n=$(awk '/requests in/ {print $1}' <<<"$res")
  local ir; ir=$(awk '/^totals:/ {print $2; exit}' "$out")
  awk -v ir="$ir" -v n="$n" 'BEGIN {printf "%.0f", ir / n}'
}

cases="${CASES:-api proxy-allow proxy-deny hyper-allow hyper-deny}"
for case in $cases; do
  o=$(measure "$old" "$case"); n=$(measure "$new" "$case")
  echo "$case instructions_per_request old=$o new=$n new/old=$(awk -v a="$n" -v b="$o" 'BEGIN {printf "%.3f", a / b}')"
done
