// AVX2 + F16C build of the quantizer rows (the loops vectorize; no FMA: -ffp-contract=off keeps numpy's
// rounding). float16 sources widen with vcvtph2ps, exact like the scalar f16_to_f32.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "quantize.h"

namespace lowbit {
namespace quant_avx2 {

static void load_f16(const void* src, int64_t K, float* dst) {
  const uint16_t* s = (const uint16_t*)src;
  int64_t i = 0;
  for (; i + 8 <= K; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + i))));
  for (; i < K; ++i) dst[i] = f16_to_f32(s[i]);
}

// numpy's pairwise summation: its 8 accumulators are one ymm register
static float pairwise_sum(const float* a, int64_t n) {
  if (n < 8) {
    float res = 0.f;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    __m256 r = _mm256_loadu_ps(a);
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8) r = _mm256_add_ps(r, _mm256_loadu_ps(a + i));
    alignas(32) float t[8];
    _mm256_store_ps(t, r);
    float res = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

// np.rint: the 1.5 * 2^23 trick where |x| < 2^22 (larger floats are integers already)
static inline __m256 round_even8(__m256 x) {
  const __m256 magic = _mm256_set1_ps(12582912.0f), lim = _mm256_set1_ps(4194304.0f);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 y = _mm256_sub_ps(_mm256_add_ps(x, magic), magic);
  return _mm256_blendv_ps(x, y, _mm256_cmp_ps(_mm256_and_ps(x, absmask), lim, _CMP_LT_OQ));
}

static inline float round_even(float x) {
  const float magic = 12582912.0f;
  const float y = (x + magic) - magic;
  return std::fabs(x) < 4194304.0f ? y : x;
}

static inline float hmin8(__m256 v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  float m = t[0];
  for (int j = 1; j < 8; ++j) m = std::min(m, t[j]);
  return m;
}

static inline float hmax8(__m256 v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  float m = t[0];
  for (int j = 1; j < 8; ++j) m = std::max(m, t[j]);
  return m;
}

static void minmax(const float* x, int64_t n, float* lo, float* hi) {  // n: a multiple of 8
  __m256 l = _mm256_loadu_ps(x), h = l;
  for (int64_t i = 8; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    l = _mm256_min_ps(l, v);
    h = _mm256_max_ps(h, v);
  }
  *lo = hmin8(l);
  *hi = hmax8(h);
}

static float absmax(const float* x, int64_t n) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
  return hmax8(m);
}

static void int8_pass(const float* x, int64_t n, float inv, uint8_t* c) {
  const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  const __m256 off = _mm256_set1_ps(128.f);
  for (int64_t i = 0; i < n; i += 8) {
    __m256 q = round_even8(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
    q = _mm256_add_ps(_mm256_min_ps(_mm256_max_ps(q, lo), hi), off);
    const __m256i v = _mm256_cvttps_epi32(q);  // 1..255: exact integers
    const __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i*)(c + i), _mm_packus_epi16(p16, p16));
  }
}

static inline __m256 affine_sq_err(__m256 v, __m256 va, __m256 vb, __m256 vinv, __m256 vtop) {
  __m256 c = round_even8(_mm256_mul_ps(_mm256_sub_ps(v, vb), vinv));
  c = _mm256_min_ps(_mm256_max_ps(c, _mm256_setzero_ps()), vtop);
  const __m256 t = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(c, va), vb), v);
  return _mm256_mul_ps(t, t);
}

static float affine_err(const float* x, int64_t n, float a, float b, float inv, float top, float* e) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vinv = _mm256_set1_ps(inv), vtop = _mm256_set1_ps(top);
  if (n <= 128) {  // numpy's 8 pairwise accumulators, kept in a register
    __m256 r = affine_sq_err(_mm256_loadu_ps(x), va, vb, vinv, vtop);
    for (int64_t i = 8; i < n; i += 8) r = _mm256_add_ps(r, affine_sq_err(_mm256_loadu_ps(x + i), va, vb, vinv, vtop));
    alignas(32) float t[8];
    _mm256_store_ps(t, r);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  }
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(e + i, affine_sq_err(_mm256_loadu_ps(x + i), va, vb, vinv, vtop));
  return pairwise_sum(e, n);
}

static void affine_codes(const float* x, int64_t n, float b, float inv, float top, uint8_t* codes) {
  const __m256 vb = _mm256_set1_ps(b), vinv = _mm256_set1_ps(inv), vtop = _mm256_set1_ps(top);
  for (int64_t i = 0; i < n; i += 8) {
    __m256 c = round_even8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vb), vinv));
    c = _mm256_min_ps(_mm256_max_ps(c, _mm256_setzero_ps()), vtop);
    const __m256i v = _mm256_cvttps_epi32(c);
    const __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i*)(codes + i), _mm_packus_epi16(p16, p16));
  }
}

#include "quantize_rows.inc"

}  // namespace quant_avx2

const QuantRowKernels& quant_kernels_avx2() { return quant_avx2::table; }

}  // namespace lowbit
