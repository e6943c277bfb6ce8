"""Which peers this worker pulls KV from, and strict checks of kv_transfer_params and bootstrap_* fields.

A real engine only reads KV from engines of its own deployment. The emulator keeps a list of
allowed peers (`--kv-peers` / XPYD_KV_PEERS: comma-separated CIDRs, addresses or host names)
and answers 400 for a request naming any other host, before opening any connection. The default
is the /16 (IPv6: /64) around its own side-channel host (VLLM_NIXL_SIDE_CHANNEL_HOST, else the
bind address), which holds every pod IP of a Kubernetes node-range pod network, or all of
127.0.0.0/8 (and `localhost`) when that host is a loopback address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from xpyd_api import labels
from xpyd_emulator.errors import ApiError

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_ROOM = (1 << 63) - 1  # SGLang draws bootstrap rooms from [0, 2**63)
MAX_BLOCK_ID = (1 << 31) - 1
SGLANG_BOOTSTRAP_PORT = labels.SGLANG_BOOTSTRAP_PORT
_TEXT_LIMIT = 256


class PeerPolicy:
    """Allowed KV peers: networks for IP literals, exact names for host names (never resolved)."""

    def __init__(self, networks: list[IpNetwork], hosts: set[str]) -> None:
        self.networks = networks
        self.hosts = {h.lower() for h in hosts}

    @classmethod
    def parse(cls, spec: str) -> PeerPolicy:
        """`10.0.0.0/16,10.1.2.3,prefill-0.svc`; raises ValueError naming the bad entry."""
        networks: list[IpNetwork] = []
        hosts: set[str] = set()
        for raw in (part.strip() for part in spec.split(",")):
            if not raw:
                continue
            try:
                networks.append(ipaddress.ip_network(raw, strict=False))
            except ValueError:
                if "/" in raw or not _is_host_name(raw):
                    raise ValueError(f"{raw!r} is neither a CIDR, an IP address nor a host name") from None
                hosts.add(raw)
        if not networks and not hosts:
            raise ValueError("the peer list is empty")
        return cls(networks, hosts)

    @classmethod
    def around(cls, side_channel_host: str) -> PeerPolicy:
        """The default: the /16 (or /64) of the side-channel host; loopback stays on loopback."""
        try:
            ip = ipaddress.ip_address(side_channel_host)
        except ValueError:
            if side_channel_host.lower() == "localhost":
                return cls([ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")], {"localhost"})
            return cls([], {side_channel_host})
        if ip.is_loopback:
            return cls([ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")], {"localhost"})
        prefix = 16 if ip.version == 4 else 64
        return cls([ipaddress.ip_network(f"{ip}/{prefix}", strict=False)], set())

    def allows(self, host: str) -> bool:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return host.lower() in self.hosts
        return any(ip in net for net in self.networks if net.version == ip.version)

    def describe(self) -> str:
        return ",".join([str(n) for n in self.networks] + sorted(self.hosts))


def _is_host_name(text: str) -> bool:
    labels = text.split(".")
    return len(text) <= 253 and all(
        0 < len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii() and label[0] != "-"
        for label in labels
    )


def url_host(host: str) -> str:
    """The host part of a URL: IPv6 literals in brackets."""
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True, slots=True)
class RemoteKv:
    """A decode's validated NixlConnector params: where to pull which blocks, and the prefill's placement."""

    engine_id: str
    block_ids: list[int]
    host: str
    port: int
    tp_size: int | None
    nvlink_domain: str | None
    node_name: str | None


def _bad(field: str, why: str, prefix: str = "kv_transfer_params") -> ApiError:
    return ApiError(f"{prefix}.{field} {why}.", param=f"{prefix}.{field}")


def _int_in(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _opt_text(kv: dict[str, Any], field: str) -> str | None:
    value = kv.get(field)
    if value is not None and (not isinstance(value, str) or len(value) > _TEXT_LIMIT):
        raise _bad(field, f"must be a string of at most {_TEXT_LIMIT} characters or null")
    return value


def check_peer(policy: PeerPolicy, host: str, field: str) -> None:
    """400 (never a connection) for a host outside this deployment's peers."""
    if not policy.allows(host):
        raise ApiError(f"{field} {host!r} is not a KV peer of this worker (allowed: {policy.describe()}).", param=field)


