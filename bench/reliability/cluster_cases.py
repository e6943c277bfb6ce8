"""The fault suite's cluster cases: the e2e fault tests run longer, and their rows collected for the table.

The cases live once, as e2e tests (e2e/test_faults_under_load.py, and the operator restart in
e2e/test_operator_faults.py) so that `make test` guards them; this module runs them against the
cluster named by KUBECONFIG (else the local one, brought up) with longer load and gathers the
rows each case writes to XPYD_FAULT_ROWS.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
XPYD = Path(sys.executable).with_name("xpyd")
RESTART_TEST = "e2e/test_operator_faults.py::test_restart_mid_reconcile_converges"


def _kubeconfig() -> str:
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    out = subprocess.run([str(XPYD), "cluster", "up"], check=True, capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip().splitlines()[-1].split("=", 1)[1]


def _pytest(args: list[str], env: dict[str, str], timeout_s: float) -> int:
    cmd = [sys.executable, "-m", "pytest", "-m", "e2e", "-q", "-p", "no:cacheprovider", *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout_s, check=False).returncode
    except subprocess.TimeoutExpired:
        return 124


def run_all(quick: bool) -> list[str]:
    """Table rows for every cluster case; a failed case still reports its counted row."""
    env = {**os.environ, "KUBECONFIG": _kubeconfig(), "PATH": f"{Path.home() / '.cache/xpyd/bin'}:{os.environ['PATH']}"}
    if os.environ.get("XPYD_CACHE"):
        env["PATH"] = f"{os.environ['XPYD_CACHE']}/bin:{env['PATH']}"
    env["XPYD_FAULT_SECONDS"] = "20" if quick else "40"
    with tempfile.TemporaryDirectory() as tmp:
        rows_file = Path(tmp) / "rows.md"
        env["XPYD_FAULT_ROWS"] = str(rows_file)
        rc = _pytest(["e2e/test_faults_under_load.py"], env, 480 if quick else 780)
        rows = rows_file.read_text().splitlines() if rows_file.exists() else []
    if rc != 0:
        rows.append(f"| cluster fault tests | | | | | | | | pytest exit code {rc}: see its output |")
    restart = _pytest([RESTART_TEST], env, 300)
    verdict = "children converged, one StatefulSet per pool" if restart == 0 else f"FAILED (exit code {restart})"
    rows.append(f"| operator SIGKILLed mid-reconcile (no load) | - | - | - | - | - | - | - | {verdict} |")
    return rows


if __name__ == "__main__":
    print("\n".join(run_all("--quick" in sys.argv)))
