"""`xpyd router`: parse the command line, find the workers, serve the OpenAI API on uvloop."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import math
import signal
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import uvloop

from xpyd_api import engines
from xpyd_api import labels as L
from xpyd_http.server import Server
from xpyd_perf import resolve_gpu, resolve_model
from xpyd_router.app import Background, build_app
from xpyd_router.hashing import DEFAULT_BLOCK_CHARS
from xpyd_router.http.access import API_KEY_ENV, load_api_keys
from xpyd_router.http.tls import TlsFiles
from xpyd_router.kv.block_keys import RequestKeys
from xpyd_router.kv.tier_cost import ReloadCost
from xpyd_router.metrics import RouterMetrics
from xpyd_router.pairs import PairLimits
from xpyd_router.policy.registry import DEFAULT_SCORERS, POLICIES, SCORERS, KvAwareConfig, KvAwarePolicy, make_policy
from xpyd_router.policy.scorers import format_weights, parse_weights
from xpyd_router.pool import WorkerPool, WorkerSpec, parse_worker_arg, rank_targets, replica_target
from xpyd_router.proxy import ProxyConfig
from xpyd_router.tokens.engine import is_hub_spec, load_hub_tokenizer, make_tokenizer

SHUTDOWN_TIMEOUT = 30.0  # seconds in-flight requests get to finish after SIGTERM
MAX_TOKENIZER_THREADS = 64
TIMEOUTS = ("connect", "first_byte", "idle", "request", "header", "body")


class UsageError(Exception):
    """A bad command line; the message names the problem."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="xpyd router", description="KV-aware OpenAI-compatible router")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (in a pod: --host $(POD_IP))")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--prefill", nargs="+", default=[], metavar="URL[@domain]", help="prefill workers")
    p.add_argument("--decode", nargs="+", default=[], metavar="URL[@domain]", help="decode workers")
    p.add_argument("--worker", nargs="+", default=[], metavar="URL[@domain]", help="co-located workers")
    p.add_argument("--deployment", help="DisaggregatedDeployment whose pods to route to (in-cluster)")
    p.add_argument("--namespace", default="default", help="namespace of --deployment")
    p.add_argument(
        "--engine", choices=engines.KINDS, default="vllm",
        help="the workers' engine kind: picks the KV handoff (vLLM's and the emulator's NIXL hops, SGLang's bootstrap)",
    )  # fmt: skip
    p.add_argument("--policy", choices=sorted(POLICIES), default="kv-aware")
    p.add_argument("--block-chars", type=int, default=DEFAULT_BLOCK_CHARS, help="prefix block size in bytes")
    p.add_argument("--chars-per-token", type=float, default=4.0, help="to size each worker's prefix LRU")
    p.add_argument(
        "--tokenizer", default="none", metavar="none|emulator|PATH|hf:REPO[@REV]",
        help="the engines' tokenizer, so prefix keys are their KV blocks and their KV events can feed the index: "
        "'emulator' for xpyd emulate; for a real model a tokenizer.json, a directory with it (and "
        "tokenizer_config.json, chat_template.jinja), or hf:ORG/NAME[@REVISION] fetched from the Hugging Face Hub "
        "at start-up (HF_ENDPOINT, HF_TOKEN, HF_HOME; on failure one warning and byte blocks); 'none': byte blocks",
    )  # fmt: skip
    p.add_argument(
        "--chat-template", metavar="FILE",
        help="the Jinja chat template the engines were given (vLLM's --chat-template), instead of the model's",
    )  # fmt: skip
    p.add_argument("--block-size", type=int, default=16, help="tokens per engine KV block (with --tokenizer)")
    p.add_argument(
        "--tokenizer-threads", type=int, default=2, metavar="N",
        help="threads that tokenize prompts over 16 KiB characters off the event loop (0: on the loop; default 2)",
    )  # fmt: skip
    p.add_argument(
        "--kv-events-port", type=int, default=0,
        help="static workers: subscribe to KV events on this port of each worker's host (0: none; needs --tokenizer)",
    )  # fmt: skip
    p.add_argument(
        "--kv-replay-port", type=int, default=None,
        help="their replay port (0: none; default: events port + 100, the operator's pair 5557/5657)",
    )  # fmt: skip
    p.add_argument("--kv-events-topic", default="", help="topic prefix to subscribe to (default: all)")
    p.add_argument(
        "--data-parallel-size", type=int, default=1, metavar="N",
        help="static workers: each URL is a vLLM API server over N data-parallel ranks; route to ranks "
        "(X-data-parallel-rank), each rank's KV events on the events port + rank (default 1; in-cluster: "
        "read from the pods)",
    )  # fmt: skip
    p.add_argument(
        "--data-parallel-routing", choices=("ranks", "engine"), default="ranks",
        help="static workers of --data-parallel-size N: 'ranks' as above; 'engine': each URL is one target and "
        "its engine picks the rank, the router still hears every rank's KV events (port + rank)",
    )  # fmt: skip
    p.add_argument(
        "--peers",
        nargs="+",
        default=[],
        metavar="URL",
        help="the other router replicas' base URLs: each replica shares its in-flight counts and its routes with "
        "them (with --deployment: found from the pod watch when omitted)",
    )
    p.add_argument("--peer-sync", type=float, default=0.1, help="seconds between in-flight count and route exchanges")
    p.add_argument(
        "--direct-below-chars", type=int, default=2048,
        help="kv-aware: uncached prompts shorter than this skip prefill and go to decode (0: never go to decode first)",
    )  # fmt: skip
    p.add_argument(
        "--direct-lead-chars", type=int, default=4096,
        help="kv-aware: a decode worker holding this much more of the prompt than any prefill worker, and 4x "
        "what is left, computes the rest itself when that is at most --direct-max-chars (0: never)",
    )  # fmt: skip
    p.add_argument(
        "--scorers", default=format_weights(DEFAULT_SCORERS), metavar="NAME[=W],...",
        help="kv-aware: the scorers that order the first hop's workers, most significant first, each with its "
        f"weight (0: off; negative: reversed); default %(default)s, registered: {', '.join(SCORERS)}",
    )  # fmt: skip
    p.add_argument(
        "--direct-max-chars", type=int, default=16384,
        help="kv-aware: the most uncached prompt a decode worker computes under --direct-lead-chars",
    )  # fmt: skip
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between /metrics scrapes")
    p.add_argument("--max-attempts", type=int, default=3, help="tries per request over distinct workers")
    p.add_argument("--max-body-bytes", type=int, default=32 << 20, help="larger bodies get 413")
    p.add_argument("--bootstrap-port", type=int, default=L.SGLANG_BOOTSTRAP_PORT, help="SGLang prefill bootstrap port")
    p.add_argument("--connect-timeout", type=float, default=5.0, help="seconds to connect to a worker")
    p.add_argument(
        "--first-byte-timeout", type=float, default=120.0,
        help="seconds from sending a prefill hop or a streamed request to the worker's first body byte",
    )  # fmt: skip
    p.add_argument("--idle-timeout", type=float, default=30.0, help="longest silence between a worker's chunks")
    p.add_argument(
        "--upstream-timeout", type=float, default=None,
        help="older single knob: sets both --first-byte-timeout and --idle-timeout",
    )  # fmt: skip
    p.add_argument(
        "--request-timeout", type=float, default=600.0,
        help="deadline of a whole request; a client may lower it with an X-Request-Timeout header (seconds)",
    )  # fmt: skip
    p.add_argument(
        "--header-timeout", type=float, default=15.0,
        help="seconds a client has to send its request headers; also how long an idle connection stays",
    )  # fmt: skip
    p.add_argument("--body-timeout", type=float, default=30.0, help="seconds a client has to send its request body")
    p.add_argument("--max-connections", type=int, default=4096, help="client connections beyond this are answered 503")
    p.add_argument(
        "--api-key-file", metavar="PATH",
        help=f"require 'Authorization: Bearer <key>' with a key in PATH, one a line, re-read when the file changes "
        f"(else ${API_KEY_ENV}, else no key)",
    )  # fmt: skip
    p.add_argument(
        "--tls-cert-file", metavar="PATH",
        help="serve HTTPS (TLS 1.2+) with this PEM certificate chain (with --tls-key-file); reloaded when it changes",
    )  # fmt: skip
    p.add_argument("--tls-key-file", metavar="PATH", help="the certificate's PEM private key")
    p.add_argument(
        "--tls-ca-file", metavar="PATH",
        help="with TLS: the CA bundle the peer replicas' certificates are checked against, when the file exists "
        "and is not empty (default, or else: the serving certificate itself)",
    )  # fmt: skip
    p.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    p.add_argument(
        "--kv-bytes-per-token", type=int, default=0, metavar="N",
        help="the model's KV-cache bytes per token: exports the KV bytes each prefill/decode pair hands over "
        "(0: no bytes series; the operator passes it)",
    )  # fmt: skip
    p.add_argument(
        "--cpu-tier-gpu", metavar="NAME",
        help="the workers' GPU (H100, H200, B200, GB200, ...): with --cpu-tier-model the `tiers` scorer counts a "
        "block held in a worker's CPU tier (KV offloading) by what reloading it over the host link saves against "
        "recomputing it (default: a CPU-held block counts nothing; the operator passes both for kvOffload pools)",
    )  # fmt: skip
    p.add_argument(
        "--cpu-tier-model", metavar="NAME", help="the served model, as `xpyd plan` names it (with --cpu-tier-gpu)"
    )
    p.add_argument("--cpu-tier-tp", type=int, default=1, metavar="N", help="GPUs a first-hop replica reloads over")
    p.add_argument(
        "--cpu-tier-weight", type=float, metavar="W",
        help="count a block held in a worker's CPU tier at the fixed share W (0 < W <= 1) of a GPU-held one, "
        "whatever its reload costs, instead of pricing it from --cpu-tier-gpu/--cpu-tier-model (llm-d's rule: "
        "0.4; default: off)",
    )  # fmt: skip
    p.add_argument(
        "--hold-seconds", type=float, default=0.0, metavar="S",
        help="a request that finds no ready worker (a pool scaled to zero, or starting) waits up to S seconds for "
        "one, within its deadline, then gets 503 with Retry-After; the waiting count "
        "(xpyd_router_held_requests) wakes the pools (0: 503 at once; the operator sets it for minReplicas 0)",
    )  # fmt: skip
    p.add_argument(
        "--hold-max", type=int, default=256, metavar="N", help="requests that wait so at once (the next: 503)"
    )
    p.add_argument(
        "--served-model", metavar="NAME",
        help="the model /v1/models lists while no worker can list it (a pool at zero), until one has",
    )  # fmt: skip
    p.add_argument(
        "--pair-failures", type=int, default=3, metavar="N",
        help="KV handoffs failed in a row that take a prefill/decode pair (not its workers) out of pairing "
        "for a cool-off, doubling up to 5 minutes (0: never)",
    )  # fmt: skip
    p.add_argument(
        "--handoff-slow-seconds", type=float, default=0.0, metavar="S",
        help="streamed KV handoffs (prefill end to decode first byte) slower than this, 3 in a row, also cool a "
        "pair off; exported as xpyd_router_handoff_breakeven_seconds (0: off; the operator passes the deployment's "
        "break-even, the decode stall that disaggregation saves)",
    )  # fmt: skip
    p.add_argument(
        "--no-warm-pairs", dest="warm_pairs", action="store_false",
        help="do not send a one-token warm-up handoff over each new prefill/decode pair (its first NIXL handshake)",
    )  # fmt: skip
    return p


