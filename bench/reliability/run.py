"""Run the fault suite and write bench/results/reliability.md: `.venv/bin/python bench/reliability/run.py [--quick]`.

Runs every process-level case (bench/reliability/process_cases.py: real router and emulator processes on
127.0.0.1) and, when bench/reliability/cluster_cases.py is there, its `run_all(quick)` against the local
cluster. Bounded: the full suite stops within 20 minutes, --quick within 10 (--no-cluster: 8 and 3).
`--case NAME` (repeatable) runs only those process cases and puts their rows into the existing file, every
other row kept as it was. Exits 1 when a case lost or hung a request or failed one of its checks.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # bench/ is not installed: import it from the repository root

from bench.reliability.bounded import run_bounded  # noqa: E402
from bench.reliability.process_cases import (  # noqa: E402
    CASES,
    FULL,
    LEAK_BLOCKS,
    QUICK,
    Result,
    Scale,
    run_all,
    run_case,
)
from bench.reliability.stack import ROUTER_FLAGS  # noqa: E402
from bench.router.procs import MODEL  # noqa: E402
from testkit.outcomes import HEADER  # noqa: E402

OUT = ROOT / "bench" / "results" / "reliability.md"
PROCESS_BUDGET_S = {False: 480.0, True: 150.0}  # by --quick
TOTAL_BUDGET_S = {False: 1200.0, True: 600.0}  # the cluster cases get what the process cases left
GRACE_S = 25.0  # for cluster cases cut at the budget to tear down (a stopped apiserver restarted, say)
CLUSTER = "cluster cases (bench/reliability/cluster_cases.py)"
NOT_RUN = "not run: needs the local cluster (make cluster-up)"
# In a child process, so that the suite's budget holds whatever run_all does.
CALL = (
    "import sys; sys.path.insert(0, sys.argv[1]); from bench.reliability.cluster_cases import run_all; "
    "rows = run_all(sys.argv[2] == 'quick'); "
    "print(chr(10).join(getattr(r, 'row', lambda r=r: str(r))() for r in (rows if isinstance(rows, list) else [rows])))"
)


def blank_row(case: str, note: str) -> str:
    return f"| {case} | - | - | - | - | - | - | - | {note} |"


def cluster_rows(quick: bool, budget_s: float, skip: bool) -> list[str]:
    """Rows of bench/reliability/cluster_cases.py's `run_all(quick)`, or one row saying why they did not run."""
    if skip:
        return [blank_row(CLUSTER, f"{NOT_RUN}; skipped with --no-cluster")]
    if importlib.util.find_spec("bench.reliability.cluster_cases") is None:
        return [blank_row(CLUSTER, NOT_RUN)]
    if budget_s < 60:
        return [blank_row(CLUSTER, f"{NOT_RUN}; the process cases left only {budget_s:.0f} s of the budget")]
    cmd = [sys.executable, "-c", CALL, str(ROOT), "quick" if quick else "full"]
    out, finished = run_bounded(cmd, budget_s, GRACE_S, ROOT)
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    if not finished:
        rows.append(blank_row(CLUSTER, f"cut after {budget_s:.0f} s (the suite's budget); rows above: cases done"))
    return rows or [blank_row(CLUSTER, f"{NOT_RUN}; run_all printed no rows (its errors are on stderr)")]


def verdict(results: list[Result]) -> str:
    ran = [r for r in results if not r.failures()]
    lost = sum(r.tally.counts["lost"] for r in results)
    hung = sum(r.tally.counts["hung"] for r in results)
    failed = [f"{r.case}: {', '.join(r.failures())}" for r in results if r.failures()]
    head = f"**{len(ran)} of {len(results)} process cases passed; {lost} lost and {hung} hung requests in all.**"
    return head + "".join(f"\n- FAILED {line}" for line in failed)


def this_run(quick: bool, seconds: float, what: str = "") -> str:
    machine = f"{platform.machine()} Linux with {len(os.sched_getaffinity(0))} CPU cores"
    return f"{what}{'--quick' if quick else 'full'}, {seconds:.0f} s on {machine}, {time.strftime('%Y-%m-%d')}"


