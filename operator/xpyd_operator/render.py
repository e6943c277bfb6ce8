"""`xpyd render DD.yaml`: every object the operator would create for a DisaggregatedDeployment, no cluster needed.

Like `helm template`: the operator's own pure builders (desired.desire) run against an empty
cluster of the spec's topology (enough nodes, one NVL72 rack per 72 GPUs), so what is printed
is what a reconcile would apply, less the ownerReferences (the API server assigns the uid). A
spec the operator would refuse (schema, an unknown model, a replica that does not fit its GPUs)
is one line on stderr and exit code 2. `--model-config FILE` stands in for the ConfigMap a spec names
in spec.model.configMap (the model's Hugging Face config.json), which a render cannot read.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import ValidationError

from xpyd_api import labels as L
from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_api.podmodels import NetworkSpec
from xpyd_api.rules import MAX_NAME_LENGTH, TOPOLOGY_KINDS
from xpyd_operator import sizing
from xpyd_operator.desired import Desired, Observed, demands, desire, with_defaults, with_model_config
from xpyd_operator.meta import Owner, default_own_image
from xpyd_operator.placement import NodeInfo
from xpyd_perf import ModelConfigError, Topology, model_from_config, parse_json
from xpyd_perf.modelconfig import describe

DEFAULT_CLIQUE: Final = "00000000-0000-0000-0000-000000000000.0"  # <ClusterUUID>.<CliqueID>, as GPU Feature Discovery
EXIT_INPUT: Final = 2


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # kubectl reads anchors, people do not


class RenderError(ValueError):
    """A spec the operator would refuse; the message is the one line to print."""


@dataclass(frozen=True)
class Options:
    namespace: str | None = None  # default: the manifest's, else "default"
    topology: str | None = None  # replaces spec.topology.kind
    own_image: str = ""
    router_image: str = ""
    pull_secrets: tuple[str, ...] = ()
    default_network: NetworkSpec | None = None
    compute_domain: bool = True  # whether the cluster serves ComputeDomain (the NVIDIA DRA driver)
    clique: str = DEFAULT_CLIQUE
    model_config: dict[str, Any] | None = None  # --model-config: the config.json spec.model.configMap holds
    model_config_file: str = ""  # its path, for messages


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"spec.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def empty_cluster(topology: Topology | None, gpus: int, widest: int, clique: str) -> list[NodeInfo]:
    """Schedulable, empty nodes of the topology holding `gpus` GPUs with room to spare."""
    if topology is None:
        size = max(8, widest)
        return [NodeInfo(f"node-{i}", {}, size) for i in range(math.ceil(gpus / size) + 1)]
    if topology.nvlink_domain == "clique":
        racks = max(1, math.ceil(gpus / topology.domain_gpus))
        trays = topology.domain_gpus // topology.gpus_per_node
        cliques = [clique] + [f"{clique.rsplit('.', 1)[0]}.{r}" for r in range(1, racks)]
        return [
            NodeInfo(f"{topology.name.lower()}-r{r}-t{t:02d}", topology.node_labels(c), topology.gpus_per_node)
            for r, c in enumerate(cliques)
            for t in range(trays)
        ]
    count = math.ceil(gpus / topology.gpus_per_node) + 1
    labels, size = topology.node_labels(), topology.gpus_per_node
    return [NodeInfo(f"{topology.name.lower()}-{i}", labels, size) for i in range(count)]


def read_spec(doc: dict[str, Any], topology: str | None = None) -> tuple[str, DisaggregatedDeploymentSpec]:
    """A manifest's name and spec as the API server would admit them (`topology` replaces spec.topology.kind);
    RenderError names what it refuses. `xpyd plan --spec` reads its file with this too."""
    meta = doc.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not name or len(name) > MAX_NAME_LENGTH:
        raise RenderError(f"metadata.name must be 1 to {MAX_NAME_LENGTH} characters, got {name!r}")
    body = dict(doc.get("spec") or {})
    if topology is not None:
        if topology not in TOPOLOGY_KINDS:
            raise RenderError(f"--topology must be one of {', '.join(TOPOLOGY_KINDS)}, got {topology!r}")
        body["topology"] = {**(body.get("topology") or {}), "kind": topology}
    try:
        return name, DisaggregatedDeploymentSpec.model_validate(body)
    except ValidationError as exc:
        raise RenderError(f"{name}: {_problems(exc)}") from None


def refusal(name: str, reason: str, message: str) -> str:
    """The line a render (and `xpyd plan --spec`) prints for a spec the operator would refuse."""
    return f"{name}: the operator would refuse it (Ready=False, {reason}): {message}"


def render_objects(doc: dict[str, Any], options: Options) -> tuple[list[str], list[dict[str, Any]]]:
    """What the operator would say (placement, each pool's fits-check) and apply for one manifest."""
    meta = doc.get("metadata") or {}
    name, spec = read_spec(doc, options.topology)
    spec = with_defaults(spec, options.default_network)
    if spec.model.config is None and options.model_config is not None:
        try:
            model_from_config(options.model_config, spec.model.name)
        except ModelConfigError as exc:
            raise RenderError(f"{name}: --model-config {options.model_config_file}: {exc}") from None
        spec = with_model_config(spec, options.model_config)  # as the reconciler reads spec.model.configMap in
    elif spec.model.config is None and (ref := spec.model.config_map) is not None:
        raise RenderError(
            f"{name}: spec.model.configMap names ConfigMap {ref.name!r} (key {ref.key}), which a render cannot "
            "read; pass that config.json with --model-config FILE"
        )
    owner = Owner(name, options.namespace or str(meta.get("namespace") or "default"), "")
    wanted = demands(spec, Observed(), owner)
    nodes = empty_cluster(
        spec.topology.hardware, sum(d.gpus for d in wanted), max((d.gpus_per_replica for d in wanted), default=0),
        options.clique,
    )  # fmt: skip
    observed = Observed(nodes=nodes, compute_domain_crd=options.compute_domain, lws_crd=True)  # a cluster with LWS
    own = options.own_image or default_own_image()
    desired = desire(owner, spec, observed, own, options.router_image or own, options.pull_secrets)
    if desired.error is not None:
        raise RenderError(refusal(name, *desired.error))
    for child in desired.children:
        child["metadata"].pop("ownerReferences", None)
    return _notes(spec, desired), desired.children


def _notes(spec: DisaggregatedDeploymentSpec, desired: Desired) -> list[str]:
    out = []
    if spec.model.config is not None and (model := sizing.catalog_model(spec)) is not None:
        out.append(f"model {spec.model.name} from {sizing.config_source(spec)}: {describe(model)}")
    if (pl := desired.placement) is not None:
        out.append(f"TopologySatisfied={pl.satisfied} ({pl.reason}): {pl.message}; kvPath {pl.kv_path}")
    for role, pool in spec.pools().items():
        fit = sizing.replica_fit_of(spec, pool)
        out.append(
            f"{role}: {fit.summary() if fit else 'not modelled (topology Any, no GPUs or a model of unknown size)'}"
        )
    return out


def deployments(text: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    found = [d for d in docs if d.get("kind") == L.KIND]
    if not found:
        raise RenderError(f"no {L.KIND} in the file (kinds: {', '.join(str(d.get('kind')) for d in docs) or 'none'})")
    for d in found:
        if d.get("apiVersion") != f"{L.GROUP}/{L.VERSION}":
            raise RenderError(f"apiVersion must be {L.GROUP}/{L.VERSION}, got {d.get('apiVersion')!r}")
    return found


def _header(path: str, name: str, notes: list[str]) -> str:
    return "\n".join([f"# Source: xpyd render {path} ({L.KIND} {name})", *(f"# {n}" for n in notes)])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpyd render", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("file", help="a YAML file with one or more DisaggregatedDeployments ('-' for stdin)")
    p.add_argument("--topology", default=None, help=f"render for this kind instead: {', '.join(TOPOLOGY_KINDS)}")
    p.add_argument("-n", "--namespace", default=None, help="namespace of the objects (default: the manifest's)")
    p.add_argument("--image", default="", help="the operator's image (routers, emulated workers)")
    p.add_argument("--router-image", default="", help="router image (default: --image)")
    p.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME", help="as the operator's flag")
    p.add_argument("--default-network", default="", metavar="PROFILE|JSON", help="as the operator's flag")
    p.add_argument("--no-compute-domain", action="store_true", help="as on a cluster without the NVIDIA DRA driver")
    p.add_argument("--clique", default=DEFAULT_CLIQUE, help="the NVL72 clique id to pin to")
    p.add_argument(
        "--model-config", default=None, metavar="FILE",
        help="the model's Hugging Face config.json, as the ConfigMap spec.model.configMap names holds it",
    )  # fmt: skip
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    try:
        network = NetworkSpec.parse(args.default_network)
    except (ValidationError, ValueError) as exc:
        print(f"xpyd render: --default-network: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_INPUT
    model_config = None
    if args.model_config is not None:  # a missing file: the dispatcher's one line (xpyd_cli.errors)
        try:
            model_config = parse_json(Path(args.model_config).read_text(encoding="utf-8"), args.model_config)
        except ModelConfigError as exc:
            print(f"xpyd render: --model-config {exc}", file=sys.stderr)
            return EXIT_INPUT
    options = Options(
        args.namespace, args.topology, args.image, args.router_image, tuple(args.image_pull_secret), network,
        not args.no_compute_domain, args.clique, model_config, args.model_config or "",
    )  # fmt: skip
    out: list[str] = []
    items: list[dict[str, Any]] = []
    try:
        for doc in deployments(text):
            notes, children = render_objects(doc, options)
            items += children
            out.append(_header(args.file, doc["metadata"]["name"], notes) + "\n")
            out += ["---\n" + yaml.dump(c, Dumper=_Dumper, sort_keys=False, width=120) for c in children]
    except RenderError as exc:
        print(f"xpyd render: {args.file}: {exc}", file=sys.stderr)
        return EXIT_INPUT
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2))
    else:
        print("".join(out), end="")
    return 0
