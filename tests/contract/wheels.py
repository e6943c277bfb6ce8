"""The engines' released wheels as the test oracle: what each vLLM/SGLang release accepts, reads and exports.

A release's wheel is downloaded once (`pip download --no-deps`, never installed) into
`$XPYD_CACHE/wheels` (default ~/.cache/xpyd) and its Python sources are read with zipfile + ast:
nothing of the engine is imported, except `load_module`, which executes one self-contained file
(vLLM's kv_events.py) with the engine's other imports stubbed. The facts extracted from a wheel are
cached as JSON next to it, keyed by the wheel's sha256, so warm runs do not re-parse thousands of files.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
import typing
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

KINDS: Final = ("vllm", "sglang")
SCHEMA: Final = 8  # bump when the extraction changes: cached facts of an older schema are recomputed
IMAGES: Final = {"vllm": "vllm/vllm-openai:v{version}", "sglang": "lmsysorg/sglang:v{version}"}
_METRIC = re.compile(r"^(vllm|sglang):[a-zA-Z_][a-zA-Z0-9_]*$")
_FLAG = re.compile(r"^--[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_ENV = re.compile(r"^[A-Z][A-Z0-9_]*$")
_ROUTE_METHODS: Final = frozenset({"get", "post", "put", "delete", "patch", "api_route", "route", "add_api_route",
                                   "websocket", "add_route", "mount", "add_api_websocket_route"})  # fmt: skip
_ENV_READERS: Final = frozenset({"getenv", "get_bool_env_var", "get_int_env_var", "get_float_env_var",
                                 "get_str_env_var", "getenv_bool", "envbool"})  # fmt: skip
# Source trees that are not the server (benchmarks, tests, other subcommands' parsers).
_NOT_SERVER: Final = re.compile(
    r"(^|/)(tests?|benchmarks?|examples)(/|$)|run_batch|collect_env|entrypoints/cli/openai\.py"
)
log = logging.getLogger(__name__)


class WheelUnavailable(RuntimeError):
    """The release's wheel is neither cached nor downloadable: the oracle is missing, so tests must fail."""


@dataclass(frozen=True, order=True)
class EngineRelease:
    """One engine release: `kind` is "vllm" or "sglang", `version` its PyPI version."""

    kind: str
    version: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"engine kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def requirement(self) -> str:
        return f"{self.kind}=={self.version}"

    @property
    def image(self) -> str:
        """The engine's official container image of this release."""
        return IMAGES[self.kind].format(version=self.version)

    def __str__(self) -> str:
        return self.requirement


@dataclass(frozen=True)
class EngineFacts:
    """What one release accepts (flags, env), exports (metrics, routes) and puts on the wire."""

    release: EngineRelease
    wheel: str
    sha256: str
    flags: frozenset[str]  # every --flag of the server, underscores normalized to dashes
    env: frozenset[str]  # the env vars the engine declares (vLLM envs.py, SGLang environ.py)
    env_read: frozenset[str]  # env names read literally anywhere (os.environ/getenv/get_bool_env_var)
    removed_env: Mapping[str, str]  # vLLM's removed_environment_variables: name -> migration hint
    metrics: Mapping[str, str]  # name as declared -> counter | gauge | histogram | summary | info | unknown
    endpoints: frozenset[str]  # HTTP route paths of the server
    kv_transfer_params: frozenset[str]  # keys the NIXL connector reads from / writes to kv_transfer_params
    structs: Mapping[str, tuple[str, ...]]  # KV-event msgspec Struct -> field names in wire order
    struct_options: Mapping[str, Mapping[str, bool]]  # Struct -> array_like / tag / omit_defaults (inherited)
    configs: Mapping[str, tuple[str, ...]]  # config dataclass -> its field names (KVTransferConfig, ...)
    literals: Mapping[str, tuple[str, ...]]  # "Class.field" -> the Literal values of its annotation
    flag_choices: Mapping[str, tuple[str, ...]]  # --flag -> its literal choices, where they are static
    deprecated_flags: Mapping[str, str]  # --flag -> help text saying it is deprecated ("" if just marked)
    files: frozenset[str] = field(default_factory=frozenset)  # the wheel's .py paths

    @property
    def exposed_metrics(self) -> frozenset[str]:
        """Names as scraped: prometheus_client exposes a counter `x` as `x_total`."""
        out = set()
        for name, kind in self.metrics.items():
            out.add(name + "_total" if kind == "counter" and not name.endswith("_total") else name)
        return frozenset(out)

    def has_file(self, path: str) -> bool:
        return path in self.files


