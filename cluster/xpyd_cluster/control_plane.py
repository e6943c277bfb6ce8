"""The local control plane: etcd, kube-apiserver, controller manager, scheduler and kwok on loopback."""

from __future__ import annotations

import ssl
import urllib.request
from pathlib import Path

import yaml

from . import daemons
from .nodes import LOCAL_NODE
from .paths import Layout

SERVICE_CIDR = "10.96.0.0/16"  # Service objects only: no proxy runs, nothing is ever sent there
ISSUER = "https://kubernetes.default.svc.cluster.local"


def _tls(layout: Layout, client: str = "admin") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    ctx.load_cert_chain(str(layout.pki / f"{client}.crt"), str(layout.pki / f"{client}.key"))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def apiserver_ready(layout: Layout) -> bool:
    return _get(f"{layout.server}/readyz", _tls(layout))


def start_etcd(layout: Layout) -> None:
    data = layout.state / "etcd"
    port = layout.etcd_port
    daemons.start(
        layout,
        "etcd",
        [
            str(layout.bin / "etcd"),
            "--name=xpyd-local",
            f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{port}",
            f"--advertise-client-urls=http://127.0.0.1:{port}",
            f"--listen-peer-urls=http://127.0.0.1:{port + 1}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{port + 1}",
            f"--initial-cluster=xpyd-local=http://127.0.0.1:{port + 1}",
            "--listen-metrics-urls=",
            "--log-level=warn",
            "--quota-backend-bytes=4294967296",
            "--unsafe-no-fsync",  # a throwaway test cluster: durability traded for speed
        ],
    )
    daemons.wait_for("etcd", lambda: _get(f"http://127.0.0.1:{port}/health"), 60, layout.logs / "etcd.log")


def start_apiserver(layout: Layout) -> None:
    pki = layout.pki
    daemons.start(
        layout,
        "kube-apiserver",
        [
            str(layout.bin / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{layout.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={layout.apiserver_port}",
            "--endpoint-reconciler-type=none",  # loopback endpoints are invalid; pods reach us via env instead
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--anonymous-auth=false",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-issuer={ISSUER}",
            f"--api-audiences={ISSUER}",
            "--allow-privileged=true",
            "--profiling=false",
            "--watch-cache=true",
            "--max-requests-inflight=800",
            "--max-mutating-requests-inflight=400",
            "--event-ttl=30m",
            "--v=1",
        ],
    )
    daemons.wait_for("kube-apiserver", lambda: apiserver_ready(layout), 120, layout.logs / "kube-apiserver.log")


def start_controllers(layout: Layout) -> None:
    pki = layout.pki
    cm_kc, sched_kc = (
        layout.kubeconfig_for("kube-controller-manager"),
        layout.kubeconfig_for("kube-scheduler"),
    )
    daemons.start(
        layout,
        "kube-controller-manager",
        [
            str(layout.bin / "kube-controller-manager"),
            f"--kubeconfig={cm_kc}",
            f"--authentication-kubeconfig={cm_kc}",
            f"--authorization-kubeconfig={cm_kc}",
            "--bind-address=127.0.0.1",
            "--secure-port=10257",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            "--allocate-node-cidrs=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*,-nodeipam,-cloud-node-lifecycle",
            "--concurrent-statefulset-syncs=20",
            "--concurrent-deployment-syncs=20",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ],
    )
    daemons.start(
        layout,
        "kube-scheduler",
        [
            str(layout.bin / "kube-scheduler"),
            f"--kubeconfig={sched_kc}",
            f"--authentication-kubeconfig={sched_kc}",
            f"--authorization-kubeconfig={sched_kc}",
            "--bind-address=127.0.0.1",
            "--secure-port=10259",
            "--leader-elect=false",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ],
    )


def kwok_config(layout: Layout) -> Path:
    """kwok keeps nodes alive; a pod stage that matches nothing leaves pods to the process kubelet."""
    stage = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": "pods-belong-to-kubelet"},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {"matchLabels": {"xpyd.io/kwok-stage": "never"}},
            "next": {},
        },
    }
    path = layout.state / "kwok.yaml"
    path.write_text(yaml.safe_dump(stage))
    return path


def start_kwok(layout: Layout) -> None:
    daemons.start(
        layout,
        "kwok",
        [
            str(layout.bin / "kwok"),
            f"--kubeconfig={layout.kubeconfig_for('kwok')}",
            f"--config={kwok_config(layout)}",
            f"--manage-nodes-with-label-selector={LOCAL_NODE}=true",
            "--node-ip=127.0.0.1",
            "--cidr=127.1.0.0/16",
            "--node-lease-duration-seconds=40",
            "--server-address=127.0.0.1:10247",
        ],
    )
