"""What the router knows of the workers' KV caches: block keys, prefix indexes, event payloads (no sockets).

`block_keys` keys prompt blocks alike in every replica; `prefix_index` holds each worker's cached
prefixes (with `tier_index` and `tier_cost` for its CPU tier); `wire` decodes engine KV events and
`engine_view` (with `replica_index` for data-parallel ranks) applies them. The sockets that carry
the events are `xpyd_router.kv_events`.
"""
