"""Finds the engine command inside a container's command line, evaluating the shell words a pod's sh would.

A multi-node replica's pods run `/bin/sh -c 'exec vllm serve ... --data-parallel-start-rank
$(( ${LWS_WORKER_INDEX:-0} * 8 ))'` (the start rank is arithmetic on LeaderWorkerSet's env).
Kubernetes leaves that to the container's shell, so when the emulator stands in for the engine it
evaluates what sh would: `$NAME`, `${NAME}`, `${NAME:-default}` and integer `$(( ... ))`
(+ - * / % and parentheses), outside single quotes; anything fancier is refused with one line.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from collections.abc import Mapping

from xpyd_emulator.errors import CommandLineError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_ARITH_MAX = 200  # characters in one $(( )): the operator renders a product of two words


def _arith(expr: str) -> int:
    """An integer $(( )) expression as sh evaluates it (division truncates toward zero)."""
    try:
        tree = ast.parse(expr.strip() or "0", mode="eval").body
    except SyntaxError:
        raise CommandLineError(f"cannot evaluate $(({expr})) in the sh -c command line") from None

    def ev(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div | ast.Mod):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
                return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
            if b == 0:
                raise CommandLineError(f"division by zero in $(({expr})) in the sh -c command line")
            quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
            return quotient if isinstance(node.op, ast.Div) else a - b * quotient
        raise CommandLineError(f"cannot evaluate $(({expr})) in the sh -c command line (integers and + - * / % only)")

    return ev(tree)


def expand(text: str, env: Mapping[str, str]) -> str:
    """`text` with the parameter and arithmetic expansions sh would make (none inside single quotes)."""
    out: list[str] = []
    i, quote = 0, ""
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "'" and i + 1 < len(text):
            out.append(text[i : i + 2])
            i += 2
            continue
        if ch in "'\"" and quote in ("", ch):
            quote = "" if quote else ch
        if ch != "$" or quote == "'":
            out.append(ch)
            i += 1
            continue
        rest = text[i + 1 :]
        if rest.startswith("(("):
            end = rest.find("))")
            if end < 0 or end > _ARITH_MAX:
                raise CommandLineError("unterminated or too long $(( in the sh -c command line")
            out.append(str(_arith(expand(rest[2:end], env))))
            i += end + 3
        elif (braced := _BRACED.match(rest)) is not None:
            name, default = braced.group(1), braced.group(2)
            value = env.get(name, "")
            out.append(value if value or default is None else expand(default, env))
            i += braced.end() + 1
        elif rest.startswith(("(", "{")):
            raise CommandLineError(f"unsupported shell expansion ${rest[:20]} in the sh -c command line")
        elif (named := _NAME.match(rest)) is not None:
            out.append(env.get(named.group(0), ""))
            i += named.end() + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def split_shell(tokens: list[str], env: Mapping[str, str]) -> list[str]:
    """Unwrap `sh -c "..."` (expanding it), `exec` and `env A=B` prefixes so the engine command comes first."""
    while tokens:
        head = os.path.basename(tokens[0])
        if head in {"sh", "bash", "dash"} and "-c" in tokens:
            script = tokens[tokens.index("-c") + 1] if tokens.index("-c") + 1 < len(tokens) else ""
            try:
                tokens = shlex.split(expand(script, env))
            except ValueError as exc:
                raise CommandLineError(f"cannot read the sh -c command line ({exc})") from None
        elif head in {"exec", "env"} or ("=" in tokens[0] and not tokens[0].startswith("-")):
            tokens = tokens[1:]
        else:
            break
    return tokens


def engine_args(tokens: list[str]) -> tuple[str, str | None, list[str]]:
    """(engine, positional model or None, flags) for the recognised command line forms."""
    if not tokens:
        raise CommandLineError("missing the vLLM command line after `--` (e.g. `vllm serve MODEL --port 8000`)")
    head = os.path.basename(tokens[0])
    if tokens[0].startswith("-"):  # only args: the image's entrypoint is vLLM's api_server
        return "vllm", None, tokens
    if head == "vllm":
        if len(tokens) < 2 or tokens[1] != "serve":
            raise CommandLineError(f"expected `vllm serve MODEL ...`, got {shlex.join(tokens[:3])!r}")
        rest = tokens[2:]
        if rest and not rest[0].startswith("-"):
            return "vllm", rest[0], rest[1:]
        return "vllm", None, rest
    if head.startswith("python") and len(tokens) >= 3 and tokens[1] == "-m":
        module = tokens[2]
        if module.startswith("vllm.entrypoints"):
            return "vllm", None, tokens[3:]
        if module.startswith("sglang.launch_server"):
            return "sglang", None, tokens[3:]
        raise CommandLineError(f"python module {module!r} is neither vLLM's api_server nor sglang.launch_server")
    raise CommandLineError(
        f"not a vLLM or SGLang command line: {shlex.join(tokens[:4])!r}; expected "
        "`vllm serve MODEL ...`, `python3 -m vllm.entrypoints.openai.api_server --model M ...` "
        "or `python3 -m sglang.launch_server ...`"
    )
