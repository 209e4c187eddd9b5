// AVX-512 (F, BW, VL, VNNI) kernels. Compiled with those target flags only; dispatch.cpp calls them only
// on CPUs that have them. Also builds the AVX-VNNI ymm kernels EVEX-encoded (kernels_avx256.inc), so the
// 256-bit VNNI path runs and is tested on AVX-512 machines that lack the VEX AVX-VNNI encoding.
#include <immintrin.h>

#include <algorithm>

#include "common.h"

namespace lowbit {
namespace {

constexpr int kPrefetch = 4096;  // bytes ahead in the weight stream (measured: see DESIGN notes)

// One row block (4 tiles of 16 rows) x NT tokens. acc lanes are rows: lane i of tile t = row 16t+i.
template <int BITS, int NT>
inline void block_int(const IntWeights& w, const ActQ& a, int64_t blk, int64_t n0, float* y, int64_t ldy) {
  constexpr int PER = 8 / BITS;
  constexpr int KC = 4 * PER;
  const int64_t nch = w.nch();
  const uint8_t* wb = w.codes + blk * nch * 256;
  const __m512i mask = _mm512_set1_epi8((char)((1 << BITS) - 1));
  __m512 accf[NT][4];
  for (int n = 0; n < NT; ++n)
    for (int t = 0; t < 4; ++t) accf[n][t] = _mm512_setzero_ps();

  for (int64_t g = 0; g < w.G; ++g) {
    const int64_t c0 = g * w.group / KC, c1 = std::min((g + 1) * w.group, w.Kp) / KC;
    __m512i acc[NT][4];
    for (int n = 0; n < NT; ++n)
      for (int t = 0; t < 4; ++t) acc[n][t] = _mm512_setzero_si512();
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t* chunk = wb + c * 256;
      _mm_prefetch((const char*)chunk + kPrefetch, _MM_HINT_T0);
      _mm_prefetch((const char*)chunk + kPrefetch + 64, _MM_HINT_T0);
      _mm_prefetch((const char*)chunk + kPrefetch + 128, _MM_HINT_T0);
      _mm_prefetch((const char*)chunk + kPrefetch + 192, _MM_HINT_T0);
      const int8_t* qc = a.q + n0 * a.Kp + c * KC;
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const __m512i v = _mm512_loadu_si512(chunk + t * 64);
#pragma GCC unroll 8
        for (int j = 0; j < PER; ++j) {
          __m512i code;
          if constexpr (BITS == 8) code = v;
          else if (j == 0) code = _mm512_and_si512(v, mask);
          else code = _mm512_and_si512(_mm512_srli_epi16(v, j * BITS), mask);
#pragma GCC unroll 4
          for (int n = 0; n < NT; ++n) {
            int32_t xq;
            std::memcpy(&xq, qc + n * a.Kp + 4 * j, 4);
            acc[n][t] = _mm512_dpbusd_epi32(acc[n][t], code, _mm512_set1_epi32(xq));
          }
        }
      }
    }
    const uint16_t* sc = w.scale + (blk * w.G + g) * kRowBlock;
    const uint16_t* of = w.offset ? w.offset + (blk * w.G + g) * kRowBlock : nullptr;
    for (int t = 0; t < 4; ++t) {
      const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sc + 16 * t)));
      const __m512 b = of ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(of + 16 * t)))
                          : _mm512_mul_ps(s, _mm512_set1_ps(-w.zc));
      for (int n = 0; n < NT; ++n) {
        const int64_t ag = (n0 + n) * a.G + g;
        const __m512 r = _mm512_fmadd_ps(b, _mm512_set1_ps((float)a.sum[ag]),
                                         _mm512_mul_ps(s, _mm512_cvtepi32_ps(acc[n][t])));
        accf[n][t] = _mm512_fmadd_ps(_mm512_set1_ps(a.scale[ag]), r, accf[n][t]);
      }
    }
  }
  for (int t = 0; t < 4; ++t) {
    const int64_t row = blk * kRowBlock + 16 * t;
    if (row >= w.M) break;
    const int64_t rows = std::min<int64_t>(16, w.M - row);
    const __mmask16 m = rows == 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
    for (int n = 0; n < NT; ++n) _mm512_mask_storeu_ps(y + (n0 + n) * ldy + row, m, accf[n][t]);
  }
}

template <int BITS>
void gemm_int_bits(const IntWeights& w, const ActQ& a, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  for (int64_t blk = b0; blk < b1; ++blk) {
    int64_t n = 0;
    for (; n + 4 <= a.N; n += 4) block_int<BITS, 4>(w, a, blk, n, y, ldy);
    switch (a.N - n) {
      case 3: block_int<BITS, 3>(w, a, blk, n, y, ldy); break;
      case 2: block_int<BITS, 2>(w, a, blk, n, y, ldy); break;
      case 1: block_int<BITS, 1>(w, a, blk, n, y, ldy); break;
      default: break;
    }
  }
}

void gemm_int_avx512(const IntWeights& w, const ActQ& a, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  switch (w.bits) {
    case 1: gemm_int_bits<1>(w, a, y, ldy, b0, b1); break;
    case 2: gemm_int_bits<2>(w, a, y, ldy, b0, b1); break;
    case 4: gemm_int_bits<4>(w, a, y, ldy, b0, b1); break;
    case 8: gemm_int_bits<8>(w, a, y, ldy, b0, b1); break;
  }
}

// ---- float formats: rows of 8, K along vectors of 16 (masked tail) ----
inline __m512 load_w16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_w16(const uint16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

template <typename T>
void gemm_float_avx512(const FloatWeights& w, const float* x, int64_t N, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  const T* W = static_cast<const T*>(w.w);
  const int64_t K = w.K;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t m0 = blk * kFloatRows, rows = std::min<int64_t>(kFloatRows, w.M - m0);
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * K;
      __m512 acc[kFloatRows];
      for (int r = 0; r < kFloatRows; ++r) acc[r] = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 16) {
        const __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
        const __m512 xv = _mm512_maskz_loadu_ps(m, xr + k);
        if (rows == kFloatRows) {
#pragma GCC unroll 8
          for (int r = 0; r < kFloatRows; ++r) {
            _mm_prefetch((const char*)(W + (m0 + r) * K + k) + 1024, _MM_HINT_T0);
            acc[r] = _mm512_fmadd_ps(load_w16(W + (m0 + r) * K + k, m), xv, acc[r]);
          }
        } else {
          for (int r = 0; r < rows; ++r) acc[r] = _mm512_fmadd_ps(load_w16(W + (m0 + r) * K + k, m), xv, acc[r]);
        }
      }
      for (int r = 0; r < rows; ++r) y[n * ldy + m0 + r] = _mm512_reduce_add_ps(acc[r]);
    }
  }
}

}  // namespace

const KernelTable& kernels_avx512() {
  static const KernelTable t{"avx512", gemm_int_avx512, gemm_float_avx512<float>, gemm_float_avx512<uint16_t>};
  return t;
}

}  // namespace lowbit

// The ymm AVX-VNNI kernels again, with the EVEX encoding of the same instruction.
#define LOWBIT_AVX256_NS avxvnni_evex
#define LOWBIT_AVX256_DOT(acc, u8, s8) _mm256_dpbusd_epi32(acc, u8, s8)
#define LOWBIT_AVX256_NAME "avxvnni(evex)"
#define LOWBIT_AVX256_TABLE kernels_avxvnni_evex
#include "kernels_avx256.inc"
