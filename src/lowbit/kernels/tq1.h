// tq1: ternary weights at 5 trits per byte (1.6 bits/weight), decoded on the fly into the same VNNI
// operand as the integer-code formats (common.h).
//
// Weight w[m,k] = a[m,g] * (c[m,k] - 1), code c = t + 1 in {0,1,2}. So, as for ternary,
//     sum_k w*x = sx[g] * (a * sum_k c*q - a * sum_k q)      over the int8 activations q of group g.
//
// Layout (shapes; Mb = ceil(M/64), Kp = ceil(K/20)*20, nch = Kp/20, G = ceil(Kp/group)):
//     codes: uint8 [Mb][nch][4 tiles][64 bytes]     one chunk = 20 k x 64 rows = 256 bytes
//         tile t, byte p holds the 5 codes of row m = 64*blk + 16*t + p/4 at k = 20*chunk + 4*j + p%4,
//         j = 0..4, as the base-3 number v = sum_j c_j * 3^(4-j) (digit j = 0 most significant), stored
//         scaled like GGUF TQ1_0: byte = ceil(v * 256 / 243). Digit j decodes exactly as
//             c_j = ((uint8_t)(byte * 3^j) * 3) >> 8.
//         So digit j of the 64 bytes of a tile is a [16 rows][4 k] u8 vector: the vpdpbusd operand that
//         meets the four activations q[20*chunk + 4*j .. +3], exactly as bit field j of the int layout.
//         A 256-bit path takes the two 32-byte halves of a tile (rows 0-7, rows 8-15) separately.
//     scale: float16 [Mb][G][64]  (row 64*blk + i at index i); group a multiple of 20 or Kp.
// Padding: rows past M carry byte 0 (codes 0) and scale 0; k past K carries any code (activations are 0).
// Of the 256 byte values 243 are codes; the other 13 never occur.
#pragma once
#include <cstdint>

#include "common.h"

namespace lowbit {

constexpr int kTq1KC = 20;         // k per chunk: 5 trits x 4 consecutive k per 32-bit lane
constexpr int kTq1ChunkBytes = 256;  // 4 tiles x 64 bytes

struct TQ1Weights {
  const uint8_t* codes;   // [Mb][nch][4][64]
  const uint16_t* scale;  // f16 [Mb][G][64]
  int64_t M, Kp, group, Mb, G;
  int64_t nch() const { return Kp / kTq1KC; }
};

// Digit j (0 = most significant) of a stored byte: the decoder every path reproduces.
inline uint32_t tq1_digit(uint32_t byte, int j) {
  static const uint32_t pow3[5] = {1, 3, 9, 27, 81};
  return (((byte * pow3[j]) & 0xffu) * 3u) >> 8;
}

// Row blocks [b0, b1) for all N tokens; y is [N][ldy].
using Tq1Kernel = void (*)(const TQ1Weights&, const ActQ&, float* y, int64_t ldy, int64_t b0, int64_t b1);
void tq1_gemm_scalar(const TQ1Weights&, const ActQ&, float* y, int64_t ldy, int64_t b0, int64_t b1);
void tq1_gemm_avx2(const TQ1Weights&, const ActQ&, float* y, int64_t ldy, int64_t b0, int64_t b1);
void tq1_gemm_avx512(const TQ1Weights&, const ActQ&, float* y, int64_t ldy, int64_t b0, int64_t b1);

// The path for the active ISA: "avx512" with AVX512-VBMI -> the vpermi2b lookup kernel; any other SIMD
// level (and avx512 without VBMI) -> the AVX2 kernel; "scalar" -> the C++ twin. name: the path chosen.
Tq1Kernel tq1_kernel(const char** name);

// y [N][M] = W . q on the thread pool (tasks are runs of row blocks, as linear.cpp); call without the GIL.
void tq1_run(const TQ1Weights& w, const ActQ& a, float* y, Tq1Kernel k);

}  // namespace lowbit
