#!/usr/bin/env bash
# A/B of spillway builds or flags on the Redis store: one redis-server,
# several `spillway serve` variants on it plus the bare axum server,
# alternated under wrk (random users over 100,000, one GCRA rule), so each
# round compares them minutes apart at most. 127.0.0.1 only.
# Prints per round each variant's rate, its ratio to the bare server's
# and its CPU per request, then each variant's per-round median ratio.
# Usage: scripts/ab-redis.sh CONNS SECONDS ROUNDS 'NAME=BINARY [FLAGS...]'...
#   e.g. scripts/ab-redis.sh 256 2 10 'old=/tmp/spillway-old --threads 1' \
#          'new=target/release/spillway --threads 1'
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
[ $# -ge 4 ] || { sed -n 2,10p "$0" >&2; exit 2; }
conns=$1 secs=$2 rounds=$3; shift 3
hz=$(getconf CLK_TCK)
command -v redis-server >/dev/null || scripts/setup.sh
command -v wrk >/dev/null || { echo "install wrk (apt-get install wrk)" >&2; exit 1; }
cargo build --release --locked -q --example bare -p spillway-server
start_redis
bench_rules "$work/rules.yaml" "{ redis: { url: \"redis://127.0.0.1:$rp\", timeout: 200ms } }"
users_load "$work/load.lua"
declare -A port pid url
names=(bare)
bp=$(free_port)
target/release/examples/bare "127.0.0.1:$bp" 2>/dev/null &
pid[bare]=$!; port[bare]=$bp; url[bare]="http://127.0.0.1:$bp/"
for v in "$@"; do
  name=${v%%=*}
  read -r -a cmd <<<"${v#*=}"
  p=$(free_port)
  RUST_LOG=warn "${cmd[0]}" serve "${cmd[@]:1}" --config "$work/rules.yaml" --listen "127.0.0.1:$p" 2>/dev/null &
  pid[$name]=$!; port[$name]=$p; url[$name]="http://127.0.0.1:$p/v1/check"
  names+=("$name")
done
for n in "${names[@]}"; do wait_port "${port[$n]}"; done
sleep 0.3
results="$work/results"
for r in $(seq "$rounds"); do
  line="round $r"
  for n in "${names[@]}"; do
    c0=$(cpu_ticks "${pid[$n]}")
    out=$(wrk -t1 -c"$conns" -d"${secs}s" -s "$work/load.lua" "${url[$n]}")
    c1=$(cpu_ticks "${pid[$n]}")
    total=$(awk '/requests in/ {print $1}' <<<"$out")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    [ "$n" = bare ] && bare=$rps
    cpu=$(awk -v t="$((c1 - c0))" -v n="$total" -v hz="$hz" 'BEGIN {printf "%.2f", t/hz*1e6/n}')
    ratio=$(awk -v a="$rps" -v b="$bare" 'BEGIN {printf "%.3f", a/b}')
    echo "$n $ratio" >> "$results"
    line+=" $n=${rps%.*}/s ratio=$ratio cpu_us=$cpu"
  done
  echo "$line"
done
for n in "${names[@]:1}"; do
  echo "$n per-round median ratio to bare: $(awk -v n="$n" '$1 == n {print $2}' "$results" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
done
