"""Chat prompts rendered as vLLM renders them, so the router's block keys are the engine's KV blocks.

Real models' templates (chat_models.py) against transformers' apply_chat_template, fed the conversation
vLLM 0.11 builds from each request (written out by hand below: text parts joined with "\\n", tool-call
arguments parsed, tools dumped in vLLM's field order); the router's keys against the ids the engine
computes and the keys its KV events produce; hostile requests never raising out of the key path.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from chat_models import CONFIGS, MODELS, model_dir  # type: ignore[import-not-found]  # tests/router is on sys.path
from stub_workers import call  # type: ignore[import-not-found]

from xpyd_router.http.protocol import parse_body
from xpyd_router.kv.block_keys import RequestKeys, token_block_keys
from xpyd_router.kv.engine_view import EngineView
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.kv.wire import Stored
from xpyd_router.tokens.chat_template import MAX_MESSAGES, ChatTemplate, TemplateError, special_token_values
from xpyd_router.tokens.engine import HfTokenizer, load_local, make_tokenizer

Json = dict[str, Any]
WEATHER = {
    "type": "function",
    "function": {  # the client's field order; vLLM dumps name, description, parameters
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
        "description": "Current weather in a city",
    },
}
WEATHER_DUMPED = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER["function"]["parameters"],  # type: ignore[index]
    },
}


def _call(call_id: str, args: str) -> Json:
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}


def _call_parsed(call_id: str, args: Json) -> Json:  # vLLM: validated (id, function{arguments, name}, type), parsed
    return {"id": call_id, "function": {"arguments": args, "name": "get_weather"}, "type": "function"}


CHAT: list[Json] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]
PARTS: list[Json] = [
    {"role": "user", "content": [{"type": "text", "text": "Describe"}, "this", {"type": "text", "text": "please"}]}
]
TOOL_TURNS: list[Json] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [_call("abcdefghi", '{"location": "Paris"}')]},
    {"role": "tool", "tool_call_id": "abcdefghi", "content": "22 C"},
]
TOOL_CONVERSATION: list[Json] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [_call_parsed("abcdefghi", {"location": "Paris"})]},
    {"role": "tool", "content": "22 C", "tool_call_id": "abcdefghi"},
]

# (id, models, request body, the conversation vLLM renders, tools it passes, other apply_chat_template kwargs)
CASES: list[tuple[str, tuple[str, ...], Json, list[Json], list[Json] | None, Json]] = [
    ("turns", tuple(MODELS), {"messages": CHAT}, CHAT, None, {}),
    ("parts", tuple(MODELS), {"messages": PARTS}, [{"role": "user", "content": "Describe\nthis\nplease"}], None, {}),
    ("no-generation-prompt", tuple(MODELS), {"messages": CHAT, "add_generation_prompt": False}, CHAT, None,
     {"add_generation_prompt": False}),
    ("named", ("qwen2.5-instruct", "llama-3.1-instruct"),
     {"messages": [{"role": "user", "content": "hi", "name": "ann"},
                   {"role": "assistant", "content": "yo", "name": 5}]},
     [{"role": "user", "content": "hi", "name": "ann"}, {"role": "assistant", "content": "yo"}], None, {}),
    ("tools", ("qwen2.5-instruct", "llama-3.1-instruct", "mistral-7b-instruct-v0.3"),
     {"messages": CHAT[1:2], "tools": [WEATHER]}, CHAT[1:2], [WEATHER_DUMPED], {}),
    ("tools-none-choice", ("qwen2.5-instruct",),  # vLLM still passes them (exclude_tools_when_tool_choice_none off)
     {"messages": CHAT[1:2], "tools": [WEATHER], "tool_choice": "none"}, CHAT[1:2], [WEATHER_DUMPED], {}),
    ("tool-round-trip", ("qwen2.5-instruct", "llama-3.1-instruct", "mistral-7b-instruct-v0.3"),
     {"messages": TOOL_TURNS, "tools": [WEATHER]}, TOOL_CONVERSATION, [WEATHER_DUMPED], {}),
    ("continue-final", ("qwen2.5-instruct", "llama-3.1-instruct", "deepseek-r1"),
     {"messages": [*CHAT[1:2], {"role": "assistant", "content": "The capital is"}],
      "add_generation_prompt": False, "continue_final_message": True},
     [*CHAT[1:2], {"role": "assistant", "content": "The capital is"}], None,
     {"add_generation_prompt": False, "continue_final_message": True}),
    ("template-kwargs", ("llama-3.1-instruct",),
     {"messages": CHAT, "chat_template_kwargs": {"date_string": "01 Jan 2025", "not_in_template": 1}}, CHAT, None,
     {"date_string": "01 Jan 2025"}),
    ("think-stripped", ("deepseek-r1",),
     {"messages": [*CHAT[1:2], {"role": "assistant", "content": "<think>hmm</think>Paris."}, CHAT[3]]},
     [*CHAT[1:2], {"role": "assistant", "content": "<think>hmm</think>Paris."}, CHAT[3]], None, {}),
]  # fmt: skip
PARAMS = [
    pytest.param(model, body, conv, tools, kwargs, id=f"{model}-{name}")
    for name, models, body, conv, tools, kwargs in CASES
    for model in models
]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {m: model_dir(root / m, m) for m in MODELS}


@pytest.fixture(scope="module")
def engine_tokenizers(model_dirs: dict[str, Path]) -> Callable[[str], Any]:
    """transformers' PreTrainedTokenizerFast of each model directory: what vLLM and SGLang load."""
    transformers = pytest.importorskip("transformers")
    loaded: dict[str, Any] = {}

    def get(model: str) -> Any:
        if model not in loaded:
            loaded[model] = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dirs[model]))
        return loaded[model]

    return get