def cache_dir() -> Path:
    return Path(os.environ.get("XPYD_CACHE") or Path.home() / ".cache" / "xpyd")


def pip_command(release: EngineRelease, dest: Path) -> list[str]:
    """The download the oracle needs: the wheel only, no dependencies, never installed."""
    pip = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else [shutil.which("pip") or "pip"]
    return [*pip, "download", "--no-deps", "--only-binary=:all:", release.requirement, "-d", str(dest)]


def _find_wheel(release: EngineRelease, wheels: Path) -> Path | None:
    found = sorted(wheels.glob(f"{release.kind}-{release.version}-*.whl"))
    return found[0] if found else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One downloader/extractor per release across concurrent test processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def wheel_path(release: EngineRelease) -> Path:
    """The release's cached wheel, downloading it first if absent; raises WheelUnavailable."""
    wheels = cache_dir() / "wheels"
    if (found := _find_wheel(release, wheels)) is not None:
        return found
    with _locked(wheels / f".{release.kind}-{release.version}.lock"):
        if (found := _find_wheel(release, wheels)) is not None:
            return found
        cmd = pip_command(release, wheels)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WheelUnavailable(f"cannot download the {release} wheel: {exc}; run: {shlex.join(cmd)}") from None
        found = _find_wheel(release, wheels)
        if done.returncode != 0 or found is None:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise WheelUnavailable(
                f"cannot download the {release} wheel (pip exit {done.returncode}: {' | '.join(tail)}); "
                f"run: {shlex.join(cmd)}"
            )
        return found


def _sha256(wheel: Path) -> str:
    """The wheel's sha256, remembered in a sidecar keyed by size and mtime (hashing 400 MB takes a second)."""
    side = wheel.with_name(wheel.name + ".sha256")
    st = wheel.stat()
    stamp = f"{st.st_size}:{st.st_mtime_ns}"
    if side.exists():
        saved_stamp, _, digest = side.read_text().partition(" ")
        if saved_stamp == stamp and len(digest) == 64:
            return digest
    h = hashlib.sha256()
    with wheel.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    side.write_text(f"{stamp} {h.hexdigest()}")
    return h.hexdigest()


class Sources:
    """The .py files of one wheel, parsed lazily."""

    def __init__(self, release: EngineRelease, wheel: Path) -> None:
        self.release, self.wheel = release, wheel
        with zipfile.ZipFile(wheel) as z:
            self.paths = frozenset(n for n in z.namelist() if n.endswith(".py") and n.startswith(f"{release.kind}/"))
        self._text: dict[str, str] = {}
        self._trees: dict[str, ast.Module | None] = {}
        self._nodes: dict[str, list[ast.AST]] = {}

    def read_all(self) -> None:
        with zipfile.ZipFile(self.wheel) as z:
            for p in self.paths:
                self._text[p] = z.read(p).decode("utf-8", errors="replace")

    def text(self, path: str) -> str:
        if path not in self._text:
            if path not in self.paths:
                raise KeyError(f"{self.release} has no {path}")
            with zipfile.ZipFile(self.wheel) as z:
                self._text[path] = z.read(path).decode("utf-8", errors="replace")
        return self._text[path]

    def tree(self, path: str) -> ast.Module | None:
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(self.text(path))
            except SyntaxError:
                self._trees[path] = None
        return self._trees[path]

    def nodes(self, path: str) -> list[ast.AST]:
        """Every node of the file (one walk, shared by the extractors)."""
        if path not in self._nodes:
            tree = self.tree(path)
            self._nodes[path] = list(ast.walk(tree)) if tree is not None else []
        return self._nodes[path]

    def containing(self, paths: Iterable[str], *needles: str) -> list[str]:
        """The paths whose text contains one of the needles: a cheap filter before parsing."""
        paths = list(paths)
        missing = [p for p in paths if p not in self._text and p in self.paths]
        if missing:  # one open of the wheel for them all, not one per file
            with zipfile.ZipFile(self.wheel) as z:
                for p in missing:
                    self._text[p] = z.read(p).decode("utf-8", errors="replace")
        return [p for p in paths if any(n in self.text(p) for n in needles)]

    def under(self, *prefixes: str) -> list[str]:
        return sorted(p for p in self.paths if p.startswith(prefixes))

    def trees(self, paths: Iterable[str]) -> Iterator[tuple[str, ast.Module]]:
        for p in paths:
            if (t := self.tree(p)) is not None:
                yield p, t


