"""Registers the `engine_wheels` marker: tests that need the engines' released wheels (downloaded once)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "engine_wheels: needs the engines' released wheels (tests/contract/wheels.py)")
