"""What must agree across a KV handoff, per pool, and which prefill/decode pairs cannot hand KV over.

A prefill worker writes KV blocks that a decode worker reads as they lie in GPU memory, so the two
ends must agree on the engine (kind, release, image), the connector, the block (page) size, the KV
cache dtype and layout, the attention-level tensor and the pipeline parallel size, the attention
backend and the GPU. `pool_facts` derives these from a deployment spec's pool exactly as the engine
would read its command line: the operator's flags from the spec's own fields first, then
`spec.engine.args`, then the pool's `args` (the last value of a flag wins, as argparse has it).
`argv_facts` reads them from a bare engine command line (the emulator's).

The pool's engine revision (the pod label `xpyd.io/engine-rev`, `revision`) hashes every fact that
must be equal across the handoff, with both pools' tensor parallel as one pair, and the router pairs
only workers of one revision; so `incompatibilities` refuses any prefill/decode pair whose revisions
would differ (they would never be paired) and what the engine refuses on top (prefill TP above
decode TP, a decode TP not a multiple of prefill's, pipeline parallel over NIXL). Data parallel is not a
handoff fact: each data-parallel rank is one engine holding whole sequences, and the shipped
examples run different data-parallel sizes on the two sides. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from xpyd_api import podpatch
from xpyd_api.engines import EngineProfile, EngineUnsupported, image_version, parse_version, resolve
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_perf.topology import GPU_PRODUCT

REASON: Final = "HandoffIncompatible"  # the Ready=False reason of a refused pair
DEFAULT: Final = "default"  # a fact the command line leaves to the engine's default
LAYOUT_ENV: Final = "VLLM_KV_CACHE_LAYOUT"  # vLLM's NHD / HND KV layout

# Flag spellings per engine kind: fact -> every spelling the engine's argparse takes.
_VLLM_FLAGS: Final = {
    "block_size": ("--block-size",),
    "kv_cache_dtype": ("--kv-cache-dtype",),
    "tp": ("--tensor-parallel-size", "-tp", "--tp"),
    "pp": ("--pipeline-parallel-size", "-pp"),
    "dp": ("--data-parallel-size", "-dp"),
    "dtype": ("--dtype",),
    "attention_backend": ("--attention-backend",),
    "speculative": ("--speculative-config",),
}
_SGLANG_FLAGS: Final = {
    "block_size": ("--page-size",),
    "kv_cache_dtype": ("--kv-cache-dtype",),
    "tp": ("--tp-size", "--tp", "--tensor-parallel-size"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "dp": ("--dp-size", "--dp", "--data-parallel-size", "--attn-dp-size"),
    "dtype": ("--dtype",),
    "attention_backend": ("--attention-backend",),
    "speculative": ("--speculative-algorithm",),
}
# Facts that only need to be equal (the engine reads no other relation between the two sides).
_EQUAL: Final = (
    ("kind", "engine kind"),
    ("version", "engine release"),
    ("image", "engine image"),
    ("connector", "KV connector"),
    ("block_size", "block size"),
    ("kv_cache_dtype", "KV cache dtype"),
    ("kv_layout", f"KV cache layout ({LAYOUT_ENV})"),
    ("dtype", "model dtype (--dtype)"),
    ("attention_backend", "attention backend"),
    ("speculative", "speculative decoding"),
    ("pp", "pipeline parallel size"),
)


@dataclass(frozen=True, slots=True)
class HandoffFacts:
    """One pool's side of the handoff; text facts are DEFAULT where the engine picks."""

    kind: str
    version: str  # the release the profile serves the pool with ("" for the emulator)
    image: str  # the engine image when the spec or a pod template patch names one, else DEFAULT
    connector: str
    model: str
    block_size: str = DEFAULT  # vLLM --block-size, SGLang --page-size
    kv_cache_dtype: str = DEFAULT
    kv_layout: str = DEFAULT
    dtype: str = DEFAULT
    attention_backend: str = DEFAULT
    speculative: str = DEFAULT
    tp: int = 1  # attention-level tensor parallel (SGLang: --tp-size over the data-parallel attention ranks)
    pp: int = 1
    dp: int = 1  # reported, not compared (see the module's docstring)
    gpu: str = DEFAULT  # the GPU product the pool's nodes carry (topology, or a nodeSelector in a patch)
    tp_pair: str = ""  # "prefill:decode" tensor parallel of the deployment, which the revision covers instead of tp

    def key(self) -> str:
        """Canonical text of every fact the revision covers, besides the image and connector."""
        parts = (self.kind, self.version, self.model, self.block_size, self.kv_cache_dtype, self.kv_layout,
                 self.dtype, self.attention_backend, self.speculative, f"tp{self.tp_pair or self.tp}", f"pp{self.pp}",
                 self.gpu)  # fmt: skip
        return "|".join(parts)

    def describe(self) -> str:
        """One line of the facts, as a condition message quotes them."""
        return (
            f"{self.kind} {self.version or '-'}, connector {self.connector}, block size {self.block_size}, "
            f"KV dtype {self.kv_cache_dtype}, TP{self.tp} x PP{self.pp}, GPU {self.gpu}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def revision(image: str, connector: str | None, facts: HandoffFacts | None = None) -> str:
    """A short label-safe revision of what must match across a KV handoff.

    Without facts: the image and connector only (what every revision before the facts hashed).
    """
    text = f"{image}|{connector or ''}"
    if facts is not None:
        text += "|" + facts.key()
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _flags(kind: str) -> Mapping[str, tuple[str, ...]]:
    return _SGLANG_FLAGS if kind == "sglang" else _VLLM_FLAGS


def _last_values(kind: str, argv: Iterable[str]) -> dict[str, str]:
    """fact -> the last value given to one of its flags in `argv` (`--flag value` or `--flag=value`)."""
    by_flag = {flag: fact for fact, flags in _flags(kind).items() for flag in flags}
    words = list(argv)
    out: dict[str, str] = {}
    for i, word in enumerate(words):
        name, eq, inline = word.partition("=")
        if name.startswith("--") and kind != "sglang":
            name = "--" + name[2:].replace("_", "-")  # vLLM's parser reads --block_size as --block-size
        fact = by_flag.get(name)
        if fact is None:
            continue
        if eq:
            out[fact] = inline
        elif i + 1 < len(words):
            out[fact] = words[i + 1]
    return out


def _count(value: str | None, default: int, what: str) -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not an integer") from None
    if number < 1:
        raise ValueError(f"{what} must be at least 1, got {number}")
    return number


def argv_facts(
    kind: str,
    argv: Sequence[str],
    *,
    version: str = "",
    image: str = DEFAULT,
    connector: str = "",
    model: str = "",
    env: Mapping[str, str] | None = None,
    gpu: str = DEFAULT,
    defaults: Mapping[str, int] | None = None,
) -> HandoffFacts:
    """The facts of an engine command line (`defaults` holds tp/pp/dp when the line omits them)."""
    values = _last_values(kind, argv)
    base = dict(defaults or {})
    tp = _count(values.get("tp"), base.get("tp", 1), "tensor parallel size")
    pp = _count(values.get("pp"), base.get("pp", 1), "pipeline parallel size")
    dp = _count(values.get("dp"), base.get("dp", 1), "data parallel size")
    if kind == "sglang" and dp > 1 and tp % dp == 0:
        tp //= dp  # SGLang's --tp-size spans its data-parallel attention ranks; attention runs at tp / dp
    return HandoffFacts(
        kind=kind,
        version=version,
        image=image,
        connector=connector,
        model=model,
        block_size=values.get("block_size", DEFAULT),
        kv_cache_dtype=_dtype(values.get("kv_cache_dtype")),
        kv_layout=(env or {}).get(LAYOUT_ENV) or DEFAULT,
        dtype=_dtype(values.get("dtype")),
        attention_backend=values.get("attention_backend", DEFAULT),
        speculative=values.get("speculative", DEFAULT),
        tp=tp,
        pp=pp,
        dp=dp,
        gpu=gpu,
    )


def _dtype(value: str | None) -> str:
    return DEFAULT if value is None or value == "auto" else value


def _patched(patches: Iterable[dict[str, Any] | None]) -> tuple[str | None, str | None, dict[str, str]]:
    """(engine image, GPU product nodeSelector, engine env) the pod template patches set, the last one winning."""
    image = gpu = None
    env: dict[str, str] = {}
    for patch in patches:
        spec = (patch or {}).get("spec") or {}
        selector = spec.get("nodeSelector") or {}
        if isinstance(selector, dict) and isinstance(selector.get(GPU_PRODUCT), str):
            gpu = selector[GPU_PRODUCT]
        for container in spec.get("containers") or []:
            if not isinstance(container, dict) or container.get("name") != podpatch.ENGINE_CONTAINER:
                continue
            if isinstance(container.get("image"), str):
                image = container["image"]
            for item in container.get("env") or []:
                if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("value"), str):
                    env[item["name"]] = item["value"]
    return image, gpu, env


