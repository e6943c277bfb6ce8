"""`xpyd plan --measured URL`: a router's /metrics or a Prometheus server on loopback, and one-line errors."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import generate_latest

from xpyd_cli.main import main
from xpyd_perf import handoffs
from xpyd_router.metrics import RouterMetrics


def router_text() -> str:
    m = RouterMetrics("dd")
    m.kv_bytes_per_token = 327_680
    for _ in range(4):
        m.pair("dd-prefill-0", "dd-decode-0")
        m.handoff_seconds("dd-prefill-0", "dd-decode-0", 0.2)
        m.handoff_tokens("dd-prefill-0", "dd-decode-0", 4096)
    return generate_latest(m.registry).decode()


def vector(series: list[tuple[dict[str, str], float]]) -> str:
    result = [{"metric": labels, "value": [0, str(v)]} for labels, v in series]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


PAIR = {"namespace": "ns", "deployment": "dd", "prefill": "dd-prefill-0", "decode": "dd-decode-0"}
QUERIES = handoffs.queries("1h")  # what `xpyd plan` asks Prometheus, and what it answers here
ANSWERS = {
    QUERIES[f"{handoffs.LATENCY}_bucket"]: vector(
        [({**PAIR, "le": le}, v) for le, v in (("0.1", 0.0), ("0.25", 4.0), ("+Inf", 4.0))]
    ),
    QUERIES[f"{handoffs.LATENCY}_sum"]: vector([(PAIR, 0.8)]),
    QUERIES[f"{handoffs.LATENCY}_count"]: vector([(PAIR, 4.0)]),
    QUERIES[handoffs.BYTES]: vector([(PAIR, 4 * 4096 * 327_680)]),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/metrics":
            code, body = 200, router_text()
        elif url.path == "/api/v1/query":
            query = urllib.parse.parse_qs(url.query)["query"][0]
            code, body = (200, ANSWERS[query]) if query in ANSWERS else (400, '{"status": "error"}')
        else:
            code, body = 404, "not found"
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(("path", "deployment"), [("/metrics", "dd"), ("", "ns/dd")], ids=["router", "prometheus"])
def test_plan_reads_a_router_or_prometheus(
    server: str, path: str, deployment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--model", "llama-3.1-70b", "--measured", server + path, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["measured"]
    assert (row["deployment"], row["prefill"], row["decode"], row["handoffs"]) == (
        deployment,
        *list(PAIR.values())[2:],
        4,
    )
    assert row["prompt_tokens"] == 4096 and row["measured_mean_seconds"] == pytest.approx(0.2)
    assert row["measured_over_predicted"] == pytest.approx(0.2 / row["predicted_seconds"])


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("/nosuch/metrics", "HTTP 404"),
        ("refused", "cannot connect"),
    ],
)
def test_an_unreadable_url_is_one_line_exit_2(
    server: str, where: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "http://127.0.0.1:9/metrics" if where == "refused" else server + where
    assert main(["plan", "--model", "llama-3.1-70b", "--measured", url]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and err.startswith("xpyd plan: error:")


def test_a_prometheus_error_is_one_line_exit_2(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "llama-3.1-70b", "--measured", server, "--measured-window", "5m"]
    assert main(args) == 2  # the stand-in knows only the 1h queries: it answers 400
    err = capsys.readouterr().err
    assert "HTTP 400" in err and len(err.strip().splitlines()) == 1
