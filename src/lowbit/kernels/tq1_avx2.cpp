// tq1 with AVX2 (no VNNI, no byte lookups wider than 16): the path for "avx2", "avxvnni" and AVX-512
// CPUs without VBMI. Layout in tq1.h; a tile's 32-byte halves are rows 0-7 and 8-15.
//
// Decode without multiplies: with y = byte ^ 0x80 (the byte biased into a signed compare's range),
//     digit j = (x_j >= 86) + (x_j >= 171) = (y_j > -43) + (y_j > 42)   where x_j = (uint8)(byte * 3^j),
//     y_{j+1} = 3 * y_j mod 256   (3 * 128 = 128 mod 256, so the bias survives the step: two vpaddb).
// cmpgt gives -1 per true lane, so digit = |m1 + m2|. Codes (u8 0..2) x int8 activations go through
// vpmaddubsw summed in s16 over one chunk (|5 digits x 2 x 2 x 127| < 2^15), then vpmaddwd with ones.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "tq1.h"

namespace lowbit {
namespace {


inline __m256 cvt_f16x8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Tiles [t0, t0 + TILES) of one row block x NT tokens.
template <int NT, int TILES>
inline void block(const TQ1Weights& w, const ActQ& a, int64_t blk, int t0, int64_t n0, float* y, int64_t ldy) {
  constexpr int H = 2 * TILES;  // half tiles of 8 rows
  const uint8_t* wb = w.codes + blk * w.nch() * kTq1ChunkBytes + t0 * 64;
  const uint8_t* last = w.codes + (w.Mb * w.nch() - 1) * kTq1ChunkBytes;
  const __m256i bias = _mm256_set1_epi8((char)0x80), t1 = _mm256_set1_epi8(-43), t2 = _mm256_set1_epi8(42);
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 accf[NT][H];
  for (int n = 0; n < NT; ++n)
    for (int h = 0; h < H; ++h) accf[n][h] = _mm256_setzero_ps();

  for (int64_t g = 0; g < w.G; ++g) {
    const int64_t c0 = g * w.group / kTq1KC, c1 = std::min((g + 1) * w.group, w.Kp) / kTq1KC;
    __m256i acc[NT][H];
    for (int n = 0; n < NT; ++n)
      for (int h = 0; h < H; ++h) acc[n][h] = _mm256_setzero_si256();
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t* chunk = wb + c * kTq1ChunkBytes;
      if (TILES == 4)
        for (int l = 0; l < kTq1ChunkBytes; l += 64) _mm_prefetch(prefetch_target(chunk, last) + l, _MM_HINT_T0);
      const int8_t* qc = a.q + n0 * a.Kp + c * kTq1KC;
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        __m256i yv = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(chunk + (h / 2) * 64 + (h % 2) * 32)), bias);
        __m256i s16[NT];
        for (int n = 0; n < NT; ++n) s16[n] = _mm256_setzero_si256();
#pragma GCC unroll 5
        for (int j = 0; j < 5; ++j) {
          const __m256i d = _mm256_abs_epi8(_mm256_add_epi8(_mm256_cmpgt_epi8(yv, t1), _mm256_cmpgt_epi8(yv, t2)));
          if (j < 4) yv = _mm256_add_epi8(yv, _mm256_add_epi8(yv, yv));
#pragma GCC unroll 4
          for (int n = 0; n < NT; ++n)
            s16[n] = _mm256_add_epi16(s16[n], _mm256_maddubs_epi16(d, bcast4(qc + n * a.Kp + 4 * j)));
        }
        for (int n = 0; n < NT; ++n) acc[n][h] = _mm256_add_epi32(acc[n][h], _mm256_madd_epi16(s16[n], ones16));
      }
    }
    const uint16_t* sc = w.scale + (blk * w.G + g) * kRowBlock + t0 * 16;
    for (int h = 0; h < H; ++h) {
      const __m256 s = cvt_f16x8(sc + 8 * h);
      const __m256 b = _mm256_sub_ps(_mm256_setzero_ps(), s);
      for (int n = 0; n < NT; ++n) {
        const int64_t ag = (n0 + n) * a.G + g;
        const __m256 r = _mm256_fmadd_ps(b, _mm256_set1_ps((float)a.sum[ag]), _mm256_mul_ps(s, _mm256_cvtepi32_ps(acc[n][h])));
        accf[n][h] = _mm256_fmadd_ps(_mm256_set1_ps(a.scale[ag]), r, accf[n][h]);
      }
    }
  }
  for (int h = 0; h < H; ++h) {
    const int64_t row = blk * kRowBlock + t0 * 16 + 8 * h;
    if (row >= w.M) break;
    const int64_t rows = std::min<int64_t>(8, w.M - row);
    for (int n = 0; n < NT; ++n) {
      float* dst = y + (n0 + n) * ldy + row;
      if (rows == 8) {
        _mm256_storeu_ps(dst, accf[n][h]);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, accf[n][h]);
        std::copy(tmp, tmp + rows, dst);
      }
    }
  }
}

}  // namespace

void tq1_gemm_avx2(const TQ1Weights& w, const ActQ& a, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  for (int64_t blk = b0; blk < b1; ++blk) {
    if (a.N == 1) {
      block<1, 4>(w, a, blk, 0, 0, y, ldy);
      continue;
    }
    // Several tokens: one tile (16 rows) at a time, each decoded code vector feeds up to 4 tokens.
    for (int t = 0; t < 4 && blk * kRowBlock + 16 * t < w.M; ++t) {
      int64_t n = 0;
      for (; n + 4 <= a.N; n += 4) block<4, 1>(w, a, blk, t, n, y, ldy);
      switch (a.N - n) {
        case 3: block<3, 1>(w, a, blk, t, n, y, ldy); break;
        case 2: block<2, 1>(w, a, blk, t, n, y, ldy); break;
        case 1: block<1, 1>(w, a, blk, t, n, y, ldy); break;
        default: break;
      }
    }
  }
}

}  // namespace lowbit
