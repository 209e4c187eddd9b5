// codebook b == 4 with AVX2 (layout and error bound in codebook.h): the register-table Psumbook.
//
// A group's 16-entry psum tables are quantized to int8 with a power-of-two scale per (segment, codebook) pair
// (codebook.h); per two pairs, one 32-byte load gives 32 rows' codes of both (low/high nibbles), two vpshufb
// look up 64 psums, vpunpck{l,h}bw interleave the two lookups of each row and vpmaddubsw (x the pairs'
// multipliers) adds them into int16: 11 vector ops per 64 lookups, no gathers, no scalar loads. For one token
// (decode) the next group's tables are built in steps between the current group's row tiles (lut4_psum_decode).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codebook.h"
#include "common.h"

namespace lowbit {
namespace {

// the maxima of 8 vectors, one per lane: [max(pm[0]), ..., max(pm[7])]
inline __m256 hmax8(const __m256* pm) {
  __m256 h[4];
  for (int j = 0; j < 4; ++j)
    h[j] = _mm256_max_ps(_mm256_shuffle_ps(pm[2 * j], pm[2 * j + 1], 0x88), _mm256_shuffle_ps(pm[2 * j], pm[2 * j + 1], 0xDD));
  const __m256 ab = _mm256_max_ps(_mm256_shuffle_ps(h[0], h[1], 0x88), _mm256_shuffle_ps(h[0], h[1], 0xDD));
  const __m256 cd = _mm256_max_ps(_mm256_shuffle_ps(h[2], h[3], 0x88), _mm256_shuffle_ps(h[2], h[3], 0xDD));
  return _mm256_max_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

// float tables T[q][16] of pairs q = s*m + i for the segments [s0, s1) (V inputs per segment; V = 0: w.v at run
// time) -> tf. The build is bound by loads when the codebook comes from memory with every FMA: for V = 4 a codebook's
// transposed centroids (8 ymm) stay in registers across the segments, for V = 8 half of them (8 ymm) at a time,
// so only the activations are loaded (broadcasts). Each entry's arithmetic does not depend on [s0, s1).
template <int V>
void float_tables_lut4(const CodebookWeights& w, const float* xg, int64_t s0, int64_t s1, float* tf) {
  const int64_t m = w.m, v = V ? V : w.v;
  if (V == 4) {
    for (int64_t i = 0; i < m; ++i) {
      const float* cb = w.cbT + i * 64;
      __m256 c[8];
      for (int k = 0; k < 8; ++k) c[k] = _mm256_loadu_ps(cb + 8 * k);  // c[2d + h] = C_i^T[d][8h .. 8h + 8)
      for (int64_t s = s0; s < s1; ++s) {
        const float* xs = xg + s * 4;
        const __m256 x0 = _mm256_broadcast_ss(xs), x1 = _mm256_broadcast_ss(xs + 1);
        const __m256 x2 = _mm256_broadcast_ss(xs + 2), x3 = _mm256_broadcast_ss(xs + 3);
        const __m256 a0 = _mm256_add_ps(_mm256_fmadd_ps(c[2], x1, _mm256_mul_ps(c[0], x0)),
                                        _mm256_fmadd_ps(c[6], x3, _mm256_mul_ps(c[4], x2)));
        const __m256 a1 = _mm256_add_ps(_mm256_fmadd_ps(c[3], x1, _mm256_mul_ps(c[1], x0)),
                                        _mm256_fmadd_ps(c[7], x3, _mm256_mul_ps(c[5], x2)));
        float* t = tf + (s * m + i) * 16;
        _mm256_storeu_ps(t, a0);
        _mm256_storeu_ps(t + 8, a1);
      }
    }
  } else if (V == 8) {
    for (int64_t i = 0; i < m; ++i)
      for (int h = 0; h < 2; ++h) {
        const float* cb = w.cbT + i * 128 + 8 * h;
        __m256 c[8];
        for (int d = 0; d < 8; ++d) c[d] = _mm256_loadu_ps(cb + 16 * d);  // C_i^T[d][8h .. 8h + 8)
        for (int64_t s = s0; s < s1; ++s) {
          const float* xs = xg + s * 8;
          const __m256 e = _mm256_fmadd_ps(c[2], _mm256_broadcast_ss(xs + 2), _mm256_mul_ps(c[0], _mm256_broadcast_ss(xs)));
          const __m256 o = _mm256_fmadd_ps(c[3], _mm256_broadcast_ss(xs + 3), _mm256_mul_ps(c[1], _mm256_broadcast_ss(xs + 1)));
          const __m256 e2 = _mm256_fmadd_ps(c[6], _mm256_broadcast_ss(xs + 6), _mm256_mul_ps(c[4], _mm256_broadcast_ss(xs + 4)));
          const __m256 o2 = _mm256_fmadd_ps(c[7], _mm256_broadcast_ss(xs + 7), _mm256_mul_ps(c[5], _mm256_broadcast_ss(xs + 5)));
          _mm256_storeu_ps(tf + (s * m + i) * 16 + 8 * h, _mm256_add_ps(_mm256_add_ps(e, o), _mm256_add_ps(e2, o2)));
        }
      }
  } else {
    for (int64_t s = s0; s < s1; ++s)
      for (int64_t i = 0; i < m; ++i) {
        const float* xs = xg + s * v;
        const float* cb = w.cbT + i * v * 16;
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(cb), _mm256_broadcast_ss(xs));
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(cb + 8), _mm256_broadcast_ss(xs));
        for (int64_t d = 1; d < v; ++d) {
          const __m256 xd = _mm256_broadcast_ss(xs + d);
          a0 = _mm256_fmadd_ps(_mm256_loadu_ps(cb + d * 16), xd, a0);
          a1 = _mm256_fmadd_ps(_mm256_loadu_ps(cb + d * 16 + 8), xd, a1);
        }
        float* t = tf + (s * m + i) * 16;
        _mm256_storeu_ps(t, a0);
        _mm256_storeu_ps(t + 8, a1);
      }
  }
}

void float_tables(const CodebookWeights& w, const float* xg, int64_t s0, int64_t s1, float* tf) {
  if (w.v == 8) float_tables_lut4<8>(w, xg, s0, s1, tf);
  else if (w.v == 4) float_tables_lut4<4>(w, xg, s0, s1, tf);
  else float_tables_lut4<0>(w, xg, s0, s1, tf);
}

// the per-pair maxima |T| of tf [P][16] -> mxq (8 pairs at a time: written up to P rounded up to 8); returns the
// vector of running maxima
__m256 pair_maxima(const float* tf, int64_t P, float* mxq) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 amax = _mm256_setzero_ps();
  for (int64_t q0 = 0; q0 < P; q0 += 8) {
    __m256 pm[8];
    for (int j = 0; j < 8; ++j) {
      const float* t = tf + (q0 + j) * 16;
      pm[j] = q0 + j < P ? _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(t), absmask), _mm256_and_ps(_mm256_loadu_ps(t + 8), absmask))
                         : _mm256_setzero_ps();
    }
    const __m256 mx8 = hmax8(pm);
    _mm256_storeu_ps(mxq + q0, mx8);
    amax = _mm256_max_ps(amax, mx8);
  }
  return amax;
}

