// Python binding of the native decoder (decoder.h): building it from the model's arrays (every projection,
// norm and cache checked as the gemm entry points check theirs: weight_args.h), and its steps — decode (one
// token), forward (N tokens of one sequence: prefill), decode_batch (continuous batching), step_rows (decode
// rows and prompt chunks of several sequences in one step) — with the GIL
// released and the settings lock held shared while they run, plus the step profile.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "decoder.h"
#include "dispatch.h"
#include "kv_args.h"
#include "py_args.h"
#include "weight_args.h"

namespace nb = nanobind;
using namespace lowbit;
using namespace lowbit::py;

namespace {

// The decoder with the Python arrays it points into: it holds a reference to each (the arrays are the
// caller's own, never converted copies), so they live as long as it does. One decode at a time.
struct PyDecoder {
  Decoder d;
  std::vector<nb::object> keep;
  std::mutex mu;
  // The token embedding table for decode_token (set_embedding): float32 or bf16 bits [vocab][hidden].
  // Gathering the row here, after the GIL is released, keeps numpy off the token's path: run right after
  // a step has streamed the weights through the caches, the numpy gather took ~70 us.
  const float* emb_f32 = nullptr;
  const uint16_t* emb_bf16 = nullptr;
  int64_t emb_vocab = 0;
  float emb_scale = 1.f;
  std::vector<float> xtok;
  std::vector<float> xrows;  // step_rows' gathered embeddings [R][hidden]
  PyDecoder(const DecoderShape& s, const float* c, const float* sn) : d(s, c, sn) {}
};

// A projection for the native decoder, from a tuple built by lowbit.model.native:
//   ("int", codes, scale, offset|None, zc, bits, M, K, Kp, group, bias|None)
//   ("int6", codes (4-bit), scale, offset, codes_hi (2-bit, the same scales, 16x), M, K, Kp, group, bias|None)
//   ("f32" | "bf16", weight [M, K], bias|None)
//   ("tq1", codes, scale, M, K, Kp, group, bias|None)
//   ("codebook", codes, scale, cbT, cb, M, K, Kp, group, bias|None[, codes16|None])
LinearRef linear_from_tuple(nb::handle h, const char* what, std::vector<nb::object>& keep) {
  const std::string w = what;
  if (!(nb::isinstance<nb::tuple>(h) || nb::isinstance<nb::list>(h)) || nb::len(h) == 0)
    fail(w + " must be a projection tuple (kind, ...), got " + describe(h));
  std::string kind;
  if (!nb::try_cast<std::string>(h[0], kind)) fail(w + ": the first item must be the kind: 'int', 'int6', 'tq1', 'codebook', 'f32' or 'bf16'");
  const char* fn = what;
  LinearRef L;
  size_t bias_at = 0;
  if (kind == "int") {
    const auto t = items(h, 11, (w + " ('int', codes, scale, offset, zc, bits, M, K, Kp, group, bias)").c_str());
    L.kind = 0;
    L.M = scalar<int64_t>(t[6], "M");
    L.K = scalar<int64_t>(t[7], "K");
    L.iw = checked_int_weights(fn, t[1], t[2], t[3], scalar<float>(t[4], "zc"), scalar<int>(t[5], "bits"), L.M,
                               scalar<int64_t>(t[8], "Kp"), scalar<int64_t>(t[9], "group"));
    if (L.K <= 0 || L.K > L.iw.Kp) fail(w + ": K must be in [1, Kp]");
    bias_at = 10;
  } else if (kind == "int6") {
    const auto t = items(h, 10, (w + " ('int6', codes, scale, offset, codes_hi, M, K, Kp, group, bias)").c_str());
    L.kind = 0;
    L.M = scalar<int64_t>(t[5], "M");
    L.K = scalar<int64_t>(t[6], "K");
    const int64_t Kp = scalar<int64_t>(t[7], "Kp"), group = scalar<int64_t>(t[8], "group");
    if (t[3].is_none()) fail(w + ": an 'int6' projection needs its offsets");
    L.iw = checked_int_weights(fn, t[1], t[2], t[3], 0.f, 4, L.M, Kp, group);
    L.iw_hi = checked_int_weights(fn, t[4], t[2], nb::none(), 0.f, 2, L.M, Kp, group);  // the same scales
    if (L.K <= 0 || L.K > Kp) fail(w + ": K must be in [1, Kp]");
    bias_at = 9;
  } else if (kind == "tq1") {
    const auto t = items(h, 8, (w + " ('tq1', codes, scale, M, K, Kp, group, bias)").c_str());
    L.kind = 3;
    L.M = scalar<int64_t>(t[3], "M");
    L.K = scalar<int64_t>(t[4], "K");
    L.tq = checked_tq1_weights(fn, t[1], t[2], L.M, scalar<int64_t>(t[5], "Kp"), scalar<int64_t>(t[6], "group"));
    if (L.K <= 0 || L.K > L.tq.Kp) fail(w + ": K must be in [1, Kp]");
    bias_at = 7;
  } else if (kind == "codebook") {
    const size_t n = nb::len(h) == 11 ? 11 : 10;
    const auto t = items(h, n, (w + " ('codebook', codes, scale, cbT, cb, M, K, Kp, group, bias[, codes16])").c_str());
    L.kind = 4;
    L.M = scalar<int64_t>(t[5], "M");
    L.K = scalar<int64_t>(t[6], "K");
    L.cb = checked_codebook_weights(fn, t[1], t[2], t[3], t[4], L.M, scalar<int64_t>(t[7], "Kp"), scalar<int64_t>(t[8], "group"),
                                    n == 11 ? nb::handle(t[10]) : nb::handle(nb::none()));
    if (L.K <= 0 || L.K > L.cb.Kp || L.cb.Kp - L.K >= L.cb.v) fail(w + ": K must be in (Kp - v, Kp]");
    bias_at = 9;
  } else if (kind == "f32" || kind == "bf16") {
    const auto t = items(h, 3, (w + " ('f32' | 'bf16', weight, bias)").c_str());
    const auto [fw, bf16] = checked_float_weights(fn, t[1]);
    if (bf16 != (kind == "bf16")) fail(w + ": a '" + kind + "' weight must be " + (bf16 ? "float32" : "uint16 (bf16 bits)"));
    L.kind = bf16 ? 2 : 1;
    L.fw = fw;
    L.M = fw.M;
    L.K = fw.K;
    bias_at = 2;
  } else {
    fail(w + ": unknown projection kind '" + kind + "' (use 'int', 'int6', 'tq1', 'codebook', 'f32' or 'bf16')");
  }
  nb::handle b = h[bias_at];
  if (!b.is_none()) {
    auto bias = in<float, 1>(b, (w + " bias").c_str());
    if (bias.shape(0) != (size_t)L.M) fail(w + ": bias has " + std::to_string(bias.shape(0)) + " values, expected M = " + std::to_string(L.M));
    L.bias = bias.data();
  }
  keep.push_back(nb::borrow(h));  // the tuple holds every array of the projection
  return L;
}

In<float, 1> norm_weight(nb::handle h, const char* what, int64_t n) {
  auto a = in<float, 1>(h, what);
  if (a.shape(0) != (size_t)n)
    fail(std::string(what) + " has " + std::to_string(a.shape(0)) + " values, expected " + std::to_string(n));
  return a;
}

// decode / decode_token: the output layer set, logits [vocab], pos inside the cache (what: the call's name,
// logits_name: "<what>: logits"; messages are built only on failure, this runs every token).
float* checked_decode_logits(PyDecoder& self, nb::handle hlogits, int64_t pos, const char* what, const char* logits_name) {
  if (!self.d.has_output()) fail(std::string(what) + ": the output layer is not set (call set_output first)");
  auto logits = out<float, 1>(hlogits, logits_name);
  if (logits.shape(0) != (size_t)self.d.vocab())
    fail(std::string(what) + ": logits must be [vocab] = [" + std::to_string(self.d.vocab()) + "], got " +
         std::to_string(logits.shape(0)));
  if (pos < 0 || pos >= self.d.shape().max_ctx) fail(std::string(what) + ": position outside the cache");
  return logits.data();
}

// set_embedding: a C-contiguous [vocab, hidden] table of T; false when `table` is not an array of T.
template <typename T>
bool take_embedding(PyDecoder& self, nb::handle table, const T*& dst) {
  using Table = nb::ndarray<const T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
  if (!nb::isinstance<Table>(table)) return false;
  auto t = nb::cast<Table>(table);
  require((int64_t)t.shape(1) == self.d.shape().hidden && t.shape(0) >= 1, "set_embedding: table must be [vocab, hidden]");
  self.emb_f32 = nullptr, self.emb_bf16 = nullptr;
  dst = t.data();
  self.emb_vocab = (int64_t)t.shape(0);
  return true;
}

nb::dict profile_dict(const StepProfile& p) {
  static const char* names[kProfCats] = {"gemv", "join", "attention", "lm_head", "rest"};
  nb::dict d;
  const double per_tick = p.total_ticks ? p.seconds / (double)p.total_ticks : 0.0;
  for (int c = 0; c < kProfCats; ++c) d[names[c]] = (double)p.ticks[c] * per_tick;
  for (int c = 0; c < kProfCats; ++c)  // the join waits by stretch: join_gemv + join_attention + ... = join
    if (c != kProfJoin) d[(std::string("join_") + names[c]).c_str()] = (double)p.join_in[c] * per_tick;
  d["seconds"] = p.seconds;
  d["steps"] = p.steps;
  d["tokens"] = p.tokens;
  return d;
}

}  // namespace

