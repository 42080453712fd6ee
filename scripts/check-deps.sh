#!/usr/bin/env bash
# No crate declares a dependency its code does not use (issue 35:
# spillway-server carried tracing-subscriber, form_urlencoded, and others
# theirs, long after the code stopped naming them). cargo-machete, installed
# by scripts/setup.sh, reads every crate's sources for each dependency it
# declares. A false positive (a crate used only through a macro's
# expansion, say) goes in that crate's manifest, with the reason:
#
#   [package.metadata.cargo-machete]
#   ignored = ["name"]   # why
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo machete --version >/dev/null 2>&1; then
  echo "check-deps: cargo-machete is not installed: run scripts/setup.sh" >&2
  exit 1
fi
if ! out=$(cargo machete 2>&1); then
  echo "$out" >&2
  echo "check-deps: unused dependencies (above): remove them, or list a false positive under [package.metadata.cargo-machete]" >&2
  exit 1
fi
echo "check-deps: every declared dependency is used"
