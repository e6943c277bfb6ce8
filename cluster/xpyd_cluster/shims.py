"""Engine stand-ins for shell commands: `vllm` and `python3 -m sglang.launch_server` on PATH run the emulator."""

from __future__ import annotations

import shlex
from pathlib import Path

# An engine container rendered as `/bin/sh -c "exec vllm serve ... $(( ${LWS_WORKER_INDEX:-0} * 8 ))"` needs a
# real shell to do its arithmetic; the process kubelet runs that shell with the shim directory first on PATH.

# `python -m <module>` forms that are an engine's server, not a script the pod wants to run.
ENGINE_MODULES = ("sglang.launch_server", "vllm.entrypoints.openai.api_server")


def scripts(xpyd: str, python: str) -> dict[str, str]:
    """The shim files by name: vllm always runs the emulator; python3/python only for an engine's module."""
    emulate = f"exec {shlex.quote(xpyd)} emulate --"
    modules = "|".join(f'"-m {m}"' for m in ENGINE_MODULES)
    vllm = f'#!/bin/sh\n# xpyd local cluster: vLLM is emulated\n{emulate} vllm "$@"\n'
    py = (
        "#!/bin/sh\n"
        "# xpyd local cluster: an engine's server module is emulated, anything else runs the real interpreter\n"
        f'case "$1 $2" in\n'
        f'  {modules}) {emulate} python3 "$@" ;;\n'
        "esac\n"
        f'exec {shlex.quote(python)} "$@"\n'
    )
    return {"vllm": vllm, "python3": py, "python": py}


def install(directory: Path, xpyd: str, python: str) -> Path:
    """Write the shims (each replaced atomically, executable) and return the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in scripts(xpyd, python).items():
        tmp = directory / f".{name}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(directory / name)
    return directory