def _router_tokenizer(model_dirs: dict[str, Path], model: str) -> HfTokenizer:
    tok = make_tokenizer(str(model_dirs[model]))
    assert isinstance(tok, HfTokenizer) and tok.chat_template is not None
    return tok


def _engine_renders(engine: Any, conversation: list[Json], tools: list[Json] | None, kwargs: Json) -> str:
    """What the engine renders: transformers' apply_chat_template, as vLLM calls it."""
    kwargs = {"add_generation_prompt": True, **kwargs}
    rendered: str = engine.apply_chat_template(copy.deepcopy(conversation), tools=tools, tokenize=False, **kwargs)
    return rendered


@pytest.mark.parametrize(("model", "body", "conversation", "tools", "kwargs"), PARAMS)
def test_rendering_equals_apply_chat_template(
    model: str,
    body: Json,
    conversation: list[Json],
    tools: list[Json] | None,
    kwargs: Json,
    model_dirs: dict[str, Path],
    engine_tokenizers: Callable[[str], Any],
) -> None:
    want = _engine_renders(engine_tokenizers(model), conversation, tools, kwargs)
    router = _router_tokenizer(model_dirs, model)
    assert router.chat_template is not None
    sent = copy.deepcopy(body)
    assert router.chat_template.render(sent) == want
    assert sent == body  # the client's body is the engine's: rendering never edits it


@pytest.mark.parametrize(("model", "body", "conversation", "tools", "kwargs"), PARAMS)
def test_chat_keys_are_the_engines_blocks(
    model: str,
    body: Json,
    conversation: list[Json],
    tools: list[Json] | None,
    kwargs: Json,
    model_dirs: dict[str, Path],
    engine_tokenizers: Callable[[str], Any],
) -> None:
    """The router's keys equal token_block_keys of the engine's ids, and so the keys its KV events give."""
    engine = engine_tokenizers(model)
    rendered = _engine_renders(engine, conversation, tools, kwargs)
    ids = engine(rendered, add_special_tokens=False)["input_ids"]  # what apply_chat_template(tokenize=True) does
    keys = RequestKeys(_router_tokenizer(model_dirs, model), 4, 256, 4.0)
    _, text = parse_body(orjson.dumps(body), chat=True)
    got = keys.for_request(body, text, chat=True)
    assert got == token_block_keys(np.asarray(ids), 4) and len(got) == len(ids) // 4 > 0
    assert keys.tokenizer is not None
    with_bos = engine(rendered, add_special_tokens=True)["input_ids"]
    assert with_bos != ids  # the test tokenizer adds <s>: chat keys are cut without it, as the engine does
    # The engine's KV events name the same blocks: stored block by block, chained on their parents.
    index = PrefixIndex()
    view = EngineView("w", index, 4)
    blocks = len(ids) // 4
    view.apply([Stored(list(range(1, blocks + 1)), None, ids[: blocks * 4], 4)])
    assert index.match(got) == {"w": blocks}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("body", "special"),
    [({"prompt": "What is the capital of France?"}, True),
     ({"prompt": "What is the capital of France?", "add_special_tokens": False}, False)],
)  # fmt: skip
def test_completion_keys_add_special_tokens_as_vllm(
    model: str, body: Json, special: bool, model_dirs: dict[str, Path], engine_tokenizers: Callable[[str], Any]
) -> None:
    ids = engine_tokenizers(model)(body["prompt"], add_special_tokens=special)["input_ids"]
    keys = RequestKeys(_router_tokenizer(model_dirs, model), 4, 256, 4.0)
    assert keys.for_request(body, body["prompt"], chat=False) == token_block_keys(np.asarray(ids), 4)
    assert keys.for_request({"prompt": ids}, "ignored", chat=False) == token_block_keys(np.asarray(ids), 4)


