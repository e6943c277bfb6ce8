"""The generated NetworkPolicies (netpolicy.py) against the flows the rendered pods use.

The flows are read from the rendered manifests, not from the builder: container ports, the engines'
command lines (`--kv-events-config`, rank-join and bootstrap flags), the side channel's environment,
the data-parallel and scrape annotations, and the router's command. A small evaluator of
networking.k8s.io/v1 semantics (a pod selected by a policy of a type admits only what one of its rules
allows; policies add up) checks every flow is allowed both out of its source and into its destination,
and that flows no component uses are not. The local test cluster enforces no NetworkPolicy, so these
tables are the rules' test (the e2e test only checks the objects and that traffic still flows).
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api import labels as L
from xpyd_operator import netpolicy
from xpyd_operator.render import Options, render_objects

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").rglob("*.yaml"))
NS = "team-a"
M70 = "meta-llama/Llama-3.1-70B-Instruct"
V11 = "vllm/vllm-openai:v0.11.0"  # its side channel listens on port + rank x tensor parallel


# --- a NetworkPolicy evaluator -----------------------------------------------------------------------------


@dataclass(frozen=True)
class End:
    """A pod (namespace, its labels, pod labels) or an address outside the cluster (ip)."""

    namespace: str | None = None
    namespace_labels: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] | None = None
    ip: str | None = None

    @property
    def is_pod(self) -> bool:
        return self.labels is not None


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the builder uses matchLabels only
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer: dict[str, Any], end: End, policy_ns: str) -> bool:
    if "ipBlock" in peer:
        if end.ip is None or end.is_pod:
            return False
        return ipaddress.ip_address(end.ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"])
    if not end.is_pod:
        return False
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], end.namespace_labels):
            return False
    elif end.namespace != policy_ns:
        return False
    return _matches(peer.get("podSelector") or {}, end.labels or {})


def _port_matches(rule: dict[str, Any], port: int, protocol: str) -> bool:
    if "ports" not in rule:
        return True
    for p in rule["ports"]:
        first = p["port"]
        assert isinstance(first, int), "the builder writes port numbers"
        if p.get("protocol", "TCP") == protocol and first <= port <= p.get("endPort", first):
            return True
    return False


def _side_allows(policies: list[dict[str, Any]], me: End, other: End, port: int, protocol: str, direction: str) -> bool:
    """Whether `me`'s policies of this direction (Ingress/Egress) let the flow with `other` through."""
    if not me.is_pod:
        return True
    mine = [
        p
        for p in policies
        if p["metadata"]["namespace"] == me.namespace
        and _matches(p["spec"]["podSelector"], me.labels or {})
        and direction in p["spec"]["policyTypes"]
    ]
    if not mine:
        return True  # not isolated in this direction
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for p in mine:
        for rule in p["spec"].get(key) or []:
            peers = rule.get(peers_key)
            if peers is not None and not any(_peer_matches(x, other, p["metadata"]["namespace"]) for x in peers):
                continue
            if _port_matches(rule, port, protocol):
                return True
    return False


def allowed(policies: list[dict[str, Any]], src: End, dst: End, port: int, protocol: str = "TCP") -> bool:
    return _side_allows(policies, src, dst, port, protocol, "Egress") and _side_allows(
        policies, dst, src, port, protocol, "Ingress"
    )


# --- the flows the rendered pods use -----------------------------------------------------------------------

NS_LABELS = {"kubernetes.io/metadata.name": NS}
CLIENT = End(ip="203.0.113.7")
OTHER_POD = End("shop", {"kubernetes.io/metadata.name": "shop"}, {"app": "shop"})
PROMETHEUS = End("monitoring", {"kubernetes.io/metadata.name": "monitoring"}, {"app.kubernetes.io/name": "prometheus"})
DNS_POD = End("kube-system", {"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"})
API = End(ip="10.96.0.1")
HUB = End(ip="18.239.50.1")
PICKED_SAMPLES = (1024, 33000, 47123, 65535)  # ports an engine picks at run time (UCX, NCCL, ZMQ)


def pod(name: str, role: str) -> End:
    return End(NS, NS_LABELS, {L.DEPLOYMENT: name, L.ROLE: role, "extra": "label"})


