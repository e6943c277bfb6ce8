"""xpyd's KV-aware OpenAI-compatible router.

Its packages, by role: `http` (the client listener, the worker-hop client, request and reply bodies),
`policy` (the routing policies and their scorers), `kv` (what the router knows of the engines' KV
caches) and `tokens` (the engine's tokenizer); the modules here run the service: `cli`, `app`, the
request path (`proxy`, `hops`, `handoff`), the pool and its background jobs. The import contracts in
pyproject.toml ("Router layers") keep that order.

Pure, socket-free policy API (also used by the simulator), all importable from
`xpyd_router.policy.registry`: `POLICIES` (name -> factory), `make_policy(name)`, `PrefixIndex`,
`WorkerState`, `RouteRequest`, `Decision`, `Plan`, `NoWorker`, `record(index, plan, req)`; prompt
hashing in `xpyd_router.hashing` (`block_hashes`, `affinity_key`). The service itself is
`xpyd_router.cli.main` (`xpyd router`).
"""
