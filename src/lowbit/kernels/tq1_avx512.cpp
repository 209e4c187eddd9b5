// tq1 with AVX-512 VNNI + VBMI (Ice Lake and later, Zen 4): byte lookups decode, vpdpbusd multiplies.
// Layout in tq1.h. Compiled with AVX-512 target flags; tq1.cpp calls it only on CPUs that run "avx512"
// and report AVX512_VBMI.
//
// Decode of a 64-byte tile: two 256-entry byte lookups on the stored bytes b,
//     F1[b] = c0 | c1 << 2 | c2 << 4 | c3 << 6      F2[b] = c4
// each one lookup of the low 7 bits in two table halves (vpermt2b: 128 entries from two registers) for
// bytes < 128 and for bytes >= 128, blended on the top bit (vpmovb2m, shared by both lookups):
// 4 vpermt2b + 2 blends + 1 vpmovb2m for 5 code vectors (the tables are built from tq1_digit, so every
// byte decodes as the scalar twin does). The GEMV then masks each field of F1 in place (F1 & (3 << 2j)
// = c_j * 4^j, u8 <= 128) into an accumulator per multiplier 4^j, shifted back exactly once per group,
// as the int kernels do; F2 goes into the x1 accumulator. The GEMM shifts the fields down once per tile
// and reuses the five code vectors for up to 8 tokens.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "tq1.h"

namespace lowbit {
namespace {


struct alignas(64) LookupTables {
  uint8_t f1[256], f2[256];
  LookupTables() {
    for (int b = 0; b < 256; ++b) {
      f1[b] = (uint8_t)(tq1_digit(b, 0) | tq1_digit(b, 1) << 2 | tq1_digit(b, 2) << 4 | tq1_digit(b, 3) << 6);
      f2[b] = (uint8_t)tq1_digit(b, 4);
    }
  }
};

const LookupTables& tables() {
  static const LookupTables t;
  return t;
}

struct Tables {
  __m512i a0, a1, a2, a3, b0, b1, b2, b3;  // F1 bytes 0-63, 64-127, 128-191, 192-255; F2 likewise
  Tables() {
    const LookupTables& t = tables();
    a0 = _mm512_load_si512(t.f1), a1 = _mm512_load_si512(t.f1 + 64);
    a2 = _mm512_load_si512(t.f1 + 128), a3 = _mm512_load_si512(t.f1 + 192);
    b0 = _mm512_load_si512(t.f2), b1 = _mm512_load_si512(t.f2 + 64);
    b2 = _mm512_load_si512(t.f2 + 128), b3 = _mm512_load_si512(t.f2 + 192);
  }
};

__attribute__((always_inline)) inline void decode(__m512i v, const Tables& T, __m512i& f1, __m512i& f2) {
  const __mmask64 hi = _mm512_movepi8_mask(v);
  f1 = _mm512_mask_blend_epi8(hi, _mm512_permutex2var_epi8(T.a0, v, T.a1), _mm512_permutex2var_epi8(T.a2, v, T.a3));
  f2 = _mm512_mask_blend_epi8(hi, _mm512_permutex2var_epi8(T.b0, v, T.b1), _mm512_permutex2var_epi8(T.b2, v, T.b3));
}

// acc += u8 x s8 in groups of four, the s8 operand four activation bytes broadcast from memory; inline
// asm keeps the accumulator in one register (see kernels_avx512.cpp).
__attribute__((always_inline)) inline void dpbusd(__m512i& acc, __m512i u8, const int8_t* x4) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u8), "m"(*(const int32_t*)x4));
}

// v & mask with the mask broadcast from memory: no register held for it.
alignas(64) const uint32_t kFieldMask[2] = {0x03030303u, 0x0c0c0c0cu};
__attribute__((always_inline)) inline __m512i and_field(__m512i v, int j) {
  __m512i r;
  __asm__("vpandd %2%{1to16%}, %1, %0" : "=v"(r) : "v"(v), "m"(kFieldMask[j]));
  return r;
}

