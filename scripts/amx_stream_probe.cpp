// Does the 16-row AMX GEMM's weight stream overlap its tile phase? A standalone probe of gemm_amx.cpp's loop
// (ternary codes unpacked by GFNI into a 16 KB panel per 64-row block and 64-step slice, then 16 TDPBSUD of 16
// tokens), with the codes streamed from DRAM (a buffer well past the L3), on 1 or 2 threads, TSC cycles a slice.
//   g++ -O2 -march=sapphirerapids -pthread -o /tmp/amx_stream_probe scripts/amx_stream_probe.cpp && /tmp/amx_stream_probe 2
// Variants:
//   mem      the codes read and xor-ed, nothing else: the stream rate a core gets
//   unpack   the unpack alone (stores into the panel)
//   tiles    the tile phase alone (a fixed panel)
//   serial   unpack, then tiles (the kernel's order)
//   pfU<D>   serial, prefetcht2 of slice i+D spread over the unpack (4 lines a chunk: the kernel, D = 2)
//   pfT<D>   serial, prefetcht2 of slice i+D spread over the tile phase (4 lines a TDPBSUD)
//   pf0T<D>  the same with prefetcht0
//   pipe     the unpack of slice i+1 (other panel) interleaved with slice i's TDPBSUDs
// Stop 26 (Xeon, EMR, 2 GB of codes; TSC cycles a slice, two rounds at 1 thread, three at 2):
//   1 thread:  mem 603-794, unpack 874-1026, tiles 244-250, serial 1270-1406, pfU2 (the kernel) 956-992,
//              pfT1/2/4 1046-1707, pf0T1/2 1083-1200, pipe 1055-1074
//   2 threads: mem 595-809, unpack 885-1218, tiles 336-1046 (the host: no memory in it), serial 1914-2926,
//              pfU2 1020-2403, pfT 1081-1960, pipe 1069-2053
// At 1 thread the kernel's order (pfU2) already runs at the unpack's own speed: the tile phase is hidden under
// the stream, and neither a prefetch over the tile phase nor the pipelined unpack beats it. What stays is the
// unpack's own work (256 GFNI / AND and 256 stores a slice, ~250 cycles from L2) overlapping the stream only in
// part (unpack 874-1026 against 603-794 for the loads alone).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

constexpr int64_t kSlice = 4096;  // bytes of 2-bit codes a slice: 64 rows x 256 k
constexpr int64_t kKp = 4096;     // activations row stride

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

static void config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

static constexpr uint64_t field(int j) {
  uint64_t m = 0;
  for (int i = 0; i < 2; ++i) m |= (uint64_t)(1u << (j * 2 + i)) << (8 * (7 - i));
  return m;
}

// chunk c (4 lines) of a slice -> panel[(4c + j) * 256 + 64 t]
static inline void unpack_chunk(const uint8_t* src, uint8_t* panel, int c) {
  const __m512i mask = _mm512_set1_epi8(3);
  uint8_t* d = panel + c * 4 * 256;
  for (int t = 0; t < 4; ++t) {
    const __m512i v = _mm512_loadu_si512(src + c * 256 + 64 * t);
    _mm512_store_si512((__m512i*)(d + 64 * t), _mm512_and_si512(v, mask));
    _mm512_store_si512((__m512i*)(d + 256 + 64 * t), _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(field(1)), 0));
    _mm512_store_si512((__m512i*)(d + 512 + 64 * t), _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(field(2)), 0));
    _mm512_store_si512((__m512i*)(d + 768 + 64 * t), _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(field(3)), 0));
  }
}

static inline void tdp4(const uint8_t* panel, const int8_t* qa, int s) {
  const uint8_t* b = panel + s * 256;
  _tile_loadd(4, qa + 4 * s, kKp);
  _tile_loadd(5, b, 256);
  _tile_dpbsud(0, 4, 5);
  _tile_loadd(6, b + 64, 256);
  _tile_dpbsud(1, 4, 6);
  _tile_loadd(7, b + 128, 256);
  _tile_dpbsud(2, 4, 7);
  _tile_loadd(5, b + 192, 256);
  _tile_dpbsud(3, 4, 5);
}

enum Kind { MEM, UNPACK, TILES, SERIAL, PFU, PFT, PF0T, PIPE };

