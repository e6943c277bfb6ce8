"""`--kv-events-config`: read as vLLM (KVEventsConfig) or SGLang reads it, with one-line errors.

vLLM publishes when `enable_kv_cache_events` is true and `publisher` is not "null" (it defaults
to "zmq" then); SGLang publishes when `publisher` is "zmq" and ignores keys it does not know.
vLLM rejects unknown keys; so does the emulator in vLLM mode, naming them.

With data parallel, each rank's scheduler publishes on its own sockets: vLLM adds the global rank
to the port of both endpoints (distributed/kv_events.py `ZmqEventPublisher.offset_endpoint_port`:
tcp ports + rank, inproc names + "_dp<rank>", rank 0 unchanged, any other transport refused).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

from xpyd_emulator.errors import CommandLineError

EXAMPLE = '\'{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}\''
_TYPES: dict[str, type | tuple[type, ...]] = {
    "enable_kv_cache_events": bool, "publisher": (str, type(None)), "endpoint": str,
    "replay_endpoint": (str, type(None)), "buffer_steps": int, "hwm": int, "max_queue_size": int, "topic": str,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """Where and how the engine publishes its KV-cache events (vLLM's defaults)."""

    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def bind_address(self, endpoint: str, host: str) -> str:
        """vLLM binds `tcp://*:PORT`; the emulator binds the same port on its own host only."""
        return endpoint.replace("*", host, 1) if endpoint.startswith("tcp://*") else endpoint

    def for_rank(self, rank: int) -> KvEventsConfig:
        """The config data-parallel rank `rank` publishes with (its endpoints offset); ValueError as vLLM."""
        if rank == 0:
            return self
        replay = None if self.replay_endpoint is None else offset_endpoint(self.replay_endpoint, rank)
        return replace(self, endpoint=offset_endpoint(self.endpoint, rank), replay_endpoint=replay)

    @staticmethod
    def binds(endpoint: str) -> bool:
        """vLLM's rule: bind when the address is a wildcard or local transport, else connect to it."""
        return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def offset_endpoint(endpoint: str, rank: int) -> str:
    """`endpoint` for data-parallel rank `rank`: vLLM's offset_endpoint_port rule (ValueError for ipc)."""
    if rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint:
        head, sep, port = endpoint.rpartition(":")
        return f"{head}:{int(port) + rank}" if sep else endpoint
    raise ValueError(f"KV events endpoint {endpoint!r} cannot be offset per data-parallel rank (tcp or inproc only)")


def parse_kv_events(text: str, engine: str) -> KvEventsConfig | None:
    """The publishing config, or None when the flag leaves events off; raises CommandLineError."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandLineError(f"--kv-events-config is not JSON ({exc.msg}); pass e.g. {EXAMPLE}") from None
    if not isinstance(raw, dict):
        raise CommandLineError(f"--kv-events-config must be a JSON object, e.g. {EXAMPLE}")
    unknown = sorted(set(raw) - set(_TYPES))
    if unknown and engine == "vllm":
        raise CommandLineError(f"--kv-events-config has unknown keys {unknown}; known: {sorted(_TYPES)}")
    for key, value in raw.items():
        kind = _TYPES.get(key)
        if kind is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise CommandLineError(f"--kv-events-config {key} has the wrong type: {value!r}")
    publisher = raw.get("publisher")
    if engine == "vllm":
        enabled = raw.get("enable_kv_cache_events", False)
        publisher = publisher or ("zmq" if enabled else "null")
        on = enabled and publisher == "zmq"
    else:
        publisher = publisher or "null"
        on = publisher == "zmq"
    if publisher not in ("null", "zmq"):
        raise CommandLineError(f'--kv-events-config publisher {publisher!r} is not "null" or "zmq"')
    if not on:
        return None
    config = KvEventsConfig(**{f.name: raw[f.name] for f in fields(KvEventsConfig) if f.name in raw})
    for name, endpoint in (("endpoint", config.endpoint), ("replay_endpoint", config.replay_endpoint)):
        if endpoint is not None and not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise CommandLineError(f"--kv-events-config {name} {endpoint!r} must be tcp://HOST:PORT or ipc://PATH")
    if min(config.buffer_steps, config.hwm, config.max_queue_size) < 1:
        raise CommandLineError("--kv-events-config buffer_steps, hwm and max_queue_size must be at least 1")
    return config
