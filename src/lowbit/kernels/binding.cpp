// Python binding (nanobind). Arrays come in allocated by the Python side (lowbit.formats); this file
// checks everything a kernel will trust — dtypes, shapes, lengths, group sizes, the int32 accumulator
// bound — before any arithmetic (py_args.h: exact arrays, never converted copies), then releases the
// GIL, holds the settings lock shared (set_isa / set_threads wait for running kernels) and hands row
// blocks to the thread pool.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "act_quant.h"
#include "bandwidth.h"
#include "common.h"
#include "dispatch.h"
#include "linear.h"
#include "py_args.h"
#include "roof.h"
#include "weight_args.h"
#include "thread_pool.h"
#include "tq1.h"
#include "codebook.h"

namespace nb = nanobind;
using namespace lowbit;
using namespace lowbit::py;

namespace {

// One token block of int8 activations as quantize_act writes them: q [N, Kp] in [-127, 127], scale and
// sum [N, G]. (-128 would break the AVX2 sign trick of the 8-bit kernel and the accumulator bound.)
struct Acts {
  In<int8_t, 2> q;
  In<float, 2> sx;
  In<int32_t, 2> sum;
  ActQ view(int64_t Kp, int64_t group, int64_t G) const {
    return ActQ{q.data(), sx.data(), sum.data(), (int64_t)q.shape(0), Kp, group, G};
  }
  int64_t N() const { return (int64_t)q.shape(0); }
};

Acts checked_acts(const char* fn, nb::handle hq, nb::handle hsx, nb::handle hsum, int64_t Kp, int64_t G) {
  Acts a{in<int8_t, 2>(hq, "activations q"), in<float, 2>(hsx, "activation scales sx"),
         in<int32_t, 2>(hsum, "activation sums sumx")};
  const int64_t N = a.N();
  if (a.q.shape(1) != (size_t)Kp) fail(std::string(fn) + ": activations q must be [N, Kp=" + std::to_string(Kp) + "]");
  if (!is_shape(a.sx, N, G) || !is_shape(a.sum, N, G))
    fail(std::string(fn) + ": activation scales and sums must be [N=" + std::to_string(N) + ", G=" + std::to_string(G) + "]");
  const int8_t* q = a.q.data();
  bool has_min = false;
  for (int64_t i = 0, n = N * Kp; i < n; ++i) has_min |= q[i] == -128;
  if (has_min) fail(std::string(fn) + ": activations q must lie in [-127, 127] (as quantize_act writes them)");
  return a;
}

Out<float, 2> checked_output(const char* fn, nb::handle h, int64_t N, int64_t M) {
  Out<float, 2> y = out<float, 2>(h, "output y");
  if (!is_shape(y, N, M)) fail(std::string(fn) + ": output y must be [N, M] = [" + std::to_string(N) + ", " + std::to_string(M) + "]");
  return y;
}

void quantize_act(nb::handle hx, nb::handle hq, nb::handle hscale, nb::handle hsum, int64_t group) {
  auto x = in<float, 2>(hx, "quantize_act: x");
  auto q = out<int8_t, 2>(hq, "quantize_act: q");
  auto scale = out<float, 2>(hscale, "quantize_act: scale");
  auto sum = out<int32_t, 2>(hsum, "quantize_act: sum");
  require(group > 0, "quantize_act: group must be positive");
  const int64_t N = x.shape(0), K = x.shape(1), Kp = q.shape(1);
  const int64_t G = (Kp + group - 1) / group;
  require(q.shape(0) == (size_t)N && Kp >= K, "quantize_act: q must be [N, Kp >= K]");
  require(is_shape(scale, N, G), "quantize_act: scale must be [N, G = ceil(Kp / group)]");
  require(is_shape(sum, N, G), "quantize_act: sum must be [N, G = ceil(Kp / group)]");
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  quantize_activations(x.data(), N, K, K, Kp, group, q.data(), scale.data(), sum.data());
}

void gemm_int(nb::handle codes, nb::handle scale, nb::handle offset, float zc, int bits, int64_t M, int64_t Kp,
              int64_t group, nb::handle q, nb::handle sx, nb::handle sumx, nb::handle hy) {
  const IntWeights w = checked_int_weights("gemm_int", codes, scale, offset, zc, bits, M, Kp, group);
  const Acts a = checked_acts("gemm_int", q, sx, sumx, Kp, w.G);
  auto y = checked_output("gemm_int", hy, a.N(), M);
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  const IntJob j = make_int_job(w, a.view(Kp, group, w.G), y.data(), &active_kernels());
  pool_run(j.tasks(), int_task, (void*)&j);
}

// weights: (codes, scale, offset|None, zc, bits, M) each, all with the same Kp and group.
void gemm_int_multi(nb::handle hweights, int64_t Kp, int64_t group, nb::handle q, nb::handle sx, nb::handle sumx,
                    nb::handle hys) {
  const auto weights = seq(hweights, "gemm_int_multi: weights");
  const auto ys_in = seq(hys, "gemm_int_multi: ys");
  require(weights.size() == ys_in.size(), "gemm_int_multi: one output per weight");
  require(Kp > 0 && Kp % kKAlign == 0, "gemm_int_multi: Kp must be a positive multiple of 64");
  require(group > 0 && (group % kGroupAlign == 0 || group == Kp), "gemm_int_multi: group must be a positive multiple of 32, or Kp");
  const int64_t G = (Kp + group - 1) / group;
  const Acts a = checked_acts("gemm_int_multi", q, sx, sumx, Kp, G);
  std::vector<IntWeights> ws;
  std::vector<float*> ys;
  for (size_t i = 0; i < weights.size(); ++i) {
    const auto t = items(weights[i], 6, "gemm_int_multi: each weight (codes, scale, offset, zc, bits, M)");
    const int64_t M = scalar<int64_t>(t[5], "gemm_int_multi: M");
    ws.push_back(checked_int_weights("gemm_int_multi", t[0], t[1], t[2], scalar<float>(t[3], "gemm_int_multi: zc"),
                                     scalar<int>(t[4], "gemm_int_multi: bits"), M, Kp, group));
    ys.push_back(checked_output("gemm_int_multi", ys_in[i], a.N(), M).data());
  }
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  MultiIntJob m;
  for (size_t i = 0; i < ws.size(); ++i) m.add(make_int_job(ws[i], a.view(Kp, group, G), ys[i], &active_kernels()));
  pool_run(m.tasks(), multi_int_task, &m);
}

void gemm_float(nb::handle hw, nb::handle hx, nb::handle hy) {
  const auto [w, bf16] = checked_float_weights("gemm_float", hw);
  auto x = in<float, 2>(hx, "gemm_float: x");
  const int64_t N = x.shape(0);
  require(x.shape(1) == (size_t)w.K, "gemm_float: x must be [N, K] with the weight's K");
  auto y = checked_output("gemm_float", hy, N, w.M);
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  FloatJob j{w, x.data(), N, y.data(), bf16, &active_kernels()};
  std::vector<float> xbuf;
  if (bf16 && j.k->bf16_x_layout) {
    xbuf.resize(N * j.k->bf16_x_stride(w.K));
    j.k->bf16_x_layout(x.data(), N, w.K, xbuf.data());
    j.x = xbuf.data();
  }
  pool_run(j.tasks(), float_task, &j);
}

// Benchmark loops: the same pool_run path as gemm_int/gemm_float, called `iters` times over a rotation
// of weight copies (so the weights come from DRAM, not the cache), without Python between calls.
double bench_int(nb::handle hcopies, float zc, int bits, int64_t M, int64_t Kp, int64_t group, nb::handle q,
                 nb::handle sx, nb::handle sumx, nb::handle hy, int iters) {
  const auto copies = seq(hcopies, "bench_int: copies");
  require(!copies.empty(), "bench_int: no weights");
  require(iters >= 0, "bench_int: iters must be >= 0");
  std::vector<IntWeights> ws;
  for (const auto& c : copies) {
    const auto t = items(c, 3, "bench_int: each copy (codes, scale, offset)");
    ws.push_back(checked_int_weights("bench_int", t[0], t[1], t[2], zc, bits, M, Kp, group));
  }
  const int64_t G = ws[0].G;
  const Acts a = checked_acts("bench_int", q, sx, sumx, Kp, G);
  auto y = checked_output("bench_int", hy, a.N(), M);
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  std::vector<IntJob> jobs;
  for (const IntWeights& w : ws) jobs.push_back(make_int_job(w, a.view(Kp, group, G), y.data(), &active_kernels()));
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) {
    IntJob& j = jobs[it % jobs.size()];
    pool_run(j.tasks(), int_task, &j);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double bench_float(nb::handle hcopies, nb::handle hx, nb::handle hy, int iters) {
  const auto copies = seq(hcopies, "bench_float: copies");
  require(!copies.empty(), "bench_float: no weights");
  require(iters >= 0, "bench_float: iters must be >= 0");
  std::vector<std::pair<FloatWeights, bool>> ws;
  for (const auto& c : copies) {
    ws.push_back(checked_float_weights("bench_float", c));
    require(ws.back().first.M == ws[0].first.M && ws.back().first.K == ws[0].first.K && ws.back().second == ws[0].second,
            "bench_float: every copy must have the first one's shape and dtype");
  }
  auto x = in<float, 2>(hx, "bench_float: x");
  const int64_t N = x.shape(0), K = ws[0].first.K;
  require(x.shape(1) == (size_t)K, "bench_float: x must be [N, K] with the weight's K");
  auto y = checked_output("bench_float", hy, N, ws[0].first.M);
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  std::vector<FloatJob> jobs;
  for (auto& [w, bf16] : ws) jobs.push_back(FloatJob{w, x.data(), N, y.data(), bf16, &active_kernels()});
  std::vector<float> xbuf;
  if (jobs[0].bf16 && jobs[0].k->bf16_x_layout) {
    xbuf.resize(N * jobs[0].k->bf16_x_stride(K));
    jobs[0].k->bf16_x_layout(x.data(), N, K, xbuf.data());
    for (auto& j : jobs) j.x = xbuf.data();
  }
  const int64_t ntasks = jobs[0].tasks();
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) pool_run(ntasks, float_task, &jobs[it % jobs.size()]);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// tq1 (tq1.h): weights is a list of (codes u8 [Mb*Kp/20*256], scale f16-as-u16 [Mb*G*64]) copies of one
// [M, Kp] weight; runs `iters` products y = W . x, the i-th on copy i % len (one copy, iters=1: a matmul;
// more: the benchmark loop without Python between calls). Returns (kernel path, seconds).
std::tuple<std::string, double> gemm_tq1(nb::handle hweights, int64_t M, int64_t Kp, int64_t group, nb::handle q,
                                         nb::handle sx, nb::handle sumx, nb::handle hy, int iters) {
  const auto weights = seq(hweights, "gemm_tq1: weights");
  require(!weights.empty(), "gemm_tq1: no weights");
  require(iters >= 1, "gemm_tq1: iters must be >= 1");
  std::vector<TQ1Weights> ws;
  for (const auto& c : weights) {
    const auto t = items(c, 2, "gemm_tq1: each weight (codes, scale)");
    ws.push_back(checked_tq1_weights("gemm_tq1", t[0], t[1], M, Kp, group));
  }
  const int64_t G = ws[0].G;
  const Acts a = checked_acts("gemm_tq1", q, sx, sumx, Kp, G);
  auto y = checked_output("gemm_tq1", hy, a.N(), M);
  const ActQ av = a.view(Kp, group, G);
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  const char* path = nullptr;
  const Tq1Kernel k = tq1_kernel(&path);
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) tq1_run(ws[it % ws.size()], av, y.data(), k);
  return {path, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// codebook (codebook.h): weights is a list of (codes u8 [Mt*Kp/v*m*8], scale f16-as-u16 [G*Mt*8][, codes16]) copies of
// one [M, Kp] weight sharing the codebooks cbT f32 [m][v][nc] and cb f32 [m][nc][v]; x f32 [N, Kp]. Runs
// `iters` products (the i-th on copy i % len) with the Psumbook kernel (psum) or dequantize-then-multiply.
// Returns (kernel path, seconds).
std::tuple<std::string, double> gemm_codebook(nb::handle hweights, nb::handle hcbT, nb::handle hcb, int64_t M, int64_t Kp,
                                              int64_t group, nb::handle hx, nb::handle hy, bool psum, int iters) {
  const auto weights = seq(hweights, "gemm_codebook: weights");
  require(!weights.empty(), "gemm_codebook: no weights");
  require(iters >= 1, "gemm_codebook: iters must be >= 1");
  auto x = in<float, 2>(hx, "gemm_codebook: x");
  const int64_t N = x.shape(0);
  require(x.shape(1) == (size_t)Kp, "gemm_codebook: activations must be [N, Kp]");
  auto y = checked_output("gemm_codebook", hy, N, M);
  std::vector<CodebookWeights> ws;
  for (const auto& c : weights) {
    const bool with16 = (nb::isinstance<nb::tuple>(c) || nb::isinstance<nb::list>(c)) && nb::len(c) == 3;
    const auto t = items(c, with16 ? 3 : 2, "gemm_codebook: each weight (codes, scale[, codes16])");
    ws.push_back(checked_codebook_weights("gemm_codebook", t[0], t[1], hcbT, hcb, M, Kp, group,
                                          with16 ? nb::handle(t[2]) : nb::handle(nb::none())));
  }
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  const char* path = nullptr;
  const CodebookKernel k = codebook_kernel(psum, &path);
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) codebook_run(ws[it % ws.size()], x.data(), N, y.data(), k);
  return {path, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// The codebook quantizer's beam search (codebook.h): x, wt f32 [n, v] (wt may be None), books f32 [m, nc, v],
// codes u8 [n, m] (in: start tuples, out: the best found).
void codebook_beam_py(nb::handle hx, nb::handle hwt, nb::handle hbooks, nb::handle hcodes, int64_t beam) {
  auto x = in<float, 2>(hx, "codebook_beam: x");
  auto wt = in_or_none<float, 2>(hwt, "codebook_beam: wt");
  auto books = in<float, 3>(hbooks, "codebook_beam: books");
  auto codes = out<uint8_t, 2>(hcodes, "codebook_beam: codes");
  const int64_t n = x.shape(0), v = x.shape(1), m = books.shape(0), nc = books.shape(1);
  require(m >= 1 && nc >= 1 && nc <= 256 && books.shape(2) == (size_t)v, "codebook_beam: books must be [m, nc <= 256, v]");
  require(codes.shape(0) == (size_t)n && codes.shape(1) == (size_t)m, "codebook_beam: codes must be [n, m]");
  require(beam >= 1 && beam <= 4096, "codebook_beam: beam must be in 1..4096");
  if (wt.data()) require(is_shape(wt, n, v), "codebook_beam: wt must be [n, v]");
  const uint8_t* c = codes.data();
  for (int64_t i = 0; i < n * m; ++i) require(c[i] < nc, "codebook_beam: start codes must be < nc");
  const float* w = wt.data();
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  codebook_beam(x.data(), w, books.data(), n, m, v, nc, beam, codes.data());
}

// b = 4 codes (nibble layout, codebook.h) of an [M, Kp] weight with m codebooks of v-vectors, scale groups of
// `group` -> out: the AVX-512 kernel's codes16 layout.
void codebook_codes16_py(nb::handle hcodes, int64_t M, int64_t Kp, int64_t group, int64_t m, int64_t v, nb::handle hout) {
  auto codes = in<uint8_t, 1>(hcodes, "codebook_codes16: codes");
  auto o = out<uint8_t, 1>(hout, "codebook_codes16: out");
  require(M > 0 && Kp > 0 && m >= 1 && v >= 1 && Kp % v == 0 && group > 0 && group % v == 0,
          "codebook_codes16: M, Kp, m, v must be positive, Kp and group multiples of v");
  CodebookWeights w{codes.data(), nullptr, nullptr, nullptr, M, Kp, group, m, v, 16, CodebookWeights::tiles(M, 16),
                    (Kp + group - 1) / group};
  require(codes.shape(0) == (size_t)w.codes_bytes(), "codebook_codes16: codes have the wrong size for M, Kp, m, v");
  w.codes16 = o.data();
  require(o.shape(0) == (size_t)w.codes16_bytes(), "codebook_codes16: out has the wrong size");
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  codebook_make_codes16(w, o.data());
}

// The codebook quantizer's nearest-centroid search (codebook.h): x, wt f32 [n, v], booksT f32 [v, nc] -> out u8 [n].
void codebook_assign_py(nb::handle hx, nb::handle hwt, nb::handle hbooksT, nb::handle hout) {
  auto x = in<float, 2>(hx, "codebook_assign: x");
  auto wt = in_or_none<float, 2>(hwt, "codebook_assign: wt");
  auto booksT = in<float, 2>(hbooksT, "codebook_assign: booksT");
  auto o = out<uint8_t, 1>(hout, "codebook_assign: out");
  const int64_t n = x.shape(0), v = x.shape(1), nc = booksT.shape(1);
  require(booksT.shape(0) == (size_t)v && nc >= 1 && nc <= 256, "codebook_assign: booksT must be [v, nc <= 256]");
  require(o.shape(0) == (size_t)n, "codebook_assign: out must be [n]");
  if (wt.data()) require(is_shape(wt, n, v), "codebook_assign: wt must be [n, v]");
  const float* w = wt.data();
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  codebook_assign(x.data(), w, booksT.data(), n, v, nc, o.data());
}

nb::dict cpu_info() {
  const CpuFeatures& f = cpu_features();
  nb::dict d, feats;
  d["isa"] = selected_isa();
  d["reason"] = isa_reason();
  d["available"] = available_isas();
  d["stream_prefetch"] = stream_prefetch_reason();
  feats["avx2"] = f.avx2 && f.os_avx;
  feats["fma"] = f.fma;
  feats["f16c"] = f.f16c;
  feats["avx_vnni"] = f.avxvnni;
  feats["avx512f"] = f.avx512f && f.os_avx512;
  feats["avx512bw"] = f.avx512bw;
  feats["avx512vl"] = f.avx512vl;
  feats["avx512dq"] = f.avx512dq;
  feats["avx512_vnni"] = f.avx512vnni;
  feats["avx512_vbmi"] = f.avx512vbmi;
  d["features"] = feats;
  d["threads"] = pool_threads();
  d["physical_cores"] = physical_cores();
  d["affinity_cpus"] = affinity_cpus();
  d["cgroup_cpu_quota"] = cgroup_cpu_limit();
  d["default_threads"] = default_threads();
  return d;
}

double bandwidth(nb::handle hbuf, int passes) {
  auto buf = in<uint8_t, 1>(hbuf, "read_bandwidth: buf");
  require(passes >= 0, "read_bandwidth: passes must be >= 0");
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  return read_bandwidth(buf.data(), (int64_t)buf.shape(0), passes);
}

void set_isa(const std::string& name) {
  nb::gil_scoped_release release;
  std::unique_lock<std::shared_mutex> lock(settings_mutex());  // waits for running kernels
  select_isa(name);
}

void set_threads(int n) {
  if (n < 1 || n > kMaxThreads) fail("set_threads: n must be in [1, " + std::to_string(kMaxThreads) + "], got " + std::to_string(n));
  nb::gil_scoped_release release;
  std::unique_lock<std::shared_mutex> lock(settings_mutex());  // waits for running kernels
  pool_set_threads(n);
}

}  // namespace

namespace lowbit {
void bind_rsr(nb::module_& m);       // rsr_binding.cpp
void bind_quantize(nb::module_& m);  // quantize_binding.cpp
void bind_decoder(nb::module_& m);   // decoder_binding.cpp
void bind_attention(nb::module_& m); // attention_binding.cpp
}

NB_MODULE(_native, m) {
  bind_decoder(m);
  bind_attention(m);
  bind_rsr(m);
  bind_quantize(m);
  m.doc() = "lowbit's C++ kernels: packed low-bit GEMV/GEMM, activation quantization, thread pool";
  m.def("set_isa", &set_isa, nb::arg("name"));
  m.def("isa", [] { return selected_isa(); });
  m.def("codebook_vbmi_active", &codebook_vbmi_active);
  m.def("cpu_info", &cpu_info);
  m.def("set_threads", &set_threads, nb::arg("n"));
  m.def("get_threads", &pool_threads);
  m.def("physical_cores", &physical_cores);
  m.def("default_threads", &default_threads);
  m.def("cgroup_cpu_limit", [](const std::string& root, const std::string& self_cgroup) { return cgroup_cpu_limit(root, self_cgroup); },
        nb::arg("root"), nb::arg("self_cgroup"), "CPUs of the cgroup quota under a given mount root (tests); <= 0: none");
  m.def("pool_sleeping", &pool_sleeping, "workers parked on the condition variable now (the idle test)");
  m.def("cpuid_queries", &cpuid_queries, "how many times CPUID ran in this process (once: the decision is cached)");
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
  m.def("codebook_beam", &codebook_beam_py, nb::arg("x"), nb::arg("wt").none(), nb::arg("books"), nb::arg("codes"),
        nb::arg("beam"));
  m.def("codebook_codes16", &codebook_codes16_py, nb::arg("codes"), nb::arg("M"), nb::arg("Kp"), nb::arg("group"),
        nb::arg("m"), nb::arg("v"), nb::arg("out"));
  m.def("codebook_assign", &codebook_assign_py, nb::arg("x"), nb::arg("wt").none(), nb::arg("booksT"), nb::arg("out"));
  m.def("bench_int", &bench_int, nb::arg("copies"), nb::arg("zc"), nb::arg("bits"), nb::arg("M"), nb::arg("Kp"),
        nb::arg("group"), nb::arg("q"), nb::arg("sx"), nb::arg("sumx"), nb::arg("y"), nb::arg("iters"));
  m.def("bench_float", &bench_float, nb::arg("copies"), nb::arg("x"), nb::arg("y"), nb::arg("iters"));
  m.def("f32_to_f16", [](nb::handle hx, nb::handle hout) {
    auto x = in<float, 1>(hx, "f32_to_f16: x");
    auto o = out<uint16_t, 1>(hout, "f32_to_f16: out");
    require(o.shape(0) == x.shape(0), "f32_to_f16: out must have x's length");
    nb::gil_scoped_release release;
    KernelsRunning running(settings_mutex());
    active_kernels().ops.f32_to_f16_row(x.data(), o.data(), (int64_t)x.shape(0));
  }, nb::arg("x"), nb::arg("out"), "float32 -> float16 bits with the active ISA's converter (the KV cache write), for tests");
  m.def("read_bandwidth", &bandwidth, nb::arg("buf"), nb::arg("passes"));
  m.def("pool_overhead", [](int iters) {
    require(iters >= 1, "pool_overhead: iters must be >= 1");
    nb::gil_scoped_release release;
    KernelsRunning running(settings_mutex());
    return pool_overhead(iters);
  }, nb::arg("iters"));
  // (seconds, MACs, instruction mix) of the active ISA's int8 roof probe on `threads` pool threads.
  m.def("int8_roof", [](int64_t iters, int threads) {
    require(iters >= 1, "int8_roof: iters must be >= 1");
    require(threads >= 1 && threads <= pool_threads(), "int8_roof: threads must be in [1, get_threads()]");
    const char* what = nullptr;
    RoofResult r;
    {
      nb::gil_scoped_release release;
      KernelsRunning running(settings_mutex());
      roof_probe(&what);
      r = roof_measure(iters, threads);
    }
    return std::make_tuple(r.seconds, r.macs, std::string(what));
  }, nb::arg("iters"), nb::arg("threads"));
}
