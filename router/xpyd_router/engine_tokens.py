"""The engine's tokenizer, in the router: engines report cached blocks as token ids, so the router
cuts each prompt into the same tokens to look those blocks up.

`emulator` is exact for `xpyd emulate` (4 characters a token, each id a fixed mix of its code
points: `xpyd_perf.emutokens`, the module the emulator tokenizes with). A path names a
Hugging Face `tokenizer.json` (the served model's, optional `tokenizers` package); it is exact
for completion prompts, while chat prompts match only if the router renders the model's chat
template as the engine does (it renders ChatML, the emulator's template).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from xpyd_perf.emutokens import Ids as Ids
from xpyd_perf.emutokens import token_ids


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> Ids: ...


class EmulatorTokenizer:
    """xpyd emulate's tokens: each started group of 4 code points mixed into [0, VOCAB)."""

    name = "emulator"

    def encode(self, text: str) -> Ids:
        return token_ids(text)


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
