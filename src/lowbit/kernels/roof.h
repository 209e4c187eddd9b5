// The int8 compute roof: the highest rate of u8 x s8 multiply-accumulates this core reaches in
// registers, with the instructions the integer kernels use (AVX2: vpmaddubsw + vpaddw; AVX-VNNI /
// AVX-512: vpdpbusd; AMX: tdpbsud; scalar: a plain C++ loop as the scalar kernels compile). Prefill is
// compared to it.
#pragma once
#include <cstdint>

// asm text shared by the probes: the 12 accumulators (xmm0-11; a VEX vpxor zeroes the whole ymm/zmm) start
// at zero, and every probe clobbers the 16 vector registers it names.
#define LOWBIT_ROOF_ZERO_ACCUMULATORS                                                                  \
  "vpxor %%xmm0, %%xmm0, %%xmm0\n\tvpxor %%xmm1, %%xmm1, %%xmm1\n\tvpxor %%xmm2, %%xmm2, %%xmm2\n\t"       \
  "vpxor %%xmm3, %%xmm3, %%xmm3\n\tvpxor %%xmm4, %%xmm4, %%xmm4\n\tvpxor %%xmm5, %%xmm5, %%xmm5\n\t"       \
  "vpxor %%xmm6, %%xmm6, %%xmm6\n\tvpxor %%xmm7, %%xmm7, %%xmm7\n\tvpxor %%xmm8, %%xmm8, %%xmm8\n\t"       \
  "vpxor %%xmm9, %%xmm9, %%xmm9\n\tvpxor %%xmm10, %%xmm10, %%xmm10\n\tvpxor %%xmm11, %%xmm11, %%xmm11\n\t"
#define LOWBIT_ROOF_CLOBBERS                                                                               \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
      "xmm13", "xmm14", "xmm15", "cc"

namespace lowbit {

// Runs `iters` iterations of one ISA's probe on the calling thread; returns the MACs done.
// Each iteration is a fixed number of independent dot-product instructions (enough accumulator chains
// to hide the instruction latency), operands in registers, nothing loaded or stored.
using RoofProbe = uint64_t (*)(int64_t iters);
uint64_t roof_probe_scalar(int64_t iters);
uint64_t roof_probe_avx2(int64_t iters);
uint64_t roof_probe_avx512(int64_t iters);   // vpdpbusd zmm
uint64_t roof_probe_amx(int64_t iters);      // tdpbsud tiles (gemm_amx.cpp)
uint64_t roof_probe_avxvnni(int64_t iters);  // vpdpbusd ymm (VEX); 0 MACs when the compiler could not build it

// The probe of the active ISA level (selected_isa()), and its instruction mix in words.
RoofProbe roof_probe(const char** what);

struct RoofResult {
  double seconds;
  uint64_t macs;
};
// The probe on `threads` pool tasks at once (one per thread, each `iters` iterations): the MACs of all
// of them and the wall time of the pool run. threads = 1 runs on the calling thread only.
RoofResult roof_measure(int64_t iters, int threads);

}  // namespace lowbit
