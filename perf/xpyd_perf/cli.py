"""`xpyd plan`: does a replica fit, the smallest one that does, the break-even table and an xPyD ratio."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

from xpyd_perf import handoffs, specplan
from xpyd_perf.breakeven import BreakEven, break_even, suggest_xpyd
from xpyd_perf.fits import (
    MAX_SEARCH_GPUS,
    Fit,
    layout_problem,
    layouts,
    pods_per_replica,
    replica_fit,
    smallest_fit,
    span,
)
from xpyd_perf.lengthmix import LengthMix, TraceFormatError, parse_lengths
from xpyd_perf.modelconfig import ModelConfigError, model_from_config, parse_json
from xpyd_perf.models import MODELS, WEIGHT_BYTES, ModelSpec, UnknownModelError, quantized, resolve_model
from xpyd_perf.topology import TOPOLOGIES, Topology, UnknownTopologyError, resolve_topology

DEFAULT_GPUS = 8  # the replica the break-even table prices when no size is given (one HGX node)
DEFAULT_TOPOLOGY = "HGX-B200"
Fetch = Callable[[str], str]  # GET a URL, its body as text; OSError or ValueError when it cannot


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xpyd plan",
        description="Is disaggregation worth it (t_transfer < t_stall)? Prints the break-even table "
        "and the prefill:decode ratio for a target request rate.",
    )
    p.add_argument(
        "--model", default=None,
        help=f"catalog key or HF name: {', '.join(MODELS)}; any name with --model-config",
    )  # fmt: skip
    p.add_argument(
        "--model-config", default=None, metavar="FILE",
        help="the model's Hugging Face config.json: size any model from it, as the operator does with "
        "spec.model.configMap",
    )  # fmt: skip
    p.add_argument(
        "--topology", default=None, help=f"one of {', '.join(TOPOLOGIES)} (default: --spec's, else {DEFAULT_TOPOLOGY})"
    )
    p.add_argument(
        "--gpus-per-replica", type=int, default=None,
        help=f"GPUs per replica, as spec.<pool>.gpusPerReplica (default: {DEFAULT_GPUS}, and the smallest that fits)",
    )  # fmt: skip
    p.add_argument("--tensor-parallel-size", type=int, default=None, help="default: GPUs / data-parallel size")
    p.add_argument("--data-parallel-size", type=int, default=1, help="data-parallel ranks per replica (wide EP)")
    p.add_argument("--expert-parallel", action="store_true", help="spread the MoE experts over every rank")
    p.add_argument(
        "--prompt-tokens",
        default=None,
        help="prompt length, or a comma list (default 2048,8192,32768,131072)",
    )
    p.add_argument("--trace", default=None, help="Mooncake JSONL or Azure CSV trace: use its length mix")
    p.add_argument("--output-tokens", type=int, default=None, help="output length (default: trace mean or 256)")
    p.add_argument("--rate", type=float, default=10.0, help="target requests per second for the xPyD suggestion")
    p.add_argument("--itl-target-ms", type=float, default=50.0, help="inter-token latency target for decode")
    p.add_argument(
        "--kv-bytes-per-token", type=int, default=None, help="override the catalog's (or config.json's) KV bytes/token"
    )
    p.add_argument("--dp-attention", action="store_true", help="data-parallel attention: one NIC per request")
    p.add_argument(
        "--max-model-len", type=int, default=None, help="longest sequence the engine must hold (default: the model's)"
    )
    p.add_argument(
        "--quantization", default=None, help=f"weight type: {', '.join(WEIGHT_BYTES)} (default: from the model name)"
    )
    p.add_argument(
        "--measured", default=None, metavar="SOURCE",
        help="put the routers' measured KV handoff per prefill/decode pair beside the predicted transfer: a file "
        "holding a router's /metrics text, a router's /metrics URL, or a Prometheus URL",
    )  # fmt: skip
    p.add_argument(
        "--measured-window", default="1h", metavar="DURATION",
        help="with a Prometheus URL: the handoffs of this last stretch (a PromQL duration)",
    )  # fmt: skip
    p.add_argument(
        "--spec", default=None, metavar="FILE",
        help="a DisaggregatedDeployment file: check first that its prefill and decode can hand KV over, as the "
        "operator does (refused: its message, exit code 2), and plan its model, topology and first pool's layout "
        "where the flags above leave them out",
    )  # fmt: skip
    p.add_argument(
        "--prefill-tp", type=int, default=None, metavar="N",
        help="check a prefill tensor parallel size against --decode-tp (with --spec: instead of the prefill pool's)",
    )  # fmt: skip
    p.add_argument(
        "--decode-tp", type=int, default=None, metavar="N",
        help="check a decode tensor parallel size against --prefill-tp (with --spec: instead of the decode pool's)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return p


def _prompt_lengths(text: str | None, mix: LengthMix | None) -> list[tuple[str, int]]:
    if mix is not None:
        return [
            ("p50", mix.percentile(0.5)),
            ("mean", mix.mean_prompt),
            ("p90", mix.percentile(0.9)),
            ("p99", mix.percentile(0.99)),
        ]
    values = text.split(",") if text else ["2048", "8192", "32768", "131072"]
    lengths = []
    for value in values:
        try:
            lengths.append(int(value))
        except ValueError:
            raise ValueError(f"--prompt-tokens: {value!r} is not an integer") from None
    return [("", n) for n in lengths]


def _table(rows: list[tuple[str, BreakEven]]) -> str:
    cols = (
        ("prompt", 8),
        ("KV GB", 8),
        ("path", 12),
        ("transfer ms", 12),
        ("prefill ms", 11),
        ("stall ms", 10),
    )
    head = " " * 5 + " ".join(f"{name:>{width}}" for name, width in cols) + "  verdict"
    out = [head]
    for tag, r in rows:
        path = r.kv_path if r.kv_path == "NVLink" else f"RDMA x{r.lanes}"
        verdict = "disaggregate" if r.disaggregate else "colocate"
        out.append(
            f"{tag:<5}{r.prompt_tokens:>8} {r.kv_bytes / 1e9:>8.2f} {path:>12} "
            f"{r.transfer_seconds * 1e3:>12.1f} {r.prefill_seconds * 1e3:>11.1f} "
            f"{r.stall_seconds * 1e3:>10.1f}  {verdict}"
        )
    return "\n".join(out)


def _mix_share(args: argparse.Namespace, mix: LengthMix, gpus: int) -> float:
    """Share of the trace's requests for which disaggregation pays (cached per distinct length)."""
    verdicts: dict[int, bool] = {}
    wins = 0
    for n in mix.prompts:
        if n not in verdicts:
            verdicts[n] = break_even(
                _named(args), args.topology, n, gpus, args.kv_bytes_per_token, args.dp_attention
            ).disaggregate
        wins += verdicts[n]
    return wins / len(mix.prompts)


