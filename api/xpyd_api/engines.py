"""Engine profiles: the one place that knows each engine kind and release xpyd serves.

A profile per kind and version range says what the operator renders for it (default image, the
flags that differ between releases), what the router speaks to it (the handoff protocol) and what
every consumer reads from it (the metric-name map: the autoscaler's queries, the drain hook, the
dashboards and the router's scraper). A new engine release is one entry in `PROFILES`; a new kind
is one entry plus one argv module in the operator (`xpyd_operator/engines/`) and one handoff module
in the router. `tests/contract/` checks every entry against that release's own wheel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from xpyd_api import metric_names as names

Kind = Literal["vllm", "sglang", "emulator"]
KINDS: Final[tuple[Kind, ...]] = ("vllm", "sglang", "emulator")
Handoff = Literal["nixl", "bootstrap"]  # vLLM's two hops over a KV connector; SGLang's paired bootstrap room
ChatFlavour = Literal["vllm", "sglang"]  # how the engine renders a chat template (xpyd_router.tokens.chat_template)
Version = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class MetricNames:
    """One engine's Prometheus names for what xpyd reads (as exposed: counters with `_total`)."""

    waiting: str
    running: str
    kv_usage: tuple[str, ...]  # 0-1; the first that a worker exposes wins (older releases renamed it)
    ttft: str  # histogram
    itl: str  # histogram
    e2e: str  # histogram
    queue_time: str  # histogram
    prompt_tokens: str
    generation_tokens: str
    prompt_length: str | None = None  # histogram of each finished request's prompt tokens
    prefix_queries: str | None = None  # tokens looked up in the prefix cache (vLLM)
    prefix_hits: str | None = None
    cache_hit_rate: str | None = None  # a 0-1 gauge where the engine exports a ratio instead (SGLang)
    kv_transfers: str | None = None  # the decode side's KV-transfer histogram (vLLM NIXL, from 0.11.1)
    kv_transfer_bytes: str | None = None  # bytes per KV transfer, a histogram (vLLM NIXL, from 0.11.1)
    kv_transfer_failures: str | None = None  # failed KV transfers, a counter (vLLM NIXL, from 0.11.1)


VLLM_METRICS: Final = MetricNames(
    waiting=names.WAITING,
    running=names.RUNNING,
    kv_usage=(names.KV_USAGE, names.KV_USAGE_OLD),
    ttft=names.TTFT,
    itl=names.ITL,
    e2e=names.E2E,
    queue_time=names.QUEUE_TIME,
    prompt_tokens=names.PROMPT_TOKENS,
    generation_tokens=names.GENERATION_TOKENS,
    prompt_length=names.PROMPT_LENGTH,
    prefix_queries=names.PREFIX_QUERIES,
    prefix_hits=names.PREFIX_HITS,
    kv_transfers="vllm:nixl_xfer_time_seconds",
    kv_transfer_bytes="vllm:nixl_bytes_transferred",
    kv_transfer_failures="vllm:nixl_num_failed_transfers_total",
)
SGLANG_METRICS: Final = MetricNames(
    waiting=names.SGL_WAITING,
    running=names.SGL_RUNNING,
    kv_usage=(names.SGL_USAGE,),
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    queue_time="sglang:queue_time_seconds",
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    prompt_length=names.SGL_PROMPT_LENGTH,
    cache_hit_rate="sglang:cache_hit_rate",
)
# vLLM before 0.11.1 exports no NIXL series
VLLM_011_METRICS: Final = replace(VLLM_METRICS, kv_transfers=None, kv_transfer_bytes=None, kv_transfer_failures=None)
METRICS: Final[dict[str, MetricNames]] = {"vllm": VLLM_METRICS, "sglang": SGLANG_METRICS, "emulator": VLLM_METRICS}


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """What differs between the releases of one engine kind from `since` up to the next profile."""

    kind: Kind
    since: Version
    image: str  # the image of the newest release this profile was checked against
    released: tuple[str, ...]  # the releases the contract test checks (their wheels)
    handoff: Handoff
    metrics: MetricNames
    # vLLM: the NixlConnector's kv_role per pool (kv_both until the producer/consumer split)
    kv_roles: dict[str, str] = field(default_factory=dict)
    # vLLM: the MoE all-to-all kernel by flag (--all2all-backend) or by environment (VLLM_ALL2ALL_BACKEND)
    all2all: Literal["flag", "env", "none"] = "none"
    # vLLM >= 0.11.1: tensor/pipeline parallel across nodes with --nnodes/--node-rank (older needs Ray)
    multi_node_tp: bool = True
    # vLLM >= 0.14: the API server passes X-data-parallel-rank on to the engine, so the router can pin ranks
    rank_header: bool = False
    # SGLang: data-parallel attention by --attn-dp-size (0.5.23) or --enable-dp-attention (before)
    dp_attention: Literal["attn-dp-size", "enable-dp-attention", "none"] = "none"
    # vLLM: data-parallel rank r's NIXL side channel listens on VLLM_NIXL_SIDE_CHANNEL_PORT + r (0.11.1 on),
    # + r x tensor-parallel size before (the network policy opens that range)
    side_channel_stride: Literal["rank", "rank-x-tp"] = "rank"
    # SGLang serves /metrics only with --enable-metrics, and before 0.5.23 the prompt-length histogram (the SLO
    # autoscaler's prompt mix) only with --collect-tokens-histogram as well
    metrics_flags: tuple[str, ...] = ()
    # how the engine turns chat messages into prompt text (content format, joins, null keys): the router's keys
    chat: ChatFlavour = "vllm"
    # whose token ids the engine's KV blocks hold: the served model's tokenizer, or the emulator's own
    tokens: Literal["model", "emulator"] = "model"
    # whether the KV handoff is known to carry pipeline-parallel stages (xpyd_api.handoff refuses PP > 1 otherwise):
    # vLLM's NixlConnector has no PP before 0.32 and from 0.32 only on a push-mode prefill (NixlPushConnector),
    # which xpyd does not render; SGLang's is not checked here
    handoff_pipeline_parallel: bool = False
    # How a pool's kvOffload (a CPU tier for KV blocks) is rendered. "flags": vLLM's --kv-offloading-size (GiB,
    # all tensor-parallel ranks together) and --kv-offloading-backend (native | lmcache), read from 0.14.0's
    # vllm/config/cache.py; vllm/config/vllm.py (_post_init_kv_transfer_config) then *replaces* kv_connector with
    # OffloadingConnector (cpu_bytes_to_use) and kv_role with kv_both, so a P/D pool gets a MultiConnector of
    # NixlConnector and OffloadingConnector in --kv-transfer-config instead. "hicache": SGLang's
    # --enable-hierarchical-cache --hicache-size (whole GB of 1e9 bytes per rank; sglang/srt/server_args.py and
    # mem_cache/memory_pool_host.py of 0.5.3, arg_groups + mem_cache/pool_host/base.py of 0.5.23). "none": vLLM
    # 0.11.x, whose OffloadingConnector needs num_cpu_blocks (v1/kv_offload/cpu.py), which depends on the model's
    # block bytes, and 0.11.1's --kv-offloading-size native path writes num_cpu_blocks 0, which that check refuses.
    kv_offload: Literal["flags", "hicache", "none"] = "none"

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.since))


