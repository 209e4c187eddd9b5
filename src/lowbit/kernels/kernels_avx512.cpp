// AVX-512 (F, BW, VL, VNNI) kernels. Compiled with those target flags only; dispatch.cpp calls them only
// on CPUs that have them. Also builds the AVX-VNNI ymm kernels EVEX-encoded (kernels_avx256.inc), so the
// 256-bit VNNI path runs and is tested on AVX-512 machines that lack the VEX AVX-VNNI encoding.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common.h"
#include "dispatch.h"

#define LOWBIT_OPS_NS ops_avx512
#include "ops.inc"
#undef LOWBIT_OPS_NS

namespace lowbit::ops_avx512 {
void f16_to_f32_row(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT));
  }
}
}  // namespace lowbit::ops_avx512

namespace lowbit {
namespace {


// The four lines of the 256-byte chunk kPrefetchBytes ahead in the weight stream (never past `last`, or on
// past it into `next`: IntWeights::pf_next).
inline void prefetch_chunk(const uint8_t* chunk, const uint8_t* last, const uint8_t* next = nullptr) {
  const char* pf = prefetch_target(chunk, last, next);
  for (int l = 0; l < 256; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
}

// acc += u8 x s8 in groups of four. Inline asm ties the accumulator to one register: with the intrinsic,
// GCC 12 copies every accumulator around each vpdpbusd and spills them in the decode loop.
// The s8 operand is four activation bytes broadcast from memory ({1to16}: no broadcast register).
__attribute__((always_inline)) inline void dpbusd(__m512i& acc, __m512i u8, const int8_t* x4) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u8), "m"(*(const int32_t*)x4));
}

