// codebook: additive vector quantization (AQLM / CodeGEMM), multiplied through a Psumbook.
//
// Weight w[r, k] = s[r, grp] * sum_i C_i[code_i[r, seg], k % v]   (seg = k / v, grp = k / group)
// m codebooks C_i of nc = 2^b centroids of v floats each (one set per tensor); one f16 scale per row and
// group of `group` inputs (a multiple of v).
//
// Psumbook product (CodeGEMM): for each input segment of v values x_seg, the table
//     T[seg][i][c] = sum_t C_i[c][t] * x_seg[t]            (m * nc floats per segment)
// turns the product into lookups:  y[r] = sum_grp s[r, grp] * sum_{seg in grp} sum_i T[seg][i][code_i[r, seg]].
// The tables of one group (S = group/v segments: m*nc*S floats, 32 KiB for m1v4b8g128) are built once per
// token and stay in L1 while every row of the group is looked up.
//
// Layout (Mt = ceil(M/64)*8 tiles of 8 rows, Kp = ceil(K/v)*v, G = ceil(Kp/group), S_g = segments of group g):
//     codes: uint8 [G][Mt/8][S_g][m][64]   blocks of 64 rows: a (segment, codebook) pair's 64 codes are one 64-byte
//            vector (one vpermi2b lookup on AVX-512 VBMI), tile t's 8 rows its bytes 8*(t%8).. (tile_codes). All
//            groups but the last have S = group/v segments.
//     scale: f16 [G][Mt*8]              rows past M have scale 0
//     cbT:   f32 [m][v][nc]             coordinate-major codebooks (table build: v FMAs per 8 entries)
//     cb:    f32 [m][nc][v]             centroid-major codebooks (the dequantize kernel's vector loads)
// Activations: float32 x [N][Kp] (zero past K). For b != 4 the tables are float32, so the Psumbook product
// differs from the dequantized matmul only by float rounding.
//
// b == 4 (nc = 16): the register-table layout. A table of 16 int8 psums is one xmm (broadcast to a ymm),
// looked up for 32 rows by one vpshufb. Row tiles of 32 (Mt = ceil(M/32)); per group the P = S_g*m pairs
// (q = s*m + i) padded to even (Pp; the pad pair has a zero table and code 0):
//     codes: uint8 [G][Mt][Pp_g/2][32]  byte [p][j]: row j's code of pair 2p (low nibble), 2p+1 (high nibble)
//     scale: f16 [G][Mt*32]
// On AVX-512 VBMI a second copy of the codes, made at first use (codebook_make_codes16), feeds
// codebook_lut4_psum_avx512: blocks of 16 rows, pairs padded to a multiple of 8 per group (P8_g; pad code 0):
//     codes16: uint8 [G][2*Mt][P8_g/8][64]  slice s, byte 4j + t: row j's code of pair 8s+t (low nibble), 8s+4+t (high)
// so one vpermb looks up 16 rows x 4 pairs in a register holding those 4 pairs' tables (64 bytes) and one
// vpdpbusd adds each row's 4 lookups, times the pairs' multipliers, into its int32 lane.
// Per (token, group) the float tables T_q (q < P) are quantized to int8 with a power-of-two scale per pair, so that
// pairs with small psums (residual codebooks, segments away from the activation outliers) keep their precision:
//     mx_q = max_c |T_q[c]|, mx = max_q mx_q, inv0 = 127 / mx                         (float32)
//     f_q  = min(7, floor(log2(mx / mx_q)))   (the float32 quotient's exponent; 7 if mx_q == 0)
//     A    = sum_q ceil(mx_q * inv0) over a window of 256 pairs (the most of any window), W = its pair count
//     E    = the largest e in [0, 7] with 2^e * (2A + W) <= 65534
//     e_q  = min(f_q, E);  Tq_q[c] = round(T_q[c] * inv0 * 2^e_q) in [-127, 127];  mult_q = 2^(E - e_q)
// and y += s[r, grp] * d * sum_q mult_q Tq_q[code_q(r)] with d = mx / 127 / 2^E. The lookups of a code vector (pairs
// 2p, 2p+1) are added by one vpmaddubsw with the unsigned multipliers (mult_2p, mult_2p+1) into int16 lanes;
// |mult_q Tq_q| <= 2^E (ceil(mx_q inv0) + 1/2), so a window of 256 pairs (128 steps, then a flush to float) sums to
// at most 2^E (A + W/2) <= 32767: no overflow, and E = 0 always qualifies (2 * 127 * 256 + 256 <= 65534).
// Error per output: at most sum_grp |s[r, grp]| * sum_q (mx / 127 / 2^e_q) / 2 (half a quantum per lookup), never
// more than the single-scale bound sum_grp |s[r, grp]| * P_grp * (mx / 127) / 2.
#pragma once
#include <cstdint>
#include <cstring>

