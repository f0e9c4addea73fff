#!/usr/bin/env bash
# Builds the Go binaries of the local platform (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok, helm; kubelet, kube-proxy and
# CoreDNS for the real node; KServe's controller manager; Kubeflow Trainer's and JobSet's;
# prometheus-adapter) from the tools modules
# beside this script into $KUBELOOP_CACHE/bin/<group>-<version>/. Each group is
# built once per machine and version: a finished group carries a .complete
# stamp and is skipped afterwards; two builds of one group wait for each other
# (make test builds CoreDNS in the background while the real node may ask for it). Usage: build-binaries.sh [group...]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${KUBELOOP_CACHE:-$HOME/.cache/kubeloop}
export CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=local

build() {  # build GROUP VERSION MODULE_DIR LDFLAGS PACKAGE...
  local group=$1 version=$2 dir=$3 ldflags=$4; shift 4
  local out="$cache/bin/$group-$version"
  exec {lock}>"$cache/bin/.$group.lock"
  flock "$lock"
  if [[ -f "$out/.complete" ]]; then
    echo "build-binaries: $group $version cached in $out"
    exec {lock}>&-
    return
  fi
  echo "build-binaries: building $group $version into $out (a cold build takes minutes)"
  local tmp
  tmp=$(mktemp -d "$cache/bin/.$group.XXXXXX")
  local start=$SECONDS
  (cd "$here/$dir" && go build -p "$(nproc)" -tags selinux,notest -ldflags "$ldflags" -o "$tmp/" "$@")
  # etcd's main package is go.etcd.io/etcd/server/v3, so go names its binary "server".
  if [[ -f "$tmp/server" ]]; then mv "$tmp/server" "$tmp/etcd"; fi
  touch "$tmp/.complete"
  rm -rf "$out" && mv "$tmp" "$out"
  echo "build-binaries: $group built in $((SECONDS - start)) s"
  exec {lock}>&-
}

kubernetes_ldflags() {
  local v=$KUBERNETES_VERSION major minor
  major=${v#v}; major=${major%%.*}
  minor=${v#v*.}; minor=${minor%%.*}
  local flags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

mkdir -p "$cache/bin"
groups=("$@")
[[ ${#groups[@]} -gt 0 ]] || groups=(kubernetes node kwok helm)
for group in "${groups[@]}"; do
  case $group in
    kubernetes)
      build kubernetes "$KUBERNETES_VERSION" controlplane "$(kubernetes_ldflags)" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3
      ;;
    # The real node's binaries: a group of their own, so adding them left the
    # control plane's cached group valid; they share its build cache.
    node)
      build node "$KUBERNETES_VERSION" controlplane "$(kubernetes_ldflags)" \
        k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
      ;;
    coredns) build coredns "$COREDNS_VERSION" coredns "-s -w" kubeloop.dev/tools/coredns ;;
    kserve) build kserve "$KSERVE_VERSION" kserve "-s -w" github.com/kserve/kserve/cmd/manager ;;
    # One group: the two controllers share Trainer's module graph.
    trainer)
      build trainer "$TRAINER_VERSION" trainer "-s -w" \
        github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager sigs.k8s.io/jobset
      ;;
    prometheus-adapter)
      build prometheus-adapter "$PROMETHEUS_ADAPTER_VERSION" prometheus-adapter "-s -w" \
        sigs.k8s.io/prometheus-adapter/cmd/adapter
      ;;
    kwok) build kwok "$KWOK_VERSION" kwok "-s -w" sigs.k8s.io/kwok/cmd/kwok ;;
    helm)
      build helm "$HELM_VERSION" helm \
        "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" helm.sh/helm/v3/cmd/helm
      ;;
    *) echo "build-binaries: unknown group $group" >&2; exit 2 ;;
  esac
done
