"""What README.md, bench/README.md and docs/ cite exists: paths, make targets, xpyd flags, condition reasons,
and the numbers quoted from bench/results/ (xpyd_cli.docscheck; each check is also run on planted drift)."""

from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path

import pytest

from xpyd_cli import docscheck, docsgen

ROOT = docscheck.ROOT
DOCS = {str(d.relative_to(ROOT)): d for d in docscheck.cited_docs()}
README, BENCH = ROOT / "README.md", ROOT / "bench" / "README.md"
# (document, the heading of its table of measured claims, the column holding the numbers)
CLAIMS = [(README, "What it does, measured", 1), (BENCH, "Benchmarks", 3)]


@cache
def parsers() -> dict[str, argparse.ArgumentParser]:
    return docsgen.parsers()


@cache
def reasons() -> dict[str, list[str]]:
    return docsgen.condition_reasons()


def test_the_checked_documents() -> None:
    assert {"README.md", "bench/README.md", "docs/configure.md", "docs/reference/cli.md"} <= set(DOCS)


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_cited_paths_exist(doc: str) -> None:
    assert docscheck.missing_paths(DOCS[doc].read_text(), doc) == []


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_cited_make_targets_exist(doc: str) -> None:
    targets = docscheck.make_targets((ROOT / "Makefile").read_text())
    assert docscheck.missing_make_targets(DOCS[doc].read_text(), targets) == []


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_cited_xpyd_flags_exist(doc: str) -> None:
    assert docscheck.unknown_flags(DOCS[doc].read_text(), parsers()) == []


@pytest.mark.parametrize("section", ["The router's command line", "Router hardening"])
def test_configure_md_router_tables_name_real_flags(section: str) -> None:
    text = (ROOT / "docs" / "configure.md").read_text()
    assert "| flag |" in text.split(f"# {section}", 1)[1]
    assert docscheck.unknown_table_flags(text, section, parsers()["xpyd router"]) == []


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_cited_condition_reasons_exist(doc: str) -> None:
    assert docscheck.unknown_reasons(DOCS[doc].read_text(), reasons()) == []


@pytest.mark.parametrize(("doc", "heading", "column"), CLAIMS, ids=["README", "bench-README"])
def test_quoted_numbers_are_in_the_results(doc: Path, heading: str, column: int) -> None:
    rows = docscheck.table_rows(doc.read_text(), heading)
    assert len(rows) >= 10
    assert docscheck.unquoted_numbers(rows, column, docscheck.results_texts()) == []


# README.md and docs/: every paragraph, list item and table row that cites a bench/results file
NUMBERED = sorted(d for d in DOCS if d == "README.md" or d.startswith("docs/"))


@pytest.mark.parametrize("doc", NUMBERED)
def test_numbers_beside_a_results_citation_are_in_it(doc: str) -> None:
    assert docscheck.unquoted_cited_numbers(DOCS[doc].read_text(), docscheck.results_texts()) == []