def pool_facts(spec: DisaggregatedDeploymentSpec, pool: PoolSpec, image: str | None = None) -> HandoffFacts:
    """One pool's handoff facts; `image` is the engine image the pod runs when the caller knows it.

    With both pools, `tp_pair` holds both pools' tensor parallel: the two pools' revisions then agree when
    their TP differ as vLLM allows (decode a multiple of prefill), and a change of either moves both, so a
    worker of the old pair is never paired with one of the new.
    Raises EngineUnsupported for an engine the profiles do not serve, ValueError for a bad flag value.
    """
    facts = _own_facts(spec, pool, image)
    if spec.prefill is None or spec.decode is None:
        return facts
    tps = [facts.tp if p is pool else _own_facts(spec, p, None).tp for p in (spec.prefill, spec.decode)]
    return replace(facts, tp_pair=f"{tps[0]}:{tps[1]}")


def _own_facts(spec: DisaggregatedDeploymentSpec, pool: PoolSpec, image: str | None) -> HandoffFacts:
    engine = spec.engine
    profile = resolve(engine.kind, engine.image, engine.version)
    patched_image, patched_gpu, patched_env = _patched((spec.pod_template_patch, pool.pod_template_patch))
    env = {e.name: e.value for e in engine.env if e.value_from is None}
    env.update(patched_env)
    topology = spec.topology.hardware
    gpu = patched_gpu or (topology.product if topology is not None else DEFAULT)
    defaults = {"tp": pool.tp, "pp": pool.pipeline_parallel_size, "dp": pool.data_parallel_size}
    if engine.kind == "sglang":
        defaults["tp"] = pool.tp * pool.data_parallel_size  # as the operator renders --tp-size
    return argv_facts(
        engine.kind,
        [*engine.args, *pool.args],
        version=_version(profile, engine.image, engine.version),
        image=image or patched_image or engine.image or DEFAULT,
        connector=engine.kv_connector,
        model=spec.model.name,
        env=env,
        gpu=gpu,
        defaults=defaults,
    )


