"""`xpyd plan --measured`: the routers' per-pair handoffs, read from their own /metrics text, beside the prediction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from xpyd_api import metric_names as names
from xpyd_perf import handoffs
from xpyd_perf.cli import main
from xpyd_perf.hardware import RDMA
from xpyd_perf.models import resolve_model
from xpyd_perf.timing import handoff_seconds
from xpyd_perf.topology import resolve_topology
from xpyd_router.metrics import RouterMetrics

MODEL = "llama-3.1-70b"
PER_TOKEN = resolve_model(MODEL).kv_bytes_per_token  # 327,680 bytes
LANES = 8  # HGX-B200, 8 GPUs a replica: min(tp 8, tp 8, 8 KV heads) NIC rails


def router_text(handoffs_: list[tuple[str, str, int, float]], per_token: int = PER_TOKEN) -> str:
    """A real router's /metrics after these (prefill, decode, prompt tokens, seconds) handoffs."""
    m = RouterMetrics("dd")
    m.kv_bytes_per_token = per_token
    for prefill, decode, tokens, seconds in handoffs_:
        m.pair(prefill, decode)
        m.handoff_seconds(prefill, decode, seconds)
        m.handoff_tokens(prefill, decode, tokens)
    return generate_latest(m.registry).decode()


def predicted(tokens: int) -> float:
    return handoff_seconds(tokens * PER_TOKEN, RDMA, resolve_topology("HGX-B200").gpu, LANES)


def test_the_names_are_the_routers() -> None:
    assert (handoffs.LATENCY, handoffs.BYTES) == (names.ROUTER_HANDOFF_LATENCY, names.ROUTER_HANDOFF_BYTES)


# (case, the router's handoffs, its --kv-bytes-per-token, per pair: (handoffs, prompt, mean s, p99 bucket))
CASES = [
    ("one pair, one size", [("p0", "d0", 8192, 0.3)] * 10, PER_TOKEN, {("p0", "d0"): (10, 8192, 0.3, (0.25, 0.5))}),
    ("two pairs, their own sizes",
     [("p0", "d0", 8192, 0.3)] * 3 + [("p1", "d0", 2048, 0.04)] * 4, PER_TOKEN,
     {("p0", "d0"): (3, 8192, 0.3, (0.25, 0.5)), ("p1", "d0"): (4, 2048, 0.04, (0.025, 0.05))}),
    ("mixed sizes: the mean", [("p0", "d0", 1000, 0.1), ("p0", "d0", 3000, 0.2)], PER_TOKEN,
     {("p0", "d0"): (2, 2000, 0.15, (0.1, 0.25))}),
    ("no bytes: nothing to predict from", [("p0", "d0", 8192, 0.3)] * 2, 0,
     {("p0", "d0"): (2, None, 0.3, (0.25, 0.5))}),
    ("no handoff yet", [], PER_TOKEN, {}),
]  # fmt: skip


