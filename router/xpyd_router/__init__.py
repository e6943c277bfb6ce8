"""xpyd's KV-aware OpenAI-compatible router.

Pure, socket-free policy API (also used by the simulator), all importable from `xpyd_router.policies`:
`POLICIES` (name -> factory), `make_policy(name)`, `PrefixIndex`, `WorkerState`, `RouteRequest`,
`Decision`, `Plan`, `NoWorker`, `record(index, plan, req)`; prompt hashing in `xpyd_router.hashing`
(`block_hashes`, `affinity_key`). The service itself is `xpyd_router.cli.main` (`xpyd router`).
"""
