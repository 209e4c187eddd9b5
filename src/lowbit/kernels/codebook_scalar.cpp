// codebook in plain C++: the fallback on CPUs without AVX2 and the reference twin of the AVX2 paths
// (layout in codebook.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "codebook.h"
#include "common.h"

namespace lowbit {

float codebook_lut4_tables_scalar(const CodebookWeights& w, const float* xg, int64_t grp, float* tf, int8_t* Tq) {
  const int64_t P = w.segs(grp) * w.m, Pp = w.pairs_padded(grp);
  float amax = 0.f;
  for (int64_t q = 0; q < P; ++q) {
    const int64_t s = q / w.m, i = q % w.m;
    for (int c = 0; c < 16; ++c) {
      float acc = 0.f;
      for (int64_t d = 0; d < w.v; ++d) acc += w.cbT[(i * w.v + d) * 16 + c] * xg[s * w.v + d];
      tf[q * 16 + c] = acc;
      amax = std::max(amax, std::fabs(acc));
    }
  }
  const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
  for (int64_t e = 0; e < P * 16; ++e) Tq[e] = (int8_t)std::nearbyint(tf[e] * inv);
  if (Pp > P) std::memset(Tq + P * 16, 0, 16);
  return d;
}

void codebook_lut4_unpack(const uint8_t* tc, int64_t P, uint8_t* out) {
  for (int64_t q = 0; q < P; ++q)
    for (int j = 0; j < 32; ++j) out[q * 32 + j] = (tc[(q / 2) * 32 + j] >> (4 * (q & 1))) & 15;
}

void codebook_lut4_psum_scalar(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0,
                               int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* scratch) {
  const int64_t ppf = w.pairs_padded_full();
  int8_t* tabs = reinterpret_cast<int8_t*>(scratch);  // [N][ppf][16]
  float* dn = scratch + N * ppf * 4;                   // [N]
  float* tf = dn + N;                                  // [ppf][16]
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t P = w.segs(grp) * w.m, Pp = w.pairs_padded(grp);
    for (int64_t n = 0; n < N; ++n)
      dn[n] = codebook_lut4_tables_scalar(w, x + n * ldx + grp * w.group, grp, tf, tabs + n * ppf * 16);
    const uint16_t* sc = w.scale + grp * w.Mt * 32;
    for (int64_t tile = t0; tile < t1; ++tile) {
      const uint8_t* tc = w.group_codes(grp) + tile * Pp * 16;
      for (int64_t n = 0; n < N; ++n) {
        const int8_t* T = tabs + n * ppf * 16;
        for (int j = 0; j < 32; ++j) {
          int32_t acc = 0;
          for (int64_t q = 0; q < P; ++q) acc += T[q * 16 + ((tc[(q / 2) * 32 + j] >> (4 * (q & 1))) & 15)];
          yp[n * ldy + tile * 32 + j] += f16_to_f32(sc[tile * 32 + j]) * dn[n] * (float)acc;
        }
      }
    }
  }
}

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
  if (w.lut4()) return codebook_lut4_psum_scalar(w, x, ldx, N, g0, g1, t0, t1, yp, ldy, T);
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

// Dequantize-then-multiply: per tile of R rows (8, or 32 on the lut4 layout, whose nibble codes are
// unpacked to [P][32] bytes first), the tile's weights of one group decoded into buf [R][glen], then dotted
// with every token.
void codebook_dequant_scalar(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0,
                             int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* buf) {
  const int64_t R = w.tile();
  uint8_t* unpacked = reinterpret_cast<uint8_t*>(buf + R * w.group);  // lut4 only
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t S = w.segs(grp), glen = S * w.v, k0 = grp * w.group;
    const uint16_t* sc = w.scale + grp * w.Mt * R;
    for (int64_t tile = t0; tile < t1; ++tile) {
      const uint8_t* tc = w.group_codes(grp) + tile * S * w.m * 8;  // [S*m][R]
      if (w.lut4()) {
        codebook_lut4_unpack(w.group_codes(grp) + tile * w.pairs_padded(grp) * 16, S * w.m, unpacked);
        tc = unpacked;
      }
      for (int64_t r = 0; r < R; ++r) {
        const float s = f16_to_f32(sc[tile * R + r]);
        for (int64_t sg = 0; sg < S; ++sg)
          for (int64_t d = 0; d < w.v; ++d) {
            float acc = 0.f;
            for (int64_t i = 0; i < w.m; ++i) acc += w.cb[(i * w.nc + tc[(sg * w.m + i) * R + r]) * w.v + d];
            buf[r * glen + sg * w.v + d] = s * acc;
          }
      }
      for (int64_t n = 0; n < N; ++n)
        for (int64_t r = 0; r < R; ++r) {
          const float* xs = x + n * ldx + k0;
          float acc = 0.f;
          for (int64_t k = 0; k < glen; ++k) acc += buf[r * glen + k] * xs[k];
          yp[n * ldy + tile * R + r] += acc;
        }
    }
  }
}

}  // namespace lowbit
