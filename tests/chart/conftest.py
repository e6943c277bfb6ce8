"""Chart tests that run helm skip (with the reason) when the binary is missing; never pass silently."""

from __future__ import annotations

import pytest

from xpyd_chart.helm import helm_binary


@pytest.fixture
def helm() -> str:
    """The helm binary; modules that render the chart use it through `pytestmark`."""
    binary = helm_binary()
    if binary is None:
        pytest.skip("helm not found (set HELM, or build it with the local cluster)")
    return binary
