// What bounds bitnet-0.7b's decode attention from DRAM (stop 37): a stand-in of the MHA kernel in plain C++ (16
// heads x 96, float16 K/V [head][row][96], the kernel's math: 8-key FMA chains over d, the 512 -> 256 add and the
// hadd tree, the online softmax with exp256, the output in registers) over 24 layers of K/V read once from DRAM.
//   g++ -O3 -fno-math-errno -march=native scripts/attn_standin.cpp -o /tmp/standin
//   taskset -c 0 /tmp/standin ROWS [PF [IN_CACHE]]        CB=64 taskset -c 0 /tmp/standin 128
// Each head's K and V hold 168 rows; a head reads its first ROWS of them (a multiple of 8).
//   CB=n: the cache in blocks of n positions, [block][head][n rows][96], walked block by block over the heads,
//             each head's running max, sum and output kept between its blocks (the same operations a head, so the
//             same bits as a head in one go); the last block read in part when n does not divide ROWS.
//             IL=1 with it: each (block, head)'s V rows right after its K rows, one stream.
//   P=rows: the rows a head's buffer holds (default 168; P=256 for blocks read up to 256 rows).
//   ROWS 168: head h's K stream runs straight on into head h + 1's (the same for V): one continuous stream a
//             layer, as if the cache were laid out so that decode's rows of all heads are back to back.
//   ROWS 160: a 1.5 KB gap before each head (the model's cache: each head's rows are an island, max_ctx apart).
// PF 1 adds the kernel's software prefetch (the rows of the tile two ahead, prefetcht2); IN_CACHE 1 runs 4 heads
// of one layer over and over. Stop 37 (Zen 4, 1 thread, alternating):
//   168 rows, no prefetch: 2.5-2.9 us a head (22-26 GB/s); 160 rows: 4.1-4.9 us (13-16 GB/s) for fewer bytes;
//   160 rows with the kernel's prefetch 3.7-4.2 us, and with the next head's tiles prefetched a whole head ahead
//   3.3-3.9 us. In cache 1.5 us. The real kernel (scripts/attn_kernel_probe.cpp, 161 of 168 rows) 3.1-3.5 us.
// So a K/V stream that starts cold at every head costs ~1.7 us a head (the hardware prefetchers retrain on each new
// stream; a software prefetch recovers only part of it), more than the head's whole compute. In blocks of 64
// (CB=64, 128 rows: two blocks a head) 1.71-1.85 us against 3.86-4.43 for the same 128 rows read head by head from
// the head-major cache (27-29 against 11-13 GB/s); blocks of 56 (168 rows) 2.33-2.46, of 8 2.68-2.77.
// Stop 38 (P=256): a partly read last block costs its heads a cold start each again: blocks of 64 at 160 rows
// 3.0-3.2 us, at 176 3.5-3.7 (192: 2.7-2.8); blocks of 16 at 160 2.3, 176 2.6, 192 2.8-2.9; 32 in between. IL=1 (K
// and V of a block in one stream, read K tile, V tile): 2x slower (4.7-5.0 against 2.1-2.3 at 128 rows, CB=16).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

static inline void prefetch_l2(const char* p) { asm volatile("prefetcht2 %0" : : "m"(*p)); }

static inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, r);
  __m256 p = _mm256_set1_ps(1.5403530393381606e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(r), 23)));
}
static inline float hmax256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
static inline float hsum256(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}
static inline __m256 hsum8x8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

constexpr int HD = 96, T = 8;

// One tile of 8 positions for one head: scores, the online-softmax step, the values into o (the head's state).
[[gnu::always_inline]] inline void tile_step(const float* q, const uint16_t* kt, const uint16_t* vt, __m512* o, float& mx,
                                             float& lsum) {
  __m512 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm512_setzero_ps();
  for (int d = 0; d < HD; d += 16) {
    const __m512 qv = _mm512_load_ps(q + d);
    for (int j = 0; j < 8; ++j)
      acc[j] = _mm512_fmadd_ps(qv, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(kt + j * HD + d))), acc[j]);
  }
  __m256 a8[8];
  for (int j = 0; j < 8; ++j) a8[j] = _mm256_add_ps(_mm512_castps512_ps256(acc[j]), _mm512_extractf32x8_ps(acc[j], 1));
  const __m256 sv = hsum8x8(a8);
  const float mnew = std::max(mx, hmax256(sv));
  alignas(32) float e[8];
  _mm256_store_ps(e, exp256(_mm256_set1_ps(mx - mnew)));
  const float alpha = mnew > mx ? e[0] : 1.f;
  mx = mnew;
  const __m256 p = exp256(_mm256_sub_ps(sv, _mm256_set1_ps(mnew)));
  lsum = lsum * alpha + hsum256(p);
  alignas(32) float pb[8];
  _mm256_store_ps(pb, p);
  const __m512 a16 = _mm512_set1_ps(alpha);
  for (int u = 0; u < 6; ++u) o[u] = _mm512_mul_ps(o[u], a16);
  for (int j = 0; j < 8; ++j) {
    const __m512 pj = _mm512_set1_ps(pb[j]);
    for (int u = 0; u < 6; ++u)
      o[u] = _mm512_fmadd_ps(pj, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(vt + j * HD + 16 * u))), o[u]);
  }
}

