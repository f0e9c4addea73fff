#!/usr/bin/env bash
# Copies the Prometheus Operator CRDs the chart's objects use (PrometheusRule,
# ServiceMonitor, PodMonitor) out of the operator's Go module zip into
# $KUBELOOP_CACHE/crds/prometheus-operator-<version>/ and prints that folder.
# Go's own module download fetches and verifies the zip (set GOSUMDB=off where
# the checksum database is unreachable); the copy is made once per machine and
# version, like tools/build-binaries.sh's groups. Usage: fetch-crds.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${KUBELOOP_CACHE:-$HOME/.cache/kubeloop}
module=github.com/prometheus-operator/prometheus-operator
version=$PROMETHEUS_OPERATOR_VERSION
out="$cache/crds/prometheus-operator-$version"
kinds=(prometheusrules servicemonitors podmonitors)

mkdir -p "$cache/crds"
exec {lock}>"$cache/crds/.prometheus-operator.lock"
flock "$lock"
if [[ ! -f "$out/.complete" ]]; then
  tmp=$(mktemp -d "$cache/crds/.prometheus-operator.XXXXXX")
  # Outside any module, so no go.mod nearby decides what gets resolved.
  dir=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$module@$version" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  for kind in "${kinds[@]}"; do
    # The module cache is read-only; the copies need not be.
    install -m 0644 "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$tmp/"
  done
  touch "$tmp/.complete"
  rm -rf "$out" && mv "$tmp" "$out"
  echo "fetch-crds: prometheus-operator $version CRDs cached in $out" >&2
fi
echo "$out"
