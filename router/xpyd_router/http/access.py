"""Client-side checks made before any work: the API key and the client's own request deadline."""

from __future__ import annotations

import hmac
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from xpyd_api import labels
from xpyd_router.http.protocol import BadRequest

API_KEY_ENV = labels.ENV_ROUTER_API_KEY
TIMEOUT_HEADER = "X-Request-Timeout"
KEY_CHECK_S = 2.0  # at most this often the key file's stat is looked at (on a request's way, never more)
log = logging.getLogger("xpyd_router.http.access")
Stamp = tuple[int, int, int, int] | None  # a file's (device, inode, size, mtime_ns); None: cannot be stat'ed


def parse_keys(text: str, source: str) -> tuple[str, ...]:
    """The keys in `text`, one per line (blank lines skipped). ValueError names the problem and its fix."""
    keys = tuple(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
    if not keys:
        raise ValueError(f"{source} is empty; put the API key in it or leave it unset for no key")
    if any(any(c.isspace() for c in key) or not key.isprintable() for key in keys):
        raise ValueError(
            f"{source} holds whitespace or control characters; the key must be one printable token (one key a line)"
        )
    return keys


def read_key_file(path: str) -> tuple[str, ...]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ValueError(f"cannot read --api-key-file {path}: {reason}; give a readable UTF-8 file") from None
    return parse_keys(text, f"--api-key-file {path}")


def load_api_keys(path: str | None, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The keys from --api-key-file (one a line), else the one in $XPYD_ROUTER_API_KEY, else none (open).

    ValueError names the problem and its fix.
    """
    if path is not None:
        return read_key_file(path)
    if API_KEY_ENV not in environ:
        return ()
    keys = parse_keys(environ[API_KEY_ENV], f"${API_KEY_ENV}")
    if len(keys) > 1:
        raise ValueError(f"${API_KEY_ENV} holds whitespace or control characters; the key must be one printable token")
    return keys


def file_stamp(path: str) -> Stamp:
    """What changes when the file is rewritten or swapped (the kubelet swaps a Secret volume's symlink)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class ApiKey:
    """`Authorization: Bearer <key>` for any of the keys, each compared in constant time.

    With `path` (--api-key-file) the keys follow the file: its stat is looked at no more often than
    every `check_every` seconds, and a changed file is read again. A file that turns empty or
    unreadable keeps the keys read last (one warning per change): a broken rotation never opens the
    router.
    """

    def __init__(
        self,
        key: str | Sequence[str] | None,
        path: str | None = None,
        check_every: float = KEY_CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        keys = (key,) if isinstance(key, str) else tuple(key or ())
        self._keys = tuple(k.encode() for k in keys if k)
        self.path = path
        self.check_every = check_every
        self._clock = clock
        self._stamp = file_stamp(path) if path is not None else None
        self._due = clock() + check_every

    @property
    def required(self) -> bool:
        self.refresh()
        return bool(self._keys)

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys now accepted, in the file's order (the first is what this router sends its peers)."""
        self.refresh()
        return tuple(k.decode() for k in self._keys)

    def refresh(self) -> None:
        """Re-read the key file if it changed; a cheap clock check between looks."""
        if self.path is None:
            return
        now = self._clock()
        if now < self._due:
            return
        self._due = now + self.check_every
        stamp = file_stamp(self.path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            keys = read_key_file(self.path)
        except ValueError as exc:
            log.warning("%s; the router keeps the %d API key(s) it read before", exc, len(self._keys))
            return
        if keys != tuple(k.decode() for k in self._keys):
            self._keys = tuple(k.encode() for k in keys)
            log.info("API keys reloaded from --api-key-file %s: %d key(s) accepted", self.path, len(keys))

    def allows(self, authorization: str | None) -> bool:
        self.refresh()
        if not self._keys:
            return True
        if not authorization:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = token.strip().encode("utf-8", "replace")
        ok = False
        for key in self._keys:  # every key compared, whichever matches: the time says nothing about which
            ok |= hmac.compare_digest(given, key)
        return ok


def request_budget(raw: str | None, ceiling: float) -> float:
    """Seconds the request may take: the router's ceiling, lowered (never raised) by X-Request-Timeout."""
    if raw is None:
        return ceiling
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise BadRequest(f"{TIMEOUT_HEADER} must be a positive number of seconds, got {raw[:40]!r}", TIMEOUT_HEADER)
    return min(seconds, ceiling)
