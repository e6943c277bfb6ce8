"""The HTTP/1.1 listener the router and the engine emulator serve on (httptools on the event loop), and the
bounded Hugging Face Hub client the router and the operator fetch files with.

`server` parses requests into `messages` (a request, a whole reply or a stream) and serves them to
the handlers of a route table; `errors` writes OpenAI's error body; `hub` GETs files of a hub
repository within a deadline (the router's tokenizer, the operator's config.json). It knows no xpyd
component.
"""
