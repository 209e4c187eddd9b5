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
  // family extras (set_layer_extras), all optional:
  const float* q_norm = nullptr;     // [hd]: RMSNorm of every q head before RoPE (Qwen 3)
  const float* k_norm = nullptr;     // [hd]: same for k
  const float* post_attn = nullptr;  // [hidden]: RMSNorm of o_proj's output before the residual add (Gemma 2)
  const float* post_ffn = nullptr;   // [hidden]: same for down_proj's output
  int64_t window = 0;                // > 0: attend to the last `window` positions only (sliding window)
};

struct DecoderShape {
  int64_t hidden, n_heads, n_kv, hd, inter, max_ctx;
  float eps;
  int act;      // 0 SiLU, 1 squared ReLU, 2 GELU (tanh)
  bool kv_f16;  // the cache holds float16
  float qscale = 0.f;   // q multiplier before q.k; 0: 1/sqrt(hd)
  float softcap = 0.f;  // attention logit soft-cap (Gemma 2); 0: none
};

class Decoder {
 public:
  Decoder(const DecoderShape& shape, const float* rope_c, const float* rope_s);
  void add_layer(const DecoderLayer& layer) { layers_.push_back(layer); }
  DecoderLayer& layer(size_t i) { return layers_.at(i); }
  void set_attention(float qscale, float softcap) { s_.qscale = qscale; s_.softcap = softcap; }
  void set_output(const float* norm, const LinearRef& head) { norm_ = norm; head_ = head; }
  // x: [hidden] embedding of the token at `pos` (overwritten: the residual stream); logits: [vocab].
  void decode(float* x, int64_t pos, float* logits);
  // The batched step (continuous batching): B tokens of B sequences, each at its own position and in its
  // own slot of a multi-slot cache whose slot 0 the layers' kc/vc point at (slot s starts slot_stride
  // elements later). The projections run as one GEMM over the B rows; attention is per sequence.
  // x: [B][hidden] embeddings (overwritten); pos, slot: [B]; logits: [B][vocab].
  void set_slots(int64_t n_slots, int64_t slot_stride) { n_slots_ = n_slots; slot_stride_ = slot_stride; }
  int64_t n_slots() const { return n_slots_; }
  int64_t vocab() const { return head_.M; }
  void decode_batch(float* x, int64_t B, const int64_t* pos, const int64_t* slot, float* logits);
  const DecoderShape& shape() const { return s_; }
  bool has_output() const { return norm_ != nullptr; }
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  size_t n_layers() const { return layers_.size(); }

 private:
  void attention(const DecoderLayer& L, int64_t t);  // over positions [t - window, t) (or [0, t))

  DecoderShape s_;
  const float* C_;  // RoPE [max_ctx][hd]: x*C + swap_halves(x)*S
  const float* S_;
  std::vector<DecoderLayer> layers_;
  const float* norm_ = nullptr;
  LinearRef head_;
  std::vector<float> xn_, q_, k_, v_, att_, g_, u_, tmp_, scores_;
  ActScratch act_;
  int64_t n_slots_ = 1, slot_stride_ = 0;
  std::vector<float> bxn_, bq_, bk_, bv_, batt_, bg_, bu_, btmp_;  // decode_batch scratch, [B][...]
};

}  // namespace lowbit