// One row block (4 tiles of 16 rows) x NT tokens. acc lanes are rows: lane i of tile t = row 16t+i.
template <int BITS, int NT>
inline void block_int(const IntWeights& w, const ActQ& a, int64_t blk, int64_t n0, float* y, int64_t ldy) {
  constexpr int PER = 8 / BITS;
  constexpr int KC = 4 * PER;
  const int64_t nch = w.nch();
  const uint8_t* wb = w.codes + blk * nch * 256;
  const uint8_t* last = w.codes + (w.Mb * nch - 1) * 256;
  const __m512i mask = _mm512_set1_epi8((char)((1 << BITS) - 1));
  __m512 accf[NT][4];
  for (int n = 0; n < NT; ++n)
    for (int t = 0; t < 4; ++t) accf[n][t] = _mm512_setzero_ps();

  // One token: two accumulators per tile (even / odd bit fields) break the vpdpbusd dependency chains.
  constexpr int S = NT == 1 ? 2 : 1;
  for (int64_t g = 0; g < w.G; ++g) {
    const int64_t c0 = g * w.group / KC, c1 = std::min((g + 1) * w.group, w.Kp) / KC;
    __m512i acc[NT][4][S];
    for (int n = 0; n < NT; ++n)
      for (int t = 0; t < 4; ++t)
        for (int u = 0; u < S; ++u) acc[n][t][u] = _mm512_setzero_si512();
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t* chunk = wb + c * 256;
      prefetch_chunk(chunk, last);
      const int8_t* qc = a.q + n0 * a.Kp + c * KC;
      __m512i v[4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) v[t] = _mm512_loadu_si512(chunk + t * 64);
#pragma GCC unroll 8
      for (int j = 0; j < PER; ++j) {
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          __m512i code;
          if constexpr (BITS == 8) code = v[t];
          else if (j == 0) code = _mm512_and_si512(v[t], mask);
          else code = _mm512_and_si512(_mm512_srli_epi16(v[t], j * BITS), mask);
#pragma GCC unroll 4
          for (int n = 0; n < NT; ++n) {
            // The intrinsic (not the asm dpbusd): GCC keeps each broadcast in a register for the four tiles.
            int32_t xq;
            std::memcpy(&xq, qc + n * a.Kp + 4 * j, 4);
            acc[n][t][j % S] = _mm512_dpbusd_epi32(acc[n][t][j % S], code, _mm512_set1_epi32(xq));
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
                                         _mm512_mul_ps(s, _mm512_cvtepi32_ps(S == 2 ? _mm512_add_epi32(acc[n][t][0], acc[n][t][S - 1]) : acc[n][t][0])));
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

// GEMV (one token), the decode hot path. Instead of shifting each bit field down, field j is masked
// in place: (v & (mask << j*BITS)) = c_j * 2^(j*BITS), and each multiplier 2^(j*BITS) gets its own
// accumulator, scaled back exactly (arithmetic shift of an exact multiple) once per group. On Zen 4 this
// trades 12 shifts per 256 bytes for nothing: vpand runs on all four vector pipes, vpsrlw on two.
// 1-bit: eight fields, four multipliers; fields 4-7 come from one shift of the tile by 4.
// Accumulators of one 16-row tile, one per multiplier; named members (not an array) so that GCC keeps
// all sixteen of a block in registers.
struct TileAcc {
  __m512i m0, m1, m2, m3;
};

template <int BITS>
__attribute__((always_inline)) inline void tile_step(const uint8_t* p, const int8_t* qc, TileAcc& acc,
                                                     const __m512i& k0, const __m512i& k1, const __m512i& k2,
                                                     const __m512i& k3) {
  constexpr int PER = 8 / BITS;
  const __m512i v = _mm512_loadu_si512(p);
  auto x = [&](int j) { return qc + 4 * j; };
  if constexpr (BITS == 8) {
    dpbusd(acc.m0, v, x(0));
  } else if constexpr (PER == 2) {
    dpbusd(acc.m0, _mm512_and_si512(v, k0), x(0));
    dpbusd(acc.m1, _mm512_and_si512(v, k1), x(1));
  } else {
    dpbusd(acc.m0, _mm512_and_si512(v, k0), x(0));
    dpbusd(acc.m1, _mm512_and_si512(v, k1), x(1));
    dpbusd(acc.m2, _mm512_and_si512(v, k2), x(2));
    dpbusd(acc.m3, _mm512_and_si512(v, k3), x(3));
    if constexpr (PER == 8) {
      const __m512i vh = _mm512_srli_epi16(v, 4);
      dpbusd(acc.m0, _mm512_and_si512(vh, k0), x(4));
      dpbusd(acc.m1, _mm512_and_si512(vh, k1), x(5));
      dpbusd(acc.m2, _mm512_and_si512(vh, k2), x(6));
      dpbusd(acc.m3, _mm512_and_si512(vh, k3), x(7));
    }
  }
}

template <int BITS>
inline __m512i tile_dot(const TileAcc& acc) {
  constexpr int PER = 8 / BITS;
  if constexpr (BITS == 8) return acc.m0;
  __m512i d = _mm512_add_epi32(acc.m0, _mm512_srai_epi32(acc.m1, BITS));
  if constexpr (PER >= 4) {
    d = _mm512_add_epi32(d, _mm512_srai_epi32(acc.m2, 2 * BITS));
    d = _mm512_add_epi32(d, _mm512_srai_epi32(acc.m3, 3 * BITS));
  }
  return d;
}

// GEMV (one token), the decode hot path. Instead of shifting each bit field down, field j is masked
// in place: (v & (mask << j*BITS)) = c_j * 2^(j*BITS), and each multiplier 2^(j*BITS) gets its own
// accumulator, scaled back exactly (arithmetic shift of an exact multiple) once per group. On Zen 4 this
// trades 12 shifts per 256 bytes for nothing: vpand runs on all four vector pipes, vpsrlw on two.
// 1-bit: eight fields, four multipliers; fields 4-7 come from one shift of the tile by 4.
template <int BITS>
inline void block_gemv(const IntWeights& w, const ActQ& a, int64_t blk, float* y) {
  constexpr int PER = 8 / BITS;
  constexpr int KC = 4 * PER;
  const int64_t nch = w.nch();
  const uint8_t* wb = w.codes + blk * nch * 256;
  const uint8_t* last = w.codes + (w.Mb * nch - 1) * 256;
  const int lo = (1 << BITS) - 1;
  const __m512i k0 = _mm512_set1_epi8((char)lo), k1 = _mm512_set1_epi8((char)(lo << BITS));
  const __m512i k2 = _mm512_set1_epi8((char)(lo << (2 * BITS))), k3 = _mm512_set1_epi8((char)(lo << (3 * BITS)));
  __m512 accf[4];
  for (int t = 0; t < 4; ++t) accf[t] = _mm512_setzero_ps();

  for (int64_t g = 0; g < w.G; ++g) {
    const int64_t c0 = g * w.group / KC, c1 = std::min((g + 1) * w.group, w.Kp) / KC;
    const __m512i z = _mm512_setzero_si512();
    TileAcc t0{z, z, z, z}, t1{z, z, z, z}, t2{z, z, z, z}, t3{z, z, z, z};
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t* chunk = wb + c * 256;
      prefetch_chunk(chunk, last, w.pf_next);
      const int8_t* qc = a.q + c * KC;
      tile_step<BITS>(chunk, qc, t0, k0, k1, k2, k3);
      tile_step<BITS>(chunk + 64, qc, t1, k0, k1, k2, k3);
      tile_step<BITS>(chunk + 128, qc, t2, k0, k1, k2, k3);
      tile_step<BITS>(chunk + 192, qc, t3, k0, k1, k2, k3);
    }
    const __m512i dots[4] = {tile_dot<BITS>(t0), tile_dot<BITS>(t1), tile_dot<BITS>(t2), tile_dot<BITS>(t3)};
    const uint16_t* sc = w.scale + (blk * w.G + g) * kRowBlock;
    const uint16_t* of = w.offset ? w.offset + (blk * w.G + g) * kRowBlock : nullptr;
    const __m512 sx = _mm512_set1_ps(a.scale[g]), sq = _mm512_set1_ps((float)a.sum[g]);
    for (int t = 0; t < 4; ++t) {
      const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sc + 16 * t)));
      const __m512 b = of ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(of + 16 * t)))
                          : _mm512_mul_ps(s, _mm512_set1_ps(-w.zc));
      const __m512 r = _mm512_fmadd_ps(b, sq, _mm512_mul_ps(s, _mm512_cvtepi32_ps(dots[t])));
      accf[t] = _mm512_fmadd_ps(sx, r, accf[t]);
    }
  }
  for (int t = 0; t < 4; ++t) {
    const int64_t row = blk * kRowBlock + 16 * t;
    if (row >= w.M) break;
    const int64_t rows = std::min<int64_t>(16, w.M - row);
    const __mmask16 m = rows == 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
    _mm512_mask_storeu_ps(y + row, m, accf[t]);
  }
}

