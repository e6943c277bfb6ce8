"""A Hugging Face Hub on 127.0.0.1 for tests: GET /{repo}/resolve/{revision}/{file}, every answer settable.

The router's tokenizer fetch (tests/router/test_router_hub_files.py) and the operator's config.json fetch
(tests/operator/test_op_model_hub.py) talk to it through xpyd_http.hub.
tests/ is on sys.path: `from fakehub import FakeHub, serve`.
"""

from __future__ import annotations

import http.server
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeHub:
    """A hub on 127.0.0.1: GET /{repo}/resolve/{revision}/{file}, answers set per path (or per file name)."""

    url: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # "org/model/main/tokenizer.json" -> bytes
    replies: dict[str, list[Reply]] = field(default_factory=dict)  # file name -> replies in turn (the last stays)
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)

    def answer(self, path: str) -> Reply:
        parts = path.strip("/").split("/")
        resolve = len(parts) > 3 and parts[2] == "resolve"
        key = "/".join(parts[:2] + parts[3:]) if resolve else path.strip("/")
        queued = self.replies.get(parts[-1]) if resolve else None
        if queued:
            return queued.pop(0) if len(queued) > 1 else queued[0]
        if key in self.files:
            return Reply(200, self.files[key])
        return Reply(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"})


def serve(hub: FakeHub) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hub.seen.append((self.path, self.headers.get("Authorization")))
            reply = hub.answer(self.path)
            self.send_response(reply.status)
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    return server
