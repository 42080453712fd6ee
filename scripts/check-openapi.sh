#!/usr/bin/env bash
# Checks that docs/openapi.yaml is a valid OpenAPI 3.1 document, with a real
# validator (openapi-spec-validator, which scripts/setup.sh installs): YAML
# that parses is not enough, a plain scalar with a comma inside a flow
# mapping silently becomes extra keys.
set -euo pipefail
cd "$(dirname "$0")/.."
# Looks the module up without importing it (an import takes most of a second).
has_validator='import importlib.util, sys; sys.exit(importlib.util.find_spec("openapi_spec_validator") is None)'

if ! python3 -c "$has_validator"; then
  echo "check-openapi: openapi-spec-validator is missing; run scripts/setup.sh" >&2
  echo "  (or: python3 -m pip install 'openapi-spec-validator>=0.7,<1')" >&2
  exit 1
fi
if ! out=$(python3 -m openapi_spec_validator --schema 3.1 docs/openapi.yaml 2>&1); then
  echo "$out" >&2
  echo "check-openapi: docs/openapi.yaml is not valid OpenAPI 3.1" >&2
  exit 1
fi
