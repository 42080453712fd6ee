#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: set-up; the repository's
# own checks (no tracked file over 1 MiB, rust-version true, library crates
# packageable, docs/openapi.yaml valid, no unused dependency); formatting,
# lints, docs, and every test.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
scripts/check-tree.sh
scripts/check-msrv.sh
scripts/check-package.sh
scripts/check-openapi.sh
scripts/check-layers.sh --self-test
scripts/check-layers.sh
scripts/check-deps.sh
scripts/check-deploy.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
RUSTDOCFLAGS="-D warnings" cargo doc -p spillway-client --all-features --no-deps --locked
# The adversarial matrix times a legitimate client's answers under
# attack: it runs after the rest, alone, so its servers never share the
# cores with another test's load (only with the attacks, and whatever
# else the machine runs).
cargo test --workspace --locked -- --skip adversarial::matrix::
cargo test -p spillway --test it --locked -- adversarial::matrix:: --test-threads=1