// codebook_lut4_scales (codebook_scalar.cpp) on 8 pairs at a time, bit for bit the same: mxq [P] (read up to
// Pp rounded up to 8, zeroed here past P) -> invq, mult; returns E.
int lut4_scales_avx2(float* mxq, int64_t P, int64_t Pp, float mx, float* invq, uint32_t* mult) {
  const int64_t P8 = (Pp + 7) & ~int64_t(7);
  for (int64_t q = P; q < P8; ++q) mxq[q] = 0.f;
  const float inv0 = mx > 0.f ? 127.f / mx : 0.f;
  const __m256 vinv0 = _mm256_set1_ps(inv0), vmx = _mm256_set1_ps(mx);
  int64_t A = 0, W = 0;
  for (int64_t q0 = 0; q0 < Pp; q0 += 256) {
    __m256i acc = _mm256_setzero_si256();
    for (int64_t q = q0; q < std::min(P8, q0 + 256); q += 8)
      acc = _mm256_add_epi32(acc, _mm256_cvttps_epi32(_mm256_ceil_ps(_mm256_mul_ps(_mm256_loadu_ps(mxq + q), vinv0))));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    A = std::max<int64_t>(A, _mm_cvtsi128_si32(h));
    W = std::max(W, std::min(Pp, q0 + 256) - q0);
  }
  int E = 7;
  while (E > 0 && (int64_t(2) * A + W) << E > 65534) --E;
  const __m256i vE = _mm256_set1_epi32(E), one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(127);
  const __m256i evens = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  for (int64_t q = 0; q < P8; q += 8) {
    // floor(log2(mx / mx_q)) from the quotient's exponent field (inf, NaN: 128); zero tables: E
    const __m256 quot = _mm256_div_ps(vmx, _mm256_loadu_ps(mxq + q));
    const __m256i f = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(quot), 23), bias);
    const __m256i e = _mm256_min_epi32(f, vE);
    _mm256_storeu_ps(invq + q, _mm256_mul_ps(vinv0, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, bias), 23))));
    const __m256i mu = _mm256_sllv_epi32(one, _mm256_sub_epi32(vE, e));      // 8 multipliers (<= 128)
    __m256i x = _mm256_or_si256(mu, _mm256_srli_epi64(mu, 24));                // low dword: m_2p | m_2p+1 << 8
    x = _mm256_or_si256(x, _mm256_slli_epi32(x, 16));
    _mm_storeu_si128((__m128i*)(mult + q / 2), _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(x, evens)));
  }
  return E;
}