// Two accumulators per tile (multipliers 1 and 4): c0 = F1 & 3, c1 * 4 = F1 & 12, and the same two
// fields of F1 >> 4 for c2, c3; F2 = c4. With 8 table registers, 8 accumulators stay in registers.
struct TileAcc {
  __m512i m0, m1;
};

__attribute__((always_inline)) inline void tile_step(const uint8_t* p, const int8_t* qc, const Tables& T, TileAcc& acc) {
  __m512i f1, f2;
  decode(_mm512_loadu_si512(p), T, f1, f2);
  const __m512i f1h = _mm512_srli_epi16(f1, 4);
  dpbusd(acc.m0, and_field(f1, 0), qc);
  dpbusd(acc.m1, and_field(f1, 1), qc + 4);
  dpbusd(acc.m0, and_field(f1h, 0), qc + 8);
  dpbusd(acc.m1, and_field(f1h, 1), qc + 12);
  dpbusd(acc.m0, f2, qc + 16);
}

inline __m512i tile_dot(const TileAcc& a) { return _mm512_add_epi32(a.m0, _mm512_srai_epi32(a.m1, 2)); }

inline void store_rows(float* y, int64_t row, int64_t M, __m512 v) {
  if (row >= M) return;
  const int64_t rows = std::min<int64_t>(16, M - row);
  _mm512_mask_storeu_ps(y + row, rows == 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1), v);
}

// GEMV: one row block (4 tiles) x one token.
inline void block_gemv(const TQ1Weights& w, const ActQ& a, int64_t blk, float* y, const Tables& T) {
  const uint8_t* wb = w.codes + blk * w.nch() * kTq1ChunkBytes;
  const uint8_t* last = w.codes + (w.Mb * w.nch() - 1) * kTq1ChunkBytes;
  __m512 accf[4];
  for (int t = 0; t < 4; ++t) accf[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < w.G; ++g) {
    const int64_t c0 = g * w.group / kTq1KC, c1 = std::min((g + 1) * w.group, w.Kp) / kTq1KC;
    const __m512i z = _mm512_setzero_si512();
    TileAcc t0{z, z}, t1{z, z}, t2{z, z}, t3{z, z};
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t* chunk = wb + c * kTq1ChunkBytes;
      const char* pf = prefetch_target(chunk, last);
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
      _mm_prefetch(pf + 128, _MM_HINT_T0);
      _mm_prefetch(pf + 192, _MM_HINT_T0);
      const int8_t* qc = a.q + c * kTq1KC;
      tile_step(chunk, qc, T, t0);
      tile_step(chunk + 64, qc, T, t1);
      tile_step(chunk + 128, qc, T, t2);
      tile_step(chunk + 192, qc, T, t3);
    }
    const __m512i dots[4] = {tile_dot(t0), tile_dot(t1), tile_dot(t2), tile_dot(t3)};
    const uint16_t* sc = w.scale + (blk * w.G + g) * kRowBlock;
    const __m512 sx = _mm512_set1_ps(a.scale[g]), sq = _mm512_set1_ps((float)a.sum[g]);
    for (int t = 0; t < 4; ++t) {
      const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sc + 16 * t)));
      const __m512 r = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_setzero_ps(), s), sq, _mm512_mul_ps(s, _mm512_cvtepi32_ps(dots[t])));
      accf[t] = _mm512_fmadd_ps(sx, r, accf[t]);
    }
  }
  for (int t = 0; t < 4; ++t) store_rows(y, blk * kRowBlock + 16 * t, w.M, accf[t]);
}

