"""A model's tokenizer files from the Hugging Face Hub, fetched once at router start-up (`--tokenizer hf:REPO`).

Three files: tokenizer.json (required), tokenizer_config.json and chat_template.jinja (optional: a 404
means the repository has none). GET `{HF_ENDPOINT}/{repo}/resolve/{revision}/{file}` (default endpoint
https://huggingface.co; a mirror works the same), redirects followed (httpx drops the token when a
redirect leaves the hub's host, as for the CDN), `Authorization: Bearer $HF_TOKEN` for gated repos.
The files land in `$HF_HOME/xpyd-router/` (else under the temp dir: the router pod writes only /tmp),
each written atomically; a later start that cannot reach the hub uses that copy, as does one asked for
a commit hash (a commit never changes) or run with HF_HUB_OFFLINE=1.

Bounded: 30 s for the whole fetch (the worker thread is left behind if DNS or a server hangs), three
tries per file on connection errors, timeouts, 429 and 5xx, at most 64 MiB a file. Any failure is one
HubError line; the caller then routes without a tokenizer.

Why not `huggingface_hub.hf_hub_download`: a loopback fake of the hub it talks to is easy (HEAD with
X-Repo-Commit and ETag, then GET), but what it does around the request is not ours to bound. Tried
against such a fake (huggingface_hub 2.4): with the hub unreachable, a file not yet cached is retried
five times with backoff up to 8 s (about 23 s for that one file, most of our budget), each try logged
as a WARNING on its own stderr handler, HF_ENDPOINT and its timeouts are read once at import, and it draws
in its transport (httpx2 in 2.x), xet and progress bars. Three small GETs with httpx, already a
dependency, keep the start-up contract: bounded, one warning line, and testable with a loopback hub.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx

PREFIX = "hf:"
REQUIRED = "tokenizer.json"
OPTIONAL = ("tokenizer_config.json", "chat_template.jinja")
DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_BYTES = 64 << 20
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "xpyd-hf"  # without HF_HOME
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
_REVISION = re.compile(r"[A-Za-z0-9._/-]{1,255}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_ABSENT = ".absent"  # marker next to where an optional file would be: the repository has none
_NO_RETRY_404 = ("RepoNotFound", "RevisionNotFound")


class HubError(Exception):
    """The files could not be had; the message says why, on one line."""


@dataclass(frozen=True)
class HubRef:
    """`hf:REPO[@REVISION]`."""

    repo: str
    revision: str = "main"


def parse_spec(spec: str) -> HubRef:
    """`hf:org/name[@revision]` -> HubRef; ValueError naming the problem."""
    body = spec.removeprefix(PREFIX)
    repo, at, revision = body.partition("@")
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise ValueError(f"--tokenizer {spec}: want hf:ORG/NAME[@REVISION], a Hugging Face model repository")
    if at and (not _REVISION.fullmatch(revision) or ".." in revision):
        raise ValueError(f"--tokenizer {spec}: the revision after '@' must be a branch, tag or commit")
    return HubRef(repo, revision or "main")


@dataclass(frozen=True)
class HubOptions:
    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    cache_root: Path = DEFAULT_CACHE
    offline: bool = False
    deadline_s: float = 30.0
    attempts: int = 3
    backoff_s: float = 0.5
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0

    @classmethod
    def from_env(cls) -> HubOptions:
        """HF_ENDPOINT, HF_TOKEN (or the older HUGGING_FACE_HUB_TOKEN), HF_HOME, HF_HUB_OFFLINE."""
        env = os.environ
        home = env.get("HF_HOME")
        return cls(
            endpoint=(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
            token=env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None,
            cache_root=Path(home) if home else DEFAULT_CACHE,
            offline=env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"),
        )


@dataclass(frozen=True)
class Fetched:
    directory: Path  # holds tokenizer.json and whichever optional files the repository has
    note: str | None = None  # why a cached copy was used, or where the files went instead of the cache


def cache_dir(ref: HubRef, options: HubOptions) -> Path:
    return options.cache_root / "xpyd-router" / ref.repo.replace("/", "--") / quote(ref.revision, safe="")


def fetch(ref: HubRef, options: HubOptions) -> Fetched:
    """The repository's tokenizer files in a local directory, from the hub or the cache; HubError if neither."""
    target = cache_dir(ref, options)
    if options.offline:
        if is_complete(target):
            return Fetched(target, "HF_HUB_OFFLINE is set: using the cached copy")
        raise HubError(f"HF_HUB_OFFLINE is set and nothing is cached at {target}")
    if _COMMIT.fullmatch(ref.revision) and is_complete(target):
        return Fetched(target)  # a commit's files never change
    box: list[Fetched | HubError] = []

    def work() -> None:
        try:
            box.append(_fetch(ref, options, target))
        except HubError as exc:
            box.append(exc)
        except Exception as exc:  # a bug or an odd OS error: still one line, never a crash at start-up
            box.append(HubError(f"{type(exc).__name__}: {exc}"))

    # A thread, so that the deadline also bounds what no socket timeout covers (a stuck DNS lookup).
    worker = threading.Thread(target=work, name="xpyd-hub-fetch", daemon=True)
    worker.start()
    worker.join(options.deadline_s + 1.0)
    result = box[0] if box else HubError(f"no answer within {options.deadline_s:g}s")
    if isinstance(result, Fetched):
        return result
    if is_complete(target):
        return Fetched(target, f"{result}; using the copy cached at {target}")
    raise result