// One token's tables of group grp (codebook.h "b == 4"): Tq [Pp][16] int8 (the pad pair zero), mult [Pp/2]
// the vpmaddubsw multipliers of each code vector; returns d, the int16 accumulator's unit.
// finish_tables_lut4: the rest once tf holds the float tables of every segment.
float finish_tables_lut4(const CodebookWeights& w, int64_t grp, const float* tf, float* mxq, float* invq, int8_t* Tq,
                         uint32_t* mult) {
  const int64_t P = w.segs(grp) * w.m, Pp = w.pairs_padded(grp);
  if (codebook_nonfinite(tf, P * 16)) return codebook_nonfinite_tables(Pp, 16, Tq, mult);
  const __m256 amax = pair_maxima(tf, P, mxq);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  const float mx = _mm_cvtss_f32(h);
  const int E = lut4_scales_avx2(mxq, P, Pp, mx, invq, mult);
  for (int64_t q = 0; q < P; ++q) {
    const __m256 inv = _mm256_set1_ps(invq[q]);
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(tf + q * 16), inv));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(tf + q * 16 + 8), inv));
    const __m128i w0 = _mm_packs_epi32(_mm256_castsi256_si128(i0), _mm256_extracti128_si256(i0, 1));
    const __m128i w1 = _mm_packs_epi32(_mm256_castsi256_si128(i1), _mm256_extracti128_si256(i1, 1));
    _mm_storeu_si128((__m128i*)(Tq + q * 16), _mm_packs_epi16(w0, w1));
  }
  if (Pp > P) std::memset(Tq + P * 16, 0, 16);
  return mx / 127.f / (float)(1u << E);
}

float build_tables_lut4(const CodebookWeights& w, const float* xg, int64_t grp, float* tf, float* mxq, float* invq,
                        int8_t* Tq, uint32_t* mult) {
  float_tables(w, xg, 0, w.segs(grp), tf);
  return finish_tables_lut4(w, grp, tf, mxq, invq, Tq, mult);
}

