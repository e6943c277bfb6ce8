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
HubError line; the caller then routes without a tokenizer. The GETs and their bounds are xpyd_http.hub's
(shared with the operator's config.json fetch; why not huggingface_hub is said there); the cache is ours.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from xpyd_http import hub
from xpyd_http.hub import HubError

PREFIX = "hf:"
REQUIRED = "tokenizer.json"
OPTIONAL = ("tokenizer_config.json", "chat_template.jinja")
DEFAULT_ENDPOINT = hub.DEFAULT_ENDPOINT
MAX_BYTES = 64 << 20
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "xpyd-hf"  # without HF_HOME
_ABSENT = ".absent"  # marker next to where an optional file would be: the repository has none
__all__ = ["Fetched", "HubError", "HubOptions", "HubRef", "fetch", "parse_spec"]


@dataclass(frozen=True)
class HubRef:
    """`hf:REPO[@REVISION]`."""

    repo: str
    revision: str = "main"


def parse_spec(spec: str) -> HubRef:
    """`hf:org/name[@revision]` -> HubRef; ValueError naming the problem."""
    body = spec.removeprefix(PREFIX)
    repo, at, revision = body.partition("@")
    if not hub.valid_repo(repo):
        raise ValueError(f"--tokenizer {spec}: want hf:ORG/NAME[@REVISION], a Hugging Face model repository")
    if at and not hub.valid_revision(revision):
        raise ValueError(f"--tokenizer {spec}: the revision after '@' must be a branch, tag or commit")
    return HubRef(repo, revision or "main")


@dataclass(frozen=True)
class HubOptions(hub.FetchOptions):
    """The hub and the fetch's bounds (xpyd_http.hub.FetchOptions), and where the files are kept."""

    cache_root: Path = DEFAULT_CACHE
    offline: bool = False

    @classmethod
    def from_env(cls) -> HubOptions:
        """HF_ENDPOINT, HF_TOKEN (or the older HUGGING_FACE_HUB_TOKEN), HF_HOME, HF_HUB_OFFLINE."""
        env = os.environ
        home = env.get("HF_HOME")
        return cls(
            endpoint=hub.env_endpoint(env),
            token=hub.env_token(env),
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
    if hub.COMMIT.fullmatch(ref.revision) and is_complete(target):
        return Fetched(target)  # a commit's files never change
    try:
        # A thread, so that the deadline also bounds what no socket timeout covers (a stuck DNS lookup).
        return hub.in_thread(lambda: _fetch(ref, options, target), options.deadline_s)
    except HubError as exc:
        result = exc
    if is_complete(target):
        return Fetched(target, f"{result}; using the copy cached at {target}")
    raise result


def is_complete(target: Path) -> bool:
    """A stored copy: tokenizer.json (written last), and each optional file or its absence marker."""
    if not (target / REQUIRED).is_file():
        return False
    return all((target / n).is_file() or (target / (n + _ABSENT)).is_file() for n in OPTIONAL)


def _fetch(ref: HubRef, options: HubOptions, target: Path) -> Fetched:
    # The required file first: a gated repository fails at once.
    files = [(REQUIRED, False), *((name, True) for name in OPTIONAL)]
    got = hub.get_files(
        ref.repo, ref.revision, files, options, max_bytes=MAX_BYTES, agent="xpyd-router (tokenizer fetch)"
    )
    return _store(target, got)


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
            raise HubError(f"cannot store the files ({hub.one_line(again)})") from None
        note = f"cannot write the cache at {target} ({hub.one_line(exc)}); using {fallback} for this run"
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
