// The AVX-512 VNNI int8 roof: vpdpbusd on zmm (64 u8 x s8 products into int32), 12 independent chains
// (latency 4-5 cycles at 1-2 per cycle on Ice Lake / Sapphire Rapids / Zen 4).
#include <cstdint>

#include "roof.h"

namespace lowbit {

uint64_t roof_probe_avx512(int64_t iters) {
  if (iters <= 0) return 0;
  int64_t n = iters;
  // Written in asm: the compiler would share the identical products or spill the accumulators.
  __asm__ volatile(
      LOWBIT_ROOF_ZERO_ACCUMULATORS
      "vpternlogd $0xff, %%zmm12, %%zmm12, %%zmm12\n\t"
      "vpabsb %%zmm12, %%zmm13\n\t"
      "vpsrlw $1, %%zmm12, %%zmm14\n\t"
      "1:\n\t"
      "vpdpbusd %%zmm14, %%zmm12, %%zmm0\n\t"
      "vpdpbusd %%zmm14, %%zmm13, %%zmm1\n\t"
      "vpdpbusd %%zmm14, %%zmm12, %%zmm2\n\t"
      "vpdpbusd %%zmm14, %%zmm13, %%zmm3\n\t"
      "vpdpbusd %%zmm14, %%zmm12, %%zmm4\n\t"
      "vpdpbusd %%zmm14, %%zmm13, %%zmm5\n\t"
      "vpdpbusd %%zmm14, %%zmm12, %%zmm6\n\t"
      "vpdpbusd %%zmm14, %%zmm13, %%zmm7\n\t"
      "vpdpbusd %%zmm14, %%zmm12, %%zmm8\n\t"
      "vpdpbusd %%zmm14, %%zmm13, %%zmm9\n\t"
      "vpdpbusd %%zmm14, %%zmm12, %%zmm10\n\t"
      "vpdpbusd %%zmm14, %%zmm13, %%zmm11\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vzeroupper\n\t"
      : [n] "+r"(n)
      :
      : LOWBIT_ROOF_CLOBBERS);
  return (uint64_t)iters * 12 * 64;
}

}  // namespace lowbit
