"""The deployment's NetworkPolicies: one per pod role, allowing exactly the flows its pods use.

`flows(owner, spec)` is the table (source, destination, ports) the policies come from; `policies(owner, spec)`
renders it as networking.k8s.io/v1 NetworkPolicies, one per role (router, prefill, decode or worker) selecting
that role's pods by label: what a flow's destination lets in (Ingress) and what its source lets out (Egress).
Every port is a constant the renderers use (`xpyd_api.labels`, each engine renderer's `ports()` and
`join_port()`); a port a renderer adds that no flow here names is refused (`UnplacedPort`), so a new port
cannot ship without its rule. `doc_table()` is the "Network policy" table of docs/security.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from xpyd_api import labels as L
from xpyd_api.engines import EngineProfile
from xpyd_api.layout import ReplicaLayout
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_operator import engines, routerkit
from xpyd_operator.engine_ranks import Rank
from xpyd_operator.meta import Owner, child_name, metadata_for, selector

API_VERSION: Final = "networking.k8s.io/v1"
KIND: Final = "NetworkPolicy"
ROUTER: Final = routerkit.ROLE
# Ends of a flow that are no pod of the deployment.
CLIENTS: Final = "clients"  # whoever calls the router (spec.networkPolicy.clients; anyone by default)
PROMETHEUS: Final = "prometheus"  # spec.networkPolicy.prometheus
DNS: Final = "dns"  # any resolver (kube-dns, NodeLocal DNSCache)
API_SERVER: Final = "api-server"  # spec.networkPolicy.apiServer
HUB: Final = "hub"  # the Hugging Face Hub or HF_ENDPOINT (spec.networkPolicy.hub)
DNS_PORT: Final = 53
HTTPS_PORT: Final = 443
API_SERVER_PORTS: Final = (443, 6443)  # the kubernetes Service's port, and the API server's own behind it
# Ports vLLM and SGLang pick at run time between their own pods: UCX's TCP transport under NIXL, Mooncake's
# transfer engine, SGLang's per-rank ZMQ sockets (registered with the bootstrap server), NCCL's and
# torch.distributed's sockets and vLLM's data-parallel ZMQ sockets between the ranks of a replica.
UNPRIVILEGED: Final = (1024, 65535)

Protocol = Literal["TCP", "UDP"]


class UnplacedPort(ValueError):
    """A renderer declares a container port no flow of the policy names."""


@dataclass(frozen=True, slots=True)
class Ports:
    """A port or an inclusive range of ports (endPort)."""

    first: int
    last: int | None = None
    protocol: Protocol = "TCP"

    def manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"protocol": self.protocol, "port": self.first}
        if self.last is not None and self.last > self.first:
            out["endPort"] = self.last
        return out

    def covers(self, port: int, protocol: str = "TCP") -> bool:
        return protocol == self.protocol and self.first <= port <= (self.last or self.first)


def ranks(base: int, count: int) -> Ports:
    """`base`, `base + 1`, ... for `count` ranks: a rank's KV-event or side-channel port is base + its rank."""
    return Ports(base, base + max(1, count) - 1)


@dataclass(frozen=True, slots=True)
class Flow:
    """Pods (or an outside end) of `source` open connections to `dest` on `ports`; `key` names its docs row."""

    key: str
    source: str
    dest: str
    ports: tuple[Ports, ...]


