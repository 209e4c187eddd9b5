// What a decode GEMV call costs beyond its bytes: the real kernels and thread pool (run_linears / run_gated as the
// native decoder calls them; threads from argv[1], default 2), linked from the package build's objects, on
// bitnet-0.7b's matrices. Part 3 ends with a plain read of the same bytes (read_bandwidth) in the same process.
//   B=build/cp311-cp311-linux_x86_64   # the pip build folder (scikit-build-core's build-dir)
//   OBJS=$(ls $B/CMakeFiles/_native.dir/src/lowbit/kernels/*.o | grep -v 'binding\|weight_args')
//   g++ -O2 -std=c++17 -Isrc/lowbit/kernels scripts/decode_calls_probe.cpp $OBJS -pthread -o /tmp/calls
//   taskset -c 0 /tmp/calls 1     # or /tmp/calls 2
// For a variant of the kernel, compile kernels_avx512.cpp alone with its flags from the build's build.ninja plus
// e.g. -DLOWBIT_PF_BYTES=8192 and link it instead of the build's object (stop 36: the prefetch distance).
// Parts (medians of alternating rounds in one process; the host's bandwidth moves by the minute):
//   1. per-call costs with no DRAM: a 0.25 MB matrix in L2 called over and over, an empty pool run, one row's
//      activation quantization;
//   2. 4 long ternary GEMVs (170 MB each, K = 4096) cut into calls of 0.25 ... 34 MB, with and without the
//      decoder's next-call hint (NextPrefetch): GB/s against one long call;
//   3. bitnet-0.7b's per-layer sequence (q/k/v in one run, o, gate/up gated, down; 24 layers, 4 model copies past
//      the L3) against the same bytes as 4 long GEMVs, and the time of each call type.
// Stop 28 (Xeon EMR, 2 threads; `lowbit bench bandwidth` read 26.7 GB/s at 2 threads beside it):
//   1. 0.25 MB in L2 7.9 us a call (33 GB/s); empty pool run 0.68 us; quantizing a 4096 row 1.30 us.
//   2. calls of 0.25 / 0.5 / 1 / 2 MB: 14.0-14.2 / 16.8-18.2 / 19.8-21.1 / 20.3-21.8 GB/s without the hint, 0.59-0.66 /
//      0.73-0.85 / 0.87-0.92 / 0.88-1.0 of one long call (21.5-23.5 GB/s): ~7 us a call more than its bytes;
//      with the hint 17.0 / 20.3 / 21.5 / 22.1 GB/s.
//   3. the layer sequence 20.6-22.6 GB/s against 23.2-25.7 for the long GEMVs (0.87-0.91); means over all rounds,
//      qkv 85-92 us a call (19.3-20.8 GB/s), o 29-32 (18.4-20.4), gate+up 146-161 (19.5-21.5), down 73-79
//      (19.9-21.7): every call type alike, not the short ones only.
#include <x86intrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bandwidth.h"
#include "dispatch.h"
#include "linear.h"
#include "thread_pool.h"

using namespace lowbit;

