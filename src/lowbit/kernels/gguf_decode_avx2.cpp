// AVX2 + F16C build of the GGUF block decoders: the 32-value types and Q4_K with intrinsics (8 values per
// vcvtdq2ps; products in gguf-py's order, no FMA), the others from gguf_blocks.inc compiled for AVX2.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common.h"
#include "gguf_decode.h"

namespace lowbit {
namespace gguf_avx2 {

#include "gguf_blocks.inc"

static inline float half_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 bytes -> 8 floats (unsigned)
static inline __m256 u8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

// 16 bytes of nibbles -> lo (values 0..15 of the low nibbles) and hi (the high nibbles)
static inline void nibbles(const uint8_t* q, __m128i* lo, __m128i* hi) {
  const __m128i v = _mm_loadu_si128((const __m128i*)q), mask = _mm_set1_epi8(15);
  *lo = _mm_and_si128(v, mask);
  *hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
}

static void avx2_q4_0(const uint8_t* b, int64_t nb, float* y) {
  const __m256i eight = _mm256_set1_epi32(8);
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) {
    const __m256 d = _mm256_set1_ps(half_f16c(b));
    __m128i lo, hi;
    nibbles(b + 2, &lo, &hi);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int p = 0; p < 4; ++p) {
      const __m256 q = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[p]), eight));
      _mm256_storeu_ps(y + 8 * p, _mm256_mul_ps(d, q));
    }
  }
}

static void avx2_q4_1(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 20, y += 32) {
    const __m256 d = _mm256_set1_ps(half_f16c(b)), m = _mm256_set1_ps(half_f16c(b + 2));
    __m128i lo, hi;
    nibbles(b + 4, &lo, &hi);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int p = 0; p < 4; ++p) _mm256_storeu_ps(y + 8 * p, _mm256_add_ps(_mm256_mul_ps(d, u8x8(parts[p])), m));
  }
}

static void avx2_q8_0(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += 32) {
    const __m256 d = _mm256_set1_ps(half_f16c(b));
    for (int p = 0; p < 4; ++p) {
      const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(b + 2 + 8 * p)));
      _mm256_storeu_ps(y + 8 * p, _mm256_mul_ps(_mm256_cvtepi32_ps(v), d));
    }
  }
}

static void avx2_q4_k(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 144, y += 256) {
    const float d = half_f16c(b), dmin = half_f16c(b + 2);
    for (int c = 0; c < 4; ++c) {  // 32 bytes of qs: sub-block 2c (low nibbles) and 2c + 1 (high)
      for (int half = 0; half < 2; ++half) {
        __m128i lo, hi;
        nibbles(b + 16 + 32 * c + 16 * half, &lo, &hi);
        for (int sub = 0; sub < 2; ++sub) {
          int s, m;
          k_scale_min(b + 4, 2 * c + sub, &s, &m);
          const __m256 dd = _mm256_set1_ps(d * (float)s), dm = _mm256_set1_ps(dmin * (float)m);
          const __m128i v = sub ? hi : lo;
          float* o = y + 32 * (2 * c + sub) + 16 * half;
          _mm256_storeu_ps(o, _mm256_sub_ps(_mm256_mul_ps(dd, u8x8(v)), dm));
          _mm256_storeu_ps(o + 8, _mm256_sub_ps(_mm256_mul_ps(dd, u8x8(_mm_srli_si128(v, 8))), dm));
        }
      }
    }
  }
}

}  // namespace gguf_avx2

GGUFRowFn gguf_row_avx2(int type) {
  using namespace gguf_avx2;
  switch (type) {
    case kQ4_0: return avx2_q4_0;
    case kQ4_1: return avx2_q4_1;
    case kQ5_0: return row_q5_0;
    case kQ5_1: return row_q5_1;
    case kQ8_0: return avx2_q8_0;
    case kQ2_K: return row_q2_k;
    case kQ3_K: return row_q3_k;
    case kQ4_K: return avx2_q4_k;
    case kQ5_K: return row_q5_k;
    case kQ6_K: return row_q6_k;
    case kTQ1_0: return row_tq1_0;
    case kTQ2_0: return row_tq2_0;
    default: return nullptr;
  }
}

}  // namespace lowbit
