// The KV cache arrays the bindings take (KvType, common.h): float32 or float16 (as uint16) rows of head_dim,
// or int8 rows of head_dim + 4 (the values, then the float32 scale). One mapping for the attention and the
// decoder bindings.
#pragma once
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "common.h"
#include "py_args.h"

namespace lowbit::py {

// The array dtype of a cache of KvType t.
inline nb::dlpack::dtype kv_array_dtype(KvType t) {
  return t == KvType::kF32 ? nb::dtype<float>() : t == KvType::kF16 ? nb::dtype<uint16_t>() : nb::dtype<int8_t>();
}

// The KvType of a cache array from its dtype, checked against the length of its rows (kv_row_units).
template <class Array>
KvType cache_type(const Array& kc, int64_t hd, const std::string& fn) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kI8}) {
    if (kc.dtype() != kv_array_dtype(t)) continue;
    if ((int64_t)kc.shape(kc.ndim() - 1) != kv_row_units(t, hd))
      fail(fn + (t == KvType::kI8 ? ": an int8 cache's rows must be head_dim + 4 bytes (values, then the float32 scale)"
                                  : ": a float cache's rows must be head_dim long"));
    return t;
  }
  fail(fn + ": the KV cache must be float32, float16 (as uint16) or int8 (rows of head_dim + 4: values, then the scale)");
}

}  // namespace lowbit::py
