"""`xpyd plan --spec`: the deployment read with the operator's models and its KV handoff checked as the operator does.

xpyd_perf sits below the API and reads no spec, so the xpyd command hands `xpyd plan` this reader
(xpyd_perf.specplan.Preflight). The file is read as `xpyd render` reads it (xpyd_operator.render), the
pools' handoff checked by the operator's own checks (xpyd_operator.desired: check_engine, check_handoff),
and a refusal is the line `xpyd render` prints for it. Without a spec, --prefill-tp/--decode-tp check two
pools of the default engine that differ only in tensor parallel.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from xpyd_api import handoff
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_api.rules import TOPOLOGY_KINDS
from xpyd_cli import errors
from xpyd_operator import sizing
from xpyd_operator.desired import InputError, check_engine, check_handoff
from xpyd_operator.render import deployments, read_spec, refusal
from xpyd_perf.models import WEIGHT_BYTES
from xpyd_perf.specplan import SpecAsk, SpecPlan


def read(path: str) -> tuple[str, DisaggregatedDeploymentSpec]:
    """The one DisaggregatedDeployment in the file at `path`, as the API server would admit it (ValueError)."""
    try:
        docs = deployments(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(errors.describe(exc)) from None
    if len(docs) > 1:
        names = ", ".join(str((d.get("metadata") or {}).get("name")) for d in docs)
        raise ValueError(f"holds {len(docs)} DisaggregatedDeployments ({names}); plan one at a time")
    return read_spec(docs[0])


def bare(ask: SpecAsk) -> DisaggregatedDeploymentSpec:
    """Two pools of the default engine that differ only in tensor parallel (--prefill-tp/--decode-tp alone)."""
    if ask.prefill_tp is None or ask.decode_tp is None:
        raise ValueError("--prefill-tp and --decode-tp go together without --spec")
    body: dict[str, object] = {
        "model": {"name": ask.model or "model"},
        "prefill": {"gpusPerReplica": ask.prefill_tp},
        "decode": {"gpusPerReplica": ask.decode_tp},
    }
    if ask.topology in TOPOLOGY_KINDS:
        body["topology"] = {"kind": ask.topology}
    try:
        return DisaggregatedDeploymentSpec.model_validate(body)
    except ValidationError as exc:
        raise ValueError(" ".join(str(exc).split())) from None


def _tp(pool: PoolSpec | None, tp: int | None) -> PoolSpec | None:
    """The pool with this tensor parallel size (its GPUs follow: tp x pipeline x data parallel)."""
    if pool is None or tp is None:
        return pool
    gpus = tp * pool.pipeline_parallel_size * pool.data_parallel_size
    return pool.model_copy(update={"tensor_parallel_size": tp, "gpus_per_replica": gpus})


def with_tp(spec: DisaggregatedDeploymentSpec, prefill: int | None, decode: int | None) -> DisaggregatedDeploymentSpec:
    """The spec with --prefill-tp/--decode-tp in place of its pools' tensor parallel."""
    if spec.prefill is None and (prefill is not None or decode is not None):
        raise ValueError("--prefill-tp/--decode-tp: the spec is Colocated (one pool, no KV handoff)")
    return spec.model_copy(update={"prefill": _tp(spec.prefill, prefill), "decode": _tp(spec.decode, decode)})


def plan_flags(spec: DisaggregatedDeploymentSpec) -> dict[str, object]:
    """The `xpyd plan` flags the spec stands for: model, topology, its first pool's layout and engine flags."""
    pool = spec.prefill or spec.worker
    out: dict[str, object] = {"model": spec.model.name}
    if spec.model.config is not None:
        out["shape"] = sizing.declared_model(spec)  # ModelConfigError (a ValueError) for an unreadable one
    if (hardware := spec.topology.hardware) is not None:
        out["topology"] = hardware.name
    if spec.model.kv_bytes_per_token is not None:
        out["kv_bytes_per_token"] = spec.model.kv_bytes_per_token
    if pool is None:
        return out
    out.update(gpus_per_replica=pool.gpus_per_replica, tensor_parallel_size=pool.tp,
               data_parallel_size=pool.data_parallel_size, expert_parallel=pool.expert_parallel)  # fmt: skip
    flags = sizing.engine_flags(spec, pool)
    if flags.max_model_len is not None:
        out["max_model_len"] = flags.max_model_len
    if flags.quantization in WEIGHT_BYTES:
        out["quantization"] = flags.quantization
    return out


def verdict(name: str, spec: DisaggregatedDeploymentSpec) -> SpecPlan:
    """The handoff line of a spec the operator accepts, or the refusal it would give."""
    try:
        check_engine(spec)
        check_handoff(spec)
    except InputError as exc:
        return SpecPlan(line="", refusal=refusal(name, exc.reason, exc.message))
    if spec.prefill is None or spec.decode is None:
        return SpecPlan(
            line=f"handoff: none ({name}: Colocated, one pool hands no KV over)",
            detail={"compatible": True, "mode": spec.mode},
        )
    prefill, decode = handoff.pool_facts(spec, spec.prefill), handoff.pool_facts(spec, spec.decode)
    sides = (
        f"prefill and decode {prefill.describe()}"
        if prefill.describe() == decode.describe()
        else f"prefill {prefill.describe()}; decode {decode.describe()}"
    )
    return SpecPlan(
        line=f"handoff: compatible ({name}: {sides})",
        detail={"compatible": True, "mode": spec.mode, "prefill": prefill.as_dict(), "decode": decode.as_dict()},
    )


def preflight(ask: SpecAsk) -> SpecPlan:
    """What `xpyd plan` prints of the deployment's handoff, and the flags the spec stands for (ValueError)."""
    where = f"--spec {ask.spec}: " if ask.spec is not None else ""
    try:
        name, spec = read(ask.spec) if ask.spec is not None else ("--prefill-tp/--decode-tp", bare(ask))
        spec = with_tp(spec, ask.prefill_tp, ask.decode_tp)
        checked = verdict(name, spec)
        if checked.refusal is not None:
            return SpecPlan(line="", refusal=f"{where}{checked.refusal}")
        flags = plan_flags(spec) if ask.spec is not None else {}
    except ValueError as exc:
        raise ValueError(f"{where}{exc}") from None
    return SpecPlan(line=checked.line, detail=checked.detail, flags=flags)
