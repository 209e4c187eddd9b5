// Decode attention of one MHA layer stack straight from C++ (no Python, no driver): bitnet-0.7b's 24 layers x 16
// kv heads x 96 at 161 positions by default, float16 K/V, 8 heads a task as the driver runs them (next_K set
// within a task). Times the installed kernel (the build's objects) and, with VARIANT=1, a copy of ops.inc and
// attn.inc compiled into the probe itself from the folder given first with -I, so a change to the attention
// kernel is measured in seconds, without a package build:
//   B=build/cp311-cp311-linux_x86_64   # the pip build folder (scikit-build-core's build-dir)
//   OBJS=$(ls $B/CMakeFiles/_native.dir/src/lowbit/kernels/*.o | grep -v 'binding\|weight_args')
//   mkdir -p /tmp/av && cp src/lowbit/kernels/{ops,attn}.inc /tmp/av/   # then edit /tmp/av/attn.inc
//   g++ -O3 -fno-math-errno -march=native -std=c++17 -I/tmp/av -Isrc/lowbit/kernels scripts/attn_kernel_probe.cpp \
//       $OBJS -pthread -o /tmp/attn_probe
//   taskset -c 0 /tmp/attn_probe [CTX [IN_CACHE]]      # installed kernel;  VARIANT=1 taskset -c 0 /tmp/attn_probe
// CTX: the cache's rows a head (168: the heads' K/V back to back, as scripts/attn_decode_bench.py; 2048: a
// model's cache, each head's 30 KB stream an island). IN_CACHE=1: 4 heads of one layer over and over.
// MISALIGN=bytes puts the cache that far past a 4 KiB boundary (stop 37: 0, 16 and 64 all alike).
// Stop 37 (Zen 4, 1 thread): from DRAM 3.1-3.8 us a head, in cache 2.0-2.1, the Python bench's figures.
// PSTREAMK=1: the PSTREAM bytes read by the GEMV's read kernel (its prefetch) instead of plain loads.
//
// Stop 41, the cache layout: PM=1 and BLK=B time two prototype layouts whose per-layer K and V passes are each one
// sequential stream, their kernels compiled into this probe (below): position-major (row j holds every kv head's
// row; PNH heads a task, 16: one stream) and blocked ([block of B positions][kv head][B rows]). Both give the
// installed kernel's bits (each key's FMA chain and tree, the values' FMA chain j ascending, kept in memory between
// blocks); the probe checks that on layer 0. PREPS: the timed passes (9).
//   HUGE=1 taskset -c 0 /tmp/attn_probe 2048                 # head-major (the installed kernel), from DRAM
//   HUGE=1 taskset -c 0 /tmp/attn_probe 161                  # head-major, every head's rows back to back
//   PM=1 PNH=16 HUGE=1 taskset -c 0 /tmp/attn_probe 2048     # position-major, one task of all 16 heads
//   BLK=16 HUGE=1 taskset -c 0 /tmp/attn_probe 2048          # blocked, B = 16
// Zen 5 (stop 41): 2.0-2.2 us a kv head head-major; 1.58 with the heads back to back (39 GB/s: the stream's gaps are
// what costs, not the compute); position-major 1.81-1.88 (PMAHEAD, PMBLK, PMVB, PMPAIRS tune its prefetch and value
// blocks); blocked B = 16 / 32 1.81-1.87, B = 64 2.1-2.3 (the last block's unused rows). In cache (PH=4 or 8, second
// argument 1) the prototypes take 1.1-1.5 us against 0.8: their per-block overhead is what keeps them from the
// back-to-back 1.58. PIPE=C (PIPEAHEAD bytes, 4096): the head-major kernel software-pipelined across heads (head h's
// values beside head h + 1's scores, C positions each in turn): 1.91-2.38 us against 1.96-2.02, no gain (stop 41).
// docs/decode.md, stop 41.
#include <immintrin.h>

#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <cstring>
#include <vector>

#include "dispatch.h"
#define LOWBIT_OPS_NS ops_probe
#include "ops.inc"
#undef LOWBIT_OPS_NS
#include <type_traits>