def _version(profile: EngineProfile, image: str | None, version: str | None) -> str:
    """The release the pool runs: spec.engine.version, else the image tag's, else the profile's newest."""
    if profile.kind == "emulator":
        return ""
    found = parse_version(version) if version else (image_version(image) if image else None)
    if found is None:
        found = parse_version(profile.released[0]) if profile.released else profile.since
    return ".".join(map(str, found or profile.since))


def incompatibilities(prefill: HandoffFacts, decode: HandoffFacts, profile: EngineProfile | None = None) -> list[str]:
    """Why the prefill's KV cannot be handed to the decode, one phrase each (empty: compatible)."""
    out = [
        f"{label} differs (prefill {getattr(prefill, name)}, decode {getattr(decode, name)})"
        for name, label in _EQUAL
        if getattr(prefill, name) != getattr(decode, name)
    ]
    if prefill.tp > decode.tp:
        out.append(
            f"prefill tensor parallel {prefill.tp} > decode tensor parallel {decode.tp}: vLLM before 0.14 refuses it "
            '("Decode TP cannot be smaller than prefill TP") and later releases only when prefill TP is below the '
            "model's KV-head count and the model has no MLA; use the same tensorParallelSize on both pools"
        )
    elif decode.tp % prefill.tp:
        out.append(
            f"decode tensor parallel {decode.tp} is not a multiple of prefill tensor parallel {prefill.tp}: "
            "vLLM's NixlConnector reads a prefill's KV into a decode TP that is a multiple of the prefill's"
        )
    if profile is not None and not profile.handoff_pipeline_parallel and max(prefill.pp, decode.pp) > 1:
        out.append(
            f"pipeline parallel (prefill PP{prefill.pp}, decode PP{decode.pp}) over {prefill.connector}: "
            f"{profile.kind} {profile.version_text}'s handoff is not known to carry pipeline-parallel stages "
            "(vLLM's NixlConnector has no PP before 0.32, and from 0.32 only on a push-mode prefill); "
            "use pipelineParallelSize 1"
        )
    if prefill.gpu != decode.gpu:
        out.append(f"GPU type differs (prefill {prefill.gpu}, decode {decode.gpu})")
    return out


