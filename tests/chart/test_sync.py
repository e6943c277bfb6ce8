"""`python -m xpyd_chart`: the chart's copy of crds/ is found stale and made equal, byte for byte."""

from __future__ import annotations

from pathlib import Path

from xpyd_chart.sync import stale_crds, sync_crds


def test_sync_adds_updates_and_removes(tmp_path: Path) -> None:
    source, copy = tmp_path / "crds", tmp_path / "chart" / "files" / "crds"
    source.mkdir()
    (source / "a.yaml").write_text("kind: A\n")
    (source / "b.yaml").write_text("kind: B\n")
    copy.mkdir(parents=True)
    (copy / "b.yaml").write_text("kind: old\n")
    (copy / "gone.yaml").write_text("kind: Gone\n")
    assert stale_crds(source, copy) == ["a.yaml", "b.yaml", "gone.yaml"]
    assert sync_crds(source, copy) == ["a.yaml", "b.yaml", "gone.yaml"]
    assert stale_crds(source, copy) == []
    assert sorted(p.name for p in copy.iterdir()) == ["a.yaml", "b.yaml"]
    assert (copy / "b.yaml").read_bytes() == b"kind: B\n"
    assert sync_crds(source, copy) == []