def document(scale: Scale, rows: list[str], run_line: str, summary: str) -> str:
    """The whole file: `rows` of the table, `run_line` (this run's mode, time, machine), `summary` (the verdict)."""
    table = "\n".join(rows)
    return f"""# Reliability: the fault suite

What a client sees when a worker dies, freezes, swallows connections or answers garbage, when clients
send what they must not (protocol fields aimed at other hosts, KV they never release), and when
10,000 mutated requests hit the router and the emulator. Every request is counted as *ok*, *failed
cleanly* (an OpenAI-style error or an SSE error event: the client knows and can retry), *lost* (the
connection dropped, a stream was cut without an error, a 200 that is no answer) or *hung* (no end within
the client's own deadline of {scale.deadline_s:g} s). Lost and hung must be 0 (testkit/outcomes.py).

## Reproduce

    .venv/bin/python bench/reliability/run.py               # full: at most 20 minutes
    .venv/bin/python bench/reliability/run.py --quick       # at most 10 minutes
    .venv/bin/python bench/reliability/run.py --no-cluster  # the process cases only (about 4 minutes)

    .venv/bin/python bench/reliability/run.py --case pair-failing --case pair-slow  # rows 10a, 10b only

Short versions of cases 1, 3, 4, 5, 6, 7, 8 and 10a run in `make test` (tests/reliability/test_process_faults.py).
Each process case starts its own processes on 127.0.0.1: `xpyd router` in front of 1 prefill and
2 decode `xpyd emulate -- vllm serve {MODEL}` workers (2 and 2 in case 10; NixlConnector,
`--speedup {scale.speedup:g}`: a 128-token answer takes about 1 s), with `XPYD_KV_PEERS=127.0.0.1`, and router
flags `{" ".join(ROUTER_FLAGS)}`. Load: {scale.rate:g} requests/s for {scale.seconds:g} s (case 10: until the
faulty pair's cool-off is over and 5 s more), half streamed and half not, ~2,000-character prompts; the fault
comes {scale.fault_at:g} s in (cases 1-3, 8, 10) or is there from the start (4, 4b, 5). Recovery: from the fault
until requests started after it succeed again without a failure (case 10: from the fault's end until the pair
carries a good handoff again).

## Results

This run: {run_line}.

{HEADER}
{table}

{summary}

## What each case means

1. **Decode worker killed** (SIGKILL) under load. Requests whose stream had started end with an SSE error
   event (failed cleanly); every other one is retried on the other decode (connection refused takes the
   worker out of rotation at once).
2. **Prefill worker killed**, the only one. Prefill hops fail before the client saw a byte and are retried;
   with no prefill left the router sends requests straight to a decode worker, which prefills itself.
3. **Decode worker frozen** (SIGSTOP, SIGCONT {scale.freeze_s:g} s later). The router's scrape times out and
   takes it out; streams stalled on it end after the idle budget with an SSE error, new streams past the
   first-byte budget are retried; non-streamed decodes wait for it (only the request deadline bounds them).
4. **Black-holed decode worker**: a socket that accepts TCP and never answers, listed as a decode worker
   from the start. Its `/health` probe times out, so it never gets a request.
   **4b.** A decode worker that answers `/health` and `/metrics` but never a completion (an engine wedged behind
   a live HTTP server). Streamed hops to it miss the first-byte budget and are retried elsewhere, and it
   leaves rotation until its next probe; a non-streamed decode is silent until done, so one sent there ends
   only at the router's `--request-timeout` with a 504 (failed cleanly; 15 s here, 600 s by default). Each
   probe brings it back, so such failures recur while it stays listed: its recovery is the last of them.
5. **Decode worker answering 200 with garbage** (not JSON, a JSON array or HTML, a JSON object with no
   `choices`; for streams: a non-SSE line, a broken second event, a stream without `[DONE]`). Each hop is
   retried on a good worker; after 5 in a row the breaker holds it out 10 s. Only a stream whose first
   event was good and which then broke can fail, cleanly.
6. **SSRF reproduction**: clients put `kv_transfer_params` (also under `vllm_xargs`) or `bootstrap_host`
   in their requests, aiming the KV pull at a listener we control (127.0.0.1 and 127.0.0.99). The router
   answers 400 naming the field; straight at a worker, a `remote_host` outside `XPYD_KV_PEERS` is a 400
   too. The listeners must see 0 connections while other users' requests all succeed.
7. **KV leak reproduction**: 10 streamed prefills with `do_remote_decode` straight at a worker with a small
   KV pool ({LEAK_BLOCKS} blocks) pin most of it under leases nobody pulls; the same requests through the
   router get 400. A ~3,000-token request must then complete and KV usage fall back under 5% within the
   lease ({scale.lease_s:g} s here) plus 2 s; recovery is that time.
8. **Decode worker drained** (SIGTERM) under load: its `/health` turns 503, it refuses new requests with a
   503 (retried elsewhere) but still takes decode hops (their KV may be promised to it), finishes what it
   has and exits within `--drain-timeout` ({scale.drain_s:g} s here). A router given static worker URLs only
   learns of the drain when the port closes; in a cluster, discovery drops the terminating pod at once.
9. **Fuzzers** (bench/reliability/fuzz_router.py, fuzz_emulator.py): mutated JSON, reserved protocol fields,
   hostile headers, malformed HTTP and client aborts. Here *ok* is 2xx, *failed cleanly* 4xx (and, for the
   emulator, connections it closed on malformed HTTP or the client's own aborts), *lost* is 5xx (and
   dropped connections or refused ones), *hung* no answer within the fuzzer's hang limit; the note has the
   fuzzer's own columns. A fuzzer fails its row on any 5xx, hang, crash or traceback.
10. **Self-healing pairs** (bench/reliability/pair_cases.py): 2 prefill and 2 decode workers; decode0's KV pulls
   from prefill0 (one pair of four) fail with vLLM's failed-KV-load answer, HTTP 500, for {scale.pair_fault_s:g} s
   (**10a**), or take 1.5 s more for {1.6 * scale.pair_fault_s:g} s with the router's `--handoff-slow-seconds 1`
   (**10b**): the emulator's `--fault-kv-pull-fail-from` / `--fault-kv-pull-slow-from`, started by SIGUSR1 and
   ended by `--fault-kv-pull-for`. The router retries each failed handoff on another pair, takes the pair (not
   its workers) out of pairing for 10 s after 3 failed or slow handoffs in a row, and sends its requests to the
   other decode worker meanwhile. Must: 0 lost and hung, the pair tripped, and the pair carrying a good handoff
   again after the fault's end; its recovery (the table's) is that time, read from the router's `/metrics` every
   0.2 s: the rest of the cool-off (it depends on when the pair tripped) plus the time until the policy picks
   the pair again.

The cluster cases (scale-downs, an engine upgrade, the apiserver, etcd, Prometheus and the operator
stopped under load) come from bench/reliability/cluster_cases.py, against the cluster named by KUBECONFIG
or the local one (`make cluster-up`). They get what the process cases leave of the budget; a case still
running at its end is interrupted (its teardown runs) and the table says so.
"""


