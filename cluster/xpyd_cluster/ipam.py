"""Loopback pod IPs: every pod gets its own 127.x address, so nothing ever leaves the machine."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

POD_NETWORK = ipaddress.ip_network("127.1.0.0/16")


class PoolExhausted(RuntimeError):
    """No loopback address is left in the pod network."""


class LoopbackIPAM:
    """Hands out addresses of POD_NETWORK, never one in use; state is rebuilt from pod statuses."""

    def __init__(self, in_use: Iterable[str] = ()) -> None:
        self._used = {a for a in in_use if ipaddress.ip_address(a) in POD_NETWORK}
        self._next = 1

    def allocate(self) -> str:
        size = POD_NETWORK.num_addresses
        for _ in range(size):
            candidate = POD_NETWORK.network_address + self._next
            self._next = self._next % (size - 2) + 1
            address = str(candidate)
            if address not in self._used and not address.endswith(".0") and not address.endswith(".255"):
                self._used.add(address)
                return address
        raise PoolExhausted(f"all addresses of {POD_NETWORK} are in use")

    def claim(self, address: str) -> None:
        self._used.add(address)

    def release(self, address: str) -> None:
        self._used.discard(address)
