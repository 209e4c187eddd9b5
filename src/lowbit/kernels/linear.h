// Running projections on the thread pool: jobs over row blocks (and token chunks for prefill), used by
// the Python binding and by the native decoder.
#pragma once
#include <cstdint>
#include <vector>

#include "common.h"
#include "codebook.h"
#include "thread_pool.h"
#include "tq1.h"

namespace lowbit {

// From this many rows a GEMM is bound by compute, not by the weight stream (ternary: 8 tokens x 4 codes a
// byte = 32 MACs per byte read, ~0.9 T MAC/s at 28 GB/s, against an int8 roof of ~0.3 T MAC/s on 2 cores):
// its tasks are short runs of blocks (make_int_job), and the decoder gives it no next-matrix prefetch.
constexpr int64_t kComputeBoundRows = 8;

struct IntJob {
  IntWeights w;
  ActQ a;
  float* y;
  int64_t ldy, tok_chunk, n_tok_chunks;
  // Task r covers row blocks [bounds[r], bounds[r+1]): a run of consecutive blocks is one long,
  // prefetchable stream. One token (or a few): one equal run a thread (linear.cpp).
  std::vector<int64_t> bounds;
  // One token: where run r's software prefetch runs on past the run's end (the start of what its thread
  // streams next: the same run of the next part or matrix); empty: as w says (w.pf_next).
  std::vector<const uint8_t*> pf_run;
  const KernelTable* k;
  // int6 (LinearRef::has_hi): the high plane w_hi (the same scales as w, no offsets) on the same rows, its
  // products into y_hi [N][ldy] with the activation scales x16 (scale_hi [N][G]), then added to y; y_hi null: none
  IntWeights w_hi{};
  const float* scale_hi = nullptr;
  float* y_hi = nullptr;
  bool has_hi() const { return y_hi != nullptr; }
  int64_t tasks() const { return ((int64_t)bounds.size() - 1) * n_tok_chunks; }
};
IntJob make_int_job(const IntWeights& w, const ActQ& a, float* y, const KernelTable* k);
void int_task(void* p, int64_t t);

// Several integer jobs on the same activations in one pool run (one fork/join).
struct MultiIntJob {
  std::vector<IntJob> parts;
  std::vector<int64_t> first_task;
  void add(const IntJob& j);
  int64_t tasks() const;
};
void multi_int_task(void* p, int64_t t);

struct FloatJob {
  FloatWeights w;
  const float* x;  // [N][K], or the ISA's bf16 layout
  int64_t N;
  float* y;
  bool bf16;
  const KernelTable* k;
  int64_t tasks() const;
};
void float_task(void* p, int64_t t);

// A projection as the decoder holds it.
struct LinearRef {
  int kind = 0;  // 0 integer codes, 1 f32, 2 bf16, 3 tq1, 4 codebook
  IntWeights iw{};
  // kind 0 with a second plane (int6: iw the codes' low 4 bits with the scales and offsets, iw_hi the high 2
  // bits with the same scales and no offsets, run on 16x the activation scales): y = iw . x + 16 iw_hi . x, both
  // on one quantization of x, block by block (IntJob::has_hi)
  IntWeights iw_hi{};
  bool has_hi() const { return iw_hi.codes != nullptr; }
  TQ1Weights tq{};
  CodebookWeights cb{};
  FloatWeights fw{};
  const float* bias = nullptr;  // [M] or null
  int64_t M = 0, K = 0;
};

// Scratch for one input: its int8 quantization (per Kp/group) and the bf16 x layout.
struct ActScratch {
  std::vector<int8_t, CacheAligned<int8_t>> q;  // tile rows on cache lines (CacheAligned)
  std::vector<float> scale, xf, yhi, scale16;  // yhi, scale16: the second planes' outputs and activation scales
  std::vector<int32_t> sum;
};

// ys[i] [N][M_i] = x [N][K] . W_i^T (+ b_i) for projections sharing x. Integer ones with the same Kp/group
// run in one pool run on one quantization of x. next: the projection the caller runs after these (or
// null): threads that finish early prefetch the starts of its first runs (NextPrefetch).
void run_linears(const LinearRef* const* lins, float* const* ys, int n, const float* x, int64_t N, ActScratch& s,
                 const NextPrefetch* next = nullptr);
// Decode's gate/up: g [M] = act(gate . x) * (up . x) for one token in one pool run, each task the same
// row blocks of both projections followed by the activation on them (on the thread that has them in
// cache; act as ops.act_mul). false (nothing run) unless both are integer codes of one shape without bias.
bool run_gated(const LinearRef& gate, const LinearRef& up, float* g, float* u, const float* x, int act,
               ActScratch& s, const NextPrefetch* next = nullptr);
// The hint for `next` (n = 0 when it is not an integer-code weight): the starts of the long runs its GEMV
// gives each thread first (make_int_job), `bytes` of each.
NextPrefetch next_prefetch(const LinearRef* next);

}  // namespace lowbit
