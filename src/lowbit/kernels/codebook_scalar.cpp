// codebook in plain C++: the fallback on CPUs without AVX2 and the reference twin of the AVX2 paths
// (layout in codebook.h).
#include "codebook.h"
#include "common.h"

namespace lowbit {

// T[n][s][i][c] = sum_t C_i[c][t] * x[n][k0 + s*v + t]
static void build_tables_scalar(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t grp,
                                float* T) {
  const int64_t S = w.segs(grp), k0 = grp * w.group;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s) {
      const float* xs = x + n * ldx + k0 + s * w.v;
      for (int64_t i = 0; i < w.m; ++i) {
        float* t = T + ((n * S + s) * w.m + i) * w.nc;
        for (int64_t c = 0; c < w.nc; ++c) t[c] = 0.f;
        for (int64_t d = 0; d < w.v; ++d) {
          const float* col = w.cbT + (i * w.v + d) * w.nc;
          for (int64_t c = 0; c < w.nc; ++c) t[c] += col[c] * xs[d];
        }
      }
    }
}

void codebook_psum_scalar(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0, int64_t g1,
                          int64_t t0, int64_t t1, float* yp, int64_t ldy, float* T) {
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t S = w.segs(grp), Q = S * w.m;
    build_tables_scalar(w, x, ldx, N, grp, T);
    const uint16_t* sc = w.scale + grp * w.Mt * 8;
    for (int64_t tile = t0; tile < t1; ++tile) {
      const uint8_t* tc = w.group_codes(grp) + tile * Q * 8;
      for (int64_t n = 0; n < N; ++n) {
        const float* Tn = T + n * Q * w.nc;
        for (int r = 0; r < 8; ++r) {
          float acc = 0.f;
          for (int64_t q = 0; q < Q; ++q) acc += Tn[q * w.nc + tc[q * 8 + r]];  // q = s*m + i
          yp[n * ldy + tile * 8 + r] += f16_to_f32(sc[tile * 8 + r]) * acc;
        }
      }
    }
  }
}

void codebook_dequant_scalar(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0,
                             int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* buf) {
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t S = w.segs(grp), glen = S * w.v, k0 = grp * w.group;
    const uint16_t* sc = w.scale + grp * w.Mt * 8;
    for (int64_t tile = t0; tile < t1; ++tile) {
      const uint8_t* tc = w.group_codes(grp) + tile * S * w.m * 8;
      for (int r = 0; r < 8; ++r) {  // buf [8][glen]: the tile's weights of this group
        const float s = f16_to_f32(sc[tile * 8 + r]);
        for (int64_t sg = 0; sg < S; ++sg)
          for (int64_t d = 0; d < w.v; ++d) {
            float acc = 0.f;
            for (int64_t i = 0; i < w.m; ++i) acc += w.cb[(i * w.nc + tc[(sg * w.m + i) * 8 + r]) * w.v + d];
            buf[r * glen + sg * w.v + d] = s * acc;
          }
      }
      for (int64_t n = 0; n < N; ++n)
        for (int r = 0; r < 8; ++r) {
          const float* xs = x + n * ldx + k0;
          float acc = 0.f;
          for (int64_t k = 0; k < glen; ++k) acc += buf[r * glen + k] * xs[k];
          yp[n * ldy + tile * 8 + r] += acc;
        }
    }
  }
}

}  // namespace lowbit