@pytest.mark.parametrize(
    ("model", "want"),
    [
        ("llama-3.1-instruct", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
         "December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
         "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("qwen2.5-instruct", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
         "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
        ("deepseek-r1", "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>\n"),
        ("mistral-7b-instruct-v0.3", "<s>[INST] Hi[/INST]"),
    ],
)  # fmt: skip
def test_golden_prompts(model: str, want: str) -> None:
    """The templates' well-known outputs, without transformers: the templates here are the real ones."""
    config = CONFIGS[model]
    template = ChatTemplate(config["chat_template"], special_token_values(config))
    assert template.render({"messages": [{"role": "user", "content": "Hi"}]}) == want


# --- templates, named templates and where they come from


OPENAI_STYLE = (
    "{% for m in messages %}{% for c in m['content'] %}[{{ c['text'] or c['type'] }}]{% endfor %}{% endfor %}"
)
VIA_VARIABLES = (
    "{% set msgs = messages %}{% for x in msgs[1:] %}{% for part in x.content | list %}{{ part }}{% endfor %}"
)
VIA_VARIABLES += "{% endfor %}"


@pytest.mark.parametrize(
    ("source", "engine", "fmt"),
    [
        (CONFIGS["qwen2.5-instruct"]["chat_template"], "vllm", "string"),
        (OPENAI_STYLE, "vllm", "openai"),
        (VIA_VARIABLES, "vllm", "openai"),  # vLLM follows {% set %} and slices to the loop over content
        (VIA_VARIABLES, "sglang", "string"),  # SGLang looks for message/msg/m only
        ("{{ 'an image placeholder' }}{% for m in messages %}{{ m.content }}{% endfor %}", "sglang", "openai"),
        ("{% for a, b in messages %}{% endfor %}", "vllm", "string"),  # vLLM gives up on a tuple target
    ],
)
def test_content_format_is_detected_as_the_engine_does(source: str, engine: str, fmt: str) -> None:
    assert ChatTemplate(source, engine=engine).content_format() == fmt  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("engine", "want"),
    [("vllm", "[a][image][b]"), ("sglang", "[a][image][b]")],
)
def test_openai_templates_get_parts(engine: str, want: str) -> None:
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "b"},
    ]
    template = ChatTemplate(OPENAI_STYLE, engine=engine)  # type: ignore[arg-type]
    assert template.render({"messages": [{"role": "user", "content": parts}]}) == want


@pytest.mark.parametrize(("engine", "want"), [("vllm", "a\nb"), ("sglang", "a b")])
def test_string_templates_join_text_parts_as_the_engine(engine: str, want: str) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    template = ChatTemplate("{{ messages[0].content }}", engine=engine)  # type: ignore[arg-type]
    assert template.render(body) == want


def test_transformers_globals_and_filters() -> None:
    source = (
        "{{ messages[0].content | tojson }}|{{ {'b': [1, 2]} | tojson(indent=2) }}|{{ strftime_now('%Y') | length }}"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}!{% endfor %}"
        "{% generation %}G{% endgeneration %}|{{ bos_token }}|{{ additional_special_tokens | length }}"
    )
    tokens = special_token_values(
        {"bos_token": {"content": "<B>"}, "additional_special_tokens": ["<x>", {"content": "<y>"}]}
    )
    template = ChatTemplate(source, tokens)
    body = {"messages": [{"role": "user", "content": "<é> & 'q'"}, {"role": "user", "content": "2"}]}
    assert template.render(body) == '"<é> & \'q\'"|{\n  "b": [\n    1,\n    2\n  ]\n}|4!G|<B>|2'


