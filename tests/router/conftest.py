"""Fixtures of the router tests (defined in router_harness so that test modules can import its types)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis.configuration import set_hypothesis_home_dir
from router_harness import fleet, router  # type: ignore[import-not-found]  # tests/router is on sys.path
from stub_workers import stubs  # type: ignore[import-not-found]

# Hypothesis keeps caches in ./.hypothesis, which git does not ignore: keep them out of the tree.
set_hypothesis_home_dir(str(Path(tempfile.gettempdir()) / "xpyd-hypothesis"))

__all__ = ["fleet", "router", "stubs"]
