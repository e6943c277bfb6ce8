"""OpenAI's error body, the shape every answer the listener writes itself takes (unless told otherwise)."""

from __future__ import annotations

import orjson


def error_body(message: str, kind: str, code: int, param: str | None = None) -> bytes:
    """OpenAI's error shape."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})