@pytest.mark.parametrize(("seen", "per_token", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_pair_beside_its_prediction(
    seen: list[tuple[str, str, int, float]], per_token: int, want: dict[tuple[str, str], tuple[Any, ...]]
) -> None:
    rows = handoffs.compare(handoffs.parse_exposition(router_text(seen, per_token)), resolve_model(MODEL),
                            "HGX-B200", 8)  # fmt: skip
    assert {(r.sample.prefill, r.sample.decode) for r in rows} == set(want)
    for r in rows:
        n, tokens, mean, (low, high) = want[r.sample.prefill, r.sample.decode]
        assert r.sample.deployment == "dd" and r.sample.count == n
        assert r.measured_mean_seconds == pytest.approx(mean)
        assert r.measured_p99_seconds is not None and low <= r.measured_p99_seconds <= high
        assert r.prompt_tokens == tokens
        if tokens is None:
            assert r.predicted_seconds is None and r.ratio is None
        else:
            assert r.predicted_seconds == pytest.approx(predicted(tokens))
            assert r.ratio == pytest.approx(mean / predicted(tokens))


@pytest.mark.parametrize(
    ("buckets", "q", "want"),
    [
        (((0.1, 0.0), (0.5, 10.0), (float("inf"), 10.0)), 0.5, 0.3),  # halfway through (0.1, 0.5]
        (((0.1, 5.0), (0.5, 10.0), (float("inf"), 10.0)), 0.25, 0.05),  # inside the first bucket, from 0
        (((0.1, 0.0), (0.5, 0.0), (float("inf"), 4.0)), 0.99, 0.5),  # the open bucket: its lower bound
    ],
)
def test_quantile_interpolates_as_prometheus(buckets: tuple[tuple[float, float], ...], q: float, want: float) -> None:
    sample = handoffs.PairSample("dd", "p", "d", buckets[-1][1], 1.0, buckets, None)
    assert sample.quantile(q) == pytest.approx(want)


def test_prometheus_answers_read_as_the_routers_text() -> None:
    """Two router replicas' series summed, as the queries' `sum by` does, give the same pairs as one text."""
    text = router_text([("p0", "d0", 8192, 0.3)] * 10)
    from_text = handoffs.parse_exposition(text)[0]

    def answer(series: list[tuple[dict[str, str], float]]) -> str:
        result = [{"metric": labels, "value": [0, str(v)]} for labels, v in series]
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})

    pair = {"namespace": "ns", "deployment": "dd", "prefill": "p0", "decode": "d0"}
    bodies = {
        f"{handoffs.LATENCY}_count": answer([(pair, 10.0)]),
        f"{handoffs.LATENCY}_sum": answer([(pair, 3.0)]),
        f"{handoffs.LATENCY}_bucket": answer(
            [({**pair, "le": le}, v) for le, v in (("0.25", 0.0), ("0.5", 10.0), ("+Inf", 10.0))]
        ),
        handoffs.BYTES: answer([(pair, 10 * 8192 * PER_TOKEN)]),
    }
    got = handoffs.parse_query(bodies)[0]
    assert got.deployment == "ns/dd" and (got.count, got.kv_bytes) == (from_text.count, from_text.kv_bytes)
    assert got.seconds == pytest.approx(from_text.seconds) and got.quantile(0.99) == pytest.approx(0.4975)
    assert set(handoffs.queries("30m")) == set(bodies)
    assert all(
        "[30m]" in q and "by (namespace, deployment, prefill, decode" in q for q in handoffs.queries("30m").values()
    )


def test_plan_prints_predicted_beside_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "router.metrics"
    dump.write_text(router_text([("dd-prefill-0", "dd-decode-0", 8192, 0.3)] * 10))
    assert main(["--model", MODEL, "--measured", str(dump)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "dd-decode-0" in ln).split()
    # prefill, decode, handoffs, prompt, KV GB, predicted ms, mean ms, p99 ms, ratio
    assert line[1:] == ["dd-prefill-0", "dd-decode-0", "10", "8192", f"{8192 * PER_TOKEN / 1e9:.2f}",
                        f"{predicted(8192) * 1e3:.1f}", "300.0", line[8], f"{0.3 / predicted(8192):.2f}"]  # fmt: skip
    assert main(["--model", MODEL, "--measured", str(dump), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["measured"]
    assert row["measured_over_predicted"] == pytest.approx(0.3 / predicted(8192))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f'{handoffs.LATENCY}_count{{prefill="p" 3\n', "unreadable"),
        (f'{handoffs.LATENCY}_count{{prefill="p"}} many\n', "not a number"),
    ],
)
def test_a_garbled_dump_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    dump = tmp_path / "router.metrics"
    dump.write_text(text)
    assert main(["--model", MODEL, "--measured", str(dump)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_url_without_the_xpyd_command_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", MODEL, "--measured", "http://127.0.0.1:9/metrics"]) == 2
    assert "xpyd plan" in capsys.readouterr().err
