// AMX-INT8 GEMM of every code width (N >= kAmxMinTokens = 8 tokens; groups a multiple of 32, those below 256 from
// 12 tokens, in slices of <= 32): the AVX-512 panel GEMM (gemm_panel_avx512.inc) with its token loop on the tile
// unit. Compiled with AMX target flags; dispatch uses it only where CPUID reports AMX-TILE + AMX-INT8 + GFNI and
// the kernel granted this process the tile state.
//
// The panel of a 64-row block and K slice, panel[step s][tile t][64] (rows 16t..16t+15 x k 4s..4s+3), is
// already the B operand of TDPBSUD: 16 consecutive steps of tile t are a B tile (16 rows of 64 bytes, stride
// 256). Per block of R <= 16 tokens, four C tiles (int32 [R tokens][16 rows], zeroed at a group's start, held
// or parked in the int32 sums between slices), and each 64 k of the slice is one A tile (R rows of the tokens'
// int8 activations, stride Kp) and four TDPBSUD (s8 activations x u8 codes): 64 x R x 64 MACs each, exact int32
// like vpdpbusd, so the group sums, the float step and the output bits are those of the AVX-512 kernels.
// Tiles: tmm0-3 C (one per 16-row tile), tmm4 A, tmm5-7 B (rotating). Each call loads its configuration and
// releases the tiles at its end; keeping the configuration across calls (thread_local) measured level in the
// batched step (scripts/step_ab.py, alternating builds).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common.h"
#include "dispatch.h"

namespace lowbit {
namespace {
#include "gemm_panel_avx512.inc"

// From 8 tokens (kComputeBoundRows: the step's GEMMs run in short runs of blocks). A 4-row batched step of
// bitnet-0.7b (scripts/step_ab.py --batch 4, 2 threads): GEMM 18.6 ms on the tiles vs 14.7 on AVX-512, 2.6 ms of
// it at the join (the long per-thread runs of N < 8); at 8 rows 17.5 vs 23.9, at 16 18.6 vs 30.7.
constexpr int64_t kAmxMinTokens = 8;
// Groups < kPanelMinGroup take tiles from 12 tokens, in passes of at most 32 tokens
constexpr int64_t kAmxSmallGroupTokens[2] = {12, 32};

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles for blocks of R tokens and KB steps (4 KB k) a TDPBSUD: C R x 64 bytes, A R x 4 KB bytes, B KB x 64.
inline void load_config(int R, int KB) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = t == 4 ? 4 * KB : 64;
    c.rows[t] = t < 5 ? (uint8_t)R : (uint8_t)KB;
  }
  _tile_loadconfig(&c);
}

// C tiles 0-3 to / from the int32 sums of 16 tokens x 64 rows (row stride 256 bytes).
inline void store_c(int32_t* c) {
  _tile_stored(0, c, 256);
  _tile_stored(1, c + 16, 256);
  _tile_stored(2, c + 32, 256);
  _tile_stored(3, c + 48, 256);
}
inline void load_c(const int32_t* c) {
  _tile_loadd(0, c, 256);
  _tile_loadd(1, c + 16, 256);
  _tile_loadd(2, c + 32, 256);
  _tile_loadd(3, c + 48, 256);
}

struct AmxSlice {
  // Steps a slice (a multiple of 16: a B tile). Measured at 32, 64, 128, 256 and 1024 (ternary, 1 thread,
  // N = 16 and 128): 64 is best; longer slices move the C tiles less often but read the panel from L2.
  static constexpr int kSteps = 64;
  static constexpr bool kGfni = true;       // every AMX CPU has GFNI (has_amx checks it)
  static constexpr bool kDirect8 = true;     // tile loads take any address: 8-bit codes read as packed
  static constexpr int64_t kTileTokens = 0;  // the last slice in one call (not measured a tile at a time on AMX)
  // The loaded tile configuration (R * 64 + KB), 0 for none: set by the first block of each call.
  int* config;
  void operator()(const uint8_t* panel, const int8_t* q, int64_t nt, int64_t kp, int64_t steps,
                  int32_t (*acc32)[kRowBlock], bool first, bool last) const {
    // One block of tokens (a batched decode step of <= 16 rows): its C tiles stay in the tile unit from the
    // group's first slice to its last, instead of going through acc32 at every slice.
    const bool hold = nt <= 16;
    const int KB = steps % 16 == 0 ? 16 : 8;  // groups of 32: 8 steps a TDPBSUD
    for (int64_t n0 = 0; n0 < nt; n0 += 16) {
      const int R = (int)std::min<int64_t>(16, nt - n0);
      int32_t* c = acc32[n0];
      const bool held = hold && !first;  // the group's sums so far are in C tiles 0-3
      if (R * 64 + KB != *config) {
        // a new configuration clears the tiles: held sums go through acc32 (a group of 64 + 8 steps, say)
        if (held) store_c(c);
        load_config(R, KB);
        *config = R * 64 + KB;
        if (held) load_c(c);
      }
      if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      } else if (!hold) {
        load_c(c);
      }
      const int8_t* qa = q + n0 * kp;
      for (int64_t s = 0; s < steps; s += KB) {
        const uint8_t* b = panel + s * 256;
        _tile_loadd(4, qa + 4 * s, kp);
        _tile_loadd(5, b, 256);
        _tile_dpbsud(0, 4, 5);
        _tile_loadd(6, b + 64, 256);
        _tile_dpbsud(1, 4, 6);
        _tile_loadd(7, b + 128, 256);
        _tile_dpbsud(2, 4, 7);
        _tile_loadd(5, b + 192, 256);
        _tile_dpbsud(3, 4, 5);
      }
      if (last || !hold) store_c(c);  // the group's sums so far (all of them at its last slice)
    }
  }
};

