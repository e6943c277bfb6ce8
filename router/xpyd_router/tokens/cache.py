"""Chat prompts tokenized segment by segment, each segment's ids cached: a multi-turn chat resends its
whole history every turn, so only the new messages are tokenized again.

Hugging Face `tokenizers` (0.23, tokenizers/src/tokenizer/added_vocabulary.rs `extract_and_normalize`,
`find_matches`; tokenizer/mod.rs `encode_single_sequence`, `post_process`) cuts the input at its added
tokens before anything else: first at the non-normalized ones in the raw text, then, in each piece
left, normalized by the normalizer, at the normalized ones (leftmost-longest, daachorse). Each piece
left is then normalized, pre-tokenized and run through the model on its own, so a piece's ids do not
depend on its neighbours; `encode(piece, add_special_tokens=False)` gives them, and the whole text's
ids are the pieces' ids and the added tokens' ids in order (the post-processor adds nothing without
special tokens: processors/template.rs, bert.rs, roberta.rs, sequence.rs). This module repeats that
cut in Python (lstrip and rstrip included: Rust regex's `\\s` is Unicode White_Space) and keeps each
piece's ids in a bounded LRU cache keyed by the piece's text.

Where a piece's ids would differ (segments must then not be used, or differently):
- Metaspace with prepend_scheme "first" (pre_tokenizers/metaspace.rs) prepends "▁" only to the split
  at original offset 0: a piece encoded alone is at offset 0. Pieces after the first are encoded with
  a copy of the tokenizer whose scheme is "never", which is what "first" does past offset 0; the first
  piece with the tokenizer as it is. "always" prepends to every split whatever its offset: exact as is.
- a normalizer acts on each piece of the first cut as a whole (a Prepend normalizer prepends to each):
  exact. The normalized added tokens are matched in the normalized text, so they are cut here only
  when the normalizer is none (or an empty Sequence); otherwise they stay inside their piece, whose
  `encode` cuts them itself.
- single_word added tokens (Rust regex's `\\w` against Python's), the tokenizer's encode_special_tokens
  (special tokens not cut, their matches still consumed), truncation or padding (they act on the
  whole text) and BPE dropout (random): segments are not used.
The tokenizer checks itself all the same: the first CHECK_FIRST chat prompts and then one in
CHECK_EVERY are also encoded whole and compared; a difference logs one warning and turns segments
off for good, that prompt and every later one taking the whole encode.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import numpy.typing as npt

from xpyd_perf.emutokens import Ids

log = logging.getLogger("xpyd_router")

DEFAULT_CACHE_BYTES = 64 << 20
CHECK_FIRST = 32  # chat prompts encoded both ways at start
CHECK_EVERY = 256  # then one in this many
ENTRY_OVERHEAD = 200  # bytes an entry costs besides its text and ids: the ndarray header and the dict slot
# Rust regex's \s (Unicode White_Space), what lstrip and rstrip strip; Python's str.isspace differs.
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
WHITE_SPACE += "\u2028\u2029\u202f\u205f\u3000"
_LEADING_SPACE = re.compile("[" + re.escape(WHITE_SPACE) + "]*")

Piece = str | npt.NDArray[np.uint32]  # text still to tokenize, or an added token's id


class TokenCache:
    """An LRU map from text to its token ids, bounded by the bytes it holds (text, ids and a per-entry
    overhead): entries range from one newline to a pasted document, so a count would bound nothing.
    64 MiB holds about 2,000 histories of 4k tokens (16 KiB of text and 16 KiB of uint32 ids each);
    an entry over 1/16 of the bound is not kept, so one huge message cannot flush the rest."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes // 16
        self.bytes = 0
        self._entries: OrderedDict[str, npt.NDArray[np.uint32]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, text: str) -> npt.NDArray[np.uint32] | None:
        with self._lock:
            ids = self._entries.get(text)
            if ids is not None:
                self._entries.move_to_end(text)
            return ids

    def put(self, text: str, ids: npt.NDArray[np.uint32]) -> None:
        size = _cost(text, ids)
        if size > self.max_entry_bytes:
            return
        with self._lock:
            old = self._entries.pop(text, None)
            if old is not None:
                self.bytes -= _cost(text, old)
            self._entries[text] = ids
            self.bytes += size
            while self.bytes > self.max_bytes:
                key, value = self._entries.popitem(last=False)
                self.bytes -= _cost(key, value)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0