constexpr int LUT4_TILES = 2;  // row tiles per table load (4 measured no faster on Zen 3, noisy machine)

// 32 rows x one token: y[r] += s[r] * d * sum_q mult_q Tq[q][code(r, q)] over Pp pairs (Pp/2 code vectors).
// TILES row tiles share each table load (codes of tile t at tc + t * tstride).
template <int TILES>
inline void lookup_lut4(const uint8_t* tc, int64_t tstride, int64_t half, const int8_t* Tq, const uint32_t* mult,
                        float d, const uint16_t* sc, float* dst) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 f[TILES][4];
  for (int t = 0; t < TILES; ++t)
    for (int k = 0; k < 4; ++k) f[t][k] = _mm256_setzero_ps();
  for (int64_t p0 = 0; p0 < half; p0 += 128) {  // <= 256 pairs per int16 accumulation (codebook.h bound)
    const int64_t p1 = std::min(half, p0 + 128);
    __m256i a0[TILES], a1[TILES];
    for (int t = 0; t < TILES; ++t) a0[t] = a1[t] = _mm256_setzero_si256();
    for (int64_t p = p0; p < p1; ++p) {
      const __m256i ta = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(Tq + p * 32)));
      const __m256i tb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(Tq + p * 32 + 16)));
      const __m256i mu = _mm256_set1_epi32((int32_t)mult[p]);  // (mult 2p, mult 2p+1) per int16 lane
#pragma GCC unroll 4
      for (int t = 0; t < TILES; ++t) {
        const __m256i c = _mm256_loadu_si256((const __m256i*)(tc + t * tstride + p * 32));
        const __m256i la = _mm256_shuffle_epi8(ta, _mm256_and_si256(c, low4));
        const __m256i lb = _mm256_shuffle_epi8(tb, _mm256_and_si256(_mm256_srli_epi16(c, 4), low4));
        // rows 0-7 | 16-23 and 8-15 | 24-31: each int16 lane is one row's two lookups
        a0[t] = _mm256_add_epi16(a0[t], _mm256_maddubs_epi16(mu, _mm256_unpacklo_epi8(la, lb)));
        a1[t] = _mm256_add_epi16(a1[t], _mm256_maddubs_epi16(mu, _mm256_unpackhi_epi8(la, lb)));
      }
    }
    for (int t = 0; t < TILES; ++t) {
      f[t][0] = _mm256_add_ps(f[t][0], _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(a0[t]))));
      f[t][1] = _mm256_add_ps(f[t][1], _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(a1[t]))));
      f[t][2] = _mm256_add_ps(f[t][2], _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(a0[t], 1))));
      f[t][3] = _mm256_add_ps(f[t][3], _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(a1[t], 1))));
    }
  }
  const __m256 dv = _mm256_set1_ps(d);
  for (int t = 0; t < TILES; ++t)
    for (int k = 0; k < 4; ++k) {
      float* o = dst + t * 32 + k * 8;
      const __m256 s = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sc + t * 32 + k * 8))), dv);
      _mm256_storeu_ps(o, _mm256_fmadd_ps(s, f[t][k], _mm256_loadu_ps(o)));
    }
}

// 8 dot products of length n (rows of buf, stride ld) with xs, added to dst[0..8)
inline void dot8(const float* buf, int64_t ld, int64_t n, const float* xs, float* dst) {
  __m256 acc[8];
  for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 xv = _mm256_loadu_ps(xs + k);
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(buf + r * ld + k), xv, acc[r]);
  }
  const __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 q0 = _mm256_hadd_ps(h01, h23), q1 = _mm256_hadd_ps(h45, h67);
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31)));
  for (; k < n; ++k)
    for (int r = 0; r < 8; ++r) out[r] += buf[r * ld + k] * xs[k];
  _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), _mm256_load_ps(out)));
}

constexpr int64_t kBuildSegs = 4;  // segments of the next group's float tables built per step of the decode loop

