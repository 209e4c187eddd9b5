// codebook with AVX2 + FMA + F16C (layout in codebook.h): the path for every SIMD level.
//
// Psumbook lookups: the 8 codes of a (segment, codebook) for a tile of 8 rows are 8 contiguous bytes, so one
// vpmovzxbd + one vpgatherdd fetches the 8 rows' partial sums from the group's float table (in L1).
// No AVX-512 VBMI here: its vpermi2b 256-entry int8 lookup would need int8 psums (a second rounding); the
// float gather keeps the product equal to the dequantized one up to float rounding.
#include <immintrin.h>

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

inline __m256i idx8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }

}  // namespace

void codebook_psum_avx2(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0, int64_t g1,
                        int64_t t0, int64_t t1, float* yp, int64_t ldy, float* T) {
  const int64_t nc = w.nc;
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t Q = w.segs(grp) * w.m;  // (segment, codebook) pairs of this group
    build_tables(w, x, ldx, N, grp, T);
    const uint16_t* sc = w.scale + grp * w.Mt * 8;
    const uint8_t* gcodes = w.group_codes(grp);
    for (int64_t tile = t0; tile < t1; ++tile) {
      const uint8_t* tc = gcodes + tile * Q * 8;
      _mm_prefetch((const char*)(tc + 4 * Q * 8), _MM_HINT_T0);
      _mm_prefetch((const char*)(tc + 4 * Q * 8 + 64), _MM_HINT_T0);
      const __m256 s = scale8(sc + tile * 8);
      for (int64_t n = 0; n < N; ++n) {
        const float* Tn = T + n * Q * nc;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int64_t q = 0;
        for (; q + 4 <= Q; q += 4) {
          a0 = _mm256_add_ps(a0, _mm256_i32gather_ps(Tn + q * nc, idx8(tc + q * 8), 4));
          a1 = _mm256_add_ps(a1, _mm256_i32gather_ps(Tn + (q + 1) * nc, idx8(tc + (q + 1) * 8), 4));
          a2 = _mm256_add_ps(a2, _mm256_i32gather_ps(Tn + (q + 2) * nc, idx8(tc + (q + 2) * 8), 4));
          a3 = _mm256_add_ps(a3, _mm256_i32gather_ps(Tn + (q + 3) * nc, idx8(tc + (q + 3) * 8), 4));
        }
        for (; q < Q; ++q) a0 = _mm256_add_ps(a0, _mm256_i32gather_ps(Tn + q * nc, idx8(tc + q * 8), 4));
        const __m256 acc = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        float* dst = yp + n * ldy + tile * 8;
        _mm256_storeu_ps(dst, _mm256_fmadd_ps(s, acc, _mm256_loadu_ps(dst)));
      }
    }
  }
}

void codebook_dequant_avx2(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0,
                           int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* buf) {
  const int64_t v = w.v, nc = w.nc, m = w.m;
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t S = w.segs(grp), glen = S * v, k0 = grp * w.group, Q = S * m;
    const uint16_t* sc = w.scale + grp * w.Mt * 8;
    for (int64_t tile = t0; tile < t1; ++tile) {
      const uint8_t* tc = w.group_codes(grp) + tile * Q * 8;
      alignas(32) float s8[8];
      _mm256_store_ps(s8, scale8(sc + tile * 8));
      // dequantize: buf [8 rows][glen] = scale * sum_i C_i[code]
      for (int r = 0; r < 8; ++r) {
        float* row = buf + r * glen;
        for (int64_t sg = 0; sg < S; ++sg) {
          const uint8_t* c = tc + sg * m * 8 + r;
          if (v == 4) {
            __m128 a = _mm_loadu_ps(w.cb + c[0] * 4);
            for (int64_t i = 1; i < m; ++i) a = _mm_add_ps(a, _mm_loadu_ps(w.cb + (i * nc + c[i * 8]) * 4));
            _mm_storeu_ps(row + sg * 4, _mm_mul_ps(a, _mm_set1_ps(s8[r])));
          } else if (v == 8) {
            __m256 a = _mm256_loadu_ps(w.cb + c[0] * 8);
            for (int64_t i = 1; i < m; ++i) a = _mm256_add_ps(a, _mm256_loadu_ps(w.cb + (i * nc + c[i * 8]) * 8));
            _mm256_storeu_ps(row + sg * 8, _mm256_mul_ps(a, _mm256_set1_ps(s8[r])));
          } else {
            for (int64_t d = 0; d < v; ++d) {
              float a = 0.f;
              for (int64_t i = 0; i < m; ++i) a += w.cb[(i * nc + c[i * 8]) * v + d];
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
