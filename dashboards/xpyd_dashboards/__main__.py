"""Entry point for `python -m xpyd_dashboards`."""

from __future__ import annotations

import sys

from xpyd_dashboards.cli import main

sys.exit(main())
