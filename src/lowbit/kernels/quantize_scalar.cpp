// Scalar twin of the quantizer rows (baseline x86-64 / any CPU).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "quantize.h"

namespace lowbit {
namespace quant_scalar {

static void load_f16(const void* src, int64_t K, float* dst) {
  const uint16_t* s = (const uint16_t*)src;
  for (int64_t i = 0; i < K; ++i) dst[i] = f16_to_f32(s[i]);
}

// numpy's pairwise summation of float32 (the order of np.sum / np.add.reduce on a contiguous axis)
static float pairwise_sum(const float* a, int64_t n) {
  if (n < 8) {
    float res = 0.f;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    float r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

static void minmax(const float* x, int64_t n, float* lo, float* hi) {
  float l = x[0], h = x[0];
  for (int64_t i = 1; i < n; ++i) {
    l = std::min(l, x[i]);
    h = std::max(h, x[i]);
  }
  *lo = l;
  *hi = h;
}

static float absmax(const float* x, int64_t n) {
  float m = 0.f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

static void int8_pass(const float* x, int64_t n, float inv, uint8_t* c) {
  for (int64_t i = 0; i < n; ++i) {
    float q = round_even(x[i] * inv);
    q = std::min(std::max(q, -127.f), 127.f);
    c[i] = (uint8_t)(int)(q + 128.f);
  }
}

static float affine_err(const float* x, int64_t n, float a, float b, float inv, float top, float* e) {
  for (int64_t i = 0; i < n; ++i) {
    float c = round_even((x[i] - b) * inv);
    c = std::min(std::max(c, 0.f), top);
    const float t = ((c * a) + b) - x[i];
    e[i] = t * t;
  }
  return pairwise_sum(e, n);
}

static void affine_codes(const float* x, int64_t n, float b, float inv, float top, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) {
    const float c = round_even((x[i] - b) * inv);
    codes[i] = (uint8_t)(int)std::min(std::max(c, 0.f), top);
  }
}

#include "quantize_rows.inc"

}  // namespace quant_scalar

const QuantRowKernels& quant_kernels_scalar() { return quant_scalar::table; }

}  // namespace lowbit
