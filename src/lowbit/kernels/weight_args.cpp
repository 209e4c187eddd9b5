#include "weight_args.h"

#include "py_args.h"

namespace lowbit::py {

// int32 accumulators sum group products of (code <= max_code) x (|q| <= 127): must stay below 2^31.
void check_accumulator_bound(const char* fn, int64_t group, int64_t max_code) {
  const int64_t limit = ((int64_t(1) << 31) - 1) / (max_code * 127);
  if (group > limit)
    fail(std::string(fn) + ": group " + std::to_string(group) + " overflows the int32 accumulators (group * " +
         std::to_string(max_code) + " * 127 must stay below 2^31): use groups of at most " + std::to_string(limit));
}

// One packed integer-code weight, checked against its M, Kp, group and width: every entry point that
// takes one (gemm_int, gemm_int_multi, bench_int, the decoder's projections) builds it here.
IntWeights checked_int_weights(const char* fn, nb::handle hcodes, nb::handle hscale, nb::handle hoffset, float zc,
                               int bits, int64_t M, int64_t Kp, int64_t group) {
  auto codes = in<uint8_t, 1>(hcodes, "packed codes");
  auto scale = in<uint16_t, 1>(hscale, "scales (float16 bits as uint16)");
  auto offset = in_or_none<uint16_t, 1>(hoffset, "offsets (float16 bits as uint16)");
  if (!(bits == 1 || bits == 2 || bits == 4 || bits == 8)) fail(std::string(fn) + ": bits must be 1, 2, 4 or 8");
  if (M <= 0 || M > (int64_t(1) << 31)) fail(std::string(fn) + ": M must be in [1, 2^31]");
  if (Kp <= 0 || Kp % kKAlign || Kp > (int64_t(1) << 31)) fail(std::string(fn) + ": Kp must be a positive multiple of 64 (at most 2^31)");
  if (group <= 0 || (group % kGroupAlign != 0 && group != Kp)) fail(std::string(fn) + ": group must be a positive multiple of 32, or Kp");
  check_accumulator_bound(fn, std::min(group, Kp), (1 << bits) - 1);
  const int64_t Mb = (M + kRowBlock - 1) / kRowBlock, G = (Kp + group - 1) / group;
  if ((__int128)codes.shape(0) != (__int128)Mb * Kp * kRowBlock * bits / 8)
    fail(std::string(fn) + ": packed codes have " + std::to_string(codes.shape(0)) + " bytes, expected " +
         std::to_string(Mb * Kp * kRowBlock * bits / 8) + " for M, Kp, bits");
  if ((__int128)scale.shape(0) != (__int128)Mb * G * kRowBlock)
    fail(std::string(fn) + ": scales have " + std::to_string(scale.shape(0)) + " values, expected " +
         std::to_string(Mb * G * kRowBlock) + " for M, Kp, group");
  if (offset.data() && offset.shape(0) != scale.shape(0)) fail(std::string(fn) + ": offsets must match the scales");
  return IntWeights{codes.data(), scale.data(), offset.data(), zc, bits, M, Kp, group, Mb, G};
}

TQ1Weights checked_tq1_weights(const char* fn, nb::handle hcodes, nb::handle hscale, int64_t M, int64_t Kp, int64_t group) {
  auto codes = in<uint8_t, 1>(hcodes, "tq1 packed codes");
  auto scale = in<uint16_t, 1>(hscale, "tq1 scales (float16 bits as uint16)");
  if (M <= 0 || M > (int64_t(1) << 31)) fail(std::string(fn) + ": M must be in [1, 2^31]");
  if (Kp <= 0 || Kp % kTq1KC || Kp > (int64_t(1) << 31)) fail(std::string(fn) + ": Kp must be a positive multiple of 20 (at most 2^31)");
  if (group <= 0 || (group % kTq1KC != 0 && group != Kp)) fail(std::string(fn) + ": group must be a positive multiple of 20, or Kp");
  check_accumulator_bound(fn, std::min(group, Kp), 2);
  const int64_t Mb = (M + kRowBlock - 1) / kRowBlock, G = (Kp + group - 1) / group;
  if ((__int128)codes.shape(0) != (__int128)Mb * (Kp / kTq1KC) * kTq1ChunkBytes)
    fail(std::string(fn) + ": tq1 packed codes have " + std::to_string(codes.shape(0)) + " bytes, expected " +
         std::to_string(Mb * (Kp / kTq1KC) * kTq1ChunkBytes) + " for M, Kp");
  if ((__int128)scale.shape(0) != (__int128)Mb * G * kRowBlock)
    fail(std::string(fn) + ": tq1 scales have " + std::to_string(scale.shape(0)) + " values, expected " +
         std::to_string(Mb * G * kRowBlock) + " for M, Kp, group");
  return TQ1Weights{codes.data(), scale.data(), M, Kp, group, Mb, G};
}

// A float weight [M, K]: float32, or bf16 bits as uint16. Returns (weights, is_bf16).
std::pair<FloatWeights, bool> checked_float_weights(const char* fn, nb::handle h) {
  auto w = any_in<2>(h, "float weights");
  const bool bf16 = w.dtype() == nb::dtype<uint16_t>();
  if (!bf16 && w.dtype() != nb::dtype<float>())
    fail(std::string(fn) + ": float weights must be float32 or bf16 stored as uint16, got " + describe(h));
  if (w.shape(0) == 0 || w.shape(1) == 0) fail(std::string(fn) + ": float weights must not be empty");
  return {FloatWeights{w.data(), (int64_t)w.shape(0), (int64_t)w.shape(1)}, bf16};
}

// One codebook weight (codebook.h): codes u8 [Mt*Kp/v*m*8], scale f16-as-u16 [G*Mt*8], codebooks cbT f32
// [m][v][nc] and cb f32 [m][nc][v] (cbT transposed), checked against M, Kp and group; codes16: None or the
// AVX-512 layout's copy of b = 4 codes.
CodebookWeights checked_codebook_weights(const char* fn, nb::handle hcodes, nb::handle hscale, nb::handle hcbT,
                                         nb::handle hcb, int64_t M, int64_t Kp, int64_t group, nb::handle hcodes16) {
  const std::string f = fn;
  auto cbT = in<float, 3>(hcbT, (f + ": cbT").c_str());
  auto cb = in<float, 3>(hcb, (f + ": cb").c_str());
  auto codes = in<uint8_t, 1>(hcodes, (f + ": packed codes").c_str());
  auto scale = in<uint16_t, 1>(hscale, (f + ": scales (float16 bits as uint16)").c_str());
  const int64_t m = cbT.shape(0), v = cbT.shape(1), nc = cbT.shape(2);
  if (!(m >= 1 && v >= 1 && nc >= 2 && nc <= 256 && (nc & (nc - 1)) == 0)) fail(f + ": codebooks must be [m][v][2^b], b in 1..8");
  if (!(cb.shape(0) == (size_t)m && cb.shape(1) == (size_t)nc && cb.shape(2) == (size_t)v)) fail(f + ": cb must be [m][nc][v] (cbT transposed)");
  if (!(M > 0 && M <= (int64_t(1) << 31) && Kp > 0 && Kp <= (int64_t(1) << 31) && Kp % v == 0))
    fail(f + ": M must be positive and Kp a positive multiple of v (both at most 2^31)");
  if (!(group > 0 && group % v == 0)) fail(f + ": group must be a positive multiple of v");
  const int64_t tile = CodebookWeights::tile_rows(nc);
  const int64_t Mt = CodebookWeights::tiles(M, nc), G = (Kp + group - 1) / group;
  CodebookWeights w{codes.data(), scale.data(), cbT.data(), cb.data(), M, Kp, group, m, v, nc, Mt, G};
  if (codes.shape(0) != (size_t)w.codes_bytes()) fail(f + ": packed codes have the wrong size for M, Kp, m, v, b");
  if (scale.shape(0) != (size_t)(G * Mt * tile)) fail(f + ": scales have the wrong size for M, Kp, group");
  if (hcodes16.is_valid() && !hcodes16.is_none()) {
    if (!w.lut4()) fail(f + ": codes16 (the AVX-512 layout) is for b = 4 weights only");
    auto c16 = in<uint8_t, 1>(hcodes16, (f + ": codes16").c_str());
    if (c16.shape(0) != (size_t)w.codes16_bytes()) fail(f + ": codes16 has the wrong size for M, Kp, m, v");
    w.codes16 = c16.data();
  }
  return w;
}

}  // namespace lowbit::py
