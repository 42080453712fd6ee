#!/usr/bin/env bash
# Draws docs/elastic.svg (docs/ELASTIC.md's figure) from the recorded run
# docs/elastic-run.csv. With --record, first builds the release binary and
# records a fresh run: the real `spillway proxy` with a fixed concurrency
# limit set too high, then with the adaptive one, in front of a saturating
# test upstream under the same rising load (about 80 s, 127.0.0.1 only; see
# crates/spillway-testkit/examples/elastic_run.rs).
# Usage: scripts/elastic-plot.sh [--record]
set -euo pipefail
cd "$(dirname "$0")/.."

record=0
case "${1:-}" in
  "") ;;
  --record) record=1 ;;
  *) echo "usage: scripts/elastic-plot.sh [--record]" >&2; exit 2 ;;
esac

csv=docs/elastic-run.csv
svg=docs/elastic.svg
if [ "$record" = 1 ]; then
  cargo build --release --locked -q -p spillway --bin spillway
  cargo run --release --locked -q -p spillway-testkit --example elastic_run -- \
    --spillway target/release/spillway --out "$csv"
fi
[ -f "$csv" ] || { echo "no $csv: record one with scripts/elastic-plot.sh --record" >&2; exit 1; }
cargo run --release --locked -q -p spillway-testkit --example elastic_plot -- \
  --in "$csv" --out "$svg" --target-ms 100 # elastic_run's latency target
echo "wrote $svg from $csv"
