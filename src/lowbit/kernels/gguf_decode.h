// Native decoders of llama.cpp's GGUF block formats (Q4_0 ... Q6_K, TQ1_0, TQ2_0) to float32, on the
// thread pool, one task per run of rows. Each reproduces gguf-py's gguf.quants.dequantize bit for bit:
// the same float32 operations in the same order (-ffp-contract=off: no FMA), e.g. Q4_K's
// (d * sc) * q - dmin * m. The ternary types also decode losslessly to codes t in {-1, 0, 1} + block scales.
#pragma once
#include <cstdint>

namespace lowbit {

// ggml type ids (gguf.GGMLQuantizationType)
enum GGUFType : int {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13,
  kQ6_K = 14, kTQ1_0 = 34, kTQ2_0 = 35,
};

// Block geometry of a type: values per block and bytes per block; false for a type lowbit does not decode.
bool gguf_block_size(int type, int64_t* values, int64_t* bytes);

// One row: nb blocks -> out float32 [nb * values]; one table per ISA (scalar twin and AVX2).
using GGUFRowFn = void (*)(const uint8_t* blocks, int64_t nb, float* out);
GGUFRowFn gguf_row_scalar(int type);
GGUFRowFn gguf_row_avx2(int type);

// The codes (value + 1, 0..2; TQ2_0 may hold 3) of one TQ1_0 / TQ2_0 block -> c [256].
void gguf_ternary_codes(int type, const uint8_t* block, uint8_t* c);

// data: [R][K / values * bytes]; output row m (of M) is source row rows[m] (or m when rows is null).
// Returns false when an output value is NaN or Inf (the output is complete either way).
bool gguf_dequantize(int type, const uint8_t* data, int64_t K, const int64_t* rows, int64_t M, float* out);

// TQ1_0 / TQ2_0 -> t int8 [M][K] in {-1, 0, 1} and d float32 [M][K / 256] (the blocks' float16 scales), exactly
// what dequantize / d gives: t = 0 in blocks whose d is 0 or not finite. Returns false when a TQ2_0 code is 3
// (the value 2) in a block with a finite nonzero d.
bool gguf_ternary(int type, const uint8_t* data, int64_t K, const int64_t* rows, int64_t M, int8_t* t, float* d);

}  // namespace lowbit
