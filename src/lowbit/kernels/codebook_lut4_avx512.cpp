// codebook b == 4 on AVX-512 VBMI: the register-table Psumbook over the codes16 layout (codebook.h).
//
// The AVX2 kernel looks up one 16-entry table per vpshufb and must interleave two pairs' lookups (vpunpck) before
// vpmaddubsw can add them: 11 vector ops per 64 lookups, a third of them on port 5. Here a zmm holds four pairs'
// tables (64 int8 entries) and codes16 puts a row's codes of those four pairs in one dword, so per 16 rows x 8 pairs
// (one 64-byte code load):
//     idx = (codes & 0x0f) | (t << 4)   (vpternlogd; t = the byte's pair within its dword, the table's quarter)
//     one vpermb per nibble looks up 64 psums, one vpdpbusd (x the pairs' multipliers) adds each row's 4 into int32
// 7 vector ops per 128 lookups, 2 of them on port 5. The tables and multipliers are the AVX2 build's bytes (the same
// power-of-two scales; codebook.h), the sums exact in int32 and turned to float once a group as the AVX2 kernel does
// once a window of 256 pairs, so both give the same bits while a group has at most 256 pairs. For v = 4 the build
// itself runs on zmm (float_tables_v4, finish_v4) with the AVX2 build's operations in its order; other v call the
// AVX2 build.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "codebook.h"
#include "common.h"
#include "dispatch.h"

namespace lowbit {
namespace {

// After the AVX2 build: tables Pp..P8 zeroed (the pad pairs of codes16 look them up with code 0) and the
// multipliers regrouped in place from code vectors of 2 pairs (bytes m_2p, m_2p+1, m_2p, m_2p+1) to one dword of
// 4 pairs (m_4k, .., m_4k+3) per vpdpbusd.
void regroup(int64_t Pp, int64_t P8, int8_t* Tq, uint32_t* mult) {
  if (P8 > Pp) std::memset(Tq + Pp * 16, 0, (P8 - Pp) * 16);
  const int64_t half = Pp / 2;
  for (int64_t k = 0; k < P8 / 4; ++k) {  // reads 2k, 2k + 1 >= k: in place
    const uint32_t a = 2 * k < half ? mult[2 * k] & 0xffffu : 0u;
    const uint32_t b = 2 * k + 1 < half ? mult[2 * k + 1] & 0xffffu : 0u;
    mult[k] = a | b << 16;
  }
}

// The table build for v = 4 on zmm: the AVX2 build's operations in the same order (so the same bytes), 16 entries
// a register. Float tables of segments [s0, s1) into tf; returns whether one of them is not finite.
bool float_tables_v4(const CodebookWeights& w, const float* xg, int64_t s0, int64_t s1, float* tf) {
  __mmask16 bad = 0;
  for (int64_t i = 0; i < w.m; ++i) {
    const float* cb = w.cbT + i * 64;  // C_i^T [4][16]
    const __m512 c0 = _mm512_loadu_ps(cb), c1 = _mm512_loadu_ps(cb + 16);
    const __m512 c2 = _mm512_loadu_ps(cb + 32), c3 = _mm512_loadu_ps(cb + 48);
    for (int64_t s = s0; s < s1; ++s) {
      const float* xs = xg + s * 4;
      const __m512 t = _mm512_add_ps(_mm512_fmadd_ps(c1, _mm512_set1_ps(xs[1]), _mm512_mul_ps(c0, _mm512_set1_ps(xs[0]))),
                                     _mm512_fmadd_ps(c3, _mm512_set1_ps(xs[3]), _mm512_mul_ps(c2, _mm512_set1_ps(xs[2]))));
      bad |= _mm512_fpclass_ps_mask(t, 0x99);  // QNaN, +-Inf, SNaN
      _mm512_storeu_ps(tf + (s * w.m + i) * 16, t);
    }
  }
  return bad != 0;
}

// max over the lanes of each of 16 vectors; result lane 4L + j holds v[4j + L]'s (a transposed order)
inline __m512 hmax16(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int k = 0; k < 8; ++k)
    a[k] = _mm512_max_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44), _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
  for (int k = 0; k < 4; ++k)
    b[k] = _mm512_max_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x88), _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xDD));
  for (int k = 0; k < 2; ++k)
    c[k] = _mm512_max_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0x88), _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0xDD));
  return _mm512_max_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}

