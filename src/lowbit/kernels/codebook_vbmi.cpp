// codebook, b = 8: the Psumbook with int8 tables looked up 64 rows at a time by AVX-512 VBMI's vpermi2b (paper 004
// on the CPU; the "a 256-entry table of int8 psums is four zmm registers"). Compiled with AVX-512 VBMI flags;
// codebook_kernel picks it on the avx512 / amx levels where CPUID reports VBMI. b = 4: codebook_lut4_psum_avx512;
// other b: codebook_psum_avx2.
//
// The packed layout's blocks of 64 rows ([G][Mt/8][S_g][m][64], codebook.h) give one 64-byte load per (segment,
// codebook) pair and block: the 64 rows' codes of pair q = s*m + i. Per token and group the tables T_q[c] (for v = 4
// and 8 from int16 codebooks and activations by vpdpwssd, build_tables_i16; else float FMAs) become int8 with
// codebook.h's per-pair power-of-two scales (codebook_lut4_scales, as b = 4):
//     Tq_q[c] = round(T_q[c] * inv0 * 2^e_q),  y += s[r, grp] * d * sum_q 2^(E - e_q) Tq_q[code_q(r)],  d = mx/127/2^E
// A lookup of 64 codes: vpmovb2m (bit 7 picks the half), two vpermi2b (entries 0-127 from T0:T1, 128-255 from
// T2:T3), one byte blend. Two pairs' lookups are interleaved (vpunpck{l,h}bw) and added by vpmaddubsw with the pairs'
// multipliers into int16 lanes; the scales' window bound keeps 256 pairs of sums within int16 (codebook.h), then
// the sums go to float. The error against the exact product is the b = 4 kernel's: half a quantum per lookup.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "codebook.h"
#include "common.h"
#include "dispatch.h"

namespace lowbit {
namespace {

struct Table256 {
  __m512i t0, t1, t2, t3;
  explicit Table256(const int8_t* T)
      : t0(_mm512_load_si512(T)), t1(_mm512_load_si512(T + 64)), t2(_mm512_load_si512(T + 128)),
        t3(_mm512_load_si512(T + 192)) {}
  Table256() : t0(_mm512_setzero_si512()), t1(t0), t2(t0), t3(t0) {}
};

inline __m512i lookup256(__m512i idx, const Table256& t) {
  const __mmask64 high = _mm512_movepi8_mask(idx);
  const __m512i lo = _mm512_permutex2var_epi8(t.t0, idx, t.t1), hi = _mm512_permutex2var_epi8(t.t2, idx, t.t3);
  return _mm512_mask_blend_epi8(high, lo, hi);
}


// codebook_lut4_scales (codebook_scalar.cpp) 16 pairs at a time, with the same float operations (a correctly rounded
// division, exponent fields, products with powers of two), so the tables equal the scalar twin's bit for bit; the
// scalar loop (a division and a variable shift a pair) was ~10 % of a table build.
int lut4_scales_avx512(const float* mxq, int64_t P, int64_t Pp, float mx, float* invq, uint32_t* mult) {
  auto first = [](int64_t n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1); };
  const float inv0 = mx > 0.f ? 127.f / mx : 0.f;
  const __m512 vinv0 = _mm512_set1_ps(inv0);
  int64_t A = 0, W = 0;  // the largest window sum of ceil(mx_q * inv0) and the largest window's pair count
  for (int64_t q0 = 0; q0 < Pp; q0 += 256) {
    __m512i a = _mm512_setzero_si512();
    const int64_t qe = std::min(P, q0 + 256);
    for (int64_t q = q0; q < qe; q += 16) {
      const __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(first(qe - q), mxq + q), vinv0);
      a = _mm512_add_epi32(a, _mm512_cvttps_epi32(_mm512_roundscale_ps(t, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)));
    }
    A = std::max<int64_t>(A, _mm512_reduce_add_epi32(a));
    W = std::max(W, std::min(Pp, q0 + 256) - q0);
  }
  int E = 7;
  while (E > 0 && (int64_t(2) * A + W) << E > 65534) --E;
  const __m512 vmx = _mm512_set1_ps(mx);
  const __m512i vE = _mm512_set1_epi32(E), one = _mm512_set1_epi32(1);
  const __m512i odd8 = _mm512_setr_epi32(0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8);
  for (int64_t q = 0; q < Pp; q += 16) {
    const __mmask16 kP = first(P - q);
    const __m512 m = _mm512_maskz_loadu_ps(kP, mxq + q);
    const __mmask16 pos = _mm512_mask_cmp_ps_mask(kP, m, _mm512_setzero_ps(), _CMP_GT_OQ);
    // floor(log2(mx / mx_q)): the quotient's exponent field (>= 1; inf: 128); E where mx_q is 0 or past P
    const __m512i bits = _mm512_castps_si512(_mm512_maskz_div_ps(pos, vmx, m));
    const __m512i ex = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(0xff)), _mm512_set1_epi32(127));
    const __m512i e = _mm512_mask_min_epi32(vE, pos, ex, vE);
    const __m512 pow2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
    _mm512_mask_storeu_ps(invq + q, kP, _mm512_mul_ps(vinv0, pow2));
    // mult[q / 2] = mq[q] | mq[q + 1] << 8 | mq[q] << 16 | mq[q + 1] << 24, mq = 2^(E - e)
    const __m512i sh = _mm512_sllv_epi32(_mm512_sllv_epi32(one, _mm512_sub_epi32(vE, e)), odd8);
    const __m512i w16 = _mm512_or_si512(sh, _mm512_srli_epi64(sh, 32));  // low dword of each qword
    const __m256i words = _mm512_cvtepi64_epi32(_mm512_or_si512(w16, _mm512_slli_epi32(w16, 16)));
    const int64_t nw = std::min<int64_t>(8, (Pp - q) / 2);
    _mm256_mask_storeu_epi32(mult + q / 2, (__mmask8)((1u << nw) - 1), words);
  }
  return E;
}

