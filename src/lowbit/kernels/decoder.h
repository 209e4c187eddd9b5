// The decode step of a llama-family decoder (BitNet as flags) in C++: one call per token runs every
// layer — RMSNorm, Q/K/V (one pool run), RoPE, the static KV cache, attention (heads on the pool),
// o_proj, gate/up (one pool run), SiLU or squared ReLU, down_proj — and the lm_head, so the Python
// overhead per token is one call. The Python model (lowbit.model.llama) is the reference it is tested
// against, and keeps prefill.
#pragma once
#include <cstdint>
#include <vector>

#include "linear.h"

namespace lowbit {

struct DecoderLayer {
  LinearRef q, k, v, o, gate, up, down;
  const float* ln1 = nullptr;       // [hidden]
  const float* ln2 = nullptr;       // [hidden]
  const float* attn_sub = nullptr;  // [heads*hd] or null (BitNet)
  const float* ffn_sub = nullptr;   // [inter] or null (BitNet)
  void* kc = nullptr;               // [kv_heads][max_ctx][hd], this layer's slice of the static cache,
  void* vc = nullptr;               // float32 or float16 (DecoderShape::kv_f16)
};

struct DecoderShape {
  int64_t hidden, n_heads, n_kv, hd, inter, max_ctx;
  float eps;
  int act;      // 0 SiLU, 1 squared ReLU
  bool kv_f16;  // the cache holds float16
};

class Decoder {
 public:
  Decoder(const DecoderShape& shape, const float* rope_c, const float* rope_s);
  void add_layer(const DecoderLayer& layer) { layers_.push_back(layer); }
  void set_output(const float* norm, const LinearRef& head) { norm_ = norm; head_ = head; }
  // x: [hidden] embedding of the token at `pos` (overwritten: the residual stream); logits: [vocab].
  void decode(float* x, int64_t pos, float* logits);
  const DecoderShape& shape() const { return s_; }
  bool has_output() const { return norm_ != nullptr; }
  int64_t vocab() const { return head_.M; }
  size_t n_layers() const { return layers_.size(); }

 private:
  void attention(const DecoderLayer& L, int64_t t);

  DecoderShape s_;
  const float* C_;  // RoPE [max_ctx][hd]: x*C + swap_halves(x)*S
  const float* S_;
  std::vector<DecoderLayer> layers_;
  const float* norm_ = nullptr;
  LinearRef head_;
  std::vector<float> xn_, q_, k_, v_, att_, g_, u_, tmp_, scores_;
  ActScratch act_;
};

}  // namespace lowbit