// The int8 tables of group grp from tf (codebook_lut4_finish_avx2's bytes: pair maxima, the per-pair scales, the
// quantization), zeroed past P up to P8, and the 4-pair multipliers; returns d.
float finish_v4(const CodebookWeights& w, int64_t grp, const float* tf, bool bad, Lut4Scratch& sb, int8_t* Tq,
                uint32_t* mult) {
  const int64_t P = w.segs(grp) * w.m, Pp = w.pairs_padded(grp), P8 = w.pairs8(grp);
  if (bad) {
    const float d = codebook_nonfinite_tables(Pp, 16, Tq, mult);
    regroup(Pp, P8, Tq, mult);
    return d;
  }
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512 amax = _mm512_setzero_ps();
  for (int64_t q0 = 0; q0 < P; q0 += 16) {
    __m512 v[16];
    for (int j = 0; j < 16; ++j)
      v[j] = q0 + j < P ? _mm512_and_ps(_mm512_loadu_ps(tf + (q0 + j) * 16), absmask) : _mm512_setzero_ps();
    const __m512 mx16 = _mm512_permutexvar_ps(order, hmax16(v));
    _mm512_storeu_ps(sb.mxq + q0, mx16);
    amax = _mm512_max_ps(amax, mx16);
  }
  const float mx = _mm512_reduce_max_ps(amax);
  const int E = codebook_lut4_scales_avx512(sb.mxq, P, Pp, mx, sb.invq, mult);
  for (int64_t q = 0; q < P; ++q) {
    const __m512i iq = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(tf + q * 16), _mm512_set1_ps(sb.invq[q])));
    _mm_storeu_si128((__m128i*)(Tq + q * 16), _mm512_cvtsepi32_epi8(iq));
  }
  if (Pp > P) std::memset(Tq + P * 16, 0, 16);  // the pad pair, as the AVX2 build; regroup zeroes the rest to P8
  regroup(Pp, P8, Tq, mult);
  return mx / 127.f / (float)(1u << E);
}

// One token's tables of group grp in one go.
float build(const CodebookWeights& w, const float* xg, int64_t grp, Lut4Scratch& sb, int8_t* Tq, uint32_t* mult) {
  if (w.v == 4) return finish_v4(w, grp, sb.tf, float_tables_v4(w, xg, 0, w.segs(grp), sb.tf), sb, Tq, mult);
  codebook_lut4_float_tables_avx2(w, xg, 0, w.segs(grp), sb.tf);
  const float d = codebook_lut4_finish_avx2(w, grp, sb.tf, sb.mxq, sb.invq, Tq, mult);
  regroup(w.pairs_padded(grp), w.pairs8(grp), Tq, mult);
  return d;
}

// Four 16-row blocks (codes of block r at c + r * bstride) x one token over the group's `slices` (>= 1) slices of 8
// pairs: out[16 r + i] = the int32 sum of block r's row i, as lookup16's loop below computes it, in asm. GCC kept the
// eight accumulators of that loop in registers but copied each one to another register and back around its
// vpdpbusd (16 extra moves a slice): in L1 3.4 cycles per 64 code bytes, the asm 2.4 (a Zen 5; the same sums).
//   zmm0-3 / zmm4-7: the blocks' sums of the low / high nibbles' pairs; zmm8, zmm9: the slice's two tables;
//   zmm10, zmm11: their multipliers; zmm12, zmm13: a block's indices, then its looked-up psums; zmm14, zmm15: 0x0f
//   and the quarter selector. PF: a prefetch of pf + (s * 4 + r) * 64 into L2 (1, prefetcht1) or L1 (2, prefetcht0),
//   as lookup16's.
#define LOWBIT_LK_ROW(P, ADDR, A, B)                                                                  \
  P "vmovdqu64 " ADDR ", %%zmm12\n\tvpsrlw $4, %%zmm12, %%zmm13\n\t"                                  \
    "vpternlogd $0xEA, %%zmm15, %%zmm14, %%zmm12\n\tvpternlogd $0xEA, %%zmm15, %%zmm14, %%zmm13\n\t" \
    "vpermb %%zmm8, %%zmm12, %%zmm12\n\tvpermb %%zmm9, %%zmm13, %%zmm13\n\t"                       \
    "vpdpbusd %%zmm12, %%zmm10, %%zmm" #A "\n\tvpdpbusd %%zmm13, %%zmm11, %%zmm" #B "\n\t"
