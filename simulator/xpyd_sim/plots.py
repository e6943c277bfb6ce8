"""PNG plots of simulation results (matplotlib, Agg backend: no display needed).

matplotlib is the optional extra `xpyd[plot]`: it is imported on first use, and its absence is one
clear error (`PlotUnavailable`) rather than an import failure of the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

INSTALL_HINT = "plots need matplotlib: pip install 'xpyd[plot]'"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; PlotUnavailable (with the install hint) when it is missing."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise PlotUnavailable(INSTALL_HINT) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def replicas_plot(result: dict[str, Any], path: Path) -> Path:
    """Replicas (and queue) over simulated time for one run."""
    plt = pyplot()
    rows = result["replicas"]
    t = [r[0] / 60 for r in rows]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if result["mode"] == "Colocated":
        ax.step(t, [r[1] for r in rows], where="post", label="workers")
    else:
        ax.step(t, [r[1] for r in rows], where="post", label="prefill replicas")
        ax.step(t, [r[2] for r in rows], where="post", label="decode replicas")
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("replicas")
    ax2 = ax.twinx()
    ax2.plot(t, [r[3] for r in rows], color="grey", alpha=0.4, label="queued requests")
    ax2.set_ylabel("queued requests")
    ax.set_title(f"{result.get('label', '')}: {result['autoscaler']} autoscaler, {result['gpu_hours']:.1f} GPU-h")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare_plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """TTFT p50/p99 bars and SLO attainment per run of a comparison."""
    plt = pyplot()
    labels = [str(r.get("label", "")) for r in rows]
    x = range(len(rows))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.4
    ax.bar([i - width / 2 for i in x], [r["ttft_p50_s"] or 0 for r in rows], width, label="TTFT p50")
    ax.bar([i + width / 2 for i in x], [r["ttft_p99_s"] or 0 for r in rows], width, label="TTFT p99")
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log)")
    ax.set_xticks(list(x), labels, rotation=25, ha="right", fontsize=8)
    ax.legend()
    ax.set_title("time to first token")
    ax2.bar(list(x), [100 * (r["slo_attainment"] or 0) for r in rows], color="tab:green")
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("% requests within SLO")
    ax2.set_xticks(list(x), labels, rotation=25, ha="right", fontsize=8)
    for i, r in enumerate(rows):
        ax2.text(i, 2, f"{r['gpu_hours']:.0f} GPU-h", ha="center", fontsize=7, rotation=90, color="white")
    ax2.set_title("SLO attainment")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def autoscaler_plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """GPUs in use over time per run, with SLO attainment and GPU-hours in the legend."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in rows:
        gpus = r.get("gpus_per_replica", {})
        t = [row[0] / 60 for row in r["replicas"]]
        if r["mode"] == "Colocated":
            total = [row[1] * gpus.get("worker", 1) for row in r["replicas"]]
        else:
            total = [row[1] * gpus.get("prefill", 1) + row[2] * gpus.get("decode", 1) for row in r["replicas"]]
        label = f"{r.get('label', '')}: {100 * (r['slo_attainment'] or 0):.1f}% SLO, {r['gpu_hours']:.0f} GPU-h"
        ax.step(t, total, where="post", label=label)
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("GPUs allocated")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(rows: Sequence[dict[str, Any]], directory: Path, title: str = "xpyd simulate") -> list[Path]:
    """A comparison plot when several runs, and one replicas-over-time plot per run."""
    directory.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    if len(rows) > 1:
        out.append(compare_plot(rows, directory / "compare.png", title))
    for i, r in enumerate(rows):
        safe = "".join(ch if ch.isalnum() else "-" for ch in str(r.get("label", i)))
        out.append(replicas_plot(r, directory / f"replicas-{safe}.png"))
    return out
