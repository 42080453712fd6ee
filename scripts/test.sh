#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: set-up, repository hygiene,
# formatting, lints, docs, and every test.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
scripts/check-tree.sh
scripts/check-msrv.sh
scripts/check-package.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --locked
