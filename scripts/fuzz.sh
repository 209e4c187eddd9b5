#!/usr/bin/env bash
# The long fuzzing run: 100,000 mutated/truncated files per reader (gguf, safetensors, config.json,
# tokenizer.json, lowbit directory metadata), each in a worker process with a timeout. Arguments go to
# `python -m tests.io.fuzz` (e.g. --cases 5000, --reader gguf, --first-seed 100000, --full-gguf).
# A failure prints its reader and seed; replay it with: python -m tests.io.fuzz --reader R --seed S
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
exec python -m tests.io.fuzz --cases 100000 "$@"
