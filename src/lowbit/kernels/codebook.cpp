// codebook: choice of the kernel path and the thread-pool job (baseline x86-64 flags). Layout in codebook.h.
#include <algorithm>
#include <cstring>
#include <vector>

#include "codebook.h"
#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {
namespace {

// Tasks: token chunks x runs of groups gb[r]..gb[r+1] x row chunks. Each run adds into its own slot of partial
// sums (added up afterwards in a fixed order: the result does not depend on which thread ran what), and each
// group's tables are built by the tasks that stream it (once, unless rows are split).
struct CodebookJob {
  CodebookWeights w;
  const float* x;
  int64_t N, tok_chunk, n_tc, n_gc, n_rc, tpc;  // n_gc: runs of groups, tpc: tiles per row chunk
  std::vector<int64_t> gb;                       // the runs' group bounds [n_gc + 1]
  float* yp;                                     // [n_gc][N][Mt*tile] partial sums
  CodebookKernel k;
  int64_t tasks() const { return n_gc * n_rc * n_tc; }
};

void codebook_task(void* p, int64_t t) {
  const CodebookJob& j = *static_cast<const CodebookJob*>(p);
  const int64_t tc = t % j.n_tc, rc = (t / j.n_tc) % j.n_rc, gc = t / (j.n_tc * j.n_rc);
  const int64_t g0 = j.gb[gc], g1 = j.gb[gc + 1];
  const int64_t t0 = rc * j.tpc, t1 = std::min(j.w.Mt, t0 + j.tpc);
  const int64_t n0 = tc * j.tok_chunk, n1 = std::min(j.N, n0 + j.tok_chunk);
  if (g0 >= g1 || t0 >= t1) return;
  const int64_t ldy = j.w.Mt * j.w.tile();
  // the task's part of its run's sums, zeroed here (in parallel, and warm in cache for the kernel)
  float* yp = j.yp + (gc * j.N + n0) * ldy;
  for (int64_t n = 0; n < n1 - n0; ++n) std::memset(yp + n * ldy + t0 * j.w.tile(), 0, (t1 - t0) * j.w.tile() * sizeof(float));
  thread_local std::vector<float> tables;
  const size_t need = (size_t)codebook_table_floats(j.w, n1 - n0);
  if (tables.size() < need) tables.resize(need);
  j.k(j.w, j.x + n0 * j.w.Kp, j.w.Kp, n1 - n0, g0, g1, t0, t1, yp, ldy, tables.data());
}

struct ReduceJob {
  const float* yp;
  float* y;
  int64_t N, M, ldy, n_sums, chunk;  // task t: token t / (columns / chunk), the columns of its chunk
};

constexpr size_t kKeepFloats = size_t(1) << 20;  // 4 MiB: decode's partial sums fit, prefill's need not
constexpr int64_t kReduceChunk = 2048;            // columns per reduce task (one token's sums split across threads)

void reduce_task(void* p, int64_t t) {
  const ReduceJob& r = *static_cast<const ReduceJob*>(p);
  const int64_t per = (r.M + r.chunk - 1) / r.chunk, n = t / per, i0 = (t % per) * r.chunk, i1 = std::min(r.M, i0 + r.chunk);
  float* dst = r.y + n * r.M;
  std::memcpy(dst + i0, r.yp + n * r.ldy + i0, (i1 - i0) * sizeof(float));
  for (int64_t gc = 1; gc < r.n_sums; ++gc) {
    const float* src = r.yp + (gc * r.N + n) * r.ldy;
    for (int64_t i = i0; i < i1; ++i) dst[i] += src[i];
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

struct Codes16Job {
  const CodebookWeights* w;
  uint8_t* out;
};

// one (group, 32-row tile): its two 16-row blocks of codes16 from the tile's nibble codes
void codes16_task(void* p, int64_t task) {
  const Codes16Job& j = *static_cast<const Codes16Job*>(p);
  const CodebookWeights& w = *j.w;
  const int64_t grp = task / w.Mt, tile = task % w.Mt;
  const int64_t P = w.segs(grp) * w.m, P8 = w.pairs8(grp);
  const uint8_t* tc = w.group_codes(grp) + tile * w.pairs_padded(grp) * 16;  // byte [q/2][row]: pair q's nibble
  auto code = [&](int64_t q, int64_t row) -> uint8_t { return q < P ? (tc[(q / 2) * 32 + row] >> (4 * (q & 1))) & 15 : 0; };
  for (int64_t h = 0; h < 2; ++h) {
    uint8_t* o = j.out + (w.group_codes16(grp) - w.codes16) + (2 * tile + h) * P8 * 8;
    for (int64_t s = 0; s < P8 / 8; ++s)
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t t = 0; t < 4; ++t)
          o[s * 64 + 4 * r + t] = (uint8_t)(code(8 * s + t, 16 * h + r) | code(8 * s + 4 + t, 16 * h + r) << 4);
  }
}

}  // namespace

void codebook_make_codes16(const CodebookWeights& w, uint8_t* codes16) {
  CodebookWeights v = w;
  v.codes16 = codes16;  // group_codes16's base
  Codes16Job j{&v, codes16};
  pool_run(w.G * w.Mt, codes16_task, &j);
}

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
    // (room for 2 tokens' tables at least: the AVX2 decode path double-buffers them)
    const int64_t pp = w.pairs8_full();  // >= pairs_padded_full: the AVX-512 kernel's tables run to 8 pairs
    return std::max<int64_t>(Lut4Scratch::floats(std::max<int64_t>(N, 2), pp), 32 * w.group + pp * 8) + 64;
  }
  return std::max<int64_t>(N * w.segs_full() * w.m * w.nc, 8 * w.group) + 64;
}

