"""The emulator's own knobs: `xpyd emulate` flags and their env twins, read with one-line errors.

A flag wins over its env variable, which wins over the default. Every value is range-checked
here, so a typo stops the process with one line naming the flag or variable and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from xpyd_emulator.errors import CommandLineError
from xpyd_emulator.faults import SIGNAL_WORD, start_time
from xpyd_emulator.faults import peer_list as fault_peers
from xpyd_emulator.peers import PeerPolicy

MIB = 1 << 20
N = TypeVar("N", int, float)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Knob:
    """One setting: the config field it fills, its flag, its env variable, parser, default and help."""

    field: str
    flag: str
    env: str
    parse: Callable[[str], object]
    default: object
    help: str
    repeat: bool = False  # the flag may be given more than once: its values join as one comma-separated list


def number(kind: Callable[[str], N], low: float, high: float = math.inf, open_low: bool = False) -> Callable[
    [str], N
]:  # fmt: skip
    """A parser for a number in [low, high] (or (low, high] with open_low)."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (low < value if open_low else low <= value) or not value <= high or value != value:
            bound = f"({low:g}" if open_low else f"[{low:g}"
            raise ValueError(f"{text} is out of range {bound}, {high:g}]")
        return value

    return parse


def peer_list(text: str) -> object:
    PeerPolicy.parse(text)  # raises ValueError naming the bad entry
    return text


def mebibytes(text: str) -> int:
    return max(1, int(number(float, 0, 4096, open_low=True)(text) * MIB))


def flag_word(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"", "0", "false", "no", "off"}:
        return False
    raise ValueError(f"{text!r} is not a boolean (use 1 or 0)")


def revision_text(text: str) -> object:
    value = text.strip()
    if not value or len(value) > 63 or not all(c.isalnum() or c in "-_." for c in value):
        raise ValueError(f"{text!r} is not a label value (1 to 63 letters, digits, '-', '_' or '.')")
    return value


KNOBS = (
    Knob("kv_peers", "--kv-peers", "XPYD_KV_PEERS", peer_list, None,
         "CIDRs, addresses or host names this worker may pull KV from (default: the /16 of the "
         "side-channel host; 127.0.0.0/8 when that is loopback)"),
    Knob("drain_seconds", "--drain-timeout", "XPYD_DRAIN_TIMEOUT", number(float, 0, 3600), 25.0,
         "seconds a SIGTERM drain may take before the process exits (default 25, under Kubernetes' "
         "30 s terminationGracePeriodSeconds)"),
    Knob("header_timeout", "--header-timeout", "XPYD_HEADER_TIMEOUT", number(float, 0, 3600, True), 10.0,
         "seconds a client may take to send a request's headers (slowloris guard, default 10)"),
    Knob("body_timeout", "--body-timeout", "XPYD_BODY_TIMEOUT", number(float, 0, 3600, True), 30.0,
         "seconds a client may take to send a request body (default 30)"),
    Knob("max_body_bytes", "--max-body-mb", "XPYD_MAX_BODY_MB", mebibytes, 16 * MIB,
         "largest request body in MiB (default 16); larger ones get 413"),
    Knob("max_connections", "--max-connections", "XPYD_MAX_CONNECTIONS", number(int, 1, 1_000_000), 4096,
         "open client connections at most; more get 503 and are closed (default 4096)"),
    Knob("join_timeout", "--join-timeout", "XPYD_JOIN_TIMEOUT", number(float, 0, 86400, True), 300.0,
         "seconds a non-API rank of a multi-node replica keeps trying to join its leader before it exits 1 "
         "(default 300)"),
    Knob("heartbeat_timeout", "--heartbeat-timeout", "XPYD_HEARTBEAT_TIMEOUT", number(float, 0.2, 600), 5.0,
         "seconds of silence after which a multi-node replica's leader counts a rank lost (its /health turns "
         "503 for good) and a rank its leader (it exits 1); default 5"),
    Knob("host_link_gbps", "--host-link-gbps", "XPYD_HOST_LINK_GBPS", number(float, 0, 100_000, True), None,
         "GB/s one GPU loads KV back from the CPU tier (vLLM's --kv-offloading-size) at (default: 80% of the "
         "GPU's host link in the topology table: 51.2 for PCIe Gen5 on H100/H200/B200, 360 for GB200's NVLink-C2C)"),
    Knob("engine_rev", "--engine-rev", "XPYD_ENGINE_REV", revision_text, None,
         "this worker's engine revision (the pod label xpyd.io/engine-rev, set by the operator): a decode refuses "
         "KV from a prefill of another revision with vLLM's failed-KV-load answer (default: no revision, no check)"),
    Knob("engine_version", "--engine-version", "XPYD_ENGINE_VERSION", revision_text, None,
         "the engine release this worker stands in for (the local cluster's kubelet sets it from the image tag): "
         "part of its handoff facts, so a decode refuses KV from a prefill of another release as vLLM's "
         "compatibility hash does (default: none, no check)"),
    Knob("fault_kv_pull_fail_from", "--fault-kv-pull-fail-from", "XPYD_FAULT_KV_PULL_FAIL_FROM", fault_peers, None,
         "fault: this decode's KV pulls from these prefill side channels (HOST or HOST:PORT, comma-separated or "
         "repeated) fail with vLLM's failed-KV-load answer, HTTP 500, while the fault is on", repeat=True),
    Knob("fault_kv_pull_slow_from", "--fault-kv-pull-slow-from", "XPYD_FAULT_KV_PULL_SLOW_FROM", fault_peers, None,
         "fault: KV pulls from these prefill side channels take --fault-kv-pull-delay more seconds while the "
         "fault is on", repeat=True),
    Knob("fault_kv_pull_delay", "--fault-kv-pull-delay", "XPYD_FAULT_KV_PULL_DELAY", number(float, 0, 600), 1.0,
         "fault: real seconds (not scaled by --speedup) a slow KV pull takes more (default 1)"),
    Knob("fault_kv_pull_at", "--fault-kv-pull-at", "XPYD_FAULT_KV_PULL_AT", start_time, 0.0,
         f"fault: when the KV pull fault starts: seconds after the worker starts (default 0), or {SIGNAL_WORD} "
         "(at each such signal to the process)"),
    Knob("fault_kv_pull_for", "--fault-kv-pull-for", "XPYD_FAULT_KV_PULL_FOR", number(float, 0, 86400, True), None,
         "fault: seconds the KV pull fault lasts once started (default: until the process ends)"),
)  # fmt: skip


def knob_values(flags: Mapping[str, str | None], env: Mapping[str, str]) -> dict[str, object]:
    """Config fields from flags (by field name, raw text) and env; raises CommandLineError naming the source."""
    out: dict[str, object] = {}
    for knob in KNOBS:
        raw, source = flags.get(knob.field), knob.flag
        if raw is None:
            raw, source = env.get(knob.env) or None, knob.env
        if raw is None:
            out[knob.field] = knob.default
            continue
        try:
            out[knob.field] = knob.parse(raw)
        except ValueError as exc:
            raise CommandLineError(f"{source}: {exc}; {knob.help}") from None
    return out


def env_value(env: Mapping[str, str], name: str, parse: Callable[[str], T], default: T) -> T:
    """One env variable through `parse` (default when unset or empty); raises CommandLineError naming it."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return parse(raw)
    except ValueError as exc:
        raise CommandLineError(f"env {name}: {exc}; fix or unset it") from None