def check(spec: DisaggregatedDeploymentSpec) -> str | None:
    """The refusal message for a spec whose prefill and decode cannot hand KV over; None when they can.

    Colocated mode (one pool) has no handoff. An engine the profiles do not serve is refused elsewhere
    (EngineUnsupported) and passes here.
    """
    if spec.prefill is None or spec.decode is None:
        return None
    try:
        profile = resolve(spec.engine.kind, spec.engine.image, spec.engine.version)
        prefill, decode = pool_facts(spec, spec.prefill), pool_facts(spec, spec.decode)
    except EngineUnsupported:
        return None
    except ValueError as exc:
        return f"cannot read the handoff facts: {exc}"
    problems = incompatibilities(prefill, decode, profile)
    if not problems:
        return None
    return (
        f"prefill and decode cannot hand KV over: {'; '.join(problems)} "
        f"[prefill: {prefill.describe()}; decode: {decode.describe()}]"
    )


# What the newest vLLM's NixlConnector compares in its handshake (its compatibility hash: release, model,
# dtype, KV cache dtype, attention backend, speculative config) before it reads a remote KV cache.
_HASHED: Final = ("version", "model", "dtype", "kv_cache_dtype", "attention_backend", "speculative")


def engine_refusal(prefill: HandoffFacts, decode: HandoffFacts) -> str | None:
    """Why the newest vLLM's decode would fail to load this prefill's KV (None: it loads it).

    As vLLM 0.34's handshake does: a different compatibility hash (the facts of `_HASHED`), tensor parallel
    sizes neither of which divides the other, a decode block size that is no multiple of the prefill's, or
    different block sizes with prefill TP > decode TP. The emulator answers a decode with this as vLLM does.
    """
    if prefill.kind != decode.kind or prefill.connector != decode.connector:
        return (
            f"remote engine {prefill.kind} with {prefill.connector or 'no connector'} cannot hand KV to "
            f"{decode.kind} with {decode.connector or 'no connector'}"
        )
    hashed = [f"{n} {getattr(decode, n)} != remote {getattr(prefill, n)}" for n in _HASHED
              if getattr(prefill, n) != getattr(decode, n)]  # fmt: skip
    if hashed:
        return (
            "NIXL compatibility hash mismatch: prefill and decode instances have incompatible configurations "
            f"({'; '.join(hashed)})"
        )
    if decode.tp >= prefill.tp and decode.tp % prefill.tp:
        return f"Local tensor parallel size {decode.tp} is not divisible by remote tensor parallel size {prefill.tp}."
    if prefill.tp > decode.tp and prefill.tp % decode.tp:
        return f"Remote tensor parallel size {prefill.tp} is not divisible by local tensor parallel size {decode.tp}."
    if prefill.block_size != decode.block_size:
        local, remote = _block(decode.block_size), _block(prefill.block_size)
        if prefill.tp > decode.tp:
            return "Different local/remote block sizes are not supported when P TP > D TP."
        if local % remote:
            return f"Local block size {local} is not divisible by remote block size {remote} or vice versa."
    return None


def _block(text: str) -> int:
    """A block size fact as the engine sees it (vLLM's CUDA default is 16)."""
    return int(text) if text.isdigit() else 16