def test_prose_and_rows_citing_results_are_checked() -> None:
    """The library table of docs/architecture.md quotes bench/results/router.md: a changed figure there is
    reported, as is one in a paragraph citing a results file."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    results = docscheck.results_texts()
    for quote, drift, reported in [
        ("50.1 vs 105.1 vs 2,673 CPU-us", "50.1 vs 150.1 vs 2,673 CPU-us", "150.1"),  # a table row
        ("0.21-0.74x the prompt tokens", "0.21-0.94x the prompt tokens", "0.94x"),  # a paragraph
    ]:
        assert quote in text
        found = docscheck.unquoted_cited_numbers(text.replace(quote, drift), results)
        assert [f.rsplit(": ", 1)[1] for f in found] == [reported]


def test_make_bench_runs_every_cited_benchmark() -> None:
    readme = [row[2] for row in docscheck.table_rows(README.read_text(), CLAIMS[0][1])]
    bench = [row[1] + " " + row[2] for row in docscheck.table_rows(BENCH.read_text(), CLAIMS[1][1])]
    runner = (ROOT / "bench" / "run-all.sh").read_text()
    assert docscheck.benchmarks_not_run(readme + bench, runner) == []


# --- each check reports planted drift ----------------------------------------------------------------


def test_a_missing_file_is_reported() -> None:
    text = "Run `bench/cache/run.py` and `e2e/test_nowhere.py`; see [the page](images/gone.png) and [ok](engines.md)."
    assert docscheck.missing_paths(text, "docs/x.md") == ["e2e/test_nowhere.py", "images/gone.png"]
    assert docscheck.missing_paths("`bench/results/sim_*.png`, `examples/<name>.yaml`", "README.md") == []


def test_a_missing_make_target_is_reported() -> None:
    text = "`make demo`, then `make tset`; ```sh\nmake bench\n```"
    assert docscheck.missing_make_targets(text, {"demo", "bench"}) == ["tset"]


def test_a_renamed_flag_is_reported() -> None:
    text = (
        "`xpyd router --policy kv-aware --polcy x`, `xpyd cluster up --no-prometheus`, `xpyd frobnicate`,\n"
        "```sh\nxpyd emulate --gpu B200 -- vllm serve --port 8001\n```"
    )
    assert docscheck.unknown_flags(text, parsers()) == ["xpyd frobnicate", "xpyd router --polcy"]


def test_a_renamed_router_flag_in_a_table_is_reported() -> None:
    text = "## Router hardening\n\n| flag | default |\n|---|---|\n| `--connect-timeout` | 5 |\n| `--conect-tmo` | 1 |\n"
    assert docscheck.unknown_table_flags(text, "Router hardening", parsers()["xpyd router"]) == ["--conect-tmo"]


def test_an_unknown_reason_is_reported() -> None:
    text = (
        "reason `ReplicaDoesNotFit`; reason `ReplicaTooBig`; `Ready=False` (`InvalidSpec`);\n"
        "`TopologySatisfied=True` (`OneRack`, `AllReplicasReady`); `Ready=False`, `Nope`; `Bogus=True` (`X`)"
    )
    assert docscheck.unknown_reasons(text, reasons()) == [
        "Bogus (not a condition type)",
        "Ready/Nope",
        "ReplicaTooBig",
        "TopologySatisfied/AllReplicasReady",
    ]


def test_numbers_are_read_with_their_units() -> None:
    cell = "SLO 96.4% vs 94.5%; 110 / 160 CPU-us; 0.21-0.74x; 27.8 ms; 2P4D at 32k, 12 scenarios, `--scale 8`"
    assert docscheck.quoted_numbers(cell) == [
        ("96.4", "%"), ("94.5", "%"), ("110", ""), ("160", "CPU-us"), ("0.21", "x"), ("0.74", "x"), ("27.8", "ms"),
    ]  # fmt: skip


def test_a_number_not_in_the_results_is_reported() -> None:
    results = {"plan.md": "| HGX-B200 | 27.8 | 828.0 |\n", "other.md": "96.4%\n"}
    rows = [
        ["plan", "27.8 ms vs a 0.8 s stall", "[plan.md](bench/results/plan.md)"],
        ["drift", "27.9 ms, 0.9 s", "[plan.md](bench/results/plan.md)"],
        ["elsewhere", "96.4%", "[plan.md](bench/results/plan.md)"],  # only in a file the row does not name
        ["unnamed", "96.4% and 0.8 s", "`bench/none.py`"],  # names none: any results file counts
    ]
    assert docscheck.unquoted_numbers(rows, 1, results) == ["drift: 27.9ms", "drift: 0.9s", "elsewhere: 96.4%"]


def test_a_benchmark_missing_from_make_bench_is_reported() -> None:
    runner = "$PY bench/sim/run.py\n$PY bench/router/run.py --quick\n"
    cited = ["`bench/sim/run.py`", "`.venv/bin/python bench/router/run.py`", "`bench/cache/run.py --only sim`"]
    assert docscheck.benchmarks_not_run(cited, runner) == ["bench/cache/run.py"]


def test_a_number_beside_a_citation_not_in_its_results_is_reported() -> None:
    results = {
        "plan.md": "| HGX-B200 | 27.8 | 828.0 |\n",
        "other.md": "96.4%, 12.5 ms, rounds every 100 ms\n",
        "kv.md": "by `.venv/bin/python bench/router/kv_cost.py`: 551.2 us\n",
    }
    text = (
        "# Plan\n\nA handoff 27.8 ms vs a 0.8 s stall\n([plan.md](bench/results/plan.md)); SLO 96.4%.\n\n"
        "Cites nothing: 12.9 ms.\n\n"
        "- per `bench/results/other.md`: 96.4%, 12.5 ms, 0.1 s rounds, `--x` default 300 s\n- uncited 27.9 ms\n\n"
        "| cost | 0.55 ms, 0.75 ms (`bench/router/kv_cost.py`, results/other.md) |\n"
        "|---|---|\n"
        "```\n99.9% bench/results/plan.md\n```\n"
        "![a figure](bench/results/fig.png) 12.5 ms, 13.5 ms\n"
    )
    found = docscheck.unquoted_cited_numbers(text, results)
    assert [f.rsplit(": ", 1)[1] for f in found] == [
        "96.4%",  # in other.md, not the file its paragraph cites
        "0.75ms",  # 0.55 ms is kv.md's, which the row's script wrote
        "13.5ms",  # a paragraph citing only an image: any results file counts
    ]
    assert found[0].startswith("A handoff 27.8 ms")
