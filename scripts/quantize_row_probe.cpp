// ns per OpsTable::quantize_row call of every ISA table, one row in L1, 1 thread (best of 300 runs of 200 calls),
// linked from the package build's objects:
//   B=build/cp311-cp311-linux_x86_64   # the pip build folder (scikit-build-core's build-dir)
//   OBJS=$(ls $B/CMakeFiles/_native.dir/src/lowbit/kernels/*.o | grep -v 'binding\|weight_args')
//   g++ -O2 -std=c++17 -Isrc/lowbit/kernels scripts/quantize_row_probe.cpp $OBJS -pthread -o /tmp/qrow
//   taskset -c 1 /tmp/qrow
// Zen 4 (2-vCPU EPYC VM), avx2 / avx512 before -> after ops.inc's 16-a-step loops (ns): K = 4096, group K
// 767 / 590-602 -> 236-240, group 128 1080-1088 / 820-828 -> 455-465; K = 1536, group K 292 / 221-234 -> 95,
// group 128 405 / 307 -> 171-173. The avxvnni_evex twin stays on the AVX2 loops (= avx2).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common.h"

using namespace lowbit;

int main() {
  struct Table {
    const char* name;
    const KernelTable* t;
  };
  const Table tables[] = {{"scalar", &kernels_scalar()},
                          {"avx2", &kernels_avx2()},
                          {"avxvnni_evex", &kernels_avxvnni_evex()},
                          {"avx512", &kernels_avx512()}};
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int64_t K : {1536, 4096}) {
    std::vector<float> buf(K + 16);
    float* const x = buf.data() + (-(uintptr_t)buf.data() / 4 & 15);  // 64-byte aligned, as the decoder's rows
    for (int64_t k = 0; k < K; ++k) x[k] = nd(gen);
    for (int64_t group : {K, (int64_t)128}) {
      const int64_t G = (K + group - 1) / group;
      std::vector<int8_t> q(K);
      std::vector<float> s(G);
      std::vector<int32_t> sum(G);
      for (const Table& t : tables) {
        double best = 1e30;
        for (int rep = 0; rep < 300; ++rep) {
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < 200; ++i) {
            t.t->ops.quantize_row(x, K, K, group, q.data(), s.data(), sum.data());
            asm volatile("" ::: "memory");
          }
          const std::chrono::duration<double, std::nano> dt = std::chrono::steady_clock::now() - t0;
          best = std::min(best, dt.count() / 200);
        }
        std::printf("K=%5lld group=%5lld %-13s %8.1f ns\n", (long long)K, (long long)group, t.name, best);
      }
    }
  }
}
