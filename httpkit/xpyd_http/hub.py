"""Files of a Hugging Face Hub repository by bounded GETs: the router's tokenizer, the operator's config.json.

GET `{endpoint}/{repo}/resolve/{revision}/{file}` (default endpoint https://huggingface.co, HF_ENDPOINT;
a mirror works the same), redirects followed (httpx drops the token when a redirect leaves the hub's
host, as for the CDN), `Authorization: Bearer <token>` for gated repositories.

Bounded: a deadline for the whole fetch (`in_thread` runs it in a thread of its own, so the deadline
also bounds what no socket timeout covers, a stuck DNS lookup: that thread is left behind), a few
tries per file on connection errors, timeouts, 429 and 5xx, a byte cap per file. Every failure is one
HubError line naming the file, the cause and, for 401/403, the fix. The callers keep what is theirs:
the router's on-disk tokenizer cache (xpyd_router.tokens.hub_files), the operator's in-memory
config.json cache (xpyd_operator.modelhub).

Why not `huggingface_hub.hf_hub_download`: a loopback fake of the hub it talks to is easy (HEAD with
X-Repo-Commit and ETag, then GET), but what it does around the request is not ours to bound. Tried
against such a fake (huggingface_hub 2.4): with the hub unreachable, a file not yet cached is retried
five times with backoff up to 8 s (about 23 s for that one file, most of our budget), each try logged
as a WARNING on its own stderr handler, HF_ENDPOINT and its timeouts are read once at import, and it draws
in its transport (httpx2 in 2.x), xet and progress bars. A few small GETs with httpx, already a
dependency, keep the contract: bounded, one line, and testable with a loopback hub.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, urlsplit

import httpx

DEFAULT_ENDPOINT = "https://huggingface.co"
REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
REVISION = re.compile(r"[A-Za-z0-9._/-]{1,255}")
COMMIT = re.compile(r"[0-9a-f]{40}")
_NO_RETRY_404 = ("RepoNotFound", "RevisionNotFound")  # a 404 that says the repository or revision is not there
T = TypeVar("T")


class HubError(Exception):
    """The files could not be had; the message says why, on one line."""


def valid_repo(repo: str) -> bool:
    """`org/name` (or a bare legacy `name`) as the hub spells repository ids; never a path out of the URL."""
    return REPO.fullmatch(repo) is not None and ".." not in repo


def valid_revision(revision: str) -> bool:
    """A branch, tag or commit."""
    return REVISION.fullmatch(revision) is not None and ".." not in revision


def env_endpoint(env: Mapping[str, str] | None = None) -> str:
    """HF_ENDPOINT, else the public hub; without a trailing slash."""
    env = os.environ if env is None else env
    return (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def env_token(env: Mapping[str, str] | None = None) -> str | None:
    """HF_TOKEN, or the older HUGGING_FACE_HUB_TOKEN."""
    env = os.environ if env is None else env
    return env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None


@dataclass(frozen=True)
class FetchOptions:
    """Where the hub is, how to authenticate, and the bounds of one fetch."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    deadline_s: float = 30.0
    attempts: int = 3
    backoff_s: float = 0.5
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    endpoint_name: str = "HF_ENDPOINT"  # what the messages call the endpoint's setting
    token_name: str = "HF_TOKEN"  # ... and the token's


def check_endpoint(options: FetchOptions) -> str:
    """The endpoint without a trailing slash; HubError unless it is an http(s) URL with a host."""
    endpoint = options.endpoint.rstrip("/")
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HubError(f"{options.endpoint_name} must be an http(s) URL, got {endpoint!r}")
    return endpoint


def resolve_url(endpoint: str, repo: str, revision: str, name: str) -> str:
    return f"{endpoint.rstrip('/')}/{repo}/resolve/{quote(revision, safe='')}/{name}"