_KV_BOTH = {"prefill": "kv_both", "decode": "kv_both"}
_KV_SPLIT = {"prefill": "kv_producer", "decode": "kv_consumer"}

# Newest first within a kind; a release belongs to the first profile whose `since` it reaches. Each
# boundary is a release whose wheel the facts were read from (tests/contract): 0.11.1 added --all2all-backend
# and --nnodes/--node-rank (0.11.0 has VLLM_ALL2ALL_BACKEND and needs Ray across nodes); 0.14.0 passes
# X-data-parallel-rank on to its engines; 0.23.0 (KV_SPLIT_VLLM) deprecates kv_role kv_both with the
# NixlConnector (kv_producer on prefill, kv_consumer on decode; 0.22.1 still takes kv_both silently).
KV_SPLIT_VLLM: Final = (0, 23, 0)
PROFILES: Final[tuple[EngineProfile, ...]] = (
    EngineProfile(
        "vllm", KV_SPLIT_VLLM, "vllm/vllm-openai:v0.34.0", ("0.34.0", "0.33.0", "0.32.0", "0.23.0"), "nixl",
        VLLM_METRICS, kv_roles=_KV_SPLIT, all2all="flag", rank_header=True, kv_offload="flags",
    ),
    EngineProfile(
        "vllm", (0, 14, 0), "vllm/vllm-openai:v0.14.0", ("0.14.0",), "nixl", VLLM_METRICS,
        kv_roles=_KV_BOTH, all2all="flag", rank_header=True, kv_offload="flags",
    ),
    EngineProfile(
        "vllm", (0, 11, 1), "vllm/vllm-openai:v0.11.1", ("0.11.1",), "nixl", VLLM_METRICS,
        kv_roles=_KV_BOTH, all2all="flag",
    ),
    EngineProfile(
        "vllm", (0, 11, 0), "vllm/vllm-openai:v0.11.0", ("0.11.0",), "nixl", VLLM_011_METRICS,
        kv_roles=_KV_BOTH, all2all="env", multi_node_tp=False, side_channel_stride="rank-x-tp",
    ),
    EngineProfile(
        "sglang", (0, 5, 23), "lmsysorg/sglang:v0.5.23", ("0.5.23",), "bootstrap", SGLANG_METRICS,
        dp_attention="attn-dp-size", metrics_flags=("--enable-metrics",), chat="sglang", kv_offload="hicache",
    ),
    EngineProfile(
        "sglang", (0, 5, 3), "lmsysorg/sglang:v0.5.3", ("0.5.3",), "bootstrap", SGLANG_METRICS,
        dp_attention="enable-dp-attention",
        metrics_flags=("--enable-metrics", "--collect-tokens-histogram"), chat="sglang", kv_offload="hicache",
    ),
)  # fmt: skip
# The emulator speaks the newest vLLM's protocol and flags, and models vLLM's native CPU tier from either form the
# operator renders: --kv-offloading-size, or a P/D pool's MultiConnector with an OffloadingConnector.
EMULATOR: Final = EngineProfile(
    "emulator",
    (0, 0, 0),
    "",
    (),
    "nixl",
    VLLM_METRICS,
    kv_roles=_KV_SPLIT,
    all2all="flag",
    rank_header=True,
    tokens="emulator",
    kv_offload="flags",
)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[-+.][\w.+-]*)?$")