@cache
def sources(release: EngineRelease) -> Sources:
    return Sources(release, wheel_path(release))


def source_text(release: EngineRelease, path: str) -> str:
    """One source file of the release, e.g. "vllm/sampling_params.py"."""
    return sources(release).text(path)


# --- AST helpers ---


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _joined_text(node: ast.AST | None) -> str:
    """A literal string, or a concatenation of literals (help texts), else ""."""
    if (s := _str(node)) is not None:
        return s
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _joined_text(node.left) + _joined_text(node.right)
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return ""


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _module_assigns(tree: ast.Module) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _literal_values(node: ast.AST | None, assigns: Mapping[str, ast.expr], depth: int = 0) -> list[str]:
    """The string values of Literal[...] in an annotation, following module-level aliases."""
    if node is None or depth > 8:
        return []
    if isinstance(node, ast.Subscript):
        head = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Literal":  # Literal["a", Other] where Other is a Literal alias too
            out = [v for e in items if (v := _str(e)) is not None]
            out += [v for e in items if not isinstance(e, ast.Constant) for v in _literal_values(e, assigns, depth + 1)]
            return list(dict.fromkeys(out))
        return [v for e in items for v in _literal_values(e, assigns, depth + 1)]
    if isinstance(node, ast.BinOp):
        return _literal_values(node.left, assigns, depth + 1) + _literal_values(node.right, assigns, depth + 1)
    if isinstance(node, ast.Name) and node.id in assigns:
        return _literal_values(assigns[node.id], assigns, depth + 1)
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and depth > 0:
        with contextlib.suppress(SyntaxError):
            return _literal_values(ast.parse(node.value, mode="eval").body, assigns, depth + 1)
    return []


def _static_strings(node: ast.AST | None, assigns: Mapping[str, ast.expr], depth: int = 0) -> list[str] | None:
    """A list/tuple/set of string literals (or a name bound to one, or a Literal alias), else None."""
    if node is None or depth > 4:
        return None
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        values = [_str(e) for e in node.elts]
        return [v for v in values if v is not None] if all(v is not None for v in values) else None
    if isinstance(node, ast.Name) and node.id in assigns:
        return _static_strings(assigns[node.id], assigns, depth + 1)
    if isinstance(node, ast.Call) and node.args and _callee(node) in ("list", "tuple", "get_args", "sorted"):
        inner = node.args[0]
        if isinstance(inner, ast.Name) and inner.id in assigns and (lits := _literal_values(inner, assigns)):
            return lits
        return _static_strings(inner, assigns, depth + 1)
    return None


@dataclass
class _Class:
    path: str
    node: ast.ClassDef
    assigns: dict[str, ast.expr]

    @property
    def bases(self) -> list[str]:
        return [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in self.node.bases]

    def own_fields(self) -> list[tuple[str, ast.expr]]:
        out = []
        for stmt in self.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                ann = ast.unparse(stmt.annotation)
                if not stmt.target.id.startswith("_") and "ClassVar" not in ann and "InitVar" not in ann:
                    out.append((stmt.target.id, stmt.annotation))
        return out


class _Classes:
    """Every class of a set of files, by name (the first one found wins: names are unique enough)."""

    def __init__(self, src: Sources, paths: Iterable[str]) -> None:
        self.by_name: dict[str, _Class] = {}
        for path, tree in src.trees(paths):
            assigns = _module_assigns(tree)
            for node in src.nodes(path):
                if isinstance(node, ast.ClassDef):
                    self.by_name.setdefault(node.name, _Class(path, node, assigns))

    def mro(self, name: str) -> list[_Class]:
        """The class and its ancestors found here, base first (msgspec/dataclass field order)."""
        out: list[_Class] = []
        seen: set[str] = set()

        def walk(n: str) -> None:
            c = self.by_name.get(n)
            if c is None or n in seen:
                return
            seen.add(n)
            for b in c.bases:
                walk(b)
            out.append(c)

        walk(name)
        return out

    def fields(self, name: str) -> list[tuple[str, ast.expr, dict[str, ast.expr]]]:
        out: dict[str, tuple[str, ast.expr, dict[str, ast.expr]]] = {}
        for c in self.mro(name):
            for fname, ann in c.own_fields():
                out[fname] = (fname, ann, c.assigns)  # an override keeps the base's position, as in msgspec
        return list(out.values())

    def subclasses(self, name: str) -> list[str]:
        out = [name]
        changed = True
        while changed:
            changed = False
            for n, c in self.by_name.items():
                if n not in out and any(b in out for b in c.bases):
                    out.append(n)
                    changed = True
        return out