// One token (decode): the next group's tables are built in steps between the current group's row-tile lookups,
// into the other half of a double buffer, so the code stream (bound by memory on one core) goes on while they are
// built; the tables are the same bytes as build_tables_lut4's.
void lut4_psum_decode(const CodebookWeights& w, const float* x, int64_t g0, int64_t g1, int64_t t0, int64_t t1,
                      float* yp, Lut4Scratch& sb) {
  const uint8_t* last = w.codes + w.codes_bytes() - 64;
  sb.d[0] = build_tables_lut4(w, x + g0 * w.group, g0, sb.tf, sb.mxq, sb.invq, sb.tabs(0), sb.mults(0));
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t slot = (grp - g0) & 1, next = slot ^ 1;
    const int64_t Pp = w.pairs_padded(grp), half = Pp / 2, tstride = half * 32;
    const uint16_t* sc = w.scale + grp * w.Mt * 32;
    const uint8_t* gc = w.group_codes(grp);
    const int8_t* tq = sb.tabs(slot);
    const uint32_t* mu = sb.mults(slot);
    const float d = sb.d[slot];
    const float* nx = x + (grp + 1) * w.group;
    StepwiseBuild nb([&](int64_t s0, int64_t s1) { float_tables(w, nx, s0, s1, sb.tf); },
                     [&] { sb.d[next] = finish_tables_lut4(w, grp + 1, sb.tf, sb.mxq, sb.invq, sb.tabs(next), sb.mults(next)); },
                     grp + 1 < g1 ? w.segs(grp + 1) : 0, kBuildSegs);
    // this task's code stream: the tiles [t0, t1) of each group in turn (contiguous when the task has every row);
    // the prefetches run kPrefetchBytes ahead on it, into the next group's tiles past this group's
    const uint8_t* base = gc + t0 * tstride;
    const int64_t len = (t1 - t0) * tstride;
    const uint8_t* nbase = grp + 1 < g1 ? w.group_codes(grp + 1) + t0 * w.pairs_padded(grp + 1) * 16 : last;
    int64_t tile = t0;
    for (; tile + LUT4_TILES <= t1; tile += LUT4_TILES) {
      const uint8_t* here = gc + tile * tstride;
      for (int64_t l = 0; l < LUT4_TILES * tstride; l += 64) {
        const int64_t ahead = here + l - base + kPrefetchBytes;
        _mm_prefetch((const char*)std::min(ahead < len ? base + ahead : nbase + (ahead - len), last), _MM_HINT_T0);
      }
      lookup_lut4<LUT4_TILES>(here, tstride, half, tq, mu, d, sc + tile * 32, yp + tile * 32);
      nb.step();
    }
    for (; tile < t1; ++tile) lookup_lut4<1>(gc + tile * tstride, tstride, half, tq, mu, d, sc + tile * 32, yp + tile * 32);
    nb.complete();
  }
}

}  // namespace

void codebook_lut4_float_tables_avx2(const CodebookWeights& w, const float* xg, int64_t s0, int64_t s1, float* tf) {
  float_tables(w, xg, s0, s1, tf);
}

float codebook_lut4_finish_avx2(const CodebookWeights& w, int64_t grp, const float* tf, float* mxq, float* invq,
                                int8_t* Tq, uint32_t* mult) {
  return finish_tables_lut4(w, grp, tf, mxq, invq, Tq, mult);
}

