// The int8 compute roof: dispatch, the pool run and the scalar probe (baseline x86-64 flags).
#include "roof.h"

#include <atomic>
#include <chrono>

#include "common.h"
#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {

// A plain loop over 64 u8 x s8 products per iteration, as the scalar kernels compile it (the compiler
// may vectorize it with baseline SSE2). The asm barrier makes the operands opaque each iteration, so the
// products cannot be hoisted out of the loop.
uint64_t roof_probe_scalar(int64_t iters) {
  alignas(64) uint8_t w[64];
  alignas(64) int8_t x[64];
  for (int i = 0; i < 64; ++i) {
    w[i] = (uint8_t)(i * 7 + 1);
    x[i] = (int8_t)(i * 5 - 100);
  }
  int32_t acc[8] = {0};
  for (int64_t it = 0; it < iters; ++it) {
    __asm__ volatile("" : : "r"(w), "r"(x) : "memory");
    for (int i = 0; i < 64; ++i) acc[i & 7] += (int32_t)w[i] * x[i];
  }
  int32_t s = 0;
  for (int i = 0; i < 8; ++i) s += acc[i];
  __asm__ volatile("" : : "r"(s));
  return (uint64_t)iters * 64;
}

RoofProbe roof_probe(const char** what) {
  const std::string& isa = selected_isa();
  if (isa == "amx") {
    if (what) *what = "tdpbsud tiles (16 x 16 x 64 MACs each), 4 independent accumulator tiles";
    return roof_probe_amx;
  }
  if (isa == "avx512") {
    if (what) *what = "vpdpbusd zmm (64 MACs each), 12 independent chains";
    return roof_probe_avx512;
  }
  if (isa == "avxvnni") {
    if (cpu_features().avxvnni && kernels_avxvnni() != nullptr) {
      if (what) *what = "vpdpbusd ymm (32 MACs each), 12 independent chains";
      return roof_probe_avxvnni;
    }
    if (what) *what = "vpdpbusd zmm (64 MACs each; EVEX-encoded VNNI CPU), 12 independent chains";
    return roof_probe_avx512;
  }
  if (isa == "avx2") {
    if (what) *what = "vpmaddubsw + vpaddw ymm (32 MACs per pair), 12 independent s16 chains";
    return roof_probe_avx2;
  }
  if (what) *what = "plain C++ loop (u8 x s8 -> int32)";
  return roof_probe_scalar;
}

namespace {

struct RoofCtx {
  RoofProbe probe;
  int64_t iters;
  std::atomic<uint64_t> macs{0};
};

void roof_task(void* p, int64_t) {
  RoofCtx& c = *static_cast<RoofCtx*>(p);
  c.macs.fetch_add(c.probe(c.iters), std::memory_order_relaxed);
}

}  // namespace

RoofResult roof_measure(int64_t iters, int threads) {
  RoofCtx c;
  c.probe = roof_probe(nullptr);
  c.iters = iters;
  const auto t0 = std::chrono::steady_clock::now();
  if (threads <= 1) roof_task(&c, 0);
  else pool_run(threads, roof_task, &c);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return RoofResult{s, c.macs.load()};
}

}  // namespace lowbit
