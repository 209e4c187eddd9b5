#!/usr/bin/env bash
# The test suite: set up with the test extras (CPU torch 2.13.0, transformers for the golden test), run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
exec python -m pytest -q "$@"