#define LOWBIT_LK_PF(H, K) "prefetch" H " " #K "(%[pf])\n\t"
#define LOWBIT_LK_BODY(P0, P1, P2, P3)                                                                                       \
  "vpxord %%xmm0, %%xmm0, %%xmm0\n\tvpxord %%xmm1, %%xmm1, %%xmm1\n\tvpxord %%xmm2, %%xmm2, %%xmm2\n\t"                      \
  "vpxord %%xmm3, %%xmm3, %%xmm3\n\tvpxord %%xmm4, %%xmm4, %%xmm4\n\tvpxord %%xmm5, %%xmm5, %%xmm5\n\t"                      \
  "vpxord %%xmm6, %%xmm6, %%xmm6\n\tvpxord %%xmm7, %%xmm7, %%xmm7\n\t"                                                       \
  "vpbroadcastd %k[lowv], %%zmm14\n\tvpbroadcastd %k[selv], %%zmm15\n\t"                                                      \
  "1:\n\t"                                                                                                                   \
  "vmovdqu64 (%[t]), %%zmm8\n\tvmovdqu64 64(%[t]), %%zmm9\n\t"                                                               \
  "vpbroadcastd (%[m]), %%zmm10\n\tvpbroadcastd 4(%[m]), %%zmm11\n\t"                                                        \
  LOWBIT_LK_ROW(P0, "(%[c])", 0, 4) LOWBIT_LK_ROW(P1, "(%[c],%[bs],1)", 1, 5)                                                 \
  LOWBIT_LK_ROW(P2, "(%[c],%[bs],2)", 2, 6) LOWBIT_LK_ROW(P3, "(%[c],%[bs3],1)", 3, 7)                                        \
  "add $64, %[c]\n\tsub $-128, %[t]\n\tadd $8, %[m]\n\tadd $256, %[pf]\n\tdec %[n]\n\tjnz 1b\n\t"                             \
  "vpaddd %%zmm4, %%zmm0, %%zmm0\n\tvpaddd %%zmm5, %%zmm1, %%zmm1\n\t"                                                       \
  "vpaddd %%zmm6, %%zmm2, %%zmm2\n\tvpaddd %%zmm7, %%zmm3, %%zmm3\n\t"                                                       \
  "vmovdqu32 %%zmm0, (%[out])\n\tvmovdqu32 %%zmm1, 64(%[out])\n\tvmovdqu32 %%zmm2, 128(%[out])\n\tvmovdqu32 %%zmm3, 192(%[out])\n\t"
#define LOWBIT_LK_OPS                                                                                                        \
  : [c] "+r"(c), [t] "+r"(Tq), [m] "+r"(m4), [pf] "+r"(pf), [n] "+r"(n)                                                      \
  : [bs] "r"(bstride), [bs3] "r"(bs3), [lowv] "r"(0x0f0f0f0fu), [selv] "r"(0x30201000u), [out] "r"(out)                    \
  : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",       \
    "xmm14", "xmm15", "cc", "memory"
