"""The engine's tokenizer, in the router: engines report cached blocks as token ids, so the router
cuts each prompt into the same tokens to look those blocks up.

`emulator` is exact for `xpyd emulate` (4 characters a token, each id a fixed mix of its code
points: the copy of `xpyd_emulator.tokens.token_ids`, pinned to it by a test). A path names a
Hugging Face `tokenizer.json` (the served model's, optional `tokenizers` package); it is exact
for completion prompts, while chat prompts match only if the router renders the model's chat
template as the engine does (it renders ChatML, the emulator's template).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Ids = npt.NDArray[np.int64]
CHARS_PER_TOKEN = 4
VOCAB = 1 << 17
_CHAR_KEYS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93], np.uint64)


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> Ids: ...


class EmulatorTokenizer:
    """xpyd emulate's tokens: each started group of 4 code points mixed into [0, VOCAB)."""

    name = "emulator"

    def encode(self, text: str) -> Ids:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)
        n = (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
        if len(codes) < n * CHARS_PER_TOKEN:  # the last token is shorter: pad it with code point 0
            codes = np.concatenate([codes, np.zeros(n * CHARS_PER_TOKEN - len(codes), dtype=np.uint64)])
        groups = codes.reshape(n, CHARS_PER_TOKEN)
        with np.errstate(over="ignore"):
            mixed = groups[:, 0] * _CHAR_KEYS[0] + groups[:, 1] * _CHAR_KEYS[1]
            mixed += groups[:, 2] * _CHAR_KEYS[2] + groups[:, 3] * _CHAR_KEYS[3]
            mixed ^= mixed >> np.uint64(29)
        ids: Ids = (mixed & np.uint64(VOCAB - 1)).astype(np.int64)
        return ids


class HfTokenizer:
    """A Hugging Face tokenizer.json, through the `tokenizers` package (Rust, releases the GIL)."""

    def __init__(self, path: str, add_special_tokens: bool = True) -> None:
        try:
            from tokenizers import Tokenizer as _Rust
        except ImportError:
            raise ValueError("--tokenizer PATH needs the 'tokenizers' package: pip install 'xpyd[tokenizer]'") from None
        try:
            self._tok: Any = _Rust.from_file(path)
        except Exception as exc:  # the Rust side raises plain Exception for a missing or bad file
            raise ValueError(f"--tokenizer {path}: cannot load it ({exc})") from None
        self.name = path
        self.add_special_tokens = add_special_tokens

    def encode(self, text: str) -> Ids:
        return np.asarray(self._tok.encode(text, add_special_tokens=self.add_special_tokens).ids, dtype=np.int64)


def make_tokenizer(spec: str) -> Tokenizer | None:
    """`none` (no tokenizer: engine events cannot be matched), `emulator`, or a tokenizer.json path."""
    if spec in ("", "none"):
        return None
    if spec == "emulator":
        return EmulatorTokenizer()
    return HfTokenizer(spec)
