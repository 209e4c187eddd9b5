// The AVX2 int8 roof: vpmaddubsw (32 u8 x s8 products, summed in pairs to s16) + vpaddw into s16
// accumulators, the inner step of the AVX2 integer kernels (kernels_avx256.inc). 12 accumulators:
// more chains than latency x throughput on current cores (Zen 3: 3-cycle vpmaddubsw, 2 per cycle).
#include <cstdint>

#include "roof.h"

namespace lowbit {

uint64_t roof_probe_avx2(int64_t iters) {
  if (iters <= 0) return 0;
  int64_t n = iters;
  // Written in asm: the compiler would share the identical products or spill the accumulators.
  __asm__ volatile(
      LOWBIT_ROOF_ZERO_ACCUMULATORS
      "vpcmpeqb %%ymm12, %%ymm12, %%ymm12\n\t"
      "vpabsb %%ymm12, %%ymm13\n\t"
      "vpsrlw $1, %%ymm12, %%ymm14\n\t"
      "1:\n\t"
      "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm0, %%ymm0\n\t"
      "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm1, %%ymm1\n\t"
      "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm2, %%ymm2\n\t"
      "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm3, %%ymm3\n\t"
      "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm4, %%ymm4\n\t"
      "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm5, %%ymm5\n\t"
      "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm6, %%ymm6\n\t"
      "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm7, %%ymm7\n\t"
      "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm8, %%ymm8\n\t"
      "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm9, %%ymm9\n\t"
      "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm10, %%ymm10\n\t"
      "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t"
      "vpaddw %%ymm15, %%ymm11, %%ymm11\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vzeroupper\n\t"
      : [n] "+r"(n)
      :
      : LOWBIT_ROOF_CLOBBERS);
  return (uint64_t)iters * 12 * 32;
}

}  // namespace lowbit