struct VbmiScratch {
  std::vector<float> mxq, invq, scq, scb, sxs;
  std::vector<int16_t> xq, cbq;  // build_tables_i16, int16_books
  std::vector<float> books_src;   // int16_books: the float codebooks cbq was made from
  bool books_ok = false;
  std::vector<int32_t> dots;      // build_tables_i16: a group's exact sums [P][256]
  bool use_i16 = false;           // tables from int16 operands (v = 4, 8); false for non-finite codebooks, which
                                  // CodebookWeight refuses at load (a raw binding call takes the float build)
  std::vector<int8_t> tab_raw;                    // [N][Pp][256] from the first 64-byte boundary
  int8_t* tab = nullptr;
  std::vector<uint32_t> mult;                     // [N][Pp/2 + 4]
  std::vector<float> d;                           // [N]
};

// T_q[c] = sum_t cb[t][c] * xs[t] for 16 entries c0..c0+15 (V: the vector length, 0: any v).
template <int V>
inline __m512 table16(const float* cb, int64_t v, const __m512* xb, const float* xs, int c0) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t t = 0; t < (V > 0 ? V : v); ++t)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(cb + t * 256 + c0), V > 0 ? xb[t] : _mm512_set1_ps(xs[t]), acc);
  return acc;
}

// 64 table entries as int32 (r[k]: entries 16k..16k+15, |v| <= 127) -> 64 int8 at dst: two saturating packs (exact)
// and one dword permutation back from the packs' lane order (lane l: r0[4l..4l+3], r1[..], r2[..], r3[..] as bytes)
inline void store_entries64(int8_t* dst, const __m512i* r) {
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i packed = _mm512_packs_epi16(_mm512_packs_epi32(r[0], r[1]), _mm512_packs_epi32(r[2], r[3]));
  _mm512_store_si512(dst, _mm512_permutexvar_epi32(order, packed));
}