def _cost(text: str, ids: npt.NDArray[np.uint32]) -> int:
    return sys.getsizeof(text) + ids.nbytes + ENTRY_OVERHEAD


class _Cut:
    """tokenizers' `find_matches` over one set of added tokens: leftmost-longest matches (`_trie_regex`
    finds the same), a match's span widened over white space by lstrip (not past the previous match)
    and rstrip, the text between matches kept."""

    def __init__(self, tokens: list[Any], ids: dict[str, int]) -> None:
        self.regex = re.compile(_trie_regex({t.content for t in tokens}))
        self.tokens: dict[str, tuple[npt.NDArray[np.uint32], bool, bool]] = {}
        for t in tokens:
            one = np.array([ids[t.content]], dtype=np.uint32)
            one.flags.writeable = False
            self.tokens[t.content] = (one, bool(t.lstrip), bool(t.rstrip))

    def cut(self, text: str, out: list[Piece]) -> None:
        start_offset = 0
        for match in self.regex.finditer(text):
            start, stop = match.span()
            one, lstrip, rstrip = self.tokens[match.group()]
            if lstrip and start_offset < start:  # max(start of the white space before, start_offset)
                start = start_offset + len(text[start_offset:start].rstrip(WHITE_SPACE))
            if rstrip:
                stop = _LEADING_SPACE.match(text, stop).end()  # type: ignore[union-attr]  # `*` always matches
            if start_offset < start:
                out.append(text[start_offset:start])
            out.append(one)
            start_offset = stop
        if start_offset != len(text):
            out.append(text[start_offset:])


