"""Reads a vLLM (or SGLang) command line and the pod's env into the emulator's configuration."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_SIDE_CHANNEL_PORT = 5600


class CommandLineError(ValueError):
    """A command line the emulator cannot read as vLLM or SGLang; the message says why."""


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
    kv_transfer_config: dict[str, object] | None = None
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
    extra_args: list[str] = field(default_factory=list)


def _bool_env(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _engine_parser(engine: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=30000 if engine == "sglang" else 8000)
    p.add_argument("--model", "--model-path", dest="model", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", "--tp", "--tp-size", dest="tp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", "--dp", "--dp-size", dest="dp", type=int, default=1)
    p.add_argument("--enable-expert-parallel", "--enable-dp-attention", dest="dp_attn", action="store_true")
    p.add_argument("--kv-transfer-config", default=None)
    p.add_argument("--max-model-len", "--context-length", dest="max_model_len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", "--chunked-prefill-size", dest="mnbt", type=int, default=8192)
    p.add_argument("--max-num-seqs", "--max-running-requests", dest="max_num_seqs", type=int, default=256)
    p.add_argument("--block-size", "--page-size", dest="block_size", type=int, default=16)
    p.add_argument("--gpu-memory-utilization", "--mem-fraction-static", dest="gmu", type=float, default=0.9)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--enable-prefix-caching", dest="prefix", action="store_true", default=True)
    p.add_argument("--no-enable-prefix-caching", "--disable-radix-cache", dest="prefix", action="store_false")
    p.add_argument("--disaggregation-mode", default=None)
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=None)
    return p


def _split_shell(tokens: list[str]) -> list[str]:
    """Unwrap `sh -c "..."`, `exec` and `env A=B` prefixes so the engine command comes first."""
    while tokens:
        head = os.path.basename(tokens[0])
        if head in {"sh", "bash", "dash"} and "-c" in tokens:
            tokens = shlex.split(tokens[tokens.index("-c") + 1])
        elif head in {"exec", "env"} or ("=" in tokens[0] and not tokens[0].startswith("-")):
            tokens = tokens[1:]
        else:
            break
    return tokens


def _engine_args(tokens: list[str]) -> tuple[str, str | None, list[str]]:
    """(engine, positional model or None, flags) for the recognised command line forms."""
    if not tokens:
        raise CommandLineError("missing the vLLM command line after `--` (e.g. `vllm serve MODEL --port 8000`)")
    head = os.path.basename(tokens[0])
    if tokens[0].startswith("-"):  # only args: the image's entrypoint is vLLM's api_server
        return "vllm", None, tokens
    if head == "vllm":
        if len(tokens) < 2 or tokens[1] != "serve":
            raise CommandLineError(f"expected `vllm serve MODEL ...`, got {shlex.join(tokens[:3])!r}")
        rest = tokens[2:]
        if rest and not rest[0].startswith("-"):
            return "vllm", rest[0], rest[1:]
        return "vllm", None, rest
    if head.startswith("python") and len(tokens) >= 3 and tokens[1] == "-m":
        module = tokens[2]
        if module.startswith("vllm.entrypoints"):
            return "vllm", None, tokens[3:]
        if module.startswith("sglang.launch_server"):
            return "sglang", None, tokens[3:]
        raise CommandLineError(f"python module {module!r} is neither vLLM's api_server nor sglang.launch_server")
    raise CommandLineError(
        f"not a vLLM or SGLang command line: {shlex.join(tokens[:4])!r}; expected "
        "`vllm serve MODEL ...`, `python3 -m vllm.entrypoints.openai.api_server --model M ...` "
        "or `python3 -m sglang.launch_server ...`"
    )


def parse_engine_command(
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    gpu: str | None = None,
    speedup: float | None = None,
    zero_delay: bool | None = None,
) -> EmulatorConfig:
    """The emulator configuration for an engine command line plus env (flags given win over env)."""
    engine, model, flags = _engine_args(_split_shell(list(command)))
    try:
        ns, extra = _engine_parser(engine).parse_known_args(flags)
    except (argparse.ArgumentError, ValueError) as exc:
        raise CommandLineError(f"bad engine flag: {exc}") from exc
    model = model or ns.model or ("facebook/opt-125m" if engine == "vllm" else None)
    if model is None:
        raise CommandLineError("SGLang command line needs --model-path")
    kv_config = None
    if ns.kv_transfer_config:
        try:
            kv_config = json.loads(ns.kv_transfer_config)
        except json.JSONDecodeError as exc:
            raise CommandLineError(f"--kv-transfer-config is not JSON: {exc}") from exc
        if not isinstance(kv_config, dict):
            raise CommandLineError("--kv-transfer-config must be a JSON object")
    host = env.get("XPYD_BIND_HOST") or ns.host or "127.0.0.1"  # vLLM binds all interfaces; we stay local
    side_host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or (host if host not in {"0.0.0.0", "::", ""} else "127.0.0.1")
    cfg = EmulatorConfig(
        model=model,
        served_model_names=list(ns.served_model_name or [model]),
        host=host,
        port=ns.port,
        tp=max(1, ns.tp),
        dp=max(1, ns.dp),
        dp_attention=bool(ns.dp_attn and ns.dp > 1),
        kv_transfer_config=kv_config,
        max_model_len=ns.max_model_len,
        max_num_batched_tokens=max(1, ns.mnbt),
        max_num_seqs=max(1, ns.max_num_seqs),
        block_size=max(1, ns.block_size),
        gpu_memory_utilization=ns.gmu,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        enable_prefix_caching=ns.prefix,
        engine=engine,
        disaggregation_mode=ns.disaggregation_mode,
        bootstrap_port=ns.disaggregation_bootstrap_port,
        gpu=gpu or env.get("XPYD_GPU") or "B200",
        speedup=speedup if speedup is not None else float(env.get("XPYD_SPEEDUP") or 1.0),
        zero_delay=zero_delay if zero_delay else _bool_env(env.get("XPYD_ZERO_DELAY")),
        kv_lease_seconds=float(env.get("XPYD_KV_LEASE_SECONDS") or 30.0),
        node_name=env.get("XPYD_NODE_NAME") or None,
        nvlink_domain=env.get("XPYD_NVLINK_DOMAIN") or env.get("XPYD_NODE_NAME") or None,
        side_channel_host=side_host,
        side_channel_port=int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT") or DEFAULT_SIDE_CHANNEL_PORT),
        extra_args=extra,
    )
    if cfg.speedup <= 0:
        raise CommandLineError(f"speed-up must be > 0, got {cfg.speedup}")
    return cfg