template <int PF>
inline void lookup16x4_sums(const uint8_t* c, int64_t bstride, int64_t slices, const int8_t* Tq, const uint32_t* m4,
                            int32_t* out, const uint8_t* pf) {
  const int64_t bs3 = 3 * bstride;
  int64_t n = slices;
  if (PF == 1)
    __asm__ volatile(LOWBIT_LK_BODY(LOWBIT_LK_PF("t1", 0), LOWBIT_LK_PF("t1", 64), LOWBIT_LK_PF("t1", 128),
                                    LOWBIT_LK_PF("t1", 192)) LOWBIT_LK_OPS);
  else if (PF == 2)
    __asm__ volatile(LOWBIT_LK_BODY(LOWBIT_LK_PF("t0", 0), LOWBIT_LK_PF("t0", 64), LOWBIT_LK_PF("t0", 128),
                                    LOWBIT_LK_PF("t0", 192)) LOWBIT_LK_OPS);
  else __asm__ volatile(LOWBIT_LK_BODY("", "", "", "") LOWBIT_LK_OPS);
}
#undef LOWBIT_LK_ROW
#undef LOWBIT_LK_PF
#undef LOWBIT_LK_BODY
#undef LOWBIT_LK_OPS

// dst[i] += (scale[i] * d) * the float of sum[i], 16 rows (the group's float step of lookup16).
inline void add_scaled16(__m512i sum, const uint16_t* scale, __m512 dv, float* dst) {
  const __m512 s = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)scale)), dv);
  _mm512_storeu_ps(dst, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(sum), _mm512_loadu_ps(dst)));
}

// R blocks of 16 rows (codes of block r at c + r * bstride) x one token: y[row] += s[row] * d * sum_q mult_q
// Tq[q][code(row, q)] over the group's slices of 8 pairs. PF: one prefetch per code load, at the same offset from pf,
// into L2 (1) or L1 (2; stream_prefetch_l1), or none (0).
template <int R, int PF>
inline void lookup16(const uint8_t* c, int64_t bstride, int64_t slices, const int8_t* Tq, const uint32_t* m4, float d,
                     const uint16_t* sc, float* dst, const uint8_t* pf) {
  const __m512 dv = _mm512_set1_ps(d);
  if constexpr (R == 4) {
    if (slices > 0) {
      alignas(64) int32_t sums[64];
      lookup16x4_sums<PF>(c, bstride, slices, Tq, m4, sums, pf);
      for (int r = 0; r < R; ++r) add_scaled16(_mm512_load_si512(sums + 16 * r), sc + 16 * r, dv, dst + 16 * r);
      return;
    }
  }
  const __m512i low4 = _mm512_set1_epi8(0x0f), sel = _mm512_set1_epi32(0x30201000);
  __m512i a[R], b[R];
  for (int r = 0; r < R; ++r) a[r] = b[r] = _mm512_setzero_si512();
  for (int64_t s = 0; s < slices; ++s) {
    const __m512i t0 = _mm512_loadu_si512(Tq + s * 128), t1 = _mm512_loadu_si512(Tq + s * 128 + 64);
    const __m512i u0 = _mm512_set1_epi32((int32_t)m4[2 * s]), u1 = _mm512_set1_epi32((int32_t)m4[2 * s + 1]);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      // L2 or L1 by the core (stream_prefetch_l1): into L1 the one-token GEMV from DRAM ran 1.2-1.4x slower than
      // into L2 on a Zen 4 (m2v4b4g128 at Llama3-8B's shapes, 1 thread, scripts/codebook_ab.py 1 3: 0.54-0.68x
      // ternary with T0, 0.71-0.98x with T1) and ~1.17x faster on a Zen 5 (0.65-0.72x with T1, 0.74-0.85x with T0)
      if (PF) stream_prefetch<1>(pf + (s * R + r) * 64, PF == 2);
      const __m512i cv = _mm512_loadu_si512(c + r * bstride + s * 64);
      const __m512i i0 = _mm512_ternarylogic_epi32(cv, low4, sel, 0xEA);  // (cv & low4) | sel
      const __m512i i1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(cv, 4), low4, sel, 0xEA);
      a[r] = _mm512_dpbusd_epi32(a[r], u0, _mm512_permutexvar_epi8(i0, t0));
      b[r] = _mm512_dpbusd_epi32(b[r], u1, _mm512_permutexvar_epi8(i1, t1));
    }
  }
  for (int r = 0; r < R; ++r) add_scaled16(_mm512_add_epi32(a[r], b[r]), sc + 16 * r, dv, dst + 16 * r);
}

