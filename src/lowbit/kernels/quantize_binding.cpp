// Python binding of the native quantizers (called from binding.cpp's module init).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include "gguf_decode.h"
#include "quantize.h"

namespace nb = nanobind;

namespace lowbit {
namespace {

template <typename T>
using Vec = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using AnyArr = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;  // any dtype, read-only views too (mmaps)

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

// src: float32, float16 or (bf16 bits as) uint16, [R][K] with R >= every row read
void quantize_int_py(AnyArr src, int kind, int64_t M, int64_t K, std::optional<Vec<const int64_t>> rows, int method,
                     int bits, int64_t group, bool symmetric, Vec<const double> ratios, Vec<uint8_t> codes,
                     Vec<uint16_t> scale, std::optional<Vec<uint16_t>> offset, std::optional<Vec<uint8_t>> codes_hi) {
  require(M > 0 && K > 0, "quantize_int: M and K must be positive");
  require(kind == kSrcF32 || kind == kSrcF16 || kind == kSrcBF16, "quantize_int: kind must be 0 (f32), 1 (f16), 2 (bf16)");
  const nb::dlpack::dtype dt = src.dtype();
  const bool ok_dtype = kind == kSrcF32 ? dt == nb::dtype<float>()
                                       : (dt.bits == 16 && (dt.code == (uint8_t)nb::dlpack::dtype_code::Float ||
                                                            dt.code == (uint8_t)nb::dlpack::dtype_code::UInt));
  require(ok_dtype, "quantize_int: source dtype does not match kind (float32, float16, or bf16 bits as uint16)");
  require(bits == 1 || bits == 2 || bits == 4 || bits == 8 || bits == 6, "quantize_int: bits must be 1, 2, 4, 6 or 8");
  require((bits == 6) == (bool)codes_hi, "quantize_int: codes_hi is given for bits 6 and only then");
  require(bits != 6 || (method == kQuantAffine && !symmetric), "quantize_int: bits 6 is asymmetric affine only");
  require(method == kQuantInt8 || method == kQuantAffine || method == kQuantBinary, "quantize_int: unknown method");
  const int64_t Kp = (K + 63) / 64 * 64, Mb = (M + 63) / 64;
  require(group > 0 && (group % 32 == 0 || group == Kp) && group <= Kp, "quantize_int: group must be a multiple of 32 or Kp");
  const int64_t G = (Kp + group - 1) / group;
  const int64_t src_rows = (int64_t)(src.size() / (size_t)K);
  require((int64_t)src.size() == src_rows * K, "quantize_int: source size is not a multiple of K");
  if (rows) {
    require((int64_t)rows->shape(0) == M, "quantize_int: rows must have M entries");
    for (int64_t i = 0; i < M; ++i)
      require(rows->data()[i] >= 0 && rows->data()[i] < src_rows, "quantize_int: a row index is out of range");
  } else {
    require(src_rows >= M, "quantize_int: the source has fewer than M rows");
  }
  const int lo_bits = bits == 6 ? 4 : bits;
  require((int64_t)codes.shape(0) == Mb * Kp * 64 * lo_bits / 8, "quantize_int: codes has the wrong size");
  require(!codes_hi || (int64_t)codes_hi->shape(0) == Mb * Kp * 64 * 2 / 8, "quantize_int: codes_hi has the wrong size");
  require((int64_t)scale.shape(0) == Mb * G * 64, "quantize_int: scale has the wrong size");
  require(!offset || (int64_t)offset->shape(0) == Mb * G * 64, "quantize_int: offset has the wrong size");
  require(method != kQuantAffine || (ratios.shape(0) > 0 && (symmetric || offset)),
          "quantize_int: affine needs ratios (and offsets unless symmetric)");
  QuantSource s{src.data(), kind, M, K, rows ? rows->data() : nullptr};
  QuantSpec p{method, bits, group, symmetric, ratios.data(), (int)ratios.shape(0)};
  QuantOut o{codes.data(), scale.data(), offset ? offset->data() : nullptr, codes_hi ? codes_hi->data() : nullptr};
  nb::gil_scoped_release release;
  quantize_int(s, p, o);
}

QuantSource checked_source(const AnyArr& src, int kind, int64_t M, int64_t K, const std::optional<Vec<const int64_t>>& rows) {
  require(M > 0 && K > 0, "M and K must be positive");
  require(kind == kSrcF32 || kind == kSrcF16 || kind == kSrcBF16, "kind must be 0 (f32), 1 (f16), 2 (bf16)");
  const nb::dlpack::dtype dt = src.dtype();
  const bool ok_dtype = kind == kSrcF32 ? dt == nb::dtype<float>()
                                       : (dt.bits == 16 && (dt.code == (uint8_t)nb::dlpack::dtype_code::Float ||
                                                            dt.code == (uint8_t)nb::dlpack::dtype_code::UInt));
  require(ok_dtype, "source dtype does not match kind (float32, float16, or bf16 bits as uint16)");
  const int64_t src_rows = (int64_t)(src.size() / (size_t)K);
  require((int64_t)src.size() == src_rows * K, "source size is not a multiple of K");
  if (rows) {
    require((int64_t)rows->shape(0) == M, "rows must have M entries");
    for (int64_t i = 0; i < M; ++i)
      require(rows->data()[i] >= 0 && rows->data()[i] < src_rows, "a row index is out of range");
  } else {
    require(src_rows >= M, "the source has fewer than M rows");
  }
  return QuantSource{src.data(), kind, M, K, rows ? rows->data() : nullptr};
}

void ternary_stats_py(AnyArr src, int kind, int64_t M, int64_t K, std::optional<Vec<const int64_t>> rows, int64_t group,
                      Vec<double> sum, Vec<float> mx, Vec<float> mnz) {
  const QuantSource s = checked_source(src, kind, M, K, rows);
  require(group > 0, "ternary_stats: group must be positive");
  const int64_t G = (int64_t)sum.shape(0) / M;
  require(G >= (K + group - 1) / group && (int64_t)sum.shape(0) == M * G && (int64_t)mx.shape(0) == M * G &&
              (int64_t)mnz.shape(0) == M * G, "ternary_stats: sum, mx, mnz must be [M * G] with G >= ceil(K / group)");
  nb::gil_scoped_release release;
  ternary_stats(s, group, G, sum.data(), mx.data(), mnz.data());
}

void ternary_pack_py(AnyArr src, int kind, int64_t M, int64_t K, std::optional<Vec<const int64_t>> rows,
                     Vec<const float> a, int64_t group, bool tq1, Vec<uint8_t> codes, Vec<uint16_t> scale) {
  const QuantSource s = checked_source(src, kind, M, K, rows);
  const int64_t Kp = tq1 ? (K + 19) / 20 * 20 : (K + 63) / 64 * 64, Mb = (M + 63) / 64;
  require(group > 0 && (group % (tq1 ? 20 : 32) == 0 || group == Kp) && group <= Kp,
          "ternary_pack: group must be a multiple of 32 (tq1: 20) or Kp");
  const int64_t G = (Kp + group - 1) / group;
  require((int64_t)a.shape(0) == M * G, "ternary_pack: a must be [M * G]");
  require((int64_t)codes.shape(0) == (tq1 ? Mb * (Kp / 20) * 256 : Mb * Kp * 16), "ternary_pack: codes has the wrong size");
  require((int64_t)scale.shape(0) == Mb * G * 64, "ternary_pack: scale has the wrong size");
  for (int64_t i = 0; i < M * G; ++i)
    require(std::isfinite(a.data()[i]) && a.data()[i] > 0.f, "ternary_pack: scales must be finite and > 0");
  nb::gil_scoped_release release;
  ternary_pack(s, a.data(), group, G, tq1, codes.data(), scale.data());
}

// GGUF blocks (any dtype, read as bytes) [R][K / values * bytes] -> geometry checks; returns the row count R
int64_t gguf_rows(const AnyArr& data, int type, int64_t K, const std::optional<Vec<const int64_t>>& rows, int64_t M) {
  int64_t values, bytes;
  require(gguf_block_size(type, &values, &bytes), "gguf: unsupported GGML type " + std::to_string(type));
  require(K > 0 && K % values == 0, "gguf: K must be a positive multiple of the block size " + std::to_string(values));
  require(M > 0, "gguf: M must be positive");
  const int64_t row_bytes = K / values * bytes, nbytes = (int64_t)data.nbytes();
  require(nbytes % row_bytes == 0, "gguf: the data is not a whole number of rows of K values");
  const int64_t R = nbytes / row_bytes;
  if (rows) {
    require((int64_t)rows->shape(0) == M, "gguf: rows must have M entries");
    for (int64_t i = 0; i < M; ++i)
      require(rows->data()[i] >= 0 && rows->data()[i] < R, "gguf: a row index is out of range");
  } else {
    require(R >= M, "gguf: the data has fewer than M rows");
  }
  return R;
}

bool gguf_dequantize_py(AnyArr data, int type, int64_t K, std::optional<Vec<const int64_t>> rows, int64_t M, Vec<float> out) {
  gguf_rows(data, type, K, rows, M);
  require((int64_t)out.shape(0) == M * K, "gguf_dequantize: out must be [M * K]");
  nb::gil_scoped_release release;
  return gguf_dequantize(type, (const uint8_t*)data.data(), K, rows ? rows->data() : nullptr, M, out.data());
}

bool gguf_ternary_py(AnyArr data, int type, int64_t K, std::optional<Vec<const int64_t>> rows, int64_t M, Vec<int8_t> t,
                     Vec<float> d) {
  require(type == kTQ1_0 || type == kTQ2_0, "gguf_ternary: type must be TQ1_0 or TQ2_0");
  gguf_rows(data, type, K, rows, M);
  require((int64_t)t.shape(0) == M * K && (int64_t)d.shape(0) == M * (K / 256),
          "gguf_ternary: t must be [M * K] and d [M * K / 256]");
  nb::gil_scoped_release release;
  return gguf_ternary(type, (const uint8_t*)data.data(), K, rows ? rows->data() : nullptr, M, t.data(), d.data());
}

}  // namespace

// Outputs are noconvert: a converted copy would be filled and thrown away.
void bind_quantize(nb::module_& m) {
  m.def("ternary_stats", &ternary_stats_py, nb::arg("src"), nb::arg("kind"), nb::arg("M"), nb::arg("K"),
        nb::arg("rows").none(), nb::arg("group"), nb::arg("sum").noconvert(), nb::arg("mx").noconvert(), nb::arg("mnz").noconvert());
  m.def("ternary_pack", &ternary_pack_py, nb::arg("src"), nb::arg("kind"), nb::arg("M"), nb::arg("K"),
        nb::arg("rows").none(), nb::arg("a"), nb::arg("group"), nb::arg("tq1"), nb::arg("codes").noconvert(), nb::arg("scale").noconvert());
  m.def("quantize_int", &quantize_int_py, nb::arg("src"), nb::arg("kind"), nb::arg("M"), nb::arg("K"),
        nb::arg("rows").none(), nb::arg("method"), nb::arg("bits"), nb::arg("group"), nb::arg("symmetric"),
        nb::arg("ratios"), nb::arg("codes").noconvert(), nb::arg("scale").noconvert(), nb::arg("offset").none().noconvert(),
        nb::arg("codes_hi").none().noconvert() = nb::none(),
        "Quantizes rows of a float32/float16/bf16 matrix into the integer-code layout (see quantize.h).");
  m.def("gguf_dequantize", &gguf_dequantize_py, nb::arg("data"), nb::arg("type"), nb::arg("K"), nb::arg("rows").none(),
        nb::arg("M"), nb::arg("out").noconvert(),
        "GGUF blocks -> float32 [M * K] as gguf.quants.dequantize (output row m = source row rows[m]); False if not finite.");
  m.def("gguf_ternary", &gguf_ternary_py, nb::arg("data"), nb::arg("type"), nb::arg("K"), nb::arg("rows").none(),
        nb::arg("M"), nb::arg("t").noconvert(), nb::arg("d").noconvert(),
        "TQ1_0/TQ2_0 blocks -> codes t int8 [M * K] and scales d [M * K / 256]; False if a TQ2_0 code is 3.");
  m.def("pack_codes", [](nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu> codes, int64_t M, int64_t K, int bits,
                        Vec<uint8_t> out) {
          require(M > 0 && K > 0 && (int64_t)codes.size() == M * K, "pack_codes: codes must hold M * K values");
          require(bits == 1 || bits == 2 || bits == 4 || bits == 8, "pack_codes: bits must be 1, 2, 4 or 8");
          const int64_t Kp = (K + 63) / 64 * 64, Mb = (M + 63) / 64;
          require((int64_t)out.shape(0) == Mb * Kp * 64 * bits / 8, "pack_codes: out has the wrong size");
          nb::gil_scoped_release release;
          pack_codes(codes.data(), M, K, bits, out.data());
        }, nb::arg("codes"), nb::arg("M"), nb::arg("K"), nb::arg("bits"), nb::arg("out").noconvert(),
        "uint8 codes [M, K] (each < 2**bits) -> the packed tiles (formats.intcodes.pack_codes).");
  m.def("f32_to_bf16", [](nb::ndarray<const float, nb::c_contig, nb::device::cpu> src, Vec<uint16_t> dst) {
          require((int64_t)dst.shape(0) == (int64_t)src.size(), "f32_to_bf16: dst must have src's size");
          nb::gil_scoped_release release;
          f32_to_bf16(src.data(), dst.data(), (int64_t)src.size());
        }, nb::arg("src"), nb::arg("dst").noconvert(), "float32 (any shape, C order) -> bf16 bits (round to nearest even).");
  m.def("f64_to_f16", [](double d) { return f64_to_f16(d); }, nb::arg("d"));
}

}  // namespace lowbit
