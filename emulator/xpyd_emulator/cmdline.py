"""Reads a vLLM (or SGLang) command line and the pod's env into the emulator's configuration.

Flags the emulator models are range-checked as the engine would check them; other engine flags
are accepted and ignored, except near-misses of modelled ones (`--max-model-length`) which would
silently change what is emulated. vLLM's `--config FILE` (YAML) is read like vLLM reads it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import yaml

from xpyd_api import labels
from xpyd_emulator.errors import CommandLineError
from xpyd_emulator.kv_events import KvEventsConfig, parse_kv_events
from xpyd_emulator.options import env_value, flag_word, knob_values, number
from xpyd_emulator.parallel import GroupPlan, Layout, add_flags, read_group
from xpyd_emulator.shellwords import engine_args, split_shell

__all__ = ["CommandLineError", "EmulatorConfig", "parse_engine_command"]
DEFAULT_SIDE_CHANNEL_PORT = labels.NIXL_PORT
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_EXAMPLE = '\'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\''
# Real engine flags a few edits away from a modelled flag: not typos.
_NEAR_BUT_REAL = {"--ec-transfer-config", "--num-cpu-blocks-override"}


@dataclass(slots=True)
class EmulatorConfig:
    """Everything the server needs, from the engine command line, `xpyd emulate` flags and env."""

    model: str
    served_model_names: list[str]
    host: str = "127.0.0.1"
    port: int = 8000
    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    metrics: bool = True  # serves /metrics (SGLang only with --enable-metrics)
    kv_transfer_config: dict[str, object] | None = None
    kv_events: KvEventsConfig | None = None  # --kv-events-config, when it turns publishing on
    max_model_len: int | None = None
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    engine: str = "vllm"  # "vllm" | "sglang"
    disaggregation_mode: str | None = None  # SGLang: "prefill" | "decode"
    bootstrap_port: int | None = None
    gpu: str = "B200"
    speedup: float = 1.0
    zero_delay: bool = False
    kv_lease_seconds: float = 30.0
    node_name: str | None = None
    nvlink_domain: str | None = None
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = DEFAULT_SIDE_CHANNEL_PORT
    default_output_tokens: int = 256
    kv_peers: str | None = None  # None: the /16 of side_channel_host (see peers.py)
    drain_seconds: float = 25.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_body_bytes: int = 16 << 20
    max_connections: int = 4096
    layout: Layout = field(default_factory=Layout)  # what the timings model: the whole replica on its leader
    group: GroupPlan = field(default_factory=GroupPlan)  # this pod's rank in a multi-node replica
    join_timeout: float = 300.0
    heartbeat_timeout: float = 5.0
    engine_rev: str | None = None  # XPYD_ENGINE_REV: a decode refuses KV from a prefill of another revision
    engine_version: str | None = None  # XPYD_ENGINE_VERSION: the release in its handoff facts (vLLM's hash has it)
    kv_offloading_bytes: int = 0  # vLLM's --kv-offloading-size (GiB) with the native backend: a CPU KV tier
    host_link_gbps: float | None = None  # --host-link-gbps: one GPU's reload rate (None: the topology table's)
    fault_kv_pull_fail_from: str | None = None  # --fault-kv-pull-*: injected KV-pull faults (faults.py)
    fault_kv_pull_slow_from: str | None = None
    fault_kv_pull_delay: float = 1.0
    fault_kv_pull_at: float | None = 0.0  # None: at each SIGUSR1
    fault_kv_pull_for: float | None = None  # None: for good
    extra_args: list[str] = field(default_factory=list)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CommandLineError(f"bad engine flag: {message}")


def _typed(parse: Callable[[str], object]) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


PORT = _typed(number(int, 1, 65535))
POSITIVE = _typed(number(int, 1))
INDEX = _typed(number(int, 0))
BLOCK = _typed(number(int, 1, 1024))
FRACTION = _typed(number(float, 0, 1, open_low=True))
GIB = _typed(number(float, 0, 1 << 20, open_low=True))


def _offload_bytes(ns: argparse.Namespace) -> int:
    """vLLM's --kv-offloading-size GiB as bytes; the emulator models its native backend only."""
    gib = getattr(ns, "offload_gib", None)
    if gib is None:
        return 0
    if ns.offload_backend != "native":
        raise CommandLineError(
            f"--kv-offloading-backend {ns.offload_backend!r}: the emulator models vLLM's native offloading only;"
            " use native"
        )
    return int(gib * (1 << 30))