# --- extraction ---


def _calls_by_function(tree: ast.Module) -> Iterator[tuple[ast.AST | None, ast.Call, list[ast.Call]]]:
    """Every call with its innermost enclosing function (None at module level) and that function's calls."""
    by_func: dict[ast.AST | None, list[ast.Call]] = {}

    def visit(node: ast.AST, func: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else func
            if isinstance(child, ast.Call):
                by_func.setdefault(func, []).append(child)
            visit(child, inner)

    visit(tree, None)
    for func, calls in by_func.items():
        for call in calls:
            yield func, call, calls


def _flags(src: Sources, paths: list[str]) -> tuple[set[str], dict[str, tuple[str, ...]], dict[str, str]]:
    """Every --flag of add_argument calls: literal, looped over literals, or generated from dataclass fields."""
    flags: set[str] = set()
    choices: dict[str, tuple[str, ...]] = {}
    deprecated: dict[str, str] = {}
    classes: _Classes | None = None
    for path, tree in src.trees(src.containing(paths, "add_argument")):
        assigns = _module_assigns(tree)
        loops: dict[str, list[str]] = {}
        for node in src.nodes(path):
            if isinstance(node, ast.For):
                names = [n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)]
                lits = [s for n in ast.walk(node.iter) if (s := _str(n)) is not None and _FLAG.match(s)]
                for n in names:
                    loops.setdefault(n, []).extend(lits)
        for func, call, body_calls in _calls_by_function(tree):
            if _callee(call) != "add_argument":
                continue
            names = [s for a in call.args if (s := _str(a)) is not None and _FLAG.match(s)]
            for a in call.args:
                if isinstance(a, ast.Name) and a.id in loops:
                    names += loops[a.id]
            generated = any(isinstance(a, ast.JoinedStr) and _joined_text(a).startswith("--") for a in call.args)
            if generated and func is not None:
                classes = classes or _Classes(src, [p for p in paths if re.search(r"class \w*Args\b", src.text(p))])
                names += _generated_flags(func, body_calls, classes, tree)
            names = [n.replace("_", "-") for n in names]
            flags.update(names)
            opts = _static_strings(_kw(call, "choices"), assigns)
            help_text = _joined_text(_kw(call, "help"))
            marked = isinstance(d := _kw(call, "deprecated"), ast.Constant) and d.value is True
            for n in names:
                if opts:
                    choices[n] = tuple(opts)
                if marked or "deprecat" in help_text.lower():
                    deprecated[n] = " ".join(help_text.split())
    return flags, choices, deprecated


def _generated_flags(func: ast.AST, calls: list[ast.Call], classes: _Classes, tree: ast.Module) -> list[str]:
    """`for key in get_kwargs(X): add_argument(f"--{key}")`: X's dataclass fields (cls: and its subclasses)."""
    out: list[str] = []
    for call in calls:
        if _callee(call) != "get_kwargs" or not call.args or not isinstance(call.args[0], ast.Name):
            continue
        target = call.args[0].id
        names = [target]
        if target == "cls":
            owner = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and func in ast.walk(c)), None)
            names = classes.subclasses(owner.name) if owner else []
        for n in names:
            out += [f"--{f}" for f, _, _ in classes.fields(n)]
    return out


