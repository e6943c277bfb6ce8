"""Chat prompts tokenized by segments between added tokens, each segment's ids cached: the ids are the
whole encode's, exactly, or the segments are not used.

Real models' templates and the tiny real BPE of chat_models.py; tokenizers built here where segments
need care (Metaspace "first", a Prepend normalizer, normalized and lstrip / rstrip added tokens) or
cannot be used (single_word, truncation, dropout, encode_special_tokens); the runtime self-check catching
a tokenizer whose segments differ; the cache's bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chat_models import CORPUS, MODELS, SPECIALS, model_dir  # type: ignore[import-not-found]  # on sys.path
from hypothesis import given, settings
from hypothesis import strategies as st
from test_router_chat_template import CHAT, PARTS, TOOL_TURNS, WEATHER  # type: ignore[import-not-found]
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from xpyd_router.kv.block_keys import RequestKeys, token_block_keys
from xpyd_router.tokens import cache as token_cache
from xpyd_router.tokens.cache import CHECK_EVERY, CHECK_FIRST, WHITE_SPACE, SegmentEncoder, TokenCache
from xpyd_router.tokens.engine import HfTokenizer, load_local

Json = dict[str, Any]


def _turns(n: int, say: Callable[[int], str], reply: Callable[[int], str]) -> list[Json]:
    messages: list[Json] = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(n):
        messages += [{"role": "user", "content": say(i)}, {"role": "assistant", "content": reply(i)}]
    return messages


# (id, models, the conversation's messages, other request fields): each prefix a template renders is a request
CONVERSATIONS: list[tuple[str, tuple[str, ...], list[Json], Json]] = [
    ("ten-turns", tuple(MODELS), _turns(10, lambda i: f"Question {i}: what is {i} + {i}?", lambda i: f"{2 * i}."), {}),
    ("chat", tuple(MODELS), CHAT, {}),
    ("parts", tuple(MODELS), [*PARTS, {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}], {}),
    ("tools", ("qwen2.5-instruct", "llama-3.1-instruct", "mistral-7b-instruct-v0.3"),
     [*TOOL_TURNS, {"role": "assistant", "content": "It is 22 C."}, {"role": "user", "content": "Thanks"}],
     {"tools": [WEATHER]}),
    ("unicode", tuple(MODELS),
     _turns(3, lambda i: f"Ünïcödé {i}: 中文 日本語 한국어 🙂👍🏽 e\u0301 \u200d\u2028 \u00a0\u3000 עברית",
            lambda i: "ок ✓"), {}),
    ("empty", tuple(MODELS), _turns(3, lambda i: "", lambda i: ""), {}),
    ("whitespace", tuple(MODELS), _turns(3, lambda i: "  \n\n\t x \n " * (i + 1), lambda i: " \n"), {}),
    ("special-strings-in-content", tuple(MODELS),
     _turns(len(SPECIALS) // 4, lambda i: f"see {' '.join(SPECIALS[4 * i : 4 * i + 4])}<|im_<|eot_id|<|eot_id|>>[INST",
            lambda i: f"{SPECIALS[i]}{SPECIALS[-1 - i]}  {SPECIALS[i]}"), {}),
    ("continue-final", ("qwen2.5-instruct", "llama-3.1-instruct", "deepseek-r1"),
     [*CHAT[1:2], {"role": "assistant", "content": "The capital is"}],
     {"add_generation_prompt": False, "continue_final_message": True}),
]  # fmt: skip
PARAMS = [
    pytest.param(model, messages, extra, id=f"{model}-{name}")
    for name, models_, messages, extra in CONVERSATIONS
    for model in models_
]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {m: model_dir(root / m, m) for m in MODELS}


def _rendered(tok: HfTokenizer, messages: list[Json], extra: Json) -> list[str]:
    """Each request of the conversation as a client resends it: the first k messages, rendered."""
    assert tok.chat_template is not None
    texts = [tok.chat_template.try_render({"messages": messages[:k], **extra}) for k in range(1, len(messages) + 1)]
    return [t for t in texts if t is not None]


@pytest.mark.parametrize(("model", "messages", "extra"), PARAMS)
def test_segments_are_the_whole_encode(
    model: str, messages: list[Json], extra: Json, model_dirs: dict[str, Path]
) -> None:
    tok = load_local(model_dirs[model])
    segments = tok.chat_segments
    assert segments.disabled is None
    texts = _rendered(tok, messages, extra)
    assert texts
    for text in texts:  # unchecked, so a difference cannot hide behind the self-check
        assert np.array_equal(segments.segmented(text), tok.encode(text, False))  # type: ignore[arg-type]
    for text in texts:  # again, from the cache
        assert np.array_equal(segments.segmented(text), tok.encode(text, False))  # type: ignore[arg-type]
        assert np.array_equal(tok.encode_chat(text), tok.encode(text, False))
    assert len(segments.cache) > 0 and segments.disabled is None


def test_later_turns_reuse_the_history(model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    tok = load_local(model_dirs["llama-3.1-instruct"])
    texts = _rendered(tok, _turns(6, lambda i: f"question {i} " * 50, lambda i: f"answer {i} " * 50), {})
    encoded: list[str] = []
    later = tok.chat_segments._later
    monkeypatch.setattr(tok.chat_segments, "_later", _Spy(later, encoded))
    tok.encode_chat(texts[1])  # system, user
    encoded.clear()
    tok.encode_chat(texts[3])  # a turn on: the reply and the next user message are new, the rest is cached
    assert encoded == ["\n\n" + ("answer 0 " * 50).strip(), "\n\n" + ("question 1 " * 50).strip()]


class _Spy:
    def __init__(self, tok: Any, seen: list[str]) -> None:
        self.tok, self.seen = tok, seen

    def encode_batch(self, texts: list[str], add_special_tokens: bool) -> Any:
        self.seen.extend(texts)
        return self.tok.encode_batch(texts, add_special_tokens=add_special_tokens)


def test_completions_and_chat_with_special_tokens_keep_the_whole_encode(model_dirs: dict[str, Path]) -> None:
    tok = load_local(model_dirs["qwen2.5-instruct"])
    keys = RequestKeys(tok, 4, 256, 4.0)
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>"
    assert keys.for_request({"prompt": prompt}, prompt, chat=False) == token_block_keys(tok.encode(prompt, True), 4)
    assert tok.chat_template is not None
    body = {"messages": CHAT, "add_special_tokens": True}
    rendered = tok.chat_template.render(body)
    assert keys.for_request(body, "", chat=True) == token_block_keys(tok.encode(rendered, True), 4)
    assert tok.chat_segments.encoded == 0 and len(tok.chat_segments.cache) == 0
    assert keys.for_request({"messages": CHAT}, "", chat=True) == token_block_keys(tok.encode(rendered, False), 4)
    assert tok.chat_segments.encoded == 1


# --- tokenizers whose segments need care, built here


def _trained(path: Path, pre: Any = None, normalizer: Any = None, specials: list[Any] | None = None) -> Path:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if pre is not None:
        tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"], show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.add_special_tokens(specials if specials is not None else SPECIALS)
    tok.save(str(path))
    return path


def _metaspace(scheme: str, split: bool = True) -> Any:
    return pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)


def _raw(content: str, **flags: bool) -> AddedToken:
    return AddedToken(content, special=flags.pop("special", True), normalized=flags.pop("normalized", False), **flags)


LSTRIP_RSTRIP = [_raw("<|end|>", rstrip=True), _raw("<|user|>", lstrip=True), _raw("<|x|>", lstrip=True, rstrip=True),
                 _raw("<s>"), _raw("</s>"), _raw("<s></s>", special=False), _raw("ab", special=False)]  # fmt: skip
NORMALIZED = [_raw("[INST]"), _raw("[/INST]"), _raw("<s>", normalized=True), _raw("xa", normalized=True),
              _raw("ab"), _raw("<|im_start|>", normalized=True, special=False)]  # fmt: skip

# (id, pre-tokenizer, normalizer, added tokens): segments exact, by the reading in token_cache's docstring
EXACT: list[tuple[str, Any, Any, list[Any] | None]] = [
    ("metaspace-first", _metaspace("first"), None, None),  # later pieces: the "never" copy
    ("metaspace-first-no-split", _metaspace("first", split=False), None, None),
    ("metaspace-first-in-sequence", pre_tokenizers.Sequence([pre_tokenizers.Digits(), _metaspace("first")]), None,
     None),
    ("metaspace-always", _metaspace("always"), None, None),
    ("metaspace-never", _metaspace("never"), None, None),
    ("llama-2-legacy", None, normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), None),
    ("lowercase-normalizer", pre_tokenizers.Whitespace(), normalizers.Lowercase(), NORMALIZED),
    ("prepend-normalizer", None, normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
     NORMALIZED),  # normalized tokens left inside their pieces: cut there, each piece would get a "▁"
    ("normalized-tokens", _metaspace("first"), None, NORMALIZED),  # no normalizer: cut at both sets
    ("empty-normalizer-sequence", _metaspace("always"), normalizers.Sequence([]), NORMALIZED),
    ("lstrip-rstrip", pre_tokenizers.ByteLevel(add_prefix_space=False), None, LSTRIP_RSTRIP),
    ("lstrip-rstrip-metaspace", _metaspace("first"), normalizers.NFKC(), LSTRIP_RSTRIP),
]  # fmt: skip
TEXTS = [
    "", "<s>", "Hello world", "Hello<s>world", "<s>Hello world", " <s> Hello [INST] world [/INST]  </s>",
    "<s>[INST] What is the capital of France?[/INST] Paris.</s>[INST] And of Italy?[/INST]",
    "xab xa ab <s></s> <s> </s><s><s> 12 345 é ÉCOLE",
    "a \t<|user|>\n b<|end|> \n\u3000\x85 c \x1c<|user|>\x1c <|end|>\x1c<|x|> <|x|><|x|>  <|end|><|user|>",
    "<|IM_START|>user <|im_start|> <S> [inst]", "   ", "<|end|>   ", "   <|user|>", "▁<s>▁Hello▁ ▁",
]  # fmt: skip


def _tokenizers(tmp_path: Path) -> list[tuple[str, HfTokenizer]]:
    return [(name, HfTokenizer(str(_trained(tmp_path / f"{name}.json", pre, norm, added)), name=name))
            for name, pre, norm, added in EXACT]  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, HfTokenizer]]:
    return _tokenizers(tmp_path_factory.mktemp("built"))


def test_built_tokenizers_segment_exactly(built: list[tuple[str, HfTokenizer]]) -> None:
    for name, tok in built:
        assert tok.chat_segments.disabled is None, name
        for text in TEXTS + [t + t for t in TEXTS]:
            got = tok.chat_segments.segmented(text)
            want = tok.encode(text, False)
            assert got is None or np.array_equal(got, want), (name, text, got, want)
            assert np.array_equal(tok.encode_chat(text), want), (name, text)
    first = dict(built)["metaspace-first"].chat_segments
    assert first._later is not first._tok  # the "never" copy
    assert dict(built)["metaspace-always"].chat_segments._later is dict(built)["metaspace-always"].chat_segments._tok


ALPHABET = ["<s>", "</s>", "<|end|>", "<|user|>", "<|x|>", "ab", "xa", "[INST]", "<|im_start|>", "<", "|", ">", "s",
            "a", "b", "x", "é", " ", "  ", "\n", "\t", "\u3000", "\x85", "\x1c", "\u200b", "▁", "1"]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=30))
def test_random_texts_segment_exactly(built: list[tuple[str, HfTokenizer]], parts: list[str]) -> None:
    text = "".join(parts)
    for name, tok in built:
        got = tok.chat_segments.segmented(text)
        assert got is None or np.array_equal(got, tok.encode(text, False)), (name, text)


def test_white_space_is_rust_regexs() -> None:
    """Rust regex's \\s is Unicode White_Space: Python's str.isspace adds U+001C-U+001F."""
    assert {c for c in map(chr, range(0x3100)) if c.isspace()} - set(WHITE_SPACE) == {"\x1c", "\x1d", "\x1e", "\x1f"}
    assert set(WHITE_SPACE) <= {c for c in map(chr, range(0x3100)) if c.isspace()}


# --- where segments are not used


def _configured(path: Path, setup: Callable[[Tokenizer], None]) -> Tokenizer:
    tok = Tokenizer.from_file(str(_trained(path, pre_tokenizers.ByteLevel(add_prefix_space=False))))
    setup(tok)
    return tok


def _all_normalized(tok: Tokenizer) -> None:
    tok.normalizer = normalizers.Lowercase()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=True) for s in SPECIALS])
    assert all(t.normalized for t in tok.get_added_tokens_decoder().values())


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (lambda t: t.add_special_tokens([AddedToken("<w>", special=True, single_word=True, normalized=False)]),
         "single_word"),
        (lambda t: setattr(t, "encode_special_tokens", True), "encode_special_tokens"),
        (lambda t: t.enable_truncation(8), "truncation"),
        (lambda t: t.enable_padding(length=512), "padding"),
        (lambda t: setattr(t.model, "dropout", 0.5), "dropout"),
        (lambda t: _all_normalized(t), "no added tokens"),  # cut where the normalizer leaves them: not here
    ],
)  # fmt: skip
def test_statically_disabled(tmp_path: Path, setup: Callable[[Tokenizer], None], reason: str) -> None:
    tok = _configured(tmp_path / "t.json", setup)
    segments = SegmentEncoder(tok, "t")
    assert segments.disabled is not None and reason in segments.disabled
    text = "<s>[INST] Hello <w> world[/INST]</s>"
    if reason != "dropout":  # random ids
        assert np.array_equal(segments.encode(text), segments.whole(text))
    assert segments.encoded == 0 and len(segments.cache) == 0


def test_an_unreadable_tokenizer_is_disabled_not_an_error() -> None:
    segments = SegmentEncoder(object(), "odd")
    assert segments.disabled is not None and "cannot read" in segments.disabled


def test_the_self_check_catches_segments_that_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A reading that misses Metaspace "first" (later pieces encoded alone get a "▁" the whole encode
    does not give them): the first checked prompt that shows it logs one warning, and from then on
    every prompt is encoded whole."""
    path = _trained(tmp_path / "first.json", _metaspace("first"))
    monkeypatch.setattr(token_cache, "_metaspace_first", lambda pre, never: False)
    tok = HfTokenizer(str(path), name="sp-first")
    segments = tok.chat_segments
    text = "<s>[INST]Hello world[/INST]Paris</s>"
    assert not np.array_equal(segments.segmented(text), tok.encode(text, False))  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="xpyd_router")
    for _ in range(3):
        assert np.array_equal(tok.encode_chat(text), tok.encode(text, False))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "sp-first" in warnings[0].getMessage()
    assert segments.disabled is not None and segments.encoded == 1 and len(segments.cache) == 0
    assert np.array_equal(tok.encode_chat(text + " more"), tok.encode(text + " more", False))


