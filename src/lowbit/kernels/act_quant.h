#pragma once
#include <cstdint>

namespace lowbit {

// x: f32 [N][ldx] (K used) -> q: int8 [N][Kp] (zero past K), scale: f32 [N][G], sum: int32 [N][G].
// Per token and group: scale = absmax / 127, q = clamp(rint(x * (127 / absmax)), -127, 127).
void quantize_activations(const float* x, int64_t N, int64_t K, int64_t ldx, int64_t Kp, int64_t group,
                          int8_t* q, float* scale, int32_t* sum);

}  // namespace lowbit
