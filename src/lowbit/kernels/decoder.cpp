#include "decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "attention.h"
#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {

Decoder::Decoder(const DecoderShape& shape, const float* rope_c, const float* rope_s)
    : s_(shape), C_(rope_c), S_(rope_s) {}

namespace {
// RMSNorm of each of `heads` vectors of hd in place (Qwen 3's q/k norms).
void norm_heads(const OpsTable& ops, float* x, int64_t heads, int64_t hd, const float* w, float eps) {
  for (int64_t i = 0; i < heads; ++i) ops.rmsnorm(x + i * hd, w, hd, eps, x + i * hd);
}

// fn(r) for every row r in [0, R): on the pool (pool_run_rows) when there are enough rows to pay for the fork/join.
template <typename F>
void for_rows(int64_t R, F&& fn) {
  if (R < 8) {
    for (int64_t r = 0; r < R; ++r) fn(r);
    return;
  }
  pool_run_rows(R, [](void* p, int64_t r) { (*static_cast<F*>(p))(r); }, &fn);
}

// Laps of a profiled step: lap(cat) gives the time since the last lap to `cat`, less the pool's join
// idle time inside it, which goes to kProfJoin. Does nothing when profiling is off.
struct Laps {
  StepProfile* p;  // null: off
  uint64_t mark = 0, idle = 0;
  explicit Laps(StepProfile* prof) : p(prof) {
    if (p) {
      mark = cycle_ticks();
      idle = pool_join_idle_ticks();
    }
  }
  void lap(ProfCat cat) {
    if (!p) return;
    const uint64_t now = cycle_ticks(), id = pool_join_idle_ticks();
    const uint64_t wall = now - mark, join = std::min(id - idle, wall);
    p->ticks[kProfJoin] += join;
    p->join_in[cat] += join;
    p->ticks[cat] += wall - join;
    p->total_ticks += wall;
    mark = now;
    idle = id;
  }
};

}  // namespace

void Decoder::set_profile(bool on) {
  prof_on_ = on;
  for (StepProfile& p : prof_) p = StepProfile{};
  pool_profile_join(on);
}

void Decoder::decode(float* x, int64_t pos, float* logits) {
  const int64_t slot = 0;
  step(x, 1, &pos, &slot, logits, 0, kStepDecode);
}

void Decoder::forward(float* x, int64_t N, int64_t pos, int64_t slot, float* logits, Logits which) {
  pos_.resize(N);
  slot_.assign(N, slot);
  for (int64_t i = 0; i < N; ++i) pos_[i] = pos + i;
  const int64_t first = which == kAllLogits ? 0 : which == kLastLogits ? N - 1 : N;
  step(x, N, pos_.data(), slot_.data(), logits, first, N == 1 ? kStepDecode : kStepPrefill);
}

void Decoder::decode_batch(float* x, int64_t B, const int64_t* pos, const int64_t* slot, float* logits) {
  step(x, B, pos, slot, logits, 0, kStepBatch);
}