class SegmentEncoder:
    """A `tokenizers.Tokenizer`'s encode(text, add_special_tokens=False) piece by piece through a
    TokenCache, or whole where that is not exact (`disabled` says why)."""

    def __init__(self, tok: Any, name: str, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.name = name
        self.cache = TokenCache(cache_bytes)
        self.encoded = 0  # chat prompts encoded by pieces
        self.checked = 0  # of which also encoded whole and compared
        self._tok = tok
        self._later: Any = tok  # encodes the pieces after the first (a "never" copy for Metaspace "first")
        self._cuts: list[_Cut] = []
        self.disabled: str | None = None
        try:
            self.disabled = self._plan(tok)
        except Exception as exc:  # a tokenizer this reading does not know: whole encodes, nothing lost
            self.disabled = f"cannot read its configuration ({' '.join(str(exc).split())})"
        if self.disabled is not None:
            log.info("--tokenizer %s: chat prompts are tokenized whole: %s", name, self.disabled)

    def _plan(self, tok: Any) -> str | None:
        if tok.encode_special_tokens:
            return "encode_special_tokens is set"
        if tok.truncation is not None or tok.padding is not None:
            return "truncation or padding is set"
        if getattr(tok.model, "dropout", None):
            return "BPE dropout is set"
        added = list(tok.get_added_tokens_decoder().items())
        ids = {t.content: i for i, t in sorted(added)}  # a content twice: the map keeps the last id
        tokens = [t for _, t in added if t.content]
        raw = [t for t in tokens if not t.normalized]
        normalized = [t for t in tokens if t.normalized]
        normalizer = json.loads(tok.normalizer.__getstate__()) if tok.normalizer is not None else None
        if not _identity(normalizer):
            normalized = []  # matched in normalized text: left inside their pieces, whose encode cuts them
        if any(t.single_word for t in raw + normalized):
            return "an added token is single_word"
        if not raw and not normalized:
            return "no added tokens to cut at"
        self._cuts = [_Cut(group, ids) for group in (raw, normalized) if group]
        pre = json.loads(tok.pre_tokenizer.__getstate__()) if tok.pre_tokenizer is not None else None
        if _metaspace_first(pre, never=False):
            config = json.loads(tok.to_str())
            _metaspace_first(config["pre_tokenizer"], never=True)
            self._later = type(tok).from_str(json.dumps(config))
        return None

    def encode(self, text: str) -> Ids:
        """The ids of tok.encode(text, add_special_tokens=False), by segments while they are exact."""
        if self.disabled is not None:
            return self.whole(text)
        try:
            ids = self.segmented(text)
        except Exception:  # whatever the text: the whole encode answers, as it did without segments
            ids = None
        if ids is None:
            return self.whole(text)
        self.encoded += 1
        if self.encoded <= CHECK_FIRST or self.encoded % CHECK_EVERY == 0:
            self.checked += 1
            whole = self.whole(text)
            if not np.array_equal(ids, whole):
                self.disabled = f"chat prompt {self.encoded}: its segments' ids differ from its whole encode's"
                self.cache.clear()
                log.warning("--tokenizer %s: %s; chat prompts are tokenized whole from now", self.name, self.disabled)
            return whole
        return ids

    def segmented(self, text: str) -> Ids | None:
        """The text's ids from its pieces' (cached) ids, unchecked; None without an added token in it."""
        pieces = self.cut(text)
        if len(pieces) == 1 and isinstance(pieces[0], str):  # nothing to reuse: the whole encode is as fast
            return None
        parts: list[npt.NDArray[np.uint32]] = []
        cache = self.cache
        for i, piece in enumerate(pieces):
            if not isinstance(piece, str):
                parts.append(piece)
            elif i == 0 and self._later is not self._tok:  # at offset 0, where Metaspace "first" prepends
                parts.append(_encode(self._tok, piece))
            else:
                ids = cache.get(piece)
                if ids is None:
                    ids = _encode(self._later, piece)
                    cache.put(piece, ids)
                parts.append(ids)
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(parts, dtype=np.int64)

    def whole(self, text: str) -> Ids:
        return np.asarray(encode_unlocked(self._tok, text), dtype=np.int64)

    def cut(self, text: str) -> list[Piece]:
        """The text's pieces as tokenizers cuts them at added tokens: texts and 1-id arrays."""
        pieces: list[Piece] = [text]
        for cut in self._cuts:
            out: list[Piece] = []
            for piece in pieces:
                if isinstance(piece, str):
                    cut.cut(piece, out)
                else:
                    out.append(piece)
            pieces = out
        return pieces


def encode_unlocked(tok: Any, text: str, add_special_tokens: bool = False) -> list[int]:
    """`tok.encode(text).ids`, with the GIL released while Rust works: the `tokenizers` binding holds it
    for the whole of `encode` (bindings/python/src/tokenizer.rs) but detaches in `encode_batch`, so a
    prompt tokenized on one of the router's threads would otherwise stop the event loop all the same
    (measured: a 64k-character prompt on a thread stalled the main thread 20 ms with `encode`, 0.6 ms
    with `encode_batch`, at the same cost per call). With TOKENIZERS_PARALLELISM false (HfTokenizer
    sets it unless the environment says otherwise) the batch of one runs on the calling thread."""
    ids: list[int] = tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
    return ids


def _encode(tok: Any, text: str) -> npt.NDArray[np.uint32]:
    ids = np.asarray(encode_unlocked(tok, text), dtype=np.uint32)
    ids.flags.writeable = False  # shared by every prompt that has this piece
    return ids


def _trie_regex(words: set[str]) -> str:
    """A regex matching the longest of `words` at the leftmost place one starts: the words' trie, each
    node's children (distinct first characters) an alternation, a word's end an optional rest. Python's
    regex tries a flat alternation's hundreds of words (Llama 3 has 256 added tokens) at every place;
    the trie tries one character."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}  # a word ends here
    return _node_regex(root)


def _node_regex(node: dict[str, Any]) -> str:
    alternatives = []
    for ch, child in sorted((k, v) for k, v in node.items() if k):
        literal = ch
        while len(child) == 1 and "" not in child:  # a chain of single children: one literal
            ((ch2, child),) = child.items()
            literal += ch2
        alternatives.append(re.escape(literal) + _node_regex(child))
    if not alternatives:
        return ""
    body = alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"
    return f"(?:{body})?" if "" in node else body  # greedy: the longer word first, else the word ending here


def _identity(normalizer: Any) -> bool:
    """Whether a normalizer's JSON leaves every text as it is: none, or a Sequence of such."""
    if normalizer is None:
        return True
    if isinstance(normalizer, dict) and normalizer.get("type") == "Sequence":
        return all(_identity(n) for n in normalizer.get("normalizers", []))
    return False


def _metaspace_first(pre: Any, never: bool) -> bool:
    """Whether a pre-tokenizer's JSON has a Metaspace with prepend_scheme "first"; `never`: make it "never"."""
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "Sequence":
        found = False
        for p in pre.get("pretokenizers", []):
            found = _metaspace_first(p, never) or found
        return found
    if pre.get("type") == "Metaspace" and pre.get("prepend_scheme") == "first":
        if never:
            pre["prepend_scheme"] = "never"
        return True
    return False
