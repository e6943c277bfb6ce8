"""Prometheus for the local cluster: the real server, discovering pods through the local API server.

Built from its Go module like the control plane: Debian's package (2.42) is compiled without
kubernetes_sd_configs, which is exactly what a cluster's Prometheus uses.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import yaml

from . import daemons
from .paths import Layout

SCRAPE_INTERVAL = "2s"

# RBAC for Prometheus's own client certificate (user xpyd:prometheus): discovery needs only reads.
RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "xpyd:prometheus"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods", "nodes", "services", "endpoints"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "xpyd:prometheus"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "xpyd:prometheus",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "xpyd:prometheus"}],
    },
]


def _label(meta: str, target: str) -> dict[str, Any]:
    return {"source_labels": [meta], "target_label": target}


def config(layout: Layout) -> dict[str, Any]:
    """Scrape every running pod annotated prometheus.io/scrape=true, plus file-registered local processes."""
    pki = layout.pki
    tls = {
        "ca_file": str(pki / "ca.crt"),
        "cert_file": str(pki / "prometheus.crt"),
        "key_file": str(pki / "prometheus.key"),
    }
    pods = {
        "job_name": "kubernetes-pods",
        "honor_labels": True,  # the operator's xpyd_* series carry their own namespace label
        "kubernetes_sd_configs": [{"role": "pod", "api_server": layout.server, "tls_config": tls}],
        "relabel_configs": [
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                "action": "keep",
                "regex": "true",
            },
            {"source_labels": ["__meta_kubernetes_pod_phase"], "action": "keep", "regex": "Running"},
            {
                "source_labels": [
                    "__meta_kubernetes_pod_ip",
                    "__meta_kubernetes_pod_annotation_prometheus_io_port",
                ],
                "regex": r"(.+);(\d+)",
                "replacement": "$1:$2",
                "target_label": "__address__",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                "regex": "(.+)",
                "target_label": "__metrics_path__",
            },
            _label("__meta_kubernetes_namespace", "namespace"),
            _label("__meta_kubernetes_pod_name", "pod"),
            _label("__meta_kubernetes_pod_node_name", "node"),
            _label("__meta_kubernetes_pod_label_xpyd_io_deployment", "xpyd_deployment"),
            _label("__meta_kubernetes_pod_label_xpyd_io_role", "xpyd_role"),
        ],
    }
    local = {
        "job_name": "local-processes",
        "file_sd_configs": [{"files": [str(targets_dir(layout) / "*.json")], "refresh_interval": "2s"}],
    }
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
            "scrape_timeout": "1500ms",
        },
        "scrape_configs": [pods, local],
    }


def targets_dir(layout: Layout) -> Path:
    """Drop a file_sd JSON file here to have Prometheus scrape a process that is not a pod."""
    return layout.state / "prometheus" / "targets"


def binary(layout: Layout) -> str | None:
    built = layout.bin / "prometheus"
    return str(built) if built.exists() else None


def ready(layout: Layout) -> bool:
    try:
        with urllib.request.urlopen(f"{layout.prometheus_url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start(layout: Layout) -> None:
    exe = binary(layout)
    if exe is None:
        raise RuntimeError(f"prometheus is not built in {layout.bin}: run cluster/build-tools.sh")
    home = layout.state / "prometheus"
    targets_dir(layout).mkdir(parents=True, exist_ok=True)
    (home / "prometheus.yml").write_text(yaml.safe_dump(config(layout), sort_keys=False))
    daemons.start(
        layout,
        "prometheus",
        [
            exe,
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{layout.prometheus_port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=2d",
            "--log.level=warn",
        ],
    )
    daemons.wait_for("prometheus", lambda: ready(layout), 60, layout.logs / "prometheus.log")
