// RSR: choice of the kernel path and the thread-pool job (baseline x86-64 flags). Layout in rsr.h.
#include "rsr.h"

#include <algorithm>
#include <string>
#include <vector>

#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {
namespace {

struct RsrJob {
  const RsrCall* c;
  const RsrKernels* k;
  int64_t tile, ntiles, blocks_per_task;
};

void rsr_task(void* p, int64_t t) {
  const RsrJob& j = *static_cast<const RsrJob*>(p);
  const RsrCall& c = *j.c;
  const RsrIndex& ix = c.ix;
  const int64_t run = t / j.ntiles, tile = t % j.ntiles;
  const int64_t b0 = run * j.blocks_per_task, b1 = std::min(ix.nblocks, b0 + j.blocks_per_task);
  const int64_t n0 = tile * j.tile;
  const int nt = (int)std::min(j.tile, c.ldx - n0);  // ldx is 1 or padded to a whole number of vectors
  const int64_t nreal = std::min<int64_t>(nt, c.N - n0);
  thread_local std::vector<int32_t> scratch;  // u [S][nt], r [k][nt], c [K + 4]: 4-byte elements
  const size_t need = (size_t)(ix.S + ix.k) * nt + ix.K + 4;
  if (scratch.size() < need) scratch.resize(need);
  int32_t* u = scratch.data();
  int32_t* r = u + ix.S * nt;
  float* rf = reinterpret_cast<float*>(r);
  int32_t* cs = r + ix.k * nt;
  for (int64_t blk = b0; blk < b1; ++blk) {
    if (c.i8)
      j.k->block_i8(ix, blk, static_cast<const int8_t*>(c.xT) + n0, c.ldx, nt, c.plus, u, r, cs);
    else
      j.k->block_f32(ix, blk, static_cast<const float*>(c.xT) + n0, c.ldx, nt, c.plus, reinterpret_cast<float*>(u), rf,
                     reinterpret_cast<float*>(cs));
    const int64_t rows = std::min<int64_t>(ix.k, ix.M - blk * ix.k);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t m = blk * ix.k + i;
      const float s = c.coef * (c.rowscale ? c.rowscale[m] : 1.f);
      for (int64_t n = 0; n < nreal; ++n) {
        const float v = c.i8 ? (float)r[i * nt + n] : rf[i * nt + n];
        const float out = s * (c.tokscale ? c.tokscale[n0 + n] : 1.f) * v;
        float& dst = c.y[(n0 + n) * c.ldy + m];
        dst = c.accumulate ? dst + out : out;
      }
    }
  }
}

}  // namespace

const RsrKernels& rsr_kernels() {
  const std::string& isa = selected_isa();
  if (isa == "scalar") return rsr_kernels_scalar;
  return isa == "avx512" || isa == "amx" ? rsr_kernels_avx512 : rsr_kernels_avx2;
}

void rsr_run(const RsrCall& c, const RsrKernels& k) {
  RsrJob j{&c, &k, std::min<int64_t>(c.i8 ? kRsrTileI8 : kRsrTileF32, c.ldx), 0, 0};
  j.ntiles = (c.ldx + j.tile - 1) / j.tile;
  // About four tasks per thread over blocks (each block is independent: the paper's parallelization).
  const int64_t want = std::max<int64_t>(1, 4 * (int64_t)pool_threads() / j.ntiles);
  j.blocks_per_task = std::max<int64_t>(1, (c.ix.nblocks + want - 1) / want);
  const int64_t runs = (c.ix.nblocks + j.blocks_per_task - 1) / j.blocks_per_task;
  pool_run(runs * j.ntiles, rsr_task, &j);
}

}  // namespace lowbit