@dataclass(frozen=True)
class Need:
    src: End
    dst: End
    port: int
    protocol: str
    why: str


def _cmd(container: dict[str, Any]) -> list[str]:
    """The engine's words, also out of a multi-node pod's `/bin/sh -c 'exec ...'`."""
    command = list(container.get("command") or [])
    if command[:2] == ["/bin/sh", "-c"]:
        import shlex

        return shlex.split(command[2].removeprefix("exec "))
    return command


def _flag(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words else None


def _templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    spec = obj["spec"]
    if obj["kind"] == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        return [("leader", lwt["leaderTemplate"]), ("worker", lwt["workerTemplate"])]
    return [("", spec["template"])]


def needs_of(name: str, children: list[dict[str, Any]]) -> list[Need]:
    """Every flow the rendered objects imply, each from the manifests' own numbers."""
    out: list[Need] = []
    router = pod(name, "router")
    roles = {c["metadata"]["labels"][L.ROLE] for c in children if c["kind"] in ("StatefulSet", "LeaderWorkerSet")}
    for obj in children:
        if obj["kind"] == "Deployment":
            tmpl = obj["spec"]["template"]
            c = tmpl["spec"]["containers"][0]
            http = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
            out += [Need(CLIENT, router, http, "TCP", "client"), Need(OTHER_POD, router, http, "TCP", "gateway")]
            scrape = int(tmpl["metadata"]["annotations"]["prometheus.io/port"])
            out.append(Need(PROMETHEUS, router, scrape, "TCP", "scrape"))
            if obj["spec"]["replicas"] > 1:
                out.append(Need(router, router, http, "TCP", "peers"))
            out += [Need(router, DNS_POD, 53, "UDP", "dns"), Need(router, DNS_POD, 53, "TCP", "dns")]
            if "--deployment" in c["command"]:
                out += [Need(router, API, 443, "TCP", "api"), Need(router, API, 6443, "TCP", "api")]
            if (_flag(c["command"], "--tokenizer") or "").startswith("hf:"):
                out.append(Need(router, HUB, 443, "TCP", "tokenizer"))
        if obj["kind"] not in ("StatefulSet", "LeaderWorkerSet"):
            continue
        role = obj["metadata"]["labels"][L.ROLE]
        me = pod(name, role)
        peer = {"prefill": "decode", "decode": "prefill"}.get(role)
        for rank, tmpl in _templates(obj):
            c = next(x for x in tmpl["spec"]["containers"] if x["name"] == "engine")
            words = _cmd(c)
            own = "xpyd" in words[:1]
            annotations = tmpl["metadata"].get("annotations") or {}
            api = rank in ("", "leader")
            dp_api = int(annotations.get(L.DATA_PARALLEL_SIZE, "1"))
            dp = int(_flag(words, "--data-parallel-size") or "1")
            tp = int(_flag(words, "--tensor-parallel-size") or "1")
            events = json.loads(_flag(words, "--kv-events-config") or "{}")
            ev_ports = [int(events[k].rsplit(":", 1)[1]) for k in ("endpoint", "replay_endpoint")]
            for p in c.get("ports") or []:
                number, pname = p["containerPort"], p["name"]
                if pname == "http":
                    out.append(Need(router, me, number, "TCP", "route"))
                elif pname in (L.KV_EVENTS_PORT_NAME, L.KV_REPLAY_PORT_NAME):
                    assert number in ev_ports
                elif pname in ("kv-side", "bootstrap") and peer is not None:
                    out.append(Need(pod(name, peer), me, number, "TCP", pname))
                elif pname == "rank-join":
                    out.append(Need(pod(name, role), me, number, "TCP", "rank-join"))
                else:
                    raise AssertionError(f"{role}: port {pname} {number}: who uses it? add it to the flows here")
            if api:
                out.append(Need(PROMETHEUS, me, int(annotations["prometheus.io/port"]), "TCP", "scrape"))
            # every rank's events: pod of rank r publishes on port + r (r < the replica's data-parallel size)
            ranks = max(dp_api, dp)
            for base in ev_ports:
                out += [Need(router, me, base + r, "TCP", "kv-events") for r in range(ranks)]
                if own and rank == "worker" and dp > 1:  # the emulator's members relay from the leader
                    out += [Need(me, pod(name, role), base + r, "TCP", "relay") for r in range(ranks)]
            env = {e["name"]: e.get("value") for e in c.get("env") or []}
            if peer is not None and (side := env.get(L.ENV_NIXL_PORT)) is not None:
                stride = tp if c["image"] == V11 else 1
                out += [Need(pod(name, peer), me, int(side) + r, "TCP", "side") for r in range(dp * stride)]
            if (boot := _flag(words, "--disaggregation-bootstrap-port")) is not None:
                out.append(Need(pod(name, "decode"), me, int(boot), "TCP", "bootstrap"))
            for flag in ("--data-parallel-rpc-port", "--master-port"):
                if (join := _flag(words, flag)) is not None:
                    out.append(Need(me, pod(name, role), int(join), "TCP", "join"))
            if (dist := _flag(words, "--dist-init-addr")) is not None:
                out.append(Need(me, pod(name, role), int(dist.rsplit(":", 1)[1]), "TCP", "join"))
            out += [Need(me, DNS_POD, 53, "UDP", "dns"), Need(me, DNS_POD, 53, "TCP", "dns")]
            if not own:  # vLLM and SGLang: weights from the Hub, and ports they pick themselves
                out.append(Need(me, HUB, 443, "TCP", "weights"))
                if peer is not None and peer in roles:
                    out += [Need(pod(name, peer), me, p, "TCP", "handoff-picked") for p in PICKED_SAMPLES]
                if obj["kind"] == "LeaderWorkerSet":
                    out += [Need(me, pod(name, role), p, "TCP", "rank-picked") for p in PICKED_SAMPLES]
    return out


def render(body: dict[str, Any], name: str = "llama") -> list[dict[str, Any]]:
    doc = {"apiVersion": "xpyd.io/v1alpha1", "kind": L.KIND, "metadata": {"name": name, "namespace": NS}, "spec": body}
    return render_objects(doc, Options(own_image="ghcr.io/xpyd/xpyd:test"))[1]


def policies_of(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] == netpolicy.KIND]


