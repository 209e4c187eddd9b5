// rsr-lut with AVX-512BW: the AVX2 kernel's lookups two chunks at a time, one chunk in each 256-bit half of a zmm
// (vpshufb looks up within each 128-bit lane, so lanes 0-1 take chunk c's table and lanes 2-3 chunk c + 1's):
// 2 x 64 rows x 4 inputs per plane in 4 vpshufb + 4 vpunpck + 4 vpaddw. The halves hold the same rows and are
// added when a span's int16 sums widen to int32 (layout and the int16 bound in rsr_lut.h).
#include <immintrin.h>

#include <algorithm>

#include "common.h"
#include "rsr_lut.h"

namespace lowbit {
namespace {

// chunk c's and c + 1's 32 code bytes of plane pl (zero past K4: pattern 0 looks up T[0] = 0)
template <int PLANES>
inline __m512i codes2(const uint8_t* wt, int64_t c, int64_t K4, int pl) {
  const uint8_t* a = wt + (c * PLANES + pl) * 32;
  const bool two = c + 1 < K4;
  if constexpr (PLANES == 1) return two ? _mm512_loadu_si512(a) : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)a));
  const __m256i lo = _mm256_loadu_si256((const __m256i*)a);
  const __m256i hi = two ? _mm256_loadu_si256((const __m256i*)(a + PLANES * 32)) : _mm256_setzero_si256();
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

template <int PLANES>
void tile_n(const uint8_t* wt, const int8_t* tab, int64_t K4, const LutPlanes& p, int32_t* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const uint8_t* last = wt + (K4 * PLANES - 1) * 32;
  // each half adds every other chunk, so twice lut_span's chunks keep every int16 lane within its bound
  const int64_t span = 2 * lut_span(p);
  __m512i acc32[4];
  for (int i = 0; i < 4; ++i) acc32[i] = _mm512_setzero_si512();
  for (int64_t c0 = 0; c0 < K4; c0 += span) {
    const int64_t c1 = std::min(K4, c0 + span);
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int64_t c = c0; c < c1; c += 2) {
      // [low c | high c | low c+1 | high c+1] -> tl = [low c, low c, low c+1, low c+1], th likewise
      const __m512i T = c + 1 < K4 ? _mm512_loadu_si512(tab + c * 32)
                                   : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)(tab + c * 32)));
      const __m512i tl = _mm512_shuffle_i64x2(T, T, 0xA0), th = _mm512_shuffle_i64x2(T, T, 0xF5);
      // the tile's codes are one stream of K4 * PLANES * 32 bytes: kPrefetchBytes ahead, a line per 64 bytes
      for (int pl = 0; pl < PLANES; ++pl) _mm_prefetch(prefetch_target(wt + (c * PLANES + pl) * 32, last), _MM_HINT_T0);
      for (int pl = 0; pl < PLANES; ++pl) {
        const __m512i v = codes2<PLANES>(wt, c, K4, pl);
        const __m512i i0 = _mm512_and_si512(v, low4);                        // rows 0..31 (each half)
        const __m512i i1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);  // rows 32..63
        const __m512i l0 = _mm512_shuffle_epi8(tl, i0), h0 = _mm512_shuffle_epi8(th, i0);
        const __m512i l1 = _mm512_shuffle_epi8(tl, i1), h1 = _mm512_shuffle_epi8(th, i1);
        __m512i e[4] = {_mm512_unpacklo_epi8(l0, h0),   // per half: rows 0-7 | 16-23
                        _mm512_unpackhi_epi8(l0, h0),   // rows 8-15 | 24-31
                        _mm512_unpacklo_epi8(l1, h1),   // rows 32-39 | 48-55
                        _mm512_unpackhi_epi8(l1, h1)};  // rows 40-47 | 56-63
        const int s = p.shift[pl];
        for (int i = 0; i < 4; ++i) {
          const __m512i t = s ? _mm512_slli_epi16(e[i], s) : e[i];
          a[i] = p.neg[pl] ? _mm512_sub_epi16(a[i], t) : _mm512_add_epi16(a[i], t);
        }
      }
    }
    // widen: lane l of a[i] (l = 0, 1 chunk c's half; 2, 3 chunk c + 1's) -> int32, the halves added
    for (int i = 0; i < 4; ++i) {
      const __m512i w0 = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(a[i]));       // lanes 0-1: rows as AVX2's a[i]
      const __m512i w1 = _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(a[i], 1));  // lanes 2-3: the same rows
      acc32[i] = _mm512_add_epi32(acc32[i], _mm512_add_epi32(w0, w1));
    }
  }
  // acc32[i]: 16 int32 = the AVX2 kernel's a[i] widened: first 8 = low 128-bit lane's rows, next 8 the high lane's
  static const int first_row[4][2] = {{0, 16}, {8, 24}, {32, 48}, {40, 56}};
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_si256((__m256i*)(out + first_row[i][0]), _mm512_castsi512_si256(acc32[i]));
    _mm256_storeu_si256((__m256i*)(out + first_row[i][1]), _mm512_extracti64x4_epi64(acc32[i], 1));
  }
}

void tile(const uint8_t* wt, const int8_t* tab, int64_t K4, const LutPlanes& p, int32_t* out) {
  lut_with_planes(p.planes, [&](auto n) { tile_n<decltype(n)::value>(wt, tab, K4, p, out); });
}

}  // namespace

const LutKernels lut_kernels_avx512{"avx512", tile};

}  // namespace lowbit
