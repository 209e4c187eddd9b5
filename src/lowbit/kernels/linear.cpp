#include "linear.h"

#include <algorithm>

#include "act_quant.h"
#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {

namespace {
constexpr int64_t kFloatBlocksPerTask = 8;
// Prefill: tokens per task. The AVX2 panel GEMM unpacks a block's codes once per task, for all its tokens, so
// longer chunks share that unpack (~4 % of the GEMM at 64 tokens); shorter ones give the threads more, smaller
// tasks to finish together. kTokChunkLong when every thread still gets kLongChunkTasks blocks or more (one
// thread always): best of alternating short runs, bitnet-0.7b layer GEMMs at N = 128, 1 thread, +1.2 %
// (scripts/prefill_gemm_ab.py); at 2 threads 128-token tasks for every matrix measured 0.95x (a loaded machine:
// noisy), so there the matrices of fewer blocks (1536 rows: 12 a thread) keep 64-token tasks.
constexpr int64_t kTokChunk = 64, kTokChunkLong = 128, kLongChunkTasks = 16;
// What a thread prefetches of its run of the next matrix while it waits (the join, a worker's wait through
// the caller's serial stretch): about what one core streams in ~10 us, a quarter of its L2. Issued in
// slices between checks for the next run (thread_pool.cpp), so a large budget delays nothing.
constexpr int64_t kIdlePrefetchBytes = 128 << 10;
// int6's planes alternate every this many row blocks (the high plane re-reads the scales the low one read). Each
// switch restarts a stream: a 1-layer model's decode step, mostly its int6 lm_head, in-process alternation
// (stop 35): 4 -> 16 blocks bitnet-2b 1 thread 13.45 -> 12.49 ms, 2 threads 9.04 -> 8.95; bitnet-0.7b 2.06 -> 1.90 and
// 0.97 -> 0.95. Longer runs gained a little more at 1 thread and lost at 2 (bitnet-2b 32: 12.37 / 9.14 ms).
constexpr int64_t kHiBlocks = 16;
}  // namespace

IntJob make_int_job(const IntWeights& w, const ActQ& a, float* y, const KernelTable* k) {
  IntJob j;
  j.w = w;
  j.a = a;
  j.y = y;
  j.ldy = w.M;
  const int64_t threads = pool_threads();
  const int64_t chunk = threads == 1 || w.Mb >= kLongChunkTasks * threads ? kTokChunkLong : kTokChunk;
  j.tok_chunk = a.N > chunk ? chunk : std::max<int64_t>(a.N, 1);
  j.n_tok_chunks = (a.N + j.tok_chunk - 1) / j.tok_chunk;
  j.bounds.push_back(0);
  if (a.N > kTokChunk) {  // prefill: compute-bound, one block per task
    for (int64_t b = 1; b <= w.Mb; ++b) j.bounds.push_back(b);
  } else if (a.N >= kComputeBoundRows) {
    // A batched decode step (8-64 rows): bound by compute like prefill, so no long streams to keep; ~8 short
    // runs a thread, handed out in order, let a thread that fell behind (a shared core) be caught up by the
    // others instead of holding the join for the rest of its long run.
    const int64_t run = std::max<int64_t>(1, w.Mb / (8 * pool_threads()));
    for (int64_t b = run; b < w.Mb + run; b += run) j.bounds.push_back(std::min(b, w.Mb));
  } else {
    // One run a thread, equal and contiguous: each thread streams one range of the matrix. It replaced T long
    // runs over ~80 % of the blocks followed by shrinking runs for the tail, claimed in turn, where each tail
    // run was a stream started cold at a block its thread had not been streaming. bitnet-0.7b's layer sequence,
    // 2 threads (scripts/decode_calls_probe.cpp, the host reading 65-73 GB/s): 49.8-51.7 -> 53.5-59.2 GB/s;
    // its decode 67-83 -> 76-91 % of the roofline (docs/decode.md, stop 42). A late worker's run is still taken
    // by whoever is free (the pool hands out tasks, not threads); stealing blocks from the back of a run in
    // progress was tried: claiming a run in pieces cost more (gate/up interleaved a piece at a time) than the
    // stealing gained. (On cores of unequal speed, P- and E-cores, equal runs wait for the slowest: unmeasured.)
    const int64_t T = std::min<int64_t>(pool_threads(), w.Mb);
    for (int64_t t = 1; t <= T; ++t) j.bounds.push_back(w.Mb * t / T);
  }
  j.k = k;
  return j;
}

