#!/usr/bin/env bash
# Side-by-side checks of the 2-bit GEMV (kernels_avx256.inc), one process each, alternating, min / median of rounds:
#   bash scripts/gemv_ab/run.sh [OLD_COMMIT]       (default: the commit before the 13-op GEMV, e1fe4b6^)
#   1. in cache, 1 thread: OLD's AVX2 kernel vs the working tree's, bitwise-equal check + G MAC/s ratio
#   2. from DRAM, 1 thread, CPU time: the working tree's kernel on 4 KiB vs 2 MiB pages (weights rotated over 256 MiB)
set -euo pipefail
root=$(git rev-parse --show-toplevel); K=$root/src/lowbit/kernels; old=${1:-e1fe4b6^}
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
mkdir -p "$d/old"; git -C "$root" show "$old:src/lowbit/kernels/kernels_avx256.inc" > "$d/old/kernels_avx256.inc"
for v in old new; do
  inc=$([ $v = old ] && echo "old/kernels_avx256.inc" || echo "kernels_avx256.inc")
  printf '#define LOWBIT_AVX256_NS avx2%s\n#define LOWBIT_AVX256_NAME "%s"\n#define LOWBIT_AVX256_TABLE kernels_%s\n#define LOWBIT_OPS_NS ops_%s\n#include "%s"\n' $v $v $v $v "$inc" > "$d/$v.cpp"
done
F="-O3 -mavx2 -mfma -mf16c -mbmi2 -std=c++17 -I$K -I$d"
g++ $F -c "$d/old.cpp" -o "$d/old.o"; g++ $F -c "$d/new.cpp" -o "$d/new.o"
g++ $F "$(dirname "$0")/incache_ab.cpp" "$d/old.o" "$d/new.o" -o "$d/incache"
g++ $F "$(dirname "$0")/pages_ab.cpp" "$d/new.o" -o "$d/pages"
uptime
for s in "448 4096 0" "448 4096 128" "256 2048 0" "1536 1536 0" "100 1000 0"; do "$d/incache" $s; done
"$d/incache" 64 2048 0 2 2 max   # codes 3 x activations 127: the s16 bound
for s in "1536 1536" "4096 1536" "1536 4096" "640 2560" "2560 2560"; do "$d/pages" $s 20 | grep -v AnonHuge; done
