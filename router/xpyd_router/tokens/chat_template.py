"""A chat request's prompt text as the engine renders it: the router's routing key only.

vLLM and SGLang turn a /v1/chat/completions request into a conversation, render it with the model's
Jinja chat template through Hugging Face transformers' `apply_chat_template`, and tokenize the text
with add_special_tokens=False. The router renders the same text so that its prefix block keys are the
engine's KV blocks. The request body sent to the engine is untouched: a request this module cannot
render (a template's raise_exception, a wrong type, a hostile shape) raises TemplateError, and the
router then keys it by its ChatML text; the engine answers the client with its own error.

Checked against the sources of:
- transformers 4.57 `utils/chat_template_utils.py` (`_compile_jinja_template`: the sandbox, its
  extensions and globals, `tojson`; `render_jinja_template`: the variables, continue_final_message)
  and `tokenization_utils_base.py` (`apply_chat_template`: special tokens first, then the caller's
  kwargs; `get_chat_template`: "tool_use" with tools, else "default"; `special_tokens_map`);
- vLLM 0.11.0 `entrypoints/chat_utils.py` (`_detect_content_format`, `_parse_chat_message_content*`:
  text parts joined with "\\n" for "string" templates, {"type": "text"} parts for "openai" ones;
  `_postprocess_messages`: tool-call arguments parsed to dicts; `resolve_chat_template_kwargs`),
  `entrypoints/openai/serving_engine.py` (`_preprocess_chat`), `serving_chat.py` (tools unless absent)
  and `protocol.py` (request defaults; tools dumped as {type, function: {name, description, parameters}});
- SGLang `srt/parser/jinja_template_utils.py` (`detect_jinja_template_content_format`;
  `process_content_for_template_format`: text parts joined with " ").

Not rendered the engine's way (keys then miss the engine's blocks, routing still works): images and
other media (the engine expands them into model-specific placeholder tokens), a template sent in the
request (vLLM refuses it unless --trust-request-chat-template), a processor's chat template
(multimodal models), --chat-template-content-format overrides, and SGLang's own tool and reasoning
fields, which vary between its releases.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from xpyd_api.engines import ChatFlavour

log = logging.getLogger("xpyd_router")
ContentFormat = Literal["string", "openai"]
Engine = ChatFlavour  # the profile's chat flavour (xpyd_api.engines.EngineProfile.chat)

MAX_MESSAGES = 1024  # longer conversations are keyed by their ChatML text: rendering 1024 takes up to ~20 ms
# transformers' named special tokens, passed to the template as variables (those that are set).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# apply_chat_template's own parameters: vLLM passes request chat_template_kwargs named like these or like
# one of the template's variables, and drops the others.
_APPLY_PARAMS = frozenset(
    {
        "add_generation_prompt", "continue_final_message", "documents", "tokenize", "padding", "truncation",
        "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    }
)  # fmt: skip
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_TEXT_PARTS = {"text": "text", "input_text": "text", "refusal": "refusal", "thinking": "thinking"}
_MEDIA_PARTS = {
    "image_url": "image", "input_image": "image", "image_embeds": "image", "image_pil": "image",
    "audio_url": "audio", "input_audio": "audio", "video_url": "video",
}  # fmt: skip


class TemplateError(Exception):
    """This request cannot be rendered as the engine would; the message says why."""


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders its body."""

    tags = {"generation"}  # noqa: RUF012  # jinja's own class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        block = jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body)
        block.set_lineno(lineno)
        return block

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: object) -> None:
    raise jinja2.exceptions.TemplateError(str(message))


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' filter: json.dumps without jinja's HTML escaping, with its options."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def environment() -> ImmutableSandboxedEnvironment:
    """The sandbox transformers compiles chat templates in."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def special_token_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """The template's special-token variables from a tokenizer_config.json: strings (AddedToken dicts
    give their "content"), plus the list additional_special_tokens; unset ones are left out."""
    out: dict[str, Any] = {}
    for name in SPECIAL_TOKENS:
        value = _token_text(config.get(name))
        if value:
            out[name] = value
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        texts = [t for t in (_token_text(v) for v in extra) if t]
        if texts:
            out["additional_special_tokens"] = texts
    return out


def _token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return None


class _Compiled:
    """One template: compiled once, its content format and variables found once."""

    def __init__(self, env: ImmutableSandboxedEnvironment, source: str, engine: Engine) -> None:
        try:
            ast = env.parse(source)
            self.template = env.from_string(source)
        except Exception as exc:  # a syntax error, an unknown tag, a template nested past the recursion limit
            raise ValueError(f"the chat template does not compile: {' '.join(str(exc).split())}") from None
        self.variables = frozenset(jinja2.meta.find_undeclared_variables(ast))
        self.content_format: ContentFormat = (
            _sglang_content_format(source, ast) if engine == "sglang" else _vllm_content_format(ast)
        )


class ChatTemplate:
    """A model's chat template (one, or named ones: "default", "tool_use"), rendered as the engine does."""

    def __init__(
        self, source: str | Mapping[str, str], special_tokens: Mapping[str, Any] | None = None, engine: Engine = "vllm"
    ) -> None:
        env = environment()
        named = {"default": source} if isinstance(source, str) else dict(source)
        if not named or not all(isinstance(t, str) for t in named.values()):
            raise ValueError("the chat template must be a string or named strings")
        self._templates = {name: _Compiled(env, text, engine) for name, text in named.items()}
        if "default" not in self._templates and "tool_use" not in self._templates and len(named) > 1:
            raise ValueError(f"the chat templates {sorted(named)} name no 'default'")
        self.special_tokens = dict(special_tokens or {})
        self.engine: Engine = engine
        self._join = " " if engine == "sglang" else "\n"

    def _pick(self, tools: object) -> _Compiled:
        """transformers' get_chat_template: the "tool_use" template when tools are given, else "default"."""
        templates = self._templates
        if tools is not None and "tool_use" in templates:
            return templates["tool_use"]
        if "default" in templates:
            return templates["default"]
        if len(templates) == 1:
            return next(iter(templates.values()))
        raise TemplateError("no 'default' chat template for a request without tools")

    def content_format(self, tools: object = None) -> ContentFormat:
        return self._pick(tools).content_format

    def render(self, body: Mapping[str, Any]) -> str:
        """The prompt text the engine renders for this chat request; TemplateError when it cannot be had."""
        try:
            return self._render(body)
        except TemplateError:
            raise
        except Exception as exc:  # the template is code: whatever it raises, this request is keyed another way
            raise TemplateError(f"{type(exc).__name__}: {exc}") from None

    def try_render(self, body: Mapping[str, Any]) -> str | None:
        """render(), or None when the request cannot be rendered (the router then keys it by its ChatML text)."""
        try:
            return self.render(body)
        except TemplateError as exc:
            log.debug("chat template: keying a request by its ChatML text: %s", exc)
            return None

    def _render(self, body: Mapping[str, Any]) -> str:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
            raise TemplateError(f"'messages' must be a list of 1-{MAX_MESSAGES} messages")
        kwargs: dict[str, Any] = {
            "add_generation_prompt": body.get("add_generation_prompt", True),
            "continue_final_message": body.get("continue_final_message", False),
            "tools": _tools(body.get("tools")),
            "documents": body.get("documents"),
        }
        extra = body.get("chat_template_kwargs")
        if extra is not None:
            if not isinstance(extra, dict):
                raise TemplateError("'chat_template_kwargs' must be an object")
            kwargs.update(extra)
        tools = kwargs.pop("tools")
        compiled = self._pick(tools)
        accepted = (compiled.variables | _APPLY_PARAMS) - {"chat_template"}
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        add_generation_prompt = kwargs.pop("add_generation_prompt", False)
        continue_final = kwargs.pop("continue_final_message", False)
        documents = kwargs.pop("documents", None)
        if kwargs.pop("tokenize", False) or kwargs.pop("return_dict", False):
            raise TemplateError("chat_template_kwargs asks for token ids, not text")
        for name in _APPLY_PARAMS:
            kwargs.pop(name, None)
        if not isinstance(add_generation_prompt, bool) or not isinstance(continue_final, bool):
            raise TemplateError("'add_generation_prompt' and 'continue_final_message' must be booleans")
        if add_generation_prompt and continue_final:
            raise TemplateError("'add_generation_prompt' and 'continue_final_message' cannot both be true")
        if documents is not None and not (isinstance(documents, list) and all(isinstance(d, dict) for d in documents)):
            raise TemplateError("'documents' must be a list of objects")
        chat = [self._message(m, compiled.content_format) for m in messages]
        _parse_tool_arguments(chat)
        final = _tag_final_message(chat) if continue_final else None
        rendered: str = compiled.template.render(
            messages=chat,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens, **kwargs},
        )
        return rendered if final is None else _cut_at_tag(rendered, final)

    def _message(self, message: object, content_format: ContentFormat) -> dict[str, Any]:
        """vLLM's conversation message: role, content as the template takes it, tool calls, tool call id, name."""
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise TemplateError("each message must be an object with a string 'role'")
        role: str = message["role"]
        out: dict[str, Any] = {"role": role, "content": self._content(message.get("content"), content_format)}
        if role == "assistant" and message.get("tool_calls") is not None:
            calls = message["tool_calls"]
            if not isinstance(calls, list):
                raise TemplateError("'tool_calls' must be a list")
            out["tool_calls"] = [_tool_call(c) for c in calls]
        elif role == "tool" and "tool_call_id" in message:
            call_id = message["tool_call_id"]
            if call_id is not None or self.engine == "vllm":  # SGLang drops keys set to null
                out["tool_call_id"] = call_id
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
        return out

    def _content(self, content: object, content_format: ContentFormat) -> str | list[str | dict[str, str]]:
        if content is None:
            parts: list[object] = []
        elif isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            parts = content
        else:
            raise TemplateError("message 'content' must be a string, a list of parts or null")
        texts: list[str] = []
        wrapped: list[str | dict[str, str]] = []
        for part in parts:
            if isinstance(part, str):  # vLLM keeps a bare string part as it is, in both formats
                texts.append(part)
                wrapped.append(part)
                continue
            if not isinstance(part, dict):
                raise TemplateError("each content part must be an object or a string")
            kind = part.get("type")
            if kind is None:  # vLLM takes a part without a type by its media field
                kind = next((k for k in _MEDIA_PARTS if k in part), None)
            if not isinstance(kind, str):
                raise TemplateError("each content part needs a string 'type'")
            if kind in _TEXT_PARTS:
                text = part.get(_TEXT_PARTS[kind])
                if text is None:  # vLLM skips a part without its text
                    continue
                if not isinstance(text, str):
                    raise TemplateError(f"a '{kind}' part must carry a string")
                texts.append(text)
                wrapped.append({"type": "text", "text": text})
            elif kind in _MEDIA_PARTS:  # "string" templates get the engine's own placeholders: not modelled
                wrapped.append({"type": _MEDIA_PARTS[kind]})
            else:
                raise TemplateError(f"unknown content part type {kind!r}")
        return wrapped if content_format == "openai" else self._join.join(texts)


