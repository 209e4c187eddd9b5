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

struct BeamJob {
  const float *x, *wt, *books, *booksT;  // books [m][nc][v], booksT [m][v][nc]
  uint8_t* codes;               // [n][m]: the start codes in, the best tuple out
  int64_t n, m, v, nc, beam;
};

constexpr int64_t kBeamChunk = 256;

struct Cand {
  float d;
  int32_t parent, code;
};

// One vector's beam search (codebook.h); scratch sized for beam members and nc centroids.
void beam_one(const BeamJob& j, const float* x, const float* wt, uint8_t* out, std::vector<float>& scratch,
              std::vector<uint8_t>& codes, std::vector<uint8_t>& next_codes, std::vector<Cand>& list,
              std::vector<char>& twin) {
  const int64_t m = j.m, v = j.v, nc = j.nc, B = j.beam;
  scratch.resize((size_t)(2 * B * v + nc + 2 * v + nc));
  float* recon = scratch.data();        // [B][v]
  float* next_recon = recon + B * v;    // [B][v]
  float* q = next_recon + B * v;        // [nc]  sum_t wt_t C_i[c][t]^2
  float* wr = q + nc;                   // [v]
  float* r = wr + v;                    // [v]
  float* dist = r + v;                  // [nc]
  codes.resize((size_t)(B * m));
  next_codes.resize((size_t)(B * m));
  list.resize((size_t)B);
  twin.resize((size_t)(B * B));
  int64_t b = 1;
  for (int64_t i = 0; i < m; ++i) codes[i] = out[i];
  for (int64_t t = 0; t < v; ++t) {
    float a = 0.f;
    for (int64_t i = 0; i < m; ++i) a += j.books[(i * nc + codes[i]) * v + t];
    recon[t] = a;
  }
  for (int64_t i = 0; i < m; ++i) {
    const float* Ci = j.books + i * nc * v;
    const float* CTi = j.booksT + i * v * nc;  // loops over c (inner) vectorize
    for (int64_t c = 0; c < nc; ++c) q[c] = 0.f;
    for (int64_t t = 0; t < v; ++t)
      for (int64_t c = 0; c < nc; ++c) q[c] += wt[t] * CTi[t * nc + c] * CTi[t * nc + c];
    // twin[p * B + p2]: members p and p2 differ only in code i (their candidates can coincide)
    bool any_twin = false;
    for (int64_t p = 0; p < b; ++p)
      for (int64_t p2 = 0; p2 < b; ++p2) {
        bool eq = p != p2;
        for (int64_t k = 0; k < m && eq; ++k) eq = k == i || codes[p * m + k] == codes[p2 * m + k];
        twin[p * B + p2] = eq;
        any_twin |= eq;
      }
    int64_t len = 0;  // list[0..len): the best distinct candidates so far, ascending distance
    for (int64_t p = 0; p < b; ++p) {
      const uint8_t* pc = codes.data() + p * m;
      float R = 0.f;
      for (int64_t t = 0; t < v; ++t) {
        r[t] = x[t] - recon[p * v + t] + Ci[pc[i] * v + t];
        wr[t] = wt[t] * r[t];
        R += wr[t] * r[t];
      }
      for (int64_t c = 0; c < nc; ++c) dist[c] = R + q[c];
      for (int64_t t = 0; t < v; ++t) {
        const float w2 = -2.f * wr[t];
        for (int64_t c = 0; c < nc; ++c) dist[c] += w2 * CTi[t * nc + c];
      }
      for (int64_t c = 0; c < nc; ++c) {
        const float d = dist[c];
        if (len == B && !(d < list[len - 1].d)) continue;
        int64_t end = len;  // where the shift starts: the list end, or a twin's slot it replaces
        if (any_twin) {
          int64_t same = -1;
          for (int64_t e = 0; e < len; ++e)
            if (list[e].code == c && twin[p * B + list[e].parent]) { same = e; break; }
          if (same >= 0) {
            if (!(d < list[same].d)) continue;
            end = same;
          }
        }
        if (end == B) end = B - 1;  // the full list drops its last entry
        else if (end == len) ++len;
        int64_t at = end;
        while (at > 0 && list[at - 1].d > d) {
          list[at] = list[at - 1];
          --at;
        }
        list[at] = Cand{d, (int32_t)p, (int32_t)c};
      }
    }
    b = len;
    for (int64_t e = 0; e < b; ++e) {
      const Cand& cd = list[e];
      const uint8_t* pc = codes.data() + cd.parent * m;
      uint8_t* nc8 = next_codes.data() + e * m;
      for (int64_t k = 0; k < m; ++k) nc8[k] = pc[k];
      nc8[i] = (uint8_t)cd.code;
      for (int64_t t = 0; t < v; ++t)
        next_recon[e * v + t] = recon[cd.parent * v + t] - Ci[pc[i] * v + t] + Ci[cd.code * v + t];
    }
    std::swap(recon, next_recon);
    codes.swap(next_codes);
  }
  for (int64_t k = 0; k < m; ++k) out[k] = codes[k];  // the list is sorted: member 0 is the best
}

void beam_task(void* p, int64_t t) {
  const BeamJob& j = *static_cast<const BeamJob*>(p);
  std::vector<float> scratch;
  std::vector<uint8_t> codes, next_codes;
  std::vector<Cand> list;
  std::vector<char> twin;
  std::vector<float> ones((size_t)j.v, 1.f);
  const int64_t a = t * kBeamChunk, b = std::min(j.n, a + kBeamChunk);
  for (int64_t i = a; i < b; ++i)
    beam_one(j, j.x + i * j.v, j.wt ? j.wt + i * j.v : ones.data(), j.codes + i * j.m, scratch, codes, next_codes, list, twin);
}

}  // namespace

void codebook_beam(const float* x, const float* wt, const float* books, int64_t n, int64_t m, int64_t v, int64_t nc,
                   int64_t beam, uint8_t* codes) {
  std::vector<float> booksT((size_t)(m * v * nc));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t t = 0; t < v; ++t) booksT[(i * v + t) * nc + c] = books[(i * nc + c) * v + t];
  BeamJob j{x, wt, books, booksT.data(), codes, n, m, v, nc, beam};
  pool_run((n + kBeamChunk - 1) / kBeamChunk, beam_task, &j);
}

void codebook_assign(const float* x, const float* wt, const float* booksT, int64_t n, int64_t v, int64_t nc,
                     uint8_t* out) {
  AssignJob j{x, wt, booksT, out, n, v, nc};
  pool_run((n + kAssignChunk - 1) / kAssignChunk, assign_task, &j);
}

int64_t codebook_table_floats(const CodebookWeights& w, int64_t N) {
  // psum tables of one group for N tokens, or the dequantize kernel's [8 rows][group] buffer
  if (w.lut4()) {
    // the psum tables (Lut4Scratch); dequantize: [32][group] + unpacked codes
    const int64_t pp = w.pairs_padded_full();
    return std::max<int64_t>(Lut4Scratch::floats(N, pp), 32 * w.group + pp * 8) + 64;
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
