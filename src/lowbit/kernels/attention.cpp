#include "attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace lowbit {
namespace {

// One pool task: rows [r0, r0 + rows) of one slot against kv head h; chunk >= 0: a chunk of a split row,
// written to the partial buffers at that index.
struct AttnTask {
  int64_t r0, rows, h, chunk, cost, nh = 1;  // kv heads [h, h + nh)
};

struct AttnPlan {
  const AttnCall* c = nullptr;
  const OpsTable* ops = nullptr;
  std::vector<AttnTask> tasks;
  std::vector<int64_t> lo, hi;    // [R]: row r attends [lo, hi)
  std::vector<int64_t> clo, chi;  // [chunks]
  std::vector<float> po, pm;      // [chunks][group][hd] unnormalized outputs, [chunks][group][2] max and sum
  std::vector<std::pair<int64_t, int64_t>> blocks;  // (first row, rows)
  std::vector<const AttnTask*> of_chunk;            // [chunks]
  const AttnPrep* prep = nullptr;                   // run for a task's kv heads at its start, before their attention
};

void attn_head(const AttnPlan& P, const AttnTask& T, int64_t h) {
  const AttnCall& c = *P.c;
  const int64_t QD = c.heads * c.hd, G = c.heads / c.n_kv;
  // bytes from the cache's start to kv head hh's stream of the task's slot
  auto head_at = [&](int64_t hh) {
    return (c.slot[T.r0] * c.slot_stride + hh * c.max_ctx * kv_row_units(c.kv, c.hd)) * kv_unit_bytes(c.kv);
  };
  const int64_t off = head_at(h);
  AttnBlock b{};
  b.q = c.q + T.r0 * QD + h * G * c.hd;
  b.rows = T.rows;
  b.group = G;
  b.hd = c.hd;
  b.K = static_cast<const char*>(c.kc) + off;
  b.V = static_cast<const char*>(c.vc) + off;
  b.kv = c.kv;
  b.softcap = c.softcap;
  if (h + 1 < T.h + T.nh) {  // the tile loop's prefetch runs on into the next head's K/V
    const int64_t next = head_at(h + 1);
    b.next_K = static_cast<const char*>(c.kc) + next;
    b.next_V = static_cast<const char*>(c.vc) + next;
    b.next_lo = P.lo[T.r0] / 8 * 8;
    b.next_hi = P.hi[T.r0];
  }
  if (h > T.h) b.pf_skip = kAttnPrefetchAhead;  // the head before ran its prefetch on into this one's K/V
  if (T.chunk < 0) {
    b.out = c.out + T.r0 * QD + h * G * c.hd;
    b.row_stride = QD;
    b.lo = P.lo.data() + T.r0;
    b.hi = P.hi.data() + T.r0;
    b.part = nullptr;
  } else {
    b.out = const_cast<float*>(P.po.data()) + T.chunk * G * c.hd;
    b.row_stride = G * c.hd;
    b.lo = P.clo.data() + T.chunk;
    b.hi = P.chi.data() + T.chunk;
    b.part = const_cast<float*>(P.pm.data()) + T.chunk * G * 2;
  }
  P.ops->attn_block(b);
}

void attn_task(void* p, int64_t t) {
  const AttnPlan& P = *static_cast<const AttnPlan*>(p);
  const AttnTask& T = P.tasks[t];
  // The task's kv heads' prep (RoPE, the cache write) all first: run head by head, each right before the head's
  // attention, it cut into the K/V stream that the prefetch keeps going from head to head. bitnet-0.7b decode at 1
  // thread, in-step attention (prep included) 0.95-1.0 -> 0.90 ms a token (scripts/e2e_ab.py-style alternation of
  // the two orders in one build, 4 rounds), 2 threads level; the prep alone outside the tasks: 0.87-0.89 ms but
  // +0.04 ms of serial prep.
  if (P.prep)
    for (int64_t h = T.h; h < T.h + T.nh; ++h) P.prep->fn(P.prep->ctx, h);
  for (int64_t h = T.h; h < T.h + T.nh; ++h) attn_head(P, T, h);
}

}  // namespace