void Decoder::step(float* x, int64_t R, const int64_t* pos, const int64_t* slot, float* logits, int64_t first_logit,
                   StepKind kind) {
  const OpsTable& ops = active_kernels().ops;
  const int64_t H = s_.hidden, hd = s_.hd, QD = s_.n_heads * hd, KD = s_.n_kv * hd, F = s_.inter;
  const float qscale = s_.qscale > 0.f ? s_.qscale : 1.f / std::sqrt((float)hd);
  const auto wall0 = prof_on_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  Laps laps(prof_on_ ? &prof_[kind] : nullptr);
  xn_.resize(R * H);
  q_.resize(R * QD);
  k_.resize(R * KD);
  v_.resize(R * KD);
  att_.resize(R * QD);
  g_.resize(R * F);
  u_.resize(R * F);
  tmp_.resize(R * H);
  float *xn = xn_.data(), *q = q_.data(), *k = k_.data(), *v = v_.data(), *att = att_.data(), *g = g_.data(),
        *u = u_.data(), *tmp = tmp_.data();
  const float eps = s_.eps;
  // tmp [R][H] -> optional post-norm -> x += tmp; then, in the same pool run (one fork/join a residual, not two),
  // xn[r - from] = rmsnorm(x[r], norm) for rows r >= from when norm is given: the next norm's input.
  auto residual = [&](const float* post, const float* norm = nullptr, int64_t from = 0) {
    for_rows(R, [&](int64_t r) {
      float* t = tmp + r * H;
      if (post) ops.rmsnorm(t, post, H, eps, t);
      float* xr = x + r * H;
      for (int64_t i = 0; i < H; ++i) xr[i] += t[i];
      if (norm && r >= from) ops.rmsnorm(xr, norm, H, eps, xn + (r - from) * H);
    });
  };
  const int64_t NL = R - first_logit;  // rows that need logits
  if (!layers_.empty()) for_rows(R, [&](int64_t r) { ops.rmsnorm(x + r * H, layers_[0].ln1, H, eps, xn + r * H); });
  // The decode schedule across matrices: each GEMV's (and attention's) idle threads prefetch the start of
  // the matrix that comes next. Not for steps of kComputeBoundRows or more rows: their GEMMs are bound by
  // compute and run in short runs of blocks, not the long per-thread runs whose starts next_prefetch names.
  const bool hint = prefetch_next_ && R < kComputeBoundRows;
  auto next_of = [&](const LinearRef* lin) { return hint ? next_prefetch(lin) : NextPrefetch{}; };
  for (size_t li = 0; li < layers_.size(); ++li) {
    const DecoderLayer& L = layers_[li];
    const LinearRef* after_down = li + 1 < layers_.size() ? &layers_[li + 1].q : &head_;
    // attention: Q/K/V of all rows in one GEMM (xn: ln1 of x, from the previous residual), then q/k norms, RoPE
    // and the cache write per row
    laps.lap(kProfRest);
    {
      const LinearRef* lins[3] = {&L.q, &L.k, &L.v};
      float* ys[3] = {q, k, v};
      run_linears(lins, ys, 3, xn, R, act_);
    }
    laps.lap(kProfGemv);
    // q/k norms, RoPE, q's scale and the cache write of row r's kv head h and its group of q heads
    const int64_t G = s_.n_heads / s_.n_kv;
    auto prep = [&](int64_t r, int64_t h) {
      const float* C = C_ + pos[r] * hd;
      const float* S = S_ + pos[r] * hd;
      float* qh = q + r * QD + h * G * hd;
      float* kh = k + r * KD + h * hd;
      const float* vh = v + r * KD + h * hd;
      if (L.q_norm) norm_heads(ops, qh, G, hd, L.q_norm, eps);
      if (L.k_norm) norm_heads(ops, kh, 1, hd, L.k_norm, eps);
      ops.rope(qh, G, hd, C, S, qscale);
      ops.rope(kh, 1, hd, C, S, 1.f);
      const int64_t at = slot[r] * slot_stride_ + (h * s_.max_ctx + pos[r]) * kv_row_units(s_.kv, hd);
      if (s_.kv == KvType::kF16) {
        ops.f32_to_f16_row(kh, static_cast<uint16_t*>(L.kc) + at, hd);
        ops.f32_to_f16_row(vh, static_cast<uint16_t*>(L.vc) + at, hd);
      } else if (s_.kv == KvType::kI8) {
        ops.kv_quantize_row(kh, hd, static_cast<int8_t*>(L.kc) + at);
        ops.kv_quantize_row(vh, hd, static_cast<int8_t*>(L.vc) + at);
      } else {
        std::copy(kh, kh + hd, static_cast<float*>(L.kc) + at);
        std::copy(vh, vh + hd, static_cast<float*>(L.vc) + at);
      }
    };
    // Decode: each kv head's prep runs in its attention task, on the pool (AttnPrep). Several rows: all
    // rows' K/V are written first, so the rows of one prefill chunk see each other causally.
    auto prep_row0 = [&](int64_t h) { prep(0, h); };
    const AttnPrep fused{[](void* p, int64_t h) { (*static_cast<decltype(prep_row0)*>(p))(h); }, &prep_row0};
    if (R > 1) {
      for_rows(R, [&](int64_t r) {
        for (int64_t h = 0; h < s_.n_kv; ++h) prep(r, h);
      });
      laps.lap(kProfRest);
    }
    {
      const AttnCall c{q, att, L.kc, L.vc, s_.kv, pos, slot, R, s_.n_heads, s_.n_kv, hd, s_.max_ctx,
                       slot_stride_, L.window, s_.softcap};
      const NextPrefetch nx = next_of(&L.o);
      attention(c, ops, &nx, attn_split_min_, R == 1 ? &fused : nullptr);
    }
    laps.lap(kProfAttn);
    if (L.attn_sub) for_rows(R, [&](int64_t r) { ops.rmsnorm(att + r * QD, L.attn_sub, QD, eps, att + r * QD); });
    laps.lap(kProfRest);
    {
      const LinearRef* lins[1] = {&L.o};
      float* ys[1] = {tmp};
      const NextPrefetch nx = next_of(&L.gate);
      run_linears(lins, ys, 1, att, R, act_, &nx);
    }
    laps.lap(kProfGemv);
    residual(L.post_attn, L.ln2);  // and the MLP's input norm
    laps.lap(kProfRest);
    {
      const NextPrefetch nx = next_of(&L.down);
      // decode: the activation inside the gate/up tasks (run_gated)
      const bool gated = R == 1 && run_gated(L.gate, L.up, g, u, xn, s_.act, act_, &nx);
      if (!gated) {
        const LinearRef* lins[2] = {&L.gate, &L.up};
        float* ys[2] = {g, u};
        run_linears(lins, ys, 2, xn, R, act_, &nx);
      }
      laps.lap(kProfGemv);
      for_rows(R, [&](int64_t r) {
        if (!gated) ops.act_mul(g + r * F, u + r * F, F, s_.act);
        if (L.ffn_sub) ops.rmsnorm(g + r * F, L.ffn_sub, F, eps, g + r * F);
      });
    }
    laps.lap(kProfRest);
    {
      const LinearRef* lins[1] = {&L.down};
      float* ys[1] = {tmp};
      const NextPrefetch nx = next_of(after_down);
      run_linears(lins, ys, 1, g, R, act_, &nx);
    }
    laps.lap(kProfGemv);
    if (li + 1 < layers_.size()) {
      residual(L.post_ffn, layers_[li + 1].ln1);
    } else {
      residual(L.post_ffn, NL > 0 ? norm_ : nullptr, first_logit);  // and the final norm of the logit rows
    }
  }
  if (NL > 0) {
    if (layers_.empty())  // else the last layer's residual ran the final norm
      for_rows(NL, [&](int64_t r) { ops.rmsnorm(x + (first_logit + r) * H, norm_, H, eps, xn + r * H); });
    laps.lap(kProfRest);
    const LinearRef* lins[1] = {&head_};
    float* ys[1] = {logits};
    // the next step starts with layer 0's q: a worker streams its run through the gap between steps
    const NextPrefetch nx = next_of(layers_.empty() ? nullptr : &layers_[0].q);
    run_linears(lins, ys, 1, xn, NL, act_, &nx);
    laps.lap(kProfHead);
  }
  if (prof_on_) {
    StepProfile& p = prof_[kind];
    p.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    p.steps += 1;
    p.tokens += R;
  }
}

}  // namespace lowbit
