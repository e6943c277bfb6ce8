"""Case 9: the two fuzzers (fuzz_router.py, fuzz_emulator.py) as subprocesses, their counts as table rows."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bench.reliability.results import FUZZ_PASSED, NO_FAULT, Result, Scale
from testkit.outcomes import CLEAN, HUNG, LOST, OK, Tally

HERE = Path(__file__).resolve().parent

# --- case 9: the fuzzers, as subprocesses ----------------------------------------------------------------


def parse_table(out: str) -> dict[str, str]:
    """The last markdown table a fuzzer printed, as {column: cell}."""
    lines = [line for line in out.splitlines() if line.startswith("|") and not line.startswith("|-")]
    lines = [line for line in lines if not set(line) <= set("|-: ")]
    if len(lines) < 2:
        return {}
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[-2:]]
    return dict(zip(cells[0], cells[1], strict=False))


async def fuzz(name: str, script: str, args: list[str], budget: float) -> tuple[int | None, dict[str, str], str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / script), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(budget):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None, {}, f"{name} ran past {budget:g} s"
    return proc.returncode, parse_table(out.decode()), err.decode(errors="replace")[-500:]


def fuzz_result(case: str, rc: int | None, cols: dict[str, str], err: str, columns: dict[str, list[str]]) -> Result:
    """A fuzzer's counts in the table's columns: `columns` maps ok / lost / failed cleanly / hung to its own."""

    def total(key: str) -> int:
        return sum(int(cols.get(c, "0") or 0) for c in columns[key])

    tally = Tally()
    for outcome in (OK, LOST, CLEAN, HUNG):
        tally.counts[outcome] = total(outcome)
    note = ", ".join(f"{k} {v}" for k, v in cols.items()) if cols else f"no table: {err.strip()[-300:]}"
    checks = {FUZZ_PASSED: rc == 0 and bool(cols)}
    return Result(case, tally, NO_FAULT, note, checks, "-")


async def fuzz_router(scale: Scale, logdir: Path) -> Result:
    args = ["--requests", str(scale.fuzz_requests), "--budget", f"{scale.fuzz_budget_s:g}"]
    rc, cols, err = await fuzz("fuzz_router", "fuzz_router.py", args, scale.fuzz_budget_s + 60)
    columns = {OK: ["2xx"], LOST: ["5xx", "dropped"], CLEAN: ["4xx"], HUNG: ["hangs"]}
    return fuzz_result(f"9a. fuzzer: {scale.fuzz_requests:,} mutated requests at the router", rc, cols, err, columns)


async def fuzz_emulator(scale: Scale, logdir: Path) -> Result:
    args = ["--requests", str(scale.fuzz_requests), "--deadline", f"{scale.fuzz_budget_s:g}"]
    rc, cols, err = await fuzz("fuzz_emulator", "fuzz_emulator.py", args, scale.fuzz_budget_s + 60)
    columns = {OK: ["2xx"], LOST: ["5xx", "crashes"], CLEAN: ["4xx", "closed", "aborted"],
               HUNG: ["hangs"]}  # fmt: skip
    return fuzz_result(f"9b. fuzzer: {scale.fuzz_requests:,} mutated requests at the emulator", rc, cols, err,
                       columns)  # fmt: skip
