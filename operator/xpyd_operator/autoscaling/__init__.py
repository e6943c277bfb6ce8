"""The autoscaler inside the operator, and the pure policy the simulator runs too.

From the top down (pyproject.toml's import-linter contracts keep it so):

- ``loop``: one task per autoscaled DisaggregatedDeployment; reads Kubernetes, writes ``status.autoscaler``.
- ``prometheus`` (the query client, over ``promql``'s queries) and ``metrics`` (the autoscaler's own metrics).
- ``spec``: the typed spec in, the policy's inputs out, and its decision back to status.
- ``datapath``: the KvDataPathHealthy condition, from the routers' pairs out of pairing (self-healing).
- ``slo`` (the SLO policy, priced by ``slomodel``) and ``policy`` (``XpydPolicy`` and the ``AUTOSCALERS`` registry).
- ``guards``: freshness, anti-flapping, the P:D ratio band and the GPU ceiling.
- ``types``: the plain data they all share.

All but ``loop``, ``prometheus`` and ``metrics`` are pure: no I/O library, clock passed in.
"""
