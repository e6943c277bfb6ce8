"""Short runs of the fault suite's process cases (bench/reliability): real router and emulator processes on
127.0.0.1, a fault under load, and not one request lost or hung."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.reliability import process_cases as pc
from testkit.outcomes import HUNG, LOST, OK

pytestmark = pytest.mark.timeout(120)


async def run(name: str, tmp_path: Path) -> pc.Result:
    result = await pc.run_case(name, pc.SHORT, tmp_path)
    assert result.tally.counts[OK] > 0, result.row()  # requests really went through
    assert result.tally.counts[LOST] == 0, result.row()
    assert result.tally.counts[HUNG] == 0, result.row()
    assert result.failures() == [], result.row()
    assert result.checks[pc.NO_CRASH], result.row()
    return result


@pytest.mark.parametrize("name", ["decode-killed", "decode-frozen"])
async def test_a_decode_worker_signalled_under_load_loses_no_request(name: str, tmp_path: Path) -> None:
    result = await run(name, tmp_path)
    assert result.tally.in_flight_at(result.fault_at) > 0, result.row()  # the fault hit requests in flight


async def test_a_drained_worker_loses_no_request_and_exits_within_its_drain_timeout(tmp_path: Path) -> None:
    result = await run("decode-drained", tmp_path)
    assert result.tally.in_flight_at(result.fault_at) > 0, result.row()
    assert 0 <= result.facts["exited after s"] <= pc.SHORT.drain_s + 2, result.row()


async def test_a_black_holed_worker_never_gets_a_request(tmp_path: Path) -> None:
    result = await run("black-hole", tmp_path)
    assert result.facts["connections"] > 0, result.row()  # the router did try it (health probes)
    assert result.facts["completions"] == 0, result.row()


async def test_garbage_from_a_worker_never_reaches_a_client_as_an_answer(tmp_path: Path) -> None:
    """Its first non-streamed reply is a JSON object with no `choices`: the router must retry it elsewhere."""
    result = await run("garbage", tmp_path)
    assert result.facts["garbage hops"] > 0, result.row()


async def test_ssrf_attempts_get_400_and_open_no_connection(tmp_path: Path) -> None:
    result = await run("ssrf", tmp_path)
    facts = result.facts
    assert facts["attempts"] >= 6 and facts["answered 400"] == facts["attempts"], result.row()
    assert facts["router 400"] > 0 and facts["worker 400"] > 0, result.row()
    assert facts["listener connections"] == 0, result.row()
    assert facts["users ok"] == facts["users"] > 0, result.row()


async def test_leaked_kv_is_refused_by_the_router_and_freed_within_the_lease(tmp_path: Path) -> None:
    result = await run("kv-leak", tmp_path)
    facts = result.facts
    assert facts["router 400"] == facts["leaks"] == 10, result.row()
    assert facts["peak usage"] > 0.5, result.row()  # the reproduction really pinned the pool
    assert facts["large ok"] == 1 and facts["large after s"] <= facts["lease s"] + 2, result.row()
    assert 0 <= facts["freed after s"] <= facts["lease s"] + 2, result.row()


async def test_a_failing_pair_cools_off_and_pairs_again_without_losing_a_request(tmp_path: Path) -> None:
    """Case 10a: one prefill/decode pair's KV pulls fail for a while; the router retries its handoffs on other
    pairs, takes the pair out of pairing, and pairs it again once the fault and the cool-off are over."""
    result = await run("pair-failing", tmp_path)
    facts = result.facts
    assert facts["trips"] >= 1 and facts["pair failures"] >= 3 and facts["pair retries"] >= 1, result.row()
    assert facts["rerouted"] + facts["direct"] > 0, result.row()  # requests went around the cooling pair
    assert 0 <= facts["paired after end s"] <= facts["recovery s"], result.row()  # back in pairing, then used
