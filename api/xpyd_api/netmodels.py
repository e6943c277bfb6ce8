"""spec.networkPolicy: the NetworkPolicies the operator generates for a deployment (docs/security.md#network-policy).

It is its own field, not under spec.network: spec.network is the RDMA fabric (its `profile` is required, and a
deployment that sets it no longer gets the operator's --default-network), while a policy applies to every fabric.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Final

from pydantic import ConfigDict, Field, field_validator, model_validator

from xpyd_api.apibase import ApiModel, cel

ANYWHERE_V4: Final = "0.0.0.0/0"
# Prometheus' own pods as the Prometheus Operator (and kube-prometheus-stack) labels them, in any namespace.
PROMETHEUS_POD_LABELS: Final = {"app.kubernetes.io/name": "prometheus"}


def _cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise ValueError(f"{value!r} is no CIDR such as 10.0.0.0/8 or 0.0.0.0/0") from None
    return value


class PolicyPeer(ApiModel):
    """Pods (by their namespace's labels and their own) or addresses (a CIDR) a rule lets in."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            [
                {
                    "rule": "!has(self.cidr) || (!has(self.namespaceLabels) && !has(self.podLabels))",
                    "message": "a peer is a cidr or pods (namespaceLabels/podLabels), not both",
                },
                {
                    "rule": "has(self.cidr) || has(self.namespaceLabels) || has(self.podLabels)",
                    "message": "a peer names a cidr, namespaceLabels or podLabels",
                },
            ]
        )
    )

    namespace_labels: dict[str, str] | None = Field(
        default=None,
        description="Namespaces by label ({} = every namespace); omitted: the deployment's own namespace.",
    )
    pod_labels: dict[str, str] | None = Field(
        default=None, description="Pods by label in those namespaces; omitted: every pod there."
    )
    cidr: str | None = Field(default=None, description="Addresses instead of pods, e.g. 10.0.0.0/8.")

    @field_validator("cidr")
    @classmethod
    def _valid_cidr(cls, value: str | None) -> str | None:
        return None if value is None else _cidr(value)

    @model_validator(mode="after")
    def _one_kind(self) -> PolicyPeer:
        pods = self.namespace_labels is not None or self.pod_labels is not None
        if self.cidr is not None and pods:
            raise ValueError("a peer is a cidr or pods (namespaceLabels/podLabels), not both")
        if self.cidr is None and not pods:
            raise ValueError("a peer names a cidr, namespaceLabels or podLabels")
        return self

    def manifest(self) -> dict[str, Any]:
        """The NetworkPolicyPeer this stands for."""
        if self.cidr is not None:
            return {"ipBlock": {"cidr": self.cidr}}
        out: dict[str, Any] = {}
        if self.namespace_labels is not None:
            out["namespaceSelector"] = {"matchLabels": dict(self.namespace_labels)}
        out["podSelector"] = {"matchLabels": dict(self.pod_labels or {})}
        return out


def _prometheus() -> PolicyPeer:
    return PolicyPeer(namespace_labels={}, pod_labels=dict(PROMETHEUS_POD_LABELS))


class NetworkPolicySpec(ApiModel):
    """One NetworkPolicy per pod role that allows exactly the flows the deployment uses; off by default."""

    enabled: bool = Field(
        default=False,
        description=(
            "Generate the policies. Off by default: on a CNI that enforces them they deny every flow they do not "
            "list (a Gateway's health checks on the pools, a sidecar, a model store on another port)."
        ),
    )
    clients: list[PolicyPeer] = Field(
        default_factory=list, description="Who may call the router's port; empty: anyone (a Gateway, other pods)."
    )
    prometheus: PolicyPeer = Field(
        default_factory=_prometheus,
        description="Who scrapes /metrics on the router and the engines; default: pods labelled "
        "app.kubernetes.io/name=prometheus in any namespace.",
    )
    api_server: list[str] = Field(
        default_factory=lambda: [ANYWHERE_V4],
        description="CIDRs of the API server (ports 443 and 6443) the router's pod watch reaches.",
    )
    hub: list[str] = Field(
        default_factory=lambda: [ANYWHERE_V4],
        description="CIDRs the engines (weights) and the router (tokenizer) reach on HTTPS 443 for the Hugging "
        "Face Hub or HF_ENDPOINT; empty when air-gapped.",
    )

    @field_validator("api_server", "hub")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        return [_cidr(v) for v in values]
