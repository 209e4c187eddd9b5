// codebook: choice of the kernel path and the thread-pool job (baseline x86-64 flags). Layout in codebook.h.
#include <algorithm>
#include <cstring>
#include <vector>

#include "codebook.h"
#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {
namespace {

struct CodebookJob {
  CodebookWeights w;
  const float* x;
  int64_t N, tok_chunk, n_tc, n_gc, n_rc, gpc, tpc;  // gpc: groups per group chunk, tpc: tiles per row chunk
  float* yp;                                          // [n_gc][N][Mt*8] partial sums
  CodebookKernel k;
  int64_t tasks() const { return n_gc * n_rc * n_tc; }
};

void codebook_task(void* p, int64_t t) {
  const CodebookJob& j = *static_cast<const CodebookJob*>(p);
  const int64_t tc = t % j.n_tc, rc = (t / j.n_tc) % j.n_rc, gc = t / (j.n_tc * j.n_rc);
  const int64_t g0 = gc * j.gpc, g1 = std::min(j.w.G, g0 + j.gpc);
  const int64_t t0 = rc * j.tpc, t1 = std::min(j.w.Mt, t0 + j.tpc);
  const int64_t n0 = tc * j.tok_chunk, n1 = std::min(j.N, n0 + j.tok_chunk);
  if (g0 >= g1 || t0 >= t1) return;
  thread_local std::vector<float> tables;
  const size_t need = (size_t)codebook_table_floats(j.w, n1 - n0);
  if (tables.size() < need) tables.resize(need);
  const int64_t ldy = j.w.Mt * j.w.tile();
  j.k(j.w, j.x + n0 * j.w.Kp, j.w.Kp, n1 - n0, g0, g1, t0, t1, j.yp + (gc * j.N + n0) * ldy, ldy, tables.data());
}

struct ReduceJob {
  const float* yp;
  float* y;
  int64_t N, M, ldy, n_gc;
};

void reduce_task(void* p, int64_t n) {
  const ReduceJob& r = *static_cast<const ReduceJob*>(p);
  float* dst = r.y + n * r.M;
  std::memcpy(dst, r.yp + n * r.ldy, r.M * sizeof(float));
  for (int64_t gc = 1; gc < r.n_gc; ++gc) {
    const float* src = r.yp + (gc * r.N + n) * r.ldy;
    for (int64_t i = 0; i < r.M; ++i) dst[i] += src[i];
  }
}

struct AssignJob {
  const float *x, *wt, *booksT;
  uint8_t* out;
  int64_t n, v, nc;
};

constexpr int64_t kAssignChunk = 2048;

void assign_task(void* p, int64_t t) {
  const AssignJob& j = *static_cast<const AssignJob*>(p);
  std::vector<float> d(j.nc);
  const int64_t a = t * kAssignChunk, b = std::min(j.n, a + kAssignChunk);
  for (int64_t i = a; i < b; ++i) {
    std::fill(d.begin(), d.end(), 0.f);
    for (int64_t k = 0; k < j.v; ++k) {
      const float xv = j.x[i * j.v + k], wv = j.wt ? j.wt[i * j.v + k] : 1.f;
      const float* col = j.booksT + k * j.nc;
      for (int64_t c = 0; c < j.nc; ++c) {
        const float e = xv - col[c];
        d[c] += wv * e * e;
      }
    }
    int64_t best = 0;
    for (int64_t c = 1; c < j.nc; ++c)
      if (d[c] < d[best]) best = c;
    j.out[i] = (uint8_t)best;
  }
}

}  // namespace

void codebook_assign(const float* x, const float* wt, const float* booksT, int64_t n, int64_t v, int64_t nc,
                     uint8_t* out) {
  AssignJob j{x, wt, booksT, out, n, v, nc};
  pool_run((n + kAssignChunk - 1) / kAssignChunk, assign_task, &j);
}

int64_t codebook_table_floats(const CodebookWeights& w, int64_t N) {
  // psum tables of one group for N tokens, or the dequantize kernel's [8 rows][group] buffer
  if (w.lut4()) {
    // int8 tables [N][Pp][16] + d [N] + a float build buffer [Pp][16]; dequantize: [32][group] + unpacked codes
    const int64_t pp = w.pairs_padded_full();
    return std::max<int64_t>(N * pp * 4 + N + pp * 16, 32 * w.group + pp * 8) + 64;
  }
  return std::max<int64_t>(N * w.segs_full() * w.m * w.nc, 8 * w.group) + 64;
}

CodebookKernel codebook_kernel(bool psum, const char** name) {
  const bool scalar = selected_isa() == "scalar";
  if (name) *name = scalar ? "scalar" : "avx2";
  if (psum) return scalar ? codebook_psum_scalar : codebook_psum_avx2;
  return scalar ? codebook_dequant_scalar : codebook_dequant_avx2;
}

void codebook_run(const CodebookWeights& w, const float* x, int64_t N, float* y, CodebookKernel k) {
  const bool psum = k == codebook_psum_scalar || k == codebook_psum_avx2;
  CodebookJob j{w, x, N, 0, 0, 1, 1, w.G, w.Mt, nullptr, k};
  // Psumbook: a few tokens per task so their tables (N x 32 KiB) stay in L2 while the codes of a row tile
  // are reused; dequantize: many tokens per dequantized [8 rows][group] buffer.
  j.tok_chunk = std::min<int64_t>(std::max<int64_t>(N, 1), psum ? 4 : 64);
  j.n_tc = (N + j.tok_chunk - 1) / j.tok_chunk;
  const int64_t want = 4 * (int64_t)pool_threads();
  if (j.n_tc < want) {
    // Few tokens (decode): split K into group chunks (each builds only its own tables; partial sums are
    // added afterwards), then rows if there are too few groups.
    j.n_gc = std::min<int64_t>(w.G, (want + j.n_tc - 1) / j.n_tc);
    j.n_rc = std::min<int64_t>(w.Mt, std::max<int64_t>(1, (want + j.n_gc * j.n_tc - 1) / (j.n_gc * j.n_tc)));
  }
  j.gpc = (w.G + j.n_gc - 1) / j.n_gc;
  j.n_gc = (w.G + j.gpc - 1) / j.gpc;
  j.tpc = (w.Mt + j.n_rc - 1) / j.n_rc;
  j.n_rc = (w.Mt + j.tpc - 1) / j.tpc;
  const int64_t ldy = w.Mt * w.tile();
  std::vector<float> yp((size_t)(j.n_gc * N * ldy), 0.f);
  j.yp = yp.data();
  pool_run(j.tasks(), codebook_task, &j);
  ReduceJob r{yp.data(), y, N, w.M, ldy, j.n_gc};
  if (N == 1) reduce_task(&r, 0);
  else pool_run(N, reduce_task, &r);
}

}  // namespace lowbit