// One token's int8 tables of group grp, in two passes over the float tables that never store them (the stores of
// 32 KiB of float tables a group, read back once, stalled half of the build): max |T_q| of every pair, the scales,
// then the tables again, quantized.
template <int V>
float build_tables_v(const CodebookWeights& w, const float* xg, int64_t grp, VbmiScratch& s, int8_t* Tq, uint32_t* mult) {
  const int64_t S = w.segs(grp), P = S * w.m, Pp = P + (P & 1);
  __m512 xb[V > 0 ? V : 1];
  // pair q's codebook and inputs (broadcast into xb when V is fixed)
  auto pair = [&](int64_t q, const float*& cb, const float*& xs) {
    cb = w.cbT + (q % w.m) * w.v * 256;
    xs = xg + (q / w.m) * w.v;
    if constexpr (V > 0)
      for (int t = 0; t < V; ++t) xb[t] = _mm512_set1_ps(xs[t]);
  };
  const float *cb, *xs;
  float mx = 0.f;
  for (int64_t q = 0; q < P; ++q) {
    pair(q, cb, xs);
    __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
    for (int c = 0; c < 256; c += 32) {
      m0 = _mm512_max_ps(m0, _mm512_abs_ps(table16<V>(cb, w.v, xb, xs, c)));
      m1 = _mm512_max_ps(m1, _mm512_abs_ps(table16<V>(cb, w.v, xb, xs, c + 16)));
    }
    s.mxq[q] = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    mx = std::max(mx, s.mxq[q]);
  }
  const int E = lut4_scales_avx512(s.mxq.data(), P, Pp, mx, s.invq.data(), mult);
  // |T * inv| <= 127 by the scales' choice; cvtps rounds to nearest even (nearbyint)
  for (int64_t q = 0; q < P; ++q) {
    pair(q, cb, xs);
    const __m512 inv = _mm512_set1_ps(s.invq[q]);
    for (int c = 0; c < 256; c += 64) {
      __m512i r[4];
      for (int k = 0; k < 4; ++k) r[k] = _mm512_cvtps_epi32(_mm512_mul_ps(table16<V>(cb, w.v, xb, xs, c + 16 * k), inv));
      store_entries64(Tq + q * 256 + c, r);
    }
  }
  if (Pp > P) std::memset(Tq + P * 256, 0, 256);
  return mx / 127.f / (float)(1u << E);
}

