#!/usr/bin/env bash
# Builds the local cluster's binaries from their Go modules into a cache outside the repo,
# skipping any binary already there at the pinned version. Independent builds run in parallel
# (XPYD_BUILD_JOBS, default: one per two cores, at least 2); each prints a line when it starts
# and when it ends with its elapsed time, and a failed build names its module and the fix.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${XPYD_CACHE:-$HOME/.cache/xpyd}
bin=$cache/bin
logs=$cache/build-logs
mkdir -p "$bin" "$logs"
export GOFLAGS=-buildvcs=false GOPATH=${GOPATH:-$cache/gopath} GOCACHE=${GOCACHE:-$cache/go-build}
jobs=${XPYD_BUILD_JOBS:-$(( $(nproc) / 2 > 2 ? $(nproc) / 2 : 2 ))}

KUBE_VERSION=v1.36.3   # pinned: k8s.io/kubernetes, with staging modules v0.36.3 (see go/kube/go.mod)
ETCD_VERSION=v3.6.16   # pinned in go/etcd/go.mod
KWOK_VERSION=v0.7.0
HELM_VERSION=v3.19.0
PROMETHEUS_VERSION=v0.316.0  # Prometheus 3.x; Debian's build omits kubernetes_sd_configs
LWS_VERSION=v0.7.0     # pinned in go/lws/go.mod (a `tool` wrapper: the proxy refuses `go install ...@v0.7.0`)
LWS_CRD=leaderworkerset.x-k8s.io_leaderworkersets.yaml  # copied from the module next to the binaries

command -v go >/dev/null || { echo "build-tools: 'go' not found; install Go >= 1.26 (https://go.dev/dl) and rerun 'make tools'" >&2; exit 2; }

stamp() { echo "$1" > "$bin/.$2.version"; }
fresh() { [ -x "$bin/$1" ] && [ "$(cat "$bin/.$1.version" 2>/dev/null)" = "$2" ] && extras_present "$1"; }
extras_present() { [ "$1" != lws ] || [ -s "$bin/$LWS_CRD" ]; }

v=k8s.io/component-base/version
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
h=helm.sh/helm/v3
# name | stamp | how (wrapper dir, tool:dir:package, or package@version) | ldflags | share of a cold build's minutes on 2 cores
specs=(
  "kube|$KUBE_VERSION|wrapper:kube|-X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z|4"
  "prometheus|$PROMETHEUS_VERSION|github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION||3"
  "etcd|$ETCD_VERSION|wrapper:etcd||1"
  "helm|$HELM_VERSION+k8s$KUBE_VERSION|$h/cmd/helm@$HELM_VERSION|-X $h/internal/version.version=$HELM_VERSION -X $h/internal/version.gitTreeState=clean -X $h/pkg/lint/rules.k8sVersionMajor=1 -X $h/pkg/lint/rules.k8sVersionMinor=$minor -X $h/pkg/chartutil.k8sVersionMajor=1 -X $h/pkg/chartutil.k8sVersionMinor=$minor|1"
  "kwok|$KWOK_VERSION|sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION||1"
  "lws|$LWS_VERSION|tool:lws:sigs.k8s.io/lws/cmd|-X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION|3"
)

lws_crd() { # copies the LeaderWorkerSet CRD from the module the wrapper pins (read-only there) next to the binaries
  local dir
  dir=$(cd "$here/go/lws" && go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [ -n "$dir" ] && install -m 0644 "$dir/config/crd/bases/$LWS_CRD" "$bin/$LWS_CRD"
}

build_one() { # name stamp how ldflags -> builds into $bin, logs to $logs/<name>.log
  local name=$1 version=$2 how=$3 ldflags="-s -w $4"
  if [[ $how == wrapper:* || $how == tool:* ]]; then
    local dir=${how#*:} pkg=.
    [[ $how == tool:* ]] && { pkg=${dir#*:}; dir=${dir%%:*}; }
    (cd "$here/go/$dir" && go build -trimpath -ldflags="$ldflags" -o "$bin/$name.tmp" "$pkg") \
      && mv "$bin/$name.tmp" "$bin/$name" && { [ "$name" != lws ] || lws_crd; }
  else
    local tmp; tmp=$(mktemp -d "$cache/gobin.XXXX")
    GOBIN="$tmp" go install -trimpath -ldflags="$ldflags" "$how" && mv "$tmp/$name" "$bin/$name"
    local rc=$?; rm -rf "$tmp"; return $rc
  fi
}

todo=(); expected=0
for s in "${specs[@]}"; do
  IFS='|' read -r name version how ldflags minutes <<<"$s"
  if fresh "$name" "$version"; then continue; fi
  todo+=("$s"); expected=$(( expected + minutes ))
done
link() { for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do ln -sf kube "$bin/$c"; done; }
if [ ${#todo[@]} -eq 0 ]; then link; echo "$bin"; exit 0; fi

total=${#todo[@]}; t0=$(date +%s)
echo "build-tools: building $total binaries from their Go modules into $bin, $jobs at a time" >&2
echo "build-tools: expect about $expected minutes on 2 idle cores (measured cold: 10-15 min for the first five, about 3 more for lws); later runs reuse the cache" >&2

declare -A ver_of=() name_of=() start_of=() mod_of=()
failed=()
reap() { # waits for one build to end and reports it
  local done_pid rc=0
  wait -n -p done_pid "${!name_of[@]}" || rc=$?
  local name=${name_of[$done_pid]} secs=$(( $(date +%s) - ${start_of[$done_pid]} ))
  unset "name_of[$done_pid]"
  if [ $rc -eq 0 ]; then
    stamp "${ver_of[$name]}" "$name"
    echo "build-tools: [$(( ++finished ))/$total] $name built in ${secs}s (total $(( $(date +%s) - t0 ))s)" >&2
  else
    failed+=("$name")
    echo "build-tools: [$(( ++finished ))/$total] $name FAILED after ${secs}s building ${mod_of[$name]}; last lines of $logs/$name.log:" >&2
    tail -n 15 "$logs/$name.log" | sed 's/^/    /' >&2
  fi
}
finished=0
for s in "${todo[@]}"; do
  IFS='|' read -r name version how ldflags minutes <<<"$s"
  while [ ${#name_of[@]} -ge "$jobs" ]; do reap; done
  echo "build-tools: $name $version: started" >&2
  build_one "$name" "$version" "$how" "$ldflags" >"$logs/$name.log" 2>&1 &
  name_of[$!]=$name; start_of[$!]=$(date +%s); ver_of[$name]=$version
  mod_of[$name]=${how#wrapper:}; [[ $how == wrapper:* ]] && mod_of[$name]="the wrapper module cluster/go/${how#wrapper:}"
  [[ $how == tool:* ]] && { t=${how#tool:}; mod_of[$name]="${t#*:} (tool of the wrapper module cluster/go/${t%%:*})"; }
done
while [ ${#name_of[@]} -gt 0 ]; do reap; done

if [ ${#failed[@]} -gt 0 ]; then
  echo "build-tools: failed: ${failed[*]}. Fix: Go >= 1.26 on PATH (go version), the Go module proxy reachable (go env GOPROXY), and disk space in $cache; then rerun 'make tools' (finished binaries are kept)" >&2
  exit 2
fi
link
echo "build-tools: all $total built in $(( $(date +%s) - t0 ))s" >&2
echo "$bin"
