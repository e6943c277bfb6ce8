"""The router's HTTP side: the client-facing listener, the worker-hop client, and what crosses them.

`server` parses client requests into `messages`; `access` and `tls` guard the port; `protocol` reads
OpenAI bodies and writes OpenAI errors; `upstream` carries the worker hops; `replies` checks what the
workers answer. Nothing here routes: the request path that uses them is `xpyd_router.proxy`.
"""