// The same tables from int16 operands, for v = 4 and 8 (V / 2 vpdpwssd per 16 entries against the float build's V
// FMAs; the build was ~20 % of a 4096x4096 GEMV and most of a 1024x4096 one). The codebooks are int16 per codebook
// (int16_books: cbq = rint(cb * kQ / max|cb_i|)), each segment's activations int16 on its own scale (xq = rint(x * kQ /
// max|x_s|)); then T_q[c] = float(sum_t cbq xq) * (sx_s * scb_i): exact integer dots (|sum| <= 8 kQ^2 < 2^31), the
// int32 -> float rounding, and the scales and quantization of the float build on those T. One pass of dots: a group's
// int32 sums (P x 1 KiB, in L1) are stored while their max is taken, then quantized by one product each (T * inv_q
// folded into (sx_s scb_i) inv_q). Before, the dots ran twice (max pass, quantize pass) and r[16] spilled to the
// stack; with the segment/codebook loops nested (no q / m, q % m per pair): a token's tables at K = 4096, harness
// minimum of 10000 alternating runs, ref-cycles: m1v4b8g128 104-106k -> 77k, m2v8b8g128 159k -> 127-139k.
// (int8 codebooks, vpdpbusd: 1 % error in the centroids, shared by every weight that uses one, cost 3.3 % perplexity
// on SmolLM2-135M m1v4b8g128; these match the float tables.) Tests emulate it in numpy (tests/formats/
// test_codebook.py: int16_operand_tables).
constexpr float kQ = 16383.f;
template <int V>
float build_tables_i16(const CodebookWeights& w, const float* xg, int64_t grp, VbmiScratch& s, int8_t* Tq,
                       uint32_t* mult) {
  static_assert(V == 4 || V == 8, "int16 tables take v = 4 or 8");
  constexpr int NP = V / 2;  // dim pairs of a vector
  const int64_t S = w.segs(grp), P = S * w.m, Pp = P + (P & 1);
  // each segment's max in all its lanes after the in-lane shuffles; 16 lanes = 16 / V segments a step (S * V a
  // multiple of 16 but for a partial last group)
  s.xq.resize(S * V + 16);
  s.sxs.resize(S + 4);
  const __m512 rq = _mm512_set1_ps(kQ);
  for (int64_t j = 0; j < S * V; j += 16) {
    const __mmask16 k = S * V - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (S * V - j)) - 1);
    const __m512 xv = _mm512_maskz_loadu_ps(k, xg + j);
    __m512 m = _mm512_abs_ps(xv);
    m = _mm512_max_ps(m, _mm512_permute_ps(m, 0xB1));  // pairs
    m = _mm512_max_ps(m, _mm512_permute_ps(m, 0x4E));  // quads: a 128-bit lane
    if constexpr (V == 8) m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0xB1));  // 256-bit halves
    const __mmask16 pos = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 inv = _mm512_maskz_div_ps(pos, rq, m);
    _mm256_mask_storeu_epi16(s.xq.data() + j, k, _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(xv, inv))));
    _mm512_mask_compressstoreu_ps(s.sxs.data() + j / V, V == 4 ? (__mmask16)0x1111 : (__mmask16)0x0101,
                                  _mm512_div_ps(m, rq));
  }
  float mx = 0.f;
  s.dots.resize(P * 256 + 16);
  int32_t* dots = s.dots.data() + (-reinterpret_cast<uintptr_t>(s.dots.data()) & 63) / 4;
  const int16_t* xq = s.xq.data();
  const float *sxs = s.sxs.data(), *scb = s.scb.data();
  float *scq = s.scq.data(), *mxq = s.mxq.data();
  for (int64_t seg = 0, q = 0; seg < S; ++seg) {
    __m512i xd[NP];
    for (int k = 0; k < NP; ++k) xd[k] = _mm512_set1_epi32(*(const int32_t*)(xq + seg * V + 2 * k));
    for (int64_t i = 0; i < w.m; ++i, ++q) {
      const int16_t* cb = s.cbq.data() + i * NP * 512;
      int32_t* dq = dots + q * 256;
      __m512i m = _mm512_setzero_si512();
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        __m512i acc = _mm512_setzero_si512();
        for (int k = 0; k < NP; ++k) acc = _mm512_dpwssd_epi32(acc, _mm512_loadu_si512(cb + k * 512 + 32 * j), xd[k]);
        m = _mm512_max_epi32(m, _mm512_abs_epi32(acc));
        _mm512_store_si512(dq + 16 * j, acc);
      }
      scq[q] = sxs[seg] * scb[i];
      mxq[q] = (float)_mm512_reduce_max_epi32(m) * scq[q];
      mx = std::max(mx, mxq[q]);
    }
  }
  const int E = lut4_scales_avx512(s.mxq.data(), P, Pp, mx, s.invq.data(), mult);
  for (int64_t q = 0; q < P; ++q) {
    const __m512 f = _mm512_set1_ps(scq[q] * s.invq[q]);
    for (int c = 0; c < 16; c += 4) {
      __m512i v[4];
      for (int k = 0; k < 4; ++k)
        v[k] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dots + q * 256 + 16 * (c + k))), f));
      store_entries64(Tq + q * 256 + 16 * c, v);
    }
  }
  if (Pp > P) std::memset(Tq + P * 256, 0, 256);
  return mx / 127.f / (float)(1u << E);
}

float build_tables(const CodebookWeights& w, const float* xg, int64_t grp, VbmiScratch& s, int8_t* Tq, uint32_t* mult) {
  const int64_t S = w.segs(grp), P = S * w.m;
  if (codebook_nonfinite(xg, S * w.v)) return codebook_nonfinite_tables(P + (P & 1), 256, Tq, mult);
  if (s.use_i16) return w.v == 4 ? build_tables_i16<4>(w, xg, grp, s, Tq, mult) : build_tables_i16<8>(w, xg, grp, s, Tq, mult);
  switch (w.v) {
    case 4: return build_tables_v<4>(w, xg, grp, s, Tq, mult);
    case 8: return build_tables_v<8>(w, xg, grp, s, Tq, mult);
    default: return build_tables_v<0>(w, xg, grp, s, Tq, mult);
  }
}