namespace lowbit {

void bind_decoder(nb::module_& m) {
  nb::class_<PyDecoder>(m, "Decoder")
      .def("__init__",
           [](PyDecoder* self, int64_t hidden, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t inter, int64_t max_ctx,
              float eps, int act, nb::handle hc, nb::handle hs, int kv) {
             constexpr int64_t kDim = int64_t(1) << 20;
             require(hidden > 0 && hidden <= kDim && inter > 0 && inter <= kDim, "Decoder: hidden and intermediate sizes must be in [1, 2^20]");
             require(n_heads > 0 && n_heads <= 4096 && n_kv > 0, "Decoder: head counts must be positive (at most 4096 heads)");
             require(n_heads % n_kv == 0, "Decoder: heads must be a multiple of kv heads");
             require(hd > 0 && hd <= 512 && hd % 2 == 0, "Decoder: head_dim must be even and in [2, 512]");
             require(max_ctx > 0 && max_ctx <= (int64_t(1) << 24), "Decoder: max_ctx must be in [1, 2^24]");
             require(act == 0 || act == 1 || act == 2, "Decoder: act must be 0 (SiLU), 1 (squared ReLU) or 2 (GELU)");
             require(eps >= 0.f && eps < 1.f, "Decoder: rms_norm_eps must be in [0, 1)");
             require(kv >= 0 && kv <= 2, "Decoder: kv must be 0 (float32 cache), 1 (float16) or 2 (int8 rows with their scale)");
             auto c = in<float, 2>(hc, "Decoder: rope C");
             auto s = in<float, 2>(hs, "Decoder: rope S");
             require(c.shape(0) >= (size_t)max_ctx && c.shape(1) == (size_t)hd, "Decoder: rope C must be [>= max_ctx, hd]");
             require(s.shape(0) >= (size_t)max_ctx && s.shape(1) == (size_t)hd, "Decoder: rope S must be [>= max_ctx, hd]");
             new (self) PyDecoder(DecoderShape{hidden, n_heads, n_kv, hd, inter, max_ctx, eps, act, KvType(kv)}, c.data(), s.data());
             self->keep = {nb::borrow(hc), nb::borrow(hs)};
           })
      .def("add_layer",
           [](PyDecoder& self, nb::handle lins, nb::handle ln1, nb::handle ln2, nb::handle attn_sub, nb::handle ffn_sub,
              nb::handle hkc, nb::handle hvc) {
             const DecoderShape& s = self.d.shape();
             require(self.d.n_slots() == 1, "add_layer: add every layer before set_slots");
             const auto t = items(lins, 7, "add_layer: linears (q, k, v, o, gate, up, down)");
             std::vector<nb::object> keep;
             DecoderLayer L;
             LinearRef* refs[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
             const char* names[7] = {"add_layer: q_proj", "add_layer: k_proj", "add_layer: v_proj", "add_layer: o_proj",
                                     "add_layer: gate_proj", "add_layer: up_proj", "add_layer: down_proj"};
             for (size_t i = 0; i < 7; ++i) *refs[i] = linear_from_tuple(t[i], names[i], keep);
             const int64_t qd = s.n_heads * s.hd, kvd = s.n_kv * s.hd;
             require(L.q.M == qd && L.q.K == s.hidden, "add_layer: q_proj must be [heads*hd, hidden]");
             require(L.k.M == kvd && L.k.K == s.hidden && L.v.M == kvd && L.v.K == s.hidden, "add_layer: k/v_proj must be [kv_heads*hd, hidden]");
             require(L.o.M == s.hidden && L.o.K == qd, "add_layer: o_proj must be [hidden, heads*hd]");
             require(L.gate.M == s.inter && L.gate.K == s.hidden && L.up.M == s.inter && L.up.K == s.hidden,
                     "add_layer: gate/up_proj must be [intermediate, hidden]");
             require(L.down.M == s.hidden && L.down.K == s.inter, "add_layer: down_proj must be [hidden, intermediate]");
             L.ln1 = norm_weight(ln1, "add_layer: ln1", s.hidden).data();
             L.ln2 = norm_weight(ln2, "add_layer: ln2", s.hidden).data();
             L.attn_sub = attn_sub.is_none() ? nullptr : norm_weight(attn_sub, "add_layer: attn_sub", qd).data();
             L.ffn_sub = ffn_sub.is_none() ? nullptr : norm_weight(ffn_sub, "add_layer: ffn_sub", s.inter).data();
             // The cache is written in place (prefill in numpy writes the same arrays): exact dtype, writable.
             auto kc = any_out<3>(hkc, "add_layer: k cache");
             auto vc = any_out<3>(hvc, "add_layer: v cache");
             require(kc.dtype() == kv_array_dtype(s.kv) && vc.dtype() == kc.dtype(),
                     s.kv == KvType::kF32   ? "add_layer: the k and v caches must be float32"
                     : s.kv == KvType::kF16 ? "add_layer: the k and v caches must be float16 (passed as a uint16 view)"
                                            : "add_layer: the k and v caches must be int8");
             const size_t row = kv_row_units(s.kv, s.hd);
             require(kc.shape(0) == (size_t)s.n_kv && kc.shape(1) == (size_t)s.max_ctx && kc.shape(2) == row &&
                         vc.shape(0) == kc.shape(0) && vc.shape(1) == kc.shape(1) && vc.shape(2) == kc.shape(2),
                     s.kv == KvType::kI8 ? "add_layer: k and v caches must be [kv_heads, max_ctx, hd + 4]"
                                         : "add_layer: k and v caches must be [kv_heads, max_ctx, hd]");
             L.kc = kc.data();
             L.vc = vc.data();
             for (nb::handle h : {ln1, ln2, attn_sub, ffn_sub, hkc, hvc}) keep.push_back(nb::borrow(h));
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.add_layer(L);
             for (auto& o : keep) self.keep.push_back(std::move(o));
           },
           nb::arg("linears"), nb::arg("ln1"), nb::arg("ln2"), nb::arg("attn_sub").none(), nb::arg("ffn_sub").none(),
           nb::arg("kc"), nb::arg("vc"))
      .def("set_layer_extras",
           [](PyDecoder& self, size_t index, nb::handle q_norm, nb::handle k_norm, nb::handle post_attn,
              nb::handle post_ffn, int64_t window) {
             const DecoderShape& s = self.d.shape();
             require(index < self.d.n_layers(), "set_layer_extras: no such layer");
             require(window >= 0, "set_layer_extras: window must be >= 0");
             auto opt = [](nb::handle h, const char* what, int64_t n) -> const float* {
               return h.is_none() ? nullptr : norm_weight(h, what, n).data();
             };
             const float* qn = opt(q_norm, "set_layer_extras: q_norm", s.hd);
             const float* kn = opt(k_norm, "set_layer_extras: k_norm", s.hd);
             const float* pa = opt(post_attn, "set_layer_extras: post_attn norm", s.hidden);
             const float* pf = opt(post_ffn, "set_layer_extras: post_ffn norm", s.hidden);
             std::lock_guard<std::mutex> lock(self.mu);
             DecoderLayer& L = self.d.layer(index);
             L.q_norm = qn;
             L.k_norm = kn;
             L.post_attn = pa;
             L.post_ffn = pf;
             L.window = window;
             for (nb::handle h : {q_norm, k_norm, post_attn, post_ffn}) self.keep.push_back(nb::borrow(h));
           },
           nb::arg("index"), nb::arg("q_norm").none(), nb::arg("k_norm").none(), nb::arg("post_attn").none(),
           nb::arg("post_ffn").none(), nb::arg("window"))
      .def("set_attention",
           [](PyDecoder& self, float qscale, float softcap) {
             require(qscale >= 0.f && softcap >= 0.f && std::isfinite(qscale) && std::isfinite(softcap),
                     "set_attention: qscale and softcap must be finite and >= 0");
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.set_attention(qscale, softcap);
           },
           nb::arg("qscale"), nb::arg("softcap"))
      .def("set_output",
           [](PyDecoder& self, nb::handle norm, nb::handle head) {
             std::vector<nb::object> keep;
             const float* n = norm_weight(norm, "set_output: final norm", self.d.shape().hidden).data();
             LinearRef h = linear_from_tuple(head, "set_output: lm_head", keep);
             require(h.K == self.d.shape().hidden, "set_output: lm_head must be [vocab, hidden]");
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.set_output(n, h);
             self.keep.push_back(nb::borrow(norm));
             for (auto& o : keep) self.keep.push_back(std::move(o));
           },
           nb::arg("norm"), nb::arg("head"))
      .def("decode",
           [](PyDecoder& self, nb::handle hx, int64_t pos, nb::handle hlogits) {
             float* logits = checked_decode_logits(self, hlogits, pos, "decode", "decode: logits");
             auto x = out<float, 1>(hx, "decode: x");
             require(x.shape(0) == (size_t)self.d.shape().hidden, "decode: x must be [hidden]");
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             KernelsRunning running(settings_mutex());
             self.d.decode(x.data(), pos, logits);
           },
           nb::arg("x"), nb::arg("pos"), nb::arg("logits"))
      .def("set_embedding",
           [](PyDecoder& self, nb::handle table, float scale) {
             require(std::isfinite(scale), "set_embedding: scale must be finite");
             if (!take_embedding(self, table, self.emb_f32) && !take_embedding(self, table, self.emb_bf16))
               fail("set_embedding: table must be a C-contiguous float32 or bf16-bits uint16 array [vocab, hidden]");
             self.emb_scale = scale;
             self.xtok.assign(self.d.shape().hidden, 0.f);
             self.keep.push_back(nb::borrow(table));
           },
           nb::arg("table"), nb::arg("scale"), "the token embedding [vocab, hidden] (float32 or bf16 bits) for decode_token")
      .def("decode_token",
           [](PyDecoder& self, int64_t token, int64_t pos, nb::handle hlogits) {
             float* logits = checked_decode_logits(self, hlogits, pos, "decode_token", "decode_token: logits");
             require(self.emb_vocab > 0, "decode_token: no embedding (call set_embedding first)");
             if (token < 0 || token >= self.emb_vocab)
               fail("decode_token: token id " + std::to_string(token) + " outside the vocabulary [0, " + std::to_string(self.emb_vocab) + ")");
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             const int64_t hidden = self.d.shape().hidden;
             float* x = self.xtok.data();
             if (self.emb_f32) {
               std::memcpy(x, self.emb_f32 + token * hidden, sizeof(float) * hidden);
             } else {
               const uint16_t* row = self.emb_bf16 + token * hidden;
               for (int64_t i = 0; i < hidden; ++i) x[i] = bf16_to_f32(row[i]);
             }
             if (self.emb_scale != 1.f)
               for (int64_t i = 0; i < hidden; ++i) x[i] *= self.emb_scale;
             KernelsRunning running(settings_mutex());
             self.d.decode(x, pos, logits);
           },
           nb::arg("token"), nb::arg("pos"), nb::arg("logits"),
           "decode() of a token id: its embedding row gathered (and scaled) natively")
      // The multi-slot cache of batched decoding: k, v are the whole [layers, slots, kv_heads, max_ctx, hd]
      // arrays whose slot 0 each layer's kc/vc is; every slot of every layer must lie inside them.
      .def("set_slots",
           [](PyDecoder& self, int64_t n_slots, int64_t slot_stride, nb::handle hk, nb::handle hv) {
             const DecoderShape& s = self.d.shape();
             const int64_t slot_size = s.n_kv * s.max_ctx * kv_row_units(s.kv, s.hd);
             require(n_slots >= 1, "set_slots: n_slots must be >= 1");
             require(n_slots == 1 || slot_stride >= slot_size, "set_slots: slots overlap: slot_stride too small");
             auto k = any_out<5>(hk, "set_slots: k (the whole slot cache)");
             auto v = any_out<5>(hv, "set_slots: v (the whole slot cache)");
             require(k.dtype() == kv_array_dtype(s.kv) && v.dtype() == kv_array_dtype(s.kv),
                     "set_slots: the slot cache must have the decoder's KV dtype");
             const int64_t esz = kv_unit_bytes(s.kv), need = ((n_slots - 1) * slot_stride + slot_size) * esz;
             for (const DecoderLayer& L : self.d.layers())
               for (auto [p, a] : {std::pair{(const char*)L.kc, &k}, std::pair{(const char*)L.vc, &v}}) {
                 const char* lo = (const char*)a->data();
                 const char* hi = lo + (int64_t)a->size() * esz;
                 require(p >= lo && p + need <= hi, "set_slots: a layer's slots reach outside the slot cache");
               }
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.set_slots(n_slots, slot_stride);
             self.keep.push_back(nb::borrow(hk));
             self.keep.push_back(nb::borrow(hv));
           },
           nb::arg("n_slots"), nb::arg("slot_stride"), nb::arg("k"), nb::arg("v"))
      .def("decode_batch",
           [](PyDecoder& self, nb::handle hx, nb::handle hpos, nb::handle hslot, nb::handle hlogits) {
             Decoder& d = self.d;
             require(d.has_output(), "decode_batch: the output layer is not set (call set_output first)");
             auto x = out<float, 2>(hx, "decode_batch: x");
             auto pos = in<int64_t, 1>(hpos, "decode_batch: pos");
             auto slot = in<int64_t, 1>(hslot, "decode_batch: slot");
             auto logits = out<float, 2>(hlogits, "decode_batch: logits");
             const int64_t B = (int64_t)x.shape(0);
             require(B >= 1 && x.shape(1) == (size_t)d.shape().hidden, "decode_batch: x must be [B, hidden] with B >= 1");
             require(pos.shape(0) == (size_t)B && slot.shape(0) == (size_t)B, "decode_batch: pos and slot must be [B]");
             require(is_shape(logits, B, d.vocab()), "decode_batch: logits must be [B, vocab]");
             for (int64_t b = 0; b < B; ++b) {
               require(pos.data()[b] >= 0 && pos.data()[b] < d.shape().max_ctx, "decode_batch: position outside the cache");
               require(slot.data()[b] >= 0 && slot.data()[b] < d.n_slots(), "decode_batch: slot outside the cache");
               for (int64_t c = 0; c < b; ++c) require(slot.data()[c] != slot.data()[b], "decode_batch: two rows write the same slot");
             }
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             KernelsRunning running(settings_mutex());
             d.decode_batch(x.data(), B, pos.data(), slot.data(), logits.data());
           },
           nb::arg("x"), nb::arg("pos"), nb::arg("slot"), nb::arg("logits"))
      .def("step_rows",
           [](PyDecoder& self, nb::handle hx, nb::handle hpos, nb::handle hslot, nb::handle hlogits, int64_t first_logit,
              nb::handle htokens) {
             Decoder& d = self.d;
             const int64_t hidden = d.shape().hidden;
             require(d.has_output(), "step_rows: the output layer is not set (call set_output first)");
             require(hx.is_none() != htokens.is_none(), "step_rows: give either x (embeddings) or tokens (ids), not both");
             auto pos = in<int64_t, 1>(hpos, "step_rows: pos");
             auto slot = in<int64_t, 1>(hslot, "step_rows: slot");
             float* xp = nullptr;
             const int64_t* ids = nullptr;
             int64_t R = 0;
             if (!hx.is_none()) {
               auto x = out<float, 2>(hx, "step_rows: x");
               R = (int64_t)x.shape(0);
               require(R >= 1 && x.shape(1) == (size_t)hidden, "step_rows: x must be [R, hidden] with R >= 1");
               xp = x.data();
             } else {  // the embedding rows gathered here, with the GIL released (as decode_token)
               auto t = in<int64_t, 1>(htokens, "step_rows: tokens");
               R = (int64_t)t.shape(0);
               require(R >= 1, "step_rows: tokens must be [R] with R >= 1");
               require(self.emb_vocab > 0, "step_rows: no embedding (call set_embedding first)");
               ids = t.data();
               for (int64_t r = 0; r < R; ++r)
                 if (ids[r] < 0 || ids[r] >= self.emb_vocab)
                   fail("step_rows: token id " + std::to_string(ids[r]) + " outside the vocabulary [0, " +
                        std::to_string(self.emb_vocab) + ")");
             }
             require(pos.shape(0) == (size_t)R && slot.shape(0) == (size_t)R, "step_rows: pos and slot must be [R]");
             require(first_logit >= 0 && first_logit <= R, "step_rows: first_logit must be in [0, R]");
             float* lp = nullptr;
             if (first_logit < R) {
               auto logits = out<float, 2>(hlogits, "step_rows: logits");
               if (!is_shape(logits, R - first_logit, d.vocab()))
                 fail("step_rows: logits must be [R - first_logit = " + std::to_string(R - first_logit) + ", vocab = " +
                      std::to_string(d.vocab()) + "]");
               lp = logits.data();
             }
             const int64_t* p = pos.data();
             const int64_t* s = slot.data();
             for (int64_t r = 0; r < R; ++r) {
               require(p[r] >= 0 && p[r] < d.shape().max_ctx, "step_rows: position outside the cache");
               require(s[r] >= 0 && s[r] < d.n_slots(), "step_rows: slot outside the cache");
             }
             {  // two rows writing the same (slot, position) would race on the cache
               std::vector<std::pair<int64_t, int64_t>> at(R);
               for (int64_t r = 0; r < R; ++r) at[r] = {s[r], p[r]};
               std::sort(at.begin(), at.end());
               for (int64_t r = 1; r < R; ++r) require(at[r] != at[r - 1], "step_rows: two rows write the same slot and position");
             }
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             if (ids) {
               self.xrows.resize(R * hidden);
               xp = self.xrows.data();
               for (int64_t r = 0; r < R; ++r) {
                 float* x = xp + r * hidden;
                 if (self.emb_f32) {
                   std::memcpy(x, self.emb_f32 + ids[r] * hidden, sizeof(float) * hidden);
                 } else {
                   const uint16_t* row = self.emb_bf16 + ids[r] * hidden;
                   for (int64_t i = 0; i < hidden; ++i) x[i] = bf16_to_f32(row[i]);
                 }
                 if (self.emb_scale != 1.f)
                   for (int64_t i = 0; i < hidden; ++i) x[i] *= self.emb_scale;
               }
             }
             KernelsRunning running(settings_mutex());
             d.step_rows(xp, R, p, s, lp, first_logit);
           },
           nb::arg("x").none(), nb::arg("pos"), nb::arg("slot"), nb::arg("logits").none(), nb::arg("first_logit"),
           nb::arg("tokens").none() = nb::none(),
           "R rows of any sequences (row r at pos[r] of slot[r]: decode rows and prompt chunks together), from "
           "embeddings x [R, hidden] (overwritten) or token ids [R] (gathered natively: set_embedding); logits "
           "[R - first_logit, vocab] of the last rows, or None when first_logit == R")
      .def("forward",
           [](PyDecoder& self, nb::handle hx, int64_t pos, int64_t slot, nb::handle hlogits, int which) {
             Decoder& d = self.d;
             require(d.has_output(), "forward: the output layer is not set (call set_output first)");
             require(which >= 0 && which <= 2, "forward: logits_of must be 0 (none), 1 (the last token) or 2 (every token)");
             auto x = out<float, 2>(hx, "forward: x");
             const int64_t N = (int64_t)x.shape(0);
             require(N >= 1 && x.shape(1) == (size_t)d.shape().hidden, "forward: x must be [N, hidden] with N >= 1");
             float* lp = nullptr;
             if (which != 0) {
               auto logits = out<float, 2>(hlogits, "forward: logits");
               const int64_t rows = which == 2 ? N : 1;
               if (!is_shape(logits, rows, d.vocab()))
                 fail("forward: logits must be [" + std::to_string(rows) + ", vocab = " + std::to_string(d.vocab()) + "]");
               lp = logits.data();
             }
             require(pos >= 0 && pos + N <= d.shape().max_ctx, "forward: positions pos..pos+N-1 must lie inside the cache");
             require(slot >= 0 && slot < d.n_slots(), "forward: slot outside the cache");
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             KernelsRunning running(settings_mutex());
             d.forward(x.data(), N, pos, slot, lp, (Decoder::Logits)which);
           },
           nb::arg("x"), nb::arg("pos"), nb::arg("slot"), nb::arg("logits").none(), nb::arg("logits_of"),
           "N tokens of one sequence at positions pos..pos+N-1 of `slot`; logits_of 0: none, 1: the last token's "
           "[1, vocab], 2: every token's [N, vocab]")
      .def("set_profile",
           [](PyDecoder& self, bool on) {
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.set_profile(on);
           },
           nb::arg("on"), "profiling on (counters reset) or off; off costs nothing")
      .def("set_prefetch_next",
           [](PyDecoder& self, bool on) {
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.set_prefetch_next(on);
           },
           nb::arg("on"), "the decode schedule across matrices on (default) or off, for side-by-side measurements")
      .def("set_attn_split_min",
           [](PyDecoder& self, int64_t n) {
             if (n < 0) py::fail("set_attn_split_min: n must be >= 0 (0: never split), not " + std::to_string(n));
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(self.mu);
             self.d.set_attn_split_min(n);
           },
           nb::arg("n"), "shortest chunk of a decode row's context split across threads (flash-decoding); 0: never")
      .def("profile",
           [](PyDecoder& self) {
             nb::dict d;
             std::lock_guard<std::mutex> lock(self.mu);
             d["decode"] = profile_dict(self.d.profile(kStepDecode));
             d["prefill"] = profile_dict(self.d.profile(kStepPrefill));
             d["batch"] = profile_dict(self.d.profile(kStepBatch));
             return d;
           },
           "seconds per category (gemv, join, attention, lm_head, rest; join split as join_gemv, join_attention, "
           "join_lm_head, join_rest), wall seconds, steps and tokens, per kind of step")
      .def_prop_ro("n_layers", [](PyDecoder& self) { return self.d.n_layers(); });
}

}  // namespace lowbit
