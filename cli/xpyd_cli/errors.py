"""Turns any failure of an `xpyd` command into one line that names the problem and the fix, exit code 2."""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
from typing import NoReturn

EXIT_USAGE = 2
DEBUG_ENV = "XPYD_DEBUG"  # set to 1 to see the traceback instead of the one line


class OneLineParser(argparse.ArgumentParser):
    """argparse with its error as one line (the usage block stays behind --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def one_line_argparse_errors() -> None:
    """Every parser the commands build reports bad flags in one line: applied once, in the dispatcher."""
    argparse.ArgumentParser.error = OneLineParser.error  # type: ignore[method-assign,assignment]


def _squash(text: str) -> str:
    return " ".join(str(text).split())


def _yaml_message(exc: Exception) -> str | None:
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        return None
    if not isinstance(exc, yaml.YAMLError):
        return None
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"not valid YAML{where}: {_squash(problem)}; fix the file"


def _os_message(exc: OSError) -> str:
    name = exc.filename if exc.filename is not None else ""
    cache_bin = os.path.join(os.environ.get("XPYD_CACHE", "~/.cache/xpyd"), "bin")
    if isinstance(exc, FileNotFoundError):
        if str(name).startswith(os.path.expanduser(cache_bin)):
            return f"{name} is not built yet; run 'make tools' (or bash cluster/build-tools.sh)"
        return f"{name or 'a file'} does not exist; check the path"
    if isinstance(exc, PermissionError):
        return f"permission denied on {name or 'a file'}; check its owner and mode"
    if isinstance(exc, IsADirectoryError):
        return f"{name} is a folder, a file was expected"
    if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT) or isinstance(
        exc, ConnectionError
    ):
        return f"cannot connect ({_squash(exc.strerror or str(exc))}); check the URL and that the server runs"
    return f"{_squash(str(exc))}; check the path or address it names"


def describe(exc: BaseException) -> str:
    """One line for a failure: what went wrong and what to do about it."""
    if isinstance(exc, OSError):
        return _os_message(exc)
    if isinstance(exc, subprocess.CalledProcessError):
        cmd = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd))
        return f"'{_squash(cmd)}' failed with exit code {exc.returncode}; see its output above"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}; fix the input"
    yaml_msg = _yaml_message(exc) if isinstance(exc, Exception) else None
    if yaml_msg:
        return yaml_msg
    if isinstance(exc, (ValueError, KeyError, LookupError, RuntimeError, TimeoutError)):
        return _squash(str(exc)) or type(exc).__name__
    return (
        f"unexpected {type(exc).__name__}: {_squash(str(exc))} (a bug: rerun with {DEBUG_ENV}=1 for the"
        " traceback and report it)"
    )


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")
