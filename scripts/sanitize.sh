#!/usr/bin/env bash
# Builds lowbit's C++ extension with AddressSanitizer + UndefinedBehaviorSanitizer and runs tests on it.
#
#   bash scripts/sanitize.sh                     # kernel, format and model tests (the default)
#   bash scripts/sanitize.sh tests/kernels -x    # any pytest arguments
#
# The instrumented build goes to build/sanitize (CMake) and build/sanitize-site (the package), which is put
# first on PYTHONPATH, so the regular .venv (made by scripts/setup.sh when missing) provides everything
# else. CPython is not instrumented, so libasan is preloaded; leak detection is off (the interpreter's
# own allocations at exit are not ours); any ASan or UBSan report aborts the run with a nonzero status.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "sanitize.sh: $*" >&2; exit 1; }

need_pkgs=()
command -v g++ >/dev/null || need_pkgs+=(g++)
command -v cmake >/dev/null || python3 -c "import cmake" 2>/dev/null || need_pkgs+=(cmake)
if [ ${#need_pkgs[@]} -gt 0 ] || [ ! -f "$(g++ -print-file-name=libasan.so 2>/dev/null)" ]; then
  command -v apt-get >/dev/null || die "need a C++ compiler with libasan/libubsan (g++); no apt-get to install it"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq g++ cmake >/dev/null || die "apt-get install g++ cmake failed"
fi
LIBASAN="$(g++ -print-file-name=libasan.so)"
[ -f "$LIBASAN" ] || die "libasan.so not found next to g++ ($LIBASAN): install the compiler's sanitizer runtime"
# libstdc++ preloaded too: ASan's __cxa_throw interceptor must find the real one at start-up, or the
# first C++ exception (every ValueError of the binding) aborts.
LIBSTDCXX="$(g++ -print-file-name=libstdc++.so.6)"
[ -f "$LIBSTDCXX" ] || die "libstdc++.so.6 not found next to g++"
PRELOAD="$LIBASAN $LIBSTDCXX"

[ -x .venv/bin/python ] || bash scripts/setup.sh test
PY=.venv/bin/python
"$PY" -m pip install -q scikit-build-core nanobind pytest hypothesis || die "pip could not install the build tools"

SITE=build/sanitize-site
echo "sanitize.sh: building the ASan+UBSan extension (build/sanitize)..."
"$PY" -m pip install -q --no-build-isolation --no-deps --upgrade --target "$SITE" \
  -C build-dir=build/sanitize -C cmake.build-type=RelWithDebInfo -C cmake.define.LOWBIT_SANITIZE=ON . \
  || die "the sanitizer build failed"

export PYTHONPATH="$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}"
# Reports go to files as well as stderr (pytest captures stderr; a test that aborts would lose its report).
LOGS="$PWD/build/sanitize-logs"
rm -rf "$LOGS" && mkdir -p "$LOGS"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_odr_violation=0:log_path=$LOGS/asan:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$LOGS/ubsan:${UBSAN_OPTIONS:-}"
LD_PRELOAD="$PRELOAD" "$PY" -c "import lowbit, sys; assert lowbit.__file__.startswith('$PWD/$SITE'), lowbit.__file__" \
  || die "the instrumented lowbit is not the one imported"

[ $# -gt 0 ] || set -- tests/kernels tests/formats tests/model
echo "sanitize.sh: pytest $* (LD_PRELOAD=$PRELOAD)"
rc=0
LD_PRELOAD="$PRELOAD" "$PY" -m pytest -q -p no:cacheprovider "$@" || rc=$?
if compgen -G "$LOGS/*" >/dev/null; then
  echo "sanitize.sh: sanitizer reports:" >&2
  cat "$LOGS"/* >&2
  exit 1
fi
[ "$rc" -eq 0 ] || die "pytest failed (status $rc)"
echo "sanitize.sh: clean (no ASan/UBSan report)"
