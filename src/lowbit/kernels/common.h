// Shared types of lowbit's kernels.
//
// Integer formats (int8, int4, int2, ternary, binary) share one packed layout and one kernel family:
// every weight is an unsigned code c of BITS bits with an affine map per (row, group):
//     w[m,k] = a[m,g] * c[m,k] + b[m,g]          (b = -a * zc when no offsets are stored)
// so  sum_k w*x = sx[g] * (a * sum_k c*q + b * sum_k q)   over the int8 activations q of group g.
// The codes feed u8 x s8 dot-product instructions (vpdpbusd / vpmaddubsw) directly after a shift and a
// mask: no lookup table, and the +-1 of binary / -1 of ternary is exact through the b term.
//
// Packed code layout, the same on every ISA (so a model packed once runs everywhere):
//     codes: uint8 [Mb = Mp/64][nch = Kp/KC][4 tiles][64 bytes]       KC = 4 * (8/BITS) k per chunk
//     In tile t, byte p, bit field j (bits j*BITS .. j*BITS+BITS-1):
//         row m = 64*blk + 16*t + p/4,   k = KC*chunk + 4*j + p%4
//     so after (v >> j*BITS) & mask a 64-byte vector holds [16 rows][4 k] u8 codes: the VNNI4 operand.
//     A 256-bit path takes the two 32-byte halves of a tile (rows 0-7, rows 8-15) separately.
//     scale / offset: float16 [Mb][G][64]  (row 64*blk + i at index i), G = ceil(Kp / group),
//     group a multiple of 32 (llama.cpp's Q4_0/Q4_1 block) or Kp.
// Padding: rows past M carry code 0 and scale 0; k past K carries any code (the activations there are 0).
#pragma once
#include <immintrin.h>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