def _sglang_field_flags(src: Sources) -> tuple[set[str], dict[str, tuple[str, ...]], dict[str, str]]:
    """SGLang >= 0.5.2x: flags from `A[T, "help"]` / `A[T, Arg(...)]` fields of the arg_groups/fields namespaces."""
    flags: set[str] = set()
    choices: dict[str, tuple[str, ...]] = {}
    deprecated: dict[str, str] = {}
    paths = src.under("sglang/srt/arg_groups/fields/")
    for c in _Classes(src, paths).by_name.values():
        if not any(isinstance(st, ast.Assign | ast.AnnAssign) and "_NS_PATH" in ast.unparse(st) for st in c.node.body):
            continue
        for stmt in c.node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = stmt.annotation
            if not (
                isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated", "typing.Annotated")
            ):
                continue
            items = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else []
            meta = next(
                (m for m in items[1:] if _str(m) is not None or (isinstance(m, ast.Call) and _callee(m) == "Arg")), None
            )
            if meta is None:
                continue
            arg = meta if isinstance(meta, ast.Call) else None
            no_cli = arg is not None and isinstance(v := _kw(arg, "no_cli"), ast.Constant) and v.value is True
            if no_cli:
                continue
            name = (_str(_kw(arg, "cli_name")) if arg else None) or "--" + stmt.target.id.replace("_", "-")
            names = [name, *(_static_strings(_kw(arg, "aliases"), c.assigns) or [] if arg else [])]
            if arg is not None and "BooleanOptionalAction" in ast.unparse(_kw(arg, "action") or ast.Constant(None)):
                names += ["--no-" + n.removeprefix("--") for n in list(names)]
            names = [n.replace("_", "-") for n in names]
            flags.update(names)
            opts = (_static_strings(_kw(arg, "choices"), c.assigns) if arg else None) or _literal_values(
                items[0], c.assigns
            )
            help_text = _joined_text(_kw(arg, "help")) if arg else _joined_text(meta)
            for n in names:
                if opts:
                    choices[n] = tuple(opts)
                if "deprecat" in help_text.lower():
                    deprecated[n] = " ".join(help_text.split())
    return flags, choices, deprecated


def _vllm_env(src: Sources) -> tuple[set[str], dict[str, str]]:
    tree = src.tree("vllm/envs.py")
    env: set[str] = set()
    removed: dict[str, str] = {}
    for name, value in _module_assigns(tree).items() if tree else ():
        if isinstance(value, ast.Dict) and name in ("environment_variables", "removed_environment_variables"):
            for k, v in zip(value.keys, value.values, strict=True):
                if (key := _str(k)) is not None:
                    if name == "environment_variables":
                        env.add(key)
                    else:
                        removed[key] = " ".join(_joined_text(v).split())
    return env, removed


def _sglang_env(src: Sources) -> set[str]:
    """SGLang's environ.py: `class Envs: SGLANG_X = EnvBool(...)` (and deprecated_name="..." aliases)."""
    env: set[str] = set()
    if "sglang/srt/environ.py" not in src.paths or (tree := src.tree("sglang/srt/environ.py")) is None:
        return env
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
            targets = (
                stmt.targets
                if isinstance(stmt, ast.Assign)
                else [stmt.target]
                if isinstance(stmt, ast.AnnAssign)
                else []
            )
            if isinstance(value, ast.Call) and _callee(value).startswith("Env"):
                env.update(t.id for t in targets if isinstance(t, ast.Name) and _ENV.match(t.id))
                for k in value.keywords:
                    if k.arg and "name" in k.arg and (s := _str(k.value)) and _ENV.match(s):
                        env.add(s)
    return env


def _env_read(src: Sources, paths: list[str]) -> set[str]:
    """Env names read literally: os.environ["X"], os.environ.get("X"), os.getenv("X"), get_bool_env_var("X")."""
    out: set[str] = set()
    for path in src.containing(paths, "environ", "getenv", "env_var"):
        for node in src.nodes(path):
            key: str | None = None
            if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
                key = _str(node.slice)
            elif isinstance(node, ast.Call) and node.args:
                f = node.func
                on_environ = (
                    isinstance(f, ast.Attribute)
                    and ast.unparse(f.value).endswith("environ")
                    and f.attr in ("get", "setdefault", "pop")
                )
                if on_environ or _callee(node).lower() in _ENV_READERS:
                    key = _str(node.args[0])
            elif (
                isinstance(node, ast.Compare)
                and any(isinstance(o, ast.In | ast.NotIn) for o in node.ops)
                and any(ast.unparse(c).endswith("environ") for c in node.comparators)
            ):
                key = _str(node.left)
            if key and _ENV.match(key):
                out.add(key)
    return out