void codebook_lut4_psum_avx2(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0,
                             int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* scratch) {
  const int64_t ppf = w.pairs_padded_full();
  if (N == 1) {
    Lut4Scratch sb(scratch, 2, ppf);  // two tokens' room: the double buffer
    lut4_psum_decode(w, x, g0, g1, t0, t1, yp, sb);
    return;
  }
  Lut4Scratch sb(scratch, N, ppf);
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t Pp = w.pairs_padded(grp), half = Pp / 2, tstride = half * 32;
    for (int64_t n = 0; n < N; ++n)
      sb.d[n] = build_tables_lut4(w, x + n * ldx + grp * w.group, grp, sb.tf, sb.mxq, sb.invq, sb.tabs(n), sb.mults(n));
    const uint16_t* sc = w.scale + grp * w.Mt * 32;
    const uint8_t* gc = w.group_codes(grp);
    int64_t tile = t0;
    // codes are read as one stream (tiles in order, then the next group): prefetch kPrefetchBytes ahead
    const uint8_t* last = w.codes + w.codes_bytes() - 64;
    for (; tile + LUT4_TILES <= t1; tile += LUT4_TILES) {
      const uint8_t* here = gc + tile * tstride;
      for (int64_t l = 0; l < LUT4_TILES * tstride; l += 64) _mm_prefetch(prefetch_target(here + l, last), _MM_HINT_T0);
      for (int64_t n = 0; n < N; ++n)
        lookup_lut4<LUT4_TILES>(gc + tile * tstride, tstride, half, sb.tabs(n), sb.mults(n), sb.d[n], sc + tile * 32,
                                yp + n * ldy + tile * 32);
    }
    for (; tile < t1; ++tile)
      for (int64_t n = 0; n < N; ++n)
        lookup_lut4<1>(gc + tile * tstride, tstride, half, sb.tabs(n), sb.mults(n), sb.d[n], sc + tile * 32,
                       yp + n * ldy + tile * 32);
  }
}

// dequantize-then-multiply on the lut4 layout (the baseline): per 32-row tile the codes are unpacked, the
// group's weights decoded into buf [32][glen] and multiplied with every token, 8 rows at a time.
void codebook_lut4_dequant_avx2(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0,
                                int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* buf) {
  uint8_t* codes = reinterpret_cast<uint8_t*>(buf + 32 * w.group);
  const int64_t m = w.m, v = w.v;
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t S = w.segs(grp), glen = S * v, k0 = grp * w.group, P = S * m, Pp = w.pairs_padded(grp);
    const uint16_t* sc = w.scale + grp * w.Mt * 32;
    for (int64_t tile = t0; tile < t1; ++tile) {
      codebook_lut4_unpack(w.group_codes(grp) + tile * Pp * 16, P, codes);
      for (int r = 0; r < 32; ++r) {
        const float s = f16_to_f32(sc[tile * 32 + r]);
        float* row = buf + r * glen;
        for (int64_t sg = 0; sg < S; ++sg) {
          const uint8_t* c = codes + sg * m * 32 + r;
          if (v == 4) {
            __m128 a = _mm_loadu_ps(w.cb + c[0] * 4);
            for (int64_t i = 1; i < m; ++i) a = _mm_add_ps(a, _mm_loadu_ps(w.cb + (i * 16 + c[i * 32]) * 4));
            _mm_storeu_ps(row + sg * 4, _mm_mul_ps(a, _mm_set1_ps(s)));
          } else if (v == 8) {
            __m256 a = _mm256_loadu_ps(w.cb + c[0] * 8);
            for (int64_t i = 1; i < m; ++i) a = _mm256_add_ps(a, _mm256_loadu_ps(w.cb + (i * 16 + c[i * 32]) * 8));
            _mm256_storeu_ps(row + sg * 8, _mm256_mul_ps(a, _mm256_set1_ps(s)));
          } else {
            for (int64_t d = 0; d < v; ++d) {
              float a = 0.f;
              for (int64_t i = 0; i < m; ++i) a += w.cb[(i * 16 + c[i * 32]) * v + d];
              row[sg * v + d] = s * a;
            }
          }
        }
      }
      for (int64_t n = 0; n < N; ++n)
        for (int rb = 0; rb < 32; rb += 8) dot8(buf + rb * glen, glen, glen, x + n * ldx + k0, yp + n * ldy + tile * 32 + rb);
    }
  }
}

}  // namespace lowbit
