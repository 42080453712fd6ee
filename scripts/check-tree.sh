#!/usr/bin/env bash
# Fails when a tracked file is over 1 MiB, naming each one. Sizes are read
# from the index's blobs (git cat-file), not the work tree, so the check sees
# what is committed and works the same in a fresh clone. Submodules (mode
# 160000) have no blob and are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=$((1024 * 1024))

big=$(git ls-files --stage \
  | awk '$1 != "160000" { sha = $2; sub(/^[^\t]*\t/, ""); print sha " " $0 }' \
  | git cat-file --batch-check='%(objectsize) %(rest)' \
  | awk -v limit="$limit" '$1 > limit')

if [ -n "$big" ]; then
  echo "check-tree: tracked files over 1 MiB (bytes path):" >&2
  echo "$big" | sed 's/^/  /' >&2
  echo "check-tree: remove them (git rm) or keep them outside the repository" >&2
  exit 1
fi

# The service, the wire layer and simulate keep each source file short
# enough to read whole: at most 700 lines, tests (tests.rs files and
# tests/ folders) aside. Split by concern when one grows past it.
long=$(git ls-files 'crates/spillway-server/src/*.rs' 'crates/spillway-wire/src/*.rs' \
    'crates/spillway-simulate/src/*.rs' | grep -v -e '/tests\.rs$' -e '/tests/' |
  while read -r f; do n=$(wc -l <"$f"); [ "$n" -gt 700 ] && echo "$n $f"; done || true)
if [ -n "$long" ]; then
  echo "check-tree: source files over 700 lines (lines path):" >&2
  echo "$long" | sed 's/^/  /' >&2
  exit 1
fi