def nixl_flags(kv: dict[str, Any]) -> tuple[bool, bool]:
    """(do_remote_prefill, do_remote_decode), each a boolean or null; not both."""
    flags = []
    for field in ("do_remote_prefill", "do_remote_decode"):
        value = kv.get(field)
        if value is not None and not isinstance(value, bool):
            raise _bad(field, "must be a boolean or null")
        flags.append(bool(value))
    if flags[0] and flags[1]:
        raise _bad("do_remote_prefill", "and do_remote_decode cannot both be true")
    return flags[0], flags[1]


def nixl_remote(kv: dict[str, Any], max_blocks: int, policy: PeerPolicy) -> RemoteKv:
    """Validate a decode's remote_* params (types, ranges, allowed peer); raises ApiError(400)."""
    engine_id = kv.get("remote_engine_id")
    if not isinstance(engine_id, str) or not 0 < len(engine_id) <= _TEXT_LIMIT:
        raise _bad("remote_engine_id", f"must be a non-empty string of at most {_TEXT_LIMIT} characters")
    ids = kv.get("remote_block_ids")
    if not isinstance(ids, list) or not 0 < len(ids) <= max_blocks:
        raise _bad("remote_block_ids", f"must be a list of 1 to {max_blocks} block ids")
    if not all(_int_in(b, 0, MAX_BLOCK_ID) for b in ids):
        raise _bad("remote_block_ids", f"must hold integers in [0, {MAX_BLOCK_ID}]")
    host = kv.get("remote_host")
    if not isinstance(host, str) or not host or len(host) > 253:
        raise _bad("remote_host", "must be a non-empty host name or IP address")
    port = kv.get("remote_port")
    if not _int_in(port, 1, 65535):
        raise _bad("remote_port", "must be an integer in [1, 65535]")
    tp = kv.get("tp_size")
    if tp is not None and not _int_in(tp, 1, 4096):
        raise _bad("tp_size", "must be an integer in [1, 4096] or null")
    domain, node = _opt_text(kv, "xpyd_nvlink_domain"), _opt_text(kv, "xpyd_node_name")
    _opt_text(kv, "remote_request_id")
    check_peer(policy, host, "kv_transfer_params.remote_host")
    assert isinstance(port, int)
    return RemoteKv(engine_id, ids, host, port, tp, domain, node)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """SGLang's disaggregation pairing fields of one request."""

    host: str
    port: int
    room: int


def bootstrap_fields(body: dict[str, Any]) -> Bootstrap | None:
    """Validated bootstrap_host/port/room of an SGLang request (None without them); raises ApiError(400)."""
    host, port, room = body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")
    if host is None and port is None and room is None:
        return None
    if isinstance(host, list) or isinstance(port, list) or isinstance(room, list):
        raise ApiError("batched bootstrap_* lists are not supported: send one prompt.", param="bootstrap_room")
    if not isinstance(host, str) or not host or len(host) > 253:
        raise ApiError("bootstrap_host must be a non-empty host name or IP address.", param="bootstrap_host")
    if port is not None and not _int_in(port, 1, 65535):
        raise ApiError("bootstrap_port must be an integer in [1, 65535] or null.", param="bootstrap_port")
    if not _int_in(room, 0, MAX_ROOM):
        raise ApiError(f"bootstrap_room must be an integer in [0, {MAX_ROOM}].", param="bootstrap_room")
    assert isinstance(room, int)
    return Bootstrap(host, port if isinstance(port, int) else SGLANG_BOOTSTRAP_PORT, room)