namespace lowbit {

struct CodebookWeights {
  const uint8_t* codes;
  const uint16_t* scale;
  const float* cbT;
  const float* cb;
  int64_t M, Kp, group, m, v, nc, Mt, G;  // Mt: tiles of tile_rows(nc) rows
  const uint8_t* codes16 = nullptr;        // lut4: the AVX-512 layout's copy of the codes (null: not made)
  static int64_t tile_rows(int64_t nc) { return nc == 16 ? 32 : 8; }
  // tiles for M rows: b = 4 tiles of 32; else tiles of 8 in whole blocks of 64 rows
  static int64_t tiles(int64_t M, int64_t nc) { return nc == 16 ? (M + 31) / 32 : (M + 63) / 64 * 8; }
  static constexpr int64_t kPairStride = 64;  // b != 4: bytes from one pair's codes of a tile to the next pair's
  bool lut4() const { return nc == 16; }
  int64_t tile() const { return tile_rows(nc); }
  int64_t segs_full() const { return group / v; }
  int64_t segs(int64_t grp) const {
    const int64_t end = (grp + 1) * group < Kp ? (grp + 1) * group : Kp;
    return (end - grp * group) / v;
  }
  // lut4: (segment, codebook) pairs of a group, padded to even
  int64_t pairs_padded(int64_t grp) const { return (segs(grp) * m + 1) & ~int64_t(1); }
  int64_t pairs_padded_full() const { return (segs_full() * m + 1) & ~int64_t(1); }
  const uint8_t* group_codes(int64_t grp) const {
    return codes + grp * Mt * (lut4() ? pairs_padded_full() * 16 : segs_full() * m * 8);
  }
  // b != 4: tile t's codes of group grp; pair q's 8 rows at + q * kPairStride
  const uint8_t* tile_codes(int64_t grp, int64_t tile) const {
    return group_codes(grp) + (tile / 8) * segs(grp) * m * 64 + (tile % 8) * 8;
  }
  // codes16: pairs of group grp padded to a multiple of 8, the group's codes, one 16-row block's bytes
  int64_t pairs8(int64_t grp) const { return (segs(grp) * m + 7) & ~int64_t(7); }
  int64_t pairs8_full() const { return (segs_full() * m + 7) & ~int64_t(7); }
  const uint8_t* group_codes16(int64_t grp) const { return codes16 + grp * 2 * Mt * pairs8_full() * 8; }
  int64_t codes16_bytes() const { return 2 * Mt * 8 * ((G - 1) * pairs8_full() + pairs8(G - 1)); }
  int64_t codes_bytes() const {
    if (!lut4()) return Mt * (Kp / v) * m * 8;
    return Mt * 16 * ((G - 1) * pairs_padded_full() + pairs_padded(G - 1));
  }
};

// One kernel call: groups [g0, g1), row tiles [t0, t1), tokens x[N][ldx]; adds into yp[N][ldy] (rows of
// the tiles; yp has Mt*8 columns). tables: scratch of >= table_floats(w, N) floats.
using CodebookKernel = void (*)(const CodebookWeights&, const float* x, int64_t ldx, int64_t N, int64_t g0,
                                int64_t g1, int64_t t0, int64_t t1, float* yp, int64_t ldy, float* tables);
int64_t codebook_table_floats(const CodebookWeights& w, int64_t N);

void codebook_psum_scalar(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                          int64_t, float*, int64_t, float*);
void codebook_psum_avx2(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, float*, int64_t, float*);
// b = 8 on AVX-512 VBMI: int8 tables looked up by vpermi2b (codebook_vbmi.cpp); other b or more than 4 tokens: the
// AVX2 kernel
void codebook_psum_vbmi(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, float*, int64_t, float*);
void codebook_dequant_scalar(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                             int64_t, float*, int64_t, float*);
void codebook_dequant_avx2(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, float*, int64_t, float*);
// b == 4 (lut4 layout); the kernels above call these for such weights
void codebook_lut4_psum_scalar(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                               int64_t, float*, int64_t, float*);
void codebook_lut4_psum_avx2(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                             int64_t, float*, int64_t, float*);
// b == 4 on AVX-512 VBMI over codes16 (codebook_lut4_avx512.cpp); without codes16: codebook_lut4_psum_avx2
void codebook_lut4_psum_avx512(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                               int64_t, float*, int64_t, float*);
// the AVX2 table build's two steps, shared with the AVX-512 kernel: float tables tf [P][16] of segments [s0, s1),
// then the int8 tables Tq [Pp][16] and multipliers [Pp/2] of group grp (the pad pair zero); returns d
void codebook_lut4_float_tables_avx2(const CodebookWeights& w, const float* xg, int64_t s0, int64_t s1, float* tf);
float codebook_lut4_finish_avx2(const CodebookWeights& w, int64_t grp, const float* tf, float* mxq, float* invq,
                                int8_t* Tq, uint32_t* mult);
void codebook_lut4_dequant_avx2(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                int64_t, float*, int64_t, float*);
// the per-pair scales above: mxq [P] -> invq [P] (inv0 * 2^e_q), mult [Pp/2] (code vector p: bytes mult_2p,
// mult_2p+1, mult_2p, mult_2p+1; the pad pair's 1); returns E (shared by the AVX2 kernel and its scalar twin)
int codebook_lut4_scales(const float* mxq, int64_t P, int64_t Pp, float mx, float* invq, uint32_t* mult);
// the same 16 pairs at a time with AVX-512 (codebook_vbmi.cpp; VBMI CPUs only), bit for bit the scalar one
int codebook_lut4_scales_avx512(const float* mxq, int64_t P, int64_t Pp, float mx, float* invq, uint32_t* mult);
// Whether x[0..n) holds a NaN or an infinity (an integer test of the exponent fields, which vectorizes). The int8
// table builds check a group's inputs (or float tables) with it and then return codebook_nonfinite_tables: NaN as the
// unit d, so that token's outputs become NaN as the float paths' do; else the non-finite values vanished in the int8
// rounding and the output looked plausible.
inline bool codebook_nonfinite(const float* x, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    any |= (~b & 0x7f800000u) == 0;
  }
  return any != 0;
}
// Zero tables Tq [Pp][nc] and unit multipliers mult [Pp/2] (the lookups stay valid); returns a NaN d.
float codebook_nonfinite_tables(int64_t Pp, int64_t nc, int8_t* Tq, uint32_t* mult);
// a kernel's scratch for N tokens' tables (codebook_table_floats): tabs [N][ppf][16] int8, mults [N][ppf/2],
// d [N], float tables tf [ppf][16], mxq [ppf], invq [ppf]
struct Lut4Scratch {
  int8_t* tab;
  uint32_t* mult;
  float *d, *tf, *mxq, *invq;
  int64_t ppf;
  // mults and mxq/invq padded by 8 pairs: the AVX2 scales work on 8 pairs at a time
  Lut4Scratch(float* s, int64_t N, int64_t ppf_) : ppf(ppf_) {
    tab = reinterpret_cast<int8_t*>(s);
    mult = reinterpret_cast<uint32_t*>(s + N * ppf * 4);
    d = s + N * ppf * 4 + N * (ppf / 2 + 4);
    tf = d + N;
    mxq = tf + ppf * 16;
    invq = mxq + ppf + 8;
  }
  static int64_t floats(int64_t N, int64_t ppf) { return N * ppf * 4 + N * (ppf / 2 + 4) + N + ppf * 18 + 16; }
  int8_t* tabs(int64_t n) const { return tab + n * ppf * 16; }
  uint32_t* mults(int64_t n) const { return mult + n * (ppf / 2 + 4); }
};
// The b = 4 decode kernels' build of the next group's tables in steps between this group's row passes, so the code
// stream goes on while they are built: step() adds per_step segments of float tables (floats(s0, s1)), and once all
// nS are there runs finish(); complete() runs what is left.
template <class Floats, class Finish>
struct StepwiseBuild {
  Floats floats;
  Finish finish;
  int64_t nS, per_step, s_done = 0;
  bool finished;
  StepwiseBuild(Floats f, Finish g, int64_t nS_, int64_t per) : floats(f), finish(g), nS(nS_), per_step(per), finished(nS_ == 0) {}
  void step() {
    if (s_done < nS) {
      const int64_t e = s_done + per_step < nS ? s_done + per_step : nS;
      floats(s_done, e);
      s_done = e;
    } else if (!finished) {
      finish();
      finished = true;
    }
  }
  void complete() {
    while (!finished) step();
  }
};
// one token's int8 tables of group grp: Tq [pairs_padded(grp)][16] and multipliers, returns d (the scalar build)
float codebook_lut4_tables_scalar(const CodebookWeights& w, const float* xg, int64_t grp, Lut4Scratch& sb, int8_t* Tq,
                                  uint32_t* mult);
