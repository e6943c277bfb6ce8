"""The HTTP/1.1 listener the router and the engine emulator serve on (httptools on the event loop).

`server` parses requests into `messages` (a request, a whole reply or a stream) and serves them to
the handlers of a route table; `errors` writes OpenAI's error body. It knows no xpyd component.
"""
