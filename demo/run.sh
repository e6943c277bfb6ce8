#!/usr/bin/env bash
# `make demo`: the whole xPyD story on the local cluster that `xpyd cluster up` starts.
#   1. cluster up   2. helm install the operator   3. apply an HGX-B200 and a GB200-NVL72 deployment
#   4. show xPyD and placement   5. replay a real trace through the router with a progress bar
#   6. watch the autoscaler's SLO policy (the deployment's spec.slo) resize the pools (and fail unless
#      both grew and shrank back)
#   7. plot replicas and queues from Prometheus   8. check every dashboard query has data
# It leaves everything running and prints how to look around; `make demo-down` cleans up.
# Knobs (environment): DEMO_TRACE (trace to replay, default the repo's Mooncake trace),
# DEMO_PLOT (where the plot goes), DEMO_SHRINK_TIMEOUT (seconds to wait for the shrink, 300).
set -euo pipefail
cd "$(dirname "$0")/.."
export XPYD_CACHE=${XPYD_CACHE:-$HOME/.cache/xpyd}
export PATH="$XPYD_CACHE/bin:$PWD/.venv/bin:$PATH"
NS=xpyd-demo
OP_NS=xpyd-system
DEPLOYMENT=llama-hgx
MODEL=meta-llama/Llama-3.1-70B-Instruct
PROM=${PROMETHEUS_URL:-http://127.0.0.1:9090}
PLOT=${DEMO_PLOT:-$XPYD_CACHE/demo-autoscaling.png}  # never a tracked file (DEMO_PLOT=docs/images/... to refresh the README's)
TRACE=${DEMO_TRACE:-data/traces/conversation_trace.jsonl}
RESULTS=${DEMO_RESULTS:-$XPYD_CACHE/demo-slo.md}  # never a tracked file (DEMO_RESULTS=bench/results/demo-slo.md to refresh)
MANIFEST=examples/demo/hgx-b200-emulated.yaml
read -r SLO_TTFT SLO_ITL _ < <(python demo/results.py --manifest "$MANIFEST" --print-slo)
PHASES=$(mktemp -d)
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
started=$(date +%s)

step "Local cluster (real kube-apiserver, scheduler, controller manager, etcd; kwok nodes; Prometheus)"
eval "$(xpyd cluster up | tail -1)"
xpyd cluster nodes

step "helm install the operator (runs in-cluster under its own ServiceAccount)"
helm upgrade --install xpyd charts/xpyd-operator -n "$OP_NS" --create-namespace --wait --timeout 180s
kubectl -n "$OP_NS" get deploy,pods -o wide

step "kubectl apply two DisaggregatedDeployments of emulated workers"
kubectl apply -f examples/demo/
for dd in $(kubectl -n "$NS" get dd -o name); do
  kubectl -n "$NS" wait "$dd" --for=condition=Ready --timeout=240s
done
kubectl -n "$NS" get dd
kubectl -n "$NS" get dd -o custom-columns='NAME:.metadata.name,XPYD:.status.xpyd,KV PATH:.status.placement.kvPath,CLIQUES:.status.placement.cliques,NODES:.status.placement.nodes'
kubectl -n "$NS" get pods -o wide -L xpyd.io/role

router_ip() { kubectl -n "$NS" get pods -l "xpyd.io/deployment=$1,xpyd.io/role=router" \
  -o jsonpath='{.items[0].status.podIP}'; }
ROUTER=http://$(router_ip "$DEPLOYMENT"):8000
load_start=$(date +%s)

autoscaler() { # the autoscaler's last decision per pool, from status.autoscaler
  kubectl -n "$NS" get dd "$DEPLOYMENT" -o json | python demo/status.py
}
pool_size() { kubectl -n "$NS" get dd "$DEPLOYMENT" -o "jsonpath={.status.$1.readyReplicas}"; }
wait_shrunk() { # seconds: until both pools are back to one ready replica, printing the deployment every 10 s
  local until=$(( $(date +%s) + $1 ))
  while [ "$(date +%s)" -lt "$until" ]; do
    printf '  %s  ' "$(date +%T)"; kubectl -n "$NS" get dd "$DEPLOYMENT" --no-headers
    if [ "$(pool_size prefill)" = 1 ] && [ "$(pool_size decode)" = 1 ]; then return 0; fi
    sleep 10
  done
  echo "the pools did not shrink back to 1P1D within $1 s" >&2; return 1
}

step "Phase 1: long prompts (prefill pressure): the Mooncake conversation trace in real time, through $ROUTER"
xpyd load --url "$ROUTER" --model "$MODEL" --trace "$TRACE" --speedup 1 --max-output-tokens 16 \
  --max-requests 400 --duration 60 --max-in-flight 256 --slo-ttft "$SLO_TTFT" --slo-itl "$SLO_ITL" \
  | tee "$PHASES/phase1.txt"
kubectl -n "$NS" get dd "$DEPLOYMENT"; autoscaler

step "Phase 2: long answers (decode pressure): 8 requests/s of 512-token answers"
xpyd load --url "$ROUTER" --model "$MODEL" --rate 8 --prompt-tokens 256 --output-tokens 512 \
  --max-output-tokens 512 --max-requests 400 --duration 45 --max-in-flight 256 --slo-ttft "$SLO_TTFT" \
  --slo-itl "$SLO_ITL" | tee "$PHASES/phase2.txt"
kubectl -n "$NS" get dd "$DEPLOYMENT"; autoscaler

step "Load stopped: the pools shrink back through the stabilization window"
wait_shrunk "${DEMO_SHRINK_TIMEOUT:-300}"
autoscaler
sleep 5  # one more scrape of the shrunk pools

step "Check from Prometheus: each pool grew under its load and is back to one replica"
python demo/verify.py --prometheus "$PROM" --deployment "$DEPLOYMENT" --since "$load_start"

step "Plot of replicas and queues, read back from Prometheus"
python demo/plot.py --prometheus "$PROM" --deployment "$DEPLOYMENT" --since "$load_start" --out "$PLOT"

step "The SLO the deployment states, as its clients saw it (TTFT <= ${SLO_TTFT} s, ITL <= ${SLO_ITL} s)"
python demo/results.py --manifest "$MANIFEST" --out "$RESULTS" \
  "Phase 1: long prompts (Mooncake trace, the first minute, from 1P1D)=$PHASES/phase1.txt" \
  "Phase 2: long answers (8 req/s, 512 tokens)=$PHASES/phase2.txt" | tail -4
rm -rf "$PHASES"

step "Every Grafana panel's query has data for $DEPLOYMENT (the dashboards ship in the chart)"
PROMETHEUS_URL="$PROM" python -m e2e.dashboards_check --with slo "$NS/$DEPLOYMENT" | tail -3

step "Done in $(( $(date +%s) - started ))s. Everything keeps running; look around:"
cat <<EOT
  export KUBECONFIG=$KUBECONFIG PATH=$XPYD_CACHE/bin:\$PATH
  kubectl -n $NS get dd                      # xPyD, readiness, topology
  kubectl -n $NS describe dd $DEPLOYMENT     # conditions, placement, autoscaler decisions
  curl $ROUTER/v1/models                     # the router (OpenAI API)
  xpyd load --url $ROUTER --model $MODEL --rate 4 --duration 30
  open $PROM                                 # Prometheus (try: vllm:num_requests_waiting)
  plot: $PLOT
  SLO results: $RESULTS
  make demo-down                             # stop everything
EOT
