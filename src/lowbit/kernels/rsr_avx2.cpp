// RSR / RSR++ with AVX2: step 1 over token tiles in ymm registers (8 floats, or 16 int8 widened to int16
// per load), step 2 and the one-token GEMV from rsr_step2.inc compiled for AVX2. Layout in rsr.h.
// The one-token step 1 stays scalar: an 8-wide vpgatherdd/vgatherdps prefix scan measured 1.6x slower
// than the scalar prefix loop on this AMD EPYC (CPU time, 1 thread, 2560x2560 ternary, k = 2..5).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "rsr.h"

namespace lowbit {
namespace {

#include "rsr_step2.inc"

// NV ymm of floats per row (nt = 8 NV). Rows of a segment alternate between two accumulator sets when
// NV is small, so the add latency (3-4 cycles) does not bound the loop.
template <typename P, int NV>
void step1_f32(const RsrIndex& ix, int64_t blk, const float* xT, int64_t ldx, float* u) {
  constexpr int NT = 8 * NV;
  constexpr int SETS = NV < 4 ? 2 : 1;
  const P* perm = static_cast<const P*>(ix.perm) + blk * ix.K;
  int64_t l = ix.seg_at(blk, 0);
  for (int64_t p = 0; p < ix.S; ++p) {
    const int64_t e = ix.seg_at(blk, p + 1);
    __m256 acc[SETS][NV];
    for (int s = 0; s < SETS; ++s)
      for (int v = 0; v < NV; ++v) acc[s][v] = _mm256_setzero_ps();
    for (; l + SETS <= e; l += SETS)
      for (int s = 0; s < SETS; ++s) {
        const float* row = xT + (int64_t)perm[l + s] * ldx;
        for (int v = 0; v < NV; ++v) acc[s][v] = _mm256_add_ps(acc[s][v], _mm256_loadu_ps(row + 8 * v));
      }
    for (; l < e; ++l) {
      const float* row = xT + (int64_t)perm[l] * ldx;
      for (int v = 0; v < NV; ++v) acc[0][v] = _mm256_add_ps(acc[0][v], _mm256_loadu_ps(row + 8 * v));
    }
    for (int v = 0; v < NV; ++v) {
      __m256 a = acc[0][v];
      if (SETS == 2) a = _mm256_add_ps(a, acc[SETS - 1][v]);
      _mm256_storeu_ps(u + p * NT + 8 * v, a);
    }
  }
}

// NV ymm of int16 per row (nt = 16 NV): vpmovsxbw straight from memory, vpaddw; every kI16Rows rows
// (or at the segment's end) the int16 sums widen into int32 (bound in rsr.h).
template <typename P, int NV>
void step1_i8(const RsrIndex& ix, int64_t blk, const int8_t* xT, int64_t ldx, int32_t* u) {
  constexpr int NT = 16 * NV;
  const P* perm = static_cast<const P*>(ix.perm) + blk * ix.K;
  int64_t l = ix.seg_at(blk, 0);
  for (int64_t p = 0; p < ix.S; ++p) {
    const int64_t e = ix.seg_at(blk, p + 1);
    __m256i acc32[2 * NV];
    for (int v = 0; v < 2 * NV; ++v) acc32[v] = _mm256_setzero_si256();
    while (l < e) {
      const int64_t stop = std::min<int64_t>(e, l + kI16Rows);
      __m256i a16[NV];
      for (int v = 0; v < NV; ++v) a16[v] = _mm256_setzero_si256();
      for (; l < stop; ++l) {
        const int8_t* row = xT + (int64_t)perm[l] * ldx;
        for (int v = 0; v < NV; ++v)
          a16[v] = _mm256_add_epi16(a16[v], _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(row + 16 * v))));
      }
      for (int v = 0; v < NV; ++v) {
        acc32[2 * v] = _mm256_add_epi32(acc32[2 * v], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a16[v])));
        acc32[2 * v + 1] = _mm256_add_epi32(acc32[2 * v + 1], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a16[v], 1)));
      }
    }
    for (int v = 0; v < 2 * NV; ++v) _mm256_storeu_si256((__m256i*)(u + p * NT + 8 * v), acc32[v]);
  }
}


#include "rsr_block_avx.inc"

}  // namespace

const RsrKernels rsr_kernels_avx2{"avx2", block_f32, block_i8};

}  // namespace lowbit