def _tools(tools: object) -> list[dict[str, Any]] | None:
    """The request's tools as vLLM dumps its ChatCompletionToolsParam: type, then function's name,
    description and parameters (None when absent), then any other fields in the client's order."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise TemplateError("'tools' must be a list")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise TemplateError("each tool must be an object with a 'function' object")
        fn = tool["function"]
        if not isinstance(fn.get("name"), str) or tool.get("type", "function") != "function":
            raise TemplateError("each tool must be a function with a string 'name'")
        function = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
        function.update((k, v) for k, v in fn.items() if k not in function)
        dumped: dict[str, Any] = {"type": "function", "function": function}
        dumped.update((k, v) for k, v in tool.items() if k not in dumped)
        out.append(dumped)
    return out


def _tool_call(call: object) -> dict[str, Any]:
    """A tool call as vLLM's request validation leaves it: id, function {arguments, name}, type."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise TemplateError("each tool call must be an object with a 'function' object")
    fn = call["function"]
    function = {k: fn[k] for k in ("arguments", "name") if k in fn}
    out: dict[str, Any] = {k: call[k] for k in ("id",) if k in call}
    out["function"] = function
    if "type" in call:
        out["type"] = call["type"]
    return out


def _parse_tool_arguments(chat: list[dict[str, Any]]) -> None:
    """vLLM's _postprocess_messages: an assistant's tool-call arguments become dicts ({} when empty)."""
    for message in chat:
        if message["role"] == "assistant" and isinstance(message.get("tool_calls"), list):
            for call in message["tool_calls"]:
                arguments = call["function"].get("arguments")
                call["function"]["arguments"] = json.loads(arguments) if arguments else {}


