"""The router's HTTP side: the worker-hop client, what crosses it, and the guards of the client port.

The client-facing listener is xpyd_http (its `server` parses client requests into its `messages`,
shared with the emulator); `access` and `tls` guard the port; `protocol` reads OpenAI bodies and
writes the router's SSE errors; `upstream` carries the worker hops; `replies` checks what the
workers answer. Nothing here routes: the request path that uses them is `xpyd_router.proxy`.
"""
