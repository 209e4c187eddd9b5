#include "decoder.h"

#include <cmath>

#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {

Decoder::Decoder(const DecoderShape& shape, const float* rope_c, const float* rope_s)
    : s_(shape), C_(rope_c), S_(rope_s) {
  xn_.resize(s_.hidden);
  q_.resize(s_.n_heads * s_.hd);
  k_.resize(s_.n_kv * s_.hd);
  v_.resize(s_.n_kv * s_.hd);
  att_.resize(s_.n_heads * s_.hd);
  g_.resize(s_.inter);
  u_.resize(s_.inter);
  tmp_.resize(s_.hidden);
  scores_.resize(s_.n_heads * s_.max_ctx);
}

namespace {

// HF rotate_half RoPE on `heads` vectors of hd: x*C + [x2, x1]*S, C/S rows of this position.
void rope(float* x, int64_t heads, int64_t hd, const float* C, const float* S) {
  const int64_t h = hd / 2;
  for (int64_t i = 0; i < heads; ++i) {
    float* v = x + i * hd;
    for (int64_t d = 0; d < h; ++d) {
      const float a = v[d], b = v[d + h];
      v[d] = a * C[d] + b * S[d];
      v[d + h] = b * C[d + h] + a * S[d + h];
    }
  }
}

struct AttnCtx {
  const Decoder* dec;
  const float* q;
  const void *kc, *vc;
  float *out, *scores;
  int64_t start, t, hd, group, max_ctx;  // positions [start, t)
  float softcap;
  bool f16;
  const OpsTable* ops;
};

void attn_task(void* p, int64_t h) {
  const AttnCtx& c = *static_cast<const AttnCtx*>(p);
  const int64_t off = ((h / c.group) * c.max_ctx + c.start) * c.hd, n = c.t - c.start;
  if (c.f16)
    c.ops->attn_head_f16(c.q + h * c.hd, static_cast<const uint16_t*>(c.kc) + off,
                         static_cast<const uint16_t*>(c.vc) + off, n, c.hd, c.scores + h * c.max_ctx, c.out + h * c.hd,
                         c.softcap);
  else
    c.ops->attn_head(c.q + h * c.hd, static_cast<const float*>(c.kc) + off, static_cast<const float*>(c.vc) + off,
                     n, c.hd, c.scores + h * c.max_ctx, c.out + h * c.hd, c.softcap);
}

// RMSNorm of each of `heads` vectors of hd in place (Qwen 3's q/k norms).
void norm_heads(const OpsTable& ops, float* x, int64_t heads, int64_t hd, const float* w, float eps) {
  for (int64_t i = 0; i < heads; ++i) ops.rmsnorm(x + i * hd, w, hd, eps, x + i * hd);
}

// Attention of B sequences' new tokens, task = b * heads + h; sequence b reads its slot up to pos[b].
struct BatchAttnCtx {
  const float* q;  // [B][heads*hd]
  const void *kc, *vc;  // slot 0 of this layer
  float* out;  // [B][heads*hd]
  const int64_t *pos, *slot;
  int64_t heads, hd, group, max_ctx, slot_stride, window;  // window > 0: the last `window` positions only
  float softcap;
  bool f16;
  const OpsTable* ops;
};

void batch_attn_task(void* p, int64_t task) {
  const BatchAttnCtx& c = *static_cast<const BatchAttnCtx*>(p);
  thread_local std::vector<float> scores;
  const int64_t b = task / c.heads, h = task % c.heads, t = c.pos[b] + 1;
  const int64_t start = c.window > 0 && t > c.window ? t - c.window : 0, n = t - start;
  if ((int64_t)scores.size() < n) scores.resize(n);
  const int64_t off = c.slot[b] * c.slot_stride + ((h / c.group) * c.max_ctx + start) * c.hd;
  const float* q = c.q + (b * c.heads + h) * c.hd;
  float* o = c.out + (b * c.heads + h) * c.hd;
  if (c.f16)
    c.ops->attn_head_f16(q, static_cast<const uint16_t*>(c.kc) + off, static_cast<const uint16_t*>(c.vc) + off, n,
                         c.hd, scores.data(), o, c.softcap);
  else
    c.ops->attn_head(q, static_cast<const float*>(c.kc) + off, static_cast<const float*>(c.vc) + off, n, c.hd,
                     scores.data(), o, c.softcap);
}

}  // namespace

