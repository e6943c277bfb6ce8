"""docs/engines.md quotes the engine profiles: its generated tables equal what the profiles say now."""

from __future__ import annotations

import pytest

from xpyd_api import enginedocs, engines


def test_the_engine_page_is_current() -> None:
    text = enginedocs.PAGE.read_text(encoding="utf-8")
    assert enginedocs.render(text) == text, "docs/engines.md is stale: run python -m xpyd_api.enginedocs"
    assert enginedocs.main(["--check"]) == 0


def test_every_checked_release_and_metric_is_on_the_page() -> None:
    text = enginedocs.PAGE.read_text(encoding="utf-8")
    for kind in ("vllm", "sglang"):
        for release in engines.supported_releases(kind):
            assert release in text, (kind, release)
        assert engines.METRICS[kind].running in text


def test_a_stale_table_is_rewritten_and_a_missing_block_named() -> None:
    stale = "x\n<!-- engine-matrix: generated -->\n| old |\n<!-- /engine-matrix -->\n"
    stale += "<!-- engine-metrics: generated -->\n<!-- /engine-metrics -->\n"
    fresh = enginedocs.render(stale)
    assert "| old |" not in fresh and engines.support_matrix() in fresh and engines.metrics_table() in fresh
    with pytest.raises(ValueError, match="no <!-- engine-metrics"):
        enginedocs.render("<!-- engine-matrix: g -->\n<!-- /engine-matrix -->\n")
