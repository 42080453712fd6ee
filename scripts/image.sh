#!/usr/bin/env bash
# Builds spillway's image offline with buildah: the Containerfile's final
# stage (`FROM scratch`), filled from a local binary instead of its build
# stage, so no image registry is needed.
#
#   scripts/image.sh [--tag REF]        (default localhost/spillway:dev)
#
# SPILLWAY_BIN=FILE packages that binary (e.g. target/debug/spillway: a
# dynamic build brings exactly the libraries it links); without it, a
# static release build is made first (glibc linked in with
# -C target-feature=+crt-static; honours CARGO_TARGET_DIR; needs no
# network once the crates are fetched). CONTAINERS_CONF defaults to
# deploy/podman/containers.conf. Prints the image's size at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

tag=localhost/spillway:dev
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=${2:?--tag needs a REF}; shift 2 ;;
    --tag=*) tag=${1#--tag=}; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "image.sh: unknown argument $1 (usage: scripts/image.sh [--tag REF])" >&2; exit 2 ;;
  esac
done
if ! command -v buildah >/dev/null 2>&1; then
  echo "image.sh: buildah is missing: run scripts/setup.sh (or apt-get install buildah podman runc catatonit)" >&2
  exit 1
fi
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}"

bin=${SPILLWAY_BIN:-}
if [ -z "$bin" ]; then
  host="$(rustc -vV | sed -n 's/^host: //p')"
  # An explicit --target: RUSTFLAGS reach the binary only, not the build
  # scripts and proc-macros that run on this machine.
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --release --locked -p spillway --target "$host"
  bin="${CARGO_TARGET_DIR:-target}/$host/release/spillway"
fi
[ -x "$bin" ] || { echo "image.sh: $bin is not an executable" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
scripts/image-root.sh "$bin" "$work/rootfs"
# The Containerfile's last stage, copying the laid-out root from here.
sed -n '/^FROM scratch/,$p' Containerfile \
  | sed 's|^COPY --from=build /out/ /|COPY rootfs/ /|' >"$work/Containerfile"
grep -q '^COPY rootfs/ /' "$work/Containerfile" \
  || { echo "image.sh: the Containerfile's final stage no longer copies /out/" >&2; exit 1; }

revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if ! git diff --quiet HEAD 2>/dev/null; then revision="$revision-dirty"; fi
source="$(git remote get-url origin 2>/dev/null || echo unknown)"
buildah bud --quiet --layers=false --timestamp 0 \
  --build-arg "REVISION=$revision" --build-arg "SOURCE=$source" \
  -f "$work/Containerfile" -t "$tag" "$work" >/dev/null
size="$(buildah images --format '{{.Size}}' "$tag" | head -1)"
echo "image.sh: built $tag ($size) from $bin"