template <int BITS>
void gemm_amx_bits(const IntWeights& w, const ActQ& a, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  int config = 0;  // no configuration loaded yet in this call
  gemm_panel512<BITS>(w, a, y, ldy, b0, b1, AmxSlice{&config});
  if (config) _tile_release();  // the thread holds no tile state between calls (nothing for context switches)
}

void gemm_int_amx(const IntWeights& w, const ActQ& a, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  // Groups below kPanelMinGroup: the float step of every group goes through memory for every token, which
  // block_int (AVX-512) keeps in registers; the tiles win where a pass's sums stay in L1, 12-32 tokens. Same build,
  // 1 thread, in cache, AMX / AVX-512 at N = 4, 16, 128 in one pass (1536x4096, 4096x1536, 2560x6912): int8 (groups
  // of 32) 0.5-0.7 / 1.2-1.4 / 0.75-0.85x, int4 (32) 0.5 / 1.3-1.4 / 0.7-0.8x, int2 (64) 0.65-0.75 / 1.6-1.7 /
  // 1.1-1.25x. So more tokens go as slices of <= 32 (stop 32: N = 64 and 128, bitnet-2b shapes, 1 thread, in cache,
  // against block_int: int4 and int8 1.0-2.5x, int2 1.6-2.8x; the prefill of SmolLM2's int4 GGUF 1.2-1.4x).
  const bool small = w.group < kPanelMinGroup;
  if (a.N < kAmxMinTokens || w.group % 32 != 0 || (small && a.N < kAmxSmallGroupTokens[0])) {
    kernels_avx512().gemm_int(w, a, y, ldy, b0, b1);
    return;
  }
  auto run = [&](const ActQ& s, float* ys) {
    switch (w.bits) {
      case 1: gemm_amx_bits<1>(w, s, ys, ldy, b0, b1); break;
      case 2: gemm_amx_bits<2>(w, s, ys, ldy, b0, b1); break;
      case 4: gemm_amx_bits<4>(w, s, ys, ldy, b0, b1); break;
      case 8: gemm_amx_bits<8>(w, s, ys, ldy, b0, b1); break;
    }
  };
  if (!small || a.N <= kAmxSmallGroupTokens[1]) return run(a, y);
  // Small groups, more tokens than a pass keeps in L1: equal slices of <= 32 tokens, each a pass of its own over the
  // task's rows (their codes are in L2 after the first), since a row's bits do not depend on the other tokens.
  const int64_t slices = (a.N + kAmxSmallGroupTokens[1] - 1) / kAmxSmallGroupTokens[1];
  for (int64_t i = 0, t0 = 0; i < slices; ++i) {
    const int64_t t1 = a.N * (i + 1) / slices;
    const ActQ s{a.q + t0 * a.Kp, a.scale + t0 * a.G, a.sum ? a.sum + t0 * a.G : nullptr, t1 - t0, a.Kp, a.group, a.G};
    run(s, y + t0 * ldy);
    t0 = t1;
  }
}

}  // namespace

// The AMX roof probe (roof.h): 4 independent TDPBSUD a iteration (C tiles 0-3 from A tiles 4-5 x B tiles
// 6-7, all 16 x 64 bytes, loaded once), 4 x 16 x 16 x 64 = 65536 MACs.
uint64_t roof_probe_amx(int64_t iters) {
  load_config(16, 16);
  alignas(64) static const int8_t ops[16 * 64] = {1, 2, 3};
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ops, 64);
  _tile_loadd(5, ops, 64);
  _tile_loadd(6, ops, 64);
  _tile_loadd(7, ops, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    _tile_dpbsud(2, 5, 6);
    _tile_dpbsud(3, 5, 7);
  }
  alignas(64) int32_t out[16 * 16];
  _tile_stored(0, out, 64);  // keeps the chain live
  __asm__ volatile("" : : "r"(out) : "memory");
  _tile_release();
  return (uint64_t)iters * 4 * 16 * 16 * 64;
}

bool amx_tile_permission() {
  // Linux: the tile data state is off (XFD) until the process asks for it; granted once for all its threads.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

const KernelTable& kernels_amx() {
  static const KernelTable t = [] {
    KernelTable k = kernels_avx512();
    k.name = "amx";
    k.gemm_int = gemm_int_amx;
    return k;
  }();
  return t;
}

}  // namespace lowbit
