"""A real Prometheus for tests (the local cluster's build, `make tools`), and stand-in /metrics pages it scrapes.

tests/ is on sys.path: `from realprom import PROMETHEUS, running, serve_pages`.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_chart.helm import find_binary

PROMETHEUS = find_binary("prometheus")  # $XPYD_CACHE/bin's (`make tools`), else one on PATH
START_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve_pages(pages: Mapping[str, Callable[[], str]]) -> ThreadingHTTPServer:
    """A loopback server answering GET PATH with pages[PATH]() as a Prometheus text page (404 for another path),
    in a daemon thread; shut it down with stop_pages. Its port: server.server_address[1]."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            make = pages.get(self.path)
            body = make().encode() if make else b""
            self.send_response(200 if make else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_pages(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


@contextmanager
def running(folder: Path, config: dict[str, Any]) -> Iterator[str]:
    """Prometheus with `config` (prometheus.yml as a dict) and its data under `folder`, on a free loopback port,
    once it says it is ready; yields its base URL and stops it after. Fails (never skips) without the binary."""
    if PROMETHEUS is None:
        pytest.fail("no prometheus binary: run `make tools` (it builds one into $XPYD_CACHE/bin)")
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Until /-/ready answers 200 (refused connections, then 503s, while it starts)."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"Prometheus exited with {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"Prometheus not ready within {START_S:.0f}s")
