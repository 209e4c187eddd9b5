// RSR / RSR++ with AVX-512: step 1 over token tiles in zmm registers (16 floats, or 32 int8 widened to int16 per
// load: a gathered row of the 64-token int8 tile is two vpmovsxbw + vpaddw instead of AVX2's four), step 2 and the
// one-token GEMV from rsr_step2.inc compiled for AVX-512, the block kernels from rsr_block_avx.inc. Layout in rsr.h.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "rsr.h"

namespace lowbit {
namespace {

#include "rsr_step2.inc"

// nt = 8 E tokens of floats: E / 2 zmm and a ymm for an odd E. Rows of a segment alternate between two
// accumulator sets when there are few vectors, so the add latency does not bound the loop.
template <typename P, int E>
void step1_f32(const RsrIndex& ix, int64_t blk, const float* xT, int64_t ldx, float* u) {
  constexpr int NT = 8 * E, NZ = E / 2;
  constexpr bool Y = E % 2;
  constexpr int SETS = NZ + Y < 3 ? 2 : 1;
  const P* perm = static_cast<const P*>(ix.perm) + blk * ix.K;
  int64_t l = ix.seg_at(blk, 0);
  for (int64_t p = 0; p < ix.S; ++p) {
    const int64_t e = ix.seg_at(blk, p + 1);
    __m512 acc[SETS][NZ > 0 ? NZ : 1];
    __m256 accy[SETS];
    for (int s = 0; s < SETS; ++s) {
      for (int v = 0; v < NZ; ++v) acc[s][v] = _mm512_setzero_ps();
      accy[s] = _mm256_setzero_ps();
    }
    auto add_row = [&](int s, int64_t at) {
      const float* row = xT + (int64_t)perm[at] * ldx;
      for (int v = 0; v < NZ; ++v) acc[s][v] = _mm512_add_ps(acc[s][v], _mm512_loadu_ps(row + 16 * v));
      if constexpr (Y) accy[s] = _mm256_add_ps(accy[s], _mm256_loadu_ps(row + 16 * NZ));
    };
    for (; l + SETS <= e; l += SETS)
      for (int s = 0; s < SETS; ++s) add_row(s, l + s);
    for (; l < e; ++l) add_row(0, l);
    for (int v = 0; v < NZ; ++v)
      _mm512_storeu_ps(u + p * NT + 16 * v, SETS == 2 ? _mm512_add_ps(acc[0][v], acc[SETS - 1][v]) : acc[0][v]);
    if constexpr (Y) _mm256_storeu_ps(u + p * NT + 16 * NZ, SETS == 2 ? _mm256_add_ps(accy[0], accy[SETS - 1]) : accy[0]);
  }
}

// nt = 16 H tokens of int8: H / 2 zmm of int16 (32 tokens, vpmovsxbw straight from memory) and a ymm for an odd
// H; every kI16Rows rows (or at the segment's end) the int16 sums widen into int32 (bound in rsr.h).
template <typename P, int H>
void step1_i8(const RsrIndex& ix, int64_t blk, const int8_t* xT, int64_t ldx, int32_t* u) {
  constexpr int NT = 16 * H, NZ = H / 2;
  constexpr bool Y = H % 2;
  const P* perm = static_cast<const P*>(ix.perm) + blk * ix.K;
  int64_t l = ix.seg_at(blk, 0);
  for (int64_t p = 0; p < ix.S; ++p) {
    const int64_t e = ix.seg_at(blk, p + 1);
    __m512i acc32[2 * NZ + 1];  // zmm v's tokens 32v..32v+15 in 2v, 32v+16.. in 2v+1; the ymm's 16 in 2 NZ
    for (int v = 0; v < 2 * NZ + 1; ++v) acc32[v] = _mm512_setzero_si512();
    while (l < e) {
      const int64_t stop = std::min<int64_t>(e, l + kI16Rows);
      __m512i a16[NZ > 0 ? NZ : 1];
      for (int v = 0; v < NZ; ++v) a16[v] = _mm512_setzero_si512();
      __m256i a16y = _mm256_setzero_si256();
      for (; l < stop; ++l) {
        const int8_t* row = xT + (int64_t)perm[l] * ldx;
        for (int v = 0; v < NZ; ++v)
          a16[v] = _mm512_add_epi16(a16[v], _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(row + 32 * v))));
        if constexpr (Y) a16y = _mm256_add_epi16(a16y, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(row + 32 * NZ))));
      }
      for (int v = 0; v < NZ; ++v) {
        acc32[2 * v] = _mm512_add_epi32(acc32[2 * v], _mm512_cvtepi16_epi32(_mm512_castsi512_si256(a16[v])));
        acc32[2 * v + 1] = _mm512_add_epi32(acc32[2 * v + 1], _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(a16[v], 1)));
      }
      if constexpr (Y) acc32[2 * NZ] = _mm512_add_epi32(acc32[2 * NZ], _mm512_cvtepi16_epi32(a16y));
    }
    for (int v = 0; v < 2 * NZ + (Y ? 1 : 0); ++v) _mm512_storeu_si512(u + p * NT + 16 * v, acc32[v]);
  }
}

#include "rsr_block_avx.inc"

}  // namespace

const RsrKernels rsr_kernels_avx512{"avx512", block_f32, block_i8};

}  // namespace lowbit
