// Python binding of the RSR kernels (rsr.h): checks the index's shapes, lays the activations out
// token-minor and runs on the pool without the GIL. Index contents (perm < K, seg monotone) are checked
// once where an index is built or loaded (lowbit.formats.rsr), not per call.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch.h"
#include "rsr.h"
#include "rsr_lut.h"
#include "thread_pool.h"

namespace nb = nanobind;

namespace lowbit {
namespace {

template <typename T, typename... Shape>
using Arr = nb::ndarray<T, nb::c_contig, nb::device::cpu, Shape...>;
using AnyArr2 = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, nb::ndim<2>>;

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

// One pass, one message: require() per element built a std::string each time (16 ms for 128 x 2560).
bool no_int8_min(const int8_t* q, int64_t n) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= q[i] != -128;
  return ok;
}

bool is_u16(const AnyArr2& a) { return a.dtype() == nb::dtype<uint16_t>(); }
bool is_u32(const AnyArr2& a) { return a.dtype() == nb::dtype<uint32_t>(); }

RsrIndex make_index(const AnyArr2& perm, const AnyArr2& seg, int64_t M, int64_t K, int64_t k, int64_t base,
                    const Arr<const float, nb::ndim<1>>& values, bool integral) {
  require(M > 0 && K > 0, "rsr: M and K must be positive");
  require(base >= 2 && base <= kRsrMaxBase, "rsr: base must be 2..16");
  require(k >= 1 && k <= 16, "rsr: k must be 1..16");
  int64_t S = 1;
  for (int64_t i = 0; i < k; ++i) S *= base;
  require(S <= 65536, "rsr: base^k must be <= 65536");
  const int64_t nblocks = (M + k - 1) / k;
  require(is_u16(perm) || is_u32(perm), "rsr: perm must be uint16 or uint32");
  require(is_u16(seg) || is_u32(seg), "rsr: seg must be uint16 or uint32");
  require(perm.shape(0) == (size_t)nblocks && perm.shape(1) == (size_t)K, "rsr: perm must be [ceil(M/k), K]");
  require(seg.shape(0) == (size_t)nblocks && seg.shape(1) == (size_t)(S + 1), "rsr: seg must be [ceil(M/k), base^k + 1]");
  require(values.shape(0) == (size_t)base, "rsr: values must have one entry per digit");
  RsrIndex ix{perm.data(), seg.data(), is_u32(perm), is_u32(seg), M, K, k, base, S, nblocks, {}, {}};
  float vmax = 0.f;
  for (int64_t d = 0; d < base; ++d) {
    const float v = values.data()[d];
    require(std::isfinite(v), "rsr: digit values must be finite");
    if (integral) require(v == std::nearbyint(v) && std::fabs(v) <= 15.f, "rsr: int8 path needs integer digit values in [-15, 15]");
    ix.valf[d] = v;
    ix.vali[d] = (int32_t)v;
    vmax = std::max(vmax, std::fabs(v));
  }
  // Step 2 in int32: |r| <= K * max|v| * 127 must stay below 2^31 (rsr.h).
  if (integral) require((double)K * vmax * 127.0 < 2147483647.0, "rsr: K too large for int32 accumulation");
  return ix;
}

int64_t padded_tokens(int64_t N, int64_t vec) { return N == 1 ? 1 : (N + vec - 1) / vec * vec; }

template <typename T>
std::vector<T> transpose(const T* x, int64_t N, int64_t K, int64_t ldx) {
  std::vector<T> xT((size_t)K * ldx + 64, T(0));  // x [N][K] -> xT [K][ldx], tokens past N zero; +64: the
                                                  // one-token gathers read 3 bytes past the end (rsr.h)
  constexpr int64_t kTile = 64;  // 64 x 64 tiles: the strided writes of a tile stay in L1 (a plain double loop
                                 // missed L1 on every write: 5.6 ms for 128 x 2560 int8)
  for (int64_t n0 = 0; n0 < N; n0 += kTile)
    for (int64_t k0 = 0; k0 < K; k0 += kTile) {
      const int64_t n1 = std::min(N, n0 + kTile), k1 = std::min(K, k0 + kTile);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t kk = k0; kk < k1; ++kk) xT[kk * ldx + n] = x[n * K + kk];
    }
  return xT;
}