# The docs' table, one row per kind of flow (key: from, to, ports, why). Ports in the words of the constants.
DOC_ROWS: Final[dict[str, tuple[str, str, str, str]]] = {
    "clients": (
        "clients (`clients`; anyone by default)", "router", f"{L.ROUTER_PORT}/TCP",
        "the OpenAI API",
    ),
    "router-peers": (
        "router", "router", f"{L.ROUTER_PORT}/TCP",
        "replicas share load and routes (`/internal/load`); with `router.replicas` > 1",
    ),
    "router-workers": (
        "router", "prefill, decode, worker", f"{L.ENGINE_PORT}/TCP",
        "requests, `/health`, `/metrics` (load)",
    ),
    "kv-events": (
        "router", "prefill, decode, worker",
        f"{L.KV_EVENTS_PORT}..{L.KV_EVENTS_PORT}+dp-1, {L.KV_REPLAY_PORT}..{L.KV_REPLAY_PORT}+dp-1/TCP",
        "KV-cache events (ZMQ PUB) and their replay (ROUTER), one port of each per data-parallel rank",
    ),
    "scrape": (
        "Prometheus (`prometheus`)", "router, prefill, decode, worker", f"{L.ENGINE_PORT}/TCP",
        "`/metrics` (the pods' `prometheus.io/port`)",
    ),
    "side-channel": (
        "decode, prefill", "the other pool",
        f"{L.NIXL_PORT}..{L.NIXL_PORT}+dp-1/TCP (vLLM 0.11.0: ..{L.NIXL_PORT}+dp x tp-1)",
        f"the handoff's side channel (`{L.ENV_NIXL_PORT}` + rank; SGLang: {L.NIXL_PORT})",
    ),
    "bootstrap": (
        "decode", "prefill", f"{L.SGLANG_BOOTSTRAP_PORT}/TCP",
        "SGLang's bootstrap server (`--disaggregation-bootstrap-port`)",
    ),
    "handoff-picked": (
        "decode, prefill", "the other pool", f"{UNPRIVILEGED[0]}-{UNPRIVILEGED[1]}/TCP",
        "vLLM and SGLang only: the KV data path's ports the engine picks (UCX under NIXL, Mooncake, SGLang's "
        "per-rank ZMQ sockets)",
    ),
    "rank-join": (
        "ranks of a replica", "the same pool", f"{L.DP_RPC_PORT}/TCP (vLLM, emulator), {L.SGLANG_DIST_PORT}/TCP "
        "(SGLang)", "multi-node replicas: the ranks meet the leader (`--data-parallel-rpc-port`, `--master-port`, "
        "`--dist-init-addr`)",
    ),
    "rank-relay": (
        "ranks of a replica", "the same pool",
        f"{L.KV_EVENTS_PORT}..{L.KV_EVENTS_PORT}+dp-1, {L.KV_REPLAY_PORT}..{L.KV_REPLAY_PORT}+dp-1/TCP",
        "emulator, multi-node data parallel: a member relays its ranks' events from the leader",
    ),
    "rank-picked": (
        "ranks of a replica", "the same pool", f"{UNPRIVILEGED[0]}-{UNPRIVILEGED[1]}/TCP",
        "vLLM and SGLang multi-node replicas: NCCL, torch.distributed and data-parallel sockets",
    ),
    "dns": ("every pod", "any resolver", f"{DNS_PORT}/UDP, {DNS_PORT}/TCP", "names: the Hub, the API server, peers"),
    "api-server": (
        "router", "the API server (`apiServer`)", ", ".join(f"{p}/TCP" for p in API_SERVER_PORTS),
        "its pod watch (in-cluster discovery, `--deployment`)",
    ),
    "hub": (
        "router, prefill, decode, worker", "the Hub (`hub`)", f"{HTTPS_PORT}/TCP",
        "the router's tokenizer (`hf:` tokenizers) and vLLM's and SGLang's weights; not the emulator",
    ),
}  # fmt: skip


def doc_table() -> str:
    """The flows as a Markdown table (docs/security.md quotes it; a test keeps them equal)."""
    rows = [("From", "To", "Ports", "What"), ("---",) * 4, *DOC_ROWS.values()]
    return "".join("| " + " | ".join(row) + " |\n" for row in rows)


def side_channel(profile: EngineProfile, layout: ReplicaLayout) -> Ports:
    """The side channel's ports of one replica: one per data-parallel rank (x tensor parallel on vLLM 0.11.0)."""
    if profile.handoff != "nixl":
        return Ports(L.NIXL_PORT)
    per_rank = layout.tp if profile.side_channel_stride == "rank-x-tp" else 1
    return ranks(L.NIXL_PORT, layout.dp * per_rank)


def router_reads_api(owner: Owner, spec: DisaggregatedDeploymentSpec) -> bool:
    """Whether the router finds its pools through the API server (its command names --deployment)."""
    command = routerkit.deployment(owner, spec, "")["spec"]["template"]["spec"]["containers"][0]["command"]
    return "--deployment" in command


