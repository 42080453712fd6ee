#!/usr/bin/env bash
# Builds and runs the service with the example rules (or the arguments given,
# e.g. --config my-rules.yaml --listen 0.0.0.0:8080).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --release --locked --bin spillway -- serve "$@"
