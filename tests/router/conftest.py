"""Fixtures of the router tests (defined in router_harness so that test modules can import its types)."""

from __future__ import annotations

from router_harness import fleet, router  # type: ignore[import-not-found]  # tests/router is on sys.path

__all__ = ["fleet", "router"]