def test_checks_the_first_prompts_then_a_sample(model_dirs: dict[str, Path]) -> None:
    segments = load_local(model_dirs["qwen2.5-instruct"]).chat_segments
    for i in range(CHECK_EVERY):
        segments.encode(f"<|im_start|>user\n{i}<|im_end|>")
        assert segments.checked == min(i + 1, CHECK_FIRST) + (i + 1 == CHECK_EVERY)
    assert segments.disabled is None


# --- the cache's bound, hostile texts


def _ids(n: int) -> Any:
    return np.arange(n, dtype=np.uint32)


def test_the_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    cache = TokenCache(max_bytes=64 * 1024)
    cost = token_cache._cost("k000", _ids(100))
    for i in range(10):
        cache.put(f"k{i:03}", _ids(100))
    assert cache.bytes == 10 * cost
    assert cache.get("k000") is not None  # now the most recently used
    for i in range(10, 200):
        cache.put(f"k{i:03}", _ids(100))
        assert cache.bytes <= cache.max_bytes
    assert cache.bytes == len(cache) * cost and len(cache) == cache.max_bytes // cost
    assert cache.get("k001") is None and cache.get("k199") is not None
    cache.put("k199", _ids(200))  # replaced: counted once
    assert cache.bytes == (len(cache) - 1) * cost + token_cache._cost("k199", _ids(200))
    cache.put("huge", _ids(cache.max_entry_bytes))  # over 1/16 of the bound: not kept
    assert cache.get("huge") is None
    cache.clear()
    assert cache.bytes == 0 and len(cache) == 0


