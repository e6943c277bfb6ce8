"""The xpyd router with the peers' policies registered: `python bench/baselines/router.py ROUTER-ARGS`.

The routing benchmarks start it where they compare `--policy llm-d` or `--policy sglang` with the
product's policies on the same proxy; everything else is `xpyd router`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.baselines import register

from xpyd_router.cli import main

if __name__ == "__main__":
    register()
    sys.exit(main(sys.argv[1:]))
