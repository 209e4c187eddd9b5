// Driver of the GGUF block decoders: runs of rows on the thread pool, the active ISA's row decoder.
#include "gguf_decode.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {

bool gguf_block_size(int type, int64_t* values, int64_t* bytes) {
  int64_t v = 256, n = 0;
  switch (type) {
    case kQ4_0: v = 32; n = 18; break;
    case kQ4_1: v = 32; n = 20; break;
    case kQ5_0: v = 32; n = 22; break;
    case kQ5_1: v = 32; n = 24; break;
    case kQ8_0: v = 32; n = 34; break;
    case kQ2_K: n = 84; break;
    case kQ3_K: n = 110; break;
    case kQ4_K: n = 144; break;
    case kQ5_K: n = 176; break;
    case kQ6_K: n = 210; break;
    case kTQ1_0: n = 54; break;
    case kTQ2_0: n = 66; break;
    default: return false;
  }
  *values = v;
  *bytes = n;
  return true;
}

namespace {

constexpr int64_t kRowsPerTask = 16;

struct DecodeJob {
  GGUFRowFn fn;
  const uint8_t* data;
  int64_t K, M, nb, row_bytes;
  const int64_t* rows;
  float* out;
  int8_t* t;
  float* d;
  int type;
  std::atomic<bool> bad{false};
};

void dequant_task(void* ctx, int64_t task) {
  DecodeJob& J = *static_cast<DecodeJob*>(ctx);
  bool finite = true;
  for (int64_t m = task * kRowsPerTask; m < std::min(J.M, (task + 1) * kRowsPerTask); ++m) {
    const int64_t src = J.rows ? J.rows[m] : m;
    float* y = J.out + m * J.K;
    J.fn(J.data + src * J.row_bytes, J.nb, y);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // x - x: 0 for finite x, NaN for NaN and Inf (K: a multiple of 32)
    for (int64_t i = 0; i < J.K; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += y[i + j] - y[i + j];
    for (int j = 0; j < 8; ++j) finite &= acc[j] == 0.f;
  }
  if (!finite) J.bad.store(true, std::memory_order_relaxed);
}

void ternary_task(void* ctx, int64_t task) {
  DecodeJob& J = *static_cast<DecodeJob*>(ctx);
  const int64_t bytes = J.type == kTQ1_0 ? 54 : 66;
  uint8_t c[256];
  bool ok = true;
  for (int64_t m = task * kRowsPerTask; m < std::min(J.M, (task + 1) * kRowsPerTask); ++m) {
    const uint8_t* b = J.data + (J.rows ? J.rows[m] : m) * J.row_bytes;
    for (int64_t i = 0; i < J.nb; ++i, b += bytes) {
      uint16_t h;
      std::memcpy(&h, b + bytes - 2, 2);
      const float d = f16_to_f32(h);
      J.d[m * J.nb + i] = d;
      int8_t* t = J.t + m * J.K + i * 256;
      if (d == 0.f || !std::isfinite(d)) {  // dequantize / d is 0 / 0 or inf / inf: NaN, read as 0
        std::memset(t, 0, 256);
        continue;
      }
      gguf_ternary_codes(J.type, b, c);
      bool three = false;  // code 3: the value 2
      for (int j = 0; j < 256; ++j) {
        three |= c[j] == 3;
        t[j] = (int8_t)((int)c[j] - 1);
      }
      ok &= !three;
    }
  }
  if (!ok) J.bad.store(true, std::memory_order_relaxed);
}

}  // namespace

bool gguf_dequantize(int type, const uint8_t* data, int64_t K, const int64_t* rows, int64_t M, float* out) {
  int64_t values, bytes;
  gguf_block_size(type, &values, &bytes);
  DecodeJob J;
  J.fn = selected_isa() == "scalar" ? gguf_row_scalar(type) : gguf_row_avx2(type);
  J.data = data;
  J.K = K;
  J.M = M;
  J.nb = K / values;
  J.row_bytes = J.nb * bytes;
  J.rows = rows;
  J.out = out;
  pool_run((M + kRowsPerTask - 1) / kRowsPerTask, dequant_task, &J);
  return !J.bad.load();
}

bool gguf_ternary(int type, const uint8_t* data, int64_t K, const int64_t* rows, int64_t M, int8_t* t, float* d) {
  DecodeJob J;
  J.type = type;
  J.data = data;
  J.K = K;
  J.M = M;
  J.nb = K / 256;
  J.row_bytes = J.nb * (type == kTQ1_0 ? 54 : 66);
  J.rows = rows;
  J.t = t;
  J.d = d;
  pool_run((M + kRowsPerTask - 1) / kRowsPerTask, ternary_task, &J);
  return !J.bad.load();
}

}  // namespace lowbit