int main(int argc, char** argv) {
  const int rows = argc > 1 ? atoi(argv[1]) : 168, pf = argc > 2 ? atoi(argv[2]) : 0;
  const int in_cache = argc > 3 ? atoi(argv[3]) : 0;
  const int P = getenv("P") ? atoi(getenv("P")) : 168;  // rows a head's buffer holds
  const int L = 24, H = 16, RB = HD * 2, TB = T * RB, NT = std::min(rows, P) / T;
  const size_t per = (size_t)H * P * RB;
  std::mt19937 rng(0);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<char*> K(L), V(L);
  for (int l = 0; l < L; ++l) {
    K[l] = (char*)aligned_alloc(4096, 2 * per);  // twice: IL keeps V beside K in it
    V[l] = (char*)aligned_alloc(4096, per);
    for (size_t i = 0; i < 2 * per; i += 2) *(uint16_t*)(K[l] + i) = _cvtss_sh(nd(rng), 0);
    for (size_t i = 0; i < per; i += 2) *(uint16_t*)(V[l] + i) = _cvtss_sh(nd(rng), 0);
  }
  std::vector<char> flush(64 << 20, 1);
  alignas(64) float q[HD];
  for (int i = 0; i < HD; ++i) q[i] = 0.1f * nd(rng);
  double best = 1e9;
  float total = 0;
  for (int rep = 0; rep < 9; ++rep) {
    volatile long sink = 0;
    if (!in_cache)
      for (size_t i = 0; i < flush.size(); i += 64) sink += flush[i];
    const auto t0 = std::chrono::steady_clock::now();
    static const int CB = getenv("CB") ? atoi(getenv("CB")) : 0;
    if (CB) {  // the same buffers read as [block][head][CB rows][96]
      const int NC = (std::min(rows, P) + CB - 1) / CB;  // the last block partly read
      alignas(64) static float ost[16][HD];
      static float mst[16], lst[16];
      for (int l = 0; l < L; ++l) {
        const int ll = in_cache ? 0 : l;
        for (int h = 0; h < H; ++h) {
          for (int d = 0; d < HD; ++d) ost[h][d] = 0.f;
          mst[h] = -INFINITY;
          lst[h] = 0.f;
        }
        for (int c = 0; c < NC; ++c)
          for (int h = 0; h < H; ++h) {
            static const bool IL = getenv("IL") != nullptr;
            const uint16_t* Kh = IL ? (const uint16_t*)(K[ll] + ((size_t)c * H + h) * 2 * CB * RB)
                                    : (const uint16_t*)(K[ll] + ((size_t)c * H + h) * CB * RB);
            const uint16_t* Vh = IL ? Kh + CB * HD : (const uint16_t*)(V[ll] + ((size_t)c * H + h) * CB * RB);
            __m512 o[6];
            for (int u = 0; u < 6; ++u) o[u] = _mm512_load_ps(ost[h] + 16 * u);
            float mx = mst[h], lsum = lst[h];
            const int nt = (std::min(CB, std::min(rows, P) - c * CB) + T - 1) / T;
            for (int t = 0; t < nt; ++t) tile_step(q, Kh + t * T * HD, Vh + t * T * HD, o, mx, lsum);
            for (int u = 0; u < 6; ++u) _mm512_store_ps(ost[h] + 16 * u, o[u]);
            mst[h] = mx;
            lst[h] = lsum;
          }
        for (int h = 0; h < H; ++h) total += ost[h][0] / lst[h];
      }
    } else {
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          const int ll = in_cache ? 0 : l, hh = in_cache ? h % 4 : h;
          const uint16_t* Kh = (const uint16_t*)(K[ll] + (size_t)hh * P * RB);
          const uint16_t* Vh = (const uint16_t*)(V[ll] + (size_t)hh * P * RB);
          __m512 o[6];
          for (int u = 0; u < 6; ++u) o[u] = _mm512_setzero_ps();
          float mx = -INFINITY, lsum = 0.f;
          for (int t = 0; t < NT; ++t) {
            if (pf && t + 2 < NT) {
              const char* pk = (const char*)(Kh + (t + 2) * T * HD);
              const char* pv = (const char*)(Vh + (t + 2) * T * HD);
              for (int b = 0; b < TB; b += 64) prefetch_l2(pk + b);
              for (int b = 0; b < TB; b += 64) prefetch_l2(pv + b);
            }
            tile_step(q, Kh + t * T * HD, Vh + t * T * HD, o, mx, lsum);
          }
          __m512 s = o[0];
          for (int u = 1; u < 6; ++u) s = _mm512_add_ps(s, o[u]);
          total += _mm512_reduce_add_ps(s) / lsum;
        }
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / (L * H);
    if (us < best) best = us;
  }
  const int cb = getenv("CB") ? atoi(getenv("CB")) : 0, read = cb ? (std::min(rows, P) + T - 1) / T * T : NT * T;
  printf("%d of %d rows a head%s%s, %s: %.2f us a head (%.1f GB/s of K/V)%s\n", read, P, pf ? ", prefetch" : "",
         cb ? ", in blocks" : "", in_cache ? "in cache" : "from DRAM", best, 2.0 * read * RB / best / 1e3,
         total == 1.5f ? "!" : "");
}
