#!/usr/bin/env bash
# Installs what the tests need beyond the Rust toolchain: redis-server
# (Debian package, which brings redis-cli and redis-benchmark) and faketime
# (to run an instance with a skewed clock). Safe to run again: it does
# nothing when everything is there.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v faketime >/dev/null 2>&1 || need+=(faketime)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: please install: ${need[*]} (e.g. with your package manager)" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "setup: installing ${need[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
