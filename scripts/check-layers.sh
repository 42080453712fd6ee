#!/usr/bin/env bash
# One-way imports, checked (docs/ARCHITECTURE.md, "Layers"):
#
# - in crates/spillway-server, a way in (api/, proxy/, grpc/, admin/, tls/,
#   metrics/) imports neither config/ nor another way in: config/ builds
#   each way in's settings, and app.rs wires them together;
# - spillway-simulate, an offline tool, has no Tokio, hyper, axum, tonic or
#   rustls among its normal dependencies, and no library crate depends on
#   the service or the binary.
#
# Test code (files named tests.rs, folders named tests/, and everything
# after a file's `#[cfg(test)]`) may reach across: a way in's tests may
# build their settings through config/.
#
# `scripts/check-layers.sh --self-test` plants a wrong-way import in a copy
# of the tree and fails unless the check catches it.
set -euo pipefail
cd "$(dirname "$0")/.."

check_imports() {
    python3 - "$1" <<'EOF'
import os, re, sys

root = sys.argv[1]
ways = ["api", "proxy", "grpc", "admin", "tls", "metrics"]
forbidden_for = {w: {"config"} | (set(ways) - {w}) for w in ways}
bad = []


def modules_named(text):
    """Every top-level module a `crate::` path names, grouped imports
    (`crate::{a, b::c}`) included."""
    names = set(re.findall(r"\bcrate::([a-z_][a-z0-9_]*)", text))
    for group in re.findall(r"\bcrate::\{([^}]*)\}", text, re.S):
        for part in group.split(","):
            part = part.strip()
            m = re.match(r"([a-z_][a-z0-9_]*)", part)
            if m and m.group(1) != "self":
                names.add(m.group(1))
    # `super::super::x` from a way in's nested module reaches the crate root.
    return names


for way in ways:
    paths = []
    folder = os.path.join(root, way)
    if os.path.isdir(folder):
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if d != "tests"]
            paths += [os.path.join(dirpath, f) for f in filenames if f.endswith(".rs")]
    if os.path.isfile(folder + ".rs"):
        paths.append(folder + ".rs")
    for path in sorted(paths):
        if os.path.basename(path) == "tests.rs":
            continue
        lines = open(path, encoding="utf-8").read().split("\n")
        code = []
        skipping = False  # inside the item after `#[cfg(test)]`
        depth = 0
        for line in lines:
            # Comments and doc links name modules without importing them.
            stripped = re.sub(r"//.*", "", line)
            if stripped.strip().startswith("#[cfg(test)]"):
                skipping, depth = True, 0
                code.append("")
                continue
            if skipping:
                depth += stripped.count("{") - stripped.count("}")
                if depth <= 0 and (";" in stripped or "}" in stripped):
                    skipping = False
                code.append("")
                continue
            code.append(stripped)
        text = "\n".join(code)
        for name in sorted(modules_named(text) & forbidden_for[way]):
            for no, line in enumerate(code, 1):
                if re.search(r"\bcrate::(\{[^}]*\b)?" + name + r"\b", line) or (
                    "crate::{" in line and re.search(r"\b" + name + r"\b", line)
                ):
                    bad.append(f"{path}:{no}: the way in `{way}` imports `{name}`")
                    break
            else:
                bad.append(f"{path}: the way in `{way}` imports `{name}`")

for b in bad:
    print(b, file=sys.stderr)
if bad:
    print(
        "check-layers: ways in import neither config/ nor each other "
        "(docs/ARCHITECTURE.md); move the shared piece to a neutral module "
        "or have config/ build the way in's settings",
        file=sys.stderr,
    )
    sys.exit(1)
EOF
}

check_crates() {
    local deps
    deps=$(cargo tree -p spillway-simulate -e normal --prefix none --locked 2>/dev/null |
        awk '{print $1}' | sort -u)
    for banned in tokio hyper axum tonic rustls spillway-server spillway; do
        if grep -qx "$banned" <<<"$deps"; then
            echo "check-layers: spillway-simulate depends on $banned (an offline tool: core, store and rules only)" >&2
            return 1
        fi
    done
    local lib
    for lib in spillway-core spillway-store spillway-rules spillway-redis spillway-sync \
        spillway-wire spillway-tower spillway-client spillway-simulate; do
        deps=$(cargo tree -p "$lib" -e normal --prefix none --locked 2>/dev/null | awk '{print $1}' | sort -u)
        for banned in spillway-server spillway; do
            if grep -qx "$banned" <<<"$deps"; then
                echo "check-layers: the library $lib depends on $banned" >&2
                return 1
            fi
        done
    done
}

if [[ "${1:-}" == "--self-test" ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cp -r crates/spillway-server/src "$tmp/src"
    check_imports "$tmp/src" || { echo "check-layers self-test: the real tree must pass first" >&2; exit 1; }
    for plant in "use crate::config::Config;" "use crate::{os, proxy::Settings};" "fn f() { crate::grpc::x(); }"; do
        cp crates/spillway-server/src/api/mod.rs "$tmp/src/api/mod.rs"
        printf '%s\n' "$plant" >>"$tmp/src/api/mod.rs"
        if check_imports "$tmp/src" 2>/dev/null; then
            echo "check-layers self-test: a planted \`$plant\` in api/ was not caught" >&2
            exit 1
        fi
    done
    # A test may reach across.
    cp crates/spillway-server/src/api/mod.rs "$tmp/src/api/mod.rs"
    printf '#[cfg(test)]\nmod t { use crate::config::Config; }\n' >>"$tmp/src/api/mod.rs"
    check_imports "$tmp/src" || { echo "check-layers self-test: test code was refused" >&2; exit 1; }
    echo "check-layers self-test: a wrong-way import fails the check"
    exit 0
fi

check_imports crates/spillway-server/src
check_crates
echo "check-layers: imports point one way"
