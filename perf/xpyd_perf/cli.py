"""`xpyd plan`: the break-even table and a suggested xPyD ratio for a model on a topology."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from xpyd_perf.breakeven import BreakEven, break_even, suggest_xpyd
from xpyd_perf.fits import Fit, replica_fit
from xpyd_perf.lengthmix import LengthMix, TraceFormatError, parse_lengths
from xpyd_perf.models import MODELS, WEIGHT_BYTES, UnknownModelError, quantized, resolve_model
from xpyd_perf.topology import TOPOLOGIES, UnknownTopologyError, resolve_topology


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xpyd plan",
        description="Is disaggregation worth it (t_transfer < t_stall)? Prints the break-even table "
        "and the prefill:decode ratio for a target request rate.",
    )
    p.add_argument("--model", required=True, help=f"catalog key or HF name: {', '.join(MODELS)}")
    p.add_argument("--topology", default="HGX-B200", help=f"one of {', '.join(TOPOLOGIES)}")
    p.add_argument("--gpus-per-replica", type=int, default=8, help="GPUs (tensor-parallel size) per replica")
    p.add_argument(
        "--prompt-tokens",
        default=None,
        help="prompt length, or a comma list (default 2048,8192,32768,131072)",
    )
    p.add_argument("--trace", default=None, help="Mooncake JSONL or Azure CSV trace: use its length mix")
    p.add_argument("--output-tokens", type=int, default=None, help="output length (default: trace mean or 256)")
    p.add_argument("--rate", type=float, default=10.0, help="target requests per second for the xPyD suggestion")
    p.add_argument("--itl-target-ms", type=float, default=50.0, help="inter-token latency target for decode")
    p.add_argument("--kv-bytes-per-token", type=int, default=None, help="override the catalog's KV bytes/token")
    p.add_argument("--dp-attention", action="store_true", help="data-parallel attention: one NIC per request")
    p.add_argument(
        "--max-model-len", type=int, default=None, help="longest sequence the engine must hold (default: the model's)"
    )
    p.add_argument(
        "--quantization", default=None, help=f"weight type: {', '.join(WEIGHT_BYTES)} (default: from the model name)"
    )
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


def _mix_share(args: argparse.Namespace, mix: LengthMix) -> float:
    """Share of the trace's requests for which disaggregation pays (cached per distinct length)."""
    verdicts: dict[int, bool] = {}
    wins = 0
    for n in mix.prompts:
        if n not in verdicts:
            verdicts[n] = break_even(
                args.model,
                args.topology,
                n,
                args.gpus_per_replica,
                args.kv_bytes_per_token,
                args.dp_attention,
            ).disaggregate
        wins += verdicts[n]
    return wins / len(mix.prompts)


def fit_of(args: argparse.Namespace) -> Fit:
    """The replica fits-check the operator runs too (condition Ready=False, reason ReplicaDoesNotFit)."""
    model = resolve_model(args.model)
    if args.quantization:
        model = quantized(model, args.quantization)
    topo = resolve_topology(args.topology)
    return replica_fit(model, topo.gpu, args.gpus_per_replica, 1, False, args.max_model_len, args.kv_bytes_per_token)


def run(args: argparse.Namespace) -> str:
    fit = fit_of(args)
    if not fit.fits:
        raise ValueError(fit.summary())
    mix = None
    if args.trace:
        with open(args.trace, encoding="utf-8") as f:
            mix = parse_lengths(f)
    lengths = _prompt_lengths(args.prompt_tokens, mix)
    rows = [
        (
            tag,
            break_even(
                args.model,
                args.topology,
                n,
                args.gpus_per_replica,
                args.kv_bytes_per_token,
                args.dp_attention,
            ),
        )
        for tag, n in lengths
    ]
    main_row = next((r for tag, r in rows if tag == "mean"), rows[0][1])
    output = args.output_tokens or (mix.mean_output if mix else 256)
    s = suggest_xpyd(
        args.model, args.topology, main_row.prompt_tokens, output, args.rate, args.gpus_per_replica,
        args.itl_target_ms / 1e3,
    )  # fmt: skip
    share = _mix_share(args, mix) if mix else None
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
        return json.dumps(doc)
    lines = [
        f"{main_row.model} on {main_row.topology}, {args.gpus_per_replica} GPUs per replica "
        "(disaggregate iff transfer < stall)",
        f"replica: {fit.summary()}",
        _table(rows),
    ]
    if share is not None:
        lines.append(
            f"disaggregation pays for {100 * share:.1f}% of the trace's {len(mix.prompts) if mix else 0} requests"
        )
    lines.append(
        f"suggested for {args.rate:g} req/s of {main_row.prompt_tokens}+{output} tokens: {s.label} "
        f"(prefill {s.prefill_rps_per_replica:.2f} req/s per replica, "
        f"decode {s.decode_rps_per_replica:.2f} req/s per replica at batch {s.decode_batch})"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        print(run(args))
    except (UnknownModelError, UnknownTopologyError, TraceFormatError, ValueError, OSError) as exc:
        print(f"xpyd plan: error: {exc}", file=sys.stderr)
        return 2
    return 0
