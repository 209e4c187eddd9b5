#!/usr/bin/env bash
# The main job: set up, then chat once with the default model (SmolLM2-135M-Instruct), printing tokens/s.
# Extra arguments go to `lowbit run` (see `lowbit run --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec lowbit run "$@"