// a 32-row tile's nibble codes [Pp/2][32] -> bytes [P][32] (code of pair q, row j at [q][j])
void codebook_lut4_unpack(const uint8_t* tc, int64_t P, uint8_t* out);

// matmul's choice (formats/codebook.py use_psum): the Psumbook up to this many tokens, else dequantize; b == 4, and
// b == 8 where the VBMI kernel runs, always take the Psumbook (their lookups cost less per token than decoding m
// codebook vectors per weight: m1v4b8g128 4096x4096, 2 threads, VBMI Psumbook / dequantize at 16, 32, 64, 128 tokens:
// 3.9 / 9.5, 5.0 / 17.1, 9.4 / 30.0, 20.1 / 53.4 ms).
constexpr int64_t kCodebookPsumMaxTokens = 16;
bool codebook_vbmi_active();  // the active ISA's Psumbook for b = 8 is codebook_psum_vbmi
inline bool codebook_use_psum(const CodebookWeights& w, int64_t N) {
  return w.lut4() || N <= kCodebookPsumMaxTokens || (w.nc == 256 && codebook_vbmi_active());
}

// The path for the active ISA ("scalar" -> the C++ twin, avx512 / amx with VBMI -> the VBMI Psumbook for b = 8, any
// SIMD level -> AVX2). psum: the Psumbook kernel, else dequantize-then-multiply. name: the path chosen.
CodebookKernel codebook_kernel(bool psum, const char** name);