namespace {

uint8_t* g_arena;
size_t g_used = 0;

struct Mat {
  std::vector<uint16_t> sc;
  LinearRef L;
};

// A ternary matrix (2-bit codes, one group a row) of M x K at the arena's next page.
Mat make(int64_t M, int64_t K) {
  Mat m;
  const int64_t Mb = (M + 63) / 64, bytes = Mb * (K / 16) * 256;
  m.sc.assign(Mb * 64, 0x2000);
  m.L.kind = 0;
  m.L.M = M;
  m.L.K = K;
  m.L.iw = IntWeights{g_arena + g_used, nullptr, nullptr, 1.f, 2, M, K, K, Mb, 1};
  g_used += (bytes + 4095) / 4096 * 4096;
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double g_tsc_mhz = 2.1e3;  // measured at start

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 2;
  {
    const uint64_t k0 = __rdtsc();
    const auto t0 = std::chrono::steady_clock::now();
    while (seconds_since(t0) < 0.2) {}
    g_tsc_mhz = (__rdtsc() - k0) / seconds_since(t0) / 1e6;
  }
  const size_t cap = size_t(3) << 30;
  g_arena = (uint8_t*)mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (g_arena == MAP_FAILED) return 1;
  madvise(g_arena, cap, MADV_HUGEPAGE);
  pool_set_threads(threads);
  const int64_t H = 1536, F = 4096, K = 4096;
  const int NL = 24, COPIES = 4;  // 4 copies of the decoder blocks: 680 MB, past the L3
  std::vector<std::vector<Mat>> model(COPIES);
  for (auto& mc : model)
    for (int l = 0; l < NL; ++l)
      for (auto [M, KK] : {std::pair{H, H}, {H, H}, {H, H}, {H, H}, {F, H}, {F, H}, {H, F}}) mc.push_back(make(M, KK));
  const size_t per_copy = g_used / COPIES;
  std::vector<Mat> longm;  // the same bytes as one copy, as one matrix
  for (int c = 0; c < COPIES; ++c) {
    const int64_t rows = per_copy / (K / 4) / 64 * 64;
    Mat m;
    m.sc.assign(rows, 0x2000);
    m.L.kind = 0;
    m.L.M = rows;
    m.L.K = K;
    m.L.iw = IntWeights{g_arena + per_copy * c, nullptr, nullptr, 1.f, 2, rows, K, K, rows / 64, 1};
    longm.push_back(std::move(m));
  }
  for (auto& mc : model)
    for (auto& m : mc) m.L.iw.scale = m.sc.data();
  for (auto& m : longm) m.L.iw.scale = m.sc.data();
  for (size_t i = 0; i < g_used; ++i) g_arena[i] = (uint8_t)((i * 2654435761u) >> 13) & 0x55;
  std::vector<float> x(F, 0.5f), y(1 << 20), g(F), u(F);
  ActScratch s;
  auto run1 = [&](const LinearRef& L, const NextPrefetch* nx = nullptr) {
    const LinearRef* LL[1] = {&L};
    float* yy[1] = {y.data()};
    run_linears(LL, yy, 1, x.data(), 1, s, nx);
  };

  {  // 1
    const int64_t rows = 256;
    LinearRef L = longm[0].L;
    L.M = L.iw.M = rows;
    L.iw.Mb = rows / 64;
    for (int w = 0; w < 1000; ++w) run1(L);
    auto best_of = [](auto&& f) {
      uint64_t best = ~0ull;
      for (int r = 0; r < 20; ++r) {
        const uint64_t t0 = __rdtsc();
        for (int w = 0; w < 1000; ++w) f();
        best = std::min<uint64_t>(best, __rdtsc() - t0);
      }
      return best / 1000.0 / g_tsc_mhz;
    };
    const double l2 = best_of([&] { run1(L); });
    printf("1. 0.25 MB in L2: %.2f us a call (%.1f GB/s)\n", l2, rows * K / 4 / l2 / 1e3);
    struct Empty {
      static void f(void*, int64_t) {}
    };
    printf("   empty pool run (4 tasks): %.2f us\n", best_of([] { pool_run(4, Empty::f, nullptr); }));
    std::vector<int8_t> q(K);
    float sc;
    int32_t sm;
    printf("   quantizing a %ld row: %.2f us\n", (long)K,
           best_of([&] { active_kernels().ops.quantize_row(x.data(), K, K, K, q.data(), &sc, &sm); }));
  }

  {  // 2
    const std::vector<double> mb = {0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 34.0};
    std::vector<std::vector<double>> plain(mb.size()), hinted(mb.size());
    for (int r = 0; r < 16; ++r)
      for (size_t ii = 0; ii < mb.size(); ++ii) {
        const size_t si = r % 2 ? mb.size() - 1 - ii : ii;
        const bool hint = (r / 2) % 2;
        const int64_t rows = std::max<int64_t>(64, (int64_t)(mb[si] * 1e6 / (K / 4)) / 64 * 64);
        const auto t0 = std::chrono::steady_clock::now();
        size_t bytes = 0;
        for (const Mat& m : longm)
          for (int64_t r0 = 0; r0 + rows <= m.L.M; r0 += rows) {
            LinearRef L = m.L;
            L.M = L.iw.M = rows;
            L.iw.Mb = rows / 64;
            L.iw.codes = m.L.iw.codes + r0 / 64 * (K / 16) * 256;
            LinearRef N = L;
            N.iw.codes = L.iw.codes + rows / 64 * (K / 16) * 256;
            const NextPrefetch nx = hint ? next_prefetch(&N) : NextPrefetch{};
            run1(L, &nx);
            bytes += rows * K / 4;
          }
        (hint ? hinted : plain)[si].push_back(bytes / seconds_since(t0) / 1e9);
      }
    const double big = median(plain.back());
    for (size_t si = 0; si < mb.size(); ++si) {
      const double gb = median(plain[si]);
      printf("2. calls of %5.2f MB: %4.1f GB/s, %.3f of one long call (%+5.1f us a call); with the next call's hint %4.1f GB/s\n",
             mb[si], gb, gb / big, mb[si] * 1e3 / gb - mb[si] * 1e3 / big, median(hinted[si]));
    }
  }

  {  // 3
    double tcall[4] = {0, 0, 0, 0};
    int64_t layers = 0;
    auto layer_seq = [&](std::vector<Mat>& mm) {
      for (int l = 0; l < NL; ++l) {
        Mat* q = &mm[7 * l];
        const uint64_t k0 = __rdtsc();
        const LinearRef* qkv[3] = {&q[0].L, &q[1].L, &q[2].L};
        float* ys[3] = {y.data(), y.data() + H, y.data() + 2 * H};
        NextPrefetch n0 = next_prefetch(&q[3].L);
        run_linears(qkv, ys, 3, x.data(), 1, s, &n0);
        const uint64_t k1 = __rdtsc();
        NextPrefetch n1 = next_prefetch(&q[4].L);
        run1(q[3].L, &n1);
        const uint64_t k2 = __rdtsc();
        NextPrefetch n2 = next_prefetch(&q[6].L);
        run_gated(q[4].L, q[5].L, g.data(), u.data(), x.data(), 0, s, &n2);
        const uint64_t k3 = __rdtsc();
        NextPrefetch n3 = l + 1 < NL ? next_prefetch(&mm[7 * (l + 1)].L) : NextPrefetch{};
        const LinearRef* d[1] = {&q[6].L};
        float* yd[1] = {y.data()};
        run_linears(d, yd, 1, g.data(), 1, s, &n3);
        const uint64_t k4 = __rdtsc();
        tcall[0] += k1 - k0;
        tcall[1] += k2 - k1;
        tcall[2] += k3 - k2;
        tcall[3] += k4 - k3;
        ++layers;
      }
    };
    std::vector<double> seq, lng;
    for (int r = 0; r < 12; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (auto& mc : model) layer_seq(mc);
      seq.push_back(g_used / seconds_since(t0) / 1e9);
      t0 = std::chrono::steady_clock::now();
      for (const Mat& m : longm) run1(m.L);
      lng.push_back(g_used / seconds_since(t0) / 1e9);
    }
    std::vector<double> rd;
    for (int r = 0; r < 5; ++r) rd.push_back(g_used / read_bandwidth(g_arena, g_used, 1) / 1e9);
    printf("3. layer sequence %.1f GB/s, the same bytes as 4 long GEMVs %.1f GB/s, read alone %.1f GB/s\n", median(seq),
           median(lng), median(rd));
    const double bytes[4] = {3.0 * H * H / 4, 1.0 * H * H / 4, 2.0 * F * H / 4, 1.0 * H * F / 4};
    const char* name[4] = {"qkv", "o", "gate+up", "down"};
    for (int i = 0; i < 4; ++i) {
      const double us = tcall[i] / layers / g_tsc_mhz;
      printf("   %-8s %6.1f us a call, %4.1f GB/s (means over all rounds)\n", name[i], us, bytes[i] / us / 1e3);
    }
  }
  return 0;
}
