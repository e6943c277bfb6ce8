"""Routing targets: a worker's API server, or one data-parallel rank behind it.

A vLLM replica with data parallelism (`--data-parallel-size D`: one API server over D engines, on
one pod or a LeaderWorkerSet group) keeps one prefix cache per rank, and its API server sends a
request to the rank named by the `X-data-parallel-rank` header, else to the rank with the fewest
queued and running requests (vLLM v0.11 `entrypoints/openai/serving_engine.py`,
`v1/engine/core_client.py` DPLBAsyncMPClient), which knows nothing of prompts: a conversation's
next turn lands on the rank holding its prefix only by chance (1 in D). Each rank also publishes its
own KV events, on the configured port + its global rank (`distributed/kv_events.py`
offset_endpoint_port). So the router routes to ranks: a rank is a target of its own, named
`URL#dpR`, with its own cache picture, load and events, and its requests carry the header. A
name without the mark is the worker itself (the engine picks the rank, or there is one).

When the engine picks the rank (data-parallel routing 'engine': older vLLM, SGLang), the replica is
one target, but its ranks still publish apart, each on its own port: the target's KV event
endpoints are then every rank's, space-separated (`replica_endpoints`), all feeding its one picture.
"""

from __future__ import annotations

RANK_MARK = "#dp"
RANK_HEADER = "X-data-parallel-rank"


def target_name(url: str, rank: int | None) -> str:
    """The target for `rank` of the worker at `url` (the worker itself for None)."""
    return url if rank is None else f"{url}{RANK_MARK}{rank}"


def split_target(name: str) -> tuple[str, int | None]:
    """(base URL, data-parallel rank or None) of a target name."""
    url, mark, rank = name.partition(RANK_MARK)
    return (url, int(rank)) if mark and rank.isdigit() else (name, None)


def rank_endpoint(endpoint: str, rank: int, host: str = "") -> str:
    """Rank `rank`'s KV event socket from rank 0's `tcp://HOST:PORT`: the port moved by the rank, as
    vLLM binds it, on `host` (the pod that runs the rank) when given."""
    if not endpoint:
        return endpoint
    base, _, port = endpoint.rpartition(":")
    if host:
        base = f"tcp://[{host}]" if ":" in host else f"tcp://{host}"
    return f"{base}:{int(port) + rank}"


def replica_endpoints(endpoint: str, size: int, local: int = 0, hosts: list[str] | None = None) -> str:
    """Every rank's KV event socket of a `size`-rank replica, space-separated: rank r on the port + r
    (its global rank, in vLLM and SGLang alike), on hosts[r // local] (the pod that runs it) when given."""
    if not endpoint or size <= 1:
        return endpoint
    hosts = hosts or []

    def host(rank: int) -> str:
        return hosts[rank // local] if local > 0 and rank // local < len(hosts) else ""

    return " ".join(rank_endpoint(endpoint, rank, host(rank)) for rank in range(size))


def split_endpoints(endpoints: str) -> list[str]:
    """The sockets of a target's `kv_events` (or `kv_replay`): one, or one per rank."""
    return endpoints.split()
