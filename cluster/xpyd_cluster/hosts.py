"""The local cluster's stand-in for DNS: pod host names in /etc/hosts format, in one file the kubelet rewrites."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEADER = "# pod host names of the xpyd local cluster, kept by its process kubelet (there is no DNS)\n"
DOMAIN = "cluster.local"


@dataclass(frozen=True)
class HostEntry:
    """A running pod with spec.hostname and spec.subdomain, as a headless Service's DNS would name it."""

    ip: str
    hostname: str
    subdomain: str
    namespace: str

    def names(self) -> list[str]:
        """<hostname>.<subdomain>.<namespace>, then with .svc and .svc.cluster.local."""
        short = f"{self.hostname}.{self.subdomain}.{self.namespace}"
        return [short, f"{short}.svc", f"{short}.svc.{DOMAIN}"]


def entry_of(pod: dict[str, Any], ip: str) -> HostEntry | None:
    """The pod's entry, or None when it has no hostname and subdomain or its IP is not on loopback."""
    spec, meta = pod.get("spec", {}), pod.get("metadata", {})
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    if not hostname or not subdomain or not ipaddress.ip_address(ip).is_loopback:
        return None
    return HostEntry(ip=ip, hostname=str(hostname), subdomain=str(subdomain), namespace=str(meta.get("namespace", "")))


def render(entries: Iterable[HostEntry]) -> str:
    """/etc/hosts lines sorted by name; when two pods claim one name (a pod and its successor) the last wins."""
    by_name: dict[str, str] = {}
    for entry in entries:
        for name in entry.names():
            by_name[name] = entry.ip
    lines = [f"{ip}\t{name}" for name, ip in sorted(by_name.items())]
    return HEADER + "".join(f"{line}\n" for line in lines)


def write(path: Path, entries: Iterable[HostEntry]) -> None:
    """Replace the file atomically, so a reader sees the old or the new content, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(render(entries))
    tmp.replace(path)
