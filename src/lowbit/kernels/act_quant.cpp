#include "act_quant.h"

#include <algorithm>
#include <cmath>

#include "thread_pool.h"

namespace lowbit {
namespace {

struct Ctx {
  const float* x;
  int64_t K, ldx, Kp, group, G;
  int8_t* q;
  float* scale;
  int32_t* sum;
};

void quantize_row(void* p, int64_t n) {
  const Ctx& c = *static_cast<const Ctx*>(p);
  const float* xr = c.x + n * c.ldx;
  int8_t* qr = c.q + n * c.Kp;
  for (int64_t g = 0; g < c.G; ++g) {
    const int64_t k0 = g * c.group, k1 = std::min(k0 + c.group, c.K), kend = std::min(k0 + c.group, c.Kp);
    float amax = 0.f;
    for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(xr[k]));
    int32_t s = 0;
    if (amax > 0.f && std::isfinite(amax)) {
      const float inv = 127.f / amax;
      for (int64_t k = k0; k < k1; ++k) {
        float v = std::nearbyint(xr[k] * inv);
        v = std::min(127.f, std::max(-127.f, v));
        qr[k] = (int8_t)v;
        s += (int32_t)v;
      }
      c.scale[n * c.G + g] = amax / 127.f;
    } else {
      for (int64_t k = k0; k < k1; ++k) qr[k] = 0;
      c.scale[n * c.G + g] = 0.f;
    }
    for (int64_t k = std::max(k0, k1); k < kend; ++k) qr[k] = 0;
    c.sum[n * c.G + g] = s;
  }
}

}  // namespace

void quantize_activations(const float* x, int64_t N, int64_t K, int64_t ldx, int64_t Kp, int64_t group,
                          int8_t* q, float* scale, int32_t* sum) {
  Ctx c{x, K, ldx, Kp, group, (Kp + group - 1) / group, q, scale, sum};
  if (N >= 8) pool_run(N, quantize_row, &c);
  else
    for (int64_t n = 0; n < N; ++n) quantize_row(&c, n);
}

}  // namespace lowbit