void int_task(void* p, int64_t t) {
  const IntJob& j = *static_cast<const IntJob*>(p);
  const int64_t run = t / j.n_tok_chunks, tc = t % j.n_tok_chunks;
  const int64_t b0 = j.bounds[run], b1 = j.bounds[run + 1];
  const int64_t n0 = tc * j.tok_chunk, n1 = std::min(j.a.N, n0 + j.tok_chunk);
  // The software prefetch inside the kernel runs kPrefetchBytes ahead; cover the start of the run.
  const uint8_t* start = j.w.codes + b0 * j.w.nch() * 256;
  const int64_t left = (j.w.Mb - b0) * j.w.nch() * 256;  // bytes from start to the end of the codes
  for (int64_t off = 0; off < std::min<int64_t>(kPrefetchBytes, left); off += 64) __builtin_prefetch(start + off, 0, 3);
  ActQ a = j.a;
  a.q += n0 * a.Kp;
  a.scale += n0 * a.G;
  a.sum += n0 * a.G;
  a.N = n1 - n0;
  if (!j.has_hi()) {
    IntWeights w = j.w;
    if (!j.pf_run.empty()) {  // the run's end is its stream's end: the kernel's prefetch goes on into pf_run
      w.Mb = b1;
      w.pf_next = j.pf_run[run];
    }
    j.k->gemm_int(w, a, j.y + n0 * j.ldy, j.ldy, b0, b1);
    return;
  }
  // int6: a few blocks of the low plane, the same blocks of the high one (their scales still in cache), the sum
  ActQ ah = a;
  ah.scale = j.scale_hi + n0 * a.G;
  float *y = j.y + n0 * j.ldy, *yh = j.y_hi + n0 * j.ldy;
  for (int64_t c0 = b0; c0 < b1; c0 += kHiBlocks) {
    const int64_t c1 = std::min(b1, c0 + kHiBlocks);
    j.k->gemm_int(j.w, a, y, j.ldy, c0, c1);
    j.k->gemm_int(j.w_hi, ah, yh, j.ldy, c0, c1);
    const int64_t r0 = c0 * kRowBlock, r1 = std::min(j.w.M, c1 * kRowBlock);
    for (int64_t n = 0; n < a.N; ++n)
      for (int64_t r = r0; r < r1; ++r) y[n * j.ldy + r] += yh[n * j.ldy + r];
  }
}

namespace {

// Run r's first code byte (r past the last run: the last run's).
const uint8_t* int_run_start(const IntJob& j, int64_t r) {
  const int64_t runs = (int64_t)j.bounds.size() - 1;
  return runs < 1 ? j.w.codes : j.w.codes + j.bounds[std::min(r, runs - 1)] * j.w.nch() * 256;
}

// pf_run of j: run r's prefetch on into run r of `then` (null: of the next matrix's runs, `next`; neither: none).
void chain_runs(IntJob& j, const IntJob* then, const NextPrefetch* next) {
  const int64_t runs = (int64_t)j.bounds.size() - 1;
  if (j.has_hi() || j.n_tok_chunks != 1 || runs < 1 || (!then && (!next || next->n <= 0))) return;
  j.pf_run.resize(runs);
  for (int64_t r = 0; r < runs; ++r)
    j.pf_run[r] = then ? int_run_start(*then, r) : reinterpret_cast<const uint8_t*>(next->starts[r % next->n]);
}

}  // namespace

void MultiIntJob::add(const IntJob& j) {
  first_task.push_back(tasks());
  parts.push_back(j);
}

int64_t MultiIntJob::tasks() const { return parts.empty() ? 0 : first_task.back() + parts.back().tasks(); }

void multi_int_task(void* p, int64_t t) {
  const MultiIntJob& m = *static_cast<const MultiIntJob*>(p);
  const size_t i = std::upper_bound(m.first_task.begin(), m.first_task.end(), t) - m.first_task.begin() - 1;
  int_task((void*)&m.parts[i], t - m.first_task[i]);
}

