// Python binding (nanobind). Arrays come in allocated by the Python side (lowbit.formats); this file
// checks their shapes, releases the GIL and hands row blocks to the thread pool.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <tuple>
#include <vector>
#include <stdexcept>
#include <string>

#include "act_quant.h"
#include "bandwidth.h"
#include "common.h"
#include "dispatch.h"
#include "decoder.h"
#include "linear.h"
#include "thread_pool.h"
#include "tq1.h"
#include "codebook.h"

namespace nb = nanobind;
using namespace lowbit;

template <typename T, typename... Shape>
using Arr = nb::ndarray<T, nb::c_contig, nb::device::cpu, Shape...>;

namespace {

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

void quantize_act(Arr<const float, nb::ndim<2>> x, Arr<int8_t, nb::ndim<2>> q, Arr<float, nb::ndim<2>> scale,
                  Arr<int32_t, nb::ndim<2>> sum, int64_t group) {
  const int64_t N = x.shape(0), K = x.shape(1), Kp = q.shape(1);
  require(group > 0, "group must be positive");
  const int64_t G = (Kp + group - 1) / group;
  require(q.shape(0) == (size_t)N && Kp >= K, "quantize_act: q must be [N, Kp >= K]");
  require(scale.shape(0) == (size_t)N && scale.shape(1) == (size_t)G, "quantize_act: scale must be [N, G]");
  require(sum.shape(0) == (size_t)N && sum.shape(1) == (size_t)G, "quantize_act: sum must be [N, G]");
  nb::gil_scoped_release release;
  quantize_activations(x.data(), N, K, K, Kp, group, q.data(), scale.data(), sum.data());
}

using U8 = Arr<const uint8_t, nb::ndim<1>>;
using U16 = Arr<const uint16_t, nb::ndim<1>>;

// One packed integer-code weight, checked against its M, Kp, group and width: every entry point that
// takes one (gemm_int, gemm_int_multi, bench_int, the decoder's projections) builds it here.
IntWeights checked_int_weights(const U8& codes, const U16& scale, const std::optional<U16>& offset, float zc, int bits,
                               int64_t M, int64_t Kp, int64_t group) {
  require(bits == 1 || bits == 2 || bits == 4 || bits == 8, "bits must be 1, 2, 4 or 8");
  require(M > 0, "M must be positive");
  require(Kp > 0 && Kp % kKAlign == 0, "Kp must be a positive multiple of 64");
  require(group > 0 && (group % kGroupAlign == 0 || group == Kp), "group must be a multiple of 32 or Kp");
  const int64_t Mb = (M + kRowBlock - 1) / kRowBlock, G = (Kp + group - 1) / group;
  require(codes.shape(0) == (size_t)(Mb * Kp * kRowBlock * bits / 8), "packed codes have the wrong size for M, Kp, bits");
  require(scale.shape(0) == (size_t)(Mb * G * kRowBlock), "scales have the wrong size for M, Kp, group");
  if (offset) require(offset->shape(0) == scale.shape(0), "offsets must match scales");
  return IntWeights{codes.data(), scale.data(), offset ? offset->data() : nullptr, zc, bits, M, Kp, group, Mb, G};
}

void gemm_int(Arr<const uint8_t, nb::ndim<1>> codes, Arr<const uint16_t, nb::ndim<1>> scale,
              std::optional<Arr<const uint16_t, nb::ndim<1>>> offset, float zc, int bits, int64_t M, int64_t Kp,
              int64_t group, Arr<const int8_t, nb::ndim<2>> q, Arr<const float, nb::ndim<2>> sx,
              Arr<const int32_t, nb::ndim<2>> sumx, Arr<float, nb::ndim<2>> y) {
  const IntWeights w = checked_int_weights(codes, scale, offset, zc, bits, M, Kp, group);
  const int64_t G = w.G, N = q.shape(0);
  require(q.shape(1) == (size_t)Kp, "activations: q must be [N, Kp]");
  require(sx.shape(0) == (size_t)N && sx.shape(1) == (size_t)G, "activations: scale must be [N, G]");
  require(sumx.shape(0) == (size_t)N && sumx.shape(1) == (size_t)G, "activations: sum must be [N, G]");
  require(y.shape(0) == (size_t)N && y.shape(1) == (size_t)M, "output must be [N, M]");
  const IntJob j = make_int_job(w, ActQ{q.data(), sx.data(), sumx.data(), N, Kp, group, G}, y.data(), &active_kernels());
  nb::gil_scoped_release release;
  pool_run(j.tasks(), int_task, (void*)&j);
}

using IntWeightTuple = std::tuple<Arr<const uint8_t, nb::ndim<1>>, Arr<const uint16_t, nb::ndim<1>>,
                                  std::optional<Arr<const uint16_t, nb::ndim<1>>>, float, int, int64_t>;

// weights: (codes, scale, offset|None, zc, bits, M) each, all with the same Kp and group.
void gemm_int_multi(std::vector<IntWeightTuple> weights, int64_t Kp, int64_t group, Arr<const int8_t, nb::ndim<2>> q,
                    Arr<const float, nb::ndim<2>> sx, Arr<const int32_t, nb::ndim<2>> sumx,
                    std::vector<Arr<float, nb::ndim<2>>> ys) {
  require(weights.size() == ys.size(), "one output per weight");
  require(Kp > 0 && Kp % kKAlign == 0, "Kp must be a positive multiple of 64");
  require(group > 0 && (group % kGroupAlign == 0 || group == Kp), "group must be a multiple of 32 or Kp");
  const int64_t N = q.shape(0), G = (Kp + group - 1) / group;
  require(q.shape(1) == (size_t)Kp, "activations: q must be [N, Kp]");
  require(sx.shape(0) == (size_t)N && sx.shape(1) == (size_t)G, "activations: scale must be [N, G]");
  require(sumx.shape(0) == (size_t)N && sumx.shape(1) == (size_t)G, "activations: sum must be [N, G]");
  MultiIntJob m;
  for (size_t i = 0; i < weights.size(); ++i) {
    auto& [codes, scale, offset, zc, bits, M] = weights[i];
    const IntWeights w = checked_int_weights(codes, scale, offset, zc, bits, M, Kp, group);
    require(ys[i].shape(0) == (size_t)N && ys[i].shape(1) == (size_t)M, "output must be [N, M]");
    m.add(make_int_job(w, ActQ{q.data(), sx.data(), sumx.data(), N, Kp, group, G}, ys[i].data(), &active_kernels()));
  }
  nb::gil_scoped_release release;
  pool_run(m.tasks(), multi_int_task, &m);
}

void gemm_float(nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, nb::ndim<2>> w, Arr<const float, nb::ndim<2>> x,
                Arr<float, nb::ndim<2>> y) {
  const bool bf16 = w.dtype() == nb::dtype<uint16_t>();
  require(bf16 || w.dtype() == nb::dtype<float>(), "float weights must be float32 or bf16 stored as uint16");
  const int64_t M = w.shape(0), K = w.shape(1), N = x.shape(0);
  require(x.shape(1) == (size_t)K, "x must be [N, K]");
  require(y.shape(0) == (size_t)N && y.shape(1) == (size_t)M, "output must be [N, M]");
  FloatJob j{FloatWeights{w.data(), M, K}, x.data(), N, y.data(), bf16, &active_kernels()};
  nb::gil_scoped_release release;
  std::vector<float> xbuf;
  if (bf16 && j.k->bf16_x_layout) {
    xbuf.resize(N * j.k->bf16_x_stride(K));
    j.k->bf16_x_layout(x.data(), N, K, xbuf.data());
    j.x = xbuf.data();
  }
  pool_run(j.tasks(), float_task, &j);
}

// Benchmark loops: the same pool_run path as gemm_int/gemm_float, called `iters` times over a rotation
// of weight copies (so the weights come from DRAM, not the cache), without Python between calls.
double bench_int(std::vector<std::tuple<Arr<const uint8_t, nb::ndim<1>>, Arr<const uint16_t, nb::ndim<1>>,
                                        std::optional<Arr<const uint16_t, nb::ndim<1>>>>> copies,
                 float zc, int bits, int64_t M, int64_t Kp, int64_t group, Arr<const int8_t, nb::ndim<2>> q,
                 Arr<const float, nb::ndim<2>> sx, Arr<const int32_t, nb::ndim<2>> sumx, Arr<float, nb::ndim<2>> y,
                 int iters) {
  require(!copies.empty(), "no weights");
  const int64_t G = (Kp + group - 1) / group, N = q.shape(0);
  std::vector<IntJob> jobs(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    auto& [codes, scale, offset] = copies[i];
    jobs[i] = make_int_job(checked_int_weights(codes, scale, offset, zc, bits, M, Kp, group),
                           ActQ{q.data(), sx.data(), sumx.data(), N, Kp, group, G}, y.data(), &active_kernels());
  }
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) {
    IntJob& j = jobs[it % jobs.size()];
    pool_run(j.tasks(), int_task, &j);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double bench_float(std::vector<nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, nb::ndim<2>>> copies,
                   Arr<const float, nb::ndim<2>> x, Arr<float, nb::ndim<2>> y, int iters) {
  require(!copies.empty(), "no weights");
  std::vector<FloatJob> jobs;
  for (auto& w : copies) {
    const bool bf16 = w.dtype() == nb::dtype<uint16_t>();
    jobs.push_back(FloatJob{FloatWeights{w.data(), (int64_t)w.shape(0), (int64_t)w.shape(1)}, x.data(),
                            (int64_t)x.shape(0), y.data(), bf16, &active_kernels()});
  }
  std::vector<float> xbuf;
  if (jobs[0].bf16 && jobs[0].k->bf16_x_layout) {
    const int64_t K = jobs[0].w.K, N = (int64_t)x.shape(0);
    xbuf.resize(N * jobs[0].k->bf16_x_stride(K));
    jobs[0].k->bf16_x_layout(x.data(), N, K, xbuf.data());
    for (auto& j : jobs) j.x = xbuf.data();
  }
  const int64_t ntasks = jobs[0].tasks();
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) pool_run(ntasks, float_task, &jobs[it % jobs.size()]);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// tq1 (tq1.h): weights is a list of (codes u8 [Mb*Kp/20*256], scale f16-as-u16 [Mb*G*64]) copies of one
// [M, Kp] weight; runs `iters` products y = W . x, the i-th on copy i % len (one copy, iters=1: a matmul;
// more: the benchmark loop without Python between calls). Returns (kernel path, seconds).
std::tuple<std::string, double> gemm_tq1(std::vector<std::tuple<Arr<const uint8_t, nb::ndim<1>>, Arr<const uint16_t, nb::ndim<1>>>> weights,
                                         int64_t M, int64_t Kp, int64_t group, Arr<const int8_t, nb::ndim<2>> q,
                                         Arr<const float, nb::ndim<2>> sx, Arr<const int32_t, nb::ndim<2>> sumx,
                                         Arr<float, nb::ndim<2>> y, int iters) {
  require(!weights.empty(), "gemm_tq1: no weights");
  require(iters >= 1, "gemm_tq1: iters must be >= 1");
  require(M > 0, "gemm_tq1: M must be positive");
  require(Kp > 0 && Kp % kTq1KC == 0, "gemm_tq1: Kp must be a positive multiple of 20");
  require(group > 0 && (group % kTq1KC == 0 || group == Kp), "gemm_tq1: group must be a multiple of 20 or Kp");
  const int64_t Mb = (M + kRowBlock - 1) / kRowBlock, G = (Kp + group - 1) / group, N = q.shape(0);
  require(q.shape(1) == (size_t)Kp, "gemm_tq1: activations q must be [N, Kp]");
  require(sx.shape(0) == (size_t)N && sx.shape(1) == (size_t)G, "gemm_tq1: activation scales must be [N, G]");
  require(sumx.shape(0) == (size_t)N && sumx.shape(1) == (size_t)G, "gemm_tq1: activation sums must be [N, G]");
  require(y.shape(0) == (size_t)N && y.shape(1) == (size_t)M, "gemm_tq1: output must be [N, M]");
  std::vector<TQ1Weights> ws;
  for (auto& [codes, scale] : weights) {
    require(codes.shape(0) == (size_t)(Mb * (Kp / kTq1KC) * kTq1ChunkBytes), "gemm_tq1: packed codes have the wrong size for M, Kp");
    require(scale.shape(0) == (size_t)(Mb * G * kRowBlock), "gemm_tq1: scales have the wrong size for M, Kp, group");
    ws.push_back(TQ1Weights{codes.data(), scale.data(), M, Kp, group, Mb, G});
  }
  const char* path = nullptr;
  const Tq1Kernel k = tq1_kernel(&path);
  const ActQ a{q.data(), sx.data(), sumx.data(), N, Kp, group, G};
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) tq1_run(ws[it % ws.size()], a, y.data(), k);
  return {path, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// codebook (codebook.h): weights is a list of (codes u8 [Mt*Kp/v*m*8], scale f16-as-u16 [G*Mt*8]) copies of
// one [M, Kp] weight sharing the codebooks cbT f32 [m][v][nc] and cb f32 [m][nc][v]; x f32 [N, Kp]. Runs
// `iters` products (the i-th on copy i % len) with the Psumbook kernel (psum) or dequantize-then-multiply.
// Returns (kernel path, seconds).
std::tuple<std::string, double> gemm_codebook(
    std::vector<std::tuple<Arr<const uint8_t, nb::ndim<1>>, Arr<const uint16_t, nb::ndim<1>>>> weights,
    Arr<const float, nb::ndim<3>> cbT, Arr<const float, nb::ndim<3>> cb, int64_t M, int64_t Kp, int64_t group,
    Arr<const float, nb::ndim<2>> x, Arr<float, nb::ndim<2>> y, bool psum, int iters) {
  require(!weights.empty(), "gemm_codebook: no weights");
  require(iters >= 1, "gemm_codebook: iters must be >= 1");
  const int64_t m = cbT.shape(0), v = cbT.shape(1), nc = cbT.shape(2);
  require(m >= 1 && v >= 1 && nc >= 2 && nc <= 256 && (nc & (nc - 1)) == 0, "gemm_codebook: codebooks must be [m][v][2^b], b in 1..8");
  require(cb.shape(0) == (size_t)m && cb.shape(1) == (size_t)nc && cb.shape(2) == (size_t)v, "gemm_codebook: cb must be [m][nc][v] (cbT transposed)");
  require(M > 0 && Kp > 0 && Kp % v == 0, "gemm_codebook: M must be positive and Kp a positive multiple of v");
  require(group > 0 && group % v == 0, "gemm_codebook: group must be a positive multiple of v");
  const int64_t Mt = (M + 7) / 8, G = (Kp + group - 1) / group, N = x.shape(0);
  require(x.shape(1) == (size_t)Kp, "gemm_codebook: activations must be [N, Kp]");
  require(y.shape(0) == (size_t)N && y.shape(1) == (size_t)M, "gemm_codebook: output must be [N, M]");
  std::vector<CodebookWeights> ws;
  for (auto& [codes, scale] : weights) {
    CodebookWeights w{codes.data(), scale.data(), cbT.data(), cb.data(), M, Kp, group, m, v, nc, Mt, G};
    require(codes.shape(0) == (size_t)w.codes_bytes(), "gemm_codebook: packed codes have the wrong size for M, Kp, m, v");
    require(scale.shape(0) == (size_t)(G * Mt * 8), "gemm_codebook: scales have the wrong size for M, Kp, group");
    ws.push_back(w);
  }
  const char* path = nullptr;
  const CodebookKernel k = codebook_kernel(psum, &path);
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) codebook_run(ws[it % ws.size()], x.data(), N, y.data(), k);
  return {path, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// The codebook quantizer's nearest-centroid search (codebook.h): x, wt f32 [n, v], booksT f32 [v, nc] -> out u8 [n].
void codebook_assign_py(Arr<const float, nb::ndim<2>> x, std::optional<Arr<const float, nb::ndim<2>>> wt,
                        Arr<const float, nb::ndim<2>> booksT, Arr<uint8_t, nb::ndim<1>> out) {
  const int64_t n = x.shape(0), v = x.shape(1), nc = booksT.shape(1);
  require(booksT.shape(0) == (size_t)v && nc >= 1 && nc <= 256, "codebook_assign: booksT must be [v, nc <= 256]");
  require(out.shape(0) == (size_t)n, "codebook_assign: out must be [n]");
  if (wt) require(wt->shape(0) == (size_t)n && wt->shape(1) == (size_t)v, "codebook_assign: wt must be [n, v]");
  const float* w = wt ? wt->data() : nullptr;
  nb::gil_scoped_release release;
  codebook_assign(x.data(), w, booksT.data(), n, v, nc, out.data());
}

// A projection for the native decoder, from a tuple built by lowbit.model.native:
//   ("int", codes, scale, offset|None, zc, bits, M, K, Kp, group, bias|None)
//   ("f32" | "bf16", weight [M, K], bias|None)
//   ("tq1", codes, scale, M, K, Kp, group, bias|None)
LinearRef linear_from_tuple(nb::handle h) {
  nb::tuple t = nb::cast<nb::tuple>(h);
  const std::string kind = nb::cast<std::string>(t[0]);
  LinearRef L;
  auto bias = [&](size_t i) -> const float* {
    if (t[i].is_none()) return nullptr;
    return nb::cast<Arr<const float, nb::ndim<1>>>(t[i]).data();
  };
  if (kind == "int") {
    std::optional<U16> offset;
    if (!t[3].is_none()) offset = nb::cast<U16>(t[3]);
    const int64_t M = nb::cast<int64_t>(t[6]), K = nb::cast<int64_t>(t[7]);
    L.kind = 0;
    L.iw = checked_int_weights(nb::cast<U8>(t[1]), nb::cast<U16>(t[2]), offset, nb::cast<float>(t[4]),
                               nb::cast<int>(t[5]), M, nb::cast<int64_t>(t[8]), nb::cast<int64_t>(t[9]));
    L.M = M;
    L.K = K;
    L.bias = bias(10);
  } else if (kind == "tq1") {  // ("tq1", codes, scale, M, K, Kp, group, bias|None)
    auto codes = nb::cast<Arr<const uint8_t, nb::ndim<1>>>(t[1]);
    auto scale = nb::cast<Arr<const uint16_t, nb::ndim<1>>>(t[2]);
    const int64_t M = nb::cast<int64_t>(t[3]), K = nb::cast<int64_t>(t[4]), Kp = nb::cast<int64_t>(t[5]);
    const int64_t group = nb::cast<int64_t>(t[6]);
    const int64_t Mb = (M + kRowBlock - 1) / kRowBlock, G = (Kp + group - 1) / group;
    require(Kp % kTq1KC == 0 && (group % kTq1KC == 0 || group == Kp), "tq1: Kp and group must be multiples of 20");
    require(codes.shape(0) == (size_t)(Mb * (Kp / kTq1KC) * kTq1ChunkBytes), "tq1: packed codes have the wrong size");
    require(scale.shape(0) == (size_t)(Mb * G * kRowBlock), "tq1: scales have the wrong size");
    L.kind = 3;
    L.tq = TQ1Weights{codes.data(), scale.data(), M, Kp, group, Mb, G};
    L.M = M;
    L.K = K;
    L.bias = bias(7);
  } else if (kind == "codebook") {  // ("codebook", codes, scale, cbT, cb, M, K, Kp, group, bias|None)
    auto codes = nb::cast<Arr<const uint8_t, nb::ndim<1>>>(t[1]);
    auto scale = nb::cast<Arr<const uint16_t, nb::ndim<1>>>(t[2]);
    auto cbT = nb::cast<Arr<const float, nb::ndim<3>>>(t[3]);
    auto cb = nb::cast<Arr<const float, nb::ndim<3>>>(t[4]);
    const int64_t M = nb::cast<int64_t>(t[5]), K = nb::cast<int64_t>(t[6]), Kp = nb::cast<int64_t>(t[7]);
    const int64_t group = nb::cast<int64_t>(t[8]);
    const int64_t m = cbT.shape(0), v = cbT.shape(1), nc = cbT.shape(2);
    require(v >= 1 && Kp % v == 0 && Kp >= K && Kp - K < v && group > 0 && group % v == 0 && nc <= 256,
            "codebook: Kp, group must be multiples of v and nc <= 256");
    require(cb.shape(0) == (size_t)m && cb.shape(1) == (size_t)nc && cb.shape(2) == (size_t)v, "codebook: cb must be [m][nc][v]");
    L.kind = 4;
    L.cb = CodebookWeights{codes.data(), scale.data(), cbT.data(), cb.data(), M, Kp, group, m, v, nc, (M + 7) / 8,
                           (Kp + group - 1) / group};
    require(codes.shape(0) == (size_t)L.cb.codes_bytes(), "codebook: packed codes have the wrong size");
    require(scale.shape(0) == (size_t)(L.cb.G * L.cb.Mt * 8), "codebook: scales have the wrong size");
    L.M = M;
    L.K = K;
    L.bias = bias(9);
  } else if (kind == "f32" || kind == "bf16") {
    auto w = nb::cast<nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, nb::ndim<2>>>(t[1]);
    require(w.dtype() == (kind == "f32" ? nb::dtype<float>() : nb::dtype<uint16_t>()), "float weight dtype mismatch");
    L.kind = kind == "f32" ? 1 : 2;
    L.M = w.shape(0);
    L.K = w.shape(1);
    L.fw = FloatWeights{w.data(), L.M, L.K};
    L.bias = bias(2);
  } else {
    throw std::invalid_argument("unknown linear kind " + kind);
  }
  return L;
}

// Causal attention of n new tokens (prefill) over the static cache, heads x tokens on the pool.
// q: [n, heads, hd] (RoPE'd and scaled), cache: [kv_heads, max_ctx, hd] float32 or float16 (as uint16),
// positions pos..pos+n-1 already written; out: [n, heads*hd].
struct PrefillAttn {
  const float* q;
  const void *kc, *vc;
  float* out;
  int64_t n, heads, hd, group, max_ctx, pos;
  bool f16;
  const OpsTable* ops;
};

void prefill_attn_task(void* p, int64_t task) {
  const PrefillAttn& c = *static_cast<const PrefillAttn*>(p);
  thread_local std::vector<float> scores;
  const int64_t i = task / c.heads, h = task % c.heads, t = c.pos + i + 1;
  if ((int64_t)scores.size() < t) scores.resize(t);
  const int64_t off = (h / c.group) * c.max_ctx * c.hd;
  const float* q = c.q + (i * c.heads + h) * c.hd;
  float* o = c.out + (i * c.heads + h) * c.hd;
  if (c.f16)
    c.ops->attn_head_f16(q, static_cast<const uint16_t*>(c.kc) + off, static_cast<const uint16_t*>(c.vc) + off, t, c.hd,
                         scores.data(), o, 0.f);
  else
    c.ops->attn_head(q, static_cast<const float*>(c.kc) + off, static_cast<const float*>(c.vc) + off, t, c.hd,
                     scores.data(), o, 0.f);
}

void attention_prefill(Arr<const float, nb::ndim<3>> q, nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, nb::ndim<3>> kc,
                       nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, nb::ndim<3>> vc, int64_t pos,
                       Arr<float, nb::ndim<2>> out) {
  const int64_t n = q.shape(0), heads = q.shape(1), hd = q.shape(2);
  const int64_t kv = kc.shape(0), max_ctx = kc.shape(1);
  const bool f16 = kc.dtype() == nb::dtype<uint16_t>();
  require(f16 || kc.dtype() == nb::dtype<float>(), "the KV cache must be float32 or float16 (as uint16)");
  require(vc.dtype() == kc.dtype() && vc.shape(0) == kc.shape(0) && vc.shape(1) == kc.shape(1) && vc.shape(2) == kc.shape(2),
          "k and v caches must match");
  require(kc.shape(2) == (size_t)hd && kv > 0 && heads % kv == 0, "cache must be [kv_heads, max_ctx, hd] with heads % kv_heads == 0");
  require(hd <= 512, "head_dim above 512 is not supported");
  require(pos >= 0 && pos + n <= max_ctx, "positions outside the cache");
  require(out.shape(0) == (size_t)n && out.shape(1) == (size_t)(heads * hd), "out must be [n, heads*hd]");
  PrefillAttn c{q.data(), kc.data(), vc.data(), out.data(), n, heads, hd, heads / kv, max_ctx, pos, f16, &active_kernels().ops};
  nb::gil_scoped_release release;
  pool_run(n * heads, prefill_attn_task, &c);
}

nb::dict cpu_info() {
  const CpuFeatures& f = cpu_features();
  nb::dict d, feats;
  d["isa"] = selected_isa();
  d["reason"] = isa_reason();
  d["available"] = available_isas();
  feats["avx2"] = f.avx2 && f.os_avx;
  feats["fma"] = f.fma;
  feats["f16c"] = f.f16c;
  feats["avx_vnni"] = f.avxvnni;
  feats["avx512f"] = f.avx512f && f.os_avx512;
  feats["avx512bw"] = f.avx512bw;
  feats["avx512vl"] = f.avx512vl;
  feats["avx512dq"] = f.avx512dq;
  feats["avx512_vnni"] = f.avx512vnni;
  d["features"] = feats;
  d["threads"] = pool_threads();
  d["physical_cores"] = physical_cores();
  return d;
}

double bandwidth(Arr<const uint8_t, nb::ndim<1>> buf, int passes) {
  nb::gil_scoped_release release;
  return read_bandwidth(buf.data(), (int64_t)buf.shape(0), passes);
}

}  // namespace

void bind_decoder(nb::module_& m) {
  using F1 = Arr<const float, nb::ndim<1>>;
  using F2 = Arr<const float, nb::ndim<2>>;
  using C3 = nb::ndarray<nb::c_contig, nb::device::cpu, nb::ndim<3>>;
  nb::class_<Decoder>(m, "Decoder")
      .def("__init__",
           [](Decoder* d, int64_t hidden, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t inter, int64_t max_ctx,
              float eps, int act, F2 rope_c, F2 rope_s, bool kv_f16) {
             require(n_heads % n_kv == 0, "heads must be a multiple of kv heads");
             require(hd <= 512, "head_dim above 512 is not supported by the native decoder");
             require(hd % 2 == 0, "head_dim must be even");
             require(rope_c.shape(0) >= (size_t)max_ctx && rope_c.shape(1) == (size_t)hd, "rope C must be [max_ctx, hd]");
             require(rope_s.shape(0) >= (size_t)max_ctx && rope_s.shape(1) == (size_t)hd, "rope S must be [max_ctx, hd]");
             new (d) Decoder(DecoderShape{hidden, n_heads, n_kv, hd, inter, max_ctx, eps, act, kv_f16}, rope_c.data(),
                             rope_s.data());
           })
      .def("add_layer",
           [](Decoder& d, nb::tuple lins, F1 ln1, F1 ln2, std::optional<F1> attn_sub, std::optional<F1> ffn_sub, C3 kc,
              C3 vc) {
             const DecoderShape& s = d.shape();
             require(lins.size() == 7, "add_layer takes (q, k, v, o, gate, up, down)");
             DecoderLayer L;
             LinearRef* refs[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
             for (size_t i = 0; i < 7; ++i) *refs[i] = linear_from_tuple(lins[i]);
             require(L.q.M == s.n_heads * s.hd && L.q.K == s.hidden, "q_proj shape");
             require(L.k.M == s.n_kv * s.hd && L.v.M == s.n_kv * s.hd, "k/v_proj shape");
             require(L.o.M == s.hidden && L.o.K == s.n_heads * s.hd, "o_proj shape");
             require(L.gate.M == s.inter && L.up.M == s.inter && L.down.K == s.inter && L.down.M == s.hidden, "mlp shape");
             require(ln1.shape(0) == (size_t)s.hidden && ln2.shape(0) == (size_t)s.hidden, "norm shape");
             require(kc.shape(0) == (size_t)s.n_kv && kc.shape(1) == (size_t)s.max_ctx && kc.shape(2) == (size_t)s.hd,
                     "k cache must be [kv_heads, max_ctx, hd]");
             require(vc.shape(0) == kc.shape(0) && vc.shape(1) == kc.shape(1) && vc.shape(2) == kc.shape(2), "v cache shape");
             const auto want = s.kv_f16 ? nb::dtype<uint16_t>() : nb::dtype<float>();
             require(kc.dtype() == want && vc.dtype() == want,
                     s.kv_f16 ? "the KV cache must be float16 (passed as uint16 views)" : "the KV cache must be float32");
             L.ln1 = ln1.data();
             L.ln2 = ln2.data();
             L.attn_sub = attn_sub ? attn_sub->data() : nullptr;
             L.ffn_sub = ffn_sub ? ffn_sub->data() : nullptr;
             L.kc = kc.data();
             L.vc = vc.data();
             d.add_layer(L);
           },
           nb::arg("linears"), nb::arg("ln1"), nb::arg("ln2"), nb::arg("attn_sub").none(), nb::arg("ffn_sub").none(),
           nb::arg("kc"), nb::arg("vc"))
      .def("set_layer_extras",
           [](Decoder& d, size_t index, std::optional<F1> q_norm, std::optional<F1> k_norm, std::optional<F1> post_attn,
              std::optional<F1> post_ffn, int64_t window) {
             const DecoderShape& s = d.shape();
             require(index < d.n_layers(), "set_layer_extras: no such layer");
             require(!q_norm || q_norm->shape(0) == (size_t)s.hd, "q_norm must be [head_dim]");
             require(!k_norm || k_norm->shape(0) == (size_t)s.hd, "k_norm must be [head_dim]");
             require(!post_attn || post_attn->shape(0) == (size_t)s.hidden, "post_attn norm must be [hidden]");
             require(!post_ffn || post_ffn->shape(0) == (size_t)s.hidden, "post_ffn norm must be [hidden]");
             require(window >= 0, "window must be >= 0");
             DecoderLayer& L = d.layer(index);
             L.q_norm = q_norm ? q_norm->data() : nullptr;
             L.k_norm = k_norm ? k_norm->data() : nullptr;
             L.post_attn = post_attn ? post_attn->data() : nullptr;
             L.post_ffn = post_ffn ? post_ffn->data() : nullptr;
             L.window = window;
           },
           nb::arg("index"), nb::arg("q_norm").none(), nb::arg("k_norm").none(), nb::arg("post_attn").none(),
           nb::arg("post_ffn").none(), nb::arg("window"))
      .def("set_attention",
           [](Decoder& d, float qscale, float softcap) {
             require(qscale >= 0.f && softcap >= 0.f && std::isfinite(qscale) && std::isfinite(softcap),
                     "qscale and softcap must be finite and >= 0");
             d.set_attention(qscale, softcap);
           },
           nb::arg("qscale"), nb::arg("softcap"))
      .def("set_output",
           [](Decoder& d, F1 norm, nb::handle head) {
             require(norm.shape(0) == (size_t)d.shape().hidden, "final norm shape");
             LinearRef h = linear_from_tuple(head);
             require(h.K == d.shape().hidden, "lm_head shape");
             d.set_output(norm.data(), h);
           })
      .def("decode",
           [](Decoder& d, Arr<float, nb::ndim<1>> x, int64_t pos, Arr<float, nb::ndim<1>> logits) {
             require(x.shape(0) == (size_t)d.shape().hidden, "x must be [hidden]");
             require(pos >= 0 && pos < d.shape().max_ctx, "position outside the cache");
             nb::gil_scoped_release release;
             d.decode(x.data(), pos, logits.data());
           })
      .def("set_slots",
           [](Decoder& d, int64_t n_slots, int64_t slot_stride) {
             const DecoderShape& s = d.shape();
             require(n_slots >= 1, "n_slots must be >= 1");
             require(n_slots == 1 || slot_stride >= s.n_kv * s.max_ctx * s.hd, "slots overlap: slot_stride too small");
             d.set_slots(n_slots, slot_stride);
           },
           nb::arg("n_slots"), nb::arg("slot_stride"))
      .def("decode_batch",
           [](Decoder& d, Arr<float, nb::ndim<2>> x, Arr<const int64_t, nb::ndim<1>> pos,
              Arr<const int64_t, nb::ndim<1>> slot, Arr<float, nb::ndim<2>> logits) {
             const int64_t B = (int64_t)x.shape(0);
             require(B >= 1 && x.shape(1) == (size_t)d.shape().hidden, "x must be [B, hidden] with B >= 1");
             require(pos.shape(0) == (size_t)B && slot.shape(0) == (size_t)B, "pos and slot must be [B]");
             require(logits.shape(0) == (size_t)B && logits.shape(1) == (size_t)d.vocab(), "logits must be [B, vocab]");
             for (int64_t b = 0; b < B; ++b) {
               require(pos.data()[b] >= 0 && pos.data()[b] < d.shape().max_ctx, "position outside the cache");
               require(slot.data()[b] >= 0 && slot.data()[b] < d.n_slots(), "slot outside the cache");
               for (int64_t c = 0; c < b; ++c) require(slot.data()[c] != slot.data()[b], "two rows write the same slot");
             }
             nb::gil_scoped_release release;
             d.decode_batch(x.data(), B, pos.data(), slot.data(), logits.data());
           },
           nb::arg("x"), nb::arg("pos"), nb::arg("slot"), nb::arg("logits"));
}

namespace lowbit {
void bind_rsr(nb::module_& m);       // rsr_binding.cpp
void bind_quantize(nb::module_& m);  // quantize_binding.cpp
}

NB_MODULE(_native, m) {
  bind_decoder(m);
  bind_rsr(m);
  bind_quantize(m);
  m.doc() = "lowbit's C++ kernels: packed low-bit GEMV/GEMM, activation quantization, thread pool";
  m.def("set_isa", &select_isa, nb::arg("name"));
  m.def("isa", [] { return selected_isa(); });
  m.def("cpu_info", &cpu_info);
  m.def("set_threads", &pool_set_threads, nb::arg("n"));
  m.def("get_threads", &pool_threads);
  m.def("physical_cores", &physical_cores);
  m.def("quantize_act", &quantize_act, nb::arg("x"), nb::arg("q"), nb::arg("scale"), nb::arg("sum"), nb::arg("group"));
  m.def("gemm_int", &gemm_int, nb::arg("codes"), nb::arg("scale"), nb::arg("offset").none(), nb::arg("zc"),
        nb::arg("bits"), nb::arg("M"), nb::arg("Kp"), nb::arg("group"), nb::arg("q"), nb::arg("sx"),
        nb::arg("sumx"), nb::arg("y"));
  m.def("gemm_int_multi", &gemm_int_multi, nb::arg("weights"), nb::arg("Kp"), nb::arg("group"), nb::arg("q"),
        nb::arg("sx"), nb::arg("sumx"), nb::arg("ys"));
  m.def("gemm_float", &gemm_float, nb::arg("w"), nb::arg("x"), nb::arg("y"));
  m.def("gemm_tq1", &gemm_tq1, nb::arg("weights"), nb::arg("M"), nb::arg("Kp"), nb::arg("group"), nb::arg("q"),
        nb::arg("sx"), nb::arg("sumx"), nb::arg("y"), nb::arg("iters") = 1);
  m.def("gemm_codebook", &gemm_codebook, nb::arg("weights"), nb::arg("cbT"), nb::arg("cb"), nb::arg("M"), nb::arg("Kp"),
        nb::arg("group"), nb::arg("x"), nb::arg("y"), nb::arg("psum") = true, nb::arg("iters") = 1);
  m.def("codebook_assign", &codebook_assign_py, nb::arg("x"), nb::arg("wt").none(), nb::arg("booksT"), nb::arg("out"));
  m.def("bench_int", &bench_int);
  m.def("bench_float", &bench_float);
  m.def("f32_to_f16", [](Arr<const float, nb::ndim<1>> x, Arr<uint16_t, nb::ndim<1>> out) {
    require(out.shape(0) == x.shape(0), "out must match x");
    active_kernels().ops.f32_to_f16_row(x.data(), out.data(), (int64_t)x.shape(0));
  }, "float32 -> float16 bits with the active ISA's converter (the KV cache write), for tests");
  m.def("attention_prefill", &attention_prefill, nb::arg("q"), nb::arg("kc"), nb::arg("vc"), nb::arg("pos"), nb::arg("out"));
  m.def("read_bandwidth", &bandwidth, nb::arg("buf"), nb::arg("passes"));
  m.def("pool_overhead", [](int iters) { return pool_overhead(iters); }, nb::arg("iters"));
}
