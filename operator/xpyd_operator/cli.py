"""`xpyd operator`: run the Kopf operator in-cluster or from KUBECONFIG."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os

import kopf
from pydantic import ValidationError

from xpyd_api.podmodels import NetworkSpec
from xpyd_http import hub
from xpyd_operator import opmetrics, preflight
from xpyd_operator.handlers import Options, register
from xpyd_operator.modelhub import HubSettings
from xpyd_operator.reconcile import Config
from xpyd_operator.routerkit import MonitorSettings


def _on(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _labels(text: str) -> dict[str, str]:
    """--pod-monitor-labels: a JSON object of strings; ValueError naming the problem."""
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
        raise ValueError("want a JSON object of string labels")
    return dict(doc)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpyd operator", description=__doc__)
    p.add_argument("-n", "--namespace", action="append", default=[], help="watch only this namespace (repeatable)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)")
    p.add_argument(
        "--peering",
        default=None,
        help="Kopf peering name for several operator replicas (default: standalone)",
    )
    p.add_argument("--priority", type=int, default=0, help="Kopf peering priority")
    p.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=float(os.environ.get("XPYD_RESYNC_SECONDS", "30")),
        help="period of the level-based re-check of every object (default 30, env XPYD_RESYNC_SECONDS)",
    )
    p.add_argument("--concurrency", type=int, default=16, help="reconciles running at once")
    p.add_argument(
        "--image",
        default=os.environ.get("XPYD_IMAGE", ""),
        help="xpyd's image for routers and emulator pools (env XPYD_IMAGE; default ghcr.io/xpyd/xpyd:VER)",
    )
    p.add_argument(
        "--router-image",
        default=os.environ.get("XPYD_ROUTER_IMAGE", ""),
        help="router image (env XPYD_ROUTER_IMAGE; default: --image)",
    )
    p.add_argument(
        "--image-pull-secret",
        action="append",
        default=[s for s in os.environ.get("XPYD_IMAGE_PULL_SECRETS", "").split(",") if s],
        metavar="NAME",
        help="pull secret for every pod it makes (repeatable; env XPYD_IMAGE_PULL_SECRETS, comma-separated)",
    )
    p.add_argument(
        "--default-network",
        default=os.environ.get("XPYD_DEFAULT_NETWORK", ""),
        metavar="PROFILE|JSON",
        help="network profile for deployments without spec.network, e.g. InfiniBand or "
        '\'{"profile":"RoCE","annotations":{...}}\' (env XPYD_DEFAULT_NETWORK; default: None)',
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("XPYD_METRICS_PORT") or 0),
        help="serve Prometheus /metrics on this port (env XPYD_METRICS_PORT; 0: off)",
    )
    p.add_argument(
        "--metrics-address",
        default=os.environ.get("XPYD_BIND_HOST", "0.0.0.0"),
        help="address for --metrics-port (env XPYD_BIND_HOST; default all interfaces)",
    )
    p.add_argument(
        "--model-hub",
        action="store_true",
        default=_on(os.environ.get("XPYD_MODEL_HUB", "")),
        help="fetch the config.json of a model outside the catalog that the spec gives none for from the "
        "Hugging Face Hub (needs egress to it; env XPYD_MODEL_HUB; the token of gated models: env HF_TOKEN)",
    )
    p.add_argument(
        "--model-hub-endpoint",
        default=hub.env_endpoint(),
        metavar="URL",
        help=f"the hub or a mirror for --model-hub (env HF_ENDPOINT; default {hub.DEFAULT_ENDPOINT})",
    )
    p.add_argument(
        "--router-pod-monitor",
        action="store_true",
        default=_on(os.environ.get("XPYD_ROUTER_POD_MONITOR", "")),
        help="where the cluster serves the Prometheus Operator's PodMonitor: one per deployment whose router serves "
        "TLS, scraping it over HTTPS with the TLS Secret's ca.crt (env XPYD_ROUTER_POD_MONITOR; the chart sets it "
        "with its own PodMonitor)",
    )
    p.add_argument(
        "--pod-monitor-interval",
        default=os.environ.get("XPYD_POD_MONITOR_INTERVAL") or "15s",
        help="scrape interval of those PodMonitors (env XPYD_POD_MONITOR_INTERVAL)",
    )
    p.add_argument(
        "--pod-monitor-labels",
        default=os.environ.get("XPYD_POD_MONITOR_LABELS", ""),
        metavar="JSON",
        help='labels on those PodMonitors, e.g. \'{"release":"kube-prometheus-stack"}\' (env XPYD_POD_MONITOR_LABELS)',
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the API server to accept connections before giving up (exit 2)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.namespace and args.all_namespaces:
        print("xpyd operator: use either --namespace or --all-namespaces", flush=True)
        return 2
    if args.resync_seconds <= 0:
        print("xpyd operator: --resync-seconds must be > 0", flush=True)
        return 2
    try:
        network = NetworkSpec.parse(args.default_network)
    except (ValidationError, ValueError) as exc:
        print(f"xpyd operator: --default-network: {' '.join(str(exc).split())}", flush=True)
        return 2
    model_hub = None
    if args.model_hub:
        model_hub = HubSettings(endpoint=args.model_hub_endpoint.rstrip("/"), token=hub.env_token())
        try:
            hub.check_endpoint(model_hub.fetch_options())
        except hub.HubError as exc:
            print(f"xpyd operator: {exc}", flush=True)
            return 2
    monitor = None
    if args.router_pod_monitor:
        try:
            monitor = MonitorSettings(args.pod_monitor_interval, _labels(args.pod_monitor_labels))
        except ValueError as exc:
            print(f"xpyd operator: --pod-monitor-labels: {exc}", flush=True)
            return 2
    try:
        preflight.wait_reachable(preflight.api_server(), args.startup_timeout)
    except preflight.PreflightError as exc:
        print(f"xpyd operator: {exc}", flush=True)
        return 2
    kopf.configure(verbose=args.verbose, quiet=args.quiet)
    for name in ("httpx", "httpx2", "httpcore") + (() if args.verbose else ("kopf.objects",)):
        logging.getLogger(name).setLevel(logging.WARNING)  # one line per watch event is noise
    options = Options(
        namespaces=list(args.namespace),
        resync_seconds=args.resync_seconds,
        concurrency=args.concurrency,
        config=Config(
            args.image,
            args.router_image,
            tuple(args.image_pull_secret),
            default_network=network,
            model_hub=model_hub,
            router_monitor=monitor,
        ),
    )
    if args.metrics_port:
        opmetrics.serve(args.metrics_port, args.metrics_address)
    registry = kopf.OperatorRegistry()
    register(registry, options)
    try:
        asyncio.run(
            kopf.operator(
                registry=registry,
                clusterwide=not args.namespace,
                namespaces=args.namespace,
                standalone=args.peering is None,
                peering_name=args.peering,
                priority=args.priority,
                liveness_endpoint=args.liveness,
            )
        )
    except KeyboardInterrupt:
        return 0
    return 0
