"""The engine's tokenizer, in the router: engines report cached blocks as token ids, so the router
cuts each prompt into the same tokens to look those blocks up.

`emulator` is exact for `xpyd emulate` (4 characters a token, each id a fixed mix of its code
points: `xpyd_perf.emutokens`, the module the emulator tokenizes with; it renders chat as ChatML).
A real model's tokenizer (`tokenizers`, Rust) comes from a path (a tokenizer.json, or a directory
with it and the optional tokenizer_config.json and chat_template.jinja) or from the Hugging Face Hub
(`hf:REPO[@REVISION]`, fetched at start-up by `hub_files`). Completion prompts are tokenized as vLLM
does (special tokens added unless the request says add_special_tokens: false); chat prompts are
rendered with the model's chat template (`chat_template`) and tokenized without added special
tokens, as vLLM and SGLang do, so their blocks are the engine's. A chat request the template cannot
render, or a tokenizer without a template, is keyed by its ChatML text instead. A rendered chat
prompt is tokenized piece by piece between the tokenizer's added tokens, each piece's ids cached
(`token_cache`): a multi-turn chat resends its history, and only its new messages are tokenized again.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from xpyd_api import engines
from xpyd_perf.emutokens import Ids as Ids
from xpyd_perf.emutokens import token_ids
from xpyd_router.tokens import hub_files
from xpyd_router.tokens.cache import SegmentEncoder, encode_unlocked

if TYPE_CHECKING:
    from xpyd_router.tokens.chat_template import ChatTemplate

log = logging.getLogger("xpyd_router")
# Prompts are tokenized up to this many characters (about 128k tokens, the longest context engines
# commonly serve): a bound on what one request's tokenizing costs the event loop (~0.15 s with a BPE
# tokenizer, against ~10 s for a 32 MiB body); the last block before the cut may then miss.
MAX_KEY_CHARS = 512 * 1024
Body = Mapping[str, Any]


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> Ids: ...

    def prompt_ids(self, body: Body, text: str, chat: bool) -> Ids:
        """The token ids the engine computes for this request; `text` is the router's prompt text."""
        ...


class EmulatorTokenizer:
    """xpyd emulate's tokens: each started group of 4 code points mixed into [0, VOCAB)."""

    name = "emulator"

    def encode(self, text: str) -> Ids:
        return token_ids(text)

    def prompt_ids(self, body: Body, text: str, chat: bool) -> Ids:
        return token_ids(text[:MAX_KEY_CHARS])  # the emulator renders chat as the router's ChatML text


class HfTokenizer:
    """A Hugging Face tokenizer.json through the `tokenizers` package (Rust; encoded with the GIL
    released: token_cache.encode_unlocked), and the model's chat template when it has one."""

    def __init__(
        self,
        path: str,
        add_special_tokens: bool = True,
        chat_template: ChatTemplate | None = None,
        name: str | None = None,
    ) -> None:
        try:
            from tokenizers import Tokenizer as _Rust
        except ImportError:  # a dependency of xpyd: only a broken install lacks it
            raise ValueError("--tokenizer needs the 'tokenizers' package, an xpyd dependency: reinstall xpyd") from None
        # The router runs its own tokenizing threads: rayon's pool would only add a hand-off per prompt
        # (and a warning in every child a test process forks afterwards).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            self._tok: Any = _Rust.from_file(path)
        except Exception as exc:  # the Rust side raises plain Exception for a missing or bad file
            raise ValueError(f"--tokenizer {name or path}: cannot load {path} ({_one_line(exc)})") from None
        self.name = name or path
        self.add_special_tokens = add_special_tokens
        self.chat_template = chat_template
        self.chat_segments = SegmentEncoder(self._tok, self.name)

    def encode(self, text: str, add_special_tokens: bool | None = None) -> Ids:
        special = self.add_special_tokens if add_special_tokens is None else add_special_tokens
        return np.asarray(encode_unlocked(self._tok, text, special), dtype=np.int64)

    def prompt_ids(self, body: Body, text: str, chat: bool) -> Ids:
        if not chat:  # vLLM's completions default: add_special_tokens true
            return self.encode(text[:MAX_KEY_CHARS], body.get("add_special_tokens") is not False)
        rendered = self.chat_template.try_render(body) if self.chat_template is not None else None
        if rendered is None:
            return self.encode(text[:MAX_KEY_CHARS])
        if body.get("add_special_tokens") is True:
            return self.encode(rendered[:MAX_KEY_CHARS], True)
        # vLLM and SGLang: the template writes the special tokens, none are added
        return self.encode_chat(rendered[:MAX_KEY_CHARS])

    def encode_chat(self, rendered: str) -> Ids:
        """A rendered chat prompt's ids without added special tokens: encode(rendered, False), through
        the segment cache where that is exact."""
        return self.chat_segments.encode(rendered)


