#!/usr/bin/env bash
# `make demo`: the local cluster, then the whole xPyD story on it (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/xpyd cluster up | tail -1 > .cluster-env
. ./.cluster-env && rm -f .cluster-env
echo
echo "Nodes by topology:"
.venv/bin/xpyd cluster nodes
echo
echo "The cluster keeps running. Look around with:"
echo "  export KUBECONFIG=$KUBECONFIG PATH=$XPYD_CACHE/bin:\$PATH"
echo "  kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.clique"
echo "Stop it with: make demo-down"
