// codebook in plain C++: the fallback on CPUs without AVX2 and the reference twin of the AVX2 paths
// (layout in codebook.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "codebook.h"
#include "common.h"

namespace lowbit {

int codebook_lut4_scales(const float* mxq, int64_t P, int64_t Pp, float mx, float* invq, uint32_t* mult) {
  // exact float ops only (products with powers of two, exponent fields), so the AVX2 kernel, this twin and the
  // tests' numpy emulation agree bit for bit on the same tables
  const float inv0 = mx > 0.f ? 127.f / mx : 0.f;
  int64_t A = 0, W = 0;  // the largest window sum of ceil(mx_q * inv0) and the largest window's pair count
  for (int64_t q0 = 0; q0 < Pp; q0 += 256) {
    int64_t a = 0;
    for (int64_t q = q0; q < std::min(P, q0 + 256); ++q) {
      const float t = mxq[q] * inv0;  // in [0, 127]
      const int64_t c = (int64_t)t;
      a += c + ((float)c < t);
    }
    A = std::max(A, a);
    W = std::max(W, std::min(Pp, q0 + 256) - q0);
  }
  int E = 7;
  while (E > 0 && (int64_t(2) * A + W) << E > 65534) --E;
  uint32_t mq[2];
  for (int64_t q = 0; q < Pp; ++q) {
    int e = E;  // the pad pair (zero table) and zero tables: the finest step, multiplier 1
    if (q < P && mxq[q] > 0.f) {
      const float quot = mx / mxq[q];  // >= 1; floor(log2) is its exponent field (inf: 128)
      uint32_t bits;
      std::memcpy(&bits, &quot, 4);
      e = std::min<int>(E, (int)((bits >> 23) & 0xff) - 127);
    }
    if (q < P) invq[q] = inv0 * (float)(1u << e);
    mq[q & 1] = 1u << (E - e);
    if (q & 1) mult[q / 2] = mq[0] | mq[1] << 8 | mq[0] << 16 | mq[1] << 24;
  }
  return E;
}

float codebook_nonfinite_tables(int64_t Pp, int64_t nc, int8_t* Tq, uint32_t* mult) {
  std::memset(Tq, 0, Pp * nc);
  for (int64_t p = 0; p < Pp / 2; ++p) mult[p] = 0x01010101u;
  return std::numeric_limits<float>::quiet_NaN();
}

float codebook_lut4_tables_scalar(const CodebookWeights& w, const float* xg, int64_t grp, Lut4Scratch& sb, int8_t* Tq,
                                  uint32_t* mult) {
  const int64_t P = w.segs(grp) * w.m, Pp = w.pairs_padded(grp);
  float amax = 0.f;
  for (int64_t q = 0; q < P; ++q) {
    const int64_t s = q / w.m, i = q % w.m;
    float pm = 0.f;
    for (int c = 0; c < 16; ++c) {
      float acc = 0.f;
      for (int64_t d = 0; d < w.v; ++d) acc += w.cbT[(i * w.v + d) * 16 + c] * xg[s * w.v + d];
      sb.tf[q * 16 + c] = acc;
      pm = std::max(pm, std::fabs(acc));
    }
    sb.mxq[q] = pm;
    amax = std::max(amax, pm);
  }
  if (codebook_nonfinite(sb.tf, P * 16)) return codebook_nonfinite_tables(Pp, 16, Tq, mult);
  const int E = codebook_lut4_scales(sb.mxq, P, Pp, amax, sb.invq, mult);
  for (int64_t q = 0; q < P; ++q)
    for (int c = 0; c < 16; ++c) {
      const float t = std::nearbyint(sb.tf[q * 16 + c] * sb.invq[q]);
      Tq[q * 16 + c] = (int8_t)std::max(-127.f, std::min(127.f, t));
    }
  if (Pp > P) std::memset(Tq + P * 16, 0, 16);
  return amax / 127.f / (float)(1u << E);
}

void codebook_lut4_unpack(const uint8_t* tc, int64_t P, uint8_t* out) {
  for (int64_t q = 0; q < P; ++q)
    for (int j = 0; j < 32; ++j) out[q * 32 + j] = (tc[(q / 2) * 32 + j] >> (4 * (q & 1))) & 15;
}

void codebook_lut4_psum_scalar(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0,
                               int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* scratch) {
  Lut4Scratch sb(scratch, N, w.pairs_padded_full());
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t P = w.segs(grp) * w.m, Pp = w.pairs_padded(grp);
    for (int64_t n = 0; n < N; ++n)
      sb.d[n] = codebook_lut4_tables_scalar(w, x + n * ldx + grp * w.group, grp, sb, sb.tabs(n), sb.mults(n));
    const uint16_t* sc = w.scale + grp * w.Mt * 32;
    for (int64_t tile = t0; tile < t1; ++tile) {
      const uint8_t* tc = w.group_codes(grp) + tile * Pp * 16;
      for (int64_t n = 0; n < N; ++n) {
        const int8_t* T = sb.tabs(n);
        const uint8_t* mb = reinterpret_cast<const uint8_t*>(sb.mults(n));  // byte 4p + (q & 1): pair q's multiplier
        for (int j = 0; j < 32; ++j) {
          int32_t acc = 0;
          for (int64_t q = 0; q < P; ++q)
            acc += mb[(q / 2) * 4 + (q & 1)] * T[q * 16 + ((tc[(q / 2) * 32 + j] >> (4 * (q & 1))) & 15)];
          yp[n * ldy + tile * 32 + j] += f16_to_f32(sc[tile * 32 + j]) * sb.d[n] * (float)acc;
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
      const uint8_t* tc = w.tile_codes(grp, tile);
      for (int64_t n = 0; n < N; ++n) {
        const float* Tn = T + n * Q * w.nc;
        for (int r = 0; r < 8; ++r) {
          float acc = 0.f;
          for (int64_t q = 0; q < Q; ++q) acc += Tn[q * w.nc + tc[q * CodebookWeights::kPairStride + r]];  // q = s*m + i
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
      const uint8_t* tc;  // pair q's R codes at tc + q * PS
      int64_t PS;
      if (w.lut4()) {
        codebook_lut4_unpack(w.group_codes(grp) + tile * w.pairs_padded(grp) * 16, S * w.m, unpacked);
        tc = unpacked;
        PS = R;
      } else {
        tc = w.tile_codes(grp, tile);
        PS = CodebookWeights::kPairStride;
      }
      for (int64_t r = 0; r < R; ++r) {
        const float s = f16_to_f32(sc[tile * R + r]);
        for (int64_t sg = 0; sg < S; ++sg)
          for (int64_t d = 0; d < w.v; ++d) {
            float acc = 0.f;
            for (int64_t i = 0; i < w.m; ++i) acc += w.cb[(i * w.nc + tc[(sg * w.m + i) * PS + r]) * w.v + d];
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
