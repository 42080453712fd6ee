#!/usr/bin/env bash
# Checks that the library crates could be published: `cargo package` makes
# their .crate files (all together, so each finds the others as if
# they were on crates.io; --no-verify: the test suite builds them anyway),
# then each package is checked for what crates.io shows or requires:
# description, license, readme, keywords, categories, and the README and
# both license texts inside the .crate. --allow-dirty so it also runs on a
# work tree with edits; CI's clean clone is packaged as committed.
set -euo pipefail
cd "$(dirname "$0")/.."

crates=(spillway-core spillway-rules spillway-store spillway-redis spillway-sync spillway-tower spillway-client)

args=()
for c in "${crates[@]}"; do
  args+=(-p "$c")
done
if ! out=$(cargo package --no-verify --allow-dirty --locked --quiet "${args[@]}" 2>&1); then
  echo "$out" >&2
  echo "check-package: cargo package failed for ${crates[*]}" >&2
  exit 1
fi

check=$(cat <<'PY'
import json, re, sys, tarfile, os

meta = json.load(sys.stdin)
wanted = sys.argv[1:]
target = meta["target_directory"]
problems = []
for pkg in meta["packages"]:
    name = pkg["name"]
    if name not in wanted or pkg["id"] not in meta["workspace_members"]:
        continue
    for field in ("description", "license", "readme"):
        if not pkg.get(field):
            problems.append(f"{name}: no {field}")
    if pkg.get("publish") == []:
        problems.append(f"{name}: publish = false")
    keywords = pkg.get("keywords") or []
    if not keywords:
        problems.append(f"{name}: no keywords")
    if len(keywords) > 5:
        problems.append(f"{name}: {len(keywords)} keywords (crates.io takes 5)")
    for k in keywords:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_+-]{0,19}", k):
            problems.append(f"{name}: keyword {k!r} is not one crates.io takes")
    categories = pkg.get("categories") or []
    if not categories or len(categories) > 5:
        problems.append(f"{name}: {len(categories)} categories (1 to 5)")
    crate = os.path.join(target, "package", f"{name}-{pkg['version']}.crate")
    with tarfile.open(crate) as tar:
        files = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    for f in ("README.md", "LICENSE-MIT", "LICENSE-APACHE"):
        if f not in files:
            problems.append(f"{name}: {f} is not in {os.path.basename(crate)}")

if problems:
    print("check-package: not publishable as is:", file=sys.stderr)
    for p in problems:
        print("  " + p, file=sys.stderr)
    sys.exit(1)
PY
)

cargo metadata --format-version 1 --no-deps --locked --quiet \
  | python3 -c "$check" "${crates[@]}"
