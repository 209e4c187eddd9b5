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
// sequential stream, their kernels compiled into this probe (scripts/attn_layout_protos.inc): position-major (row j holds every kv head's
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

#include "attn_layout_protos.inc"
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