class EngineUnsupported(ValueError):
    """A kind or release the operator cannot serve; the message names it and what would do."""


KV_OFFLOAD_MIN_VLLM: Final = "0.14.0"  # the first vLLM whose offloading takes a size (cpu_bytes_to_use)


def kv_offload_problem(profile: EngineProfile, where: str, backend: str, disk: str | None) -> str | None:
    """Why this release cannot render a pool's kvOffload (`where` names the field); None when it can."""
    release = f"{profile.kind} {profile.version_text}"
    if profile.kind == "emulator":
        if disk is not None:
            return f"{where}.disk: the emulator models a CPU tier only; drop disk"
        if backend != "native":
            return f"{where}.backend {backend!r}: the emulator models vLLM's native offloading only; drop backend"
        return None
    if profile.kv_offload == "none":
        return (
            f"{where} needs {profile.kind} {KV_OFFLOAD_MIN_VLLM} or newer: {release}'s OffloadingConnector takes a"
            " CPU block count, not a size; use a newer image (or spec.engine.version) or drop kvOffload"
        )
    if disk is not None:
        return f"{where}.disk: {release} takes no local-disk tier size from xpyd; drop disk"
    if profile.kv_offload == "hicache" and backend != "native":
        return f"{where}.backend {backend!r}: {profile.kind} offloads with its HiCache; drop backend"
    return None


def parse_version(text: str) -> Version | None:
    """`v0.33.0`, `0.33.0`, `v0.11.1-cu129` -> (major, minor, patch); None for anything else."""
    match = _VERSION.match(text.strip())
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def image_version(image: str) -> Version | None:
    """The version in an image reference's tag (`vllm/vllm-openai:v0.14.1`); None for a digest or custom tag."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return parse_version(name[colon + 1 :]) if colon > slash else None


def of_kind(kind: str) -> tuple[EngineProfile, ...]:
    if kind == "emulator":
        return (EMULATOR,)
    found = tuple(p for p in PROFILES if p.kind == kind)
    if not found:
        raise EngineUnsupported(f"engine kind {kind!r} is not served; xpyd serves {', '.join(KINDS)}")
    return found


def newest(kind: str) -> EngineProfile:
    """The profile of a kind's newest release: its image is the default."""
    return of_kind(kind)[0]


def default_image(kind: str) -> str:
    return newest(kind).image


def oldest_supported(kind: str) -> EngineProfile:
    return of_kind(kind)[-1]


def for_version(kind: str, version: Version) -> EngineProfile:
    """The profile serving `version` of `kind`; EngineUnsupported outside the range xpyd checks."""
    profiles = of_kind(kind)
    if kind == "emulator":
        return profiles[0]
    top = newest(kind)
    if version[:2] > top.since[:2] and version[:2] > _newest_released(top)[:2]:
        raise EngineUnsupported(
            f"{kind} {_text(version)} is newer than the newest release xpyd has checked ({kind} "
            f"{top.released[0]}); set spec.engine.version to a checked release the image is compatible with"
        )
    for profile in profiles:
        if version >= profile.since:
            return profile
    raise EngineUnsupported(
        f"{kind} {_text(version)} is older than the oldest release xpyd serves ({kind} "
        f"{oldest_supported(kind).version_text}); use a newer image"
    )