def is_complete(target: Path) -> bool:
    """A stored copy: tokenizer.json (written last), and each optional file or its absence marker."""
    if not (target / REQUIRED).is_file():
        return False
    return all((target / n).is_file() or (target / (n + _ABSENT)).is_file() for n in OPTIONAL)


def _fetch(ref: HubRef, options: HubOptions, target: Path) -> Fetched:
    endpoint = options.endpoint.rstrip("/")
    if urlsplit(endpoint).scheme not in ("http", "https") or not urlsplit(endpoint).hostname:
        raise HubError(f"HF_ENDPOINT must be an http(s) URL, got {endpoint!r}")
    headers = {"User-Agent": "xpyd-router (tokenizer fetch)"}
    if options.token:
        headers["Authorization"] = f"Bearer {options.token}"
    base = f"{endpoint}/{ref.repo}/resolve/{quote(ref.revision, safe='')}/"
    got: dict[str, bytes | None] = {}
    with httpx.Client(headers=headers, follow_redirects=True, max_redirects=5) as client:
        # Timed from here: building the client (its TLS context) is local work that a busy machine slows,
        # and the first request should still get the whole deadline. fetch's join bounds the total.
        deadline = time.monotonic() + options.deadline_s
        for name in (REQUIRED, *OPTIONAL):  # the required file first: a gated repo fails at once
            got[name] = _get(client, base + name, name, name != REQUIRED, deadline, options)
    return _store(target, got)


class _Retry(Exception):
    """A failure worth another try (the network, a timeout, 429, 5xx)."""


def _get(
    client: httpx.Client, url: str, name: str, optional: bool, deadline: float, options: HubOptions
) -> bytes | None:
    """The file's bytes, or None for an optional file the repository does not have."""
    problem = ""
    for attempt in range(options.attempts):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            return _get_once(client, url, name, optional, deadline, options)
        except _Retry as exc:
            problem = str(exc)
        pause = options.backoff_s * 2**attempt
        if attempt + 1 < options.attempts and time.monotonic() + pause < deadline:
            time.sleep(pause)
    if not problem:
        problem = f"no answer within {options.deadline_s:g}s"
    raise HubError(f"cannot fetch {name} ({problem})")


def _get_once(
    client: httpx.Client, url: str, name: str, optional: bool, deadline: float, options: HubOptions
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
                why = "gated or private repository" if code == 401 else "no access to this repository"
                fix = "set HF_TOKEN to a token with access" if code == 401 else "request access with HF_TOKEN's account"
                raise HubError(f"cannot fetch {name} (HTTP {code}: {why}; {fix})")
            if code == 429 or code >= 500:
                raise _Retry(f"HTTP {code}")
            if code != 200:
                detail = f": {error}" if error else ""
                raise HubError(f"cannot fetch {name} (HTTP {code}{detail})")
            declared = resp.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > MAX_BYTES:
                raise HubError(f"{name} is {int(declared)} bytes, over the {MAX_BYTES} byte limit")
            data = bytearray()
            for chunk in resp.iter_bytes():
                data += chunk
                if len(data) > MAX_BYTES:
                    raise HubError(f"{name} is over the {MAX_BYTES} byte limit")
                if time.monotonic() > deadline:
                    raise HubError(f"cannot fetch {name} (no complete answer within {options.deadline_s:g}s)")
            return bytes(data)
    except httpx.TimeoutException:
        raise _Retry(f"timed out at {_host(url)}") from None
    except httpx.TransportError as exc:
        raise _Retry(f"cannot reach {_host(url)}: {_one_line(exc)}") from None
    except httpx.RequestError as exc:  # too many redirects, an undecodable body
        raise HubError(f"cannot fetch {name} ({_one_line(exc)})") from None


def _host(url: str) -> str:
    """host[:port] of a URL, without any user:password an HF_ENDPOINT may carry."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def _store(target: Path, got: dict[str, bytes | None]) -> Fetched:
    """Write the files (tokenizer.json last: it marks a whole copy); to a temp dir if the cache is read-only."""
    note = None
    try:
        _write_all(target, got)
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix="xpyd-tokenizer-"))
        try:
            _write_all(fallback, got)
        except OSError as again:
            raise HubError(f"cannot store the files ({_one_line(again)})") from None
        note = f"cannot write the cache at {target} ({_one_line(exc)}); using {fallback} for this run"
        target = fallback
    return Fetched(target, note)


def _write_all(target: Path, got: dict[str, bytes | None]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in (*OPTIONAL, REQUIRED):
        data = got.get(name)
        path, marker = target / name, target / (name + _ABSENT)
        if data is None:
            path.unlink(missing_ok=True)
            _write(marker, b"")
        else:
            _write(path, data)
            marker.unlink(missing_ok=True)


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