// The codebooks as int16 for build_tables_i16: cbq [m][v/2][256][2] (entry c's pair of dims 2k, 2k+1) = rint(cb *
// kQ / max|cb_i|), scb [m] = max|cb_i| / kQ. False where the codebooks hold a non-finite value.
bool int16_books(const CodebookWeights& w, VbmiScratch& s) {
  // the same codebooks as the last call (a model's matrices are called over and over): the conversion is kept
  const size_t nb = (size_t)(w.m * 256 * w.v);
  if (s.books_src.size() == nb && std::memcmp(s.books_src.data(), w.cb, nb * 4) == 0) return s.books_ok;
  s.books_src.assign(w.cb, w.cb + nb);
  s.books_ok = false;
  const int64_t np = w.v / 2;
  s.cbq.resize(w.m * np * 512 + 32);
  s.scb.resize(w.m);
  for (int64_t i = 0; i < w.m; ++i) {
    const float* cb = w.cb + i * 256 * w.v;  // [nc][v], 256 * v a multiple of 16
    __m512 m = _mm512_setzero_ps();
    for (int64_t j = 0; j < 256 * w.v; j += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(cb + j)));
    const float mx = _mm512_reduce_max_ps(m);
    if (!std::isfinite(mx)) return false;
    const float inv = mx > 0.f ? kQ / mx : 0.f;
    s.scb[i] = mx / kQ;
    // [nc][v] in the centroids' order (cvtps: round to nearest even, rint), then each pair of dims to its place
    int16_t* u = s.cbq.data() + i * np * 512;
    int16_t tmp[256 * 8];
    const __m512 vi = _mm512_set1_ps(inv);
    for (int64_t j = 0; j < 256 * w.v; j += 16)
      _mm256_storeu_si256((__m256i*)(tmp + j), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(cb + j), vi))));
    for (int64_t c = 0; c < 256; ++c)
      for (int64_t k = 0; k < np; ++k) std::memcpy(u + (k * 256 + c) * 2, tmp + c * w.v + 2 * k, 4);
  }
  s.books_ok = true;
  return true;
}

// acc16 lo / hi (rows in unpack order: lane l of lo = rows 16l..16l+7, of hi = 16l+8..16l+15) -> y[rows] +=
// scale[row] * d * acc for the first `rows` (<= 64) rows.
inline void flush(__m512i lo, __m512i hi, const uint16_t* sc, float d, float* y, int64_t rows) {
  const __m512i a = _mm512_shuffle_i64x2(lo, hi, 0x44);  // [lo.l0, lo.l1, hi.l0, hi.l1]
  const __m512i b = _mm512_shuffle_i64x2(lo, hi, 0xEE);  // [lo.l2, lo.l3, hi.l2, hi.l3]
  const __m512i r0 = _mm512_shuffle_i64x2(a, a, 0xD8);   // [lo.l0, hi.l0, lo.l1, hi.l1]: rows 0..31
  const __m512i r1 = _mm512_shuffle_i64x2(b, b, 0xD8);   // rows 32..63
  const __m512i parts[2] = {r0, r1};
  const __m512 vd = _mm512_set1_ps(d);
  for (int h = 0; h < 4; ++h) {
    const int64_t r = 16 * h;
    if (r >= rows) break;
    const __m256i half = h & 1 ? _mm512_extracti64x4_epi64(parts[h / 2], 1) : _mm512_castsi512_si256(parts[h / 2]);
    const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(half));
    const __mmask16 k = rows - r >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (rows - r)) - 1);
    const __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, sc + r));
    const __m512 out = _mm512_fmadd_ps(_mm512_mul_ps(s, vd), v, _mm512_maskz_loadu_ps(k, y + r));
    _mm512_mask_storeu_ps(y + r, k, out);
  }
}

