#!/usr/bin/env bash
# Builds llama.cpp's command-line tools (llama-bench, llama-quantize, llama-perplexity, llama-imatrix) from
# the llama.cpp source inside the llama-cpp-python sdist on PyPI, for the side-by-side benchmarks and the
# perplexity rows in docs/codebook.md. Not run by CI. Prints the bin/ folder on its last line.
#
#   bash scripts/llamacpp.sh                 # -> ~/.cache/lowbit/llamacpp/build/bin
#   LLAMACPP_DIR=/work/llamacpp JOBS=2 bash scripts/llamacpp.sh
#   LLAMACPP_VERSION=0.3.36 bash scripts/llamacpp.sh   # the sdist measured in docs/codebook.md
#
# Needs: python3 -m pip, cmake >= 3.14, a C/C++ compiler (gcc 12 here). Release build, native CPU flags
# (GGML_NATIVE: the binaries use this machine's AVX2/AVX-512 and do not run on an older CPU).
set -euo pipefail
DIR=${LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lowbit/llamacpp}
JOBS=${JOBS:-$(nproc)}
SPEC=llama-cpp-python${LLAMACPP_VERSION:+==$LLAMACPP_VERSION}
TARGETS=(llama-bench llama-quantize llama-perplexity llama-imatrix)
mkdir -p "$DIR"
cd "$DIR"
if ! ls llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    # --no-build-isolation: else pip prepares the sdist's metadata in an isolated environment whose build
    # requirements (cmake among them) --no-binary :all: makes it compile from source, ~20 min on 2 cores
    python3 -m pip download --no-deps --no-binary :all: --no-build-isolation -d . "$SPEC" >&2
fi
SDIST=$(ls llama_cpp_python-*.tar.gz | sort -V | tail -1)
SRC=${SDIST%.tar.gz}
[ -d "$SRC/vendor/llama.cpp" ] || tar xzf "$SDIST"
if [ ! -f build/CMakeCache.txt ]; then
    cmake -S "$SRC/vendor/llama.cpp" -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_TOOLS=ON >&2
fi
cmake --build build --config Release -j "$JOBS" --target "${TARGETS[@]}" >&2
for t in "${TARGETS[@]}"; do [ -x "build/bin/$t" ] || { echo "llamacpp.sh: build/bin/$t was not built" >&2; exit 1; }; done
echo "$DIR/build/bin"
