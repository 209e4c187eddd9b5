// Plain C++ twins of the SIMD kernels: the fallback on CPUs without AVX2, and a second reference.
#include <algorithm>
#include <vector>

#include "common.h"

#define LOWBIT_OPS_NS ops_scalar
#include "ops.inc"

namespace lowbit::ops_scalar {
void f16_to_f32_row(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}
}  // namespace lowbit::ops_scalar

namespace lowbit {
namespace {

void gemm_int_scalar(const IntWeights& w, const ActQ& a, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  const int bits = w.bits, per = 8 / bits;
  const int64_t kc = w.kc(), nch = w.nch();
  const uint32_t mask = (1u << bits) - 1;
  std::vector<int32_t> dot(kRowBlock);
  std::vector<float> acc(kRowBlock);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const uint8_t* wb = w.codes + blk * nch * 256;
    for (int64_t n = 0; n < a.N; ++n) {
      const int8_t* q = a.q + n * a.Kp;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t g = 0; g < w.G; ++g) {
        const int64_t c0 = g * w.group / kc, c1 = std::min((g + 1) * w.group, w.Kp) / kc;
        std::fill(dot.begin(), dot.end(), 0);
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t* chunk = wb + c * 256;
          const int8_t* qc = q + c * kc;
          for (int t = 0; t < 4; ++t)
            for (int p = 0; p < 64; ++p) {
              const uint32_t byte = chunk[t * 64 + p];
              int32_t s = 0;
              for (int j = 0; j < per; ++j) s += (int32_t)((byte >> (j * bits)) & mask) * qc[4 * j + p % 4];
              dot[t * 16 + p / 4] += s;
            }
        }
        const float sx = a.scale[n * a.G + g];
        const float sq = (float)a.sum[n * a.G + g];
        const uint16_t* sc = w.scale + (blk * w.G + g) * kRowBlock;
        const uint16_t* of = w.offset ? w.offset + (blk * w.G + g) * kRowBlock : nullptr;
        for (int i = 0; i < kRowBlock; ++i) {
          const float s = f16_to_f32(sc[i]);
          const float b = of ? f16_to_f32(of[i]) : -s * w.zc;
          acc[i] += sx * (s * (float)dot[i] + b * sq);
        }
      }
      const int64_t rows = std::min<int64_t>(kRowBlock, w.M - blk * kRowBlock);
      for (int64_t i = 0; i < rows; ++i) y[n * ldy + blk * kRowBlock + i] = acc[i];
    }
  }
}

template <typename T, float (*cvt)(T)>
void gemm_float_scalar(const FloatWeights& w, const float* x, int64_t N, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  const T* W = static_cast<const T*>(w.w);
  for (int64_t m = b0 * kFloatRows; m < std::min(b1 * kFloatRows, w.M); ++m)
    for (int64_t n = 0; n < N; ++n) {
      float s = 0.f;
      const T* wr = W + m * w.K;
      const float* xr = x + n * w.K;
      for (int64_t k = 0; k < w.K; ++k) s += cvt(wr[k]) * xr[k];
      y[n * ldy + m] = s;
    }
}

float ident(float v) { return v; }

uint64_t read_scalar(const uint8_t* p, int64_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (int64_t i = 0; i < n; i += 32) {
    uint64_t v[4];
    std::memcpy(v, p + i, 32);
    a0 += v[0]; a1 += v[1]; a2 += v[2]; a3 += v[3];
  }
  return a0 + a1 + a2 + a3;
}

}  // namespace

const KernelTable& kernels_scalar() {
  static const KernelTable t{"scalar", gemm_int_scalar, gemm_float_scalar<float, ident>,
                             gemm_float_scalar<uint16_t, bf16_to_f32>, read_scalar, nullptr, nullptr,
                             ops_scalar::table()};
  return t;
}

}  // namespace lowbit
