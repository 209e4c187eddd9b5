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

void quantize_task(void* p, int64_t n) {
  const Ctx& c = *static_cast<const Ctx*>(p);
  c.ops->quantize_row(c.x + n * c.ldx, c.K, c.Kp, c.group, c.q + n * c.Kp, c.scale + n * c.G,
                                    c.sum + n * c.G);
}

}  // namespace

void quantize_activations(const float* x, int64_t N, int64_t K, int64_t ldx, int64_t Kp, int64_t group,
                          int8_t* q, float* scale, int32_t* sum) {
  Ctx c{x, K, ldx, Kp, group, (Kp + group - 1) / group, q, scale, sum, &active_kernels().ops};
  if (N >= 8) pool_run_rows(N, quantize_task, &c);
  else
    for (int64_t n = 0; n < N; ++n) quantize_task(&c, n);
}

}  // namespace lowbit
