// Python binding (nanobind). Arrays come in allocated by the Python side (lowbit.formats); this file
// checks their shapes, releases the GIL and hands row blocks to the thread pool.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <chrono>
#include <tuple>
#include <vector>
#include <stdexcept>
#include <string>

#include "act_quant.h"
#include "bandwidth.h"
#include "common.h"
#include "dispatch.h"
#include "thread_pool.h"

namespace nb = nanobind;
using namespace lowbit;

template <typename T, typename... Shape>
using Arr = nb::ndarray<T, nb::c_contig, nb::device::cpu, Shape...>;

namespace {

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

struct IntJob {
  IntWeights w;
  ActQ a;
  float* y;
  int64_t ldy, tok_chunk, n_tok_chunks;
  const KernelTable* k;
};

void int_task(void* p, int64_t t) {
  const IntJob& j = *static_cast<const IntJob*>(p);
  const int64_t blk = t / j.n_tok_chunks, tc = t % j.n_tok_chunks;
  const int64_t n0 = tc * j.tok_chunk, n1 = std::min(j.a.N, n0 + j.tok_chunk);
  ActQ a = j.a;
  a.q += n0 * a.Kp;
  a.scale += n0 * a.G;
  a.sum += n0 * a.G;
  a.N = n1 - n0;
  j.k->gemm_int(j.w, a, j.y + n0 * j.ldy, j.ldy, blk, blk + 1);
}

// Several weights reading the same activations (Q/K/V, gate/up): one pool run over all their row blocks,
// so the threads fork and join once and small matrices (K/V) share the work with large ones.
struct MultiIntJob {
  std::vector<IntJob> parts;
  std::vector<int64_t> first_task;  // prefix sums of tasks per part
};

void multi_int_task(void* p, int64_t t) {
  const MultiIntJob& m = *static_cast<const MultiIntJob*>(p);
  size_t i = std::upper_bound(m.first_task.begin(), m.first_task.end(), t) - m.first_task.begin() - 1;
  int_task((void*)&m.parts[i], t - m.first_task[i]);
}

struct FloatJob {
  FloatWeights w;
  const float* x;
  int64_t N;
  float* y;
  bool bf16;
  const KernelTable* k;
};

constexpr int64_t kFloatBlocksPerTask = 8;

void float_task(void* p, int64_t t) {
  const FloatJob& j = *static_cast<const FloatJob*>(p);
  const int64_t nb_total = (j.w.M + kFloatRows - 1) / kFloatRows;
  const int64_t b0 = t * kFloatBlocksPerTask, b1 = std::min(nb_total, b0 + kFloatBlocksPerTask);
  (j.bf16 ? j.k->gemm_bf16 : j.k->gemm_f32)(j.w, j.x, j.N, j.y, j.w.M, b0, b1);
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

void gemm_int(Arr<const uint8_t, nb::ndim<1>> codes, Arr<const uint16_t, nb::ndim<1>> scale,
              std::optional<Arr<const uint16_t, nb::ndim<1>>> offset, float zc, int bits, int64_t M, int64_t Kp,
              int64_t group, Arr<const int8_t, nb::ndim<2>> q, Arr<const float, nb::ndim<2>> sx,
              Arr<const int32_t, nb::ndim<2>> sumx, Arr<float, nb::ndim<2>> y) {
  require(bits == 1 || bits == 2 || bits == 4 || bits == 8, "bits must be 1, 2, 4 or 8");
  require(Kp > 0 && Kp % kKAlign == 0, "Kp must be a positive multiple of 64");
  require(group > 0 && (group % kKAlign == 0 || group == Kp), "group must be a multiple of 64 or Kp");
  const int64_t Mb = (M + kRowBlock - 1) / kRowBlock, G = (Kp + group - 1) / group;
  const int64_t N = q.shape(0);
  require(codes.shape(0) == (size_t)(Mb * Kp * kRowBlock * bits / 8), "packed codes have the wrong size for M, Kp, bits");
  require(scale.shape(0) == (size_t)(Mb * G * kRowBlock), "scales have the wrong size for M, Kp, group");
  if (offset) require(offset->shape(0) == scale.shape(0), "offsets must match scales");
  require(q.shape(1) == (size_t)Kp, "activations: q must be [N, Kp]");
  require(sx.shape(0) == (size_t)N && sx.shape(1) == (size_t)G, "activations: scale must be [N, G]");
  require(sumx.shape(0) == (size_t)N && sumx.shape(1) == (size_t)G, "activations: sum must be [N, G]");
  require(y.shape(0) == (size_t)N && y.shape(1) == (size_t)M, "output must be [N, M]");
  IntJob j;
  j.w = IntWeights{codes.data(), scale.data(), offset ? offset->data() : nullptr, zc, bits, M, Kp, group, Mb, G};
  j.a = ActQ{q.data(), sx.data(), sumx.data(), N, Kp, group, G};
  j.y = y.data();
  j.ldy = M;
  // Prefill: split tokens too, so a small M still feeds every thread.
  j.tok_chunk = N > 64 ? 64 : N;
  j.n_tok_chunks = (N + j.tok_chunk - 1) / j.tok_chunk;
  j.k = &active_kernels();
  nb::gil_scoped_release release;
  pool_run(Mb * j.n_tok_chunks, int_task, &j);
}

using IntWeightTuple = std::tuple<Arr<const uint8_t, nb::ndim<1>>, Arr<const uint16_t, nb::ndim<1>>,
                                  std::optional<Arr<const uint16_t, nb::ndim<1>>>, float, int, int64_t>;

// weights: (codes, scale, offset|None, zc, bits, M) each, all with the same Kp and group.
void gemm_int_multi(std::vector<IntWeightTuple> weights, int64_t Kp, int64_t group, Arr<const int8_t, nb::ndim<2>> q,
                    Arr<const float, nb::ndim<2>> sx, Arr<const int32_t, nb::ndim<2>> sumx,
                    std::vector<Arr<float, nb::ndim<2>>> ys) {
  require(weights.size() == ys.size(), "one output per weight");
  require(Kp > 0 && Kp % kKAlign == 0, "Kp must be a positive multiple of 64");
  require(group > 0 && (group % kKAlign == 0 || group == Kp), "group must be a multiple of 64 or Kp");
  const int64_t N = q.shape(0), G = (Kp + group - 1) / group;
  require(q.shape(1) == (size_t)Kp, "activations: q must be [N, Kp]");
  require(sx.shape(0) == (size_t)N && sx.shape(1) == (size_t)G, "activations: scale must be [N, G]");
  require(sumx.shape(0) == (size_t)N && sumx.shape(1) == (size_t)G, "activations: sum must be [N, G]");
  MultiIntJob m;
  int64_t tasks = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    auto& [codes, scale, offset, zc, bits, M] = weights[i];
    require(bits == 1 || bits == 2 || bits == 4 || bits == 8, "bits must be 1, 2, 4 or 8");
    const int64_t Mb = (M + kRowBlock - 1) / kRowBlock;
    require(codes.shape(0) == (size_t)(Mb * Kp * kRowBlock * bits / 8), "packed codes have the wrong size");
    require(scale.shape(0) == (size_t)(Mb * G * kRowBlock), "scales have the wrong size");
    if (offset) require(offset->shape(0) == scale.shape(0), "offsets must match scales");
    require(ys[i].shape(0) == (size_t)N && ys[i].shape(1) == (size_t)M, "output must be [N, M]");
    IntJob j;
    j.w = IntWeights{codes.data(), scale.data(), offset ? offset->data() : nullptr, zc, bits, M, Kp, group, Mb, G};
    j.a = ActQ{q.data(), sx.data(), sumx.data(), N, Kp, group, G};
    j.y = ys[i].data();
    j.ldy = M;
    j.tok_chunk = N > 64 ? 64 : N;
    j.n_tok_chunks = (N + j.tok_chunk - 1) / j.tok_chunk;
    j.k = &active_kernels();
    m.first_task.push_back(tasks);
    tasks += Mb * j.n_tok_chunks;
    m.parts.push_back(j);
  }
  nb::gil_scoped_release release;
  pool_run(tasks, multi_int_task, &m);
}

void gemm_float(nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, nb::ndim<2>> w, Arr<const float, nb::ndim<2>> x,
                Arr<float, nb::ndim<2>> y) {
  const bool bf16 = w.dtype() == nb::dtype<uint16_t>();
  require(bf16 || w.dtype() == nb::dtype<float>(), "float weights must be float32 or bf16 stored as uint16");
  const int64_t M = w.shape(0), K = w.shape(1), N = x.shape(0);
  require(x.shape(1) == (size_t)K, "x must be [N, K]");
  require(y.shape(0) == (size_t)N && y.shape(1) == (size_t)M, "output must be [N, M]");
  FloatJob j{FloatWeights{w.data(), M, K}, x.data(), N, y.data(), bf16, &active_kernels()};
  const int64_t nblocks = (M + kFloatRows - 1) / kFloatRows;
  nb::gil_scoped_release release;
  std::vector<float> xbuf;
  if (bf16 && j.k->bf16_x_layout) {
    xbuf.resize(N * j.k->bf16_x_stride(K));
    j.k->bf16_x_layout(x.data(), N, K, xbuf.data());
    j.x = xbuf.data();
  }
  pool_run((nblocks + kFloatBlocksPerTask - 1) / kFloatBlocksPerTask, float_task, &j);
}

// Benchmark loops: the same pool_run path as gemm_int/gemm_float, called `iters` times over a rotation
// of weight copies (so the weights come from DRAM, not the cache), without Python between calls.
double bench_int(std::vector<std::tuple<Arr<const uint8_t, nb::ndim<1>>, Arr<const uint16_t, nb::ndim<1>>,
                                        std::optional<Arr<const uint16_t, nb::ndim<1>>>>> copies,
                 float zc, int bits, int64_t M, int64_t Kp, int64_t group, Arr<const int8_t, nb::ndim<2>> q,
                 Arr<const float, nb::ndim<2>> sx, Arr<const int32_t, nb::ndim<2>> sumx, Arr<float, nb::ndim<2>> y,
                 int iters) {
  require(!copies.empty(), "no weights");
  const int64_t Mb = (M + kRowBlock - 1) / kRowBlock, G = (Kp + group - 1) / group, N = q.shape(0);
  std::vector<IntJob> jobs(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    auto& [codes, scale, offset] = copies[i];
    require(codes.shape(0) == (size_t)(Mb * Kp * kRowBlock * bits / 8), "packed codes have the wrong size");
    require(scale.shape(0) == (size_t)(Mb * G * kRowBlock), "scales have the wrong size");
    IntJob& j = jobs[i];
    j.w = IntWeights{codes.data(), scale.data(), offset ? offset->data() : nullptr, zc, bits, M, Kp, group, Mb, G};
    j.a = ActQ{q.data(), sx.data(), sumx.data(), N, Kp, group, G};
    j.y = y.data();
    j.ldy = M;
    j.tok_chunk = N > 64 ? 64 : N;
    j.n_tok_chunks = (N + j.tok_chunk - 1) / j.tok_chunk;
    j.k = &active_kernels();
  }
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) {
    IntJob& j = jobs[it % jobs.size()];
    pool_run(Mb * j.n_tok_chunks, int_task, &j);
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
  const int64_t M = jobs[0].w.M;
  const int64_t ntasks = ((M + kFloatRows - 1) / kFloatRows + kFloatBlocksPerTask - 1) / kFloatBlocksPerTask;
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) pool_run(ntasks, float_task, &jobs[it % jobs.size()]);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

NB_MODULE(_native, m) {
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
  m.def("bench_int", &bench_int);
  m.def("bench_float", &bench_float);
  m.def("read_bandwidth", &bandwidth, nb::arg("buf"), nb::arg("passes"));
  m.def("pool_overhead", [](int iters) { return pool_overhead(iters); }, nb::arg("iters"));
}