def _metrics(src: Sources, paths: list[str], prefix: str) -> dict[str, str]:
    """Metric names passed to a metric constructor (name= or first argument), typed by the constructor's name."""
    out: dict[str, str] = {}
    for path in src.containing(paths, f'"{prefix}', f"'{prefix}"):
        for node in src.nodes(path):
            if not isinstance(node, ast.Call):
                continue
            name = _str(_kw(node, "name")) or (_str(node.args[0]) if node.args else None)
            if not name or not name.startswith(prefix) or not _METRIC.match(name):
                continue
            callee = _callee(node).lower()
            kind = next((k for k in ("counter", "gauge", "histogram", "summary", "info") if k in callee), "unknown")
            if out.get(name, "unknown") == "unknown":
                out[name] = kind
        for node in src.nodes(path):  # `name = "vllm:x"` passed on as a variable: the name, its type unknown
            if (
                isinstance(node, ast.Assign)
                and (name := _str(node.value))
                and name.startswith(prefix)
                and _METRIC.match(name)
                and name not in out
            ):
                out[name] = "unknown"
    return out


def _endpoints(src: Sources, paths: list[str]) -> set[str]:
    out: set[str] = set()
    for path in src.containing(paths, '"/', "'/"):
        for node in src.nodes(path):
            routed = isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Attribute) and node.func.attr in _ROUTE_METHODS)
                or _callee(node) in ("Mount", "Route", "APIRoute")
            )
            if isinstance(node, ast.Call) and routed:
                route = _str(node.args[0]) if node.args else _str(_kw(node, "path"))
                if route and route.startswith("/"):
                    out.add(route)
    return out


def _kv_params(src: Sources, paths: list[str]) -> set[str]:
    """Keys of kv_transfer_params the NIXL connector reads (params["k"], .get("k"), "k" in params) or returns."""
    out: set[str] = set()

    def is_params(n: ast.AST) -> bool:
        text = ast.unparse(n)
        return text.endswith("params") and "sampling" not in text

    for path in paths:
        for node in src.nodes(path):
            if isinstance(node, ast.Subscript) and is_params(node.value) and (k := _str(node.slice)):
                out.add(k)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.args
                and node.func.attr in ("get", "pop", "setdefault")
                and is_params(node.func.value)
            ):
                out.update(k for k in [_str(node.args[0])] if k)
            if isinstance(node, ast.Call) and _callee(node) == "dict":
                kws = {k.arg for k in node.keywords if k.arg}
                if kws & {"do_remote_prefill", "do_remote_decode"}:
                    out |= kws
            if isinstance(node, ast.Dict):
                keys = {k for k in map(_str, node.keys) if k}
                if keys & {"do_remote_prefill", "do_remote_decode", "remote_engine_id"}:
                    out |= keys
            if (
                isinstance(node, ast.Compare)
                and any(is_params(c) for c in node.comparators)
                and (k := _str(node.left)) is not None
            ):
                out.add(k)
            if isinstance(node, ast.comprehension) and isinstance(node.iter, ast.Tuple):
                parent_uses_params = True
                if parent_uses_params:
                    lits = [s for e in node.iter.elts if (s := _str(e))]
                    if any(s.startswith("remote_") for s in lits):
                        out.update(lits)
    return {k for k in out if re.match(r"^[a-z][a-z0-9_]*$", k)}


def _structs(classes: _Classes, names: Iterable[str]) -> tuple[dict[str, tuple[str, ...]], dict[str, dict[str, bool]]]:
    fields_out: dict[str, tuple[str, ...]] = {}
    options: dict[str, dict[str, bool]] = {}
    for name in names:
        if name not in classes.by_name:
            continue
        fields_out[name] = tuple(f for f, _, _ in classes.fields(name))
        opts: dict[str, bool] = {"array_like": False, "tag": False, "omit_defaults": False}
        for c in classes.mro(name):
            for k in c.node.keywords:
                if k.arg in opts and isinstance(k.value, ast.Constant):
                    opts[k.arg] = bool(k.value.value)
        options[name] = opts
    return fields_out, options


VLLM_CONFIGS: Final = ("KVTransferConfig", "KVEventsConfig", "ParallelConfig", "KernelConfig")
VLLM_LITERALS: Final = (
    "KVTransferConfig.kv_role", "KVEventsConfig.publisher", "ParallelConfig.all2all_backend",
    "ParallelConfig.data_parallel_backend", "KernelConfig.moe_backend",
)  # fmt: skip
KV_EVENT_STRUCTS: Final = ("EventBatch", "KVEventBatch", "BlockStored", "BlockRemoved", "AllBlocksCleared")


