"""docs/reference/ is generated from the code (python -m xpyd_cli.docsgen) and stays equal to it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from xpyd_cli import docscheck, docsgen

CONFIGURE = docsgen.ROOT / "docs" / "configure.md"


def test_reference_pages_are_fresh() -> None:
    assert docsgen.stale() == [], f"run {docsgen.COMMAND}"
    assert docsgen.main(["--check"]) == 0


def test_a_changed_page_is_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, make in docsgen.PAGES.items():
        (tmp_path / name).write_text(make(), encoding="utf-8")
    monkeypatch.setattr(docsgen, "REFERENCE", tmp_path)
    assert docsgen.stale() == []
    page = tmp_path / "cli.md"
    page.write_text(page.read_text().replace("`--policy", "`--policey"), encoding="utf-8")
    assert docsgen.stale() == ["docs/reference/cli.md"]
    assert docsgen.main(["--check"]) == 1


def test_spec_fields_cover_nested_models_with_defaults() -> None:
    fields = {f.path: f for f in docsgen.spec_fields()}
    assert fields["spec.autoscaling.targets.ttftP90Seconds"].type == "number"
    assert fields["spec.router.policy"].default == "`kv-aware`"
    assert fields["spec.engine.env[].name"].default == "required"
    assert fields["spec.engine.args"].default == "`[]`"  # a factory's default, which the schema lacks
    assert "spec.<pool>.autoscaling.maxReplicas" in fields
    assert not any(p.startswith(("spec.decode.", "spec.worker.")) for p in fields)


def test_every_command_has_its_parser() -> None:
    from xpyd_cli import main

    parsers = docsgen.parsers()
    assert {f"xpyd {c}" for c in main.COMMANDS} <= set(parsers)
    assert "xpyd cluster up" in parsers
    assert {"--policy", "--prefill", "--decode"} <= docsgen.flags(parsers["xpyd router"])
    assert "--namespace" in docsgen.flags(parsers["xpyd operator"])


def test_parsers_are_built_not_run() -> None:
    ran: list[list[str]] = []

    def main(argv: list[str]) -> int:
        p = argparse.ArgumentParser(prog="xpyd fake")
        p.add_argument("--flag")
        p.parse_args(argv)
        ran.append(argv)
        return 0

    assert docsgen.flags(docsgen.built_parser(main)) == {"-h", "--help", "--flag"}
    assert ran == []
    assert argparse.ArgumentParser.parse_known_args.__name__ == "parse_known_args"  # put back


def test_reasons_come_from_the_code() -> None:
    reasons = docsgen.condition_reasons()
    assert set(reasons) >= {"Ready", "Progressing", "TopologySatisfied", "AutoscalerHealthy"}
    assert {"ReplicaDoesNotFit", "InvalidSpec", "ModelConfigInvalid", "HandoffIncompatible"} <= set(reasons["Ready"])
    assert {"OneRack", "SpansRacks"} <= set(reasons["TopologySatisfied"])
    assert {"MetricsStale", "MetricsFresh", "PrometheusTimeout", "AutoscalingOff"} <= set(reasons["AutoscalerHealthy"])


def test_every_reason_the_scan_cannot_read_is_relayed_from_one_it_can() -> None:
    relays: list[str] = []
    docsgen.condition_reasons(relays)
    assert sorted(relays) == sorted(docsgen.RELAYS)


def test_the_scan_follows_literals_names_and_branches() -> None:
    source = (
        "from xpyd_api import conditions as C\n"
        "def f(ok):\n"
        "    reason = 'AllGood' if ok else 'NotGood'\n"
        "    a = C.make(C.READY, ok, reason, 'm')\n"
        "    b = C.make(C.PROGRESSING, True, 'Moving', 'm')\n"
        "    raise InputError('Broken', 'why')\n"
    )
    relays: list[str] = []
    found = docsgen.scan_reasons(
        source + "def g(x):\n    C.make(C.READY, False, x.why, 'm')\n", docsgen.condition_types(), relays
    )
    assert found == {"Ready": {"AllGood", "NotGood", "Broken"}, "Progressing": {"Moving"}}
    assert relays == ["g: Ready"]


def test_metrics_cover_every_exporter() -> None:
    from xpyd_api import metric_names

    exported = {m.name for m in docsgen.metrics()}
    assert {"xpyd_operator_reconciles_total", "xpyd_autoscaler_healthy", "xpyd_router_requests_total"} <= exported
    ours = {v for k, v in vars(metric_names).items() if k.isupper() and isinstance(v, str)}
    ours = {n for n in ours if n.startswith(("xpyd_router_", "xpyd_autoscaler_"))}
    assert ours - exported == set(), "metric_names lists a series no exporter registers"


def test_emulator_metrics_cover_what_xpyd_reads_of_each_engine() -> None:
    """The emulator's section lists every series the profiles name for the engine it stands in for, and its own."""
    from xpyd_api import metric_names
    from xpyd_api.engines import METRICS

    listed: dict[str, set[str]] = {}
    for m in docsgen.emulator_metrics():
        listed.setdefault(m.exporter, set()).add(m.name)
    assert set(listed) == set(docsgen.EMULATOR_FLAVOURS.values())
    for flavour, exporter in docsgen.EMULATOR_FLAVOURS.items():
        names = METRICS[flavour]
        read = {getattr(names, f) for f in names.__slots__ if isinstance(getattr(names, f), str)}
        read.add(names.kv_usage[0])
        assert read - listed[exporter] == set(), exporter
        assert metric_names.EMULATOR_PREFIX_INDEX_BLOCKS in listed[exporter]
    page = (docsgen.REFERENCE / "metrics.md").read_text(encoding="utf-8")
    assert "| emulator (vLLM) | `vllm:num_requests_waiting` | gauge | `engine`, `model_name` |" in page


def test_configure_md_defaults_equal_the_models() -> None:
    assert docscheck.default_mismatches(CONFIGURE.read_text(), docsgen.spec_fields()) == []


def test_a_changed_default_is_reported() -> None:
    fields = docsgen.spec_fields()
    text = CONFIGURE.read_text()
    row = "| `spec.router.policy` | `kv-aware` |"
    assert row in text
    drifted = text.replace(row, "| `spec.router.policy` | `round-robin` |")
    assert docscheck.default_mismatches(drifted, fields) == [
        "spec.router.policy: docs say `round-robin`, the model `kv-aware`"
    ]
    prose = text.replace(row, "| `spec.router.policy` | the operator's choice |")
    assert docscheck.default_mismatches(prose, fields) == []  # prose is not checked
