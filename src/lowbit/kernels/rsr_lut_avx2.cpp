// rsr-lut with AVX2: 64 rows x 4 inputs per plane and chunk in 4 vpshufb + 4 vpunpck + 4 vpaddw
// (layout and the int16 bound in rsr_lut.h).
#include <immintrin.h>

#include <algorithm>

#include "common.h"
#include "rsr_lut.h"

namespace lowbit {
namespace {

template <int PLANES>
void tile_n(const uint8_t* wt, const int8_t* tab, int64_t K4, const LutPlanes& p, int32_t* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const uint8_t* last = wt + (K4 * PLANES - 1) * 32;
  const int64_t span = lut_span(p);
  __m256i acc[8];  // int32, rows in the order of widen() below
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_si256();
  for (int64_t c0 = 0; c0 < K4; c0 += span) {
    const int64_t c1 = std::min(K4, c0 + span);
    __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int64_t c = c0; c < c1; ++c) {
      const __m256i tl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(tab + c * 32)));
      const __m256i th = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(tab + c * 32 + 16)));
      if (!(c & 1))  // the tile's codes are one stream: kPrefetchBytes ahead, a line per 64 bytes
        for (int pl = 0; pl < PLANES; ++pl) _mm_prefetch(prefetch_target(wt + (c * PLANES + pl) * 32, last), _MM_HINT_T0);
      for (int pl = 0; pl < PLANES; ++pl) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(wt + (c * PLANES + pl) * 32));
        const __m256i i0 = _mm256_and_si256(v, low4);                        // rows 0..31
        const __m256i i1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  // rows 32..63
        const __m256i l0 = _mm256_shuffle_epi8(tl, i0), h0 = _mm256_shuffle_epi8(th, i0);
        const __m256i l1 = _mm256_shuffle_epi8(tl, i1), h1 = _mm256_shuffle_epi8(th, i1);
        __m256i e[4] = {_mm256_unpacklo_epi8(l0, h0),   // rows 0-7 | 16-23
                        _mm256_unpackhi_epi8(l0, h0),   // rows 8-15 | 24-31
                        _mm256_unpacklo_epi8(l1, h1),   // rows 32-39 | 48-55
                        _mm256_unpackhi_epi8(l1, h1)};  // rows 40-47 | 56-63
        const int s = p.shift[pl];
        for (int i = 0; i < 4; ++i) {
          const __m256i t = s ? _mm256_slli_epi16(e[i], s) : e[i];
          a[i] = p.neg[pl] ? _mm256_sub_epi16(a[i], t) : _mm256_add_epi16(a[i], t);
        }
      }
    }
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] = _mm256_add_epi32(acc[2 * i], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a[i])));
      acc[2 * i + 1] = _mm256_add_epi32(acc[2 * i + 1], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a[i], 1)));
    }
  }
  // acc[2i] = low lane of a[i], acc[2i+1] = high lane: rows 0-7, 16-23, 8-15, 24-31, 32-39, 48-55, 40-47, 56-63
  static const int first_row[8] = {0, 16, 8, 24, 32, 48, 40, 56};
  for (int i = 0; i < 8; ++i) _mm256_storeu_si256((__m256i*)(out + first_row[i]), acc[i]);
}

void tile(const uint8_t* wt, const int8_t* tab, int64_t K4, const LutPlanes& p, int32_t* out) {
  lut_with_planes(p.planes, [&](auto n) { tile_n<decltype(n)::value>(wt, tab, K4, p, out); });
}

}  // namespace

const LutKernels lut_kernels_avx2{"avx2", tile};

}  // namespace lowbit