#include "gemm_panel_avx512.inc"

template <int BITS>
void gemm_int_bits(const IntWeights& w, const ActQ& a, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  if (a.N >= 4 && w.group >= kPanelMinGroup) {
    gemm_panel512<BITS>(w, a, y, ldy, b0, b1);
    return;
  }
  for (int64_t blk = b0; blk < b1; ++blk) {
    if (a.N == 1) {
      block_gemv<BITS>(w, a, blk, y);
      continue;
    }
    // Token passes of 3: four tokens' int32 and float accumulators (32 zmm) spilled with the codes and their
    // broadcasts beside them, three fit (bitnet-2b shapes, int4 / int8 groups of 32 at N = 16 and 128, 1 thread in
    // cache: 46-49 % -> 59-69 % of the int8 roof, int2 groups of 64 67-69 % -> 73-77 %). A row's bits do not depend
    // on the tokens beside it, so how they are grouped changes no result. One left over goes with the pass before
    // as 2 + 2 (a lone token runs the slower one-token pass).
    int64_t n = 0;
    const int64_t threes = a.N % 3 == 1 && a.N >= 4 ? a.N - 4 : a.N - a.N % 3;
    for (; n < threes; n += 3) block_int<BITS, 3>(w, a, blk, n, y, ldy);
    for (; n + 2 <= a.N; n += 2) block_int<BITS, 2>(w, a, blk, n, y, ldy);
    if (n < a.N) block_int<BITS, 1>(w, a, blk, n, y, ldy);
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

// ---- float formats: rows of 8 per block, 4 rows x up to 4 tokens per pass ----
// 4 rows x NT tokens per pass (NT <= 4): each widened weight vector feeds NT FMAs.
// bf16 rows are read 32 at a time and widened without a shuffle: (v << 16) holds the even elements as
// f32, (v & 0xffff0000) the odd ones; x comes pre-split to match (bf16_x_layout: per 32 k, 16 even then
// 16 odd values), so the activations stay f32 and exact.
// ROWS and NT are compile-time so every accumulator index is constant and GCC keeps them in registers.
// Rows are read side by side, so each row's prefetch targets the same k of the row ROWS further on: a
// fixed distance ahead would land in the neighbouring row, which is already being read.
template <typename T, int NT, int ROWS>
inline void float_tile(const T* W, int64_t K, int64_t M, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m0) {
  const int64_t ahead = m0 + 2 * ROWS <= M ? ROWS * K : 0;  // the next tile's rows, if they exist
  __m512 acc[ROWS][NT];
  for (int r = 0; r < ROWS; ++r)
    for (int n = 0; n < NT; ++n) acc[r][n] = _mm512_setzero_ps();
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
      __m512 xv[NT];
      for (int n = 0; n < NT; ++n) xv[n] = _mm512_maskz_loadu_ps(m, x + n * ldx + k);
#pragma GCC unroll 4
      for (int r = 0; r < ROWS; ++r) {
        const float* wr = W + (m0 + r) * K + k;
        _mm_prefetch((const char*)(wr + ahead), _MM_HINT_T1);  // the next tile's row: rows are one stream
        const __m512 wv = _mm512_maskz_loadu_ps(m, wr);
        for (int n = 0; n < NT; ++n) acc[r][n] = _mm512_fmadd_ps(wv, xv[n], acc[r][n]);
      }
    }
  } else {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t k = 0; k < K; k += 32) {
      const __mmask32 m = K - k >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (K - k)) - 1);
      __m512 xe[NT], xo[NT];
      for (int n = 0; n < NT; ++n) {
        xe[n] = _mm512_loadu_ps(x + n * ldx + k);
        xo[n] = _mm512_loadu_ps(x + n * ldx + k + 16);
      }