namespace lowbit {

constexpr int kRowBlock = 64;   // rows per block: 4 tiles of 16
constexpr int kKAlign = 64;     // Kp = K rounded up to this
constexpr int kGroupAlign = 32; // groups are multiples of this (a whole number of k-chunks at every width)

struct IntWeights {
  const uint8_t* codes;    // [Mb][nch][4][64]
  const uint16_t* scale;   // f16 [Mb][G][64]
  const uint16_t* offset;  // f16 [Mb][G][64], or nullptr: then b = -a * zc
  float zc;
  int bits;                // 1, 2, 4 or 8
  int64_t M, Kp, group, Mb, G;
  // The one-token GEMV only (a hint, null: none): where its weight stream's software prefetch runs on past the
  // last chunk, the start of the codes streamed next (run_linears), so the stream does not stop at a matrix's end.
  const uint8_t* pf_next = nullptr;
  int64_t kc() const { return 4 * (8 / bits); }
  int64_t nch() const { return Kp / kc(); }
};

// Activations quantized per token and per group (the same group as the weights they meet):
// x[n,k] ~= scale[n,g] * q[n,k];  sum[n,g] = sum of q over the group.
struct ActQ {
  const int8_t* q;       // [N][Kp], zero past K
  const float* scale;    // [N][G]
  const int32_t* sum;    // [N][G]
  int64_t N, Kp, group, G;
};

struct FloatWeights {
  const void* w;         // f32 or bf16 (uint16) [M][K], row-major
  int64_t M, K;
};

// The KV cache's element type. kI8: a row (one position of one kv head) is hd int8 values and then its
// float32 scale (max |x| / 127, unaligned), hd + 4 bytes: K/V at half the bytes of float16, the scale next to
// its values so one stream (and one pointer) carries both. The array holding it is int8 [..., hd + 4].
enum class KvType : int { kF32 = 0, kF16 = 1, kI8 = 2 };
inline int64_t kv_row_units(KvType t, int64_t hd) { return t == KvType::kI8 ? hd + 4 : hd; }  // array elements
inline int64_t kv_unit_bytes(KvType t) { return t == KvType::kF32 ? 4 : t == KvType::kF16 ? 2 : 1; }
inline int64_t kv_row_bytes(KvType t, int64_t hd) { return kv_row_units(t, hd) * kv_unit_bytes(t); }

// Attention of a block of queries that share one K/V stream (attn.inc): the heads of one GQA group, for
// `rows` consecutive query rows of one sequence (a prefill block; 1 row in decode). Query (i, g) is at
// q + i * row_stride + g * hd (RoPE'd and scaled), its output at the same offset of out. Row i attends
// K/V rows [lo[i], hi[i]) (hi > lo, unless part is set). part == null: out = softmax(q.K^T) V. part set
// (a chunk of a split context): out gets the unnormalized sum of exp(s_j - mx) v_j and part[2m], part[2m+1]
// = mx, sum of exp(s_j - mx) of query m = i * group + g (mx = -inf, sum = 0 for a row with no positions).
struct AttnBlock {
  const float* q;
  float* out;
  int64_t rows, group, row_stride, hd;  // hd <= kMaxHeadDim
  const int64_t *lo, *hi;               // [rows]
  const void *K, *V;                    // [t] rows of one kv head (KvType: float32, float16 as uint16, int8 + scale)
  KvType kv;
  float softcap;                        // > 0: scores -> softcap * tanh(scores / softcap) (Gemma 2)
  float* part;                          // [rows * group][2] or null
  // The stream the caller runs next (its next kv head), or null: the tile loop's prefetch, past this
  // block's last tiles, runs on into its positions [next_lo, ...) (a hint: no bits depend on it).
  const void *next_K = nullptr, *next_V = nullptr;
  int64_t next_lo = 0, next_hi = 0;
  // Bytes at the start of this block's stream that the block before already prefetched (it ran on into them).
  int64_t pf_skip = 0;
};
// How far ahead the two-pass attention's software prefetch runs over its K and V rows (attn.inc). bitnet-0.7b decode,
// 1 thread, in-step attention: 1 KB ahead 1.12-1.19 ms a token, 2 KB 1.03-1.07, 4 KB 0.88-0.98, 8 KB 0.89-1.0.
constexpr int64_t kAttnPrefetchAhead = 8192;
constexpr int64_t kMaxHeadDim = 512;

// Vector ops of the decoder (ops.inc), compiled once per ISA level.
struct OpsTable {
  void (*quantize_row)(const float* x, int64_t K, int64_t Kp, int64_t group, int8_t* q, float* scale, int32_t* sum);
  void (*rmsnorm)(const float* x, const float* w, int64_t n, float eps, float* out);
  void (*attn_block)(const AttnBlock& a);
  void (*act_mul)(float* g, const float* u, int64_t n, int act);
  void (*f32_to_f16_row)(const float* src, uint16_t* dst, int64_t n);
  void (*kv_quantize_row)(const float* x, int64_t hd, int8_t* dst);  // one KvType::kI8 row (ops.inc)
  // RoPE (HF rotate_half) on `heads` vectors of hd with this position's C/S rows, then * scale (ops.inc)
  void (*rope)(float* x, int64_t heads, int64_t hd, const float* C, const float* S, float scale);
};

// One ISA's kernels. Each processes row blocks [b0, b1) for all N tokens; y is [N][ldy].
// For float formats a "block" is kFloatRows rows.
constexpr int kFloatRows = 8;
struct KernelTable {
  const char* name;
  void (*gemm_int)(const IntWeights&, const ActQ&, float* y, int64_t ldy, int64_t b0, int64_t b1);
  void (*gemm_f32)(const FloatWeights&, const float* x, int64_t N, float* y, int64_t ldy, int64_t b0, int64_t b1);
  void (*gemm_bf16)(const FloatWeights&, const float* x, int64_t N, float* y, int64_t ldy, int64_t b0, int64_t b1);
  // Reads [p, p+n) (n a multiple of 256) with the widest loads and the GEMV's prefetch: the bandwidth roof.
  uint64_t (*read)(const uint8_t* p, int64_t n);
  // Optional: rearranges x [N][K] into the layout gemm_bf16 reads (returns floats per row), or nullptr.
  int64_t (*bf16_x_layout)(const float* x, int64_t N, int64_t K, float* out);
  int64_t (*bf16_x_stride)(int64_t K);
  OpsTable ops;
};

// A std::vector allocator on 64-byte boundaries, for the int8 activations the AMX GEMM reads as tiles: a tile
// row that straddles two cache lines costs two line reads, and with malloc's 16-byte alignment every row of a
// 16 x 64-byte A tile did. A probe of the tile loop alone (128 tokens x 1536 k, from L2): 0.19 of the tile roof
// misaligned by 16 bytes, 0.70 aligned; the GEMM at N = 128, 2 threads: 1.06-1.13x.
template <class T>
struct CacheAligned {
  using value_type = T;
  CacheAligned() = default;
  template <class U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <class U>
  bool operator==(const CacheAligned<U>&) const { return true; }
};

// Software prefetch distance of the weight streams. Not a multiple of 4 KiB: L1 sets repeat every 4 KiB, so a
// prefetch exactly 4 or 8 KiB ahead lands in the sets of the lines being read. On Zen 4 (32 KiB 8-way L1D), 1
// thread, bitnet-0.7b's decode GEMVs (scripts/decode_calls_probe.cpp, builds alternating): 8 or 12 KiB 26.3 /
// 26.5 GB/s as the layer sequence, 6, 7, 10 or 14 KiB 26.6-27.5 (long GEMVs 27.7 -> 29.2-29.9); end to end
// (scripts/e2e_ab.py, --shape bitnet-0.7b -t 1, 6 rounds) decode 1.02-1.05x, 2 threads level. The Xeon of stop 28
// (48 KiB 12-way) measured 8 KiB above 4 and level to 16, hence the longer of the good ones. LOWBIT_PF_BYTES
// overrides it for such A/B builds.
#ifndef LOWBIT_PF_BYTES
#define LOWBIT_PF_BYTES 10240
#endif
constexpr int kPrefetchBytes = LOWBIT_PF_BYTES;

// A line of a compute-heavy kernel's weight stream prefetched into L1 (T0) when `l1` (stream_prefetch_l1(), dispatch.h,
// which the kernel reads once), else into L2 with the hint the kernel used before the choice existed: T1 (kL2Hint 1)
// or T2 (2).
template <int kL2Hint>
inline void stream_prefetch(const void* p, bool l1) {
  const char* c = static_cast<const char*>(p);
  if (l1) _mm_prefetch(c, _MM_HINT_T0);
  else if constexpr (kL2Hint == 1) _mm_prefetch(c, _MM_HINT_T1);
  else _mm_prefetch(c, _MM_HINT_T2);
}

// The 256-byte chunk kPrefetchBytes past `chunk`, clamped to `last`, the stream's last chunk: the weight
// stream's prefetches never run past its buffer (a hint cannot fault, but it would pull a neighbour's
// lines or cost a page walk on an unmapped page).
// With `next` (the codes streamed after this one, IntWeights::pf_next) the target runs on into them instead.
inline const char* prefetch_target(const uint8_t* chunk, const uint8_t* last, const uint8_t* next = nullptr) {
  const uint8_t* t = chunk + kPrefetchBytes;
  return (const char*)(t <= last ? t : next ? next + (t - last - 256) : last);
}

const KernelTable& kernels_scalar();
const KernelTable& kernels_avx2();
const KernelTable* kernels_avxvnni();       // nullptr if the compiler could not build it
const KernelTable& kernels_avx512();
const KernelTable& kernels_avxvnni_evex();  // the AVX-VNNI ymm kernels, EVEX-encoded (AVX512-VNNI+VL CPUs)
const KernelTable& kernels_amx();           // AVX-512's, with the AMX-INT8 GEMM for N >= 8 (gemm_amx.cpp)
bool amx_tile_permission();                 // asks Linux for the tile state once; false if refused

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) { bits = sign; }
    else {  // subnormal
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// float32 -> float16, round to nearest even (as numpy and F16C's vcvtps2ph with imm 0); the well-known
// float_to_half_fast3_rtne: subnormals by a float add against a magic constant, normals by integer rounding.
inline uint16_t f32_to_f16(float f) {
  const uint32_t f32infty = 255u << 23, f16max = (127u + 16) << 23;
  const uint32_t denorm_magic = ((127u - 15) + (23 - 10) + 1) << 23;
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t o;
  if (x >= f16max) {
    o = x > f32infty ? 0x7e00 : 0x7c00;
  } else if (x < (113u << 23)) {
    float fx, magic;
    std::memcpy(&fx, &x, 4);
    std::memcpy(&magic, &denorm_magic, 4);
    fx += magic;
    uint32_t r;
    std::memcpy(&r, &fx, 4);
    o = r - denorm_magic;
  } else {
    const uint32_t mant_odd = (x >> 13) & 1;
    x += ((15u - 127u) << 23) + 0xfff;
    x += mant_odd;
    o = x >> 13;
  }
  return (uint16_t)(o | (sign >> 16));
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace lowbit
