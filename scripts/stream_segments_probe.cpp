// Read rate of short streams with gaps between them (stop 41): the decode attention's K/V pattern without its
// compute. Per layer 16 "heads", each a segment of S bytes read from buffer K and then one from buffer V (mode 0; 1: K
// only; 2: the heads in reverse order; 3: head h's V beside head h + 1's K, 1.5 KB of each in turn), head h's segment
// at h * STRIDE; a T0 (HINT 0; 1 T1, 2 NTA, 3 prefetchw)
// software prefetch D bytes ahead runs along the sequence of segments, as the attention's AttnPrefetch does; TOUCH > 0
// demand-loads each segment's first TOUCH lines when the prefetch reaches them instead. 24 layers, the L3 flushed
// before each of 7 passes, best pass:
//   g++ -O3 -march=native scripts/stream_segments_probe.cpp -o /tmp/seg
//   taskset -c 0 /tmp/seg S D [STRIDE [MODE [TOUCH [HINT]]]]
// Zen 5, 1 thread (docs/decode.md, stop 41): S = 30 KB (bitnet-0.7b's heads at 160 positions) with STRIDE = S (the
// heads back to back) 38-44 GB/s; STRIDE = S + 4 KB or anything larger 26-31 GB/s; reversed back-to-back heads 32-37;
// 480 KB segments 34-38; no prefetch hint, distance (4-24 KB), demand touches or T1 recovered the gap; mode 3 (two
// streams at once) 29.9-32.5 against mode 0's 25.9-30.5 and back-to-back's 39-46 in 6 alternating rounds.
#include <immintrin.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
static char* halloc(size_t n) {
  const size_t h = 2 << 20; n = (n + h - 1) / h * h;
  char* p = (char*)mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  madvise(p, n, MADV_HUGEPAGE); memset(p, 1, n); return p;
}
// One sequence of segments read in order with its own prefetch D bytes ahead (mode 3's two streams).
struct SegStream {
  std::vector<const char*> seg;
  long S, D;
  size_t cs = 0, ps = 0;
  long co = 0, po = 0;
  __m512i acc = _mm512_setzero_si512();
  bool done() const { return cs >= seg.size(); }
  void read(long bytes) {  // up to `bytes` more of the current segment
    const long end = std::min(S, co + bytes);
    for (; co < end; co += 256) {
      long need = co + 256 + D;
      size_t t = cs;
      while (t < seg.size() && need >= S) { need -= S; ++t; }
      while (ps < seg.size() && (ps < t || (ps == t && po < need))) {
        _mm_prefetch(seg[ps] + po, _MM_HINT_T0);
        if ((po += 64) >= S) { po = 0; ++ps; }
      }
      for (int k = 0; k < 4; ++k) acc = _mm512_xor_si512(acc, _mm512_loadu_si512(seg[cs] + co + 64 * k));
    }
    if (co >= S) { co = 0; ++cs; }
  }
};

int main(int argc, char** argv) {
  const long S = atol(argv[1]) , D = atol(argv[2]), stride = argc > 3 ? atol(argv[3]) : 393216;
  const int mode = argc > 4 ? atoi(argv[4]) : 0;
  const int touch = argc > 5 ? atoi(argv[5]) : 0;  // demand-load the first `touch` lines of each segment (at prefetch time)
  const int hint = argc > 6 ? atoi(argv[6]) : 0;
  __m512i touch_acc = _mm512_setzero_si512();  // 0: K seg, V seg per head; 1: K only
  const long total_per_layer = 16L * 2 * S;
  const int layers = 24;
  std::vector<char*> Kb(layers), Vb(layers);
  for (int l = 0; l < layers; ++l) { Kb[l] = halloc(16 * stride); Vb[l] = halloc(16 * stride); }
  std::vector<char> flush(64 << 20, 1);
  double best = 1e9;
  for (int rep = 0; rep < 7; ++rep) {
    volatile long sink = 0;
    for (size_t i = 0; i < flush.size(); i += 64) sink += flush[i];
    // sequence of segments
    auto t0 = std::chrono::steady_clock::now();
    __m512i acc = _mm512_setzero_si512();
    for (int l = 0; l < layers; ++l) {
      if (mode == 3) {  // head h's V read beside head h + 1's K, 1.5 KB of each in turn (a two-pass attention pipelined
                        // across heads), each stream with its own prefetch D / 2 ahead
        SegStream k{{}, S, D / 2}, v{{}, S, D / 2};
        for (int h = 0; h < 16; ++h) {
          k.seg.push_back(Kb[l] + h * stride);
          v.seg.push_back(Vb[l] + h * stride);
        }
        k.read(S);
        while (!v.done())
          for (long o = 0; o < S; o += 1536) {
            if (!k.done()) k.read(1536);
            v.read(1536);
          }
        acc = _mm512_xor_si512(acc, _mm512_xor_si512(k.acc, v.acc));
        continue;
      }
      std::vector<const char*> seg;
      for (int hi = 0; hi < 16; ++hi) { const int h = mode == 2 ? 15 - hi : hi; seg.push_back(Kb[l] + h * stride); if (mode != 1) seg.push_back(Vb[l] + h * stride); }
      // prefetch cursor
      size_t ps = 0; long po = 0; long ahead = D;  // prefetch position in (segment, offset)
      auto pf_upto = [&](size_t s, long off) {  // prefetch until cursor is D past (s, off)
        long need = off + D;
        size_t t = s;
        while (t < seg.size() && need > S) { need -= S; ++t; }
        while (ps < t || (ps == t && po < need && ps < seg.size())) {
          if (ps >= seg.size()) break;
          if (touch && po < touch * 64 && ps > 0) touch_acc = _mm512_xor_si512(touch_acc, _mm512_loadu_si512(seg[ps] + po));
          else if (hint == 0) _mm_prefetch(seg[ps] + po, _MM_HINT_T0);
          else if (hint == 1) _mm_prefetch(seg[ps] + po, _MM_HINT_T1);
          else if (hint == 2) _mm_prefetch(seg[ps] + po, _MM_HINT_NTA);
          else _mm_prefetch(seg[ps] + po, _MM_HINT_ET0);
          po += 64;
          if (po >= S) { po = 0; ++ps; }
        }
      };
      for (size_t s = 0; s < seg.size(); ++s)
        for (long off = 0; off < S; off += 256) {
          if (D > 0) pf_upto(s, off + 256);
          for (int k = 0; k < 4; ++k) acc = _mm512_xor_si512(acc, _mm512_loadu_si512(seg[s] + off + 64 * k));
        }
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    sink += _mm_cvtsi128_si64(_mm512_castsi512_si128(acc)) + _mm_cvtsi128_si64(_mm512_castsi512_si128(touch_acc));
    if (us < best) best = us;
  }
  const double bytes = (double)layers * 16 * (mode != 1 ? 2 : 1) * S;
  printf("S %6ld D %6ld stride %7ld mode %d: %.1f GB/s\n", S, D, stride, mode, bytes / best / 1e3);
}
