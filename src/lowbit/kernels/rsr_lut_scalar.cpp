// rsr-lut in plain C++: the fallback without AVX2 and the twin the AVX2 path is tested against.
#include "rsr_lut.h"

namespace lowbit {
namespace {

void tile(const uint8_t* wt, const int8_t* tab, int64_t K4, const LutPlanes& p, int32_t* out) {
  for (int r = 0; r < kLutRows; ++r) out[r] = 0;
  for (int64_t c = 0; c < K4; ++c) {
    const uint8_t* lo = reinterpret_cast<const uint8_t*>(tab + c * 32);
    const int8_t* hi = tab + c * 32 + 16;
    for (int pl = 0; pl < p.planes; ++pl) {
      const uint8_t* b = wt + (c * p.planes + pl) * 32;
      for (int j = 0; j < 32; ++j)
        for (int half = 0; half < 2; ++half) {
          const int nib = half ? b[j] >> 4 : b[j] & 15;
          // the int16 entry from its bytes (the high byte unsigned: shifting a negative int8 is UB before C++20)
          const int32_t t = (int32_t)(int16_t)(uint16_t)(lo[nib] | (uint8_t)hi[nib] << 8) * (1 << p.shift[pl]);
          out[j + 32 * half] += p.neg[pl] ? -t : t;
        }
    }
  }
}

}  // namespace

const LutKernels lut_kernels_scalar{"scalar", tile};

}  // namespace lowbit