void Decoder::attention(const DecoderLayer& L, int64_t t) {
  const int64_t start = L.window > 0 && t > L.window ? t - L.window : 0;
  AttnCtx c{this, q_.data(), L.kc, L.vc, att_.data(), scores_.data(), start, t, s_.hd, s_.n_heads / s_.n_kv,
            s_.max_ctx, s_.softcap, s_.kv_f16, &active_kernels().ops};
  pool_run(s_.n_heads, attn_task, &c);
}

void Decoder::decode(float* x, int64_t pos, float* logits) {
  const OpsTable& ops = active_kernels().ops;
  const int64_t H = s_.hidden, hd = s_.hd;
  const float* C = C_ + pos * hd;
  const float* S = S_ + pos * hd;
  const float qscale = s_.qscale > 0.f ? s_.qscale : 1.f / std::sqrt((float)hd);
  for (const DecoderLayer& L : layers_) {
    // attention
    ops.rmsnorm(x, L.ln1, H, s_.eps, xn_.data());
    {
      const LinearRef* lins[3] = {&L.q, &L.k, &L.v};
      float* ys[3] = {q_.data(), k_.data(), v_.data()};
      run_linears(lins, ys, 3, xn_.data(), 1, act_);
    }
    if (L.q_norm) norm_heads(ops, q_.data(), s_.n_heads, hd, L.q_norm, s_.eps);
    if (L.k_norm) norm_heads(ops, k_.data(), s_.n_kv, hd, L.k_norm, s_.eps);
    rope(q_.data(), s_.n_heads, hd, C, S);
    rope(k_.data(), s_.n_kv, hd, C, S);
    for (float& v : q_) v *= qscale;
    for (int64_t h = 0; h < s_.n_kv; ++h) {
      const int64_t at = (h * s_.max_ctx + pos) * hd;
      if (s_.kv_f16) {
        ops.f32_to_f16_row(k_.data() + h * hd, static_cast<uint16_t*>(L.kc) + at, hd);
        ops.f32_to_f16_row(v_.data() + h * hd, static_cast<uint16_t*>(L.vc) + at, hd);
      } else {
        std::copy(k_.data() + h * hd, k_.data() + (h + 1) * hd, static_cast<float*>(L.kc) + at);
        std::copy(v_.data() + h * hd, v_.data() + (h + 1) * hd, static_cast<float*>(L.vc) + at);
      }
    }
    attention(L, pos + 1);
    if (L.attn_sub) ops.rmsnorm(att_.data(), L.attn_sub, (int64_t)att_.size(), s_.eps, att_.data());
    {
      const LinearRef* lins[1] = {&L.o};
      float* ys[1] = {tmp_.data()};
      run_linears(lins, ys, 1, att_.data(), 1, act_);
    }
    if (L.post_attn) ops.rmsnorm(tmp_.data(), L.post_attn, H, s_.eps, tmp_.data());
    for (int64_t i = 0; i < H; ++i) x[i] += tmp_[i];
    // MLP
    ops.rmsnorm(x, L.ln2, H, s_.eps, xn_.data());
    {
      const LinearRef* lins[2] = {&L.gate, &L.up};
      float* ys[2] = {g_.data(), u_.data()};
      run_linears(lins, ys, 2, xn_.data(), 1, act_);
    }
    ops.act_mul(g_.data(), u_.data(), s_.inter, s_.act);
    if (L.ffn_sub) ops.rmsnorm(g_.data(), L.ffn_sub, s_.inter, s_.eps, g_.data());
    {
      const LinearRef* lins[1] = {&L.down};
      float* ys[1] = {tmp_.data()};
      run_linears(lins, ys, 1, g_.data(), 1, act_);
    }
    if (L.post_ffn) ops.rmsnorm(tmp_.data(), L.post_ffn, H, s_.eps, tmp_.data());
    for (int64_t i = 0; i < H; ++i) x[i] += tmp_[i];
  }
  ops.rmsnorm(x, norm_, H, s_.eps, xn_.data());
  const LinearRef* lins[1] = {&head_};
  float* ys[1] = {logits};
  run_linears(lins, ys, 1, xn_.data(), 1, act_);
}