def _named(args: argparse.Namespace) -> str | ModelSpec:
    """The model the break-even prices: its config.json's shape (read once by main), else the catalog name."""
    shape: ModelSpec | None = getattr(args, "shape", None)
    return shape if shape is not None else str(args.model)


def _model(args: argparse.Namespace) -> ModelSpec:
    named = _named(args)
    model = named if isinstance(named, ModelSpec) else resolve_model(named)
    return quantized(model, args.quantization) if args.quantization else model


def read_model_config(path: str, name: str | None) -> ModelSpec:
    """The shape in the config.json at `path`, served as `name` (default: the config's _name_or_path, else the
    file's folder or stem). OSError or ModelConfigError (a ValueError) for a bad file."""
    with open(path, encoding="utf-8") as f:
        config = parse_json(f.read(), path)
    if name is None:
        file = Path(path)
        name = str(config.get("_name_or_path") or (file.parent.name if file.name == "config.json" else file.stem))
    try:
        return model_from_config(config, name)
    except ModelConfigError as exc:
        raise ModelConfigError(f"{path}: {exc}") from None


def _asked_layout(args: argparse.Namespace) -> tuple[int, int, int, bool] | None:
    """(GPUs, tp, dp, expert parallel) the flags ask for, checked as the API checks a pool; None: no size given."""
    dp, tp = args.data_parallel_size, args.tensor_parallel_size
    gpus = args.gpus_per_replica if args.gpus_per_replica is not None else (tp * dp if tp is not None else None)
    if gpus is None and dp > 1:
        gpus = dp  # data-parallel ranks of one GPU each
    if gpus is None:
        if args.expert_parallel:
            raise ValueError("--expert-parallel needs a replica size: --gpus-per-replica or --data-parallel-size")
        return None
    if gpus < 1 or dp < 1 or (tp is not None and tp < 1):
        raise ValueError("--gpus-per-replica, --tensor-parallel-size and --data-parallel-size must be >= 1")
    if gpus % dp or (tp is not None and tp * dp != gpus):
        raise ValueError(
            f"tensor x data parallel ({tp or gpus // dp} x {dp}) is the engine's world size and must equal "
            f"--gpus-per-replica ({gpus})"
        )
    return gpus, tp or gpus // dp, dp, args.expert_parallel