def test_named_templates_pick_tool_use_with_tools() -> None:
    template = ChatTemplate({"default": "plain", "tool_use": "tools:{{ tools | length }}"})
    assert template.render({"messages": CHAT}) == "plain"
    assert template.render({"messages": CHAT, "tools": [WEATHER]}) == "tools:1"


@pytest.mark.parametrize(
    ("files", "flag", "want"),
    [
        ({}, None, "config"),
        ({"chat_template.jinja": "jinja"}, None, "jinja"),  # newer repositories: the file wins
        ({"chat_template.jinja": "jinja"}, "flag", "flag"),  # --chat-template wins over both
        ({"list": True}, None, "default-of-list"),
    ],
)
def test_where_the_template_comes_from(tmp_path: Path, files: dict[str, Any], flag: str | None, want: str) -> None:
    model_dir(tmp_path, "qwen2.5-instruct")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = "config"
    if files.pop("list", False):
        config["chat_template"] = [
            {"name": "tool_use", "template": "t"},
            {"name": "default", "template": "default-of-list"},
        ]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    tok = load_local(tmp_path, flag)
    assert tok.chat_template is not None and tok.chat_template.render({"messages": CHAT}) == want


def test_a_tokenizer_json_alone_keys_chat_by_chatml(tmp_path: Path) -> None:
    model_dir(tmp_path, "qwen2.5-instruct")
    tok = load_local(tmp_path / "tokenizer.json")
    assert tok.chat_template is None
    _, text = parse_body(orjson.dumps({"messages": CHAT}), chat=True)
    assert np.array_equal(tok.prompt_ids({"messages": CHAT}, text, True), tok.encode(text))


def test_a_models_broken_template_leaves_chat_keyed_by_chatml(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model_dir(tmp_path, "qwen2.5-instruct", jinja_file="{% for %}")
    tok = load_local(tmp_path, name="m")
    assert tok.chat_template is None
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "does not compile" in caplog.records[0].message


def test_a_broken_chat_template_flag_is_an_error(tmp_path: Path) -> None:
    model_dir(tmp_path, "qwen2.5-instruct")
    with pytest.raises(ValueError, match="does not compile"):
        load_local(tmp_path, "{% if %}")


# --- hostile requests: never an exception out of the key path


def _deep(n: int) -> Any:
    node: Any = "x"
    for _ in range(n):
        node = {"a": node}
    return node


HOSTILE: list[tuple[str, Json]] = [
    ("role-not-string", {"messages": [{"role": 5, "content": "x"}]}),
    ("message-not-object", {"messages": ["hello"]}),
    ("messages-not-list", {"messages": {"role": "user"}}),
    ("no-messages", {"messages": []}),
    ("too-many-messages", {"messages": [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)}),
    ("content-object", {"messages": [{"role": "user", "content": {"text": "x"}}]}),
    ("content-number", {"messages": [{"role": "user", "content": 7}]}),
    ("parts-numbers", {"messages": [{"role": "user", "content": [1, 2]}]}),
    ("part-type-number", {"messages": [{"role": "user", "content": [{"type": 5}]}]}),
    ("part-unknown", {"messages": [{"role": "user", "content": [{"type": "bogus", "text": "x"}]}]}),
    ("part-text-number", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    ("tool-calls-object", {"messages": [{"role": "assistant", "content": "", "tool_calls": {"a": 1}}]}),
    ("tool-call-string", {"messages": [{"role": "assistant", "content": "", "tool_calls": ["x"]}]}),
    ("tool-arguments-not-json", {"messages": [{"role": "assistant", "tool_calls": [_call("abcdefghi", "{nope")]}]}),
    ("tool-arguments-deep", {"messages": [{"role": "assistant", "tool_calls": [_call("abcdefghi", "[" * 100_000)]}]}),
    ("tools-deep", {"messages": CHAT, "tools": [{"function": {"name": "f", "parameters": _deep(5000)}}]}),
    ("tools-not-list", {"messages": CHAT, "tools": "all"}),
    ("tool-name-number", {"messages": CHAT, "tools": [{"type": "function", "function": {"name": 5}}]}),
    ("tool-not-function", {"messages": CHAT, "tools": [{"type": "code", "function": {"name": "f"}}]}),
    ("deep-content", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "x": _deep(5000)}]}]}),
    ("generation-prompt-string", {"messages": CHAT, "add_generation_prompt": "yes"}),
    ("both-prompts", {"messages": CHAT, "add_generation_prompt": True, "continue_final_message": True}),
    ("continue-after-an-image", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}],
                                "add_generation_prompt": False, "continue_final_message": True}),
    ("kwargs-not-object", {"messages": CHAT, "chat_template_kwargs": ["x"]}),
    ("kwargs-messages", {"messages": CHAT, "chat_template_kwargs": {"messages": []}}),
    ("kwargs-tokenize", {"messages": CHAT, "chat_template_kwargs": {"tokenize": True}}),
    ("documents-string", {"messages": CHAT, "documents": "doc"}),
    ("roles-not-alternating", {"messages": [CHAT[1], CHAT[1]]}),  # Mistral's raise_exception
    ("two-tool-calls", {"messages": [CHAT[1], {"role": "assistant", "tool_calls": [_call("abcdefghi", "{}")] * 2}]}),
    ("tool-call-id-short", {"messages": [CHAT[1], {"role": "assistant", "tool_calls": [_call("x", "{}")]}]}),
    ("unknown-role", {"messages": [{"role": "wizard", "content": "x"}]}),
    ("content-null", {"messages": [{"role": "user", "content": None}]}),
]  # fmt: skip


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("body", [b for _, b in HOSTILE], ids=[n for n, _ in HOSTILE])
def test_hostile_requests_never_raise_out_of_the_key_path(model: str, body: Json, model_dirs: dict[str, Path]) -> None:
    tok = _router_tokenizer(model_dirs, model)
    assert tok.chat_template is not None
    keys = RequestKeys(tok, 4, 256, 4.0)
    text = "the request's ChatML text"
    got = keys.for_request(body, text, chat=True)
    try:
        rendered = tok.chat_template.render(body)
    except TemplateError:  # ours, whatever the template or the input raised
        assert got == token_block_keys(tok.encode(text), 4)  # keyed by the ChatML text instead
    else:
        assert got == token_block_keys(tok.encode(rendered, False), 4)


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(10**9) %}x{% endfor %}",  # the sandbox caps range()
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # and refuses dunder attributes
        "{{ messages.append(1) }}",  # and any change to its inputs
        "{{ raise_exception('no thanks') }}",
        "{{ undefined_variable.attribute }}",
        "{{ messages[0]['content'] + 1 }}",
    ],
)
def test_template_failures_are_template_errors(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source).render({"messages": CHAT})