void attention(const AttnCall& c, const OpsTable& ops, const NextPrefetch* next, int64_t split_min,
               const AttnPrep* prep) {
  thread_local AttnPlan P;
  P.c = &c;
  P.ops = &ops;
  P.prep = nullptr;
  P.tasks.clear();
  P.clo.clear();
  P.chi.clear();
  const int64_t R = c.R, G = c.heads / c.n_kv, hd = c.hd, QD = c.heads * hd;
  P.lo.resize(R);
  P.hi.resize(R);
  for (int64_t r = 0; r < R; ++r) {
    P.hi[r] = c.pos[r] + 1;
    P.lo[r] = c.window > 0 ? std::max<int64_t>(0, P.hi[r] - c.window) : 0;
  }
  // blocks: runs of consecutive positions in one slot, at most max_rows rows
  const int64_t max_rows = std::max<int64_t>(1, kAttnBlockQueries / G);
  auto& blocks = P.blocks;
  blocks.clear();
  for (int64_t r = 0; r < R;) {
    int64_t r1 = r + 1;
    while (r1 < R && r1 - r < max_rows && c.slot[r1] == c.slot[r] && c.pos[r1] == c.pos[r1 - 1] + 1) ++r1;
    blocks.emplace_back(r, r1 - r);
    r = r1;
  }
  // A lone row's chunk count depends only on its own context, the kv heads and the pool, never on the other
  // rows of the step: a sequence decoded alone and in a batch gets the same chunks, so the same bits.
  const int64_t want = 4 * (int64_t)pool_threads();
  const int64_t split = split_min > 0 && c.n_kv < want ? (want + c.n_kv - 1) / c.n_kv : 1;
  // Several lone rows (a batched decode step): a task takes nh kv heads of one row, and the tile loop's
  // prefetch (two tiles ahead) runs on from one head's K/V into the next one's (AttnBlock::next_K), so a
  // thread's stream stays warm instead of every ~1 us task starting cold; still >= kAttnTasksPerThread tasks
  // a thread for the balance. bitnet-0.7b, 16 rows of one slot each, all 24 layers from DRAM, 2 threads
  // (scripts/attn_batch_ab.py, alternating, best; noisy shared machine): one head a task -> this, contexts
  // 16-32 5.39 -> 3.68 ms a step, 16-144 11.99 -> 10.25 ms. Tried: only the next head's first 16-64
  // positions prefetched at its start (1.05-1.2x, a burst that stalls), 3 or 4 tiles ahead (level, 0.85x).
  // A lone decode row (its kv heads' prep runs in its tasks) the same way, ~2 tasks a thread:
  // bitnet-0.7b decode, 2 threads, in-process alternation: 1.011-1.019x tok/s (1 thread level).
  const int64_t nh_batch = R == 1
      ? std::max<int64_t>(1, c.n_kv / (2 * (int64_t)pool_threads()))
      : std::max<int64_t>(1, std::min<int64_t>(c.n_kv, R * c.n_kv / (kAttnTasksPerThread * pool_threads())));
  for (const auto& [r0, rows] : blocks) {
    const int64_t lo = P.lo[r0], hi = P.hi[r0 + rows - 1], len = hi - lo;
    const int64_t nc = rows == 1 && split > 1 ? std::min(split, std::max<int64_t>(1, len / split_min)) : 1;
    const int64_t nh = rows == 1 && nc == 1 ? nh_batch : 1;
    for (int64_t h = 0; h < c.n_kv; h += nh) {
      if (nc == 1) {
        const int64_t n = std::min(nh, c.n_kv - h);
        P.tasks.push_back({r0, rows, h, -1, len * rows * n, n});
        continue;
      }
      // chunk edges on tile edges (multiples of 8), so no tile is read by two chunks
      auto edge = [&](int64_t k) { return k == 0 ? lo : k == nc ? hi : std::max(lo, (lo + len * k / nc) / 8 * 8); };
      for (int64_t k = 0; k < nc; ++k) {
        P.clo.push_back(edge(k));
        P.chi.push_back(edge(k + 1));
        P.tasks.push_back({r0, 1, h, (int64_t)P.clo.size() - 1, len / nc});
      }
    }
  }
  // longest first: the pool hands tasks out in order, so the long ones do not end up last
  std::stable_sort(P.tasks.begin(), P.tasks.end(), [](const AttnTask& a, const AttnTask& b) { return a.cost > b.cost; });
  const int64_t chunks = (int64_t)P.clo.size();
  if (prep && prep->fn) {
    if (R == 1 && chunks == 0) {
      P.prep = prep;  // each task runs its kv heads' prep at its start, then their attention
    } else {
      for (int64_t h = 0; h < c.n_kv; ++h) prep->fn(prep->ctx, h);
    }
  }
  P.po.resize(chunks * G * hd);
  P.pm.resize(chunks * G * 2);
  pool_run((int64_t)P.tasks.size(), attn_task, &P, next);
  if (!chunks) return;
  // merge the chunks of each split (row, kv head): the chunks of one pair are consecutive
  auto& firsts = P.of_chunk;
  firsts.assign(chunks, nullptr);
  for (const AttnTask& T : P.tasks)
    if (T.chunk >= 0) firsts[T.chunk] = &T;
  for (int64_t k0 = 0; k0 < chunks;) {
    const AttnTask& T = *firsts[k0];
    int64_t k1 = k0 + 1;
    while (k1 < chunks && firsts[k1]->r0 == T.r0 && firsts[k1]->h == T.h) ++k1;
    for (int64_t g = 0; g < G; ++g) {
      float mx = -INFINITY;
      for (int64_t k = k0; k < k1; ++k) mx = std::max(mx, P.pm[(k * G + g) * 2]);
      float sum = 0.f;
      float* out = c.out + T.r0 * QD + (T.h * G + g) * hd;
      std::fill(out, out + hd, 0.f);
      for (int64_t k = k0; k < k1; ++k) {
        const float w = std::exp(P.pm[(k * G + g) * 2] - mx);
        sum += w * P.pm[(k * G + g) * 2 + 1];
        const float* o = P.po.data() + (k * G + g) * hd;
        for (int64_t d = 0; d < hd; ++d) out[d] += w * o[d];
      }
      const float inv = 1.f / sum;
      for (int64_t d = 0; d < hd; ++d) out[d] *= inv;
    }
    k0 = k1;
  }
}

}  // namespace lowbit