def static_workers(args: argparse.Namespace) -> list[WorkerSpec]:
    specs = [parse_worker_arg(u, "prefill") for u in args.prefill]
    specs += [parse_worker_arg(u, "decode") for u in args.decode]
    specs += [parse_worker_arg(u, "worker") for u in args.worker]
    if args.kv_events_port:
        offset = L.KV_REPLAY_PORT - L.KV_EVENTS_PORT
        replay = args.kv_events_port + offset if args.kv_replay_port is None else args.kv_replay_port
        out = []
        for spec in specs:
            host = urlsplit(spec.url).hostname
            events, replays = f"tcp://{host}:{args.kv_events_port}", f"tcp://{host}:{replay}" if replay else ""
            out.append(dataclasses.replace(spec, kv_events=events, kv_replay=replays))
        specs = out
    size = args.data_parallel_size
    if args.data_parallel_routing == "engine":
        return [replica_target(spec, size) for spec in specs]
    return [target for spec in specs for target in rank_targets(spec, size)]


def tier_pricing(gpu: str, model: str, tp: int, kv_bytes_per_token: int = 0) -> ReloadCost:
    """What a reload from a worker's CPU tier costs against a recompute; ValueError names an unknown part."""
    return ReloadCost(resolve_model(model), resolve_gpu(gpu), tp, kv_bytes_per_token or None)


