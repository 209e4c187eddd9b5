// rsr-lut: table construction, kernel choice and the thread-pool job (layout in rsr_lut.h).
#include "rsr_lut.h"

#include <algorithm>
#include <cstring>

#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {

const LutKernels& lut_kernels() {
  const std::string& isa = selected_isa();
  if (isa == "scalar") return lut_kernels_scalar;
  return isa == "avx512" || isa == "amx" ? lut_kernels_avx512 : lut_kernels_avx2;
}

void lut_tables(const int8_t* x, int64_t K, int8_t* tab, bool i16, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) {
    int16_t v[4];
    for (int i = 0; i < 4; ++i) v[i] = 4 * c + i < K ? x[4 * c + i] : 0;
    int16_t s[16];
    s[0] = 0;
    for (int i = 0; i < 4; ++i)  // the patterns with bit i set are those without it, plus x[4c + i]
      for (int p = 0; p < 1 << i; ++p) s[(1 << i) + p] = (int16_t)(s[p] + v[i]);
    int8_t* t = tab + c * 32;
    if (i16) {
      std::memcpy(t, s, sizeof s);
      continue;
    }
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
  bool pairs;  // tasks of two tiles (k->tile2_binary)
};

// Token n's int32 dots of tile `tile` (out) into y, scaled.
void lut_store(const LutCall& c, int64_t tile, int64_t n, const int32_t* out) {
  const int64_t m0 = tile * kLutRows, rows = std::min<int64_t>(kLutRows, c.M - m0);
  const float ts = c.coef * (c.tokscale ? c.tokscale[n] : 1.f);
  float* yn = c.y + n * c.ldy + m0;
  for (int64_t i = 0; i < rows; ++i) {
    const float v = ts * (c.rowscale ? c.rowscale[m0 + i] : 1.f) * (float)out[i];
    yn[i] = c.accumulate ? yn[i] + v : v;
  }
}

// One task: `per` consecutive tiles from tile * per (2 where the kernel has tile2_binary: a pair at once).
void lut_task(void* ctx, int64_t task) {
  const LutJob& j = *static_cast<const LutJob*>(ctx);
  const LutCall& c = *j.c;
  const int64_t K4 = (c.K + 3) / 4, tiles = (c.M + kLutRows - 1) / kLutRows;
  const int64_t per = j.pairs ? 2 : 1, t0 = task * per, t1 = std::min(tiles, t0 + per);
  auto codes = [&](int64_t t) { return c.w + t * K4 * c.p.planes * 32; };
  alignas(64) int32_t out[2][kLutRows];
  for (int64_t n = 0; n < c.N; ++n) {  // the tiles' weights stay in cache across tokens
    const int8_t* tab = c.tab + n * K4 * 32;
    if (t1 - t0 == 2) {
      j.k->tile2_binary(codes(t0), codes(t0 + 1), tab, K4, c.p, out[0], out[1]);
    } else {
      j.k->tile(codes(t0), tab, K4, c.p, out[0]);
    }
    for (int64_t t = t0; t < t1; ++t) lut_store(c, t, n, out[t - t0]);
  }
}

struct TabJob {
  const int8_t* x;
  int64_t K, parts, per_part;
  int8_t* tab;
  bool i16;
};

void tab_task(void* ctx, int64_t t) {
  const TabJob& j = *static_cast<const TabJob*>(ctx);
  const int64_t n = t / j.parts, K4 = (j.K + 3) / 4, c0 = (t % j.parts) * j.per_part;
  lut_tables(j.x + n * j.K, j.K, j.tab + n * K4 * 32, j.i16, c0, std::min(K4, c0 + j.per_part));
}

}  // namespace

void lut_build_tables(const int8_t* x, int64_t N, int64_t K, int8_t* tab, bool i16) {
  const int64_t K4 = (K + 3) / 4;
  // fewer tokens than 2 tasks a thread: their chunks in parts of >= 512 (16 KB of tables)
  const int64_t want = (2 * pool_threads() + N - 1) / N;
  const int64_t parts = std::max<int64_t>(1, std::min(want, K4 / 512));
  const int64_t per_part = (K4 + parts - 1) / parts;
  TabJob j{x, K, (K4 + per_part - 1) / per_part, per_part, tab, i16};
  pool_run(N * j.parts, tab_task, &j);
}

void lut_run(const LutCall& c, const LutKernels& k) {
  const int64_t tiles = (c.M + kLutRows - 1) / kLutRows;
  // tile pairs only where each thread still gets a few tasks (a short matrix keeps one tile a task)
  const bool pairs = k.tile2_binary && c.p.planes == 1 && tiles >= 4 * (int64_t)pool_threads();
  LutJob j{&c, &k, pairs};
  pool_run(pairs ? (tiles + 1) / 2 : tiles, lut_task, &j);
}

}  // namespace lowbit
