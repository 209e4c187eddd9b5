// RSR / RSR++ (paper 003): y = x . W^T through a preprocessed index instead of the weight bits.
//
// Index of a digit matrix D [M, K] (digits 0..base-1 standing for values[d]; see formats/rsr_index.py):
//     output rows in blocks of k (nblocks = ceil(M/k)); for block i the key of input j is the base-`base`
//     number of D[ik .. ik+k-1, j] (first row most significant); S = base^k keys.
//     perm: uint16 or uint32 [nblocks][K]    inputs sorted by key (the binary row order)
//     seg:  uint16 or uint32 [nblocks][S+1]  seg[p] = first position in perm with key p; seg[S] = K
// Activations token-minor: xT [K][ldx], so one permuted index loads a contiguous run of tokens.
// Per block and token tile: step 1, u[p][t] = sum_{l in [seg[p], seg[p+1])} xT[perm[l]][t];
// step 2, r[c][t] = sum_p values[digit c of p] * u[p][t]  (RSR: O(k S); RSR++: folding, O(S)).
//
// int8 activations: step 1 adds int8 into int16 for at most kI16Rows rows, then widens into int32.
// Bound: activations are in [-127, 127] (checked by the binding), 258 * 127 = 32766 <= 32767, so no run of
// 258 rows can overflow int16. Step 2 stays in int32: |r| <= K * max|value| * 127 < 2^31 (checked).
#pragma once
#include <cstdint>

namespace lowbit {

constexpr int kRsrMaxBase = 16;
constexpr int kRsrTileF32 = 64;  // tokens per tile: 8 ymm of float accumulators
// 4 ymm of int16 accumulators. 64 tokens, not 128: each gathered row is then one cache line of xT and a
// pass over K touches half of xT (K x 64 bytes). Ternary at N = 128, k = 4, 1 thread, CPU time, alternating
// with a 128-token build: 2560x2560 87-96 -> 96-102 G weight-tokens/s, 2560x6912 87-88 -> 91-92.
constexpr int kRsrTileI8 = 64;
constexpr int kI16Rows = 258;    // 258 * 127 <= INT16_MAX

struct RsrIndex {
  const void* perm;
  const void* seg;
  bool perm32, seg32;
  int64_t M, K, k, base, S, nblocks;
  float valf[kRsrMaxBase];
  int32_t vali[kRsrMaxBase];
  int64_t seg_at(int64_t blk, int64_t p) const {
    const int64_t o = blk * (S + 1) + p;
    return seg32 ? (int64_t)((const uint32_t*)seg)[o] : (int64_t)((const uint16_t*)seg)[o];
  }
};

// One ISA's block kernels: step 1 + step 2 of block blk for nt tokens of xT (already offset to the
// tile's first token; rows ldx apart; nt = 1, or a multiple of 8 (f32) up to kRsrTileF32 / of 16 (i8) up to kRsrTileI8).
// u: scratch [S][nt]; r: out [k][nt]; c: scratch [K + 4] for one token (nt = 1), where step 1 is a
// prefix sum along the permutation, C[l] = sum_{l' < l} x[perm[l']], and u[p] = C[seg[p+1]] - C[seg[p]]:
// no branch per segment (segments average K / S rows, so a loop per segment mispredicts at each exit).
// With nt = 1 the int8 xT must be readable 3 bytes past K (the AVX2 path gathers 4-byte words).
struct RsrKernels {
  const char* name;
  void (*block_f32)(const RsrIndex&, int64_t blk, const float* xT, int64_t ldx, int nt, bool plus, float* u, float* r,
                    float* c);
  void (*block_i8)(const RsrIndex&, int64_t blk, const int8_t* xT, int64_t ldx, int nt, bool plus, int32_t* u,
                   int32_t* r, int32_t* c);
};
extern const RsrKernels rsr_kernels_scalar;
extern const RsrKernels rsr_kernels_avx2;
extern const RsrKernels rsr_kernels_avx512;
// The path for the active ISA: AVX-512 for "avx512" and "amx", AVX2 for "avx2" and "avxvnni", else scalar.
const RsrKernels& rsr_kernels();

struct RsrCall {
  RsrIndex ix;
  const void* xT;     // float or int8 [K][ldx]
  bool i8;
  int64_t ldx, N;     // N real tokens (<= ldx)
  bool plus;
  const float* rowscale;  // [M] or nullptr (1)
  const float* tokscale;  // [N] or nullptr (1)
  float coef;
  bool accumulate;    // y += ... instead of y = ...
  float* y;           // [N][ldy]
  int64_t ldy;
};
// Runs the call on the thread pool (tasks: runs of blocks x token tiles); call without the GIL.
void rsr_run(const RsrCall& c, const RsrKernels& k);

// The paper's "Standard" baseline: y[m] = sum_k w[m][k] x[k] over a uint8 {0,1} matrix, plain C++.
void standard_gemv_u8(const uint8_t* w, const float* x, float* y, int64_t M, int64_t K);

}  // namespace lowbit
