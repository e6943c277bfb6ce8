"""Client-side checks made before any work: the API key and the client's own request deadline."""

from __future__ import annotations

import hmac
import math
import os
from collections.abc import Mapping
from pathlib import Path

from xpyd_api import labels
from xpyd_router.protocol import BadRequest

API_KEY_ENV = labels.ENV_ROUTER_API_KEY
TIMEOUT_HEADER = "X-Request-Timeout"


def load_api_key(path: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The key from --api-key-file, else from $XPYD_ROUTER_API_KEY, else None (no key: open).

    ValueError names the problem and its fix.
    """
    if path is not None:
        try:
            key = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ValueError(f"cannot read --api-key-file {path}: {reason}; give a readable UTF-8 file") from None
        source = f"--api-key-file {path}"
    elif API_KEY_ENV in environ:
        key, source = environ[API_KEY_ENV].strip(), f"${API_KEY_ENV}"
    else:
        return None
    if not key:
        raise ValueError(f"{source} is empty; put the API key in it or leave it unset for no key")
    if any(c.isspace() for c in key) or not key.isprintable():
        raise ValueError(f"{source} holds whitespace or control characters; the key must be one printable token")
    return key


class ApiKey:
    """`Authorization: Bearer <key>`, compared in constant time."""

    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else None

    @property
    def required(self) -> bool:
        return self._key is not None

    def allows(self, authorization: str | None) -> bool:
        if self._key is None:
            return True
        if not authorization:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(token.strip().encode("utf-8", "replace"), self._key)


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
