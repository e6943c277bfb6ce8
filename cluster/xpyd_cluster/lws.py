"""The LeaderWorkerSet controller (kubernetes-sigs/lws) as a local daemon, with its CRD and webhooks on loopback."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from xpyd_api import labels as L

from . import daemons, pki
from .paths import Layout

Kubectl = Callable[..., str]  # kubectl(*args, stdin=...) -> stdout; raises RuntimeError on failure

NAME = "lws"
CRD = f"{L.LWS_PLURAL}.{L.LWS_GROUP}"
MUTATING = "xpyd-lws-mutating"
VALIDATING = "xpyd-lws-validating"
PROBE_IMAGE = "registry.k8s.io/pause:3.10"


@dataclass(frozen=True)
class Hook:
    """One admission webhook the controller serves: its path and what the API server sends it."""

    name: str
    path: str
    group: str
    resource: str
    lws_pods_only: bool = False  # pod hooks see only pods of a LeaderWorkerSet (they carry its name label)


_LWS_PATH = f"{L.LWS_GROUP.replace('.', '-')}-{L.LWS_VERSION}-leaderworkerset"
MUTATING_HOOKS = (
    Hook("mleaderworkerset.kb.io", f"/mutate-{_LWS_PATH}", L.LWS_GROUP, L.LWS_PLURAL),
    Hook("mpod.kb.io", "/mutate--v1-pod", "", "pods", lws_pods_only=True),
)
VALIDATING_HOOKS = (
    Hook("vleaderworkerset.kb.io", f"/validate-{_LWS_PATH}", L.LWS_GROUP, L.LWS_PLURAL),
    Hook("vpod.kb.io", "/validate--v1-pod", "", "pods", lws_pods_only=True),
)

# The controller's client certificate (user xpyd:lws-controller) is bound to cluster-admin: acceptable for
# this throwaway local component, which creates StatefulSets, Services and Pods and edits its own webhooks.
RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": pki.LWS_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": pki.LWS_USER}],
    }
]


def config(layout: Layout) -> dict[str, Any]:
    """The controller's Configuration: webhooks on 127.0.0.1 with our certificate, no leader election."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},  # the cluster CA signs its serving certificate instead
        "webhook": {"port": layout.lws_webhook_port, "host": "127.0.0.1", "certDir": str(layout.lws / "certs")},
        "metrics": {"bindAddress": f"127.0.0.1:{layout.lws_metrics_port}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{layout.lws_health_port}"},
        "clientConnection": {"qps": 200, "burst": 400},
    }


def _webhook(layout: Layout, hook: Hook, ca_bundle: str) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "name": hook.name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": f"https://127.0.0.1:{layout.lws_webhook_port}{hook.path}", "caBundle": ca_bundle},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "timeoutSeconds": 10,
        "rules": [
            {
                "apiGroups": [hook.group],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": [hook.resource],
            }
        ],
    }
    if hook.lws_pods_only:
        rendered["objectSelector"] = {"matchExpressions": [{"key": L.LWS_NAME, "operator": "Exists"}]}
    return rendered


def webhook_configurations(layout: Layout, ca_pem: bytes) -> list[dict[str, Any]]:
    """Mutating and validating webhook configurations that call the controller by URL on loopback."""
    bundle = base64.b64encode(ca_pem).decode()
    api = "admissionregistration.k8s.io/v1"
    return [
        {
            "apiVersion": api,
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": MUTATING},
            "webhooks": [_webhook(layout, h, bundle) for h in MUTATING_HOOKS],
        },
        {
            "apiVersion": api,
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": VALIDATING},
            "webhooks": [_webhook(layout, h, bundle) for h in VALIDATING_HOOKS],
        },
    ]


def probe_lws(namespace: str = "default") -> dict[str, Any]:
    """The smallest LeaderWorkerSet: created with --dry-run=server, it passes through both LWS webhooks."""
    container = {"name": "probe", "image": PROBE_IMAGE}
    return {
        "apiVersion": f"{L.LWS_GROUP}/{L.LWS_VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "xpyd-lws-probe", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {"size": 1, "workerTemplate": {"spec": {"containers": [container]}}},
        },
    }


def argv(layout: Layout) -> list[str]:
    return [
        str(layout.bin / "lws"),
        f"--config={layout.lws / 'config.yaml'}",
        f"--kubeconfig={layout.kubeconfig_for('lws')}",
        "--leader-elect=false",
        "--zap-devel=false",
        "--zap-encoder=console",
        "--zap-log-level=info",
    ]


def install(layout: Layout, kubectl: Kubectl) -> None:
    """The CRD (server-side: it is too big for the last-applied annotation), RBAC and webhooks."""
    if not layout.lws_crd.exists():
        raise FileNotFoundError(f"{layout.lws_crd} is missing: run 'make tools' (cluster/build-tools.sh) again")
    kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=xpyd-cluster", "-f", str(layout.lws_crd))
    daemons.wait_for(f"CRD {CRD}", lambda: _established(kubectl), 60)
    manifests = [*RBAC, *webhook_configurations(layout, (layout.pki / "ca.crt").read_bytes())]
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(manifests))


def _established(kubectl: Kubectl) -> bool:
    conditions = json.loads(kubectl("get", f"crd/{CRD}", "-o", "json")).get("status", {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def start(layout: Layout) -> None:
    """Start the controller (its CRD must be established): config and serving certificate first."""
    layout.lws.mkdir(parents=True, exist_ok=True)
    pki.ensure_serving(layout, layout.lws / "certs", "xpyd-lws-webhook")
    (layout.lws / "config.yaml").write_text(yaml.safe_dump(config(layout)))
    daemons.start(layout, NAME, argv(layout), env={"ENABLE_WEBHOOKS": "true"})


def accepts_lws(kubectl: Kubectl) -> bool:
    """True once the API server can admit a LeaderWorkerSet, i.e. the controller's webhooks answer."""
    try:
        kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", stdin=yaml.safe_dump(probe_lws()))
    except RuntimeError:
        return False
    return True


def wait_ready(layout: Layout, kubectl: Kubectl, timeout: float = 90.0) -> None:
    """Until a LeaderWorkerSet is admitted; fails at once, naming the log, if the controller exited."""
    log = layout.logs / f"{NAME}.log"

    def ready() -> bool:
        if daemons.running(layout, NAME) is None:
            raise RuntimeError(f"the LeaderWorkerSet controller exited; its log: {log}")
        return accepts_lws(kubectl)

    daemons.wait_for("the LeaderWorkerSet controller's webhooks", ready, timeout, log)
