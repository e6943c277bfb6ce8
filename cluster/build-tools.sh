#!/usr/bin/env bash
# Builds the local cluster's binaries from their Go modules into a cache outside the repo,
# skipping any binary that is already there at the pinned version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${XPYD_CACHE:-$HOME/.cache/xpyd}
bin=$cache/bin
mkdir -p "$bin"
export GOFLAGS=-buildvcs=false GOPATH=${GOPATH:-$cache/gopath} GOCACHE=${GOCACHE:-$cache/go-build}

KUBE_VERSION=v1.36.3   # pinned: k8s.io/kubernetes, with staging modules v0.36.3 (see go/kube/go.mod)
ETCD_VERSION=v3.6.16   # pinned in go/etcd/go.mod
KWOK_VERSION=v0.7.0
HELM_VERSION=v3.19.0
PROMETHEUS_VERSION=v0.316.0  # Prometheus 3.x; Debian's build omits kubernetes_sd_configs

stamp() { echo "$1" > "$bin/.$2.version"; }
fresh() { [ -x "$bin/$1" ] && [ "$(cat "$bin/.$1.version" 2>/dev/null)" = "$2" ]; }

build_wrapper() { # name version dir [ldflags]
  local name=$1 version=$2 dir=$3 ldflags="-s -w ${4:-}"
  fresh "$name" "$version" && return 0
  echo "building $name $version (first time takes minutes)" >&2
  (cd "$here/go/$dir" && go build -trimpath -ldflags="$ldflags" -o "$bin/$name.tmp" .)
  mv "$bin/$name.tmp" "$bin/$name"; stamp "$version" "$name"
}

go_install() { # name stamp package@version [ldflags]
  local name=$1 version=$2 pkg=$3 ldflags="-s -w ${4:-}"
  fresh "$name" "$version" && return 0
  echo "building $name $version" >&2
  GOBIN="$bin" go install -trimpath -ldflags="$ldflags" "$pkg"
  stamp "$version" "$name"
}

v=k8s.io/component-base/version
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
build_wrapper kube "$KUBE_VERSION" kube \
  "-X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do ln -sf kube "$bin/$c"; done
build_wrapper etcd "$ETCD_VERSION" etcd
go_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok@"$KWOK_VERSION"
# helm learns the Kubernetes version it templates for (and its own version) from ldflags, as its Makefile does
h=helm.sh/helm/v3
go_install helm "$HELM_VERSION+k8s$KUBE_VERSION" $h/cmd/helm@"$HELM_VERSION" \
  "-X $h/internal/version.version=$HELM_VERSION -X $h/internal/version.gitTreeState=clean \
   -X $h/pkg/lint/rules.k8sVersionMajor=1 -X $h/pkg/lint/rules.k8sVersionMinor=$minor \
   -X $h/pkg/chartutil.k8sVersionMajor=1 -X $h/pkg/chartutil.k8sVersionMinor=$minor"
go_install prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/prometheus@"$PROMETHEUS_VERSION"
echo "$bin"
