#!/usr/bin/env bash
# Renders every Kubernetes overlay (deploy/kubernetes/overlays/*) and the
# optional components with `kubectl kustomize`, and validates each object
# against the Kubernetes schemas (kubernetes-validate, pinned in
# scripts/setup.sh; --strict: an unknown field is an error). The
# ServiceMonitor is a CRD: no schema, a warning only. That the rendered
# overlays also run is crates/spillway/tests/it/deploy.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

# The oldest Kubernetes the manifests support (matchLabelKeys in
# topologySpreadConstraints is on by default from 1.27).
version=1.30.0
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
validate() {
  python3 -m kubernetes_validate --strict --quiet -k "$version" "$@"
}
for dir in deploy/kubernetes/overlays/*/ deploy/kubernetes/components/*/; do
  name="$(basename "$dir")"
  kubectl kustomize "$dir" >"$out/$name.yaml"
  validate "$out/$name.yaml"
  echo "check-deploy: $dir renders and validates ($(grep -c '^kind:' "$out/$name.yaml") objects)"
done