double run_timed(const RsrCall& c, int iters) {
  const RsrKernels& k = rsr_kernels();
  nb::gil_scoped_release release;
  std::shared_lock<std::shared_mutex> running(settings_mutex());  // set_isa / set_threads wait for us
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) rsr_run(c, k);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// y [N, M] (+)= coef * rowscale[m] * (x . values[D]^T)[n, m], float activations.
std::tuple<std::string, double> rsr_gemm_f32(AnyArr2 perm, AnyArr2 seg, int64_t M, int64_t K, int64_t k, int64_t base,
                                             Arr<const float, nb::ndim<1>> values, Arr<const float, nb::ndim<2>> x,
                                             std::optional<Arr<const float, nb::ndim<1>>> rowscale, float coef,
                                             bool accumulate, bool plus, Arr<float, nb::ndim<2>> y, int iters) {
  const RsrIndex ix = make_index(perm, seg, M, K, k, base, values, false);
  const int64_t N = x.shape(0);
  require(N >= 1 && x.shape(1) == (size_t)K, "rsr: x must be [N, K]");
  require(y.shape(0) == (size_t)N && y.shape(1) == (size_t)M, "rsr: y must be [N, M]");
  require(!rowscale || rowscale->shape(0) == (size_t)M, "rsr: rowscale must be [M]");
  require(iters >= 1, "rsr: iters must be >= 1");
  const int64_t ldx = padded_tokens(N, 8);
  const std::vector<float> xT = transpose(x.data(), N, K, ldx);
  const RsrCall c{ix, xT.data(), false, ldx, N, plus, rowscale ? rowscale->data() : nullptr, nullptr, coef,
                  accumulate, y.data(), M};
  const double s = run_timed(c, iters);
  return {rsr_kernels().name, s};
}

// The same with int8 activations q [N, K] in [-127, 127] and their per-token scales sx [N].
std::tuple<std::string, double> rsr_gemm_i8(AnyArr2 perm, AnyArr2 seg, int64_t M, int64_t K, int64_t k, int64_t base,
                                            Arr<const float, nb::ndim<1>> values, Arr<const int8_t, nb::ndim<2>> q,
                                            Arr<const float, nb::ndim<1>> sx,
                                            std::optional<Arr<const float, nb::ndim<1>>> rowscale, float coef,
                                            bool accumulate, bool plus, Arr<float, nb::ndim<2>> y, int iters) {
  const RsrIndex ix = make_index(perm, seg, M, K, k, base, values, true);
  const int64_t N = q.shape(0);
  require(N >= 1 && q.shape(1) == (size_t)K, "rsr: q must be [N, K]");
  require(sx.shape(0) == (size_t)N, "rsr: sx must be [N]");
  require(y.shape(0) == (size_t)N && y.shape(1) == (size_t)M, "rsr: y must be [N, M]");
  require(!rowscale || rowscale->shape(0) == (size_t)M, "rsr: rowscale must be [M]");
  require(iters >= 1, "rsr: iters must be >= 1");
  const int8_t* qd = q.data();
  require(no_int8_min(qd, N * K), "rsr: int8 activations must be in [-127, 127] (int16 bound)");
  const int64_t ldx = padded_tokens(N, 16);
  const std::vector<int8_t> xT = transpose(qd, N, K, ldx);
  const RsrCall c{ix, xT.data(), true, ldx, N, plus, rowscale ? rowscale->data() : nullptr, sx.data(), coef,
                  accumulate, y.data(), M};
  const double s = run_timed(c, iters);
  return {rsr_kernels().name, s};
}

