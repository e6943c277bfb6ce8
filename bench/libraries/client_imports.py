"""Import time and memory of the Kubernetes clients docs/architecture.md compares (lightkube, kubernetes).

Run with an interpreter that has both installed (the official client is not a dependency of xpyd):
    python3 -m venv <venv> && <venv>/bin/pip install kubernetes lightkube
    <venv>/bin/python bench/libraries/client_imports.py
Each figure is the median of 7 fresh interpreters: wall time of the imports, peak RSS after them.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

CLIENTS = {
    "kubernetes": "import kubernetes.client, kubernetes.config; kubernetes.client.AppsV1Api",
    "lightkube": "import lightkube; from lightkube.resources.apps_v1 import StatefulSet; "
    "from lightkube.resources.core_v1 import Pod",
}
PROBE = "import time, resource; t = time.perf_counter(); {code}; d = time.perf_counter() - t; " \
    "print(d, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"  # fmt: skip


def measure(code: str, runs: int = 7) -> dict[str, float]:
    times: list[float] = []
    rss: list[int] = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", PROBE.format(code=code)], capture_output=True, text=True,
                             check=True).stdout.split()  # fmt: skip
        times.append(float(out[0]))
        rss.append(int(out[1]))
    return {"import_ms": round(statistics.median(times) * 1e3, 1), "rss_mib": round(statistics.median(rss) / 1024, 1)}


def main() -> int:
    bare = measure("pass")
    report = {"python": sys.version.split()[0], "bare_interpreter": bare}
    report |= {name: measure(code) for name, code in CLIENTS.items()}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
