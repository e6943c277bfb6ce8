"""A model's config.json from the Hugging Face Hub, for a model outside the catalog that the spec gives no
config for (opt-in: `xpyd operator --model-hub`, the chart's operator.modelHub.enabled).

GET `{endpoint}/{model}/resolve/{revision}/config.json` (xpyd_http.hub: bounded GETs, retries on 429, 5xx
and connection errors, a byte cap), in a thread with a hard deadline so the event loop never waits on
the network. What comes back is kept in memory per (endpoint, model, revision) for the operator's
life (a model's published config.json does not change its shape); a failure is kept for
`retry_after_s`, so a hub that is down or refusing is asked at most once a minute per model, not at
every reconcile of every deployment serving it. Reconciles of the same model while a fetch is under
way share that fetch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from xpyd_http import hub
from xpyd_operator.desired import InputError
from xpyd_perf import ModelConfigError, model_from_config, parse_json

CONFIG_FILE: Final = "config.json"
MAX_BYTES: Final = 1 << 20  # a config.json is a few KiB; a multimodal one some tens
MAX_ENTRIES: Final = 256
AGENT: Final = "xpyd-operator (config.json fetch)"
GIVE_IT: Final = "or give the config.json in spec.model.configMap or spec.model.config"

Key = tuple[str, str, str]  # (endpoint, model, revision)
Fetcher = Callable[[str, str, hub.FetchOptions], bytes]


@dataclass(frozen=True)
class HubSettings:
    """The operator's --model-hub* flags."""

    endpoint: str = hub.DEFAULT_ENDPOINT
    token: str | None = None
    deadline_s: float = 20.0
    retry_after_s: float = 60.0
    attempts: int = 3
    backoff_s: float = 0.5

    def fetch_options(self) -> hub.FetchOptions:
        return hub.FetchOptions(
            endpoint=self.endpoint,
            token=self.token,
            deadline_s=self.deadline_s,
            attempts=self.attempts,
            backoff_s=self.backoff_s,
            endpoint_name="--model-hub-endpoint",
            token_name="HF_TOKEN (chart: operator.modelHub.tokenSecret)",
        )


def fetch_config(model: str, revision: str, options: hub.FetchOptions) -> bytes:
    """config.json's bytes (blocking, bounded by options.deadline_s); HubError naming the cause."""
    got = hub.get_files(model, revision, [(CONFIG_FILE, False)], options, max_bytes=MAX_BYTES, agent=AGENT)
    data = got[CONFIG_FILE]
    assert data is not None  # a required file is bytes or a HubError
    return data


@dataclass(frozen=True)
class _Failed:
    until: float
    error: InputError


class ModelHub:
    """config.json per (endpoint, model, revision): fetched once, a failure retried after retry_after_s."""

    def __init__(
        self, settings: HubSettings, clock: Callable[[], float] = time.monotonic, fetcher: Fetcher = fetch_config
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.fetcher = fetcher
        self.fetches = 0  # trips to the hub, for tests and logs
        self._good: dict[Key, dict[str, Any]] = {}
        self._failed: dict[Key, _Failed] = {}
        self._inflight: dict[Key, asyncio.Future[dict[str, Any]]] = {}

    async def config(self, model: str, revision: str) -> dict[str, Any]:
        """The model's config.json as a dict whose shape xpyd_perf can read; InputError (the Ready reason and
        a message naming the problem and the fix) otherwise."""
        if not hub.valid_revision(revision):
            why = f"--revision {revision!r} in the engine args is not a branch, tag or commit"
            raise InputError("ModelConfigUnavailable", why)
        key = (self.settings.endpoint.rstrip("/"), model, revision)
        if (good := self._good.get(key)) is not None:
            return good
        failed = self._failed.get(key)
        if failed is not None and self.clock() < failed.until:
            raise failed.error.with_traceback(None)  # no traceback piles up on the kept error
        if (running := self._inflight.get(key)) is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            config = await self._fetch(model, revision)
        except InputError as exc:
            self._failed[key] = _Failed(self.clock() + self.settings.retry_after_s, exc)
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when no one else waited
            raise
        finally:
            self._inflight.pop(key, None)
        self._failed.pop(key, None)
        if len(self._good) >= MAX_ENTRIES:
            self._good.pop(next(iter(self._good)))
        self._good[key] = config
        future.set_result(config)
        return config

    async def _fetch(self, model: str, revision: str) -> dict[str, Any]:
        options = self.settings.fetch_options()
        where = f"{CONFIG_FILE} of {model} at {revision} from the model hub {hub.host(options.endpoint)}"
        self.fetches += 1
        try:
            data = await asyncio.to_thread(
                hub.in_thread, lambda: self.fetcher(model, revision, options), options.deadline_s, "xpyd-model-hub"
            )
        except hub.HubError as exc:
            retry = f"asked again after {self.settings.retry_after_s:g}s"
            raise InputError("ModelConfigUnavailable", f"{where}: {exc}; {retry}, {GIVE_IT}") from None
        try:
            config = parse_json(data.decode("utf-8", errors="replace"), where)
            model_from_config(config, model)  # the shape must be readable: said here, naming the hub
        except ModelConfigError as exc:
            text = str(exc) if str(exc).startswith(where) else f"{where}: {exc}"
            raise InputError("ModelConfigInvalid", f"{text}; {GIVE_IT}") from None
        return config
