"""Injected KV-pull faults (`--fault-kv-pull-*`): a decode's pulls from chosen prefill peers fail or are slow
for a while, so a router's pair self-healing can be measured against workers that answer as vLLM does.

A failing pull is answered as vLLM's failed NIXL read with kv_load_failure_policy=fail (HTTP 500, the same
answer as a refused handshake; recomputed with kv_load_failure_policy=recompute); the prefill's blocks stay
leased until their lease expires, as a real failed read leaves them. A slow pull waits `delay` more real
seconds (not scaled by --speedup), counted in the decode's NIXL transfer time. The fault starts `at`
seconds after the worker starts, or at each SIGUSR1 (`at` None), and lasts `lasting` seconds (None: for good).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xpyd_emulator.cmdline import EmulatorConfig

log = logging.getLogger("xpyd.emulator")
SIGNAL_WORD = "SIGUSR1"
Peer = tuple[str, int | None]  # a side channel's host, and its port (None: any port)


def parse_peer(text: str) -> Peer:
    """`HOST`, `HOST:PORT` or `[IPv6]:PORT`; raises ValueError naming the entry."""
    raw = text.strip()
    host, port = raw, ""
    if raw.startswith("["):
        host, _, rest = raw[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    elif raw.count(":") == 1:
        host, port = raw.split(":")
    number = int(port) if port.isdigit() else 0
    if (port and not 0 < number < 65536) or not (_is_ip(host) or _host_name(host)):
        raise ValueError(f"{text!r} is not HOST or HOST:PORT (a port in [1, 65535])")
    return host.lower(), number or None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _host_name(text: str) -> bool:
    parts = text.split(".")
    return 0 < len(text) <= 253 and all(
        0 < len(p) <= 63 and p.replace("-", "").isalnum() and p.isascii() for p in parts
    )


def peer_list(text: str) -> object:
    """A comma-separated list of peers, checked; kept as text (the worker parses it again)."""
    peers = [part for part in text.split(",") if part.strip()]
    if not peers:
        raise ValueError("the peer list is empty")
    for part in peers:
        parse_peer(part)
    return text


def start_time(text: str) -> object:
    """Seconds after the start (a number >= 0), or None for SIGUSR1."""
    if text.strip().upper() == SIGNAL_WORD:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a number of seconds nor {SIGNAL_WORD}") from None
    if not 0 <= value <= 86400:
        raise ValueError(f"{text} is out of range [0, 86400]")
    return value


def _peers(text: str | None) -> frozenset[Peer]:
    return frozenset(parse_peer(p) for p in (text or "").split(",") if p.strip())


@dataclass
class KvPullFault:
    """Which peers' pulls fail or are slow, by how much, and when the fault is on."""

    fail_from: frozenset[Peer]
    slow_from: frozenset[Peer]
    delay: float
    at: float | None  # seconds after the worker starts; None: at each SIGUSR1
    lasting: float | None  # None: for good
    since: float | None = None  # loop time the fault began (None: not yet)

    @classmethod
    def from_config(cls, cfg: EmulatorConfig) -> KvPullFault | None:
        fail, slow = _peers(cfg.fault_kv_pull_fail_from), _peers(cfg.fault_kv_pull_slow_from)
        if not fail and not (slow and cfg.fault_kv_pull_delay > 0):
            return None
        return cls(fail, slow, cfg.fault_kv_pull_delay, cfg.fault_kv_pull_at, cfg.fault_kv_pull_for)

    def on(self, now: float) -> bool:
        since = self.since
        return since is not None and since <= now and (self.lasting is None or now < since + self.lasting)

    def hit(self, host: str, port: int, now: float) -> tuple[float, bool]:
        """(extra seconds, fails) for a pull from `host:port` now; (0.0, False) when the fault spares it."""
        if not self.on(now):
            return 0.0, False
        key = host.lower()

        def listed(peers: frozenset[Peer]) -> bool:
            return (key, port) in peers or (key, None) in peers

        return (self.delay if listed(self.slow_from) else 0.0), listed(self.fail_from)

    def begin(self) -> None:
        """The fault starts now (again, at a second SIGUSR1)."""
        loop = asyncio.get_running_loop()
        self.since = loop.time()
        how = f"for {self.lasting:g} s" if self.lasting is not None else "until the process ends"
        log.warning("KV pull fault on %s: pulls from %s fail, from %s take %g s more", how,
                    _names(self.fail_from), _names(self.slow_from), self.delay)  # fmt: skip
        if self.lasting is not None:
            since = self.since
            loop.call_later(self.lasting, self._ended, since)

    def _ended(self, since: float) -> None:
        if self.since == since:  # not restarted meanwhile
            log.warning("KV pull fault over: pulls work again")

    def arm(self) -> None:
        """Start the fault at its time, or install the SIGUSR1 handler that starts it."""
        loop = asyncio.get_running_loop()
        if self.at is not None:
            loop.call_later(self.at, self.begin)
            return
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGUSR1, self.begin)

    def disarm(self) -> None:
        if self.at is None:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)


def _names(peers: frozenset[Peer]) -> str:
    return ",".join(sorted(h if p is None else f"{h}:{p}" for h, p in peers)) or "none"