// A decode step's few rows: one equal run a thread (one stream each, as make_int_job); more: short runs.
int64_t FloatJob::tasks() const {
  const int64_t nblocks = (w.M + kFloatRows - 1) / kFloatRows;
  if (N < kComputeBoundRows) return std::min<int64_t>(pool_threads(), nblocks);
  return (nblocks + kFloatBlocksPerTask - 1) / kFloatBlocksPerTask;
}

void float_task(void* p, int64_t t) {
  const FloatJob& j = *static_cast<const FloatJob*>(p);
  const int64_t nb_total = (j.w.M + kFloatRows - 1) / kFloatRows;
  const int64_t runs = j.N < kComputeBoundRows ? j.tasks() : 0;
  const int64_t b0 = runs ? nb_total * t / runs : t * kFloatBlocksPerTask;
  const int64_t b1 = runs ? nb_total * (t + 1) / runs : std::min(nb_total, b0 + kFloatBlocksPerTask);
  (j.bf16 ? j.k->gemm_bf16 : j.k->gemm_f32)(j.w, j.x, j.N, j.y, j.w.M, b0, b1);
}

namespace {

// x [N][K] -> its int8 quantization per token and group, in s.
ActQ quantize_input(const float* x, int64_t N, int64_t K, int64_t Kp, int64_t group, int64_t G, ActScratch& s,
                    const KernelTable* k) {
  s.q.resize(N * Kp);
  s.scale.resize(N * G);
  s.sum.resize(N * G);
  if (N >= 8) {  // prefill: rows on the pool
    quantize_activations(x, N, K, K, Kp, group, s.q.data(), s.scale.data(), s.sum.data());
  } else {
    for (int64_t t = 0; t < N; ++t)
      k->ops.quantize_row(x + t * K, K, Kp, group, s.q.data() + t * Kp, s.scale.data() + t * G, s.sum.data() + t * G);
  }
  return ActQ{s.q.data(), s.scale.data(), s.sum.data(), N, Kp, group, G};
}

}  // namespace

NextPrefetch next_prefetch(const LinearRef* next) {
  NextPrefetch p;
  if (!next || next->kind != 0) return p;
  const IntWeights& w = next->iw;
  const int64_t T = std::min<int64_t>(pool_threads(), w.Mb), block = w.nch() * 256;  // make_int_job's runs
  p.n = (int)std::min<int64_t>(T, NextPrefetch::kMax);
  for (int r = 0; r < p.n; ++r) p.starts[r] = (const char*)(w.codes + w.Mb * r / T * block);
  p.bytes = std::min<int64_t>(kIdlePrefetchBytes, std::max<int64_t>(w.Mb / std::max<int64_t>(T, 1), 1) * block);
  return p;
}

namespace {

struct GatedJob {
  IntJob gate, up;  // the same bounds: task t is run t of both
  float *g, *u;
  int act;
  const OpsTable* ops;
};

void gated_task(void* p, int64_t t) {
  const GatedJob& j = *static_cast<const GatedJob*>(p);
  int_task((void*)&j.gate, t);
  int_task((void*)&j.up, t);
  const int64_t r0 = j.gate.bounds[t] * kRowBlock, r1 = std::min(j.gate.w.M, j.gate.bounds[t + 1] * kRowBlock);
  j.ops->act_mul(j.g + r0, j.u + r0, r1 - r0, j.act);
}

}  // namespace

bool run_gated(const LinearRef& gate, const LinearRef& up, float* g, float* u, const float* x, int act,
               ActScratch& s, const NextPrefetch* next) {
  const IntWeights &gw = gate.iw, &uw = up.iw;
  if (gate.kind != 0 || up.kind != 0 || gate.has_hi() || up.has_hi() || gate.bias || up.bias || gate.K != up.K || gw.M != uw.M || gw.Mb != uw.Mb ||
      gw.Kp != uw.Kp || gw.group != uw.group || gw.G != uw.G)
    return false;
  const KernelTable* k = &active_kernels();
  const ActQ a = quantize_input(x, 1, gate.K, gw.Kp, gw.group, gw.G, s, k);
  GatedJob j{make_int_job(gw, a, g, k), make_int_job(uw, a, u, k), g, u, act, &k->ops};
  chain_runs(j.gate, &j.up, nullptr);  // a task streams gate's run, then up's, then the next matrix's
  chain_runs(j.up, nullptr, next);
  pool_run(j.gate.tasks(), gated_task, &j, next);
  return true;
}