static double run(Kind kind, int D, const uint8_t* codes, int64_t nslices, int8_t* acts, uint8_t* panels) {
  config();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  uint8_t* p0 = panels;
  uint8_t* p1 = panels + 16384;
  __m512i x = _mm512_setzero_si512();
  const uint64_t t0 = __rdtsc();
  for (int64_t i = 0; i < nslices; ++i) {
    const uint8_t* src = codes + i * kSlice;
    const uint8_t* pf = codes + std::min(i + D, nslices - 1) * kSlice;
    const int8_t* qa = acts + (i % 16) * 256;  // the slice's 256 k of the 16 tokens
    switch (kind) {
      case MEM:
        for (int l = 0; l < 64; ++l) x = _mm512_xor_si512(x, _mm512_load_si512(src + 64 * l));
        break;
      case UNPACK:
        for (int c = 0; c < 16; ++c) unpack_chunk(src, p0, c);
        break;
      case TILES:
        for (int s = 0; s < 64; s += 16) tdp4(p0, qa, s);
        break;
      case SERIAL:
      case PFU:
      case PFT:
      case PF0T:
        for (int c = 0; c < 16; ++c) {
          if (kind == PFU)
            for (int t = 0; t < 4; ++t) _mm_prefetch((const char*)pf + c * 256 + 64 * t, _MM_HINT_T2);
          unpack_chunk(src, p0, c);
        }
        for (int s = 0; s < 64; s += 16) {
          if (kind == PFT || kind == PF0T)
            for (int l = 0; l < 16; ++l) {
              if (kind == PFT) _mm_prefetch((const char*)pf + (s / 16) * 1024 + 64 * l, _MM_HINT_T2);
              else _mm_prefetch((const char*)pf + (s / 16) * 1024 + 64 * l, _MM_HINT_T0);
            }
          tdp4(p0, qa, s);
        }
        break;
      case PIPE: {
        // tiles of slice i from p0 while slice i + 1 is unpacked into p1, 4 chunks per group of 4 TDPBSUD
        const uint8_t* nx = codes + std::min(i + 1, nslices - 1) * kSlice;
        if (i == 0)
          for (int c = 0; c < 16; ++c) unpack_chunk(src, p0, c);
        for (int s = 0; s < 64; s += 16) {
          tdp4(p0, qa, s);
          for (int c = s / 4; c < s / 4 + 4; ++c) unpack_chunk(nx, p1, c);
        }
        std::swap(p0, p1);
        break;
      }
    }
  }
  const uint64_t t1 = __rdtsc();
  alignas(64) int32_t out[256];
  _tile_stored(0, out, 64);
  _mm512_store_si512(out, _mm512_xor_si512(x, _mm512_load_si512(out)));
  __asm__ volatile("" : : "r"(out) : "memory");
  _tile_release();
  return double(t1 - t0) / nslices;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 2;
  const int64_t mb = argc > 2 ? atoll(argv[2]) : 2048;  // past the 300 MB L3
  const int rounds = argc > 3 ? atoi(argv[3]) : 3;
  const std::string only = argc > 4 ? argv[4] : "";  // a comma-separated list of variants (default: all)
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    fprintf(stderr, "no AMX permission\n");
    return 1;
  }
  const int64_t bytes = mb << 20, per = bytes / threads / kSlice;
  uint8_t* codes = (uint8_t*)aligned_alloc(1 << 21, bytes);
  for (int64_t i = 0; i < bytes; i += 8) *(uint64_t*)(codes + i) = i * 0x9E3779B97F4A7C15ull;
  std::vector<int8_t*> acts(threads);
  std::vector<uint8_t*> panels(threads);
  for (int t = 0; t < threads; ++t) {
    acts[t] = (int8_t*)aligned_alloc(64, 16 * kKp);
    memset(acts[t], 1, 16 * kKp);
    panels[t] = (uint8_t*)aligned_alloc(64, 32768);
    memset(panels[t], 1, 32768);
  }
  struct V { const char* name; Kind k; int d; };
  const V vs[] = {{"mem", MEM, 0},     {"unpack", UNPACK, 0}, {"tiles", TILES, 0}, {"serial", SERIAL, 0},
                  {"pfU2", PFU, 2},    {"pfT1", PFT, 1},      {"pfT2", PFT, 2},    {"pfT4", PFT, 4},
                  {"pf0T1", PF0T, 1},  {"pf0T2", PF0T, 2},    {"pipe", PIPE, 0}};
  printf("%d thread(s), %lld MB of codes, %lld slices a thread; TSC cycles a slice (4 KB of codes, 16K weights x 16 "
         "tokens), per round\n", threads, (long long)mb, (long long)per);
  for (int r = 0; r < rounds; ++r) {
    for (const V& v : vs) {
      if (!only.empty() && ("," + only + ",").find("," + std::string(v.name) + ",") == std::string::npos) continue;
      std::vector<double> c(threads);
      std::vector<std::thread> th;
      for (int t = 0; t < threads; ++t)
        th.emplace_back([&, t] { c[t] = run(v.k, v.d, codes + t * per * kSlice, per, acts[t], panels[t]); });
      for (auto& x : th) x.join();
      double m = 0;
      for (double y : c) m = std::max(m, y);
      printf("  %-7s %7.0f", v.name, m);
      fflush(stdout);
    }
    printf("\n");
  }
  return 0;
}