def _pool_flows(spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec) -> list[Flow]:
    profile = engines.profile_of(spec)
    kind = engines.renderer(spec.engine.kind)
    layout = pool.layout(spec.topology.hardware)
    events, replay = ranks(L.KV_EVENTS_PORT, layout.dp), ranks(L.KV_REPLAY_PORT, layout.dp)
    own = kind.own_image()  # the emulator: every port it uses is named
    out = [
        Flow("router-workers", ROUTER, role, (Ports(L.ENGINE_PORT),)),
        Flow("kv-events", ROUTER, role, (events, replay)),
        Flow("scrape", PROMETHEUS, role, (Ports(L.ENGINE_PORT),)),
    ]
    peer = {"prefill": "decode", "decode": "prefill"}.get(role)
    rank: Rank | None = "leader" if layout.multi_node else None
    for port in kind.ports(role, rank):
        name, number = port["name"], port["containerPort"]
        if name == L.KV_SIDE_PORT_NAME and peer is not None and number == L.NIXL_PORT:
            out.append(Flow("side-channel", peer, role, (side_channel(profile, layout),)))
        elif name == L.BOOTSTRAP_PORT_NAME and role == "prefill" and number == L.SGLANG_BOOTSTRAP_PORT:
            out.append(Flow("bootstrap", "decode", role, (Ports(number),)))
        elif name == L.RANK_JOIN_PORT_NAME and layout.multi_node and number == kind.join_port():
            out.append(Flow("rank-join", role, role, (Ports(number),)))
        else:
            raise UnplacedPort(f"{spec.engine.kind} {role} port {name} ({number}) has no flow in the network policy")
    if peer is not None and not own:
        out.append(Flow("handoff-picked", peer, role, (Ports(*UNPRIVILEGED),)))
    if layout.multi_node and own and layout.dp > 1:
        out.append(Flow("rank-relay", role, role, (events, replay)))
    if layout.multi_node and not own:
        out.append(Flow("rank-picked", role, role, (Ports(*UNPRIVILEGED),)))
    out.append(Flow("dns", role, DNS, (Ports(DNS_PORT, protocol="UDP"), Ports(DNS_PORT))))
    if not own and spec.network_policy.hub:
        out.append(Flow("hub", role, HUB, (Ports(HTTPS_PORT),)))
    return out


def flows(owner: Owner, spec: DisaggregatedDeploymentSpec) -> list[Flow]:
    """Every flow the deployment's pods use, from the spec (engine kind and release, mode, layouts, router)."""
    web = (Ports(L.ROUTER_PORT),)
    out = [Flow("clients", CLIENTS, ROUTER, web), Flow("scrape", PROMETHEUS, ROUTER, web)]
    if spec.router.replicas > 1:
        out.append(Flow("router-peers", ROUTER, ROUTER, web))
    out.append(Flow("dns", ROUTER, DNS, (Ports(DNS_PORT, protocol="UDP"), Ports(DNS_PORT))))
    if router_reads_api(owner, spec) and spec.network_policy.api_server:
        out.append(Flow("api-server", ROUTER, API_SERVER, tuple(Ports(p) for p in API_SERVER_PORTS)))
    if routerkit.tokenizer(spec).startswith("hf:") and spec.network_policy.hub:
        out.append(Flow("hub", ROUTER, HUB, (Ports(HTTPS_PORT),)))
    for role, pool in spec.pools().items():
        out += _pool_flows(spec, role, pool)
    return out


def _peers(owner: Owner, spec: DisaggregatedDeploymentSpec, end: str) -> list[dict[str, Any]] | None:
    """The NetworkPolicyPeers of one end of a flow; None: anyone (the rule names no peers)."""
    settings = spec.network_policy
    if end == CLIENTS:
        return [p.manifest() for p in settings.clients] or None
    if end == PROMETHEUS:
        return [settings.prometheus.manifest()]
    if end == DNS:
        return None
    if end == API_SERVER:
        return [{"ipBlock": {"cidr": c}} for c in settings.api_server]
    if end == HUB:
        return [{"ipBlock": {"cidr": c}} for c in settings.hub]
    return [{"podSelector": {"matchLabels": selector(owner, end)}}]


def _rule(peers: list[dict[str, Any]] | None, direction: str, ports: tuple[Ports, ...]) -> dict[str, Any]:
    rule: dict[str, Any] = {} if peers is None else {direction: peers}
    rule["ports"] = [p.manifest() for p in ports]
    return rule


def policy(owner: Owner, spec: DisaggregatedDeploymentSpec, role: str, table: list[Flow]) -> dict[str, Any]:
    """NetworkPolicy <name>-<role>: the role's pods accept the flows to them and open the flows from them."""
    ingress = [_rule(_peers(owner, spec, f.source), "from", f.ports) for f in table if f.dest == role]
    egress = [_rule(_peers(owner, spec, f.dest), "to", f.ports) for f in table if f.source == role]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata_for(owner, child_name(owner, role), role),
        "spec": {
            "podSelector": {"matchLabels": selector(owner, role)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def policies(owner: Owner, spec: DisaggregatedDeploymentSpec) -> list[dict[str, Any]]:
    """The deployment's NetworkPolicies (router first, then each pool); none unless spec.networkPolicy.enabled."""
    if not spec.network_policy.enabled:
        return []
    table = flows(owner, spec)
    return [policy(owner, spec, role, table) for role in (ROUTER, *spec.pools())]