// GEMM: one tile (16 rows) x NT tokens; each decoded code vector feeds NT vpdpbusd.
template <int NT>
inline void tile_gemm(const TQ1Weights& w, const ActQ& a, int64_t blk, int t, int64_t n0, float* y, int64_t ldy,
                      const Tables& T) {
  const uint8_t* wt = w.codes + blk * w.nch() * kTq1ChunkBytes + t * 64;
  const uint8_t* last = w.codes + (w.Mb * w.nch() - 1) * kTq1ChunkBytes + t * 64;
  const __m512i low2 = _mm512_set1_epi8(3);
  __m512 accf[NT];
  for (int n = 0; n < NT; ++n) accf[n] = _mm512_setzero_ps();
  for (int64_t g = 0; g < w.G; ++g) {
    const int64_t c0 = g * w.group / kTq1KC, c1 = std::min((g + 1) * w.group, w.Kp) / kTq1KC;
    __m512i acc[NT];
    for (int n = 0; n < NT; ++n) acc[n] = _mm512_setzero_si512();
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t* p = wt + c * kTq1ChunkBytes;
      _mm_prefetch(prefetch_target(p, last), _MM_HINT_T0);
      const int8_t* qc = a.q + n0 * a.Kp + c * kTq1KC;
      __m512i f1, f2;
      decode(_mm512_loadu_si512(p), T, f1, f2);
      const __m512i d[5] = {_mm512_and_si512(f1, low2), _mm512_and_si512(_mm512_srli_epi16(f1, 2), low2),
                            _mm512_and_si512(_mm512_srli_epi16(f1, 4), low2),
                            _mm512_and_si512(_mm512_srli_epi16(f1, 6), low2), f2};
#pragma GCC unroll 5
      for (int j = 0; j < 5; ++j)
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {  // the intrinsic here: GCC keeps an array of asm operands in memory
          int32_t x4;
          std::memcpy(&x4, qc + n * a.Kp + 4 * j, 4);
          acc[n] = _mm512_dpbusd_epi32(acc[n], d[j], _mm512_set1_epi32(x4));
        }
    }
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(w.scale + (blk * w.G + g) * kRowBlock + 16 * t)));
    const __m512 b = _mm512_sub_ps(_mm512_setzero_ps(), s);
    for (int n = 0; n < NT; ++n) {
      const int64_t ag = (n0 + n) * a.G + g;
      const __m512 r = _mm512_fmadd_ps(b, _mm512_set1_ps((float)a.sum[ag]), _mm512_mul_ps(s, _mm512_cvtepi32_ps(acc[n])));
      accf[n] = _mm512_fmadd_ps(_mm512_set1_ps(a.scale[ag]), r, accf[n]);
    }
  }
  for (int n = 0; n < NT; ++n) store_rows(y + (n0 + n) * ldy, blk * kRowBlock + 16 * t, w.M, accf[n]);
}

}  // namespace

void tq1_gemm_avx512(const TQ1Weights& w, const ActQ& a, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  const Tables T;
  for (int64_t blk = b0; blk < b1; ++blk) {
    if (a.N == 1) {
      block_gemv(w, a, blk, y, T);
      continue;
    }
    for (int t = 0; t < 4 && blk * kRowBlock + 16 * t < w.M; ++t) {
      int64_t n = 0;
      for (; n + 8 <= a.N; n += 8) tile_gemm<8>(w, a, blk, t, n, y, ldy, T);
      switch (a.N - n) {
        case 7: tile_gemm<7>(w, a, blk, t, n, y, ldy, T); break;
        case 6: tile_gemm<6>(w, a, blk, t, n, y, ldy, T); break;
        case 5: tile_gemm<5>(w, a, blk, t, n, y, ldy, T); break;
        case 4: tile_gemm<4>(w, a, blk, t, n, y, ldy, T); break;
        case 3: tile_gemm<3>(w, a, blk, t, n, y, ldy, T); break;
        case 2: tile_gemm<2>(w, a, blk, t, n, y, ldy, T); break;
        case 1: tile_gemm<1>(w, a, blk, t, n, y, ldy, T); break;
        default: break;
      }
    }
  }
}

}  // namespace lowbit