// rsr-lut (rsr_lut.h): y [N, M] (+)= coef * rowscale[m] * sx[n] * (q . A^T)[n, m] with
// A = sum_i (neg_i ? -1 : 1) 2^shift_i B_i, the planes B_i packed in w [ceil(M/64), ceil(K/4), planes, 32].
// The timed loop includes building the per-token tables.
std::tuple<std::string, double> rsr_lut_gemm(Arr<const uint8_t, nb::ndim<4>> w, int64_t M, int64_t K,
                                             std::vector<int> shifts, std::vector<bool> negs,
                                             Arr<const int8_t, nb::ndim<2>> q, Arr<const float, nb::ndim<1>> sx,
                                             std::optional<Arr<const float, nb::ndim<1>>> rowscale, float coef,
                                             bool accumulate, Arr<float, nb::ndim<2>> y, int iters) {
  require(M > 0 && K > 0, "rsr_lut: M and K must be positive");
  const int planes = (int)shifts.size();
  require(planes >= 1 && planes <= kLutMaxPlanes && negs.size() == shifts.size(),
          "rsr_lut: 1..4 planes, one shift and one sign each");
  LutPlanes p{planes, {}, {}};
  for (int i = 0; i < planes; ++i) {
    require(shifts[i] >= 0 && shifts[i] <= 3, "rsr_lut: plane shifts must be 0..3");
    p.shift[i] = shifts[i];
    p.neg[i] = negs[i];
  }
  const int64_t K4 = (K + 3) / 4, tiles = (M + kLutRows - 1) / kLutRows;
  require(w.shape(0) == (size_t)tiles && w.shape(1) == (size_t)K4 && w.shape(2) == (size_t)planes && w.shape(3) == 32,
          "rsr_lut: w must be [ceil(M/64), ceil(K/4), planes, 32]");
  const int64_t N = q.shape(0);
  require(N >= 1 && q.shape(1) == (size_t)K, "rsr_lut: q must be [N, K]");
  require(sx.shape(0) == (size_t)N, "rsr_lut: sx must be [N]");
  require(y.shape(0) == (size_t)N && y.shape(1) == (size_t)M, "rsr_lut: y must be [N, M]");
  require(!rowscale || rowscale->shape(0) == (size_t)M, "rsr_lut: rowscale must be [M]");
  require(iters >= 1, "rsr_lut: iters must be >= 1");
  const int8_t* qd = q.data();
  require(no_int8_min(qd, N * K), "rsr_lut: int8 activations must be in [-127, 127] (int16 bound)");
  std::vector<int8_t> tab((size_t)N * K4 * 32);
  const LutCall c{w.data(), M, K, p, tab.data(), N, rowscale ? rowscale->data() : nullptr, sx.data(), coef,
                  accumulate, y.data(), M};
  const LutKernels& k = lut_kernels();
  nb::gil_scoped_release release;
  std::shared_lock<std::shared_mutex> running(settings_mutex());  // set_isa / set_threads wait for us
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) {
    lut_build_tables(qd, N, K, tab.data(), k.i16_tables);
    lut_run(c, k);
  }
  return {k.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

struct StdJob {
  const uint8_t* w;
  const float* x;
  float* y;
  int64_t M, K, rows;
};

void std_task(void* p, int64_t t) {
  const StdJob& j = *static_cast<const StdJob*>(p);
  const int64_t m0 = t * j.rows, m1 = std::min(j.M, m0 + j.rows);
  standard_gemv_u8(j.w + m0 * j.K, j.x, j.y + m0, m1 - m0, j.K);
}

// The paper's "Standard": y = W x over a uint8 {0,1} W [M, K], plain C++ on the pool; returns seconds.
double standard_gemv(Arr<const uint8_t, nb::ndim<2>> w, Arr<const float, nb::ndim<1>> x, Arr<float, nb::ndim<1>> y,
                     int iters) {
  const int64_t M = w.shape(0), K = w.shape(1);
  require(x.shape(0) == (size_t)K && y.shape(0) == (size_t)M, "standard_gemv: x must be [K], y [M]");
  require(iters >= 1, "standard_gemv: iters must be >= 1");
  StdJob j{w.data(), x.data(), y.data(), M, K, 0};
  j.rows = std::max<int64_t>(1, (M + 4 * pool_threads() - 1) / (4 * pool_threads()));
  nb::gil_scoped_release release;
  std::shared_lock<std::shared_mutex> running(settings_mutex());  // set_isa / set_threads wait for us
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) pool_run((M + j.rows - 1) / j.rows, std_task, &j);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void bind_rsr(nb::module_& m) {
  m.def("rsr_gemm_f32", &rsr_gemm_f32, nb::arg("perm").noconvert(), nb::arg("seg").noconvert(), nb::arg("M"), nb::arg("K"), nb::arg("k"),
        nb::arg("base"), nb::arg("values").noconvert(), nb::arg("x").noconvert(), nb::arg("rowscale").none().noconvert(), nb::arg("coef"),
        nb::arg("accumulate"), nb::arg("plus"), nb::arg("y").noconvert(), nb::arg("iters") = 1);
  m.def("rsr_gemm_i8", &rsr_gemm_i8, nb::arg("perm").noconvert(), nb::arg("seg").noconvert(), nb::arg("M"), nb::arg("K"), nb::arg("k"),
        nb::arg("base"), nb::arg("values").noconvert(), nb::arg("q").noconvert(), nb::arg("sx").noconvert(), nb::arg("rowscale").none().noconvert(), nb::arg("coef"),
        nb::arg("accumulate"), nb::arg("plus"), nb::arg("y").noconvert(), nb::arg("iters") = 1);
  m.def("rsr_lut_gemm", &rsr_lut_gemm, nb::arg("w").noconvert(), nb::arg("M"), nb::arg("K"), nb::arg("shifts"),
        nb::arg("negs"), nb::arg("q").noconvert(), nb::arg("sx").noconvert(), nb::arg("rowscale").none().noconvert(),
        nb::arg("coef"), nb::arg("accumulate"), nb::arg("y").noconvert(), nb::arg("iters") = 1);
  m.def("rsr_path", [] { return std::string(rsr_kernels().name); });
  m.def("rsr_lut_path", [] { return std::string(lut_kernels().name); });
  m.def("standard_gemv_u8", &standard_gemv, nb::arg("w").noconvert(), nb::arg("x").noconvert(), nb::arg("y").noconvert(), nb::arg("iters") = 1);
}

}  // namespace lowbit