def validate(args: argparse.Namespace) -> str | None:
    """An error message for inconsistent flags, else None."""
    static = bool(args.prefill or args.decode or args.worker)
    if static == bool(args.deployment):
        return "give either --deployment (in-cluster) or worker URLs (--prefill/--decode or --worker)"
    if args.worker and (args.prefill or args.decode):
        return "--worker (co-located) cannot be mixed with --prefill/--decode"
    if args.prefill and not args.decode:
        return "--prefill needs at least one --decode worker"
    if not 0 < args.port < 65536:
        return f"--port must be 1-65535, got {args.port}"
    if not 0 < args.bootstrap_port < 65536:
        return f"--bootstrap-port must be 1-65535, got {args.bootstrap_port}"
    if not (args.chars_per_token > 0 and math.isfinite(args.chars_per_token)):
        return f"--chars-per-token must be a positive number, got {args.chars_per_token}"
    if args.block_chars <= 0 or args.block_chars % 8:
        return f"--block-chars must be a positive multiple of 8, got {args.block_chars}"
    if args.max_attempts < 1:
        return "--max-attempts must be at least 1"
    if not 0 <= args.tokenizer_threads <= MAX_TOKENIZER_THREADS:
        return f"--tokenizer-threads must be 0-{MAX_TOKENIZER_THREADS}, got {args.tokenizer_threads}"
    if not 1 <= args.data_parallel_size <= L.MAX_DATA_PARALLEL:
        return f"--data-parallel-size must be 1-{L.MAX_DATA_PARALLEL}, got {args.data_parallel_size}"
    if not 1 <= args.block_size <= 1024:
        return f"--block-size must be 1-1024 tokens, got {args.block_size}"
    for flag, port in (("--kv-events-port", args.kv_events_port), ("--kv-replay-port", args.kv_replay_port)):
        if port is not None and not 0 <= port < 65536:
            return f"{flag} must be 0-65535, got {port}"
    if args.kv_events_port and args.tokenizer == "none":
        return "--kv-events-port needs --tokenizer (emulator, PATH or hf:REPO): events name blocks by token ids"
    if args.chat_template is not None and args.tokenizer in ("none", "emulator"):
        return "--chat-template needs --tokenizer PATH or hf:REPO: it renders chat prompts for a model's tokenizer"
    if args.upstream_timeout is not None:
        args.first_byte_timeout = args.idle_timeout = args.upstream_timeout
    for stem in TIMEOUTS:
        name = f"{stem}_timeout"
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            return f"--{name.replace('_', '-')} must be a positive number of seconds, got {value}"
    try:
        parse_weights(args.scorers)
    except ValueError as exc:
        return f"--scorers: {exc}"
    for flag in ("direct_below_chars", "direct_lead_chars", "direct_max_chars"):
        if getattr(args, flag) < 0:
            return f"--{flag.replace('_', '-')} must be 0 or more characters, got {getattr(args, flag)}"
    if args.max_connections < 1:
        return f"--max-connections must be at least 1, got {args.max_connections}"
    if args.max_body_bytes < 1:
        return f"--max-body-bytes must be at least 1, got {args.max_body_bytes}"
    if args.peer_sync <= 0 or not math.isfinite(args.peer_sync):
        return f"--peer-sync must be a positive number of seconds, got {args.peer_sync}"
    if args.scrape_interval <= 0 or not math.isfinite(args.scrape_interval):
        return f"--scrape-interval must be a positive number of seconds, got {args.scrape_interval}"
    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        return "--tls-cert-file and --tls-key-file go together: give both, or neither for plain HTTP"
    if args.tls_ca_file and not args.tls_cert_file:
        return "--tls-ca-file needs --tls-cert-file and --tls-key-file"
    if args.kv_bytes_per_token < 0 or args.pair_failures < 0:
        return "--kv-bytes-per-token and --pair-failures must be 0 or more"
    if bool(args.cpu_tier_gpu) != bool(args.cpu_tier_model):
        return "--cpu-tier-gpu and --cpu-tier-model go together: give both, or neither"
    if args.cpu_tier_gpu:
        try:
            args.cpu_tier = tier_pricing(
                args.cpu_tier_gpu, args.cpu_tier_model, args.cpu_tier_tp, args.kv_bytes_per_token
            )
        except ValueError as exc:
            return f"--cpu-tier-*: {exc}"
    weight = args.cpu_tier_weight
    if weight is not None and not (math.isfinite(weight) and 0 < weight <= 1):
        return f"--cpu-tier-weight must be more than 0 and at most 1, got {weight}"
    if not (args.hold_seconds >= 0 and math.isfinite(args.hold_seconds)):
        return f"--hold-seconds must be 0 or more seconds, got {args.hold_seconds}"
    if args.hold_max < 1:
        return f"--hold-max must be at least 1, got {args.hold_max}"
    if not (args.handoff_slow_seconds >= 0 and math.isfinite(args.handoff_slow_seconds)):
        return f"--handoff-slow-seconds must be 0 or more seconds, got {args.handoff_slow_seconds}"
    if not isinstance(logging.getLevelName(args.log_level.upper()), int):
        return f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {args.log_level!r}"
    return None