namespace lowbit::ops_probe {  // the two row helpers ops.inc declares (kernels_avx512.cpp's)
void f16_to_f32_row(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = _cvtss_sh(src[i], 0);
}

// ---- position-major decode: one query row against kv heads [0, nkv) whose rows lie side by side (row j of every
// kv head, then row j + 1: rs bytes from one position to the next). Each pass reads one sequential stream of whole
// rows, blocks of kAttnRowsBlock positions: per block, head by head, the scores (attn2_scores, the same per-key
// chain and tree) / the values (accumulators kept in acc[] between blocks: the same FMA chain, j ascending).
struct AttnRows {
  const float* q;  // [nkv * group][hd]
  float* out;      // [nkv * group][hd]
  const void *K, *V;  // row 0, first kv head
  int64_t rs, nkv, group, hd;
  KvType kv;
  int64_t lo, hi;
  float softcap;
  float* part;  // [nkv * group][2] or null
};
inline int pm_env(const char* k, int d) { const char* v = getenv(k); return v ? atoi(v) : d; }
static const int kPmAhead = pm_env("PMAHEAD", 8192);
static const int kPmBlkAhead = pm_env("PMBLK", 0);
static const int kPmVB = pm_env("PMVB", 4);
static const int kPmPairs = pm_env("PMPAIRS", 1);
constexpr int64_t kAttnRowsBlock = 8;

// Prefetch over one contiguous byte range [p, p + n), T0, kept `ahead` bytes past the consumer.
struct StreamPrefetch {
  const char* p = nullptr;
  int64_t n = 0, off = 0;
  void issue(int64_t upto) {
    upto = std::min(upto, n);
    for (; off < upto; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  }
};


// Scores of 8 (query, key) pairs: pair i is q[i] . k[i] (D vectors of 16; 0: nd at run time), each its own FMA chain
// over d ascending and attn_hsum16x8's tree, as attn2_scores. into out[i] (then softcap).
template <int D, typename T>
[[gnu::always_inline]]
inline void attn2_scores_pairs(const float* const* q, const T* const* k, int64_t nd, const float* ksc, float softcap,
                               float* const* out) {
  __m512 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm512_setzero_ps();
  const int64_t n = D > 0 ? D : nd;
#pragma GCC unroll 8
  for (int64_t d = 0; d < n; ++d)
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(q[j] + 16 * d), attn_load16(k[j] + 16 * d), acc[j]);
  __m256 s8 = attn_hsum16x8(acc);
  if (ksc) s8 = _mm256_mul_ps(s8, _mm256_loadu_ps(ksc));
  alignas(32) float t[8];
  _mm256_store_ps(t, s8);
  for (int j = 0; j < 8; ++j) *out[j] = softcap > 0.f ? softcap_score(t[j], softcap) : t[j];
}

template <int Q, int DC, typename T>
inline void attn2_values_blk(const T* V, int64_t vs, int64_t d0, int64_t jb, int64_t je, const float* const* w,
                             const float* vsc, float* const* acc_mem, bool first, bool last, const float* scale,
                             float* const* o) {
  __m512 acc[Q][DC];
  for (int g = 0; g < Q; ++g)
    for (int c = 0; c < DC; ++c) acc[g][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_mem[g] + 16 * (d0 + c));
  for (int64_t j = jb; j < je; ++j) {
    const T* v = V + j * vs + 16 * d0;
    __m512 vv[DC];
    for (int c = 0; c < DC; ++c) vv[c] = attn_load16(v + 16 * c);
    for (int g = 0; g < Q; ++g) {
      const float wj = vsc ? w[g][j] * vsc[j - jb] : w[g][j];
      const __m512 wv = _mm512_set1_ps(wj);
      for (int c = 0; c < DC; ++c) acc[g][c] = _mm512_fmadd_ps(wv, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < Q; ++g) {
    if (last) {
      const __m512 sv = _mm512_set1_ps(scale[g]);
      for (int c = 0; c < DC; ++c) _mm512_storeu_ps(o[g] + 16 * (d0 + c), _mm512_mul_ps(acc[g][c], sv));
    } else {
      for (int c = 0; c < DC; ++c) _mm512_storeu_ps(acc_mem[g] + 16 * (d0 + c), acc[g][c]);
    }
  }
}

template <int Q, typename T>
inline void attn2_values_blk_all(const T* V, int64_t vs, int64_t nd, int64_t jb, int64_t je, const float* const* w,
                                 const float* vsc, float* const* acc_mem, bool first, bool last, const float* scale,
                                 float* const* o) {
  constexpr int cap = Q <= 2 ? 8 : 6;
  for (int64_t d0 = 0; d0 < nd;) {
    const int64_t left = std::min<int64_t>(nd - d0, cap);
    if (left >= 8) { attn2_values_blk<Q, 8>(V, vs, d0, jb, je, w, vsc, acc_mem, first, last, scale, o); d0 += 8; }
    else if (left >= 6) { attn2_values_blk<Q, 6>(V, vs, d0, jb, je, w, vsc, acc_mem, first, last, scale, o); d0 += 6; }
    else if (left >= 4) { attn2_values_blk<Q, 4>(V, vs, d0, jb, je, w, vsc, acc_mem, first, last, scale, o); d0 += 4; }
    else if (left >= 2) { attn2_values_blk<Q, 2>(V, vs, d0, jb, je, w, vsc, acc_mem, first, last, scale, o); d0 += 2; }
    else { attn2_values_blk<Q, 1>(V, vs, d0, jb, je, w, vsc, acc_mem, first, last, scale, o); d0 += 1; }
  }
}

// the values of a run of k_ (1-4) queries over positions [jb, je) (attn2_values_blk_all at the run's size)
template <typename T>
inline void attn_values_run(int k_, const T* V, int64_t vs, int64_t nd, int64_t jb, int64_t je, const float* const* w,
                            const float* vsc, float* const* am, bool first, bool last, const float* sc,
                            float* const* o) {
  if (k_ == 4) attn2_values_blk_all<4>(V, vs, nd, jb, je, w, vsc, am, first, last, sc, o);
  else if (k_ == 3) attn2_values_blk_all<3>(V, vs, nd, jb, je, w, vsc, am, first, last, sc, o);
  else if (k_ == 2) attn2_values_blk_all<2>(V, vs, nd, jb, je, w, vsc, am, first, last, sc, o);
  else attn2_values_blk_all<1>(V, vs, nd, jb, je, w, vsc, am, first, last, sc, o);
}

template <int Q, int D, typename T>
inline void attn_rows_scores(const AttnRows& a, const T* K, int64_t ks, int64_t hu, int64_t h, int64_t g0, int64_t jb,
                             int64_t je, float* const* scb) {
  const bool i8 = a.kv == KvType::kI8;
  const int64_t nd = a.hd / 16;
  const float* q[Q];
  float* sc[Q];
  for (int g = 0; g < Q; ++g) {
    q[g] = a.q + (h * a.group + g0 + g) * a.hd;
    sc[g] = scb[h * a.group + g0 + g];
  }
  constexpr int NK = Q == 1 ? 8 : 4;
  alignas(32) float ksc[8];
  int64_t j = jb;
  const T* Kh = K + h * hu;
  for (; j + NK <= je; j += NK) {
    const T* k = Kh + j * ks;
    if (i8) attn_row_scales(reinterpret_cast<const int8_t*>(k), a.rs, a.hd, ksc, NK);
    float* out[Q];
    for (int g = 0; g < Q; ++g) out[g] = sc[g] + j;
    attn2_scores<Q, NK, D>(q, k, ks, nd, i8 ? ksc : nullptr, a.softcap, out);
  }
  for (; j < je; ++j) {
    const T* k = Kh + j * ks;
    if (i8) attn_row_scales(reinterpret_cast<const int8_t*>(k), a.rs, a.hd, ksc, 1);
    float* out[Q];
    for (int g = 0; g < Q; ++g) out[g] = sc[g] + j;
    attn2_scores<Q, 1, D>(q, k, ks, nd, i8 ? ksc : nullptr, a.softcap, out);
  }
}

template <typename T>
void attn_rows_t(const AttnRows& a) {
  const int64_t hd = a.hd, nd = hd / 16, ub = (int64_t)sizeof(T), ks = a.rs / ub, hu = kv_row_units(a.kv, hd);
  const bool i8 = a.kv == KvType::kI8;
  const int64_t L = a.lo, H = a.hi, n = H - L, nq = a.nkv * a.group, rbytes = a.nkv * kv_row_bytes(a.kv, hd);
  thread_local std::vector<float> buf;
  const size_t need = (size_t)(nq * n + nq * hd + kAttnRowsBlock + 16);
  if (buf.size() < need) buf.resize(need);
  // scores of query m at sc[m][j], j in [L, H)  (pointer offset so absolute positions index it)
  std::vector<float*> scv(nq);
  for (int64_t m = 0; m < nq; ++m) scv[m] = buf.data() + m * n - L;
  float* accb = buf.data() + nq * n;
  float* vsc = accb + nq * hd;
  const T* K = static_cast<const T*>(a.K);
  const T* V = static_cast<const T*>(a.V);
  const int64_t blk = kAttnRowsBlock;
  const int64_t ahead = kPmAhead + kPmBlkAhead * blk * a.rs;
  StreamPrefetch pk{reinterpret_cast<const char*>(K) + L * a.rs, n * a.rs};
  if (kPmPairs && a.group == 1 && a.nkv % 8 == 0 && !i8) {
    for (int64_t j = L; j < H; ++j) {
      const T* row = K + j * ks;
      for (int64_t h = 0; h < a.nkv; h += 8) {
        pk.issue((j - L) * a.rs + (h + 8) * kv_row_bytes(a.kv, hd) + kPmAhead);
        const float* qp[8];
        const T* kp[8];
        float* op[8];
        for (int i = 0; i < 8; ++i) {
          qp[i] = a.q + (h + i) * hd;
          kp[i] = row + (h + i) * hu;
          op[i] = scv[h + i] + j;
        }
        if (nd == 6) attn2_scores_pairs<6>(qp, kp, nd, nullptr, a.softcap, op);
        else attn2_scores_pairs<0>(qp, kp, nd, nullptr, a.softcap, op);
      }
    }
  } else
  for (int64_t jb = L; jb < H; jb += blk) {
    const int64_t je = std::min(H, jb + blk);
    for (int64_t h = 0; h < a.nkv; ++h) {
      pk.issue((jb - L) * a.rs + (h + 1) * (je - jb) * rbytes / a.nkv + ahead);
      attn_fuse_runs<4>((int)a.group, [&](int g0, int k_) {
        switch (nd) {
          case 6:
            if (k_ == 4) attn_rows_scores<4, 6>(a, K, ks, hu, h, g0, jb, je, scv.data());
            else if (k_ == 3) attn_rows_scores<3, 6>(a, K, ks, hu, h, g0, jb, je, scv.data());
            else if (k_ == 2) attn_rows_scores<2, 6>(a, K, ks, hu, h, g0, jb, je, scv.data());
            else attn_rows_scores<1, 6>(a, K, ks, hu, h, g0, jb, je, scv.data());
            break;
          default:
            if (k_ == 4) attn_rows_scores<4, 0>(a, K, ks, hu, h, g0, jb, je, scv.data());
            else if (k_ == 3) attn_rows_scores<3, 0>(a, K, ks, hu, h, g0, jb, je, scv.data());
            else if (k_ == 2) attn_rows_scores<2, 0>(a, K, ks, hu, h, g0, jb, je, scv.data());
            else attn_rows_scores<1, 0>(a, K, ks, hu, h, g0, jb, je, scv.data());
        }
      });
    }
  }
  std::vector<float> scale(nq);
  for (int64_t m = 0; m < nq; ++m) {
    float l;
    const float mx = attn2_softmax(scv[m] + L, n, &l);
    scale[m] = a.part ? 1.f : 1.f / l;
    if (a.part) {
      a.part[2 * m] = mx;
      a.part[2 * m + 1] = l;
    }
  }
  StreamPrefetch pv{reinterpret_cast<const char*>(V) + L * a.rs, n * a.rs};
  const int64_t vblk = kPmVB;
  const int64_t vahead = kPmAhead + kPmBlkAhead * vblk * a.rs;
  for (int64_t jb = L; jb < H; jb += vblk) {
    const int64_t je = std::min(H, jb + vblk);
    for (int64_t h = 0; h < a.nkv; ++h) {
      pv.issue((jb - L) * a.rs + (h + 1) * (je - jb) * rbytes / a.nkv + vahead);
      const T* Vh = V + h * hu;
      if (i8) attn_row_scales(reinterpret_cast<const int8_t*>(Vh + jb * ks), a.rs, hd, vsc, je - jb);
      attn_fuse_runs<4>((int)a.group, [&](int g0, int k_) {
        const float* w[4];
        float* am[4];
        float* o[4];
        const float* sc4 = scale.data() + h * a.group + g0;
        for (int g = 0; g < k_; ++g) {
          const int64_t m = h * a.group + g0 + g;
          w[g] = scv[m];
          am[g] = accb + m * hd;
          o[g] = a.out + m * hd;
        }
        const bool first = jb == L, last = je == H;
        const float* vs_ = i8 ? vsc : nullptr;
        attn_values_run(k_, Vh, ks, nd, jb, je, w, vs_, am, first, last, sc4, o);
      });
    }
  }
}

inline void attn_rows(const AttnRows& a) {
  if (a.kv == KvType::kF16) attn_rows_t<uint16_t>(a);
  else if (a.kv == KvType::kF32) attn_rows_t<float>(a);
  else attn_rows_t<int8_t>(a);
}


// ---- blocked layout: [block][kv head][B rows][row]; decode of one query row against all kv heads of the task,
// pass by pass in memory order (block, head): each (block, head) chunk is B contiguous rows.
template <typename T>
void attn_blocked_t(const AttnRows& a, int64_t B) {
  const int64_t hd = a.hd, nd = hd / 16, hu = kv_row_units(a.kv, hd), rb = kv_row_bytes(a.kv, hd);
  const bool i8 = a.kv == KvType::kI8;
  const int64_t L = a.lo, H = a.hi, n = H - L, nq = a.nkv * a.group;
  const int64_t cs = B * hu, bs = a.nkv * cs;  // elements: a chunk, a block (rs unused)
  thread_local std::vector<float> buf;
  const size_t need = (size_t)(nq * n + nq * hd + B + 16);
  if (buf.size() < need) buf.resize(need);
  float* scv[64];
  for (int64_t m = 0; m < nq; ++m) scv[m] = buf.data() + m * n - L;
  float* accb = buf.data() + nq * n;
  float* vsc = accb + nq * hd;
  const T* K = static_cast<const T*>(a.K);
  const T* V = static_cast<const T*>(a.V);
  const int64_t b0 = L / B, b1 = (H + B - 1) / B;
  StreamPrefetch pk{reinterpret_cast<const char*>(K + b0 * bs), (b1 - b0) * bs * (int64_t)sizeof(T)};
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t jb = std::max(L, b * B), je = std::min(H, b * B + B);
    for (int64_t h = 0; h < a.nkv; ++h) {
      const T* Kc = K + b * bs + h * cs - b * B * hu;  // row j of the chunk at Kc + j * hu
      pk.issue(((b - b0) * bs + h * cs + (je - b * B) * hu) * (int64_t)sizeof(T) + kPmAhead);
      attn_fuse_runs<4>((int)a.group, [&](int g0, int k_) {
        const float* q[4];
        float* sc[4];
        for (int g = 0; g < k_; ++g) {
          q[g] = a.q + (h * a.group + g0 + g) * hd;
          sc[g] = scv[h * a.group + g0 + g];
        }
        auto run = [&](auto QT, auto DT) {
          constexpr int Q = decltype(QT)::value, D = decltype(DT)::value;
          constexpr int NK = Q == 1 ? 8 : 4;
          alignas(32) float ksc[8];
          int64_t j = jb;
          for (; j + NK <= je; j += NK) {
            const T* k = Kc + j * hu;
            if (i8) attn_row_scales(reinterpret_cast<const int8_t*>(k), rb, hd, ksc, NK);
            float* out[Q];
            for (int g = 0; g < Q; ++g) out[g] = sc[g] + j;
            attn2_scores<Q, NK, D>(q, k, hu, nd, i8 ? ksc : nullptr, a.softcap, out);
          }
          for (; j < je; ++j) {
            const T* k = Kc + j * hu;
            if (i8) attn_row_scales(reinterpret_cast<const int8_t*>(k), rb, hd, ksc, 1);
            float* out[Q];
            for (int g = 0; g < Q; ++g) out[g] = sc[g] + j;
            attn2_scores<Q, 1, D>(q, k, hu, nd, i8 ? ksc : nullptr, a.softcap, out);
          }
        };
        using I1 = std::integral_constant<int, 1>; using I2 = std::integral_constant<int, 2>;
        using I3 = std::integral_constant<int, 3>; using I4 = std::integral_constant<int, 4>;
        using D6 = std::integral_constant<int, 6>; using D0 = std::integral_constant<int, 0>;
        if (nd == 6) { if (k_ == 4) run(I4{}, D6{}); else if (k_ == 3) run(I3{}, D6{}); else if (k_ == 2) run(I2{}, D6{}); else run(I1{}, D6{}); }
        else { if (k_ == 4) run(I4{}, D0{}); else if (k_ == 3) run(I3{}, D0{}); else if (k_ == 2) run(I2{}, D0{}); else run(I1{}, D0{}); }
      });
    }
  }
  float scale[64];
  for (int64_t m = 0; m < nq; ++m) {
    float l;
    const float mx = attn2_softmax(scv[m] + L, n, &l);
    scale[m] = a.part ? 1.f : 1.f / l;
    if (a.part) { a.part[2 * m] = mx; a.part[2 * m + 1] = l; }
  }
  StreamPrefetch pv{reinterpret_cast<const char*>(V + b0 * bs), (b1 - b0) * bs * (int64_t)sizeof(T)};
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t jb = std::max(L, b * B), je = std::min(H, b * B + B);
    for (int64_t h = 0; h < a.nkv; ++h) {
      const T* Vc = V + b * bs + h * cs - b * B * hu;
      pv.issue(((b - b0) * bs + h * cs + (je - b * B) * hu) * (int64_t)sizeof(T) + kPmAhead);
      if (i8) attn_row_scales(reinterpret_cast<const int8_t*>(Vc + jb * hu), rb, hd, vsc, je - jb);
      attn_fuse_runs<4>((int)a.group, [&](int g0, int k_) {
        const float* w[4];
        float* am[4];
        float* o[4];
        for (int g = 0; g < k_; ++g) {
          const int64_t m = h * a.group + g0 + g;
          w[g] = scv[m];
          am[g] = accb + m * hd;
          o[g] = a.out + m * hd;
        }
        const float* sc4 = scale + h * a.group + g0;
        const bool first = jb == L, last = je == H;
        const float* vs_ = i8 ? vsc : nullptr;
        attn_values_run(k_, Vc, hu, nd, jb, je, w, vs_, am, first, last, sc4, o);
      });
    }
  }
}
inline void attn_blocked(const AttnRows& a, int64_t B) { attn_blocked_t<uint16_t>(a, B); }

// ---- head-major, software-pipelined across heads (PIPE=C): decode, MHA (one query a kv head), f16, the heads of a
// task; head h's values summed beside head h + 1's scores, C positions of each in turn, so two streams (K of this head
// on into the next's, V likewise) are read at once, each with its own prefetch PIPEAHEAD bytes ahead. The same
// per-key and per-position operations as the installed kernel, so its bits.
struct SegsPrefetch {  // equal-length segments read in order; issue(upto): every line up to byte `upto` of the stream
  std::vector<const char*> seg;
  int64_t len = 0, s = 0, off = 0;
  void issue(int64_t upto) {
    while (s < (int64_t)seg.size()) {
      const int64_t stop = std::min(len, upto - s * len);
      for (; off < stop; off += 64) _mm_prefetch(seg[s] + off, _MM_HINT_T0);
      if (off < len) return;
      ++s;
      off = 0;
    }
  }
};
inline void attn_pipelined(const float* q, float* out, const uint16_t* const* Kh, const uint16_t* const* Vh, int n,
                           int64_t hd, int64_t L, int64_t H, int64_t C, int64_t ahead) {
  const int64_t nd = hd / 16, rb = hd * 2, len = H - L, seglen = len * rb;
  thread_local std::vector<float> buf;
  if ((int64_t)buf.size() < 2 * len + hd + 16) buf.resize(2 * len + hd + 16);
  float* scb[2] = {buf.data(), buf.data() + len};
  float* acc = buf.data() + 2 * len;
  float scale[2] = {1.f, 1.f};
  SegsPrefetch pk, pv;
  pk.len = pv.len = seglen;
  for (int h = 0; h < n; ++h) {
    pk.seg.push_back(reinterpret_cast<const char*>(Kh[h] + L * hd));
    pv.seg.push_back(reinterpret_cast<const char*>(Vh[h] + L * hd));
  }
  auto scores = [&](int h, int64_t k0, int64_t k1) {
    const float* qq[1] = {q + h * hd};
    int64_t j = k0;
    for (; j + 8 <= k1; j += 8) {
      pk.issue(h * seglen + (j + 8 - L) * rb + ahead);
      float* o1[1] = {scb[h & 1] + (j - L)};
      if (nd == 6) attn2_scores<1, 8, 6>(qq, Kh[h] + j * hd, hd, nd, nullptr, 0.f, o1);
      else attn2_scores<1, 8, 0>(qq, Kh[h] + j * hd, hd, nd, nullptr, 0.f, o1);
    }
    for (; j < k1; ++j) {
      pk.issue(h * seglen + (j + 1 - L) * rb + ahead);
      float* o1[1] = {scb[h & 1] + (j - L)};
      if (nd == 6) attn2_scores<1, 1, 6>(qq, Kh[h] + j * hd, hd, nd, nullptr, 0.f, o1);
      else attn2_scores<1, 1, 0>(qq, Kh[h] + j * hd, hd, nd, nullptr, 0.f, o1);
    }
  };
  auto softmax = [&](int h) {
    float l;
    attn2_softmax(scb[h & 1], len, &l);
    scale[h & 1] = 1.f / l;
  };
  auto values = [&](int h, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; j += 4) pv.issue(h * seglen + (j + 4 - L) * rb + ahead);
    const float* w[1] = {scb[h & 1] - L};
    float* am[1] = {acc};
    float* o[1] = {out + h * hd};
    attn2_values_blk_all<1>(Vh[h], hd, nd, j0, j1, w, nullptr, am, j0 == L, j1 == H, &scale[h & 1], o);
  };
  scores(0, L, H);
  softmax(0);
  for (int h = 1; h < n; ++h) {
    for (int64_t c = L; c < H; c += C) {
      scores(h, c, std::min(c + C, H));
      values(h - 1, c, std::min(c + C, H));
    }
    softmax(h);
  }
  values(n - 1, L, H);
}
}  // namespace lowbit::ops_probe

