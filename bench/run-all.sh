#!/usr/bin/env bash
# `make bench`: every benchmark, one after the other; results land in bench/results/.
# The operator benchmark needs a cluster: it uses KUBECONFIG, else brings the local one up.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
.venv/bin/pip install -q -e '.[bench]'   # sglang-router and vllm-router, the router baselines
$PY bench/emulator/run.py
$PY bench/router/run.py
$PY bench/sim/run.py
$PY bench/autoscaler/azure.py --scale 8
$PY bench/autoscaler/slo_frontier.py
$PY bench/autoscaler/slo_heldout.py
$PY bench/moe/run.py
$PY bench/moe/simulate.py
$PY bench/dp/run.py
$PY bench/dp/live.py --out bench/results/dp-ranks-live.md
$PY bench/router/loop_stall.py --out bench/results/loop-stall.md
$PY bench/router/kv_cost.py --out bench/results/kv-cost.md
$PY bench/cache/run.py
$PY bench/tiers/run.py
$PY bench/tiers/live.py
$PY bench/reliability/real_versions.py --install   # a second vLLM CPU release beside the pinned one
if [ -z "${KUBECONFIG:-}" ]; then eval "$(.venv/bin/xpyd cluster up | tail -1)"; fi
$PY bench/operator/bench_operator.py
$PY bench/reliability/real_upgrade.py --install   # real vLLM pods across two releases (after real_versions.py)
$PY bench/reliability/run.py   # its cluster cases restart the local cluster's components: last
