// Driver of the native quantizers: row blocks of 64 on the thread pool; each task converts its rows to
// float32 (zero-padded to the groups), quantizes them with the active ISA's row kernels, and writes its
// block of the packed codes and float16 scales (layout: common.h).
#include "quantize.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common.h"
#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {

uint16_t f64_to_f16(double d) {  // bit arithmetic: no libm calls (two per group and ratio in int4)
  uint64_t x;
  std::memcpy(&x, &d, 8);
  const uint16_t sign = (uint16_t)((x >> 48) & 0x8000);
  const uint64_t ax = x & 0x7fffffffffffffffull;
  if (ax >= 0x7ff0000000000000ull) return sign | (ax > 0x7ff0000000000000ull ? 0x7e00 : 0x7c00);
  const int e = (int)(ax >> 52) - 1023;
  if (e < -25) return sign;  // below half the smallest subnormal: rounds to zero
  const uint64_t mant = (ax & 0xfffffffffffffull) | (1ull << 52);  // 1.m, 53 bits
  // normal: keep 10 fraction bits; subnormal: units of 2^-24
  const int shift = e >= -14 ? 42 : 52 - (e + 24);
  uint64_t q = mant >> shift;
  const uint64_t rem = mant & ((1ull << shift) - 1), half = 1ull << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;  // ties to even
  uint64_t h = e >= -14 ? ((uint64_t)(e + 15) << 10) + (q - 1024) : q;  // the implicit 1 becomes the exponent
  if (h >= 0x7c00) h = 0x7c00;  // overflow (65520 and up): infinity
  return sign | (uint16_t)h;
}

