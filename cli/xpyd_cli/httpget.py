"""One HTTP GET for commands whose own package does no network I/O (`xpyd plan --measured URL`)."""

from __future__ import annotations

import urllib.error
import urllib.request

TIMEOUT_S = 10.0
LIMIT_BYTES = 64 << 20  # a router's /metrics or a query answer is far smaller


def get(url: str, timeout: float = TIMEOUT_S) -> str:
    """The body of `url` as text; ValueError naming the URL when it cannot be read (refused, timeout, non-2xx)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            body: bytes = reply.read(LIMIT_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ValueError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise ValueError(f"{url}: cannot connect ({exc.reason}); check the URL and that the server runs") from None
    except TimeoutError:
        raise ValueError(f"{url}: no answer within {timeout:g} s") from None
    if len(body) > LIMIT_BYTES:
        raise ValueError(f"{url}: the answer is over {LIMIT_BYTES >> 20} MiB")
    return body.decode("utf-8", errors="replace")
