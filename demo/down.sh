#!/usr/bin/env bash
# `make demo-down`: stop everything `make demo` started.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/xpyd cluster down
