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
#include "decoder.h"
#include "dispatch.h"
#include "linear.h"
#include "py_args.h"
#include "roof.h"
#include "thread_pool.h"
#include "tq1.h"
#include "codebook.h"

namespace nb = nanobind;
using namespace lowbit;
using namespace lowbit::py;

namespace {

using KernelsRunning = std::shared_lock<std::shared_mutex>;

// int32 accumulators sum group products of (code <= max_code) x (|q| <= 127): must stay below 2^31.
void check_accumulator_bound(const char* fn, int64_t group, int64_t max_code) {
  const int64_t limit = ((int64_t(1) << 31) - 1) / (max_code * 127);
  if (group > limit)
    fail(std::string(fn) + ": group " + std::to_string(group) + " overflows the int32 accumulators (group * " +
         std::to_string(max_code) + " * 127 must stay below 2^31): use groups of at most " + std::to_string(limit));
}

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

// A float weight [M, K]: float32, or bf16 bits as uint16. Returns (weights, is_bf16).
std::pair<FloatWeights, bool> checked_float_weights(const char* fn, nb::handle h) {
  auto w = any_in<2>(h, "float weights");
  const bool bf16 = w.dtype() == nb::dtype<uint16_t>();
  if (!bf16 && w.dtype() != nb::dtype<float>())
    fail(std::string(fn) + ": float weights must be float32 or bf16 stored as uint16, got " + describe(h));
  if (w.shape(0) == 0 || w.shape(1) == 0) fail(std::string(fn) + ": float weights must not be empty");
  return {FloatWeights{w.data(), (int64_t)w.shape(0), (int64_t)w.shape(1)}, bf16};
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

// One codebook weight (codebook.h): codes u8 [Mt*Kp/v*m*8], scale f16-as-u16 [G*Mt*8], codebooks cbT f32
// [m][v][nc] and cb f32 [m][nc][v] (cbT transposed), checked against M, Kp and group.
CodebookWeights checked_codebook_weights(const char* fn, nb::handle hcodes, nb::handle hscale, nb::handle hcbT,
                                         nb::handle hcb, int64_t M, int64_t Kp, int64_t group) {
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
  const int64_t Mt = (M + tile - 1) / tile, G = (Kp + group - 1) / group;
  CodebookWeights w{codes.data(), scale.data(), cbT.data(), cb.data(), M, Kp, group, m, v, nc, Mt, G};
  if (codes.shape(0) != (size_t)w.codes_bytes()) fail(f + ": packed codes have the wrong size for M, Kp, m, v, b");
  if (scale.shape(0) != (size_t)(G * Mt * tile)) fail(f + ": scales have the wrong size for M, Kp, group");
  return w;
}

// codebook (codebook.h): weights is a list of (codes u8 [Mt*Kp/v*m*8], scale f16-as-u16 [G*Mt*8]) copies of
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
    const auto t = items(c, 2, "gemm_codebook: each weight (codes, scale)");
    ws.push_back(checked_codebook_weights("gemm_codebook", t[0], t[1], hcbT, hcb, M, Kp, group));
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

void attention_prefill(nb::handle hq, nb::handle hkc, nb::handle hvc, int64_t pos, nb::handle hout) {
  auto q = in<float, 3>(hq, "attention_prefill: q");
  auto kc = any_in<3>(hkc, "attention_prefill: k cache");
  auto vc = any_in<3>(hvc, "attention_prefill: v cache");
  const int64_t n = q.shape(0), heads = q.shape(1), hd = q.shape(2);
  const int64_t kv = kc.shape(0), max_ctx = kc.shape(1);
  const bool f16 = kc.dtype() == nb::dtype<uint16_t>();
  require(f16 || kc.dtype() == nb::dtype<float>(), "attention_prefill: the KV cache must be float32 or float16 (as uint16)");
  require(vc.dtype() == kc.dtype() && vc.shape(0) == kc.shape(0) && vc.shape(1) == kc.shape(1) && vc.shape(2) == kc.shape(2),
          "attention_prefill: k and v caches must match in shape and dtype");
  require(heads > 0 && hd > 0, "attention_prefill: q must be [n, heads > 0, hd > 0]");
  require(kc.shape(2) == (size_t)hd && kv > 0 && heads % kv == 0,
          "attention_prefill: cache must be [kv_heads, max_ctx, hd] with heads % kv_heads == 0");
  require(hd <= 512, "attention_prefill: head_dim above 512 is not supported");
  require(pos >= 0 && pos + n <= max_ctx, "attention_prefill: positions pos..pos+n-1 must lie inside the cache");
  auto o = out<float, 2>(hout, "attention_prefill: out");
  require(is_shape(o, n, heads * hd), "attention_prefill: out must be [n, heads*hd]");
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  PrefillAttn c{q.data(), kc.data(), vc.data(), o.data(), n, heads, hd, heads / kv, max_ctx, pos, f16, &active_kernels().ops};
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

// ---- the native decoder ----

// The decoder with the Python arrays it points into: it holds a reference to each (the arrays are the
// caller's own, never converted copies), so they live as long as it does. One decode at a time.
struct PyDecoder {
  Decoder d;
  std::vector<nb::object> keep;
  std::mutex mu;
  PyDecoder(const DecoderShape& s, const float* c, const float* sn) : d(s, c, sn) {}
};

// A projection for the native decoder, from a tuple built by lowbit.model.native:
//   ("int", codes, scale, offset|None, zc, bits, M, K, Kp, group, bias|None)
//   ("f32" | "bf16", weight [M, K], bias|None)
//   ("tq1", codes, scale, M, K, Kp, group, bias|None)
//   ("codebook", codes, scale, cbT, cb, M, K, Kp, group, bias|None)
LinearRef linear_from_tuple(nb::handle h, const char* what, std::vector<nb::object>& keep) {
  const std::string w = what;
  if (!(nb::isinstance<nb::tuple>(h) || nb::isinstance<nb::list>(h)) || nb::len(h) == 0)
    fail(w + " must be a projection tuple (kind, ...), got " + describe(h));
  std::string kind;
  if (!nb::try_cast<std::string>(h[0], kind)) fail(w + ": the first item must be the kind: 'int', 'tq1', 'codebook', 'f32' or 'bf16'");
  const char* fn = what;
  LinearRef L;
  size_t bias_at = 0;
  if (kind == "int") {
    const auto t = items(h, 11, (w + " ('int', codes, scale, offset, zc, bits, M, K, Kp, group, bias)").c_str());
    L.kind = 0;
    L.M = scalar<int64_t>(t[6], "M");
    L.K = scalar<int64_t>(t[7], "K");
    L.iw = checked_int_weights(fn, t[1], t[2], t[3], scalar<float>(t[4], "zc"), scalar<int>(t[5], "bits"), L.M,
                               scalar<int64_t>(t[8], "Kp"), scalar<int64_t>(t[9], "group"));
    if (L.K <= 0 || L.K > L.iw.Kp) fail(w + ": K must be in [1, Kp]");
    bias_at = 10;
  } else if (kind == "tq1") {
    const auto t = items(h, 8, (w + " ('tq1', codes, scale, M, K, Kp, group, bias)").c_str());
    L.kind = 3;
    L.M = scalar<int64_t>(t[3], "M");
    L.K = scalar<int64_t>(t[4], "K");
    L.tq = checked_tq1_weights(fn, t[1], t[2], L.M, scalar<int64_t>(t[5], "Kp"), scalar<int64_t>(t[6], "group"));
    if (L.K <= 0 || L.K > L.tq.Kp) fail(w + ": K must be in [1, Kp]");
    bias_at = 7;
  } else if (kind == "codebook") {
    const auto t = items(h, 10, (w + " ('codebook', codes, scale, cbT, cb, M, K, Kp, group, bias)").c_str());
    L.kind = 4;
    L.M = scalar<int64_t>(t[5], "M");
    L.K = scalar<int64_t>(t[6], "K");
    L.cb = checked_codebook_weights(fn, t[1], t[2], t[3], t[4], L.M, scalar<int64_t>(t[7], "Kp"), scalar<int64_t>(t[8], "group"));
    if (L.K <= 0 || L.K > L.cb.Kp || L.cb.Kp - L.K >= L.cb.v) fail(w + ": K must be in (Kp - v, Kp]");
    bias_at = 9;
  } else if (kind == "f32" || kind == "bf16") {
    const auto t = items(h, 3, (w + " ('f32' | 'bf16', weight, bias)").c_str());
    const auto [fw, bf16] = checked_float_weights(fn, t[1]);
    if (bf16 != (kind == "bf16")) fail(w + ": a '" + kind + "' weight must be " + (bf16 ? "float32" : "uint16 (bf16 bits)"));
    L.kind = bf16 ? 2 : 1;
    L.fw = fw;
    L.M = fw.M;
    L.K = fw.K;
    bias_at = 2;
  } else {
    fail(w + ": unknown projection kind '" + kind + "' (use 'int', 'tq1', 'codebook', 'f32' or 'bf16')");
  }
  nb::handle b = h[bias_at];
  if (!b.is_none()) {
    auto bias = in<float, 1>(b, (w + " bias").c_str());
    if (bias.shape(0) != (size_t)L.M) fail(w + ": bias has " + std::to_string(bias.shape(0)) + " values, expected M = " + std::to_string(L.M));
    L.bias = bias.data();
  }
  keep.push_back(nb::borrow(h));  // the tuple holds every array of the projection
  return L;
}

In<float, 1> norm_weight(nb::handle h, const char* what, int64_t n) {
  auto a = in<float, 1>(h, what);
  if (a.shape(0) != (size_t)n)
    fail(std::string(what) + " has " + std::to_string(a.shape(0)) + " values, expected " + std::to_string(n));
  return a;
}

}  // namespace

void bind_decoder(nb::module_& m) {
  nb::class_<PyDecoder>(m, "Decoder")
      .def("__init__",
           [](PyDecoder* self, int64_t hidden, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t inter, int64_t max_ctx,
              float eps, int act, nb::handle hc, nb::handle hs, bool kv_f16) {
             constexpr int64_t kDim = int64_t(1) << 20;
             require(hidden > 0 && hidden <= kDim && inter > 0 && inter <= kDim, "Decoder: hidden and intermediate sizes must be in [1, 2^20]");
             require(n_heads > 0 && n_heads <= 4096 && n_kv > 0, "Decoder: head counts must be positive (at most 4096 heads)");
             require(n_heads % n_kv == 0, "Decoder: heads must be a multiple of kv heads");
             require(hd > 0 && hd <= 512 && hd % 2 == 0, "Decoder: head_dim must be even and in [2, 512]");
             require(max_ctx > 0 && max_ctx <= (int64_t(1) << 24), "Decoder: max_ctx must be in [1, 2^24]");
             require(act == 0 || act == 1 || act == 2, "Decoder: act must be 0 (SiLU), 1 (squared ReLU) or 2 (GELU)");
             require(eps >= 0.f && eps < 1.f, "Decoder: rms_norm_eps must be in [0, 1)");
             auto c = in<float, 2>(hc, "Decoder: rope C");
             auto s = in<float, 2>(hs, "Decoder: rope S");
             require(c.shape(0) >= (size_t)max_ctx && c.shape(1) == (size_t)hd, "Decoder: rope C must be [>= max_ctx, hd]");
             require(s.shape(0) >= (size_t)max_ctx && s.shape(1) == (size_t)hd, "Decoder: rope S must be [>= max_ctx, hd]");
             new (self) PyDecoder(DecoderShape{hidden, n_heads, n_kv, hd, inter, max_ctx, eps, act, kv_f16}, c.data(), s.data());
             self->keep = {nb::borrow(hc), nb::borrow(hs)};
           })
      .def("add_layer",
           [](PyDecoder& self, nb::handle lins, nb::handle ln1, nb::handle ln2, nb::handle attn_sub, nb::handle ffn_sub,
              nb::handle hkc, nb::handle hvc) {
             const DecoderShape& s = self.d.shape();
             require(self.d.n_slots() == 1, "add_layer: add every layer before set_slots");
             const auto t = items(lins, 7, "add_layer: linears (q, k, v, o, gate, up, down)");
             std::vector<nb::object> keep;
             DecoderLayer L;
             LinearRef* refs[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
             const char* names[7] = {"add_layer: q_proj", "add_layer: k_proj", "add_layer: v_proj", "add_layer: o_proj",
                                     "add_layer: gate_proj", "add_layer: up_proj", "add_layer: down_proj"};
             for (size_t i = 0; i < 7; ++i) *refs[i] = linear_from_tuple(t[i], names[i], keep);
             const int64_t qd = s.n_heads * s.hd, kvd = s.n_kv * s.hd;
             require(L.q.M == qd && L.q.K == s.hidden, "add_layer: q_proj must be [heads*hd, hidden]");
             require(L.k.M == kvd && L.k.K == s.hidden && L.v.M == kvd && L.v.K == s.hidden, "add_layer: k/v_proj must be [kv_heads*hd, hidden]");
             require(L.o.M == s.hidden && L.o.K == qd, "add_layer: o_proj must be [hidden, heads*hd]");
             require(L.gate.M == s.inter && L.gate.K == s.hidden && L.up.M == s.inter && L.up.K == s.hidden,
                     "add_layer: gate/up_proj must be [intermediate, hidden]");
             require(L.down.M == s.hidden && L.down.K == s.inter, "add_layer: down_proj must be [hidden, intermediate]");
             L.ln1 = norm_weight(ln1, "add_layer: ln1", s.hidden).data();
             L.ln2 = norm_weight(ln2, "add_layer: ln2", s.hidden).data();
             L.attn_sub = attn_sub.is_none() ? nullptr : norm_weight(attn_sub, "add_layer: attn_sub", qd).data();
             L.ffn_sub = ffn_sub.is_none() ? nullptr : norm_weight(ffn_sub, "add_layer: ffn_sub", s.inter).data();
             // The cache is written in place (prefill in numpy writes the same arrays): exact dtype, writable.
             if (s.kv_f16) {
               auto kc = out<uint16_t, 3>(hkc, "add_layer: k cache (float16 passed as a uint16 view)");
               auto vc = out<uint16_t, 3>(hvc, "add_layer: v cache (float16 passed as a uint16 view)");
               require(kc.shape(0) == (size_t)s.n_kv && kc.shape(1) == (size_t)s.max_ctx && kc.shape(2) == (size_t)s.hd &&
                           vc.shape(0) == kc.shape(0) && vc.shape(1) == kc.shape(1) && vc.shape(2) == kc.shape(2),
                       "add_layer: k and v caches must be [kv_heads, max_ctx, hd]");
               L.kc = kc.data();
               L.vc = vc.data();
             } else {
               auto kc = out<float, 3>(hkc, "add_layer: k cache");
               auto vc = out<float, 3>(hvc, "add_layer: v cache");
               require(kc.shape(0) == (size_t)s.n_kv && kc.shape(1) == (size_t)s.max_ctx && kc.shape(2) == (size_t)s.hd &&
                           vc.shape(0) == kc.shape(0) && vc.shape(1) == kc.shape(1) && vc.shape(2) == kc.shape(2),
                       "add_layer: k and v caches must be [kv_heads, max_ctx, hd]");
               L.kc = kc.data();
               L.vc = vc.data();
             }
             for (nb::handle h : {ln1, ln2, attn_sub, ffn_sub, hkc, hvc}) keep.push_back(nb::borrow(h));
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.add_layer(L);
             for (auto& o : keep) self.keep.push_back(std::move(o));
           },
           nb::arg("linears"), nb::arg("ln1"), nb::arg("ln2"), nb::arg("attn_sub").none(), nb::arg("ffn_sub").none(),
           nb::arg("kc"), nb::arg("vc"))
      .def("set_layer_extras",
           [](PyDecoder& self, size_t index, nb::handle q_norm, nb::handle k_norm, nb::handle post_attn,
              nb::handle post_ffn, int64_t window) {
             const DecoderShape& s = self.d.shape();
             require(index < self.d.n_layers(), "set_layer_extras: no such layer");
             require(window >= 0, "set_layer_extras: window must be >= 0");
             auto opt = [](nb::handle h, const char* what, int64_t n) -> const float* {
               return h.is_none() ? nullptr : norm_weight(h, what, n).data();
             };
             const float* qn = opt(q_norm, "set_layer_extras: q_norm", s.hd);
             const float* kn = opt(k_norm, "set_layer_extras: k_norm", s.hd);
             const float* pa = opt(post_attn, "set_layer_extras: post_attn norm", s.hidden);
             const float* pf = opt(post_ffn, "set_layer_extras: post_ffn norm", s.hidden);
             std::lock_guard<std::mutex> lock(self.mu);
             DecoderLayer& L = self.d.layer(index);
             L.q_norm = qn;
             L.k_norm = kn;
             L.post_attn = pa;
             L.post_ffn = pf;
             L.window = window;
             for (nb::handle h : {q_norm, k_norm, post_attn, post_ffn}) self.keep.push_back(nb::borrow(h));
           },
           nb::arg("index"), nb::arg("q_norm").none(), nb::arg("k_norm").none(), nb::arg("post_attn").none(),
           nb::arg("post_ffn").none(), nb::arg("window"))
      .def("set_attention",
           [](PyDecoder& self, float qscale, float softcap) {
             require(qscale >= 0.f && softcap >= 0.f && std::isfinite(qscale) && std::isfinite(softcap),
                     "set_attention: qscale and softcap must be finite and >= 0");
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.set_attention(qscale, softcap);
           },
           nb::arg("qscale"), nb::arg("softcap"))
      .def("set_output",
           [](PyDecoder& self, nb::handle norm, nb::handle head) {
             std::vector<nb::object> keep;
             const float* n = norm_weight(norm, "set_output: final norm", self.d.shape().hidden).data();
             LinearRef h = linear_from_tuple(head, "set_output: lm_head", keep);
             require(h.K == self.d.shape().hidden, "set_output: lm_head must be [vocab, hidden]");
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.set_output(n, h);
             self.keep.push_back(nb::borrow(norm));
             for (auto& o : keep) self.keep.push_back(std::move(o));
           },
           nb::arg("norm"), nb::arg("head"))
      .def("decode",
           [](PyDecoder& self, nb::handle hx, int64_t pos, nb::handle hlogits) {
             require(self.d.has_output(), "decode: the output layer is not set (call set_output first)");
             auto x = out<float, 1>(hx, "decode: x");
             auto logits = out<float, 1>(hlogits, "decode: logits");
             require(x.shape(0) == (size_t)self.d.shape().hidden, "decode: x must be [hidden]");
             if (logits.shape(0) != (size_t)self.d.vocab())
               fail("decode: logits must be [vocab] = [" + std::to_string(self.d.vocab()) + "], got " + std::to_string(logits.shape(0)));
             require(pos >= 0 && pos < self.d.shape().max_ctx, "decode: position outside the cache");
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             KernelsRunning running(settings_mutex());
             self.d.decode(x.data(), pos, logits.data());
           },
           nb::arg("x"), nb::arg("pos"), nb::arg("logits"))
      // The multi-slot cache of batched decoding: k, v are the whole [layers, slots, kv_heads, max_ctx, hd]
      // arrays whose slot 0 each layer's kc/vc is; every slot of every layer must lie inside them.
      .def("set_slots",
           [](PyDecoder& self, int64_t n_slots, int64_t slot_stride, nb::handle hk, nb::handle hv) {
             const DecoderShape& s = self.d.shape();
             const int64_t slot_size = s.n_kv * s.max_ctx * s.hd;
             require(n_slots >= 1, "set_slots: n_slots must be >= 1");
             require(n_slots == 1 || slot_stride >= slot_size, "set_slots: slots overlap: slot_stride too small");
             auto k = any_out<5>(hk, "set_slots: k (the whole slot cache)");
             auto v = any_out<5>(hv, "set_slots: v (the whole slot cache)");
             const auto want = s.kv_f16 ? nb::dtype<uint16_t>() : nb::dtype<float>();
             require(k.dtype() == want && v.dtype() == want, "set_slots: the slot cache must have the decoder's KV dtype");
             const int64_t esz = s.kv_f16 ? 2 : 4, need = ((n_slots - 1) * slot_stride + slot_size) * esz;
             for (const DecoderLayer& L : self.d.layers())
               for (auto [p, a] : {std::pair{(const char*)L.kc, &k}, std::pair{(const char*)L.vc, &v}}) {
                 const char* lo = (const char*)a->data();
                 const char* hi = lo + (int64_t)a->size() * esz;
                 require(p >= lo && p + need <= hi, "set_slots: a layer's slots reach outside the slot cache");
               }
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.set_slots(n_slots, slot_stride);
             self.keep.push_back(nb::borrow(hk));
             self.keep.push_back(nb::borrow(hv));
           },
           nb::arg("n_slots"), nb::arg("slot_stride"), nb::arg("k"), nb::arg("v"))
      .def("decode_batch",
           [](PyDecoder& self, nb::handle hx, nb::handle hpos, nb::handle hslot, nb::handle hlogits) {
             Decoder& d = self.d;
             require(d.has_output(), "decode_batch: the output layer is not set (call set_output first)");
             auto x = out<float, 2>(hx, "decode_batch: x");
             auto pos = in<int64_t, 1>(hpos, "decode_batch: pos");
             auto slot = in<int64_t, 1>(hslot, "decode_batch: slot");
             auto logits = out<float, 2>(hlogits, "decode_batch: logits");
             const int64_t B = (int64_t)x.shape(0);
             require(B >= 1 && x.shape(1) == (size_t)d.shape().hidden, "decode_batch: x must be [B, hidden] with B >= 1");
             require(pos.shape(0) == (size_t)B && slot.shape(0) == (size_t)B, "decode_batch: pos and slot must be [B]");
             require(is_shape(logits, B, d.vocab()), "decode_batch: logits must be [B, vocab]");
             for (int64_t b = 0; b < B; ++b) {
               require(pos.data()[b] >= 0 && pos.data()[b] < d.shape().max_ctx, "decode_batch: position outside the cache");
               require(slot.data()[b] >= 0 && slot.data()[b] < d.n_slots(), "decode_batch: slot outside the cache");
               for (int64_t c = 0; c < b; ++c) require(slot.data()[c] != slot.data()[b], "decode_batch: two rows write the same slot");
             }
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             KernelsRunning running(settings_mutex());
             d.decode_batch(x.data(), B, pos.data(), slot.data(), logits.data());
           },
           nb::arg("x"), nb::arg("pos"), nb::arg("slot"), nb::arg("logits"))
      .def_prop_ro("n_layers", [](PyDecoder& self) { return self.d.n_layers(); });
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
  m.def("set_isa", &set_isa, nb::arg("name"));
  m.def("isa", [] { return selected_isa(); });
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
  m.def("attention_prefill", &attention_prefill, nb::arg("q"), nb::arg("kc"), nb::arg("vc"), nb::arg("pos"), nb::arg("out"));
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
