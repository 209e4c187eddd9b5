// ns per call of the decoder's row ops (OpsTable: quantize_row, kv_quantize_row, rmsnorm, act_mul's squared
// ReLU and SiLU, rope) of every ISA table, one row in L1, 1 thread (best of 300 runs of 200 calls), linked from
// the package build's objects:
//   B=build/cp311-cp311-linux_x86_64   # the pip build folder (scikit-build-core's build-dir)
//   OBJS=$(ls $B/CMakeFiles/_native.dir/src/lowbit/kernels/*.o | grep -v 'binding\|weight_args')
//   g++ -O2 -std=c++17 -Isrc/lowbit/kernels scripts/row_ops_probe.cpp $OBJS -pthread -o /tmp/rowops
//   taskset -c 1 /tmp/rowops [op]        # op: quantize_row, kv_quantize_row, rmsnorm, relu2, silu, rope
//   /tmp/rowops check > new.txt          # a hash of every op's output per table and length (1-70, 1536, 1541,
//                                        # 4096, 6912; NaN, inf, -0 in some rows): diff against another build's
// Zen 4 (2-vCPU EPYC VM), quantize_row avx2 / avx512 before -> after ops.inc's 16-a-step loops (ns): K = 4096,
// group K 767 / 590-602 -> 236-240, group 128 1080-1088 / 820-828 -> 455-465; K = 1536, group K 292 / 221-234 ->
// 95, group 128 405 / 307 -> 171-173. The avxvnni_evex twin stays on the AVX2 loops (= avx2).
// The other ops, avx512 before (its AVX2 loops) -> after (16 a step, LOWBIT_OPS_512), ns, 3 alternating runs:
//   kv_quantize_row 64 21.1 -> 10.7-10.9, 128 33.0 -> 16.5-17.3, 1536 274-277 -> 129-137, 4096 717-718 -> 324-329,
//     6912 1217-1218 -> 550-566;
//   rmsnorm level (dot's one FMA chain): 1536 184-185, 4096 634-639 -> 626-627, 6912 1179-1184 -> 1170-1171;
//   relu2 level: 1536 60 or 108 by where the rows lie (the AVX2 loop) -> 72, 4096 177-190 (288 by layout) ->
//     186-193, 6912 479-487 -> 473-478;
//   silu 1536 524 -> 392-502, 4096 1443-1510 -> 1041-1046, 6912 2366-2531 -> 1764-2017;
//   rope 16x96 137 -> 111-125, 9x64 57 -> 45-50.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common.h"

using namespace lowbit;

namespace {

struct Table {
  const char* name;
  const KernelTable* t;
};

// A float buffer of n (+ slack) whose first value is 64-byte aligned, as the decoder's rows.
struct Row {
  std::vector<float> buf;
  float* p;
  explicit Row(int64_t n) : buf(n + 16) { p = buf.data() + (-(uintptr_t)buf.data() / 4 & 15); }
};

double best_ns(const std::function<void()>& f) {
  double best = 1e30;
  for (int rep = 0; rep < 300; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) {
      f();
      asm volatile("" ::: "memory");
    }
    const std::chrono::duration<double, std::nano> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / 200);
  }
  return best;
}