#pragma GCC unroll 4
      for (int r = 0; r < ROWS; ++r) {
        const uint16_t* wr = W + (m0 + r) * K + k;
        _mm_prefetch((const char*)(wr + ahead), _MM_HINT_T1);  // the next tile's row: rows are one stream
        const __m512i v = _mm512_maskz_loadu_epi16(m, wr);
        const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        for (int n = 0; n < NT; ++n)
          acc[r][n] = _mm512_fmadd_ps(wo, xo[n], _mm512_fmadd_ps(we, xe[n], acc[r][n]));
      }
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int n = 0; n < NT; ++n) y[n * ldy + m0 + r] = _mm512_reduce_add_ps(acc[r][n]);
}

template <typename T, int NT>
inline void float_rows(const T* W, int64_t K, int64_t M, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m0, int rows) {
  switch (rows) {
    case 4: float_tile<T, NT, 4>(W, K, M, x, ldx, y, ldy, m0); break;
    case 3: float_tile<T, NT, 3>(W, K, M, x, ldx, y, ldy, m0); break;
    case 2: float_tile<T, NT, 2>(W, K, M, x, ldx, y, ldy, m0); break;
    default: float_tile<T, NT, 1>(W, K, M, x, ldx, y, ldy, m0); break;
  }
}

int64_t bf16_x_stride(int64_t K) { return (K + 31) / 32 * 32; }

int64_t bf16_x_layout(const float* x, int64_t N, int64_t K, float* out) {
  const int64_t ld = bf16_x_stride(K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k0 = 0; k0 < ld; k0 += 32)
      for (int i = 0; i < 16; ++i) {
        const int64_t ke = k0 + 2 * i, ko = ke + 1;
        out[n * ld + k0 + i] = ke < K ? x[n * K + ke] : 0.f;
        out[n * ld + k0 + 16 + i] = ko < K ? x[n * K + ko] : 0.f;
      }
  return ld;
}

template <typename T>
void gemm_float_avx512(const FloatWeights& w, const float* x, int64_t N, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  const T* W = static_cast<const T*>(w.w);
  const int64_t K = w.K, ldx = std::is_same_v<T, float> ? K : bf16_x_stride(K);
  for (int64_t blk = b0; blk < b1; ++blk) {
    for (int64_t m0 = blk * kFloatRows; m0 < std::min((blk + 1) * kFloatRows, w.M); m0 += 4) {
      const int rows = (int)std::min<int64_t>(4, w.M - m0);
      int64_t n = 0;
      for (; n + 4 <= N; n += 4) float_rows<T, 4>(W, K, w.M, x + n * ldx, ldx, y + n * ldy, ldy, m0, rows);
      switch (N - n) {
        case 3: float_rows<T, 3>(W, K, w.M, x + n * ldx, ldx, y + n * ldy, ldy, m0, rows); break;
        case 2: float_rows<T, 2>(W, K, w.M, x + n * ldx, ldx, y + n * ldy, ldy, m0, rows); break;
        case 1: float_rows<T, 1>(W, K, w.M, x + n * ldx, ldx, y + n * ldy, ldy, m0, rows); break;
        default: break;
      }
    }
  }
}

uint64_t read_avx512(const uint8_t* p, int64_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  const uint8_t* last = p + n - 256;
  for (int64_t i = 0; i < n; i += 256) {
    prefetch_chunk(p + i, last);
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 192));
  }
  return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}

}  // namespace

const KernelTable& kernels_avx512() {
  static const KernelTable t{"avx512", gemm_int_avx512, gemm_float_avx512<float>, gemm_float_avx512<uint16_t>, read_avx512,
                             bf16_x_layout, bf16_x_stride,
                             ops_avx512::table()};
  return t;
}

}  // namespace lowbit

// The ymm AVX-VNNI kernels again, with the EVEX encoding of the same instruction.
#define LOWBIT_AVX256_NS avxvnni_evex
#define LOWBIT_AVX256_DOT(acc, u8, s8) _mm256_dpbusd_epi32(acc, u8, s8)
#define LOWBIT_AVX256_NAME "avxvnni(evex)"
#define LOWBIT_AVX256_TABLE kernels_avxvnni_evex
#define LOWBIT_OPS_NS ops_avxvnni_evex
#define LOWBIT_OPS_NO_512  // its ops keep the 256-bit loops of the AVX-VNNI machines it stands for
#include "kernels_avx256.inc"
#undef LOWBIT_OPS_NO_512
