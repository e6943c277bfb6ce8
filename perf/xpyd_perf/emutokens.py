"""The emulated engine's tokenizer: shared by the emulator and the router so their block keys agree.

A token is 4 characters of the text and its id a fixed mix of those 4 code points below VOCAB, so
the same text gives the same ids in every process. Pure (numpy only), like the rest of the model.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

CHARS_PER_TOKEN = 4
VOCAB = 1 << 17  # ids stay below a real vocabulary's size (Llama 3: 128,256)
_CHAR_KEYS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93], np.uint64)

Ids = npt.NDArray[np.int64]


def count_tokens(text: str) -> int:
    """Tokens in a text: one per started group of 4 characters."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def token_ids(text: str) -> Ids:
    """The text's token ids: each started group of 4 code points mixed into [0, VOCAB)."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)
    n = count_tokens(text)
    if len(codes) < n * CHARS_PER_TOKEN:  # the last token is shorter: pad it with code point 0
        codes = np.concatenate([codes, np.zeros(n * CHARS_PER_TOKEN - len(codes), dtype=np.uint64)])
    groups = codes.reshape(n, CHARS_PER_TOKEN)
    with np.errstate(over="ignore"):
        mixed = groups[:, 0] * _CHAR_KEYS[0] + groups[:, 1] * _CHAR_KEYS[1]
        mixed += groups[:, 2] * _CHAR_KEYS[2] + groups[:, 3] * _CHAR_KEYS[3]
        mixed ^= mixed >> np.uint64(29)
    ids: Ids = (mixed & np.uint64(VOCAB - 1)).astype(np.int64)
    return ids