def _tag_final_message(chat: list[dict[str, Any]]) -> str:
    """transformers' continue_final_message: mark where the last message's text ends."""
    last = chat[-1]
    content = last.get("content")
    if isinstance(content, list):
        for block in reversed(content):
            if "text" in block:
                final: str = block["text"]
                block["text"] = final + _CONTINUE_TAG
                return final
        raise TemplateError("continue_final_message: the final message has no text")
    if not isinstance(content, str):
        raise TemplateError("continue_final_message: the final message has no text")
    last["content"] = content + _CONTINUE_TAG
    return content


def _cut_at_tag(rendered: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise TemplateError("continue_final_message: the template drops the final message")
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()


# --- content format: does the template loop over a message's content parts ("openai") or print it ("string")?


def _is_var(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _is_var_or_elems(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    """`name` (or `name[key]`), possibly filtered, tested or sliced."""
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


def _target_name(node: jinja2.nodes.Node) -> str:
    if not isinstance(node, jinja2.nodes.Name):  # vLLM asserts this, and so falls back to "string"
        raise TypeError("not a plain name")
    return node.name


def _names_assigned_from(root: jinja2.nodes.Template, name: str) -> Iterator[str]:
    """`name` and every variable set from it (breadth first), as vLLM follows `{% set msgs = messages %}`."""
    yield name
    pending = [name]
    while pending:
        related = pending.pop(0)
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems(assign.node, related):
                target = _target_name(assign.target)
                yield target
                if target != related:
                    pending.append(target)


def _loop_targets(root: jinja2.nodes.Template, names: list[str], key: str | None) -> Iterator[str]:
    for loop in root.find_all(jinja2.nodes.For):
        if any(_is_var_or_elems(loop.iter, name, key) for name in names):
            yield _target_name(loop.target)


def _vllm_content_format(ast: jinja2.nodes.Template) -> ContentFormat:
    """vLLM's _detect_content_format: "openai" when some loop iterates a message's content."""
    try:
        messages = list(_names_assigned_from(ast, "messages"))
        message_names = list(_loop_targets(ast, messages, None))
        return "openai" if next(_loop_targets(ast, message_names, "content"), None) is not None else "string"
    except Exception:
        return "string"


def _sglang_content_format(source: str, ast: jinja2.nodes.Template) -> ContentFormat:
    """SGLang's detect_jinja_template_content_format: media words, or a loop over message/msg/m content."""
    if any(word in source for word in ("image", "audio", "video", "vision")):
        return "openai"
    try:
        for loop in ast.find_all(jinja2.nodes.For):
            if any(_is_var_or_elems(loop.iter, name, "content") for name in ("message", "msg", "m")):
                return "openai"
    except Exception:
        return "string"
    return "string"
