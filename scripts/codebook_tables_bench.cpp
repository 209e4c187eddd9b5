// Time of the b = 4 Psumbook's per-token table build (codebook_lut4_avx2.cpp: float psums, per-pair scales, int8
// tables) for one K = 4096 row of activations, 32 groups of 128: TSC ticks per call, best of 200. In-core work on
// L1-resident data, so it is steady on a loaded machine where the GEMV's wall time is not. Build and run:
//
//   g++ -O3 -mavx2 -mfma -mf16c -Isrc/lowbit/kernels scripts/codebook_tables_bench.cpp \
//       src/lowbit/kernels/codebook_scalar.cpp -o /tmp/tables_bench && /tmp/tables_bench
//
// Another version of the kernel: put its codebook_lut4_avx2.cpp in a folder D and add -ID before -Isrc/lowbit/kernels
// (e.g. git show 9f56c69:src/lowbit/kernels/codebook_lut4_avx2.cpp > D/codebook_lut4_avx2.cpp).
#include "codebook_lut4_avx2.cpp"

#include <x86intrin.h>

#include <cstdio>
#include <random>
#include <vector>

int main() {
  using namespace lowbit;
  const int settings[2][2] = {{4, 8}, {2, 4}};  // (m, v): m4v8b4g128, m2v4b4g128 (2.125 bits per weight)
  for (const auto& mv : settings) {
    const int m = mv[0], v = mv[1], K = 4096, group = 128, G = K / group;
    std::mt19937 rng(0);
    std::normal_distribution<float> nd;
    std::vector<float> cbT(m * v * 16), cb(m * 16 * v), x(K);
    for (auto& f : cbT) f = nd(rng);
    for (auto& f : x) f = nd(rng);
    const CodebookWeights w{nullptr, nullptr, cbT.data(), cb.data(), 32, K, group, m, v, 16, 1, G};
    const int64_t ppf = w.pairs_padded_full();
    std::vector<float> scratch(Lut4Scratch::floats(1, ppf) + 64);
    Lut4Scratch sb(scratch.data(), 1, ppf);
    double best = 1e30, sink = 0;
    for (int r = 0; r < 200; ++r) {
      const uint64_t t0 = __rdtsc();
      for (int g = 0; g < G; ++g)
        sink += build_tables_lut4(w, x.data() + g * group, g, sb.tf, sb.mxq, sb.invq, sb.tabs(0), sb.mults(0));
      best = std::min(best, (double)(__rdtsc() - t0));
    }
    std::printf("m%dv%db4g128: %.0f TSC ticks per token (K = 4096), %.1f per (segment, codebook) pair  [%g]\n", m, v,
                best, best / (G * ppf), sink);
  }
}
