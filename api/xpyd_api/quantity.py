"""Kubernetes resource quantities ("64Gi", "500G", "1.5Ti") as bytes, and back as the unit an engine takes."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Final

_SUFFIX: Final = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
_QUANTITY: Final = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(e[0-9]+|[kMGTPE]i?|Ki)?$")
GIB: Final = 2**30
GB: Final = 10**9


def quantity_bytes(text: str) -> int | None:
    """Bytes of a memory quantity (rounded down); None for text that is no quantity (or milli-bytes)."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        return None
    number, suffix = Decimal(match[1]), match[2] or ""
    if suffix.startswith("e"):
        return int(number * 10 ** int(suffix[1:]))
    return int(number * _SUFFIX[suffix])


def bytes_quantity(n: int) -> str:
    """The shortest exact binary quantity for `n` bytes ("64Gi", "1536Mi", or plain bytes)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if n and n % _SUFFIX[suffix] == 0:
            return f"{n // _SUFFIX[suffix]}{suffix}"
    return str(n)
