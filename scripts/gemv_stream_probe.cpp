// How much of the read roof a weight stream keeps when each 256 bytes also cost vector work: the ternary GEMV's
// op mix (per 64 bytes: 4 vpand + 4 vpdpbusd with a broadcast activation operand) scaled from 0 (loads only) to
// 2x the GEMV's, each thread streaming its own half of a 1 GiB buffer on huge pages, software prefetch 8 KiB
// ahead as the kernels do. Configurations alternate within one process (the host's bandwidth moves by the minute);
// medians of the rounds. Also the same mixes in L2 (ticks per 256 B: the compute alone).
//
//   g++ -O2 -std=c++17 -mavx512f -mavx512bw -mavx512vnni -pthread scripts/gemv_stream_probe.cpp -o /tmp/probe
//   /tmp/probe [threads=2] [rounds=8]
// Stop 28 (Xeon EMR, 2 vCPUs; two runs at 2 threads, one at 1): in L2, 1 thread, ticks per 256 B: loads only 4.6, the GEMV's mix 12.3,
// twice it 17.7. From DRAM, 2 threads: loads only 26.1 / 29.4 GB/s, the GEMV's mix 23.5 / 25.7 (90 % / 88 % of loads
// only), twice it 84 % / 81 %; 1 thread: loads only 15.4, the GEMV's mix 13.0 (85 %), twice it 87 %. The ternary
// kernel itself (pool or two raw threads over the same buffer, linked from the build) streamed 22-25 GB/s beside the
// mix's 20-22 in the same process: it keeps what its op count allows.
#include <immintrin.h>
#include <sys/mman.h>
#include <x86intrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

// acc += u8 x s8, the accumulator tied to one register (as kernels_avx512.cpp's dpbusd)
__attribute__((always_inline)) inline void dpbusd(__m512i& acc, __m512i u8, const int8_t* x4) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u8), "m"(*(const int32_t*)x4));
}

// REPS: how many times the GEMV's 4 x (vpand + vpdpbusd) run on each 64 bytes (0: loads only, folded by xor)
template <int REPS>
__m512i stream(const uint8_t* p, size_t n, const int8_t* x) {
  const __m512i z = _mm512_setzero_si512();
  __m512i a0 = z, a1 = z, a2 = z, a3 = z, b0 = z, b1 = z, b2 = z, b3 = z;
  const __m512i k0 = _mm512_set1_epi8(3), k1 = _mm512_set1_epi8(12), k2 = _mm512_set1_epi8(48),
                k3 = _mm512_set1_epi8((char)192);
  const uint8_t* last = p + n - 256;
  for (size_t c = 0; c < n; c += 256) {
    const uint8_t* ch = p + c;
    const uint8_t* pf = ch + 8192 < last ? ch + 8192 : last;
    for (int l = 0; l < 256; l += 64) _mm_prefetch((const char*)pf + l, _MM_HINT_T0);
    const int8_t* q = x + (c / 16) % 4096;
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const __m512i v = _mm512_loadu_si512(ch + 64 * t);
      if constexpr (REPS == 0) {
        a0 = _mm512_xor_si512(a0, v);
      } else {
#pragma GCC unroll 4
        for (int r = 0; r < REPS; ++r) {
          __m512i& c0 = (t + r) & 1 ? b0 : a0;
          __m512i& c1 = (t + r) & 1 ? b1 : a1;
          __m512i& c2 = (t + r) & 1 ? b2 : a2;
          __m512i& c3 = (t + r) & 1 ? b3 : a3;
          dpbusd(c0, _mm512_and_si512(v, k0), q);
          dpbusd(c1, _mm512_and_si512(v, k1), q + 4);
          dpbusd(c2, _mm512_and_si512(v, k2), q + 8);
          dpbusd(c3, _mm512_and_si512(v, k3), q + 12);
        }
      }
    }
  }
  return _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                          _mm512_add_epi32(_mm512_add_epi32(b0, b1), _mm512_add_epi32(b2, b3)));
}

using Fn = __m512i (*)(const uint8_t*, size_t, const int8_t*);
const Fn kFns[] = {stream<0>, stream<1>, stream<2>};
const char* kNames[] = {"loads only (the read roof's loop)", "the ternary GEMV's op mix", "twice the GEMV's op mix"};
constexpr int kN = 3;
volatile int g_sink;

}  // namespace

int main(int argc, char** argv) {
  const int T = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 8;
  const size_t len = size_t(1) << 30;
  auto* buf = (uint8_t*)mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) return 1;
  madvise(buf, len, MADV_HUGEPAGE);
  for (size_t i = 0; i < len; ++i) buf[i] = (uint8_t)((i * 2654435761u) >> 13) & 0x55;
  std::vector<int8_t> x(8192);
  for (int i = 0; i < 8192; ++i) x[i] = (int8_t)(i * 7);
  // in L2: 64 KiB, minimum of many passes, 1 thread
  for (int f = 0; f < kN; ++f) {
    uint64_t best = ~0ull;
    for (int r = 0; r < 3000; ++r) {
      const uint64_t t0 = __rdtsc();
      g_sink = _mm512_reduce_add_epi32(kFns[f](buf, 65536, x.data()));
      best = std::min<uint64_t>(best, __rdtsc() - t0);
    }
    printf("in L2, 1 thread   %-36s %6.1f TSC ticks per 256 B\n", kNames[f], best / 256.0);
  }
  std::vector<std::vector<double>> gbps(kN);
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < kN; ++i) {
      const int f = r % 2 ? kN - 1 - i : i;
      const auto now = std::chrono::steady_clock::now();
      std::vector<std::thread> th;
      for (int t = 1; t < T; ++t)
        th.emplace_back([&, t] { g_sink = _mm512_reduce_add_epi32(kFns[f](buf + len / T * t, len / T, x.data())); });
      g_sink = _mm512_reduce_add_epi32(kFns[f](buf, len / T, x.data()));
      for (auto& t : th) t.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - now).count();
      gbps[f].push_back(len / s / 1e9);
    }
  for (int f = 0; f < kN; ++f) {
    auto v = gbps[f];
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2], roof = [&] { auto w = gbps[0]; std::sort(w.begin(), w.end()); return w[w.size() / 2]; }();
    printf("from DRAM, %d thr  %-36s %6.1f GB/s median (%.1f-%.1f), %3.0f%% of loads only\n", T, kNames[f], med, v.front(),
           v.back(), 100 * med / roof);
  }
}