namespace {

constexpr int64_t kRows = 64;

const QuantRowKernels& row_kernels() {
  const std::string& isa = selected_isa();
  return isa == "scalar" ? quant_kernels_scalar() : quant_kernels_avx2();
}

struct QuantJob {
  QuantSource src;
  QuantSpec spec;
  QuantOut out;
  const QuantRowKernels* k;
  int64_t Kp, G, nch, kc, elsize;
  std::atomic<bool> bad{false};
};

// codes [64][Kp] of one row block -> its tiles: byte p of tile t in chunk ch holds rows 16t + p/4,
// k = kc*ch + 4j + p%4 in bit field j
void pack_block(const uint8_t* codes, int64_t Kp, int bits, uint8_t* dst) {
  if (bits == 4) {  // 8 codes of a row (< 16 each) -> its 4 bytes of the tile: c[i] | c[i + 4] << 4 = q | q >> 28
    for (int64_t r = 0; r < 64; ++r)
      for (int64_t ch = 0; ch < Kp / 8; ++ch) {
        uint64_t q;
        std::memcpy(&q, codes + r * Kp + 8 * ch, 8);
        const uint32_t word = (uint32_t)(q | q >> 28);
        std::memcpy(dst + (ch * 4 + r / 16) * 64 + 4 * (r % 16), &word, 4);
      }
    return;
  }
  const int per = 8 / bits;
  const int64_t kc = 4 * per, nch = Kp / kc;
  for (int64_t ch = 0; ch < nch; ++ch)
    for (int t = 0; t < 4; ++t)
      for (int p = 0; p < 64; ++p) {
        const uint8_t* row = codes + (16 * t + p / 4) * Kp + kc * ch + p % 4;
        uint8_t byte = 0;
        for (int j = 0; j < per; ++j) byte |= (uint8_t)(row[4 * j] << (j * bits));
        dst[(ch * 4 + t) * 64 + p] = byte;
      }
}

void quant_task(void* ctx, int64_t blk) {
  QuantJob& J = *static_cast<QuantJob*>(ctx);
  const QuantSource& S = J.src;
  const QuantSpec& P = J.spec;
  const int64_t group = P.group, G = J.G, Kp = J.Kp, width = G * group;
  std::vector<float> w(width), a(G), b(G), scratch(3 * group);
  std::vector<uint8_t> rowcodes(width), codes(kRows * Kp, 0);
  uint16_t* scale = J.out.scale + blk * G * kRows;
  uint16_t* offset = J.out.offset ? J.out.offset + blk * G * kRows : nullptr;
  for (int64_t i = 0; i < kRows; ++i) {
    const int64_t m = blk * kRows + i;
    if (m >= S.M) {  // padding rows: zero codes and scales
      for (int64_t g = 0; g < G; ++g) {
        scale[g * kRows + i] = 0;
        if (offset) offset[g * kRows + i] = 0;
      }
      continue;
    }
    const int64_t srow = S.rows ? S.rows[m] : m;
    const char* src = (const char*)S.data + srow * S.K * J.elsize;
    if (!J.k->load_row(src, S.kind, S.K, w.data(), width)) {
      J.bad.store(true, std::memory_order_relaxed);
      return;
    }
    switch (P.method) {
      case kQuantInt8: J.k->int8_groups(w.data(), G, group, rowcodes.data(), a.data()); break;
      case kQuantAffine:
        J.k->affine_groups(w.data(), G, group, 1 << P.bits, P.symmetric, P.ratios, P.nratios, rowcodes.data(), a.data(),
                           b.data(), scratch.data());
        break;
      default: J.k->binary_groups(w.data(), G, group, S.K, rowcodes.data(), a.data()); break;
    }
    std::memcpy(codes.data() + i * Kp, rowcodes.data(), S.K);  // columns past K stay code 0, as numpy pads
    for (int64_t g = 0; g < G; ++g) {
      scale[g * kRows + i] = f32_to_f16(a[g]);
      if (offset) offset[g * kRows + i] = f32_to_f16(b[g]);
    }
  }
  if (P.bits == 6) {  // code = lo + 16 hi: lo in the 4-bit layout, hi in the 2-bit one (int6.py)
    std::vector<uint8_t> hi(kRows * Kp);
    for (size_t i = 0; i < codes.size(); ++i) {
      hi[i] = codes[i] >> 4;
      codes[i] &= 15;
    }
    pack_block(codes.data(), Kp, 4, J.out.codes + blk * kRows * Kp * 4 / 8);
    pack_block(hi.data(), Kp, 2, J.out.codes_hi + blk * kRows * Kp * 2 / 8);
    return;
  }
  pack_block(codes.data(), Kp, P.bits, J.out.codes + blk * kRows * Kp * P.bits / 8);
}

struct TernaryJob {
  QuantSource src;
  const QuantRowKernels* k;
  int64_t group, G, Kp;
  bool tq1;
  double* sum;
  float *mx, *mnz;
  const float* a;
  uint8_t* codes;
  uint16_t* scale;
  std::atomic<bool> bad{false};
};

void ternary_stats_task(void* ctx, int64_t blk) {
  TernaryJob& J = *static_cast<TernaryJob*>(ctx);
  const QuantSource& S = J.src;
  std::vector<float> w(S.K);
  const int64_t elsize = S.kind == kSrcF32 ? 4 : 2;
  for (int64_t m = blk * kRows; m < std::min(S.M, (blk + 1) * kRows); ++m) {
    const int64_t srow = S.rows ? S.rows[m] : m;
    if (!J.k->load_row((const char*)S.data + srow * S.K * elsize, S.kind, S.K, w.data(), S.K)) {
      J.bad.store(true, std::memory_order_relaxed);
      return;
    }
    J.k->unit_stats(w.data(), S.K, J.G, J.group, J.sum + m * J.G, J.mx + m * J.G, J.mnz + m * J.G);
  }
}

// codes [64][Kp] (values 0..2) of one row block -> tq1 tiles: byte p of tile t in chunk ch holds the 5 codes
// of row 16t + p/4 at k = 20ch + 4j + p%4 as v = sum_j c_j 3^(4-j), stored as ceil(v * 256 / 243)
void pack_block_tq1(const uint8_t* codes, int64_t Kp, uint8_t* dst) {
  const int64_t nch = Kp / 20;
  for (int64_t ch = 0; ch < nch; ++ch)
    for (int t = 0; t < 4; ++t)
      for (int p = 0; p < 64; ++p) {
        const uint8_t* row = codes + (16 * t + p / 4) * Kp + 20 * ch + p % 4;
        uint32_t v = 0;
        for (int j = 0; j < 5; ++j) v = v * 3 + row[4 * j];
        dst[(ch * 4 + t) * 64 + p] = (uint8_t)((v * 256 + 242) / 243);
      }
}

void ternary_pack_task(void* ctx, int64_t blk) {
  TernaryJob& J = *static_cast<TernaryJob*>(ctx);
  const QuantSource& S = J.src;
  const int64_t Kp = J.Kp, G = J.G;
  const int64_t elsize = S.kind == kSrcF32 ? 4 : 2;
  std::vector<float> w(S.K);
  std::vector<uint8_t> codes(kRows * Kp, 0);
  uint16_t* scale = J.scale + blk * G * kRows;
  for (int64_t i = 0; i < kRows; ++i) {
    const int64_t m = blk * kRows + i;
    if (m >= S.M) {
      for (int64_t g = 0; g < G; ++g) scale[g * kRows + i] = 0;
      continue;
    }
    const int64_t srow = S.rows ? S.rows[m] : m;
    if (!J.k->load_row((const char*)S.data + srow * S.K * elsize, S.kind, S.K, w.data(), S.K)) {
      J.bad.store(true, std::memory_order_relaxed);
      return;
    }
    J.k->ternary_codes(w.data(), S.K, J.group, J.a + m * G, codes.data() + i * Kp);
    for (int64_t g = 0; g < G; ++g) scale[g * kRows + i] = f32_to_f16(J.a[m * G + g]);
  }
  if (J.tq1)
    pack_block_tq1(codes.data(), Kp, J.codes + blk * (Kp / 20) * 256);
  else
    pack_block(codes.data(), Kp, 2, J.codes + blk * kRows * Kp * 2 / 8);
}

}  // namespace