def resolve(kind: str, image: str | None, version: str | None) -> EngineProfile:
    """The profile for a pool's engine: spec.engine.version, else the image tag's, else the default image's."""
    if kind == "emulator":
        return EMULATOR
    if version is not None:
        parsed = parse_version(version)
        if parsed is None:
            raise EngineUnsupported(f"spec.engine.version {version!r} is no version; write it as 0.33.0")
        return for_version(kind, parsed)
    if image is None:
        return newest(kind)
    found = image_version(image)
    if found is None:
        raise EngineUnsupported(
            f"spec.engine.image {image!r} names no {kind} version in its tag; set spec.engine.version to the "
            f"release it contains (xpyd serves {kind} {oldest_supported(kind).version_text} to "
            f"{newest(kind).released[0]})"
        )
    return for_version(kind, found)


def supported_releases(kind: str) -> tuple[str, ...]:
    """Every release of `kind` the contract test checks, newest first."""
    return tuple(r for p in of_kind(kind) for r in p.released)


def _newest_released(profile: EngineProfile) -> Version:
    parsed = parse_version(profile.released[0]) if profile.released else None
    return parsed or profile.since


def _text(version: Version) -> str:
    return ".".join(map(str, version))


_COLUMNS: Final = ("Engine", "Releases", "Checked against (wheels)", "KV handoff", "kv_role (prefill / decode)",
                   "MoE all-to-all kernel", "Multi-node tensor parallel", "Routes to each data-parallel rank",
                   "Data-parallel attention", "Serves /metrics", "CPU KV tier (kvOffload)")  # fmt: skip
_ALL2ALL: Final = {"flag": "`--all2all-backend`", "env": "`VLLM_ALL2ALL_BACKEND`", "none": "-"}
_KV_OFFLOAD: Final = {"flags": "`--kv-offloading-size`; P/D: MultiConnector + OffloadingConnector",
               "hicache": "`--enable-hierarchical-cache --hicache-size`",
               "none": f"no (from {KV_OFFLOAD_MIN_VLLM})"}  # fmt: skip
_DP_ATTENTION: Final = {"attn-dp-size": "`--attn-dp-size`", "enable-dp-attention": "`--dp-size --enable-dp-attention`",
                        "none": "-"}  # fmt: skip


def _matrix_row(p: EngineProfile, newer: EngineProfile | None) -> list[str]:
    top = _newest_released(p)
    upper = f"before {newer.version_text}" if newer else f"through {top[0]}.{top[1]}.x"
    vllm = p.kind == "vllm"
    return [
        p.kind,
        f"from {p.version_text}, {upper}",
        ", ".join(p.released) or "-",
        {"nixl": "NIXL, two hops", "bootstrap": "bootstrap room, both at once"}[p.handoff],
        f"`{p.kv_roles['prefill']}` / `{p.kv_roles['decode']}`" if p.kv_roles else "-",
        _ALL2ALL[p.all2all] if vllm else "`--moe-a2a-backend`",
        "yes" if p.multi_node_tp else "no (needs Ray)",
        ("yes" if p.rank_header else "no: the engine balances") if vllm else "no: the engine balances",
        _DP_ATTENTION[p.dp_attention],
        f"with `{' '.join(p.metrics_flags)}`" if p.metrics_flags else "always",
        _KV_OFFLOAD[p.kv_offload],
    ]


def support_matrix() -> str:
    """The engine support matrix as a Markdown table (docs/engines.md quotes it; a test keeps them equal)."""
    rows = [_COLUMNS, tuple("---" for _ in _COLUMNS)]
    for kind in ("vllm", "sglang"):
        profiles = of_kind(kind)
        rows += [tuple(_matrix_row(p, profiles[i - 1] if i else None)) for i, p in enumerate(profiles)]
    return "".join("| " + " | ".join(row) + " |\n" for row in rows)


_METRIC_ROWS: Final = (
    ("waiting requests", "waiting"), ("running requests", "running"), ("KV cache usage (0-1)", "kv_usage"),
    ("time to first token", "ttft"), ("inter-token latency", "itl"), ("end-to-end latency", "e2e"),
    ("queue time", "queue_time"), ("prompt tokens", "prompt_tokens"), ("generated tokens", "generation_tokens"),
    ("prompt length per request", "prompt_length"),
    ("prefix-cache queries", "prefix_queries"), ("prefix-cache hits", "prefix_hits"),
    ("prefix-cache hit rate", "cache_hit_rate"), ("KV transfers (decode side)", "kv_transfers"),
)  # fmt: skip


def _names(value: str | tuple[str, ...] | None) -> str:
    names = (value,) if isinstance(value, str) else value or ()
    return ", ".join(f"`{n}`" for n in names) or "-"


def metrics_table() -> str:
    """The metric-name map per engine kind as a Markdown table (docs/engines.md quotes it)."""
    kinds = ("vllm", "sglang")
    rows = [("What xpyd reads", *kinds), ("---",) * (1 + len(kinds))]
    rows += [(label, *(_names(getattr(METRICS[k], attr)) for k in kinds)) for label, attr in _METRIC_ROWS]
    return "".join("| " + " | ".join(row) + " |\n" for row in rows)
