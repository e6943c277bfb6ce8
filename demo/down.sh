#!/usr/bin/env bash
# `make demo-down`: stop everything `make demo` started (the local cluster and all its pods).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/xpyd cluster down