uint64_t fnv(const void* p, size_t n, uint64_t h) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// Every op's output on random rows of length n (specials: NaN, +-inf, -0 written in), hashed.
void check(const Table& t, int64_t n, bool specials, std::mt19937& gen) {
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> x(2 * n), w(2 * n), u(2 * n);
  for (int64_t i = 0; i < 2 * n; ++i) x[i] = nd(gen), w[i] = nd(gen) / 3, u[i] = nd(gen) / 3;
  if (specials) {
    const float sp[] = {NAN, INFINITY, -INFINITY, -0.f, 0.f, 100.f, -100.f};
    for (float s : sp) x[gen() % (2 * n)] = s;
    x[n - 1] = -0.f;
    u[gen() % n] = -0.f;
  }
  const OpsTable& o = t.t->ops;
  uint64_t h = 1469598103934665603ull;
  std::vector<float> y(2 * n);
  o.rmsnorm(x.data(), w.data(), n, 1e-5f, y.data());
  h = fnv(y.data(), 4 * n, h);
  std::printf("%-13s n=%5lld %d rmsnorm %016llx\n", t.name, (long long)n, specials, (unsigned long long)h);
  for (int act : {0, 1}) {
    y = x;
    o.act_mul(y.data(), u.data(), n, act);
    h = fnv(y.data(), 4 * n, h);
    std::printf("%-13s n=%5lld %d act%d    %016llx\n", t.name, (long long)n, specials, act, (unsigned long long)h);
  }
  std::vector<int8_t> q(n + 4);
  o.kv_quantize_row(x.data(), n, q.data());
  h = fnv(q.data(), n + 4, h);
  std::printf("%-13s n=%5lld %d kv      %016llx\n", t.name, (long long)n, specials, (unsigned long long)h);
  y = x;  // rope: 2 heads of 2n
  o.rope(y.data(), 1, 2 * n, w.data(), u.data(), 0.125f);
  o.rope(y.data(), 1, 2 * n, w.data(), u.data(), 1.f);
  h = fnv(y.data(), 8 * n, h);
  std::printf("%-13s n=%5lld %d rope    %016llx\n", t.name, (long long)n, specials, (unsigned long long)h);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string op = argc > 1 ? argv[1] : "";
  const Table tables[] = {{"scalar", &kernels_scalar()},
                          {"avx2", &kernels_avx2()},
                          {"avxvnni_evex", &kernels_avxvnni_evex()},
                          {"avx512", &kernels_avx512()}};
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.f, 3.f);
  if (op == "check") {
    std::vector<int64_t> ns;
    for (int64_t n = 1; n <= 70; ++n) ns.push_back(n);
    for (int64_t n : {1536, 1541, 4096, 6912}) ns.push_back(n);
    for (const Table& t : tables)
      for (int64_t n : ns)
        for (bool sp : {false, true}) check(t, n, sp, gen);
    return 0;
  }
  auto want = [&](const char* name) { return op.empty() || op == name; };
  if (want("quantize_row"))
    for (int64_t K : {1536, 4096}) {
      Row x(K);
      for (int64_t k = 0; k < K; ++k) x.p[k] = nd(gen);
      for (int64_t group : {K, (int64_t)128}) {
        const int64_t G = (K + group - 1) / group;
        std::vector<int8_t> q(K);
        std::vector<float> s(G);
        std::vector<int32_t> sum(G);
        for (const Table& t : tables)
          std::printf("quantize_row K=%5lld group=%5lld %-13s %8.1f ns\n", (long long)K, (long long)group, t.name,
                      best_ns([&] { t.t->ops.quantize_row(x.p, K, K, group, q.data(), s.data(), sum.data()); }));
      }
    }
  if (want("kv_quantize_row"))
    for (int64_t n : {64, 128, 1536, 4096, 6912}) {
      Row x(n);
      for (int64_t k = 0; k < n; ++k) x.p[k] = nd(gen);
      std::vector<int8_t> q(n + 4);
      for (const Table& t : tables)
        std::printf("kv_quantize_row n=%5lld %-13s %8.1f ns\n", (long long)n, t.name,
                    best_ns([&] { t.t->ops.kv_quantize_row(x.p, n, q.data()); }));
    }
  for (int64_t n : {1536, 4096, 6912}) {
    Row x(n), w(n), y(n), g(n), u(n);
    for (int64_t k = 0; k < n; ++k) x.p[k] = nd(gen), w.p[k] = 1.f + nd(gen) / 30;
    for (const Table& t : tables) {
      if (want("rmsnorm"))
        std::printf("rmsnorm n=%5lld %-13s %8.1f ns\n", (long long)n, t.name,
                    best_ns([&] { t.t->ops.rmsnorm(x.p, w.p, n, 1e-5f, y.p); }));
      // g = act(g) * u in place: u = g / act(g) keeps g (to rounding) from call to call, so no call meets
      // zeros, infinities or subnormals the first did not
      if (want("relu2")) {
        for (int64_t k = 0; k < n; ++k) g.p[k] = x.p[k], u.p[k] = x.p[k] > 0 ? 1.f / x.p[k] : 1.f;
        std::printf("relu2 n=%5lld %-13s %8.1f ns\n", (long long)n, t.name,
                    best_ns([&] { t.t->ops.act_mul(g.p, u.p, n, 1); }));
      }
      if (want("silu")) {
        for (int64_t k = 0; k < n; ++k) g.p[k] = x.p[k], u.p[k] = (float)(1 + std::exp(-(double)x.p[k]));
        std::printf("silu n=%5lld %-13s %8.1f ns\n", (long long)n, t.name,
                    best_ns([&] { t.t->ops.act_mul(g.p, u.p, n, 0); }));
      }
    }
  }
  if (want("rope"))
    for (auto [heads, hd] : {std::pair<int64_t, int64_t>{16, 96}, {9, 64}}) {
      Row x(heads * hd), C(hd), S(hd);
      for (int64_t k = 0; k < heads * hd; ++k) x.p[k] = nd(gen);
      for (int64_t d = 0; d < hd / 2; ++d) {
        const float th = 0.37f * (float)d;
        C.p[d] = C.p[d + hd / 2] = std::cos(th);
        S.p[d] = -std::sin(th), S.p[d + hd / 2] = std::sin(th);
      }
      for (const Table& t : tables)
        std::printf("rope %2lldx%-3lld %-13s %8.1f ns\n", (long long)heads, (long long)hd, t.name,
                    best_ns([&] { t.t->ops.rope(x.p, heads, hd, C.p, S.p, 1.f); }));
    }
}