def case_of(row: str) -> str:
    return row.split("|")[1].strip()


def spliced(old: str, results: list[Result], scale: Scale, run_line: str) -> str:
    """The existing file with `results`' rows in place of rows of the same case (or after the last process row),
    the verdict recounted over the table's process rows, and `run_line` added to the run line."""
    table = old.split("## Results", 1)[-1].splitlines()
    rows = [line for line in table if line.startswith("| ") and not HEADER.startswith(line)]
    fresh = {r.case: r.row() for r in results}
    known = {case_of(line) for line in rows}
    rows = [fresh.get(case_of(line), line) for line in rows]
    process = [i for i, line in enumerate(rows) if re.match(r"\d", case_of(line))]
    rows[process[-1] + 1 if process else 0 : 0] = [fresh[r.case] for r in results if r.case not in known]
    cells = [line.split("|") for line in rows if re.match(r"\d", case_of(line))]
    lost, hung = (sum(int(c[i]) for c in cells if c[i].strip().isdigit()) for i in (5, 7))
    failed = [line for line in old.splitlines() if line.startswith("- FAILED ") and line[9:].split(":")[0] not in fresh]
    failed += verdict(results).splitlines()[1:]
    head = f"**{len(cells) - len(failed)} of {len(cells)} process cases passed; {lost} lost and {hung} hung requests"
    old_run = re.search(r"^This run: (.*)\.$", old, re.M)
    parts = old_run.group(1).split("; ") if old_run else []
    line = "; ".join([*(p for p in parts if p.split("),")[0] != run_line.split("),")[0]), run_line])
    return document(scale, rows, line, head + " in all.**" + "".join(f"\n{f}" for f in failed))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="shorter loads (10 minutes at most)")
    p.add_argument("--out", type=Path, default=OUT, help=f"the markdown to write (default {OUT.relative_to(ROOT)})")
    p.add_argument("--logs", type=Path, default=None, help="where the processes' logs go (default: a temp dir)")
    p.add_argument("--no-cluster", action="store_true", help="skip the cluster cases (they restart its components)")
    p.add_argument("--case", action="append", choices=list(CASES), default=[],
                   help="run only this process case (repeatable) and put its row into the existing --out")  # fmt: skip
    args = p.parse_args()
    scale = QUICK if args.quick else FULL
    logdir = args.logs or Path(tempfile.mkdtemp(prefix="xpyd-reliability-"))
    started = time.monotonic()
    print(f"fault suite ({'quick' if args.quick else 'full'}); logs in {logdir}\n{HEADER}", flush=True)

    def report(result: Result) -> None:
        print(result.row(), flush=True)

    if args.case:
        results = [asyncio.run(run_case(name, scale, logdir)) for name in args.case]
        for result in results:
            report(result)
        ids = ", ".join(case_of(r.row()).split(".")[0] for r in results)
        what = f"rows {ids} alone (--case {' --case '.join(args.case)}), "
        text = spliced(args.out.read_text(), results, scale, this_run(args.quick, time.monotonic() - started, what))
        args.out.write_text(text)
        print(f"\n{verdict(results)}\nwrote {args.out}", flush=True)
        return 1 if any(r.failures() for r in results) else 0

    results = asyncio.run(run_all(scale, logdir, PROCESS_BUDGET_S[args.quick], report))
    left = TOTAL_BUDGET_S[args.quick] - GRACE_S - (time.monotonic() - started)
    cluster = cluster_rows(args.quick, left, args.no_cluster)
    for line in cluster:
        print(line, flush=True)
    rows = [r.row() for r in results] + cluster
    args.out.write_text(document(scale, rows, this_run(args.quick, time.monotonic() - started), verdict(results)))
    print(f"\n{verdict(results)}\nwrote {args.out}", flush=True)
    return 1 if any(r.failures() for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
