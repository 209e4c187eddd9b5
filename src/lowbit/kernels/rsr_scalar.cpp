// RSR / RSR++ in plain C++: the fallback without AVX2 and the twin the SIMD path is tested against
// (layout and bounds in rsr.h).
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "rsr.h"

namespace lowbit {
namespace {

#include "rsr_step2.inc"

template <typename P, typename X, typename A>
void step1(const RsrIndex& ix, int64_t blk, const X* xT, int64_t ldx, int nt, A* u, A* c) {
  const P* perm = static_cast<const P*>(ix.perm) + blk * ix.K;
  if (nt == 1) return step1_gemv<P, X, A>(ix, blk, xT, u, c);
  for (int64_t p = 0; p < ix.S; ++p) {
    A* up = u + p * nt;
    std::fill(up, up + nt, A(0));
    for (int64_t l = ix.seg_at(blk, p), e = ix.seg_at(blk, p + 1); l < e; ++l) {
      const X* row = xT + (int64_t)perm[l] * ldx;
      for (int t = 0; t < nt; ++t) up[t] += (A)row[t];
    }
  }
}

void block_f32(const RsrIndex& ix, int64_t blk, const float* xT, int64_t ldx, int nt, bool plus, float* u, float* r, float* c) {
  if (ix.perm32) step1<uint32_t>(ix, blk, xT, ldx, nt, u, c);
  else step1<uint16_t>(ix, blk, xT, ldx, nt, u, c);
  step2<float>(ix, ix.valf, u, nt, plus, r);
}

void block_i8(const RsrIndex& ix, int64_t blk, const int8_t* xT, int64_t ldx, int nt, bool plus, int32_t* u,
              int32_t* r, int32_t* c) {
  if (ix.perm32) step1<uint32_t>(ix, blk, xT, ldx, nt, u, c);
  else step1<uint16_t>(ix, blk, xT, ldx, nt, u, c);
  step2<int32_t>(ix, ix.vali, u, nt, plus, r);
}

}  // namespace

const RsrKernels rsr_kernels_scalar{"scalar", block_f32, block_i8};

void standard_gemv_u8(const uint8_t* w, const float* x, float* y, int64_t M, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    const uint8_t* row = w + m * K;
    float acc = 0.f;
    for (int64_t k = 0; k < K; ++k) acc += (float)row[k] * x[k];
    y[m] = acc;
  }
}

}  // namespace lowbit