void ternary_stats(const QuantSource& src, int64_t group, int64_t G, double* sum, float* mx, float* mnz) {
  TernaryJob J;
  J.src = src;
  J.k = &row_kernels();
  J.group = group;
  J.G = G;
  J.sum = sum;
  J.mx = mx;
  J.mnz = mnz;
  pool_run((src.M + kRows - 1) / kRows, ternary_stats_task, &J);
  if (J.bad.load()) throw std::invalid_argument("weight has NaN or Inf values");
}

void ternary_pack(const QuantSource& src, const float* a, int64_t group, int64_t G, bool tq1, uint8_t* codes,
                  uint16_t* scale) {
  TernaryJob J;
  J.src = src;
  J.k = &row_kernels();
  J.group = group;
  J.G = G;
  J.tq1 = tq1;
  J.Kp = tq1 ? (src.K + 19) / 20 * 20 : (src.K + kKAlign - 1) / kKAlign * kKAlign;
  J.a = a;
  J.codes = codes;
  J.scale = scale;
  pool_run((src.M + kRows - 1) / kRows, ternary_pack_task, &J);
  if (J.bad.load()) throw std::invalid_argument("weight has NaN or Inf values");
}

namespace {
struct Bf16Job {
  const float* src;
  uint16_t* dst;
  int64_t n;
  const QuantRowKernels* k;
};
constexpr int64_t kBf16Chunk = 1 << 16;
void bf16_task(void* ctx, int64_t i) {
  const Bf16Job& J = *static_cast<Bf16Job*>(ctx);
  const int64_t b = i * kBf16Chunk;
  J.k->f32_to_bf16(J.src + b, J.dst + b, std::min(kBf16Chunk, J.n - b));
}
}  // namespace

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  Bf16Job J{src, dst, n, &row_kernels()};
  pool_run((n + kBf16Chunk - 1) / kBf16Chunk, bf16_task, &J);
}

namespace {
struct PackJob {
  const uint8_t* codes;
  int64_t M, K, Kp;
  int bits;
  uint8_t* out;
};
void pack_task(void* ctx, int64_t blk) {
  const PackJob& J = *static_cast<PackJob*>(ctx);
  std::vector<uint8_t> rows(kRows * J.Kp, 0);  // the block's rows, zero-padded to 64 x Kp
  for (int64_t i = 0; i < kRows && blk * kRows + i < J.M; ++i)
    std::memcpy(rows.data() + i * J.Kp, J.codes + (blk * kRows + i) * J.K, J.K);
  pack_block(rows.data(), J.Kp, J.bits, J.out + blk * kRows * J.Kp * J.bits / 8);
}
}  // namespace

void pack_codes(const uint8_t* codes, int64_t M, int64_t K, int bits, uint8_t* out) {
  PackJob J{codes, M, K, (K + kKAlign - 1) / kKAlign * kKAlign, bits, out};
  pool_run((M + kRows - 1) / kRows, pack_task, &J);
}

void quantize_int(const QuantSource& src, const QuantSpec& spec, const QuantOut& out) {
  QuantJob J;
  J.src = src;
  J.spec = spec;
  J.out = out;
  J.k = &row_kernels();
  J.Kp = (src.K + kKAlign - 1) / kKAlign * kKAlign;
  J.G = (J.Kp + spec.group - 1) / spec.group;
  J.elsize = src.kind == kSrcF32 ? 4 : 2;
  const int64_t Mb = (src.M + kRows - 1) / kRows;
  pool_run(Mb, quant_task, &J);
  if (J.bad.load()) throw std::invalid_argument("weight has NaN or Inf values");
}

}  // namespace lowbit
