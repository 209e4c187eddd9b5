// Scalar twin of the GGUF block decoders (baseline x86-64 / any CPU).
#include <cstdint>
#include <cstring>

#include "common.h"
#include "gguf_decode.h"

namespace lowbit {
namespace gguf_scalar {

#include "gguf_blocks.inc"

}  // namespace gguf_scalar

GGUFRowFn gguf_row_scalar(int type) {
  using namespace gguf_scalar;
  switch (type) {
    case kQ4_0: return row_q4_0;
    case kQ4_1: return row_q4_1;
    case kQ5_0: return row_q5_0;
    case kQ5_1: return row_q5_1;
    case kQ8_0: return row_q8_0;
    case kQ2_K: return row_q2_k;
    case kQ3_K: return row_q3_k;
    case kQ4_K: return row_q4_k;
    case kQ5_K: return row_q5_k;
    case kQ6_K: return row_q6_k;
    case kTQ1_0: return row_tq1_0;
    case kTQ2_0: return row_tq2_0;
    default: return nullptr;
  }
}

void gguf_ternary_codes(int type, const uint8_t* block, uint8_t* c) {
  if (type == kTQ1_0)
    gguf_scalar::tq1_codes(block, c);
  else
    gguf_scalar::tq2_codes(block, c);
}

}  // namespace lowbit