def fit_of(args: argparse.Namespace) -> Fit:
    """The replica fits-check the operator runs too (condition Ready=False, reason ReplicaDoesNotFit).

    Without a size: DEFAULT_GPUS GPUs in the model's preferred layout, or the smallest replica that fits.
    """
    model, topo = _model(args), resolve_topology(args.topology)
    asked = _asked_layout(args)
    extra = (args.max_model_len, args.kv_bytes_per_token)
    if asked is not None:
        gpus, tp, dp, ep = asked
        if problem := layout_problem(topo, gpus, dp):
            raise ValueError(problem)
        return replica_fit(model, topo.gpu, tp, dp, ep, *extra)
    shapes = layouts(model, topo, DEFAULT_GPUS) or [(DEFAULT_GPUS, 1, False)]
    tried = [replica_fit(model, topo.gpu, tp, dp, ep, *extra) for tp, dp, ep in shapes]
    return next((f for f in tried if f.fits), None) or smallest_fit(model, topo, *extra) or tried[0]


def _smallest(args: argparse.Namespace) -> Fit | None:
    return smallest_fit(_model(args), resolve_topology(args.topology), args.max_model_len, args.kv_bytes_per_token)


def _suggestion(topo: Topology, best: Fit | None) -> str:
    if best is None:
        return (
            f"no replica of up to {MAX_SEARCH_GPUS} GPUs fits on {topo.name}; "
            "use a smaller --max-model-len or a quantized checkpoint"
        )
    return f"smallest replica that fits on {topo.name}: {{{best.spec_line()}}} ({span(topo, best.gpus)})"


def _layout_doc(topo: Topology, fit: Fit | None) -> dict[str, object] | None:
    if fit is None:
        return None
    pods = pods_per_replica(topo, fit.gpus)
    return {**fit.spec_fields(), "pods_per_replica": pods, "span": span(topo, fit.gpus), "spec_line": fit.spec_line(),
            "fits": fit.fits, "summary": fit.summary()}  # fmt: skip


def _timing_gpus(topo: Topology, gpus: int) -> tuple[int, str]:
    """GPUs the break-even timing prices: the replica's, up to what the timing model takes (one NVLink domain)."""
    limit = topo.max_replica_gpus
    if gpus <= limit:
        return gpus, ""
    return limit, f"timing priced on {limit} of the replica's {gpus} GPUs (one request runs inside one NVLink domain)"