def _engine_parser(engine: str) -> argparse.ArgumentParser:
    p = _Parser(add_help=False, allow_abbrev=False, exit_on_error=False)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=PORT, default=30000 if engine == "sglang" else 8000)
    p.add_argument("--model", "--model-path", dest="model", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", "--tp", "--tp-size", dest="tp", type=POSITIVE, default=1)
    p.add_argument("--data-parallel-size", "-dp", "--dp", "--dp-size", dest="dp", type=POSITIVE, default=1)
    p.add_argument("--enable-expert-parallel", dest="ep_flag", action="store_true")
    p.add_argument("--enable-dp-attention", dest="dp_attn", action="store_true")
    p.add_argument("--kv-transfer-config", default=None)
    p.add_argument("--kv-events-config", default=None)
    p.add_argument("--max-model-len", "--context-length", dest="max_model_len", type=POSITIVE, default=None)
    p.add_argument("--max-num-batched-tokens", "--chunked-prefill-size", dest="mnbt", type=POSITIVE, default=8192)
    p.add_argument("--max-num-seqs", "--max-running-requests", dest="max_num_seqs", type=POSITIVE, default=256)
    p.add_argument("--block-size", "--page-size", dest="block_size", type=BLOCK, default=16)
    p.add_argument("--gpu-memory-utilization", "--mem-fraction-static", dest="gmu", type=FRACTION, default=0.9)
    p.add_argument("--num-gpu-blocks-override", type=POSITIVE, default=None)
    p.add_argument("--enable-prefix-caching", dest="prefix", action="store_true", default=True)
    p.add_argument("--no-enable-prefix-caching", "--disable-radix-cache", dest="prefix", action="store_false")
    p.add_argument("--disaggregation-mode", choices=("null", "prefill", "decode"), default=None)
    p.add_argument("--disaggregation-bootstrap-port", type=PORT, default=None)
    p.add_argument("--config", default=None)
    if engine == "sglang":
        p.add_argument("--enable-metrics", dest="enable_metrics", action="store_true")
        # 0.5.3's switch for the prompt-length histogram; the emulator exports it as 0.5.23 does, always
        p.add_argument("--collect-tokens-histogram", dest="tokens_histogram", action="store_true")
        p.add_argument(
            "--attn-dp-size", dest="attn_dp", type=POSITIVE, default=None
        )  # 0.5.23's data-parallel attention
    else:
        p.add_argument("--moe-backend", dest="moe_backend", type=_moe_backend, default="auto")
        p.add_argument("--kv-offloading-size", dest="offload_gib", type=GIB, default=None)  # vLLM 0.14.0 on
        p.add_argument("--kv-offloading-backend", dest="offload_backend", default="native")
    add_flags(p, engine, POSITIVE, INDEX, PORT)
    return p


def _moe_backend(text: str) -> str:
    """vLLM's --moe-backend spelling (lower case, '-' as '_'); which kernel does not change what is emulated."""
    return text.lower().replace("-", "_")


def _attn_dp(ns: argparse.Namespace) -> None:
    """SGLang 0.5.23's `--attn-dp-size N` is data-parallel attention over N ranks, as older releases'
    `--dp-size N --enable-dp-attention`: read it as those."""
    size = getattr(ns, "attn_dp", None)
    if size is None or size == 1:
        return
    if ns.dp not in (1, size):
        raise CommandLineError(
            f"--attn-dp-size {size} with --dp-size {ns.dp}: the emulator models data-parallel attention "
            "alone (give --attn-dp-size only, or the same size to both)"
        )
    ns.dp, ns.dp_attn = size, True


def _distance(a: str, b: str) -> int:
    """Levenshtein distance (flags are short)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def _near_misses(parser: argparse.ArgumentParser, extra: list[str]) -> None:
    """Refuse unknown flags up to three edits from (or an abbreviation of) a flag the emulator models."""
    known = [s for a in parser._actions for s in a.option_strings if s.startswith("--") and len(s) >= 12]
    for token in extra:
        name = token.split("=", 1)[0]
        if not name.startswith("--") or name in _NEAR_BUT_REAL or len(name) < 8:
            continue
        for flag in known:
            if _distance(name, flag) <= 3 or flag.startswith(name):
                raise CommandLineError(
                    f"unknown engine flag {name}: did you mean {flag}? (the emulator models {flag}; "
                    "spell it out in full)"
                )


def _config_file(path: str) -> list[str]:
    """vLLM's `--config FILE`: a YAML mapping of flag names to values, read before the command line."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommandLineError(f"--config {path}: cannot read it ({exc.strerror or exc}); check the path") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        reason = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise CommandLineError(f"--config {path} is not valid YAML ({reason}); fix the file") from None
    if not isinstance(doc, dict):
        raise CommandLineError(f"--config {path} must be a YAML mapping of flag names to values")
    flags: list[str] = []
    for key, value in doc.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        elif value is not None and value is not False:
            flags += [flag, str(value)]
    return flags


OFFLOADING = "OffloadingConnector"  # vLLM's native CPU tier as a connector (what a P/D pool's MultiConnector chains)


def split_connectors(config: dict[str, object]) -> tuple[dict[str, object] | None, int]:
    """A --kv-transfer-config as the handoff connector it names and the CPU tier's bytes it sets.

    A plain connector is the handoff itself, with no tier. vLLM's MultiConnector (what the operator renders for a
    prefill or decode pool with kvOffload) chains the handoff connector and an OffloadingConnector
    (`cpu_bytes_to_use`): the handoff comes back flattened (the outer kv_role and kv_load_failure_policy where it
    sets none), the tier as its bytes; a chain holding only the tier has no handoff (None).
    """
    if config.get("kv_connector") != "MultiConnector":
        return config, 0
    extra = config.get("kv_connector_extra_config")
    chain = extra.get("connectors") if isinstance(extra, dict) else None
    if not isinstance(chain, list) or not chain or not all(isinstance(c, dict) for c in chain):
        raise CommandLineError(
            "--kv-transfer-config MultiConnector needs kv_connector_extra_config.connectors: a list of connector"
            ' objects, e.g. [{"kv_connector":"NixlConnector","kv_role":"kv_producer"},'
            ' {"kv_connector":"OffloadingConnector","kv_connector_extra_config":{"cpu_bytes_to_use":68719476736}}]'
        )
    handoff: dict[str, object] | None = None
    tier = 0
    for i, inner in enumerate(chain):
        name = inner.get("kv_connector")
        where = f"--kv-transfer-config MultiConnector connectors[{i}]"
        if not isinstance(name, str):
            raise CommandLineError(f'{where} needs a "kv_connector" string')
        if name == OFFLOADING:
            size = (inner.get("kv_connector_extra_config") or {}).get("cpu_bytes_to_use")
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise CommandLineError(f"{where} ({OFFLOADING}) needs kv_connector_extra_config.cpu_bytes_to_use, "
                                       f"a positive byte count, got {size!r}")  # fmt: skip
            tier += size
        elif name == "LMCacheConnectorV1":
            raise CommandLineError(f"{where}: the emulator models vLLM's native offloading only; use {OFFLOADING}")
        elif handoff is not None:
            raise CommandLineError(f"{where}: a second handoff connector ({name}); the emulator hands KV over by one")
        else:
            handoff = {key: value for key, value in config.items() if key in ("kv_role", "kv_load_failure_policy")}
            handoff |= inner
    return (_kv_checked(handoff) if handoff is not None else None), tier


def _kv_config(text: str) -> dict[str, object]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandLineError(f"--kv-transfer-config is not JSON ({exc.msg} at column {exc.colno}); "
                               f"pass e.g. {KV_EXAMPLE}") from None  # fmt: skip
    if not isinstance(config, dict):
        raise CommandLineError(f"--kv-transfer-config must be a JSON object, e.g. {KV_EXAMPLE}")
    return _kv_checked(config)


def _kv_checked(config: dict[str, object]) -> dict[str, object]:
    if not isinstance(config.get("kv_connector"), str):
        raise CommandLineError(f'--kv-transfer-config needs a "kv_connector" string, e.g. {KV_EXAMPLE}')
    if config.get("kv_role") is not None and config["kv_role"] not in KV_ROLES:
        raise CommandLineError(f"--kv-transfer-config kv_role {config['kv_role']!r} is not one of {KV_ROLES}")
    policy = config.get("kv_load_failure_policy")
    if policy is not None and policy not in ("recompute", "fail"):
        raise CommandLineError(f"--kv-transfer-config kv_load_failure_policy {policy!r} is not recompute or fail")
    return config


def parse_engine_command(
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    gpu: str | None = None,
    speedup: float | None = None,
    zero_delay: bool | None = None,
    flags: Mapping[str, str | None] | None = None,
) -> EmulatorConfig:
    """The emulator configuration for an engine command line plus env (flags given win over env)."""
    engine, model, args = engine_args(split_shell(list(command), env))
    parser = _engine_parser(engine)
    try:
        ns, extra = parser.parse_known_args(args)
        if ns.config:
            ns, extra = parser.parse_known_args([*_config_file(ns.config), *args])
    except argparse.ArgumentError as exc:
        raise CommandLineError(f"bad engine flag: {exc}") from None
    _near_misses(parser, extra)
    _attn_dp(ns)
    model = model or ns.model or ("facebook/opt-125m" if engine == "vllm" else None)
    if model is None:
        raise CommandLineError("SGLang command line needs --model-path MODEL")
    host = env.get("XPYD_BIND_HOST") or ns.host or "127.0.0.1"  # vLLM binds all interfaces; we stay local
    side_host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or (host if host not in {"0.0.0.0", "::", ""} else "127.0.0.1")
    lease = env_value(env, "VLLM_NIXL_ABORT_REQUEST_TIMEOUT", number(float, 0, 86400, True), 30.0)
    side_port = env_value(env, "VLLM_NIXL_SIDE_CHANNEL_PORT", number(int, 1, 65535), DEFAULT_SIDE_CHANNEL_PORT)
    kv_config, chained_tier = (
        split_connectors(_kv_config(ns.kv_transfer_config)) if ns.kv_transfer_config else (None, 0)
    )
    flag_tier = _offload_bytes(ns)
    if chained_tier and flag_tier:
        raise CommandLineError(
            f"the CPU tier is given twice: --kv-offloading-size and an {OFFLOADING} in --kv-transfer-config; keep one"
        )
    cfg = EmulatorConfig(
        model=model,
        served_model_names=list(ns.served_model_name or [model]),
        host=host,
        port=ns.port,
        tp=ns.tp,
        dp=ns.dp,
        dp_attention=bool((ns.dp_attn or ns.ep_flag) and ns.dp > 1),
        metrics=engine != "sglang" or ns.enable_metrics,
        kv_transfer_config=kv_config,
        kv_events=parse_kv_events(ns.kv_events_config, engine) if ns.kv_events_config else None,
        max_model_len=ns.max_model_len,
        max_num_batched_tokens=ns.mnbt,
        max_num_seqs=ns.max_num_seqs,
        block_size=ns.block_size,
        gpu_memory_utilization=ns.gmu,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        enable_prefix_caching=ns.prefix,
        engine=engine,
        disaggregation_mode=None if ns.disaggregation_mode == "null" else ns.disaggregation_mode,
        bootstrap_port=ns.disaggregation_bootstrap_port,
        gpu=gpu or env.get("XPYD_GPU") or "B200",
        speedup=speedup if speedup is not None else env_value(env, "XPYD_SPEEDUP", number(float, 0, 1e9, True), 1.0),
        zero_delay=zero_delay if zero_delay else env_value(env, "XPYD_ZERO_DELAY", flag_word, False),
        kv_lease_seconds=env_value(env, "XPYD_KV_LEASE_SECONDS", number(float, 0, 86400, True), lease),
        node_name=env.get("XPYD_NODE_NAME") or None,
        nvlink_domain=env.get("XPYD_NVLINK_DOMAIN") or env.get("XPYD_NODE_NAME") or None,
        side_channel_host=side_host,
        side_channel_port=side_port,
        kv_offloading_bytes=chained_tier or flag_tier,
        extra_args=extra,
    )
    mode = None if ns.disaggregation_mode == "null" else ns.disaggregation_mode
    cfg.group, cfg.layout = read_group(ns, engine, env, mode)
    for name, value in knob_values(flags or {}, env).items():
        setattr(cfg, name, value)
    if cfg.speedup <= 0:
        raise CommandLineError(f"--speedup must be > 0, got {cfg.speedup}")
    return cfg
