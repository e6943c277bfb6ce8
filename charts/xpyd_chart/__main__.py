"""Entry point for `python -m xpyd_chart`."""

from __future__ import annotations

import sys

from xpyd_chart.sync import main

sys.exit(main())
