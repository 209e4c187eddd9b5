// Time of the b = 8 Psumbook's per-token table build on AVX-512 VBMI (codebook_vbmi.cpp: int16 dots, per-pair
// scales, int8 tables) for one K = 4096 row of activations, 32 groups of 128: TSC ticks per token, best of 10000.
// In-core work on L1-resident data, so it is steady on a loaded machine where the GEMV's wall time is not (the
// b = 4 twin: codebook_tables_bench.cpp). Build and run:
//
//   g++ -O3 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512vbmi -mavx2 -mfma -mf16c \
//       -Isrc/lowbit/kernels scripts/codebook_vbmi_tables_bench.cpp src/lowbit/kernels/codebook_scalar.cpp \
//       -o /tmp/vbmi_tables_bench && /tmp/vbmi_tables_bench
//
// Stop 27 (Xeon, EMR): m1v4b8g128 104-106k -> 77k ticks (one pass of dots, vector scales), m2v8b8g128 159k ->
// 127-139k. Another version of the kernel: put its codebook_vbmi.cpp in a folder D and add -ID first.
// It first checks that the kernel's vector scales (lut4_scales_avx512) equal the scalar twin's
// (codebook_lut4_scales) bit for bit on 20000 random cases: sizes 1-700, zeros, denormals, wide exponent spans.
#include "codebook_vbmi.cpp"

#include <x86intrin.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace lowbit {
// the kernel's fallback for other b / token counts, never taken here
void codebook_psum_avx2(const CodebookWeights&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                        float*, int64_t, float*) {}
}  // namespace lowbit

// lut4_scales_avx512 against codebook_lut4_scales: E, invq and mult equal, nothing written past them
static int check_scales() {
  using namespace lowbit;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  int bad = 0;
  for (int it = 0; it < 20000; ++it) {
    const int64_t P = 1 + rng() % 700, Pp = P + (P & 1);
    const int kind = rng() % 4;  // 0: dense; 1: some zeros; 2: zeros and denormals; 3: exponents down to 2^-140
    std::vector<float> mxq(Pp + 32, 0.f);
    float mx = 0.f;
    for (int64_t q = 0; q < P; ++q) {
      float v = u(rng) * std::exp2f(-(float)(rng() % (kind == 3 ? 140 : 12)));
      if (kind >= 1 && rng() % 5 == 0) v = 0.f;
      if (kind == 2 && rng() % 7 == 0) v = 1e-42f;
      mxq[q] = v;
      mx = std::max(mx, v);
    }
    std::vector<float> i1(Pp + 16, -1.f), i2(Pp + 16, -1.f);
    std::vector<uint32_t> m1(Pp / 2 + 8, 7u), m2(Pp / 2 + 8, 7u);
    const int e1 = codebook_lut4_scales(mxq.data(), P, Pp, mx, i1.data(), m1.data());
    const int e2 = lut4_scales_avx512(mxq.data(), P, Pp, mx, i2.data(), m2.data());
    bad += e1 != e2 || std::memcmp(i1.data(), i2.data(), i1.size() * 4) || std::memcmp(m1.data(), m2.data(), m1.size() * 4);
  }
  std::printf("vector scales: %d of 20000 cases differ from the scalar twin\n", bad);
  return bad;
}

int main() {
  using namespace lowbit;
  if (check_scales()) return 1;
  const int settings[2][2] = {{1, 4}, {2, 8}};  // (m, v): m1v4b8g128, m2v8b8g128 (2.125 bits per weight)
  for (const auto& mv : settings) {
    const int m = mv[0], v = mv[1];
    const int64_t K = 4096, group = 128;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> cb(m * 256 * v), cbT(m * v * 256), x(K);
    for (auto& f : cb) f = nd(rng);
    for (int i = 0; i < m; ++i)
      for (int c = 0; c < 256; ++c)
        for (int t = 0; t < v; ++t) cbT[(i * v + t) * 256 + c] = cb[(i * 256 + c) * v + t];
    for (auto& f : x) f = nd(rng);
    const CodebookWeights w{nullptr, nullptr, cbT.data(), cb.data(), 64, K, group, m, v, 256, 8, K / group};
    VbmiScratch s;
    const int64_t Pf = w.segs_full() * w.m, Ppf = Pf + (Pf & 1);
    s.mxq.resize(Ppf + 8);
    s.invq.resize(Ppf + 8);
    s.scq.resize(Ppf + 8);
    s.use_i16 = int16_books(w, s);
    std::vector<int8_t> tab(Ppf * 256 + 64);
    int8_t* T = tab.data() + (-reinterpret_cast<uintptr_t>(tab.data()) & 63);
    std::vector<uint32_t> mult(Ppf / 2 + 4);
    unsigned long long best = ~0ull;
    float check = 0.f;
    for (int rep = 0; rep < 10000; ++rep) {
      const unsigned long long t0 = __rdtsc();
      for (int64_t g = 0; g < w.G; ++g) check += build_tables(w, x.data() + g * group, g, s, T, mult.data()) + T[g];
      best = std::min(best, __rdtsc() - t0);
    }
    std::printf("m%dv%db8g128: %llu ticks a token (%.1f a pair; check %g)\n", m, v, best, (double)best / (w.G * Pf), check);
  }
}