def measured_samples(source: str, window: str, fetch: Fetch | None) -> list[handoffs.PairSample]:
    """The per-pair handoffs `--measured` names: a /metrics file or URL, or a Prometheus server's query API."""
    if not source.startswith(("http://", "https://")):
        with open(source, encoding="utf-8") as f:
            return handoffs.parse_exposition(f.read())
    if fetch is None:
        raise ValueError("--measured: a URL is read by the xpyd command (xpyd plan); here give a /metrics file")
    if urllib.parse.urlsplit(source).path.rstrip("/").endswith("/metrics"):
        return handoffs.parse_exposition(fetch(source))
    if not window or not window[0].isdigit():
        raise ValueError(f"--measured-window: {window!r} is not a PromQL duration (e.g. 30m, 1h)")
    base = source.rstrip("/")
    asked = handoffs.queries(window)
    return handoffs.parse_query(
        {name: fetch(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': q})}") for name, q in asked.items()}
    )


def _measured(args: argparse.Namespace, gpus: int) -> list[handoffs.PairComparison] | None:
    if args.measured is None:
        return None
    samples = measured_samples(args.measured, args.measured_window, getattr(args, "fetch", None))
    return handoffs.compare(samples, _model(args), args.topology, gpus, args.kv_bytes_per_token, args.dp_attention)


def _handoff_doc(args: argparse.Namespace) -> dict[str, object]:
    """--json's "handoff" when --spec or --prefill-tp/--decode-tp asked for the check, else nothing."""
    checked: specplan.SpecPlan | None = getattr(args, "handoff", None)
    return {} if checked is None else {"handoff": {"line": checked.line, **checked.detail}}


def run(args: argparse.Namespace) -> str:
    topo = resolve_topology(args.topology)
    fit, best = fit_of(args), _smallest(args)
    if not fit.fits:
        if args.json:
            print(json.dumps({"fit": fit.as_dict(), "layout": _layout_doc(topo, fit),
                              "smallest_fit": _layout_doc(topo, best), **_handoff_doc(args)}))  # fmt: skip
        raise ValueError(f"{fit.summary()}; {_suggestion(topo, best)}")
    gpus, timing_note = _timing_gpus(topo, fit.gpus)
    mix = None
    if args.trace:
        with open(args.trace, encoding="utf-8") as f:
            mix = parse_lengths(f)
    lengths = _prompt_lengths(args.prompt_tokens, mix)
    rows = [
        (tag, break_even(_named(args), args.topology, n, gpus, args.kv_bytes_per_token, args.dp_attention))
        for tag, n in lengths
    ]
    main_row = next((r for tag, r in rows if tag == "mean"), rows[0][1])
    output = args.output_tokens or (mix.mean_output if mix else 256)
    s = suggest_xpyd(
        _named(args), args.topology, main_row.prompt_tokens, output, args.rate, gpus, args.itl_target_ms / 1e3
    )
    share = _mix_share(args, mix, gpus) if mix else None
    measured = _measured(args, gpus)
    if args.json:
        doc: dict[str, object] = dict(main_row.as_dict())
        doc["rows"] = [dict(r.as_dict(), tag=tag) for tag, r in rows]
        doc["suggestion"] = {
            "xpyd": s.label,
            "prefill_replicas": s.prefill_replicas,
            "decode_replicas": s.decode_replicas,
            "decode_batch": s.decode_batch,
            "prefill_rps_per_replica": s.prefill_rps_per_replica,
            "decode_rps_per_replica": s.decode_rps_per_replica,
            "rate": args.rate,
            "prompt_tokens": main_row.prompt_tokens,
            "output_tokens": output,
        }
        if share is not None:
            doc["trace_disaggregate_share"] = share
        doc["fit"] = fit.as_dict()
        doc["layout"] = _layout_doc(topo, fit)
        doc["smallest_fit"] = _layout_doc(topo, best)
        doc["timing_gpus"] = gpus
        if measured is not None:
            doc["measured"] = [r.as_dict() for r in measured]
        doc.update(_handoff_doc(args))
        return json.dumps(doc)
    checked: specplan.SpecPlan | None = getattr(args, "handoff", None)
    lines = [] if checked is None else [checked.line]
    lines += [
        f"{main_row.model} on {main_row.topology}, {fit.gpus} GPUs per replica (disaggregate iff transfer < stall)",
        f"replica: {fit.summary()}",
        f"one replica: {span(topo, fit.gpus)}",
    ]
    if best is not None and (_asked_layout(args) is None or best.gpus < fit.gpus):
        lines.append(f"smallest replica that fits on {topo.name} ({span(topo, best.gpus)}); paste into a pool:")
        lines.append(f"  {best.spec_line()}")
    if timing_note:
        lines.append(timing_note)
    lines.append(_table(rows))
    if share is not None:
        lines.append(
            f"disaggregation pays for {100 * share:.1f}% of the trace's {len(mix.prompts) if mix else 0} requests"
        )
    lines.append(
        f"suggested for {args.rate:g} req/s of {main_row.prompt_tokens}+{output} tokens: {s.label} "
        f"(prefill {s.prefill_rps_per_replica:.2f} req/s per replica, "
        f"decode {s.decode_rps_per_replica:.2f} req/s per replica at batch {s.decode_batch})"
    )
    if measured is not None:
        lines.append(handoffs.describe(measured, topo.name, args.measured))
    return "\n".join(lines)


def _preflight(args: argparse.Namespace, preflight: specplan.Preflight | None) -> None:
    """The handoff check --spec or --prefill-tp/--decode-tp ask for (ValueError: the refusal); its flags applied."""
    ask = specplan.asked(args)
    if ask is None:
        return
    if preflight is None:
        raise ValueError("--spec, --prefill-tp and --decode-tp are read by the xpyd command (xpyd plan)")
    checked = preflight(ask)
    if checked.refusal is not None:
        raise ValueError(checked.refusal)
    specplan.apply(args, checked)
    args.handoff = checked


def main(
    argv: Sequence[str] | None = None, fetch: Fetch | None = None, preflight: specplan.Preflight | None = None
) -> int:
    """`xpyd plan`; `fetch` reads `--measured` URLs and `preflight` a --spec file (the xpyd command passes both:
    this package does no network I/O and knows no deployment spec)."""
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    args.fetch, args.shape, args.handoff = fetch, None, None
    try:
        _preflight(args, preflight)
        if args.model is None and args.model_config is None:
            parser.error("one of --model, --model-config or --spec is required")
        args.topology = args.topology or DEFAULT_TOPOLOGY
        if args.model_config:
            args.shape = read_model_config(args.model_config, args.model)
        print(run(args))
    except (UnknownModelError, UnknownTopologyError, TraceFormatError, ValueError, OSError) as exc:
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        where = f"{exc.filename}: " if isinstance(exc, OSError) and exc.filename else ""
        print(f"xpyd plan: error: {where}{' '.join(text.split())}", file=sys.stderr)
        return 2
    return 0
