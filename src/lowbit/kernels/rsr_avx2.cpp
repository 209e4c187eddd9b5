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


// RSR++ step 2 for one token of a binary index (values 0, 1), in place: each fold reads 8 pairs (2 ymm) and
// writes their 8 sums at u[g] (g <= 2g: never past what is still to be read), the odd entries (digit 1)
// summed into acc. The generic loop (rsr_step2.inc) runs scalar here; at K = 2^14, k = 12 it cost 0.2 ns per
// input (4096 + 2048 + ... entries a block), a third of step 1.
inline __m256 pair_sums(__m256 a, __m256 b) {  // [a0+a1, ..., a6+a7, b0+b1, ..., b6+b7]
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_hadd_ps(a, b)), 0xD8));
}
inline __m256 odd_entries(__m256 a, __m256 b) { return _mm256_shuffle_ps(a, b, 0xDD); }  // [a1, a3, b1, b3, ...]
inline __m256i pair_sums(__m256i a, __m256i b) { return _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8); }
inline __m256i odd_entries(__m256i a, __m256i b) {
  return _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), 0xDD));
}
inline float hsum(__m256 v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
inline int32_t hsum(__m256i v) {
  alignas(32) int32_t t[8];
  _mm256_store_si256((__m256i*)t, v);
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
template <typename T, typename V>
inline V loadv(const T* p) {
  if constexpr (std::is_same_v<T, float>) return _mm256_loadu_ps(p);
  else return _mm256_loadu_si256((const __m256i*)p);
}
template <typename T, typename V>
inline void storev(T* p, V v) {
  if constexpr (std::is_same_v<T, float>) _mm256_storeu_ps(p, v);
  else _mm256_storeu_si256((__m256i*)p, v);
}
inline __m256 addv(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
inline __m256i addv(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }

template <typename T, typename V>
void step2_binary_one(const RsrIndex& ix, T* u, T* r) {
  int64_t s = ix.S;
  for (int64_t c = ix.k - 1; c >= 0; --c) {
    const int64_t groups = s / 2;
    V acc = V{};
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
      const V a = loadv<T, V>(u + 2 * g), b = loadv<T, V>(u + 2 * g + 8);
      acc = addv(acc, odd_entries(a, b));
      storev<T, V>(u + g, pair_sums(a, b));
    }
    T tail = 0;
    for (; g < groups; ++g) {
      tail += u[2 * g + 1];
      u[g] = u[2 * g] + u[2 * g + 1];
    }
    r[c] = hsum(acc) + tail;
    s = groups;
  }
}

template <typename T>
bool binary_unit(const RsrIndex& ix, const T* vals) { return ix.base == 2 && vals[0] == 0 && vals[1] == 1; }

template <typename P>
void step1_f32_any(const RsrIndex& ix, int64_t blk, const float* xT, int64_t ldx, int nt, float* u, float* c) {
  switch (nt) {
    case 1: return step1_gemv<P>(ix, blk, xT, u, c);
    case 8: return step1_f32<P, 1>(ix, blk, xT, ldx, u);
    case 16: return step1_f32<P, 2>(ix, blk, xT, ldx, u);
    case 24: return step1_f32<P, 3>(ix, blk, xT, ldx, u);
    case 32: return step1_f32<P, 4>(ix, blk, xT, ldx, u);
    case 40: return step1_f32<P, 5>(ix, blk, xT, ldx, u);
    case 48: return step1_f32<P, 6>(ix, blk, xT, ldx, u);
    case 56: return step1_f32<P, 7>(ix, blk, xT, ldx, u);
    default: return step1_f32<P, 8>(ix, blk, xT, ldx, u);
  }
}

template <typename P>
void step1_i8_any(const RsrIndex& ix, int64_t blk, const int8_t* xT, int64_t ldx, int nt, int32_t* u, int32_t* c) {
  switch (nt) {
    case 1: return step1_gemv<P>(ix, blk, xT, u, c);
    case 16: return step1_i8<P, 1>(ix, blk, xT, ldx, u);
    case 32: return step1_i8<P, 2>(ix, blk, xT, ldx, u);
    case 48: return step1_i8<P, 3>(ix, blk, xT, ldx, u);
    case 64: return step1_i8<P, 4>(ix, blk, xT, ldx, u);
    case 80: return step1_i8<P, 5>(ix, blk, xT, ldx, u);
    case 96: return step1_i8<P, 6>(ix, blk, xT, ldx, u);
    case 112: return step1_i8<P, 7>(ix, blk, xT, ldx, u);
    default: return step1_i8<P, 8>(ix, blk, xT, ldx, u);
  }
}

void block_f32(const RsrIndex& ix, int64_t blk, const float* xT, int64_t ldx, int nt, bool plus, float* u, float* r, float* c) {
  if (ix.perm32) step1_f32_any<uint32_t>(ix, blk, xT, ldx, nt, u, c);
  else step1_f32_any<uint16_t>(ix, blk, xT, ldx, nt, u, c);
  if (nt == 1 && plus && binary_unit(ix, ix.valf)) return step2_binary_one<float, __m256>(ix, u, r);
  step2<float>(ix, ix.valf, u, nt, plus, r);
}

void block_i8(const RsrIndex& ix, int64_t blk, const int8_t* xT, int64_t ldx, int nt, bool plus, int32_t* u,
              int32_t* r, int32_t* c) {
  if (ix.perm32) step1_i8_any<uint32_t>(ix, blk, xT, ldx, nt, u, c);
  else step1_i8_any<uint16_t>(ix, blk, xT, ldx, nt, u, c);
  if (nt == 1 && plus && binary_unit(ix, ix.vali)) return step2_binary_one<int32_t, __m256i>(ix, u, r);
  step2<int32_t>(ix, ix.vali, u, nt, plus, r);
}

}  // namespace

const RsrKernels rsr_kernels_avx2{"avx2", block_f32, block_i8};

}  // namespace lowbit
