#!/usr/bin/env bash
# The Redis store's over-limit cache: a workload where 90 % of calls hit
# keys already over their limit, with the cache off and on, in one run on
# one redis-server on 127.0.0.1 (examples/over_limit_bench.rs): decisions
# per second, script calls (round trips) per decision, and the share the
# cache answered. Bounded in time.
# Usage: scripts/bench-over-limit.sh [SECONDS] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
secs=${1:-5}
conc=${2:-32}
command -v redis-server >/dev/null || scripts/setup.sh
cargo build --release --locked -q --example over_limit_bench -p spillway-redis
start_redis
echo "commit $(git rev-parse --short HEAD), $secs s each, $conc tasks"
target/release/examples/over_limit_bench "redis://127.0.0.1:$rp/0" "$secs" "$conc"