// Into L1 on the cores where the compute-heavy streams gain from it (stream_prefetch_l1; a Zen 5: m1v4b8g128 and
// m2v8b8g128 at Llama3-8B's shapes 1.03-1.07x, 1 thread, scripts/codebook_ab.py), else into L2 as before.
const bool kCodesIntoL1 = stream_prefetch_l1();
constexpr int64_t kPrefetchBlocks = 2;  // in runs of kBlocksATable blocks
// The lookups' code loads waited on L2 (perf: 17 % of the kernel's samples on the vpmovb2m after the load). 16 pairs
// ahead into L1: m1v4b8g128 from DRAM, time against ternary's at 4096x4096 1 thread 0.87 -> 0.89, 2 threads 0.76 ->
// 0.79, 4096x14336 0.83 -> 0.85 (8 pairs: 0.82 -> 0.85, 24: level; alternating runs, noisy)
constexpr int64_t kL1Pairs = 16;
constexpr int kMaxTokens = 4;  // codebook_run hands the Psumbook at most 4 tokens a task (more: the AVX2 kernel)

// One block of 64 rows of one group, for NT tokens.
struct Block {
  const uint8_t* codes;  // the block's codes of the group: pair q's 64 rows at codes + q * 64
  int64_t P;
  const int8_t* tab;  // token n's tables at tab + n * tab_stride
  int64_t tab_stride;
  const uint32_t* mult;  // token n's multipliers at mult + n * mult_stride
  int64_t mult_stride;
  const float* d;
  const uint16_t* sc;  // the block's scales
  float* y;            // token n's sums at y + n * ldy
  int64_t ldy;
  const uint8_t* pf;  // the codes to prefetch meanwhile (kPrefetchBlocks blocks ahead), up to pf_end
  const uint8_t* pf_end;
};

// NB consecutive blocks of 64 rows (codes b.codes + j * P * 64, rows 64 j) of one group, token by token: a pair of
// tables (8 zmm) is loaded once for the NB blocks' lookups (with NB = 1 each lookup loaded its four table registers:
// as many loads as vpermi2b).
template <int NB>
void run_blocks(const Block& b, int64_t N) {
  const int64_t P = b.P, bstride = P * 64;
  for (int64_t n = 0; n < N; ++n) {
    __m512i lo[NB], hi[NB];
    for (int j = 0; j < NB; ++j) lo[j] = hi[j] = _mm512_setzero_si512();
    const int8_t* Tn = b.tab + n * b.tab_stride;
    auto flush_all = [&] {
      for (int j = 0; j < NB; ++j) {
        flush(lo[j], hi[j], b.sc + 64 * j, b.d[n], b.y + n * b.ldy + 64 * j, 64);
        lo[j] = hi[j] = _mm512_setzero_si512();
      }
    };
    for (int64_t q = 0; q < P; q += 2) {
      if (n == 0)  // the blocks' codes kPrefetchBlocks ahead into L2 (L1 on cores that prefer it), a line per pair
        for (int j = 0; j < NB; ++j)
          if (const uint8_t* a = b.pf + j * bstride + q * 64; a < b.pf_end) {
            stream_prefetch<2>(a, kCodesIntoL1);
            stream_prefetch<2>(a + 64, kCodesIntoL1);
          }
      const bool pair = q + 1 < P;
      const Table256 ta(Tn + q * 256);
      const Table256 tb = pair ? Table256(Tn + q * 256 + 256) : Table256();
      const __m512i mq = _mm512_set1_epi32((int)b.mult[n * b.mult_stride + q / 2]);
      for (int j = 0; j < NB; ++j) {
        const uint8_t* c = b.codes + j * bstride + q * 64;
        if (q + kL1Pairs < P) {  // from L2 (the prefetch above) into L1, kL1Pairs pairs ahead
          _mm_prefetch((const char*)c + 64 * kL1Pairs, _MM_HINT_T0);
          _mm_prefetch((const char*)c + 64 * kL1Pairs + 64, _MM_HINT_T0);
        }
        const __m512i la = lookup256(_mm512_loadu_si512(c), ta);
        const __m512i lb = pair ? lookup256(_mm512_loadu_si512(c + 64), tb) : _mm512_setzero_si512();
        lo[j] = _mm512_add_epi16(lo[j], _mm512_maddubs_epi16(mq, _mm512_unpacklo_epi8(la, lb)));
        hi[j] = _mm512_add_epi16(hi[j], _mm512_maddubs_epi16(mq, _mm512_unpackhi_epi8(la, lb)));
      }
      if ((q + 2) % 256 == 0 && q + 2 < P) flush_all();  // a window of 256 pairs: the int16 bound's limit
    }
    flush_all();
  }
}