void run_linears(const LinearRef* const* lins, float* const* ys, int n, const float* x, int64_t N, ActScratch& s,
                 const NextPrefetch* next) {
  const KernelTable* k = &active_kernels();
  std::vector<bool> done(n, false);
  for (int i = 0; i < n; ++i) {
    if (done[i]) continue;
    const LinearRef& L = *lins[i];
    if (L.kind == 0) {
      const int64_t Kp = L.iw.Kp, group = L.iw.group;
      const ActQ a = quantize_input(x, N, L.K, Kp, group, L.iw.G, s, k);
      MultiIntJob m;
      auto joins = [&](int j) {
        const LinearRef& J = *lins[j];
        return !done[j] && J.kind == 0 && J.iw.Kp == Kp && J.iw.group == group && J.K == L.K;
      };
      size_t hi_floats = 0;
      for (int j = i; j < n; ++j)
        if (joins(j) && lins[j]->has_hi()) hi_floats += N * lins[j]->M;
      if (hi_floats) {  // int6's high planes: their outputs, and the activation scales x16 (exact)
        s.yhi.resize(hi_floats);
        s.scale16.resize(N * L.iw.G);
        for (int64_t e = 0; e < N * L.iw.G; ++e) s.scale16[e] = 16.f * a.scale[e];
      }
      float* yh = s.yhi.data();
      for (int j = i; j < n; ++j) {
        if (!joins(j)) continue;
        const LinearRef& J = *lins[j];
        IntJob ij = make_int_job(J.iw, a, ys[j], k);
        if (J.has_hi()) {
          ij.w_hi = J.iw_hi;
          ij.scale_hi = s.scale16.data();
          ij.y_hi = yh;
          yh += N * J.M;
        }
        m.add(ij);
        done[j] = true;
      }
      // One token: each run's prefetch runs on into the codes its thread streams next (run r of the next part of
      // this pool run, else of the caller's next matrix), so the stream does not stop at every matrix's end.
      // bitnet-0.7b's layer sequence (scripts/decode_calls_probe.cpp, alternating builds): 1 thread, 8 pairs,
      // 26.2 -> 27.6 GB/s (stop 36: on into the next matrix's start); 2 threads, 3 pairs, 47.4-47.5 -> 47.9-48.4 GB/s
      // (stop 42: into the same run, not the next thread's).
      if (N == 1)
        for (size_t p = 0; p < m.parts.size(); ++p)
          chain_runs(m.parts[p], p + 1 < m.parts.size() ? &m.parts[p + 1] : nullptr, next);
      pool_run(m.tasks(), multi_int_task, &m, next);
    } else if (L.kind == 4) {  // float activations, zero-padded to Kp when K is not a multiple of v
      const float* xp = x;
      if (L.cb.Kp != L.K) {
        s.xf.assign(N * L.cb.Kp, 0.f);
        for (int64_t t = 0; t < N; ++t) std::copy(x + t * L.K, x + (t + 1) * L.K, s.xf.data() + t * L.cb.Kp);
        xp = s.xf.data();
      }
      codebook_run(L.cb, xp, N, ys[i], codebook_kernel(codebook_use_psum(L.cb, N), nullptr));
      done[i] = true;
    } else if (L.kind == 3) {
      const char* path = nullptr;
      tq1_run(L.tq, quantize_input(x, N, L.K, L.tq.Kp, L.tq.group, L.tq.G, s, k), ys[i], tq1_kernel(&path));
      done[i] = true;
    } else {
      FloatJob j{L.fw, x, N, ys[i], L.kind == 2, k};
      if (j.bf16 && k->bf16_x_layout) {
        s.xf.resize(N * k->bf16_x_stride(L.K));
        k->bf16_x_layout(x, N, L.K, s.xf.data());
        j.x = s.xf.data();
      }
      pool_run(j.tasks(), float_task, &j);
      done[i] = true;
    }
  }
  for (int i = 0; i < n; ++i)
    if (lins[i]->bias)
      for (int64_t t = 0; t < N; ++t)
        for (int64_t m = 0; m < lins[i]->M; ++m) ys[i][t * lins[i]->M + m] += lins[i]->bias[m];
}

}  // namespace lowbit
