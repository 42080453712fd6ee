#!/usr/bin/env bash
# Checks that each workspace member's rust-version tells the truth:
# - no crate it builds with (normal and build dependencies, transitively, in
#   the resolved graph of Cargo.lock, every target platform) declares a
#   higher rust_version, which would make the member unbuildable on the
#   version it claims;
# - it is not above the installed rustc, which could then not build it.
# Dev-dependencies are left out: they do not reach the crate's users.
set -euo pipefail
cd "$(dirname "$0")/.."

check=$(cat <<'PY'
import json, sys

def parse(v):
    # "1.89", "1.89.0" or "1.96.0-nightly" -> (1, 89, 0)
    parts = v.split("-")[0].split(".")
    return tuple(int(p) for p in parts + ["0"] * (3 - len(parts)))

rustc = sys.argv[1]
meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
problems = []

for member in meta["workspace_members"]:
    pkg = packages[member]
    declared = pkg.get("rust_version")
    if declared is None:
        problems.append(f"{pkg['name']} declares no rust-version")
        continue
    if parse(declared) > parse(rustc):
        problems.append(
            f"{pkg['name']} declares rust-version {declared}, "
            f"above the installed rustc {rustc}, which cannot build it")
    seen, stack = set(), [member]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for dep in nodes[node]["deps"]:
            if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]):
                stack.append(dep["pkg"])
    for dep_id in sorted(seen - {member}):
        dep = packages[dep_id]
        needs = dep.get("rust_version")
        if needs and parse(needs) > parse(declared):
            problems.append(
                f"{pkg['name']} declares rust-version {declared} but depends "
                f"on {dep['name']} {dep['version']}, which needs {needs}")

if problems:
    print("check-msrv: rust-version is not true:", file=sys.stderr)
    for p in problems:
        print("  " + p, file=sys.stderr)
    print("check-msrv: raise [workspace.package] rust-version in Cargo.toml "
          "(and the README's set-up), pin the dependency lower, or install "
          "a newer Rust", file=sys.stderr)
    sys.exit(1)
PY
)

rustc_version=$(rustc --version | awk '{ print $2 }')
cargo metadata --format-version 1 --locked --quiet \
  | python3 -c "$check" "$rustc_version"
