"""docs/extend.md, "Add a scorer", followed end to end: a scorer module (here, this file), one line in
the registry, the configured order, and the choice it changes."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from xpyd_router.cli import parser, validate
from xpyd_router.model import RouteRequest, WorkerState
from xpyd_router.policy import scorers
from xpyd_router.policy.parts import RouteView, ScorerWeight
from xpyd_router.policy.registry import DEFAULT_SCORERS, KvAwareConfig, KvAwarePolicy, PrefixIndex
from xpyd_router.policy.scorers import SCORERS, parse_weights


# Step 1, the module (router/xpyd_router/policy/scorers/headroom.py in the recipe): one score per worker.
class HeadroomScorer:
    """Among equal prefixes, the worker with the most free KV cache first."""

    def score(self, view: RouteView, workers: Sequence[WorkerState]) -> Sequence[float]:
        return [-w.kv_usage for w in workers]


BLOCKS = list(range(500, 520))
KEY = 5
NAMES = ["http://127.0.0.1:8101", "http://127.0.0.1:8102"]


def equal_prefixes() -> PrefixIndex:
    index = PrefixIndex()
    for name in NAMES:
        index.record(name, BLOCKS[:12])
    return index


# where the default order (tiers, recent, rendezvous) sends the prompt; KV usage is not in it
HOME = (
    KvAwarePolicy()
    .choose_prefill(
        RouteRequest(BLOCKS, key=KEY), [WorkerState(name=n, role="prefill") for n in NAMES], equal_prefixes()
    )
    .worker
)


def workers() -> list[WorkerState]:
    # the default's choice is the fuller one: only the new scorer moves the request
    return [WorkerState(name=n, role="prefill", kv_usage=0.9 if n == HOME else 0.1) for n in NAMES]


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    # Step 2, the registration line in router/xpyd_router/policy/scorers/__init__.py:
    #     "headroom": HeadroomScorer,
    monkeypatch.setitem(SCORERS, "headroom", HeadroomScorer)


@pytest.mark.usefixtures("registered")
def test_a_registered_scorer_changes_the_choice() -> None:
    req = RouteRequest(BLOCKS, key=KEY)
    before = KvAwarePolicy().choose_prefill(req, workers(), equal_prefixes())
    assert (before.worker, before.reason) == (HOME, "prefix")
    # Step 3, the order: after the prefix, before the rest (`--scorers prefix,headroom,recent,rendezvous`)
    order = parse_weights("prefix,headroom,recent,rendezvous")
    assert order[1] == ScorerWeight("headroom")
    after = KvAwarePolicy(KvAwareConfig(scorers=order)).choose_prefill(req, workers(), equal_prefixes())
    assert (after.worker, after.reason) == (next(n for n in NAMES if n != HOME), "prefix")
    # its weight from the configuration: 0 turns it off again
    off = KvAwarePolicy(KvAwareConfig(scorers=parse_weights("prefix,headroom=0,recent,rendezvous")))
    assert off.choose_prefill(req, workers(), equal_prefixes()).worker == HOME


@pytest.mark.usefixtures("registered")
def test_the_router_command_line_takes_it() -> None:
    base = ["--prefill", "http://127.0.0.1:8101", "--decode", "http://127.0.0.1:8201"]
    assert validate(parser().parse_args([*base, "--scorers", "prefix,headroom=2,rendezvous"])) is None
    assert "headroom" in scorers.SCORERS


def test_unregistered_or_malformed_scorers_are_refused() -> None:
    base = ["--prefill", "http://127.0.0.1:8101", "--decode", "http://127.0.0.1:8201"]
    for raw, problem in [
        ("prefix,headroom", "unknown scorer 'headroom'"),
        ("prefix=x", "must be a number"),
        ("prefix=inf", "must be finite"),
        ("prefix,prefix", "given twice"),
        ("prefix,,recent", "empty scorer name"),
    ]:
        message = validate(parser().parse_args([*base, "--scorers", raw]))
        assert message is not None and message.startswith("--scorers: ") and problem in message, message
    args = parser().parse_args(base)
    assert parse_weights(args.scorers) == DEFAULT_SCORERS  # the default spells the default order
