"""Before Kopf starts: credentials that load and an API server that answers, else one clear line."""

from __future__ import annotations

import os
import socket
import time
from urllib.parse import urlsplit

import yaml
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ConfigError


class PreflightError(Exception):
    """The operator cannot start: the message says why and what to do."""


def api_server() -> str:
    """The API server's URL from the in-cluster environment or KUBECONFIG (~/.kube/config)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    try:
        current = KubeConfig.from_env().get()
        if current is None:
            raise PreflightError("the kubeconfig has no current context; pick one with kubectl config use-context")
        server = current.cluster.server
    except ConfigError as exc:
        raise PreflightError(
            f"no Kubernetes credentials: {exc}; run in a pod, or set KUBECONFIG to a kubeconfig file"
        ) from exc
    except (OSError, ValueError, KeyError, AttributeError, yaml.YAMLError) as exc:
        why = " ".join(str(exc).split())
        raise PreflightError(
            f"the kubeconfig cannot be read ({why}); point KUBECONFIG at a valid kubeconfig file"
        ) from exc
    return str(server)


def wait_reachable(server: str, timeout_s: float, attempt_s: float = 2.0) -> None:
    """TCP-connect to the API server until it accepts or `timeout_s` has passed."""
    parts = urlsplit(server)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    if not host:
        raise PreflightError(f"the API server address {server!r} has no host; fix the kubeconfig's cluster.server")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=attempt_s):
                return
        except OSError as exc:
            if time.monotonic() + attempt_s > deadline:
                raise PreflightError(
                    f"cannot reach the API server at {server} ({exc.strerror or exc}) for {timeout_s:.0f} s; "
                    "check the cluster is up and the kubeconfig's server address"
                ) from exc
            time.sleep(min(attempt_s, max(0.0, deadline - time.monotonic())))
