#include "act_quant.h"

#include <algorithm>
#include <cmath>

#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {
namespace {

struct Ctx {
  const float* x;
  int64_t K, ldx, Kp, group, G;
  int8_t* q;
  float* scale;
  int32_t* sum;
  const OpsTable* ops;  // read once per call: every row of one call uses the same ISA
};

void quantize_row_n(const Ctx& c, int64_t n) {
  c.ops->quantize_row(c.x + n * c.ldx, c.K, c.Kp, c.group, c.q + n * c.Kp, c.scale + n * c.G, c.sum + n * c.G);
}

// Rows [t * per, (t + 1) * per) of N (pool_rows_per_task).
struct Rows {
  const Ctx* c;
  int64_t N, per;
};
void quantize_task(void* p, int64_t t) {
  const Rows& r = *static_cast<const Rows*>(p);
  for (int64_t n = t * r.per; n < std::min(r.N, (t + 1) * r.per); ++n) quantize_row_n(*r.c, n);
}

}  // namespace

void quantize_activations(const float* x, int64_t N, int64_t K, int64_t ldx, int64_t Kp, int64_t group,
                          int8_t* q, float* scale, int32_t* sum) {
  Ctx c{x, K, ldx, Kp, group, (Kp + group - 1) / group, q, scale, sum, &active_kernels().ops};
  if (N >= 8) {
    const Rows rows{&c, N, pool_rows_per_task(N)};
    pool_run((N + rows.per - 1) / rows.per, quantize_task, (void*)&rows);
  } else {
    for (int64_t n = 0; n < N; ++n) quantize_row_n(c, n);
  }
}

}  // namespace lowbit
