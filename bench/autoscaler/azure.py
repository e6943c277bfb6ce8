"""Autoscaler benchmark: replay the Azure conversation trace through the simulator under three policies.

    .venv/bin/python bench/autoscaler/azure.py [--scale 4] [--slo-ttft 2] [--slo-itl 0.1]

Runs the xpyd policy and the KEDA-style rule (waiting > 5 per pod) from the spec's starting size,
then static provisioning at the peak (the largest size either autoscaler reached, per pool), and
writes the table to bench/results/autoscaler-azure.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xpyd_sim import trace as traces
from xpyd_sim.engine import SimConfig
from xpyd_sim.metrics import Slo
from xpyd_sim.runner import markdown_table, parse_trace, run_one, variants
from xpyd_sim.spec import load

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ is not installed: import it from the root
from bench.baselines import register

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
SPEC = ROOT / "bench" / "sim" / "llama70b-hgx.yaml"
OUT = ROOT / "bench" / "results" / "autoscaler-azure.md"


def main(argv: list[str]) -> int:
    register()  # the KEDA-style rule beside xpyd's policy
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=int, default=4, help="overlay this many copies of the trace")
    p.add_argument("--slo-ttft", type=float, default=2.0)
    p.add_argument("--slo-itl", type=float, default=0.1)
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--spec", type=Path, default=SPEC)
    args = p.parse_args(argv)
    spec = load(args.spec, None, None)
    load_ = parse_trace(args.trace, 0)
    if args.scale > 1:
        load_ = list(traces.scaled(load_, args.scale, 0))
    slo = Slo(args.slo_ttft, args.slo_itl, 0.9)
    rows = []
    for name in ("xpyd", "keda"):
        cfg = SimConfig(router=spec.deployment.router.policy, autoscaler=name, slo=slo)
        rows.append(run_one(variants(spec, cfg, None)[0], load_))
        rows[-1]["label"] = f"autoscaler={name}"
    peak = {role: max(int(r["replicas_max"][role]) for r in rows) for role in spec.pools}
    static = spec.with_pools(**peak)
    cfg = SimConfig(router=spec.deployment.router.policy, autoscaler="off", slo=slo)
    rows.insert(0, run_one(variants(static, cfg, None)[0], load_))
    rows[0]["label"] = "static peak"
    table = markdown_table(rows)
    base = rows[0]["gpu_hours"]
    ratios = "\n".join(
        f"- {r['label']}: SLO attainment {r['slo_attainment']:.2%}, GPU-h {r['gpu_hours']:.1f} "
        f"({r['gpu_hours'] / base:.0%} of static peak)"
        for r in rows
    )
    text = (
        f"# Autoscaler benchmark: Azure conversation trace x{args.scale}\n\n"
        f"Spec {args.spec.name}; SLO TTFT p90 <= {args.slo_ttft:g} s"
        f" and ITL p90 <= {args.slo_itl * 1000:g} ms;"
        f" command `.venv/bin/python bench/autoscaler/azure.py --scale {args.scale}`.\n\n"
        f"{table}\n\n{ratios}\n"
    )
    print(text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