void Decoder::decode_batch(float* x, int64_t B, const int64_t* pos, const int64_t* slot, float* logits) {
  const OpsTable& ops = active_kernels().ops;
  const int64_t H = s_.hidden, hd = s_.hd, QD = s_.n_heads * hd, KD = s_.n_kv * hd, F = s_.inter;
  const float qscale = s_.qscale > 0.f ? s_.qscale : 1.f / std::sqrt((float)hd);
  bxn_.resize(B * H);
  bq_.resize(B * QD);
  bk_.resize(B * KD);
  bv_.resize(B * KD);
  batt_.resize(B * QD);
  bg_.resize(B * F);
  bu_.resize(B * F);
  btmp_.resize(B * H);
  for (const DecoderLayer& L : layers_) {
    // attention: Q/K/V of all B rows in one GEMM, then RoPE and the cache write per sequence
    for (int64_t b = 0; b < B; ++b) ops.rmsnorm(x + b * H, L.ln1, H, s_.eps, bxn_.data() + b * H);
    {
      const LinearRef* lins[3] = {&L.q, &L.k, &L.v};
      float* ys[3] = {bq_.data(), bk_.data(), bv_.data()};
      run_linears(lins, ys, 3, bxn_.data(), B, act_);
    }
    for (int64_t b = 0; b < B; ++b) {
      const float* C = C_ + pos[b] * hd;
      const float* S = S_ + pos[b] * hd;
      float* q = bq_.data() + b * QD;
      float* k = bk_.data() + b * KD;
      float* v = bv_.data() + b * KD;
      if (L.q_norm) norm_heads(ops, q, s_.n_heads, hd, L.q_norm, s_.eps);
      if (L.k_norm) norm_heads(ops, k, s_.n_kv, hd, L.k_norm, s_.eps);
      rope(q, s_.n_heads, hd, C, S);
      rope(k, s_.n_kv, hd, C, S);
      for (int64_t i = 0; i < QD; ++i) q[i] *= qscale;
      for (int64_t h = 0; h < s_.n_kv; ++h) {
        const int64_t at = slot[b] * slot_stride_ + (h * s_.max_ctx + pos[b]) * hd;
        if (s_.kv_f16) {
          ops.f32_to_f16_row(k + h * hd, static_cast<uint16_t*>(L.kc) + at, hd);
          ops.f32_to_f16_row(v + h * hd, static_cast<uint16_t*>(L.vc) + at, hd);
        } else {
          std::copy(k + h * hd, k + (h + 1) * hd, static_cast<float*>(L.kc) + at);
          std::copy(v + h * hd, v + (h + 1) * hd, static_cast<float*>(L.vc) + at);
        }
      }
    }
    {
      BatchAttnCtx c{bq_.data(), L.kc, L.vc, batt_.data(), pos, slot, s_.n_heads, hd, s_.n_heads / s_.n_kv,
                     s_.max_ctx, slot_stride_, L.window, s_.softcap, s_.kv_f16, &ops};
      pool_run(B * s_.n_heads, batch_attn_task, &c);
    }
    if (L.attn_sub)
      for (int64_t b = 0; b < B; ++b) ops.rmsnorm(batt_.data() + b * QD, L.attn_sub, QD, s_.eps, batt_.data() + b * QD);
    {
      const LinearRef* lins[1] = {&L.o};
      float* ys[1] = {btmp_.data()};
      run_linears(lins, ys, 1, batt_.data(), B, act_);
    }
    if (L.post_attn)
      for (int64_t b = 0; b < B; ++b) ops.rmsnorm(btmp_.data() + b * H, L.post_attn, H, s_.eps, btmp_.data() + b * H);
    for (int64_t i = 0; i < B * H; ++i) x[i] += btmp_[i];
    // MLP
    for (int64_t b = 0; b < B; ++b) ops.rmsnorm(x + b * H, L.ln2, H, s_.eps, bxn_.data() + b * H);
    {
      const LinearRef* lins[2] = {&L.gate, &L.up};
      float* ys[2] = {bg_.data(), bu_.data()};
      run_linears(lins, ys, 2, bxn_.data(), B, act_);
    }
    for (int64_t b = 0; b < B; ++b) {
      ops.act_mul(bg_.data() + b * F, bu_.data() + b * F, F, s_.act);
      if (L.ffn_sub) ops.rmsnorm(bg_.data() + b * F, L.ffn_sub, F, s_.eps, bg_.data() + b * F);
    }
    {
      const LinearRef* lins[1] = {&L.down};
      float* ys[1] = {btmp_.data()};
      run_linears(lins, ys, 1, bg_.data(), B, act_);
    }
    if (L.post_ffn)
      for (int64_t b = 0; b < B; ++b) ops.rmsnorm(btmp_.data() + b * H, L.post_ffn, H, s_.eps, btmp_.data() + b * H);
    for (int64_t i = 0; i < B * H; ++i) x[i] += btmp_[i];
  }
  for (int64_t b = 0; b < B; ++b) ops.rmsnorm(x + b * H, norm_, H, s_.eps, bxn_.data() + b * H);
  const LinearRef* lins[1] = {&head_};
  float* ys[1] = {logits};
  run_linears(lins, ys, 1, bxn_.data(), B, act_);
}

}  // namespace lowbit
