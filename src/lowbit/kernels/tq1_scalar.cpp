// tq1 in plain C++: the fallback on CPUs without AVX2 and the reference twin of the SIMD paths
// (layout in tq1.h).
#include <algorithm>
#include <vector>

#include "tq1.h"

namespace lowbit {

void tq1_gemm_scalar(const TQ1Weights& w, const ActQ& a, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  const int64_t nch = w.nch();
  std::vector<int32_t> dot(kRowBlock);
  std::vector<float> acc(kRowBlock);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const uint8_t* wb = w.codes + blk * nch * kTq1ChunkBytes;
    for (int64_t n = 0; n < a.N; ++n) {
      const int8_t* q = a.q + n * a.Kp;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t g = 0; g < w.G; ++g) {
        const int64_t c0 = g * w.group / kTq1KC, c1 = std::min((g + 1) * w.group, w.Kp) / kTq1KC;
        std::fill(dot.begin(), dot.end(), 0);
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t* chunk = wb + c * kTq1ChunkBytes;
          const int8_t* qc = q + c * kTq1KC;
          for (int t = 0; t < 4; ++t)
            for (int p = 0; p < 64; ++p) {
              const uint32_t byte = chunk[t * 64 + p];
              int32_t s = 0;
              for (int j = 0; j < 5; ++j) s += (int32_t)tq1_digit(byte, j) * qc[4 * j + p % 4];
              dot[t * 16 + p / 4] += s;
            }
        }
        const float sx = a.scale[n * a.G + g];
        const float sq = (float)a.sum[n * a.G + g];
        const uint16_t* sc = w.scale + (blk * w.G + g) * kRowBlock;
        for (int i = 0; i < kRowBlock; ++i) {
          const float s = f16_to_f32(sc[i]);
          acc[i] += sx * (s * (float)dot[i] - s * sq);
        }
      }
      const int64_t rows = std::min<int64_t>(kRowBlock, w.M - blk * kRowBlock);
      for (int64_t i = 0; i < rows; ++i) y[n * ldy + blk * kRowBlock + i] = acc[i];
    }
  }
}

}  // namespace lowbit