def get_files(
    repo: str,
    revision: str,
    files: Sequence[tuple[str, bool]],
    options: FetchOptions,
    *,
    max_bytes: int,
    agent: str,
) -> dict[str, bytes | None]:
    """Each (name, optional) file's bytes, in order, or None for an optional file the repository lacks.

    Runs in the calling thread and blocks: bounded by the deadline except for what no socket timeout covers
    (a stuck DNS lookup); `in_thread` bounds that too.
    """
    endpoint = check_endpoint(options)
    headers = {"User-Agent": agent}
    if options.token:
        headers["Authorization"] = f"Bearer {options.token}"
    got: dict[str, bytes | None] = {}
    with httpx.Client(headers=headers, follow_redirects=True, max_redirects=5) as client:
        # Timed from here: building the client (its TLS context) is local work that a busy machine slows,
        # and the first request should still get the whole deadline. in_thread's join bounds the total.
        deadline = time.monotonic() + options.deadline_s
        for name, optional in files:
            url = resolve_url(endpoint, repo, revision, name)
            got[name] = _get(client, url, name, optional, deadline, options, max_bytes)
    return got


def in_thread(work: Callable[[], T], deadline_s: float, name: str = "xpyd-hub-fetch") -> T:
    """`work()` in a daemon thread, given up on (left behind) after deadline_s + 1 s; any exception that is
    not a HubError becomes one (a bug or an odd OS error: still one line, never a crash)."""
    box: list[T | HubError] = []

    def run() -> None:
        try:
            box.append(work())
        except HubError as exc:
            box.append(exc)
        except Exception as exc:
            box.append(HubError(f"{type(exc).__name__}: {exc}"))

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    worker.join(deadline_s + 1.0)
    result = box[0] if box else HubError(f"no answer within {deadline_s:g}s")
    if isinstance(result, HubError):
        raise result
    return result


class _Retry(Exception):
    """A failure worth another try (the network, a timeout, 429, 5xx)."""


def _get(
    client: httpx.Client,
    url: str,
    name: str,
    optional: bool,
    deadline: float,
    options: FetchOptions,
    max_bytes: int,
) -> bytes | None:
    problem = ""
    for attempt in range(options.attempts):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            return _get_once(client, url, name, optional, deadline, options, max_bytes)
        except _Retry as exc:
            problem = str(exc)
        pause = options.backoff_s * 2**attempt
        if attempt + 1 < options.attempts and time.monotonic() + pause < deadline:
            time.sleep(pause)
    if not problem:
        problem = f"no answer within {options.deadline_s:g}s"
    raise HubError(f"cannot fetch {name} ({problem})")


def _get_once(
    client: httpx.Client,
    url: str,
    name: str,
    optional: bool,
    deadline: float,
    options: FetchOptions,
    max_bytes: int,
) -> bytes | None:
    left = max(0.01, deadline - time.monotonic())
    timeout = httpx.Timeout(min(left, options.read_timeout_s), connect=min(left, options.connect_timeout_s))
    try:
        with client.stream("GET", url, timeout=timeout) as resp:
            code = resp.status_code
            error = resp.headers.get("X-Error-Code", "")
            if code == 404 and optional and error not in _NO_RETRY_404:
                return None
            if code in (401, 403):
                token = options.token_name
                why = "gated or private repository" if code == 401 else "no access to this repository"
                fix = f"set {token} to a token with access" if code == 401 else f"request access with {token}'s account"
                raise HubError(f"cannot fetch {name} (HTTP {code}: {why}; {fix})")
            if code == 429 or code >= 500:
                raise _Retry(f"HTTP {code}")
            if code != 200:
                detail = f": {error}" if error else ""
                raise HubError(f"cannot fetch {name} (HTTP {code}{detail})")
            declared = resp.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise HubError(f"{name} is {int(declared)} bytes, over the {max_bytes} byte limit")
            data = bytearray()
            for chunk in resp.iter_bytes():
                data += chunk
                if len(data) > max_bytes:
                    raise HubError(f"{name} is over the {max_bytes} byte limit")
                if time.monotonic() > deadline:
                    raise HubError(f"cannot fetch {name} (no complete answer within {options.deadline_s:g}s)")
            return bytes(data)
    except httpx.TimeoutException:
        raise _Retry(f"timed out at {host(url)}") from None
    except httpx.TransportError as exc:
        raise _Retry(f"cannot reach {host(url)}: {one_line(exc)}") from None
    except httpx.RequestError as exc:  # too many redirects, an undecodable body
        raise HubError(f"cannot fetch {name} ({one_line(exc)})") from None


def host(url: str) -> str:
    """host[:port] of a URL, without any user:password an endpoint may carry."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