constexpr int kBlocks = 4;         // 16-row blocks per table load (64 rows: 8 int32 accumulators)
// The scales (f16 [G][Mt*32], a second stream beside the codes: 1/16 of their bytes) are prefetched this far ahead of
// the kBlocks blocks' scales being read (2 lines a pass, at the codes' level). Without it their loads waited on DRAM
// (the hardware prefetchers do little for these streams): m2v4b4g128 from DRAM at Llama3-8B's shapes, 1 thread,
// scripts/codebook_ab.py 1 2 (a Zen 5, alternating): 1024x4096 0.69-0.71x -> 0.78-0.82x ternary, 4096x14336
// 0.76-0.78x -> 0.81x, 4096x4096 0.73-0.74x -> 0.77-0.82x, 14336x4096 level (0.81-0.82x); 4 KB ahead alike.
constexpr int64_t kScalePrefetchBytes = 1024;

template <int PF>
inline void prefetch_scales(const uint16_t* sc) {
  const char* p = reinterpret_cast<const char*>(sc) + kScalePrefetchBytes;
  stream_prefetch<1>(p, PF == 2);
  stream_prefetch<1>(p + 64, PF == 2);
}
constexpr int64_t kBuildSegs = 4;  // segments of the next group's float tables built per pass of the decode loop

// The task's code stream of group grp (blocks [2 t0, 2 t1), contiguous) and where a prefetch kPrefetchBytes ahead
// of `here` lands: on in this stream, then in the next group's (elsewhere), clamped to the last line.
struct Stream {
  const uint8_t *base, *next, *last;
  int64_t len;
  const uint8_t* ahead(const uint8_t* here) const {
    const int64_t a = here - base + kPrefetchBytes;
    return std::min(a < len ? base + a : next + (a - len), last);
  }
};

Stream stream(const CodebookWeights& w, int64_t grp, int64_t g1, int64_t t0, int64_t t1) {
  const int64_t bstride = w.pairs8(grp) * 8;
  const uint8_t* last = w.codes16 + w.codes16_bytes() - 64;
  const uint8_t* next = grp + 1 < g1 ? w.group_codes16(grp + 1) + 2 * t0 * w.pairs8(grp + 1) * 8 : last;
  return {w.group_codes16(grp) + 2 * t0 * bstride, next, last, 2 * (t1 - t0) * bstride};
}

// One token (decode): the next group's tables are built in steps between this group's passes, into the other
// half of a double buffer, so the code stream goes on while they are built (as the AVX2 kernel's decode).
template <int PF>
void psum_decode(const CodebookWeights& w, const float* x, int64_t g0, int64_t g1, int64_t t0, int64_t t1, float* yp,
                 Lut4Scratch& sb) {
  sb.d[0] = build(w, x + g0 * w.group, g0, sb, sb.tabs(0), sb.mults(0));
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t slot = (grp - g0) & 1, next = slot ^ 1;
    const int64_t slices = w.pairs8(grp) / 8, bstride = slices * 64;
    const uint16_t* sc = w.scale + grp * w.Mt * 32;
    const uint8_t* gc = w.group_codes16(grp);
    const int8_t* tq = sb.tabs(slot);
    const uint32_t* mu = sb.mults(slot);
    const float d = sb.d[slot];
    const float* nx = x + (grp + 1) * w.group;
    bool bad = false;
    StepwiseBuild nb(
        [&](int64_t s0, int64_t s1) {
          if (w.v == 4) bad |= float_tables_v4(w, nx, s0, s1, sb.tf);
          else codebook_lut4_float_tables_avx2(w, nx, s0, s1, sb.tf);
        },
        [&] {
          if (w.v == 4) {
            sb.d[next] = finish_v4(w, grp + 1, sb.tf, bad, sb, sb.tabs(next), sb.mults(next));
          } else {
            sb.d[next] = codebook_lut4_finish_avx2(w, grp + 1, sb.tf, sb.mxq, sb.invq, sb.tabs(next), sb.mults(next));
            regroup(w.pairs_padded(grp + 1), w.pairs8(grp + 1), sb.tabs(next), sb.mults(next));
          }
        },
        grp + 1 < g1 ? w.segs(grp + 1) : 0, kBuildSegs);
    const Stream st = stream(w, grp, g1, t0, t1);
    int64_t b = 2 * t0;
    for (; b + kBlocks <= 2 * t1; b += kBlocks) {
      const uint8_t* here = gc + b * bstride;
      prefetch_scales<PF>(sc + b * 16);
      lookup16<kBlocks, PF>(here, bstride, slices, tq, mu, d, sc + b * 16, yp + b * 16, st.ahead(here));
      nb.step();
    }
    for (; b < 2 * t1; ++b) {
      const uint8_t* here = gc + b * bstride;
      lookup16<1, PF>(here, bstride, slices, tq, mu, d, sc + b * 16, yp + b * 16, st.ahead(here));
    }
    nb.complete();
  }
}