bool codebook_vbmi_active() {
  const std::string& isa = selected_isa();
  return (isa == "avx512" || isa == "amx") && cpu_features().avx512vbmi;
}

CodebookKernel codebook_kernel(bool psum, const char** name) {
  const bool scalar = selected_isa() == "scalar";
  if (psum && codebook_vbmi_active()) {
    if (name) *name = "avx512vbmi";
    return codebook_psum_vbmi;
  }
  if (name) *name = scalar ? "scalar" : "avx2";
  if (psum) return scalar ? codebook_psum_scalar : codebook_psum_avx2;
  return scalar ? codebook_dequant_scalar : codebook_dequant_avx2;
}

void codebook_run(const CodebookWeights& w, const float* x, int64_t N, float* y, CodebookKernel k) {
  const bool psum = k == codebook_psum_scalar || k == codebook_psum_avx2 || k == codebook_psum_vbmi;
  CodebookJob j;
  j.w = w;
  j.x = x;
  j.N = N;
  j.k = k;
  j.n_rc = 1;
  // Psumbook: a few tokens per task so their tables (N x 32 KiB) stay in L2 while the codes of a row tile
  // are reused; dequantize: many tokens per dequantized [8 rows][group] buffer.
  j.tok_chunk = std::min<int64_t>(std::max<int64_t>(N, 1), psum ? 4 : 64);
  j.n_tc = (N + j.tok_chunk - 1) / j.tok_chunk;
  const int64_t T = pool_threads(), want = 4 * T;
  j.gb.push_back(0);
  if (j.n_tc == 1 && (T == 1 || w.G >= 2 * T)) {
    // decode: one equal run of groups a thread, each one contiguous stream (as the integer GEMV's row runs,
    // linear.cpp, where the reasons are; here also T partial sums to add, not T + the tail runs); one thread:
    // one run (no partial sums to add)
    for (int64_t t = 1; t <= T; ++t) j.gb.push_back(w.G * t / T);
  } else {
    // few token chunks: equal group chunks (each builds only its own tables), then rows if there are too few
    // groups; many: token chunks only
    int64_t n_gc = 1;
    if (j.n_tc < want) {
      n_gc = std::min<int64_t>(w.G, (want + j.n_tc - 1) / j.n_tc);
      j.n_rc = std::min<int64_t>(w.Mt, std::max<int64_t>(1, (want + n_gc * j.n_tc - 1) / (n_gc * j.n_tc)));
    }
    const int64_t gpc = (w.G + n_gc - 1) / n_gc;
    for (int64_t g = gpc; g < w.G + gpc; g += gpc) j.gb.push_back(std::min(g, w.G));
  }
  j.n_gc = (int64_t)j.gb.size() - 1;
  j.tpc = (w.Mt + j.n_rc - 1) / j.n_rc;
  if (!w.lut4()) j.tpc = (j.tpc + 7) / 8 * 8;  // whole blocks of 64 rows (the VBMI kernel's unit)
  j.n_rc = (w.Mt + j.tpc - 1) / j.tpc;
  const int64_t ldy = w.Mt * w.tile();
  // the partial sums: up to kKeepFloats (decode sizes) a buffer kept by the calling thread (no allocation and
  // page faults per call); the tasks zero what they use
  thread_local std::vector<float> keep;
  std::vector<float> fresh;
  const size_t need = (size_t)(j.n_gc * N * ldy);
  std::vector<float>& buf = need > kKeepFloats ? fresh : keep;
  if (buf.size() < need) buf.resize(need);
  j.yp = buf.data();
  pool_run(j.tasks(), codebook_task, &j);
  // y = the sum of the partial sums; one token's columns split across the threads
  ReduceJob r{j.yp, y, N, w.M, ldy, j.n_gc, kReduceChunk};
  const int64_t rtasks = N * ((w.M + r.chunk - 1) / r.chunk);
  if (rtasks == 1 || r.n_sums == 1) {
    for (int64_t t = 0; t < rtasks; ++t) reduce_task(&r, t);
  } else {
    pool_run(rtasks, reduce_task, &r);
  }
}

}  // namespace lowbit
