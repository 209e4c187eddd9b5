// Causal attention of R query rows over a static KV cache, on the pool: the driver of attn_block
// (common.h, attn.inc) for the decoder step and the attention bindings. Rows that are consecutive
// positions of one slot (a prefill chunk) go as blocks of up to kAttnBlockQueries queries (rows x GQA
// group) against each kv head, so K/V are read once per block and per group instead of once per query
// head; a decode row is one task per kv head covering its whole group, and when rows x kv heads give the
// pool too few tasks its context is cut into chunks run apart and merged (flash-decoding).
#pragma once
#include <cstdint>

#include "common.h"
#include "thread_pool.h"

namespace lowbit {

struct AttnCall {
  const float* q;             // [R][heads*hd], RoPE'd and scaled
  float* out;                 // [R][heads*hd]
  const void *kc, *vc;        // slot 0 of the layer's cache: [slot][n_kv][max_ctx][row] (KvType: float32, float16
  KvType kv;                  // as uint16, or int8 rows of hd + 4 with their scale); slot_stride in the array's units
  const int64_t *pos, *slot;  // [R]: row r attends positions [start, pos[r]] of slot[r], K/V already written
  int64_t R, heads, n_kv, hd, max_ctx, slot_stride, window;  // window > 0: the last `window` positions only
  float softcap;              // > 0: Gemma 2's score cap
};

// Prefill at bitnet-0.7b (128 queries, 16 heads, hd 96, f16 cache; 1 thread, thread CPU time,
// /tmp/pf/attp.py): 8 queries 10.9, 16 12.3, 32 13.2, 64 13.0 G MAC/s. The block does not change a row's
// bits (every row meets the same tiles in the same order).
constexpr int64_t kAttnBlockQueries = 32;
// A lone row (decode) is cut into chunks of at least this many positions when the kv heads alone give the
// pool fewer than 4 tasks per thread: at 2 threads, bitnet-2b's 5 kv heads become 10 tasks (not 3 + 2 on
// the two threads); 64 positions of K/V are >= 16 KB, enough to pay for the merge.
constexpr int64_t kAttnSplitMin = 64;
// A batched decode step's tasks: kv heads of one row per task, at least this many tasks a thread.
constexpr int64_t kAttnTasksPerThread = 8;

// Work that must precede the attention of kv head h (a decode step's RoPE and cache write of that head's
// q and k/v): fn(ctx, h) runs at the start of the task that holds h (with the task's other heads), on the pool,
// when the row's context is not split; otherwise for every head on the caller before the pool run.
struct AttnPrep {
  void (*fn)(void* ctx, int64_t kv_head) = nullptr;
  void* ctx = nullptr;
};

// split_min: as kAttnSplitMin (tests pass small values to exercise the merge); 0: never split.
void attention(const AttnCall& c, const OpsTable& ops, const NextPrefetch* next = nullptr,
               int64_t split_min = kAttnSplitMin, const AttnPrep* prep = nullptr);

}  // namespace lowbit