// N tokens (a few, codebook_run's token chunks): each group's tables for every token, then the blocks token by token.
template <int PF>
void psum_tokens(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0, int64_t g1, int64_t t0,
                 int64_t t1, float* yp, int64_t ldy, Lut4Scratch& sb) {
  for (int64_t grp = g0; grp < g1; ++grp) {
    for (int64_t n = 0; n < N; ++n)
      sb.d[n] = build(w, x + n * ldx + grp * w.group, grp, sb, sb.tabs(n), sb.mults(n));
    const int64_t slices = w.pairs8(grp) / 8, bstride = slices * 64;
    const uint16_t* sc = w.scale + grp * w.Mt * 32;
    const uint8_t* gc = w.group_codes16(grp);
    const Stream st = stream(w, grp, g1, t0, t1);
    int64_t b = 2 * t0;
    // the first token's pass prefetches the stream; the others find the codes in L1
    for (; b + kBlocks <= 2 * t1; b += kBlocks) {
      const uint8_t* here = gc + b * bstride;
      prefetch_scales<PF>(sc + b * 16);
      lookup16<kBlocks, PF>(here, bstride, slices, sb.tabs(0), sb.mults(0), sb.d[0], sc + b * 16, yp + b * 16,
                            st.ahead(here));
      for (int64_t n = 1; n < N; ++n)
        lookup16<kBlocks, 0>(here, bstride, slices, sb.tabs(n), sb.mults(n), sb.d[n], sc + b * 16,
                             yp + n * ldy + b * 16, nullptr);
    }
    for (; b < 2 * t1; ++b) {
      const uint8_t* here = gc + b * bstride;
      for (int64_t n = 0; n < N; ++n)
        lookup16<1, 0>(here, bstride, slices, sb.tabs(n), sb.mults(n), sb.d[n], sc + b * 16,
                       yp + n * ldy + b * 16, nullptr);
    }
  }
}

}  // namespace

void codebook_lut4_psum_avx512(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0,
                               int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* scratch) {
  if (!w.codes16) {
    codebook_lut4_psum_avx2(w, x, ldx, N, g0, g1, t0, t1, yp, ldy, scratch);
    return;
  }
  const int64_t pp8 = w.pairs8_full();
  if (N == 1) {
    Lut4Scratch sb(scratch, 2, pp8);  // two tokens' room: the double buffer
    if (stream_prefetch_l1()) psum_decode<2>(w, x, g0, g1, t0, t1, yp, sb);
    else psum_decode<1>(w, x, g0, g1, t0, t1, yp, sb);
    return;
  }
  Lut4Scratch sb(scratch, N, pp8);
  if (stream_prefetch_l1()) psum_tokens<2>(w, x, ldx, N, g0, g1, t0, t1, yp, ldy, sb);
  else psum_tokens<1>(w, x, ldx, N, g0, g1, t0, t1, yp, ldy, sb);
}

}  // namespace lowbit