def _extract(src: Sources, sha: str) -> EngineFacts:
    kind = src.release.kind
    src.read_all()
    pkg = [p for p in src.paths if not _NOT_SERVER.search(p.removeprefix(f"{kind}/"))]
    literals: dict[str, tuple[str, ...]] = {}
    configs: dict[str, tuple[str, ...]] = {}
    if kind == "vllm":
        flag_paths = pkg
        env, removed = _vllm_env(src)
        metrics = _metrics(src, pkg, "vllm:")
        endpoints = _endpoints(src, [p for p in pkg if p.startswith("vllm/entrypoints/")])
        nixl = [p for p in pkg if re.search(r"kv_connector/v1/nixl(_connector\.py|/)", p)]
        kv_params = _kv_params(src, nixl)
        events = _Classes(src, [p for p in ["vllm/distributed/kv_events.py"] if p in src.paths])
        config_classes = _Classes(src, [p for p in pkg if p.startswith("vllm/config")])
        for name in VLLM_CONFIGS:
            if name in config_classes.by_name:
                configs[name] = tuple(f for f, _, _ in config_classes.fields(name))
        for dotted in VLLM_LITERALS:
            cls, _, attr = dotted.partition(".")
            for f, ann, assigns in config_classes.fields(cls):
                if f == attr and (vals := _literal_values(ann, assigns)):
                    literals[dotted] = tuple(vals)
    else:
        flag_paths = [p for p in ["sglang/srt/server_args.py"] if p in src.paths]
        env, removed = _sglang_env(src), {}
        metrics = _metrics(src, pkg, "sglang:")
        endpoints = _endpoints(src, [p for p in pkg if p.startswith(("sglang/srt/entrypoints/", "sglang/srt/utils/"))])
        kv_params = set()
        where = [p for p in pkg if "class BlockStored" in src.text(p)]
        events = _Classes(src, where[:1])
        if "KVEventsConfig" in events.by_name:  # parsed from --kv-events-config (a pydantic model)
            configs["KVEventsConfig"] = tuple(f for f, _, _ in events.fields("KVEventsConfig"))
    flags, choices, deprecated = _flags(src, flag_paths)
    if kind == "sglang" and "add_cli_args_from_dataclass" in src.text("sglang/srt/server_args.py"):
        more, more_choices, more_deprecated = _sglang_field_flags(src)
        flags |= more
        choices = {**more_choices, **choices}
        deprecated = {**more_deprecated, **deprecated}
    if kind == "vllm":
        for flag, dotted in (("--all2all-backend", "ParallelConfig.all2all_backend"),
                             ("--moe-backend", "KernelConfig.moe_backend"),
                             ("--data-parallel-backend", "ParallelConfig.data_parallel_backend")):  # fmt: skip
            if flag in flags and dotted in literals and flag not in choices:
                choices[flag] = literals[dotted]
    structs, options = _structs(events, KV_EVENT_STRUCTS)
    return EngineFacts(
        release=src.release, wheel=src.wheel.name, sha256=sha, flags=frozenset(flags), env=frozenset(env),
        env_read=frozenset(_env_read(src, pkg)), removed_env=removed, metrics=metrics,
        endpoints=frozenset(endpoints), kv_transfer_params=frozenset(kv_params), structs=structs,
        struct_options=options, configs=configs, literals=literals, flag_choices=choices,
        deprecated_flags=deprecated, files=src.paths,
    )  # fmt: skip


def _to_json(f: EngineFacts) -> dict[str, Any]:
    def plain(v: Any) -> Any:
        if isinstance(v, frozenset):
            return sorted(v)
        if isinstance(v, Mapping):
            return {k: plain(x) for k, x in sorted(v.items())}
        if isinstance(v, tuple):
            return list(v)
        return v

    return {"schema": SCHEMA, "kind": f.release.kind, "version": f.release.version,
            **{k: plain(getattr(f, k)) for k in f.__dataclass_fields__ if k != "release"}}  # fmt: skip


def _from_json(release: EngineRelease, d: Mapping[str, Any]) -> EngineFacts:
    tuples = {k: tuple(v) for k, v in d["structs"].items()}
    return EngineFacts(
        release=release, wheel=d["wheel"], sha256=d["sha256"], flags=frozenset(d["flags"]), env=frozenset(d["env"]),
        env_read=frozenset(d["env_read"]), removed_env=dict(d["removed_env"]), metrics=dict(d["metrics"]),
        endpoints=frozenset(d["endpoints"]), kv_transfer_params=frozenset(d["kv_transfer_params"]), structs=tuples,
        struct_options={k: dict(v) for k, v in d["struct_options"].items()},
        configs={k: tuple(v) for k, v in d["configs"].items()},
        literals={k: tuple(v) for k, v in d["literals"].items()},
        flag_choices={k: tuple(v) for k, v in d["flag_choices"].items()}, deprecated_flags=dict(d["deprecated_flags"]),
        files=frozenset(d["files"]),
    )  # fmt: skip


