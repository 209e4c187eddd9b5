// codebook with AVX2 + FMA + F16C (layout in codebook.h): the path for every SIMD level.
//
// Psumbook: float32 tables (no second rounding: the product equals the dequantized one up to float
// rounding), built with FMAs, looked up with scalar loads (see lookup_tiles for the measured choice).
// No AVX-512 VBMI path: vpermi2b's 256-entry lookup needs int8 psums, and this machine cannot test it.
#include <immintrin.h>

#include <cstring>

#include "codebook.h"
#include "common.h"

namespace lowbit {
namespace {

void build_tables(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t grp, float* T) {
  const int64_t S = w.segs(grp), k0 = grp * w.group, nc = w.nc, v = w.v;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s) {
      const float* xs = x + n * ldx + k0 + s * v;
      for (int64_t i = 0; i < w.m; ++i) {
        float* t = T + ((n * S + s) * w.m + i) * nc;
        const float* cb = w.cbT + i * v * nc;
        if (nc >= 8) {
          for (int64_t c = 0; c < nc; c += 8) {
            __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(cb + c), _mm256_set1_ps(xs[0]));
            for (int64_t d = 1; d < v; ++d) acc = _mm256_fmadd_ps(_mm256_loadu_ps(cb + d * nc + c), _mm256_set1_ps(xs[d]), acc);
            _mm256_storeu_ps(t + c, acc);
          }
        } else {
          for (int64_t c = 0; c < nc; ++c) {
            float acc = 0.f;
            for (int64_t d = 0; d < v; ++d) acc += cb[d * nc + c] * xs[d];
            t[c] = acc;
          }
        }
      }
    }
}

inline __m256 scale8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }


// Lookups for two tiles (16 rows) at once: per (segment, codebook) the 16 codes are two 8-byte words and
// each lookup is one scalar load + add from the group's L1 table. Measured on Zen 3 (4096x4096 m1v4,
// tables in L1): 16-row scalar lookups 1.0 ms, 8-row scalar 1.3 ms, vpgatherdd (8 rows per gather) 1.8 ms,
// int16 tables 1.6 ms. The gather is microcoded here, so loads win.
// tc: the first tile's codes (codebook.h tile_codes), the second's at tc + 8 (two tiles of one block of 64 rows).
template <int TILES>
inline void lookup_tiles(const float* Tn, int64_t nc, const uint8_t* tc, int64_t Q, const uint16_t* sc, float* dst) {
  float a[8 * TILES] = {};
  const float* Tq = Tn;
  const uint8_t* cq = tc;
  for (int64_t q = 0; q < Q; ++q, Tq += nc, cq += CodebookWeights::kPairStride) {
#pragma GCC unroll 2
    for (int t = 0; t < TILES; ++t) {
      uint64_t c;
      std::memcpy(&c, cq + t * 8, 8);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) a[8 * t + r] += Tq[(c >> (8 * r)) & 0xff];
    }
  }
  for (int t = 0; t < TILES; ++t) {
    const __m256 acc = _mm256_loadu_ps(a + 8 * t);
    _mm256_storeu_ps(dst + 8 * t, _mm256_fmadd_ps(scale8(sc + 8 * t), acc, _mm256_loadu_ps(dst + 8 * t)));
  }
}

}  // namespace

void codebook_psum_avx2(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0, int64_t g1,
                        int64_t t0, int64_t t1, float* yp, int64_t ldy, float* T) {
  if (w.lut4()) return codebook_lut4_psum_avx2(w, x, ldx, N, g0, g1, t0, t1, yp, ldy, T);
  const int64_t nc = w.nc;
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t Q = w.segs(grp) * w.m;  // (segment, codebook) pairs of this group
    build_tables(w, x, ldx, N, grp, T);
    const uint16_t* sc = w.scale + grp * w.Mt * 8;
    const uint8_t* gend = w.group_codes(grp) + w.Mt * Q * 8;
    int64_t tile = t0;
    if (tile % 2 && tile < t1) {  // a pair of tiles must lie in one block of 8
      for (int64_t n = 0; n < N; ++n)
        lookup_tiles<1>(T + n * Q * nc, nc, w.tile_codes(grp, tile), Q, sc + tile * 8, yp + n * ldy + tile * 8);
      ++tile;
    }
    for (; tile + 2 <= t1; tile += 2) {
      const uint8_t* tc = w.tile_codes(grp, tile);
      // the next block's codes (Q lines), a quarter per pair of tiles
      const uint8_t* nb = w.tile_codes(grp, tile - tile % 8 + 8) + (tile % 8 / 2) * Q * 16;
      for (int64_t l = 0; l < Q * 16; l += 64)
        if (nb + l < gend) _mm_prefetch((const char*)(nb + l), _MM_HINT_T0);
      for (int64_t n = 0; n < N; ++n) lookup_tiles<2>(T + n * Q * nc, nc, tc, Q, sc + tile * 8, yp + n * ldy + tile * 8);
    }
    for (; tile < t1; ++tile)
      for (int64_t n = 0; n < N; ++n)
        lookup_tiles<1>(T + n * Q * nc, nc, w.tile_codes(grp, tile), Q, sc + tile * 8, yp + n * ldy + tile * 8);
  }
}