constexpr int kBlocksATable = 4;

}  // namespace

int codebook_lut4_scales_avx512(const float* mxq, int64_t P, int64_t Pp, float mx, float* invq, uint32_t* mult) {
  return lut4_scales_avx512(mxq, P, Pp, mx, invq, mult);
}

void codebook_psum_vbmi(const CodebookWeights& w, const float* x, int64_t ldx, int64_t N, int64_t g0, int64_t g1,
                        int64_t t0, int64_t t1, float* yp, int64_t ldy, float* scratch) {
  if (w.nc == 16) {
    codebook_lut4_psum_avx512(w, x, ldx, N, g0, g1, t0, t1, yp, ldy, scratch);
    return;
  }
  if (w.nc != 256 || N > kMaxTokens) {
    codebook_psum_avx2(w, x, ldx, N, g0, g1, t0, t1, yp, ldy, scratch);
    return;
  }
  // One TLS lookup a call: in a shared object each use of a thread_local calls __tls_get_addr, and GCC recomputes
  // the address rather than keep it (39 calls in this function, 4 % of a 64x4096 call); the empty asm pins it.
  thread_local VbmiScratch s_tls;
  VbmiScratch* sp = &s_tls;
  asm("" : "+r"(sp));
  VbmiScratch& s = *sp;
  const int64_t Pf = w.segs_full() * w.m, Ppf = Pf + (Pf & 1), mstride = Ppf / 2 + 4;
  s.mxq.resize(Ppf + 8);
  s.invq.resize(Ppf + 8);
  s.scq.resize(Ppf + 8);
  s.use_i16 = (w.v == 4 || w.v == 8) && int16_books(w, s);
  s.tab_raw.resize(N * Ppf * 256 + 64);
  s.tab = s.tab_raw.data() + (-reinterpret_cast<uintptr_t>(s.tab_raw.data()) & 63);
  s.mult.resize(N * mstride);
  s.d.resize(N);
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t P = w.segs(grp) * w.m;
    for (int64_t n = 0; n < N; ++n)
      s.d[n] = build_tables(w, x + n * ldx + grp * w.group, grp, s, s.tab + n * Ppf * 256, s.mult.data() + n * mstride);
    const uint8_t* gc = w.group_codes(grp);
    const uint16_t* sc = w.scale + grp * w.Mt * 8;
    // The prefetch runs kPrefetchBlocks runs ahead, and past this group's last rows on into the next group's first
    // ones (elsewhere: [G][Mt/8]...), so its stream starts warm while its tables are built. Before, every group's
    // first runs came in cold: m1v4b8g128 from DRAM, 1 thread, 4096x4096 502 -> 477 us, 1024x4096 207 -> 176,
    // 4096x14336 1962 -> 1814; 2 threads 4096x4096 302 -> 286 (medians of 12 alternating rounds).
    auto prefetch_at = [&](int64_t tb) -> std::pair<const uint8_t*, const uint8_t*> {
      const int64_t ahead = tb + 8 * kBlocksATable * kPrefetchBlocks;
      if (ahead < t1) return {w.tile_codes(grp, ahead), w.tile_codes(grp, t1)};
      if (grp + 1 < g1) return {w.tile_codes(grp + 1, t0 + std::min(ahead - t1, t1 - t0 - 8)), w.tile_codes(grp + 1, t1)};
      return {w.tile_codes(grp, t1), w.tile_codes(grp, t1)};  // none
    };
    for (int64_t tb = t0; tb < t1;) {  // t0, t1 multiples of 8 (codebook_run): whole blocks of 64 rows
      const bool full = t1 - tb >= 8 * kBlocksATable;
      const auto [pf, pf_end] = prefetch_at(tb);
      const Block b{w.tile_codes(grp, tb), P, s.tab, Ppf * 256, s.mult.data(), mstride, s.d.data(), sc + tb * 8,
                    yp + tb * 8, ldy, pf, pf_end};
      if (full) {
        run_blocks<kBlocksATable>(b, N);
        tb += 8 * kBlocksATable;
      } else {
        run_blocks<1>(b, N);
        tb += 8;
      }
    }
  }
}

}  // namespace lowbit
