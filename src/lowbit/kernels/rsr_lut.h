// rsr-lut: the transposed form of RSR's idea (T-MAC-style table lookup), NOT the paper's RSR.
//
// RSR groups the *outputs* of a block of k rows and sorts the inputs by their k-digit pattern, so each
// pattern's inputs are summed once (a permutation and segment list per block, irregular gathers). The
// transposed form groups g = 4 *inputs*: per token, each chunk c of four inputs gets a table of the 16
// partial sums T_c[p] = sum_{i: bit i of p} x[4c + i], and each output row looks up its 4-bit pattern
// of that chunk: O(M K / 4) lookups for M K weights, no permutation, regular access. On AVX2 one
// vpshufb does 32 lookups of a 16-entry byte table, so the int16 table is split into its low and high
// bytes (two vpshufb) and re-interleaved with vpunpck{l,h}bw; on AVX-512BW a zmm does it for two chunks.
//
// A weight is a sum of binary planes, A = sum_i sign_i 2^shift_i B_i (binary: one plane; ternary:
// +B(t > 0) - B(t < 0); int2 codes: B0 + 2 B1), packed per tile of 64 output rows:
//     w: uint8 [ceil(M/64)][K4 = ceil(K/4)][planes][32]
//        byte j of a chunk's 32: low nibble = row j of the tile, high nibble = row 32 + j;
//        nibble bit i = B[row][4c + i] (rows past M and inputs past K are 0)
// Activations int8 in [-127, 127] (checked by the binding), tables int16: |T| <= 4 * 127 = 508.
// int16 accumulation bound: a chunk adds at most 508 * sum_i 2^shift_i, so kernels widen into int32
// every lut_span(...) = floor(32767 / that) chunks (binary 64, ternary 32).
#pragma once
#include <cstdint>
#include <type_traits>

namespace lowbit {

constexpr int kLutRows = 64;     // output rows per tile
constexpr int kLutMaxPlanes = 4;

struct LutPlanes {
  int planes;
  int shift[kLutMaxPlanes];  // 0..3
  bool neg[kLutMaxPlanes];
};

inline int lut_span(const LutPlanes& p) {
  int w = 0;
  for (int i = 0; i < p.planes; ++i) w += 1 << p.shift[i];
  return 32767 / (508 * w);
}

// One ISA's tile kernel: out [64] int32 = the tile's rows of A . x for one token's tables tab [K4][32 bytes]:
// split (AVX2, scalar; bytes 0..15 the low bytes of T_c[0..15], 16..31 the high bytes, for vpshufb) or, where
// i16_tables, T_c[0..15] as int16 (AVX-512's vpermw).
struct LutKernels {
  const char* name;
  void (*tile)(const uint8_t* wt, const int8_t* tab, int64_t K4, const LutPlanes& p, int32_t* out);
  bool i16_tables = false;
  // Optional: two tiles of a one-plane (binary) matrix at once, out0 / out1 as tile's out for wt0 / wt1.
  void (*tile2_binary)(const uint8_t* wt0, const uint8_t* wt1, const int8_t* tab, int64_t K4, const LutPlanes& p,
                       int32_t* out0, int32_t* out1) = nullptr;
};
// The ISA kernels' tile_n<PLANES> called with the plane count known at run time:
// f(std::integral_constant<int, planes>) for planes 1..kLutMaxPlanes.
template <class F>
inline void lut_with_planes(int planes, F&& f) {
  static_assert(kLutMaxPlanes == 4, "one case per plane count");
  switch (planes) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, 4>{});
  }
}

extern const LutKernels lut_kernels_scalar;
extern const LutKernels lut_kernels_avx2;
extern const LutKernels lut_kernels_avx512;  // AVX-512BW: two chunks a zmm
const LutKernels& lut_kernels();

// tab [K4][32] from x [K] (int8, zero past K), chunks [c0, c1) only; lut_build_tables: N tokens x [N][K] on the
// pool (a few tokens' chunks cut into parts, so a one-token call does not build 2^13 tables on one thread).
void lut_tables(const int8_t* x, int64_t K, int8_t* tab, bool i16, int64_t c0, int64_t c1);
void lut_build_tables(const int8_t* x, int64_t N, int64_t K, int8_t* tab, bool i16);

struct LutCall {
  const uint8_t* w;
  int64_t M, K;
  LutPlanes p;
  const int8_t* tab;      // [N][K4][32]
  int64_t N;
  const float* rowscale;  // [M] or nullptr
  const float* tokscale;  // [N] or nullptr
  float coef;
  bool accumulate;
  float* y;               // [N][ldy]
  int64_t ldy;
};
void lut_run(const LutCall& c, const LutKernels& k);

}  // namespace lowbit