void codebook_dequant_avx2(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0,
                           int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* buf) {
  if (w.lut4()) return codebook_lut4_dequant_avx2(w, x, ldx, N, g0, g1, t0, t1, yp, ldy, buf);
  const int64_t v = w.v, nc = w.nc, m = w.m;
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t S = w.segs(grp), glen = S * v, k0 = grp * w.group, Q = S * m;
    const uint16_t* sc = w.scale + grp * w.Mt * 8;
    for (int64_t tile = t0; tile < t1; ++tile) {
      const uint8_t* tc = w.tile_codes(grp, tile);
      constexpr int64_t PS = CodebookWeights::kPairStride;
      alignas(32) float s8[8];
      _mm256_store_ps(s8, scale8(sc + tile * 8));
      // dequantize: buf [8 rows][glen] = scale * sum_i C_i[code]
      for (int r = 0; r < 8; ++r) {
        float* row = buf + r * glen;
        for (int64_t sg = 0; sg < S; ++sg) {
          const uint8_t* c = tc + sg * m * PS + r;
          if (v == 4 && sg + 1 < S) {  // two segments per 256-bit store (split stores stall the reload)
            const uint8_t* c2 = c + m * PS;
            __m256 a = _mm256_set_m128(_mm_loadu_ps(w.cb + c2[0] * 4), _mm_loadu_ps(w.cb + c[0] * 4));
            for (int64_t i = 1; i < m; ++i)
              a = _mm256_add_ps(a, _mm256_set_m128(_mm_loadu_ps(w.cb + (i * nc + c2[i * PS]) * 4),
                                                   _mm_loadu_ps(w.cb + (i * nc + c[i * PS]) * 4)));
            _mm256_storeu_ps(row + sg * 4, _mm256_mul_ps(a, _mm256_set1_ps(s8[r])));
            ++sg;
          } else if (v == 4) {
            __m128 a = _mm_loadu_ps(w.cb + c[0] * 4);
            for (int64_t i = 1; i < m; ++i) a = _mm_add_ps(a, _mm_loadu_ps(w.cb + (i * nc + c[i * PS]) * 4));
            _mm_storeu_ps(row + sg * 4, _mm_mul_ps(a, _mm_set1_ps(s8[r])));
          } else if (v == 8) {
            __m256 a = _mm256_loadu_ps(w.cb + c[0] * 8);
            for (int64_t i = 1; i < m; ++i) a = _mm256_add_ps(a, _mm256_loadu_ps(w.cb + (i * nc + c[i * PS]) * 8));
            _mm256_storeu_ps(row + sg * 8, _mm256_mul_ps(a, _mm256_set1_ps(s8[r])));
          } else {
            for (int64_t d = 0; d < v; ++d) {
              float a = 0.f;
              for (int64_t i = 0; i < m; ++i) a += w.cb[(i * nc + c[i * PS]) * v + d];
              row[sg * v + d] = s8[r] * a;
            }
          }
        }
      }
      // multiply: 8 dot products of length glen per token
      for (int64_t n = 0; n < N; ++n) {
        const float* xs = x + n * ldx + k0;
        __m256 acc[8];
        for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= glen; k += 8) {
          const __m256 xv = _mm256_loadu_ps(xs + k);
          for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(buf + r * glen + k), xv, acc[r]);
        }
        alignas(32) float out[8];
        // transpose-add the 8 accumulators into one vector of 8 row sums
        const __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
        const __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
        const __m256 q0 = _mm256_hadd_ps(h01, h23), q1 = _mm256_hadd_ps(h45, h67);
        const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
        _mm256_store_ps(out, sum);
        for (; k < glen; ++k)
          for (int r = 0; r < 8; ++r) out[r] += buf[r * glen + k] * xs[k];
        float* dst = yp + n * ldy + tile * 8;
        _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), _mm256_load_ps(out)));
      }
    }
  }
}

}  // namespace lowbit
