// The forward pass of a llama-family decoder (BitNet as flags, family extras as options) in C++: one call
// runs every layer over R token rows — RMSNorm, Q/K/V (one pool run), RoPE, the static KV cache writes,
// causal attention (rows x heads on the pool, sliding window and soft-cap included), o_proj, gate/up (one
// pool run), SiLU / squared ReLU / GELU, down_proj — and the lm_head. The rows are N consecutive tokens of
// one sequence (prefill: forward), one token (decode), or one token of each of B sequences (decode_batch:
// continuous batching), all through the same step: the projections run as GEMMs over the R rows (GEMVs for
// R = 1), and attention of row r reads its own slot up to its own position, so a prefill chunk is causal
// because every row's K/V are written before attention runs. A decode step (one row) has fewer serial
// stretches: each kv head's norms, RoPE and cache write run inside its attention task, and the activation
// inside the gate/up tasks (run_gated), bitwise as the several-row step. The Python model
// (lowbit.model.llama) keeps a numpy twin of this block as the test oracle.
#pragma once
#include <cstdint>
#include <vector>

#include "attention.h"
#include "linear.h"

namespace lowbit {

struct DecoderLayer {
  LinearRef q, k, v, o, gate, up, down;
  const float* ln1 = nullptr;       // [hidden]
  const float* ln2 = nullptr;       // [hidden]
  const float* attn_sub = nullptr;  // [heads*hd] or null (BitNet)
  const float* ffn_sub = nullptr;   // [inter] or null (BitNet)
  void* kc = nullptr;               // [kv_heads][max_ctx][row], this layer's slice of the static cache,
  void* vc = nullptr;               // of DecoderShape::kv (row: hd, or hd + 4 int8 with the scale)
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
  KvType kv;    // what the cache holds
  float qscale = 0.f;   // q multiplier before q.k; 0: 1/sqrt(hd)
  float softcap = 0.f;  // attention logit soft-cap (Gemma 2); 0: none
};

// Where a step's time goes (Decoder::set_profile). Off by default, and then nothing is timed; when on,
// each stretch of a step adds its ticks (TSC) to one category, and the pool's idle time at the join of
// every pool run inside the stretch (the mean over threads of the time from a thread's last task to the
// end of the run) goes to kJoin instead, so the categories add up to the step's wall time; join_in splits
// kJoin by the stretch it fell in (the joins of the GEMVs, of attention, of the lm_head).
enum ProfCat : int { kProfGemv, kProfJoin, kProfAttn, kProfHead, kProfRest, kProfCats };
enum StepKind : int { kStepDecode, kStepPrefill, kStepBatch, kStepKinds };
struct StepProfile {
  uint64_t ticks[kProfCats] = {};
  uint64_t join_in[kProfCats] = {};  // ticks[kProfJoin] by the stretch whose pool runs they ended (gemv, attention, ...)
  uint64_t total_ticks = 0;  // sum of the categories
  double seconds = 0;        // the same steps' wall time by steady_clock (converts ticks to seconds)
  int64_t steps = 0, tokens = 0;
};

class Decoder {
 public:
  Decoder(const DecoderShape& shape, const float* rope_c, const float* rope_s);
  void add_layer(const DecoderLayer& layer) { layers_.push_back(layer); }
  DecoderLayer& layer(size_t i) { return layers_.at(i); }
  void set_attention(float qscale, float softcap) { s_.qscale = qscale; s_.softcap = softcap; }
  void set_output(const float* norm, const LinearRef& head) { norm_ = norm; head_ = head; }
  // One token. x: [hidden] embedding of the token at `pos` (overwritten: the residual stream); logits: [vocab].
  void decode(float* x, int64_t pos, float* logits);
  // N consecutive tokens of the sequence in `slot`, at positions pos..pos+N-1 (prefill; the caller chunks
  // long prompts). x: [N][hidden] embeddings (overwritten); logits: [N][vocab] (kAllLogits), [vocab] of the
  // last token (kLastLogits), or none (kNoLogits: a prompt chunk that is not the last; may be null).
  enum Logits : int { kNoLogits = 0, kLastLogits = 1, kAllLogits = 2 };
  void forward(float* x, int64_t N, int64_t pos, int64_t slot, float* logits, Logits which);
  // The batched step (continuous batching): B tokens of B sequences, each at its own position and in its
  // own slot of a multi-slot cache whose slot 0 the layers' kc/vc point at (slot s starts slot_stride
  // elements later). x: [B][hidden] embeddings (overwritten); pos, slot: [B]; logits: [B][vocab].
  void decode_batch(float* x, int64_t B, const int64_t* pos, const int64_t* slot, float* logits);
  // The mixed step (continuous batching with chunked prefill): R rows of any sequences, row r at position
  // pos[r] of slot slot[r] — the decode rows of the running sequences and prompt chunks of newcomers in one
  // call. The caller orders the rows so that those needing logits come last: logits [R - first_logit][vocab]
  // of rows first_logit..R-1 (none when first_logit == R). A slot's rows must cover consecutive positions
  // after what the slot holds (attention reads every position up to the row's own).
  void step_rows(float* x, int64_t R, const int64_t* pos, const int64_t* slot, float* logits, int64_t first_logit) {
    step(x, R, pos, slot, logits, first_logit, kStepBatch);
  }
  void set_slots(int64_t n_slots, int64_t slot_stride) { n_slots_ = n_slots; slot_stride_ = slot_stride; }
  int64_t n_slots() const { return n_slots_; }
  int64_t vocab() const { return head_.M; }
  const DecoderShape& shape() const { return s_; }
  bool has_output() const { return norm_ != nullptr; }
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  size_t n_layers() const { return layers_.size(); }
  // Profiling: on (and the counters reset) or off; the counters per kind of step.
  void set_profile(bool on);
  bool profiling() const { return prof_on_; }
  const StepProfile& profile(StepKind k) const { return prof_[k]; }
  // The decode schedule across matrices (threads that finish a GEMV early prefetch the next matrix's
  // first blocks); on by default, a switch for side-by-side measurements.
  void set_prefetch_next(bool on) { prefetch_next_ = on; }
  // Shortest chunk of a decode row's context split across the pool (flash-decoding; attention.h); 0: never.
  void set_attn_split_min(int64_t n) { attn_split_min_ = n; }

 private:
  // The one step: R rows, row r at position pos[r] of slot slot[r]; logits of rows [first_logit, R).
  void step(float* x, int64_t R, const int64_t* pos, const int64_t* slot, float* logits, int64_t first_logit,
            StepKind kind);

  DecoderShape s_;
  const float* C_;  // RoPE [max_ctx][hd]: x*C + swap_halves(x)*S
  const float* S_;
  std::vector<DecoderLayer> layers_;
  const float* norm_ = nullptr;
  LinearRef head_;
  ActScratch act_;
  int64_t n_slots_ = 1, slot_stride_ = 0;
  std::vector<float> xn_, q_, k_, v_, att_, g_, u_, tmp_;  // step scratch, [R][...]
  std::vector<int64_t> pos_, slot_;                        // forward's positions and slots, [N]
  bool prof_on_ = false;
  bool prefetch_next_ = true;
  int64_t attn_split_min_ = kAttnSplitMin;
  StepProfile prof_[kStepKinds];
};

}  // namespace lowbit
