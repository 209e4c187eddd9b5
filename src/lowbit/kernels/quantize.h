// Native weight quantizers: float32 / float16 / bfloat16 rows -> the integer-code layout of common.h
// (codes [Mb][nch][4][64], float16 scales and offsets [Mb][G][64]), on the thread pool, one row block of
// 64 per task. Each method reproduces its numpy reference in lowbit/formats bit for bit: the same float
// operations in the same order (no FMA contraction: these files build with -ffp-contract=off), numpy's
// pairwise summation for sums, round-half-even everywhere.
#pragma once
#include <cmath>
#include <cstdint>

namespace lowbit {

enum QuantSrcKind : int { kSrcF32 = 0, kSrcF16 = 1, kSrcBF16 = 2 };
enum QuantMethod : int {
  kQuantInt8 = 0,    // absmax/127 per group, symmetric codes c = clip(rint(w/a), -127, 127) + 128
  kQuantAffine = 1,  // int4/int2: least-squares search over clipping ratios (formats/int4.py fit_affine)
  kQuantBinary = 2,  // c = (w >= 0), a = 2 * mean|w| per group (formats/binary.py)
};

struct QuantSource {
  const void* data;      // [rows][K] of kind
  int kind;              // QuantSrcKind
  int64_t M, K;
  const int64_t* rows;   // [M] source row of each output row, or nullptr (identity)
};

struct QuantSpec {
  int method;            // QuantMethod
  int bits;              // 1, 2, 4, 8; 6 (affine, 64 levels) packs two planes: QuantOut::codes_hi
  int64_t group;         // a multiple of 32, or Kp
  bool symmetric;        // affine only
  const double* ratios;  // affine only: the clipping ratios, in search order
  int nratios;
};

struct QuantOut {
  uint8_t* codes;        // [Mb * Kp * 64 * bits / 8]; bits 6: the codes' low 4 bits, the 4-bit layout
  uint16_t* scale;       // f16 [Mb][G][64]
  uint16_t* offset;      // f16 [Mb][G][64], or nullptr (affine asymmetric needs it)
  uint8_t* codes_hi = nullptr;  // bits 6 only: the codes' high 2 bits, the 2-bit layout [Mb * Kp * 64 * 2 / 8]
};

// Per-row work, one table per ISA (scalar twin and AVX2), picked by the active kernel level.
struct QuantRowKernels {
  // src row of `kind`, K values -> dst float32 [n >= K], zero-padded; returns false on NaN / Inf
  bool (*load_row)(const void* src, int kind, int64_t K, float* dst, int64_t n);
  // w: float32 [G * group] (zero-padded) -> codes [G * group], a [G] (and b [G] for affine)
  void (*int8_groups)(const float* w, int64_t G, int64_t group, uint8_t* codes, float* a);
  void (*affine_groups)(const float* w, int64_t G, int64_t group, int levels, bool symmetric, const double* ratios,
                        int nratios, uint8_t* codes, float* a, float* b, float* scratch);
  void (*binary_groups)(const float* w, int64_t G, int64_t group, int64_t K, uint8_t* codes, float* a);
  // ternary: per unit of `group` columns, sum|w| (double), max|w|, smallest nonzero |w|
  void (*unit_stats)(const float* w, int64_t K, int64_t G, int64_t group, double* sum, float* mx, float* mnz);
  // ternary codes t + 1 = clip(rint(w / a), -1, 1) + 1 for K values, a [units]
  void (*ternary_codes)(const float* w, int64_t K, int64_t group, const float* a, uint8_t* codes);
  // bf16 bits of n float32, as formats.floats.f32_to_bf16_bits: (u + 0x7fff + ((u >> 16) & 1)) >> 16 (uint32 wraps)
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n);
};
const QuantRowKernels& quant_kernels_scalar();
const QuantRowKernels& quant_kernels_avx2();

// Throws std::invalid_argument on NaN / Inf in the source (as formats.base.check_weight).
void quantize_int(const QuantSource& src, const QuantSpec& spec, const QuantOut& out);

// Ternary, pass 1: per row and unit of `group` columns (G units): sum|w|, max|w|, smallest nonzero |w|.
void ternary_stats(const QuantSource& src, int64_t group, int64_t G, double* sum, float* mx, float* mnz);
// Ternary, pass 2: codes t + 1 with a float32 [M][G] (float16-exact scales) packed as 2-bit integer codes
// (tq1 = false: Kp = K rounded to 64) or 5 trits per byte (tq1 = true: Kp = K rounded to 20), and the
// scales as float16 [Mb][G][64].
void ternary_pack(const QuantSource& src, const float* a, int64_t group, int64_t G, bool tq1, uint8_t* codes,
                  uint16_t* scale);

// codes uint8 [M][K] (each < 2^bits) -> the packed tiles of common.h (formats.intcodes.pack_codes), on the pool.
void pack_codes(const uint8_t* codes, int64_t M, int64_t K, int bits, uint8_t* out);

// bf16 bits of n float32 values (formats.floats.f32_to_bf16_bits), on the thread pool.
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);

// np.rint of a float32, for both ISA builds of the quantizer rows: round half to even by the 1.5 * 2^23
// trick where |x| < 2^22 (larger floats are integers already). Exact only without FMA contraction. static:
// each ISA's translation unit keeps its own copy (an inline one could be linked from the AVX2 build).
static inline float round_even(float x) {
  const float magic = 12582912.0f;
  const float y = (x + magic) - magic;
  return std::fabs(x) < 4194304.0f ? y : x;
}

// float16 bits nearest to a double, ties to even (numpy's float64 -> float16 cast).
uint16_t f64_to_f16(double d);

}  // namespace lowbit