@cache
def facts(release: EngineRelease) -> EngineFacts:
    """The release's facts: from the JSON cache when its wheel's sha256 matches, else extracted and cached."""
    wheel = wheel_path(release)
    sha = _sha256(wheel)
    cached = cache_dir() / "facts" / f"{release.kind}-{release.version}-{sha[:16]}.json"
    if cached.exists():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            d = json.loads(cached.read_text())
            if d.get("schema") == SCHEMA and d.get("sha256") == sha:
                return _from_json(release, d)
    with _locked(cached.with_suffix(".lock")):
        result = _extract(sources(release), sha)
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(json.dumps(_to_json(result), indent=1))
        tmp.replace(cached)
    return result


# --- loading one engine module from the wheel ---


class _Stub(types.ModuleType):
    """An engine-internal module a loaded file imports: its names are placeholders, or the real type aliases."""

    def __init__(self, name: str, aliases: Mapping[str, Any]) -> None:
        super().__init__(name)
        self._aliases = aliases

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr in self._aliases:
            return self._aliases[attr]
        if attr == "init_logger":
            return logging.getLogger
        value: Any = type(attr, (), {"__module__": self.__name__})
        setattr(self, attr, value)
        return value


def _aliases(src: Sources, module: str) -> dict[str, Any]:
    """Module-level type aliases of an engine module (e.g. ExternalBlockHash = bytes | int), evaluated safely."""
    path = module.replace(".", "/") + ".py"
    if path not in src.paths:
        path = module.replace(".", "/") + "/__init__.py"
    tree = src.tree(path) if path in src.paths else None
    out: dict[str, Any] = {}
    builtins = {"bytes": bytes, "int": int, "str": str, "float": float, "bool": bool, "list": list, "dict": dict,
                "tuple": tuple, "None": None}  # fmt: skip
    scope: dict[str, Any] = {"__builtins__": {}, **vars(typing), **builtins}
    for name, value in _module_assigns(tree).items() if tree else ():
        names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
        if names and names <= set(scope) | set(out):
            with contextlib.suppress(Exception):
                out[name] = eval(compile(ast.Expression(value), path, "eval"), {**scope, **out})
    return out


@cache
def load_module(release: EngineRelease, path: str) -> types.ModuleType:
    """Execute one file of the wheel in memory, its imports of the engine's other modules stubbed.

    For self-contained modules such as vllm/distributed/kv_events.py (msgspec + zmq): their msgspec
    Structs are the engine's own, so tests can encode and decode the engine's exact wire format.
    """
    src = sources(release)
    code = src.text(path)
    tag = f"{release.kind}_{release.version.replace('.', '_')}"
    name = f"_xpyd_oracle.{tag}." + path.removesuffix(".py").replace("/", ".")
    mod = types.ModuleType(name)
    mod.__file__ = f"{src.wheel.name}/{path}"
    real_import: Callable[..., Any] = __import__
    stubs: dict[str, _Stub] = {}

    def oracle_import(
        mod_name: str, globs: Any = None, locs: Any = None, fromlist: Any = (), level: int = 0
    ) -> types.ModuleType:
        if level == 0 and (mod_name == release.kind or mod_name.startswith(release.kind + ".")):
            if mod_name not in stubs:
                stubs[mod_name] = _Stub(mod_name, _aliases(src, mod_name))
            return stubs[mod_name] if fromlist else stubs.setdefault(release.kind, _Stub(release.kind, {}))
        return real_import(mod_name, globs, locs, fromlist, level)  # type: ignore[no-any-return]

    builtins = dict(vars(__builtins__)) if isinstance(__builtins__, types.ModuleType) else dict(__builtins__)
    builtins["__import__"] = oracle_import
    mod.__dict__["__builtins__"] = builtins
    sys.modules[name] = mod  # msgspec resolves the Structs' annotations through sys.modules
    try:
        exec(compile(code, mod.__file__, "exec"), mod.__dict__)
    except Exception:
        sys.modules.pop(name, None)
        raise
    return mod