def test_a_long_conversation_stays_within_the_bound(tmp_path: Path) -> None:
    tok = load_local(model_dir(tmp_path, "llama-3.1-instruct"))
    tok.chat_segments.cache = TokenCache(max_bytes=32 * 1024)
    texts = _rendered(tok, _turns(40, lambda i: f"question {i} " * 20, lambda i: f"answer {i} " * 20), {})
    for text in texts:
        assert np.array_equal(tok.chat_segments.segmented(text), tok.encode(text, False))  # type: ignore[arg-type]
        assert tok.chat_segments.cache.bytes <= 32 * 1024
    assert len(tok.chat_segments.cache) < 4 * 40


HOSTILE_TEXTS = [
    "", "<|eot_id|>" * 10_000, "<|" * 10_000, " " * 100_000 + "<|eot_id|>", "<|eot_id|>" + "\n" * 100_000,
    "\x00<|eot_id|>\x00", "<|start_header_id|><|start_header_id|>user<|end_header_id|>", "a" * 200_000 + "<|eot_id|>",
    "".join(SPECIALS) * 50, "<|eot_id|" + ">" * 1000, "\U0010ffff<|eot_id|>\ufeff",
]  # fmt: skip


@pytest.mark.parametrize("model", MODELS)
def test_hostile_texts_never_raise_and_stay_exact(model: str, model_dirs: dict[str, Path]) -> None:
    tok = load_local(model_dirs[model])
    for text in HOSTILE_TEXTS:
        got = tok.chat_segments.segmented(text)
        assert got is None or np.array_equal(got, tok.encode(text, False))
        assert np.array_equal(tok.encode_chat(text), tok.encode(text, False))
    assert tok.chat_segments.disabled is None


def test_an_encode_that_raises_falls_back_to_the_whole_encode(model_dirs: dict[str, Path]) -> None:
    tok = load_local(model_dirs["qwen2.5-instruct"])

    class Broken:
        def encode(self, text: str, add_special_tokens: bool) -> Any:
            raise RuntimeError("no")

    tok.chat_segments._later = Broken()
    text = "<|im_start|>user\nhi<|im_end|>"
    assert np.array_equal(tok.encode_chat(text), tok.encode(text, False))
