// tq1: choice of the kernel path and the thread-pool job (baseline x86-64 flags).
#include <algorithm>

#include "dispatch.h"
#include "linear.h"
#include "thread_pool.h"
#include "tq1.h"

namespace lowbit {
namespace {

constexpr int64_t kTokChunk = 64;

struct Tq1Job {
  TQ1Weights w;
  ActQ a;
  float* y;
  int64_t tok_chunk, n_tok_chunks, blocks_per_task;
  Tq1Kernel k;
  int64_t tasks() const { return (w.Mb + blocks_per_task - 1) / blocks_per_task * n_tok_chunks; }
};

void tq1_task(void* p, int64_t t) {
  const Tq1Job& j = *static_cast<const Tq1Job*>(p);
  const int64_t run = t / j.n_tok_chunks, tc = t % j.n_tok_chunks;
  const int64_t b0 = run * j.blocks_per_task, b1 = std::min(j.w.Mb, b0 + j.blocks_per_task);
  const int64_t n0 = tc * j.tok_chunk, n1 = std::min(j.a.N, n0 + j.tok_chunk);
  const uint8_t* start = j.w.codes + b0 * j.w.nch() * kTq1ChunkBytes;
  const int64_t run_bytes = (b1 - b0) * j.w.nch() * kTq1ChunkBytes;
  for (int64_t off = 0; off < std::min<int64_t>(kPrefetchBytes, run_bytes); off += 64) __builtin_prefetch(start + off, 0, 3);
  ActQ a = j.a;
  a.q += n0 * a.Kp;
  a.scale += n0 * a.G;
  a.sum += n0 * a.G;
  a.N = n1 - n0;
  j.k(j.w, a, j.y + n0 * j.w.M, j.w.M, b0, b1);
}

}  // namespace

Tq1Kernel tq1_kernel(const char** name) {
  const std::string& isa = selected_isa();
  const char* n = "scalar";
  Tq1Kernel k = tq1_gemm_scalar;
  if ((isa == "avx512" || isa == "amx") && cpu_features().avx512vbmi) {  // cached: no CPUID per call
    n = "avx512-vbmi";
    k = tq1_gemm_avx512;
  } else if (isa != "scalar") {
    n = "avx2";
    k = tq1_gemm_avx2;
  }
  if (name) *name = n;
  return k;
}

void tq1_run(const TQ1Weights& w, const ActQ& a, float* y, Tq1Kernel k) {
  Tq1Job j{w, a, y, 0, 0, 0, k};
  j.tok_chunk = a.N > kTokChunk ? kTokChunk : std::max<int64_t>(a.N, 1);
  j.n_tok_chunks = (a.N + j.tok_chunk - 1) / j.tok_chunk;
  // Each task a run of consecutive blocks (one prefetchable stream): a decode step's few rows one equal run a
  // thread (each thread one stream, as linear.cpp's, where the reasons are), more rows about four a thread.
  const int64_t want = (a.N < kComputeBoundRows ? 1 : 4) * (int64_t)pool_threads();
  j.blocks_per_task = j.n_tok_chunks > 1 ? 1 : std::max<int64_t>(1, (w.Mb + want - 1) / want);
  pool_run(j.tasks(), tq1_task, &j);
}

}  // namespace lowbit
