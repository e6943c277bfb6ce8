"""The Pod Security Standards (policy version 1.28+) as checks on a pod spec, for the fields pods carry here.

A test-side judge of what the builders make; e2e/test_pod_security.py asks a real API server's
PodSecurity admission the same question. Controls this file does not model (AppArmor, SELinux,
/proc mount, sysctls, Windows) are fields the operator never sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

BASELINE_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
     "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)  # fmt: skip
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
LEVELS = ("restricted", "baseline", "privileged")


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    out = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    out += [f"hostPath volume {v['name']}" for v in pod.get("volumes") or [] if "hostPath" in v]
    pod_seccomp = ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        out.append("pod seccomp Unconfined")
    for c in _containers(pod):
        ctx = c.get("securityContext") or {}
        if ctx.get("privileged"):
            out.append(f"{c['name']}: privileged")
        extra = set((ctx.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if extra:
            out.append(f"{c['name']}: adds {sorted(extra)}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{c['name']}: hostPort")
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{c['name']}: seccomp Unconfined")
    return out


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    out = baseline_violations(pod)
    pod_ctx = pod.get("securityContext") or {}
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']} of type {sorted(kinds)}")
    if pod_ctx.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    for c in _containers(pod):
        ctx = c.get("securityContext") or {}
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation not false")
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            out.append(f"{c['name']}: runAsNonRoot not true")
        if ctx.get("runAsUser") == 0:
            out.append(f"{c['name']}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccomp {seccomp}")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{c['name']}: does not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: adds {sorted(caps['add'])}")
    return out


def level(pod: dict[str, Any]) -> str:
    """The strictest Pod Security Standards level the pod spec meets."""
    if not restricted_violations(pod):
        return "restricted"
    if not baseline_violations(pod):
        return "baseline"
    return "privileged"