def test_request_text_is_data_not_template_code() -> None:
    template = ChatTemplate(CONFIGS["qwen2.5-instruct"]["chat_template"])
    body = {"messages": [{"role": "user", "content": "{{ 7*7 }}{% raise %}"}]}
    assert "{{ 7*7 }}{% raise %}" in template.render(body)


async def test_a_request_the_template_refuses_is_still_proxied_untouched(
    router: Callable[..., Any], stubs: Callable[..., Any], model_dirs: dict[str, Path]
) -> None:
    stub = await stubs()
    r = await router([stub])
    r.pool.keys = RequestKeys(_router_tokenizer(model_dirs, "mistral-7b-instruct-v0.3"), 16, 256, 4.0)
    for body in ({"model": "m", "messages": [CHAT[1], CHAT[1]]}, {"model": "m", "messages": CHAT}):
        status, _ = await call(r.url, body, path="/v1/chat/completions")
        assert status == 200
        assert stub.bodies[-1] == body  # the engine gets the client's request, the key is only the router's


@pytest.mark.parametrize("chat", [False, True])
def test_only_the_first_max_key_chars_are_tokenized(model_dirs: dict[str, Path], chat: bool) -> None:
    from xpyd_router.tokens.engine import MAX_KEY_CHARS

    tok = _router_tokenizer(model_dirs, "qwen2.5-instruct")
    huge = "lorem ipsum dolor " * (2 * MAX_KEY_CHARS // 18)  # twice the bound: a hostile 1 MiB prompt
    body: Json = {"messages": [{"role": "user", "content": huge}]} if chat else {"prompt": huge}
    text = parse_body(orjson.dumps(body), chat)[1]
    ids = tok.prompt_ids(body, text, chat)
    rendered = tok.chat_template.try_render(body) if chat and tok.chat_template is not None else None
    whole = tok.encode(rendered if rendered is not None else text, not chat)
    assert 0 < len(ids) < len(whole) * 0.6  # about half: the rest is never tokenized
    assert list(ids[:-8]) == list(whole[: len(ids) - 8])  # the same tokens up to the cut
