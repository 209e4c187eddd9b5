// The AVX-VNNI int8 roof: vpdpbusd on ymm (VEX; 32 u8 x s8 products into int32), 12 independent chains.
#include <cstdint>

#include "roof.h"

namespace lowbit {

#if defined(__AVXVNNI__)
uint64_t roof_probe_avxvnni(int64_t iters) {
  if (iters <= 0) return 0;
  int64_t n = iters;
  // Written in asm: the compiler would share the identical products or spill the accumulators.
  __asm__ volatile(
      LOWBIT_ROOF_ZERO_ACCUMULATORS
      "vpcmpeqb %%ymm12, %%ymm12, %%ymm12\n\t"
      "vpabsb %%ymm12, %%ymm13\n\t"
      "vpsrlw $1, %%ymm12, %%ymm14\n\t"
      "1:\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm12, %%ymm0\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm13, %%ymm1\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm12, %%ymm2\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm13, %%ymm3\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm12, %%ymm4\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm13, %%ymm5\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm12, %%ymm6\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm13, %%ymm7\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm12, %%ymm8\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm13, %%ymm9\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm12, %%ymm10\n\t"
      "%{vex%} vpdpbusd %%ymm14, %%ymm13, %%ymm11\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vzeroupper\n\t"
      : [n] "+r"(n)
      :
      : LOWBIT_ROOF_CLOBBERS);
  return (uint64_t)iters * 12 * 32;
}
#else
uint64_t roof_probe_avxvnni(int64_t) { return 0; }
#endif

}  // namespace lowbit