using namespace lowbit;

// HUGE=1: the K/V on transparent huge pages (a private mapping, MADV_HUGEPAGE), as the model's cache (stop 38)
static void* kv_alloc(size_t n) {
  if (!getenv("HUGE")) return aligned_alloc(4096, n);
  const size_t h = 2 << 20;
  void* p = mmap(nullptr, (n + h - 1) / h * h, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  madvise(p, (n + h - 1) / h * h, MADV_HUGEPAGE);
  return p;
}

int main(int argc, char** argv) {
  // GQA or other shapes: PL layers, PH kv heads, PG queries a kv head, PHD head dim, PPOS the query's position
  // (bitnet-2b: PL=30 PH=5 PG=4 PHD=128)
  auto env = [](const char* k, int d) { return getenv(k) ? atoi(getenv(k)) : d; };
  const int L = env("PL", 24), H = env("PH", 16), G = env("PG", 1), hd = env("PHD", 96), pos = env("PPOS", 160);
  const int ctx = argc > 1 ? atoi(argv[1]) : 168;
  const bool in_cache = argc > 2 && atoi(argv[2]);
  const int mis = getenv("MISALIGN") ? atoi(getenv("MISALIGN")) : 0;
  static const OpsTable variant = ops_probe::table();
  const OpsTable& ops = getenv("VARIANT") ? variant : active_kernels().ops;
  std::mt19937 rng(0);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t n = (size_t)H * ctx * hd;
  std::vector<uint16_t*> K(L), V(L);
  for (int l = 0; l < L; ++l) {
    K[l] = (uint16_t*)((char*)kv_alloc(n * 2 + 4096) + mis);
    V[l] = (uint16_t*)((char*)kv_alloc(n * 2 + 4096) + mis);
    for (size_t i = 0; i < n; ++i) K[l][i] = _cvtss_sh(nd(rng), 0);
    for (size_t i = 0; i < n; ++i) V[l][i] = _cvtss_sh(nd(rng), 0);
  }
  const bool pm = getenv("PM") != nullptr;
  std::vector<uint16_t*> KP(L), VP(L);
  if (pm)
    for (int l = 0; l < L; ++l) {
      KP[l] = (uint16_t*)kv_alloc(n * 2 + 4096);
      VP[l] = (uint16_t*)kv_alloc(n * 2 + 4096);
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < ctx; ++j)
          for (int d = 0; d < hd; ++d) {
            KP[l][((size_t)j * H + h) * hd + d] = K[l][((size_t)h * ctx + j) * hd + d];
            VP[l][((size_t)j * H + h) * hd + d] = V[l][((size_t)h * ctx + j) * hd + d];
          }
    }
  const int BL = getenv("BLK") ? atoi(getenv("BLK")) : 0;
  const int pipe = getenv("PIPE") ? atoi(getenv("PIPE")) : 0, pipe_ahead = getenv("PIPEAHEAD") ? atoi(getenv("PIPEAHEAD")) : 4096;
  std::vector<uint16_t*> KB(L), VB(L);
  if (BL)
    for (int l = 0; l < L; ++l) {
      const size_t nb = (ctx + BL - 1) / BL;
      KB[l] = (uint16_t*)kv_alloc(nb * H * BL * hd * 2 + 4096);
      VB[l] = (uint16_t*)kv_alloc(nb * H * BL * hd * 2 + 4096);
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < ctx; ++j)
          for (int d = 0; d < hd; ++d) {
            const size_t at = (((size_t)(j / BL) * H + h) * BL + j % BL) * hd + d;
            KB[l][at] = K[l][((size_t)h * ctx + j) * hd + d];
            VB[l][at] = V[l][((size_t)h * ctx + j) * hd + d];
          }
    }
  std::vector<float> q(H * G * hd), out(H * G * hd);
  const float qs = getenv("PQS") ? atof(getenv("PQS")) : 0.1f;  // the queries' scale (their scores' spread)
  for (auto& x : q) x = qs * nd(rng);
  std::vector<char> flush(64 << 20, 1);
  const int64_t lo = 0, hi = pos + 1;
  // PNH kv heads a task (the tile prefetch runs on into the next head within a task; the driver: n_kv / (2 T));
  // PSTREAM MB of other memory read before each layer, untimed (a model streams its weights between attentions)
  const int nh = env("PNH", 8), stream_mb = env("PSTREAM", 0), prep_write = env("PWRITE", 0);  // PWRITE=1: see below
  std::vector<char> other((size_t)std::max(1, stream_mb) << 20 << 3, 1);
  size_t other_at = 0;
  double best = 1e9;
  for (int rep = 0; rep < env("PREPS", 9); ++rep) {
    volatile long sink = 0;
    if (!in_cache)
      for (size_t i = 0; i < flush.size(); i += 64) sink += flush[i];
    double elapsed = 0;
    for (int l = 0; l < L; ++l) {
      if (stream_mb && !in_cache && getenv("PSTREAMK")) {  // the GEMV's read kernel (its prefetch) instead
        const size_t nb = (size_t)stream_mb << 20;
        if (other_at + nb > other.size()) other_at = 0;
        sink += (long)active_kernels().read(reinterpret_cast<const uint8_t*>(other.data()) + other_at, (int64_t)nb);
        other_at += nb;
      } else if (stream_mb && !in_cache) {
        __m512i acc = _mm512_setzero_si512();
        for (size_t i = 0; i < ((size_t)stream_mb << 20); i += 64, other_at = (other_at + 64) % other.size())
          acc = _mm512_xor_si512(acc, _mm512_loadu_si512(other.data() + other_at));
        sink += _mm_cvtsi128_si64(_mm512_castsi512_si128(acc));
      }
      const auto t0 = std::chrono::steady_clock::now();
      if (pipe) {
        const int ll = in_cache ? 0 : l;
        for (int h0 = 0; h0 < H; h0 += nh) {
          const int m = std::min(nh, H - h0);
          std::vector<const uint16_t*> kh(m), vh(m);
          for (int i = 0; i < m; ++i) {
            const int hh = in_cache ? (h0 + i) % 4 : h0 + i;
            kh[i] = K[ll] + (size_t)hh * ctx * hd;
            vh[i] = V[ll] + (size_t)hh * ctx * hd;
          }
          ops_probe::attn_pipelined(q.data() + h0 * hd, out.data() + h0 * hd, kh.data(), vh.data(), m, hd, lo, hi, pipe,
                                    pipe_ahead);
        }
      } else if (BL) {
        const int ll = in_cache ? 0 : l;
        ops_probe::AttnRows r{};
        r.q = q.data(); r.out = out.data(); r.K = KB[ll]; r.V = VB[ll]; r.nkv = H; r.group = G; r.hd = hd;
        r.kv = KvType::kF16; r.lo = lo; r.hi = hi;
        ops_probe::attn_blocked(r, BL);
      } else if (pm) {
        const int ll = in_cache ? 0 : l;
        for (int h0 = 0; h0 < H; h0 += nh) {
          ops_probe::AttnRows r{};
          r.q = q.data() + h0 * G * hd;
          r.out = out.data() + h0 * G * hd;
          r.K = KP[ll] + h0 * hd;
          r.V = VP[ll] + h0 * hd;
          r.rs = (int64_t)H * hd * 2;
          r.nkv = std::min(nh, H - h0);
          r.group = G;
          r.hd = hd;
          r.kv = KvType::kF16;
          r.lo = lo;
          r.hi = hi;
          ops_probe::attn_rows(r);
        }
      } else
      for (int h = 0; h < H; ++h) {
        const int ll = in_cache ? 0 : l, hh = in_cache ? h % 4 : h;
        AttnBlock b{};
        b.q = q.data() + hh * G * hd;
        b.out = out.data() + hh * G * hd;
        b.rows = 1;
        b.group = G;
        b.row_stride = H * G * hd;
        b.hd = hd;
        b.lo = &lo;
        b.hi = &hi;
        b.K = K[ll] + (size_t)hh * ctx * hd;
        b.V = V[ll] + (size_t)hh * ctx * hd;
        b.kv = KvType::kF16;
        if (h % nh != nh - 1 && h + 1 < H && !in_cache) {
          b.next_K = K[ll] + (size_t)(hh + 1) * ctx * hd;
          b.next_V = V[ll] + (size_t)(hh + 1) * ctx * hd;
          b.next_hi = hi;
        }
        if (prep_write) {  // the decoder's prep: this step's K/V rows written (float16) right before the head's attention
          ops.f32_to_f16_row(q.data(), K[ll] + ((size_t)hh * ctx + pos) * hd, hd);
          ops.f32_to_f16_row(q.data(), V[ll] + ((size_t)hh * ctx + pos) * hd, hd);
        }
        ops.attn_block(b);
      }
      elapsed += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    const double us = elapsed / (L * H);
    if (us < best) best = us;
  }
  if (pipe) {  // bits against the installed kernel, layer 0, all heads in one task
    std::vector<float> o2(out.size());
    std::vector<const uint16_t*> kh(H), vh(H);
    for (int h = 0; h < H; ++h) {
      AttnBlock b{};
      b.q = q.data() + h * G * hd; b.out = o2.data() + h * G * hd; b.rows = 1; b.group = G; b.row_stride = H * G * hd;
      b.hd = hd; b.lo = &lo; b.hi = &hi; b.K = K[0] + (size_t)h * ctx * hd; b.V = V[0] + (size_t)h * ctx * hd; b.kv = KvType::kF16;
      active_kernels().ops.attn_block(b);
      kh[h] = K[0] + (size_t)h * ctx * hd;
      vh[h] = V[0] + (size_t)h * ctx * hd;
    }
    ops_probe::attn_pipelined(q.data(), out.data(), kh.data(), vh.data(), H, hd, lo, hi, pipe, pipe_ahead);
    int bad = 0;
    for (size_t i = 0; i < out.size(); ++i) bad += memcmp(&out[i], &o2[i], 4) != 0;
    printf("bits: %d of %zu differ\n", bad, out.size());
  }
  if (BL || pm) {  // the prototypes' bits against the head-major kernel on the same data (layer 0)
    std::vector<float> o2(out.size());
    for (int h = 0; h < H; ++h) {
      AttnBlock b{};
      b.q = q.data() + h * G * hd; b.out = o2.data() + h * G * hd; b.rows = 1; b.group = G; b.row_stride = H * G * hd;
      b.hd = hd; b.lo = &lo; b.hi = &hi; b.K = K[0] + (size_t)h * ctx * hd; b.V = V[0] + (size_t)h * ctx * hd; b.kv = KvType::kF16;
      active_kernels().ops.attn_block(b);
    }
    for (int h0 = 0; h0 < H; h0 += BL ? H : nh) {
      ops_probe::AttnRows r{};
      r.q = q.data() + h0 * G * hd; r.out = out.data() + h0 * G * hd; r.group = G; r.hd = hd; r.kv = KvType::kF16;
      r.lo = lo; r.hi = hi;
      if (BL) {
        r.K = KB[0]; r.V = VB[0]; r.nkv = H;
        ops_probe::attn_blocked(r, BL);
      } else {
        r.K = KP[0] + h0 * hd; r.V = VP[0] + h0 * hd; r.rs = (int64_t)H * hd * 2; r.nkv = std::min(nh, H - h0);
        ops_probe::attn_rows(r);
      }
    }
    int bad = 0;
    for (size_t i = 0; i < out.size(); ++i) bad += memcmp(&out[i], &o2[i], 4) != 0;
    printf("bits: %d of %zu differ\n", bad, out.size());
  }
  printf("%s%s, ctx %d, %s: %.2f us per kv head (%.1f GB/s of K/V)\n", pipe ? "PIPE " : BL ? "BLK " : pm ? "PM " : "", getenv("VARIANT") ? "variant" : "installed", ctx,
         in_cache ? "in cache" : "from DRAM", best, 2.0 * hi * hd * 2 / best / 1e3);
}
