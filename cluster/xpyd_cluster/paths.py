"""Where the local cluster keeps its binaries, state, logs and ports: one place to change them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Layout:
    """Filesystem layout and loopback ports of one local cluster."""

    state: Path
    cache: Path
    apiserver_port: int = 6443
    etcd_port: int = 2379
    prometheus_port: int = 9090
    # The LeaderWorkerSet controller: its admission webhooks, metrics and health, all on 127.0.0.1.
    lws_webhook_port: int = 10270
    lws_metrics_port: int = 10271
    lws_health_port: int = 10272

    @property
    def bin(self) -> Path:
        return self.cache / "bin"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def run(self) -> Path:
        return self.state / "run"

    @property
    def pods(self) -> Path:
        return self.state / "pods"

    @property
    def lws(self) -> Path:
        """The LeaderWorkerSet controller's config file and webhook serving certificate."""
        return self.state / "lws"

    @property
    def lws_crd(self) -> Path:
        """The LeaderWorkerSet CRD, copied from its Go module next to the binaries by build-tools.sh."""
        return self.bin / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"

    @property
    def hosts_file(self) -> Path:
        """Pod host names in /etc/hosts format, kept by the process kubelet (there is no DNS)."""
        return self.state / "hosts"

    @property
    def shims(self) -> Path:
        """Engine stand-ins (vllm, python3) first on an engine pod's PATH."""
        return self.state / "shims"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def kubeconfig_for(self, component: str) -> Path:
        return self.pki / f"{component}.kubeconfig"


def default_layout() -> Layout:
    """The layout named by XPYD_CLUSTER_DIR and XPYD_CACHE, defaulting to <repo>/.cluster and ~/.cache/xpyd."""
    state = Path(os.environ.get("XPYD_CLUSTER_DIR", REPO / ".cluster")).resolve()
    cache = Path(os.environ.get("XPYD_CACHE", Path.home() / ".cache" / "xpyd")).resolve()
    return Layout(state=state, cache=cache)