def make_tokenizer(spec: str, chat_template: str | None = None, engine: str = "vllm") -> Tokenizer | None:
    """`none` (no tokenizer: engine events cannot be matched), `emulator`, or a local tokenizer.json or
    model directory (ValueError, one line, for a bad one). `chat_template`: a --chat-template text."""
    if spec in ("", "none"):
        return None
    if spec == "emulator":
        return EmulatorTokenizer()
    if is_hub_spec(spec):
        raise ValueError(f"--tokenizer {spec}: load it with load_hub_tokenizer")
    return load_local(Path(spec), chat_template, engine, name=spec)


def load_local(path: Path, chat_template: str | None = None, engine: str = "vllm", name: str = "") -> HfTokenizer:
    """A tokenizer.json file, or a directory with tokenizer.json and the optional tokenizer_config.json
    (special tokens, chat_template) and chat_template.jinja (which wins over the config's template)."""
    label = name or str(path)
    template: ChatTemplate | None = None
    if not path.is_dir():
        if chat_template is not None:
            template = _template(chat_template, {}, engine, label)
        return HfTokenizer(str(path), chat_template=template, name=label)
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"--tokenizer {label}: no tokenizer.json in {path}")
    config: dict[str, Any] = {}
    config_file = path / "tokenizer_config.json"
    if config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--tokenizer {label}: cannot read {config_file} ({_one_line(exc)})") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"--tokenizer {label}: {config_file} is not a JSON object")
        config = loaded
    jinja_file = path / "chat_template.jinja"
    try:
        jinja = jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else None
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tokenizer {label}: cannot read {jinja_file} ({_one_line(exc)})") from None
    if chat_template is not None:  # --chat-template: a template that does not compile is a command-line error
        template = _template(chat_template, config, engine, label)
    else:
        template = _model_template(jinja if jinja is not None else _config_template(config), config, engine, label)
    return HfTokenizer(str(path / "tokenizer.json"), chat_template=template, name=label)


def _model_template(source: object, config: Mapping[str, Any], engine: str, label: str) -> ChatTemplate | None:
    """The model's own template; one that cannot be used leaves chat prompts keyed by their ChatML text."""
    if source is None:
        return None
    try:
        return _template(source, config, engine, label)
    except ValueError as exc:
        log.warning("%s; chat prompts are keyed by their ChatML text", _one_line(exc))
        return None


def _config_template(config: Mapping[str, Any]) -> object:
    """tokenizer_config.json's chat_template: a string, or a list of {name, template}."""
    value = config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named or None
    return value


def _template(source: object, config: Mapping[str, Any], engine: str, label: str) -> ChatTemplate:
    from xpyd_router.tokens.chat_template import ChatTemplate, special_token_values

    if not isinstance(source, (str, dict)):
        raise ValueError(f"--tokenizer {label}: chat_template must be a string or a list of named templates")
    try:
        return ChatTemplate(source, special_token_values(config), engines.newest(engine).chat)
    except ValueError as exc:
        raise ValueError(f"--tokenizer {label}: {exc}") from None


def is_hub_spec(spec: str) -> bool:
    return spec.startswith(hub_files.PREFIX)


def load_hub_tokenizer(
    spec: str, chat_template: str | None = None, engine: str = "vllm", options: hub_files.HubOptions | None = None
) -> HfTokenizer | None:
    """`hf:REPO[@REVISION]`: fetch and load the tokenizer, or log one warning and return None (routing
    then goes on without a tokenizer, as with --tokenizer none). Never raises for the hub's sake."""
    try:
        ref = hub_files.parse_spec(spec)
        fetched = hub_files.fetch(ref, options or hub_files.HubOptions.from_env())
        tokenizer = load_local(fetched.directory, chat_template, engine, name=spec)
    except (hub_files.HubError, ValueError) as exc:
        message = _one_line(exc).removeprefix(f"--tokenizer {spec}: ")
        log.warning(
            "--tokenizer %s: %s; routing without a tokenizer (byte-block prefix keys, engine KV events unused)",
            spec,
            message,
        )
        return None
    if fetched.note:
        log.warning("--tokenizer %s: %s", spec, _one_line(Exception(fetched.note)))
    return tokenizer


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