def base(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": M70},
        "topology": {"kind": "HGX-B200"},
        "prefill": {"replicas": 2, "gpusPerReplica": 8},
        "decode": {"replicas": 2, "gpusPerReplica": 8},
        "networkPolicy": {"enabled": True},
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


EMU = {"kind": "emulator"}
COLOCATED = {"mode": "Colocated", "prefill": None, "decode": None, "worker": {"replicas": 2, "gpusPerReplica": 4}}
WIDE = {"replicas": 1, "gpusPerReplica": 16, "dataParallelSize": 16, "expertParallel": True}
DP2 = {"replicas": 1, "gpusPerReplica": 8, "dataParallelSize": 2}
DP4 = {"replicas": 1, "gpusPerReplica": 8, "dataParallelSize": 4}
TWO_NODES = {"replicas": 1, "gpusPerReplica": 16}
R1 = {"name": "deepseek-ai/DeepSeek-R1-0528"}  # wide expert parallel: TP1 x DP16 holds it


def both(pool: dict[str, Any]) -> dict[str, Any]:
    """Prefill and decode of one shape (the handoff check refuses pools of different tensor parallel)."""
    return {"prefill": pool, "decode": pool}


SHAPES: dict[str, dict[str, Any]] = {
    "vllm-disaggregated": base(),
    "vllm-0.11.0-dp-ranks": base(engine={"image": V11}, **both(DP2)),
    "sglang-mooncake-bootstrap": base(engine={"kind": "sglang", "kvConnector": "MooncakeConnector"}),
    "sglang-multi-node": base(engine={"kind": "sglang"}, **both(TWO_NODES)),
    "vllm-colocated": base(**COLOCATED),
    "vllm-multi-node-tp": base(**both(TWO_NODES)),
    "vllm-wide-ep-dp-ranks": base(model=R1, **both(WIDE), router={"replicas": 2}),
    "emulator-disaggregated": base(engine=EMU),
    "emulator-colocated": base(engine=EMU, **COLOCATED),
    "emulator-dp-ranks": base(engine=EMU, **both(DP4)),
    "emulator-multi-node-dp": base(model=R1, engine=EMU, **both(WIDE), router={"replicas": 3}),
    "emulator-multi-node-tp": base(engine=EMU, **both(TWO_NODES)),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_flow_the_pods_use_is_allowed(shape: str) -> None:
    children = render(SHAPES[shape])
    policies = policies_of(children)
    roles = {c["metadata"]["labels"][L.ROLE] for c in children if c["kind"] in ("StatefulSet", "LeaderWorkerSet")}
    assert {p["metadata"]["name"] for p in policies} == {f"llama-{r}" for r in ("router", *roles)}
    needs = needs_of("llama", children)
    assert needs
    denied = [n for n in needs if not allowed(policies, n.src, n.dst, n.port, n.protocol)]
    assert not denied, [(n.why, n.dst.labels, n.port, n.protocol) for n in denied]


def _same(a: End, b: End) -> bool:
    """The same end to a default policy: a pod, or any address (the default CIDRs are 0.0.0.0/0)."""
    return a == b or not (a.is_pod or b.is_pod)


def _used(needs: list[Need], src: End, dst: End, port: int, protocol: str = "TCP") -> bool:
    if port == netpolicy.DNS_PORT and src.is_pod:
        return True  # any resolver: kube-dns, NodeLocal DNSCache, a node's own
    return any(_same(n.src, src) and _same(n.dst, dst) and n.port == port and n.protocol == protocol for n in needs)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_nothing_else_is_allowed(shape: str) -> None:
    """Every (source, destination, port) pair over the ends and the ports the manifests name, plus strays:
    allowed only when some pod uses it (engine-picked ports of vLLM and SGLang aside)."""
    children = render(SHAPES[shape])
    policies = policies_of(children)
    needs = needs_of("llama", children)
    roles = {c["metadata"]["labels"][L.ROLE] for c in children if c["kind"] in ("StatefulSet", "LeaderWorkerSet")}
    pods = [pod("llama", r) for r in ("router", *roles)]
    ends = [*pods, CLIENT, OTHER_POD, PROMETHEUS, DNS_POD, API, HUB]
    picked = [(n.src, n.dst) for n in needs if n.why in ("handoff-picked", "rank-picked")]
    assert bool(picked) == ("emulator" not in shape and shape != "vllm-colocated")
    strays = {80, 22, 2379, 9090, 10250, L.NIXL_PORT + 200}
    ports = {n.port for n in needs} | strays
    for src in ends:
        for dst in ends:
            if src not in pods and dst not in pods:
                continue  # neither end is the deployment's: its policies say nothing
            for port in sorted(ports):
                for protocol in ("TCP", "UDP"):
                    if (src, dst) in picked and protocol == "TCP" and netpolicy.UNPRIVILEGED[0] <= port:
                        continue  # between prefill and decode, and among a replica's ranks: the engine's own ports
                    if _used(needs, src, dst, port, protocol):
                        continue
                    if dst == pods[0] and src not in pods and port == L.ROUTER_PORT and protocol == "TCP":
                        continue  # clients: anyone by default (test_settings_narrow_... narrows them)
                    assert not allowed(policies, src, dst, port, protocol), (src, dst, port, protocol)


@pytest.mark.parametrize(
    ("shape", "src", "dst", "port"),
    [
        ("vllm-disaggregated", CLIENT, "prefill", L.ENGINE_PORT),  # clients reach the router only
        ("vllm-disaggregated", OTHER_POD, "decode", L.KV_EVENTS_PORT),
        ("vllm-disaggregated", "prefill", "router", L.ROUTER_PORT),  # nothing calls back into the router
        ("vllm-disaggregated", PROMETHEUS, "decode", L.KV_EVENTS_PORT),
        ("vllm-disaggregated", "router", "router", L.ROUTER_PORT),  # one replica: no peers
        ("vllm-disaggregated", "router", "prefill", L.NIXL_PORT),  # the side channel is the pools' own
        ("sglang-mooncake-bootstrap", "router", "prefill", L.SGLANG_BOOTSTRAP_PORT),
        ("vllm-wide-ep-dp-ranks", "router", "decode", L.KV_EVENTS_PORT + 16),  # 16 ranks: 5557..5572
        ("vllm-wide-ep-dp-ranks", "router", "decode", L.KV_REPLAY_PORT + 16),
        ("emulator-dp-ranks", "decode", "prefill", L.NIXL_PORT + 4),  # 4 ranks: 5600..5603
        ("emulator-disaggregated", "decode", "prefill", 40000),  # the emulator picks no ports
        ("emulator-multi-node-tp", "decode", "decode", L.SGLANG_DIST_PORT),
        ("emulator-disaggregated", "decode", HUB, 443),  # the emulator downloads nothing
        ("vllm-colocated", "worker", "worker", 40000),  # one-node replicas: no rank traffic
        ("vllm-disaggregated", "router", HUB, 80),
    ],
)
def test_denied(shape: str, src: End | str, dst: End | str, port: int) -> None:
    policies = policies_of(render(SHAPES[shape]))
    s = pod("llama", src) if isinstance(src, str) else src
    d = pod("llama", dst) if isinstance(dst, str) else dst
    assert not allowed(policies, s, d, port)


def test_settings_narrow_clients_prometheus_and_the_outside() -> None:
    settings = {
        "enabled": True,
        "clients": [{"namespaceLabels": {"kubernetes.io/metadata.name": "gateway"}}, {"cidr": "10.20.0.0/16"}],
        "prometheus": {"namespaceLabels": {"kubernetes.io/metadata.name": "obs"}, "podLabels": {"app": "vm"}},
        "apiServer": ["192.168.0.10/32"],
        "hub": [],
    }
    policies = policies_of(render(base(networkPolicy=settings)))
    router, decode = pod("llama", "router"), pod("llama", "decode")
    gateway = End("gateway", {"kubernetes.io/metadata.name": "gateway"}, {"app": "envoy"})
    assert allowed(policies, gateway, router, L.ROUTER_PORT)
    assert allowed(policies, End(ip="10.20.3.4"), router, L.ROUTER_PORT)
    assert not allowed(policies, CLIENT, router, L.ROUTER_PORT)
    assert not allowed(policies, OTHER_POD, router, L.ROUTER_PORT)
    vm = End("obs", {"kubernetes.io/metadata.name": "obs"}, {"app": "vm"})
    assert allowed(policies, vm, decode, L.ENGINE_PORT)
    assert not allowed(policies, PROMETHEUS, decode, L.ENGINE_PORT)
    assert allowed(policies, router, End(ip="192.168.0.10"), 6443)
    assert not allowed(policies, router, API, 6443)
    assert not allowed(policies, decode, HUB, 443)  # air-gapped
    assert not allowed(policies, router, HUB, 443)


def test_off_by_default_and_pruned_when_turned_off() -> None:
    body = base()
    del body["networkPolicy"]
    assert not policies_of(render(body))
    assert not policies_of(render(base(networkPolicy={"enabled": False})))


def test_policies_are_children_with_owner_labels_and_selectors() -> None:
    from fakekube import OWNER, spec  # type: ignore[import-not-found]

    made = netpolicy.policies(OWNER, spec(networkPolicy={"enabled": True}))
    assert [p["metadata"]["name"] for p in made] == ["llama-router", "llama-prefill", "llama-decode"]
    for p in made:
        role = p["metadata"]["labels"][L.ROLE]
        assert p["apiVersion"] == "networking.k8s.io/v1"
        assert p["metadata"]["ownerReferences"] == [OWNER.ref()]
        assert p["spec"]["podSelector"] == {"matchLabels": {L.DEPLOYMENT: OWNER.name, L.ROLE: role}}
        assert p["spec"]["policyTypes"] == ["Ingress", "Egress"]


def test_a_renderer_port_without_a_flow_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from fakekube import OWNER, spec

    from xpyd_operator.engines import vllm

    real = vllm.VllmRenderer.ports

    def more(self: vllm.VllmRenderer, role: str, rank: Any) -> list[dict[str, Any]]:
        return [*real(self, role, rank), {"name": "debug", "containerPort": 7777, "protocol": "TCP"}]

    monkeypatch.setattr(vllm.VllmRenderer, "ports", more)
    with pytest.raises(netpolicy.UnplacedPort, match="debug"):
        netpolicy.policies(OWNER, spec(networkPolicy={"enabled": True}))


def _with_policy(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind") == L.KIND]
    for d in docs:
        d["spec"]["networkPolicy"] = {"enabled": True}
    return docs


@pytest.mark.parametrize("path", [p for p in EXAMPLES if _with_policy(p)], ids=lambda p: p.name)
def test_every_example_renders_a_policy_its_pods_fit(path: Path) -> None:
    for doc in _with_policy(path):
        children = render_objects(doc, Options(own_image="ghcr.io/xpyd/xpyd:test", namespace=NS))[1]
        policies = policies_of(children)
        name = doc["metadata"]["name"]
        assert f"{name}-router" in {p["metadata"]["name"] for p in policies}
        denied = [n for n in needs_of(name, children) if not allowed(policies, n.src, n.dst, n.port, n.protocol)]
        assert not denied, [(n.why, n.dst.labels, n.port) for n in denied]


def test_docs_quote_the_flow_table() -> None:
    text = (REPO / "docs" / "security.md").read_text()
    match = re.search(r"<!-- network-policy-flows:[^>]*-->\n(.*?)\n\n", text, re.S)
    assert match, "docs/security.md lacks the network-policy-flows table"
    assert match.group(1) + "\n" == netpolicy.doc_table()


def test_every_docs_row_is_a_flow_some_shape_renders() -> None:
    from fakekube import OWNER

    from xpyd_api.models import DisaggregatedDeploymentSpec

    keys = set()
    for body in SHAPES.values():
        keys |= {f.key for f in netpolicy.flows(OWNER, DisaggregatedDeploymentSpec.model_validate(body))}
    assert keys == set(netpolicy.DOC_ROWS)


@pytest.mark.parametrize(
    "peer",
    [{}, {"cidr": "10.0.0.0/8", "podLabels": {"a": "b"}}, {"cidr": "10.0.0.300/8"}],
)
def test_bad_peers_are_refused(peer: dict[str, Any]) -> None:
    from pydantic import ValidationError

    from xpyd_api.models import DisaggregatedDeploymentSpec

    with pytest.raises(ValidationError):
        DisaggregatedDeploymentSpec.model_validate(base(networkPolicy={"enabled": True, "clients": [peer]}))


async def test_the_reconciler_applies_updates_and_prunes_the_policies() -> None:
    from fakekube import FakeKube, b200_nodes

    from xpyd_operator.reconcile import Config, Reconciler

    body = base(model={"name": "meta-llama/Llama-3.1-8B-Instruct"}, engine=EMU)
    body["prefill"] = body["decode"] = {"replicas": 1, "gpusPerReplica": 2}
    kube = FakeKube(body, b200_nodes())
    reconciler = Reconciler(kube, Config(own_image="ghcr.io/xpyd/xpyd:t"))
    names = {f"llama-{r}" for r in ("router", "prefill", "decode")}

    async def writes() -> list[str]:
        kube.writes.clear()
        await reconciler.reconcile("ns1", "llama")
        return [w for w in kube.writes if netpolicy.KIND in w]

    assert sorted(await writes()) == sorted(f"apply {netpolicy.KIND}/{n}" for n in names)
    assert await writes() == []  # at rest: nothing re-applied
    assert kube.dd is not None
    kube.dd["spec"]["networkPolicy"] = {"enabled": True, "clients": [{"cidr": "10.0.0.0/8"}]}
    assert await writes() == [f"apply {netpolicy.KIND}/llama-router"]  # only the router's rules changed
    router = kube.objects[(netpolicy.KIND, "llama-router")]
    assert router["spec"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    kube.dd["spec"]["networkPolicy"] = {"enabled": False}
    assert sorted(await writes()) == sorted(f"delete {netpolicy.KIND}/{n}" for n in names)


def test_xpyd_render_prints_the_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from xpyd_operator.render import main

    doc = {"apiVersion": "xpyd.io/v1alpha1", "kind": L.KIND, "metadata": {"name": "llama"}, "spec": base()}
    path = tmp_path / "dd.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main([str(path), "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert sorted(i["metadata"]["name"] for i in items if i["kind"] == netpolicy.KIND) == [
        "llama-decode", "llama-prefill", "llama-router",
    ]  # fmt: skip