async def serve(args: argparse.Namespace, specs: list[WorkerSpec]) -> None:
    policy = make_policy(args.policy)
    keys = RequestKeys(getattr(args, "tokenizer_impl", None), args.block_size, args.block_chars, args.chars_per_token)

    def tune(_: int = 0) -> None:
        if isinstance(policy, KvAwarePolicy):
            chars_per_block = keys.tokens_per_block * args.chars_per_token
            # knobs counted in this block size
            policy.config = KvAwareConfig(scorers=parse_weights(args.scorers)).for_blocks(keys.tokens_per_block)
            cfg = policy.config
            cfg.direct_below_blocks = math.ceil(args.direct_below_chars / chars_per_block)
            cfg.direct_lead_blocks = math.ceil(args.direct_lead_chars / chars_per_block)
            cfg.direct_max_blocks = args.direct_max_chars // chars_per_block

    pool = WorkerPool(policy, args.block_chars, args.chars_per_token, keys)

    def retune(block_size: int = 0) -> None:
        tune(block_size)
        tier, weight = getattr(args, "cpu_tier", None), getattr(args, "cpu_tier_weight", None)
        pool.index.offloaded.price(tier, max(1, round(keys.tokens_per_block)), weight)

    retune()
    pool.set_workers(specs)
    background: list[Background] = []
    hub = None
    if keys.engine_aligned:  # engine KV events name blocks by token ids: usable only with the tokenizer
        from xpyd_router.kv_events import KvEventHub

        hub = KvEventHub(pool, args.kv_events_topic, retune=retune)
        background.append(hub.run)
    tls = getattr(args, "tls", None)
    if tls is not None:
        background.append(tls.run)
    share = None
    if args.peers or args.deployment:  # in a cluster the other replicas come from the pod watch
        from xpyd_router.loadshare import LoadShare, poll_source

        share = LoadShare(
            pool, args.peers, args.peer_sync, api_key=args.api_key, source=poll_source(args.host),
            key_file=args.api_key_file, tls=tls.peer_context if tls is not None else None,
        )  # fmt: skip
        background.append(share.run)
    if args.deployment:
        from xpyd_router.discovery import watch_deployment

        found = share.set_peers if share is not None and not args.peers else None

        async def discover(p: WorkerPool) -> None:
            await watch_deployment(args.deployment, args.namespace, p.set_workers, peers=found, me=args.host)

        background.append(discover)
    metrics = RouterMetrics(args.deployment or "standalone")
    metrics.tokenizer(args.tokenizer, keys.engine_aligned)
    if share is not None:
        metrics.peers(share)
    if hub is not None:
        metrics.kv_events(lambda: {name: view.stats for name, view in hub.views.items()})
    config = ProxyConfig(
        engine=args.engine,
        max_attempts=args.max_attempts,
        bootstrap_port=args.bootstrap_port,
        connect_timeout=args.connect_timeout,
        first_byte_timeout=args.first_byte_timeout,
        idle_timeout=args.idle_timeout,
        request_timeout=args.request_timeout,
        body_timeout=args.body_timeout,
        api_key=args.api_key,
        api_key_file=args.api_key_file,
        tokenizer_threads=args.tokenizer_threads,
        kv_bytes_per_token=args.kv_bytes_per_token,
        pairs=PairLimits(failures=args.pair_failures, slow_seconds=args.handoff_slow_seconds),
        warm_pairs=args.warm_pairs,
        hold_seconds=args.hold_seconds,
        hold_max=args.hold_max,
        served_model=args.served_model,
    )
    app = build_app(pool, metrics, config, args.scrape_interval, background)
    if share is not None:
        from xpyd_router.loadshare import PATH

        app.routes["GET", PATH] = share.handle
    busy = lambda: metrics.error("busy")  # noqa: E731
    server = Server(app.routes, args.header_timeout, args.max_connections, args.max_body_bytes, on_busy=busy,
                    log=logging.getLogger("xpyd_router"))  # fmt: skip
    async with app.running():
        try:
            await server.listen(args.host, args.port, tls=tls.server if tls is not None else None)
        except OSError as exc:
            problem = f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
            raise UsageError(f"{problem}; pick another --host/--port") from None
        gc.collect()
        gc.freeze()  # start-up objects are never garbage: keep them out of every later collection
        gc.set_threshold(50_000, 20, 20)  # fewer young-generation passes per request
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        https = ", HTTPS" if tls is not None else ""
        print(f"xpyd router listening on {args.host}:{args.port} ({len(specs)} static workers{https})", flush=True)
        try:
            await stop.wait()
        finally:
            await server.close(SHUTDOWN_TIMEOUT)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 after a clean stop; 2, with one line on stderr, for a bad command line."""
    try:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        problem = validate(args)
        if problem is not None:
            raise UsageError(problem)
        specs = static_workers(args)
        template = read_chat_template(args.chat_template)
        hub = is_hub_spec(args.tokenizer)
        if hub:  # a malformed hf: spec is a command-line error; a failed fetch is not
            from xpyd_router.tokens.hub_files import parse_spec

            parse_spec(args.tokenizer)
        args.tokenizer_impl = None if hub else make_tokenizer(args.tokenizer, template, args.engine)
        args.api_key = load_api_keys(args.api_key_file)
        args.tls = load_tls(args)
    except (UsageError, ValueError) as exc:
        return usage_error(exc)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if hub:  # after logging is set up: a failure is one warning, and the router routes without a tokenizer
        args.tokenizer_impl = load_hub_tokenizer(args.tokenizer, template, args.engine)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(args, specs))
    except UsageError as exc:
        return usage_error(exc)
    return 0


def load_tls(args: argparse.Namespace) -> TlsFiles | None:
    """The serving certificate from --tls-cert-file/--tls-key-file (ValueError, one line, if it cannot load)."""
    if not args.tls_cert_file:
        return None
    try:
        return TlsFiles(args.tls_cert_file, args.tls_key_file, args.tls_ca_file)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise ValueError(
            f"cannot load --tls-cert-file {args.tls_cert_file} with --tls-key-file {args.tls_key_file}: {reason}; "
            "give a PEM certificate and its private key"
        ) from None


def read_chat_template(path: str | None) -> str | None:
    """--chat-template FILE's text (ValueError, one line, if it cannot be read)."""
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read --chat-template {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise ValueError(f"cannot read --chat-template {path}: not UTF-8 text") from None


def usage_error(exc: Exception) -> int:
    print(f"xpyd router: {exc} (see xpyd router --help)", file=sys.stderr)
    return 2
