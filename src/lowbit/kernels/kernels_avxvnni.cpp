// AVX2 + AVX-VNNI (VEX vpdpbusd on ymm): Alder Lake and later laptops, Zen 5.
#if defined(__AVXVNNI__)
#define LOWBIT_AVX256_NS avxvnni
#define LOWBIT_AVX256_DOT(acc, u8, s8) _mm256_dpbusd_avx_epi32(acc, u8, s8)
#define LOWBIT_AVX256_NAME "avxvnni"
#define LOWBIT_AVX256_TABLE kernels_avxvnni_impl
#define LOWBIT_OPS_NS ops_avxvnni
#include "kernels_avx256.inc"
namespace lowbit {
const KernelTable* kernels_avxvnni() { return &kernels_avxvnni_impl(); }
}  // namespace lowbit
#else
#include "common.h"
namespace lowbit {
const KernelTable* kernels_avxvnni() { return nullptr; }
}  // namespace lowbit
#endif
