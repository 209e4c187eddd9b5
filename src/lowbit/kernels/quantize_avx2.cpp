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

// float32 rounded to odd from 4 doubles: f16 rounding of it is the double's own nearest-even float16 (24 >= 2*11 + 2
// bits), so two hardware conversions replace f64_to_f16's bit arithmetic
static inline __m128 round_to_odd_ps(__m256d d) {
  const __m128 f = _mm256_cvtpd_ps(d);
  const __m256d back = _mm256_cvtps_pd(f), absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);  // 64-bit masks -> 32-bit
  const __m128i inexact = _mm256_castsi256_si128(
      _mm256_permutevar8x32_epi32(_mm256_castpd_si256(_mm256_cmp_pd(back, d, _CMP_NEQ_UQ)), pick));
  const __m128i above = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
      _mm256_castpd_si256(_mm256_cmp_pd(_mm256_and_pd(back, absmask), _mm256_and_pd(d, absmask), _CMP_GT_OQ)), pick));
  __m128i bits = _mm_add_epi32(_mm_castps_si128(f), above);  // one ulp toward zero where RNE rounded away
  bits = _mm_or_si128(bits, _mm_and_si128(inexact, _mm_set1_epi32(1)));
  return _mm_castsi128_ps(bits);
}

// 8 doubles (lo, hi halves) -> their nearest-even float16 values as float32
static inline __m256 f16_round_pd(__m256d lo, __m256d hi) {
  const __m256 f = _mm256_set_m128(round_to_odd_ps(hi), round_to_odd_ps(lo));
  return _mm256_cvtph_ps(_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static void affine_groups(const float* w, int64_t G, int64_t group, int levels, bool symmetric, const double* ratios,
                          int nratios, uint8_t* codes, float* a, float* b, float* scratch);

// affine_groups with one group per lane, 8 groups at a time (group <= 128, a multiple of 8): the same float
// operations per group as affine_groups (numpy's 8 pairwise accumulators are 8 registers here), so the output is
// bit-identical; remaining groups go there.
static void affine_groups8(const float* w, int64_t G, int64_t group, int levels, bool symmetric, const double* ratios,
                           int nratios, uint8_t* codes, float* a, float* b, float* scratch) {
  const int64_t G8 = group <= 128 && group % 8 == 0 ? G / 8 * 8 : 0;
  alignas(32) float T[128 * 8];  // T[8i + l] = value i of group l
  alignas(32) float ba[8], bb[8], binv[8];
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)group));
  const __m256 vtop = _mm256_set1_ps((float)(levels - 1)), zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256d vhalf = _mm256_set1_pd((levels - 1) / 2.0), vlevels = _mm256_set1_pd((double)(levels - 1));
  for (int64_t g0 = 0; g0 < G8; g0 += 8) {
    const float* x = w + g0 * group;
    __m256 lo = _mm256_set1_ps(INFINITY), hi = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < group; ++i) {
      const __m256 v = _mm256_i32gather_ps(x + i, idx, 4);
      _mm256_store_ps(T + 8 * i, v);
      lo = _mm256_min_ps(lo, v);
      hi = _mm256_max_ps(hi, v);
    }
    lo = _mm256_add_ps(lo, zero);  // +0 for a zero min / max, as affine_groups
    hi = _mm256_add_ps(hi, zero);
    const __m256 amax = _mm256_max_ps(_mm256_and_ps(lo, absmask), _mm256_and_ps(hi, absmask));
    const __m256 span = _mm256_sub_ps(hi, lo);
    __m256 best_err = zero, best_a = zero, best_b = zero, best_inv = zero;
    for (int r = 0; r < nratios; ++r) {
      const __m256d ratio = _mm256_set1_pd(ratios[r]);
      __m256d a_lo, a_hi, b_lo, b_hi;
      if (symmetric) {
        a_lo = _mm256_div_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(amax)), ratio), vhalf);
        a_hi = _mm256_div_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(amax, 1)), ratio), vhalf);
        const __m256d neg = _mm256_set1_pd(-0.0);
        b_lo = _mm256_mul_pd(_mm256_xor_pd(a_lo, neg), vhalf);
        b_hi = _mm256_mul_pd(_mm256_xor_pd(a_hi, neg), vhalf);
      } else {
        a_lo = _mm256_div_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(span)), ratio), vlevels);
        a_hi = _mm256_div_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(span, 1)), ratio), vlevels);
        b_lo = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(lo)), ratio);
        b_hi = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)), ratio);
      }
      const __m256 sa = f16_round_pd(a_lo, a_hi), sb = f16_round_pd(b_lo, b_hi);
      const __m256 inv = _mm256_and_ps(_mm256_div_ps(one, sa), _mm256_cmp_ps(sa, zero, _CMP_GT_OQ));
      __m256 acc[8];
      for (int64_t i = 0; i < group; ++i) {
        const __m256 v = _mm256_load_ps(T + 8 * i);
        __m256 c = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(v, sb), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        c = _mm256_min_ps(_mm256_max_ps(c, zero), vtop);
        const __m256 t = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(c, sa), sb), v);
        const __m256 e = _mm256_mul_ps(t, t);
        acc[i % 8] = i < 8 ? e : _mm256_add_ps(acc[i % 8], e);
      }
      const __m256 err = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])),
                                       _mm256_add_ps(_mm256_add_ps(acc[4], acc[5]), _mm256_add_ps(acc[6], acc[7])));
      const __m256 take = r == 0 ? _mm256_castsi256_ps(_mm256_set1_epi32(-1)) : _mm256_cmp_ps(err, best_err, _CMP_LT_OQ);
      best_err = _mm256_blendv_ps(best_err, err, take);
      best_a = _mm256_blendv_ps(best_a, sa, take);
      best_b = _mm256_blendv_ps(best_b, sb, take);
      best_inv = _mm256_blendv_ps(best_inv, inv, take);
    }
    _mm256_store_ps(ba, best_a);
    _mm256_store_ps(bb, best_b);
    _mm256_store_ps(binv, best_inv);
    for (int l = 0; l < 8; ++l) {
      affine_codes(x + l * group, group, bb[l], binv[l], (float)(levels - 1), codes + (g0 + l) * group);
      a[g0 + l] = ba[l];
      b[g0 + l] = bb[l];
    }
  }
  if (G8 < G)
    affine_groups(w + G8 * group, G - G8, group, levels, symmetric, ratios, nratios, codes + G8 * group, a + G8, b + G8,
                  scratch);
}

#define QUANT_AFFINE_GROUPS affine_groups8
#include "quantize_rows.inc"

}  // namespace quant_avx2

const QuantRowKernels& quant_kernels_avx2() { return quant_avx2::table; }

}  // namespace lowbit
