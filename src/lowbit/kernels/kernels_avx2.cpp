// AVX2 + FMA + F16C, no VNNI: vpmaddubsw / vpmaddwd (see kernels_avx256.inc).
#define LOWBIT_AVX256_NS avx2
#define LOWBIT_AVX256_NAME "avx2"
#define LOWBIT_AVX256_TABLE kernels_avx2
#define LOWBIT_OPS_NS ops_avx2
#include "kernels_avx256.inc"
