// A stand-in for bitnet-0.7b's decode attention (16 heads x 96, 161 positions, float16 [head][pos][96]) in plain
// C++, for the open question of stop 37: the real kernel (scripts/attn_kernel_probe.cpp) needs its software prefetch
// (without it 4.2-4.5 us a head from DRAM, with it 3.2-3.5), while this loop, the same loads and a compute of
// similar weight, reaches 2.9-3.2 us with the hardware prefetchers alone, and the kernel's prefetch (pf 1) makes it
// slower (3.8-4.1). Per tile of 8 positions: the scores (8 rows x 6 vcvtph2ps loads + FMAs), a reduction per key,
// a dependent scalar chain (the softmax's stand-in), the values (8 rows x 6 loads + FMAs into 6 accumulators).
//   g++ -O2 -march=native scripts/attn_standin.cpp -o /tmp/standin
//   taskset -c 0 /tmp/standin PF PFD CHAIN IN_CACHE    # e.g. 0 2 20 0 (no prefetch), 1 2 20 0 (the kernel's)
// PF 1: at each tile, prefetcht2 of the K and V rows of the tile PFD ahead (the kernel's scheme); IN_CACHE 1: 4
// heads of one layer over and over (stop 37: 2.4 us a head, against the kernel's 1.4-2.0).
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

static inline void prefetch_l2(const char* p) { asm volatile("prefetcht2 %0" : : "m"(*p)); }

int main(int argc, char** argv) {
  const int pf = argc > 1 ? atoi(argv[1]) : 0, pfd = argc > 2 ? atoi(argv[2]) : 2;
  const int chain = argc > 3 ? atoi(argv[3]) : 20, in_cache = argc > 4 ? atoi(argv[4]) : 0;
  const int L = 24, H = 16, P = 168, HD = 96, RB = HD * 2, T = 8, TB = T * RB, NT = P / T;
  const size_t per = (size_t)H * P * RB;
  std::vector<char*> K(L), V(L);
  for (int l = 0; l < L; ++l) {
    K[l] = (char*)aligned_alloc(4096, per * 2);
    V[l] = K[l] + per;
    for (size_t i = 0; i < per * 2; i += 2) *(uint16_t*)(K[l] + i) = 0x3c00 + (i & 63);
  }
  std::vector<char> flush(64 << 20, 1);
  alignas(64) float q[HD];
  for (int i = 0; i < HD; ++i) q[i] = 0.01f * i;
  double best = 1e9;
  for (int rep = 0; rep < 9; ++rep) {
    volatile long sink = 0;
    if (!in_cache)
      for (size_t i = 0; i < flush.size(); i += 64) sink += flush[i];
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const int ll = in_cache ? 0 : l, hh = in_cache ? h % 4 : h;
        const uint16_t* Kh = (const uint16_t*)(K[ll] + (size_t)hh * P * RB);
        const uint16_t* Vh = (const uint16_t*)(V[ll] + (size_t)hh * P * RB);
        __m512 o[6];
        for (int u = 0; u < 6; ++u) o[u] = _mm512_setzero_ps();
        float mx = -1e30f;
        for (int t = 0; t < NT; ++t) {
          if (pf && t + pfd < NT) {
            const char* pk = (const char*)(Kh + (t + pfd) * T * HD);
            const char* pv = (const char*)(Vh + (t + pfd) * T * HD);
            for (int b = 0; b < TB; b += 64) prefetch_l2(pk + b);
            for (int b = 0; b < TB; b += 64) prefetch_l2(pv + b);
          }
          __m512 acc[8];
          for (int j = 0; j < 8; ++j) acc[j] = _mm512_setzero_ps();
          const uint16_t* kt = Kh + t * T * HD;
          for (int d = 0; d < HD; d += 16) {
            const __m512 qv = _mm512_load_ps(q + d);
            for (int j = 0; j < 8; ++j)
              acc[j] = _mm512_fmadd_ps(qv, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(kt + j * HD + d))), acc[j]);
          }
          float sc[8];
          for (int j = 0; j < 8; ++j) sc[j] = _mm512_reduce_add_ps(acc[j]);
          float m = mx;
          for (int j = 0; j < 8; ++j) m = m > sc[j] ? m : sc[j];
          float x = m;
          for (int c = 0; c < chain; ++c) x = x * 0.999f + 0.001f;
          mx = m;
          const __m512 alpha = _mm512_set1_ps(x * 1e-30f + 0.5f);
          const uint16_t* vt = Vh + t * T * HD;
          for (int u = 0; u < 6; ++u) o[u] = _mm512_mul_ps(o[u], alpha);
          for (int j = 0; j < 8; ++j) {
            const __m512 pj = _mm512_set1_ps(sc[j] * 1e-3f);
            for (int u = 0; u < 6; ++u)
              o[u] = _mm512_fmadd_ps(pj, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(vt + j * HD + 16 * u))), o[u]);
          }
        }
        __m512 s = o[0];
        for (int u = 1; u < 6; ++u) s = _mm512_add_ps(s, o[u]);
        total += _mm512_reduce_add_ps(s);
      }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / (L * H);
    if (total == 1.5f) printf("!");
    if (us < best) best = us;
  }
  printf("pf %d pfd %d chain %d %s: %.2f us per head (%.1f GB/s of K/V)\n", pf, pfd, chain,
         in_cache ? "in cache" : "from DRAM", best, 2.0 * P * RB / best / 1e3);
}
