// rsr-lut: table construction, kernel choice and the thread-pool job (layout in rsr_lut.h).
#include "rsr_lut.h"

#include <algorithm>

#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {

const LutKernels& lut_kernels() {
  const std::string& isa = selected_isa();
  if (isa == "scalar") return lut_kernels_scalar;
  return isa == "avx512" || isa == "amx" ? lut_kernels_avx512 : lut_kernels_avx2;
}

void lut_tables(const int8_t* x, int64_t K, int8_t* tab) {
  const int64_t K4 = (K + 3) / 4;
  for (int64_t c = 0; c < K4; ++c) {
    int16_t v[4];
    for (int i = 0; i < 4; ++i) v[i] = 4 * c + i < K ? x[4 * c + i] : 0;
    int16_t s[16];
    s[0] = 0;
    for (int i = 0; i < 4; ++i)  // the patterns with bit i set are those without it, plus x[4c + i]
      for (int p = 0; p < 1 << i; ++p) s[(1 << i) + p] = (int16_t)(s[p] + v[i]);
    int8_t* t = tab + c * 32;
    for (int p = 0; p < 16; ++p) {
      t[p] = (int8_t)(uint8_t)(s[p] & 0xFF);
      t[16 + p] = (int8_t)(s[p] >> 8);
    }
  }
}

namespace {

struct LutJob {
  const LutCall* c;
  const LutKernels* k;
};

void lut_task(void* ctx, int64_t tile) {
  const LutJob& j = *static_cast<const LutJob*>(ctx);
  const LutCall& c = *j.c;
  const int64_t K4 = (c.K + 3) / 4;
  const uint8_t* wt = c.w + tile * K4 * c.p.planes * 32;
  const int64_t m0 = tile * kLutRows, rows = std::min<int64_t>(kLutRows, c.M - m0);
  alignas(32) int32_t out[kLutRows];
  for (int64_t n = 0; n < c.N; ++n) {  // the tile's weights stay in cache across tokens
    j.k->tile(wt, c.tab + n * K4 * 32, K4, c.p, out);
    const float ts = c.coef * (c.tokscale ? c.tokscale[n] : 1.f);
    float* yn = c.y + n * c.ldy + m0;
    for (int64_t i = 0; i < rows; ++i) {
      const float v = ts * (c.rowscale ? c.rowscale[m0 + i] : 1.f) * (float)out[i];
      yn[i] = c.accumulate ? yn[i] + v : v;
    }
  }
}

struct TabJob {
  const int8_t* x;
  int64_t K;
  int8_t* tab;
};

void tab_task(void* ctx, int64_t n) {
  const TabJob& j = *static_cast<const TabJob*>(ctx);
  lut_tables(j.x + n * j.K, j.K, j.tab + n * ((j.K + 3) / 4) * 32);
}

}  // namespace

void lut_build_tables(const int8_t* x, int64_t N, int64_t K, int8_t* tab) {
  TabJob j{x, K, tab};
  pool_run(N, tab_task, &j);
}

void lut_run(const LutCall& c, const LutKernels& k) {
  LutJob j{&c, &k};
  pool_run((c.M + kLutRows - 1) / kLutRows, lut_task, &j);
}

}  // namespace lowbit
