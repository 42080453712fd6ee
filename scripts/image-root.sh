#!/usr/bin/env bash
# Lays out the root filesystem of spillway's image in DIR from the binary
# BIN: what the Containerfile's build stage and scripts/image.sh both
# copy into an empty (`FROM scratch`) final stage, so both ways give the
# same image.
#
#   scripts/image-root.sh BIN DIR
#
# DIR gets /bin/spillway, /bin/ratelimit (a link: started under that name
# it takes envoyproxy/ratelimit's environment), the CA certificates
# (rediss:// and HTTPS upstreams), /etc/passwd and /etc/group naming the
# non-root user 65532, /etc/nsswitch.conf (host names from /etc/hosts,
# then DNS), the example rules and the empty rules file `ratelimit`
# serves beside its Envoy domains. A dynamically linked BIN (a debug
# build) brings exactly the libraries it links, at the paths its loader
# looks them up; a static one (-C target-feature=+crt-static) none.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BIN DIR" >&2
  exit 2
fi
bin=$1
root=$2
here="$(cd "$(dirname "$0")/.." && pwd)"
certs=/etc/ssl/certs/ca-certificates.crt
if [ ! -f "$certs" ]; then
  echo "image-root: no $certs (install Debian's ca-certificates)" >&2
  exit 1
fi

mkdir -p "$root/bin" "$root/etc/ssl/certs" "$root/etc/spillway" "$root/tmp"
chmod 1777 "$root/tmp"
install -m 0755 "$bin" "$root/bin/spillway"
# Debug info out (the release profile keeps line tables; a debug build
# carries far more), symbols kept for backtraces.
if command -v strip >/dev/null 2>&1; then
  strip --strip-debug "$root/bin/spillway"
fi
ln -sf spillway "$root/bin/ratelimit"
install -m 0644 "$certs" "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
install -m 0644 "$here/examples/rules.yaml" "$root/etc/spillway/rules.yaml"
printf '# The rules `ratelimit` (/bin/ratelimit) serves beside its Envoy\n# domains: none (SPILLWAY_CONFIG names another file).\nrules: []\n' \
  >"$root/etc/spillway/ratelimit.yaml"

# A dynamic binary: each library ldd resolves, and the loader, at its
# path. A static one: ldd names none ("statically linked", or an error).
libs="$(ldd "$bin" 2>/dev/null | grep -o '/[^ ]*' | sort -u || true)"
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