// y [N][M] = x [N][Kp] . W^T on the thread pool; call without the GIL.
void codebook_run(const CodebookWeights& w, const float* x, int64_t N, float* y, CodebookKernel k);

// b == 4: w's codes (the nibble layout) -> codes16 [codes16_bytes()] (the AVX-512 layout); on the thread pool.
void codebook_make_codes16(const CodebookWeights& w, uint8_t* codes16);

// The quantizer's nearest-centroid search: out[i] = argmin_c sum_k wt[i][k] (x[i][k] - C[c][k])^2 (first
// minimum on ties), x and wt [n][v] (wt null: all ones), booksT [v][nc] with nc <= 256. On the thread pool.
void codebook_assign(const float* x, const float* wt, const float* booksT, int64_t n, int64_t v, int64_t nc,
                     uint8_t* out);

// The quantizer's code search for additive codebooks (AQLM beam search): per vector a beam of up to `beam`
// distinct code tuples starts at codes[i] (in: the start tuple); for each codebook in turn every member's
// code is replaced by each of the nc centroids and the best `beam` distinct tuples are kept; codes[i] (out)
// is the best tuple. Error sum_t wt[i][t] (x[i][t] - sum_k C_k[code_k][t])^2 (wt null: all ones); it never
// rises above the start's. x, wt [n][v], books [m][nc][v] (nc <= 256), codes [n][m]. On the thread pool;
// deterministic (ties keep the earlier candidate).
void codebook_beam(const float* x, const float* wt, const float* books, int64_t n, int64_t m, int64_t v, int64_t nc,
                   int64_t beam, uint8_t* codes);

}  // namespace lowbit
