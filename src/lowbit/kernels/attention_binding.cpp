// Python entry points of the attention driver (attention.h): the same code the decoder step runs, for the
// kernel tests against numpy and for the numpy prefill path.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention.h"
#include "dispatch.h"
#include "kv_args.h"
#include "py_args.h"
#include "weight_args.h"

namespace nb = nanobind;
using namespace lowbit;
using namespace lowbit::py;

namespace {

// Causal attention of n new tokens (prefill) over the static cache of one sequence.
// q: [n, heads, hd] (RoPE'd and scaled), cache: [kv_heads, max_ctx, hd] float32 or float16 (as uint16),
// positions pos..pos+n-1 already written; out: [n, heads*hd].
void attention_prefill(nb::handle hq, nb::handle hkc, nb::handle hvc, int64_t pos, nb::handle hout) {
  auto q = in<float, 3>(hq, "attention_prefill: q");
  auto kc = any_in<3>(hkc, "attention_prefill: k cache");
  auto vc = any_in<3>(hvc, "attention_prefill: v cache");
  const int64_t n = q.shape(0), heads = q.shape(1), hd = q.shape(2);
  const int64_t kv = kc.shape(0), max_ctx = kc.shape(1);
  require(vc.dtype() == kc.dtype() && vc.shape(0) == kc.shape(0) && vc.shape(1) == kc.shape(1) && vc.shape(2) == kc.shape(2),
          "attention_prefill: k and v caches must match in shape and dtype");
  require(heads > 0 && hd > 0, "attention_prefill: q must be [n, heads > 0, hd > 0]");
  const KvType kvt = cache_type(kc, hd, "attention_prefill");
  require(kv > 0 && heads % kv == 0, "attention_prefill: cache must be [kv_heads, max_ctx, row] with heads % kv_heads == 0");
  require(hd <= kMaxHeadDim, "attention_prefill: head_dim above 512 is not supported");
  require(pos >= 0 && pos + n <= max_ctx, "attention_prefill: positions pos..pos+n-1 must lie inside the cache");
  auto o = out<float, 2>(hout, "attention_prefill: out");
  require(is_shape(o, n, heads * hd), "attention_prefill: out must be [n, heads*hd]");
  if (n == 0) return;
  std::vector<int64_t> p(n), s(n, 0);
  for (int64_t i = 0; i < n; ++i) p[i] = pos + i;
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  const AttnCall c{q.data(), o.data(), kc.data(), vc.data(), kvt, p.data(), s.data(), n, heads, kv, hd, max_ctx, 0, 0, 0.f};
  attention(c, active_kernels().ops);
}

// The decoder's attention, every option: rows r of q attend positions [start, pos[r]] of slot[r] of the
// cache [slots, kv_heads, max_ctx, hd] (start cut by window > 0), scores soft-capped when softcap > 0,
// a lone row's context split across threads in chunks of >= split_min positions (0: never).
void attention_rows(nb::handle hq, nb::handle hkc, nb::handle hvc, nb::handle hpos, nb::handle hslot, nb::handle hout,
                    int64_t window, float softcap, int64_t split_min) {
  auto q = in<float, 3>(hq, "attention: q");
  auto kc = any_in<4>(hkc, "attention: k cache");
  auto vc = any_in<4>(hvc, "attention: v cache");
  auto pos = in<int64_t, 1>(hpos, "attention: pos");
  auto slot = in<int64_t, 1>(hslot, "attention: slot");
  auto o = out<float, 2>(hout, "attention: out");
  const int64_t R = q.shape(0), heads = q.shape(1), hd = q.shape(2);
  const int64_t slots = kc.shape(0), kv = kc.shape(1), max_ctx = kc.shape(2);
  bool same = vc.dtype() == kc.dtype();
  for (int d = 0; d < 4; ++d) same = same && vc.shape(d) == kc.shape(d);
  require(same, "attention: k and v caches must match in shape and dtype");
  require(heads > 0 && hd > 0, "attention: q must be [rows, heads > 0, hd > 0]");
  const KvType kvt = cache_type(kc, hd, "attention");
  require(kv > 0 && heads % kv == 0, "attention: cache must be [slots, kv_heads, max_ctx, row] with heads % kv_heads == 0");
  require(hd <= kMaxHeadDim, "attention: head_dim above 512 is not supported");
  require(pos.shape(0) == (size_t)R && slot.shape(0) == (size_t)R, "attention: pos and slot must have one entry per row of q");
  require(is_shape(o, R, heads * hd), "attention: out must be [rows, heads*hd]");
  require(window >= 0 && split_min >= 0, "attention: window and split_min must be >= 0");
  require(std::isfinite(softcap) && softcap >= 0.f, "attention: softcap must be a finite number >= 0");
  for (int64_t r = 0; r < R; ++r) {
    if (pos.data()[r] < 0 || pos.data()[r] >= max_ctx)
      fail("attention: pos[" + std::to_string(r) + "] = " + std::to_string(pos.data()[r]) + " is outside the cache of " +
           std::to_string(max_ctx) + " positions");
    if (slot.data()[r] < 0 || slot.data()[r] >= slots)
      fail("attention: slot[" + std::to_string(r) + "] = " + std::to_string(slot.data()[r]) + " is outside the " +
           std::to_string(slots) + " slots");
  }
  if (R == 0) return;
  nb::gil_scoped_release release;
  KernelsRunning running(settings_mutex());
  const AttnCall c{q.data(), o.data(), kc.data(), vc.data(), kvt, pos.data(), slot.data(), R, heads, kv, hd, max_ctx,
                   kv * max_ctx * kv_row_units(kvt, hd), window, softcap};
  attention(c, active_kernels().ops, nullptr, split_min);
}

// The int8 cache's row write, as the decoder runs it: x [n, hd] float32 -> out [n, hd + 4] int8 (tests).
void kv_quantize_rows(nb::handle hx, nb::handle hout) {
  auto x = in<float, 2>(hx, "kv_quantize_rows: x");
  auto o = out<int8_t, 2>(hout, "kv_quantize_rows: out");
  const int64_t n = x.shape(0), hd = x.shape(1);
  const int64_t row = kv_row_units(KvType::kI8, hd);
  require(is_shape(o, n, row), "kv_quantize_rows: out must be [n, hd + 4]");
  const OpsTable& ops = active_kernels().ops;
  for (int64_t i = 0; i < n; ++i) ops.kv_quantize_row(x.data() + i * hd, hd, o.data() + i * row);
}

// RoPE as the decoder applies it to a row's heads: x [n, hd] in place with the rows C, S [hd] of one position,
// then * scale (tests).
void rope_rows(nb::handle hx, nb::handle hc, nb::handle hs, float scale) {
  auto x = out<float, 2>(hx, "rope_rows: x");
  auto c = in<float, 1>(hc, "rope_rows: C");
  auto s = in<float, 1>(hs, "rope_rows: S");
  const int64_t n = x.shape(0), hd = x.shape(1);
  require(hd % 2 == 0, "rope_rows: the head dim must be even");
  require(c.shape(0) == (size_t)hd && s.shape(0) == (size_t)hd, "rope_rows: C and S must be [hd]");
  active_kernels().ops.rope(x.data(), n, hd, c.data(), s.data(), scale);
}

// The decoder's other row ops (tests): rmsnorm of each row of x [n, d] with w [d] into out [n, d] (out may be
// x); g [n] = act(g) * u in place (act 0 SiLU, 1 squared ReLU, 2 GELU).
void rmsnorm_rows(nb::handle hx, nb::handle hw, float eps, nb::handle hout) {
  auto x = in<float, 2>(hx, "rmsnorm_rows: x");
  auto w = in<float, 1>(hw, "rmsnorm_rows: w");
  auto o = out<float, 2>(hout, "rmsnorm_rows: out");
  const int64_t n = x.shape(0), d = x.shape(1);
  require(w.shape(0) == (size_t)d && is_shape(o, n, d), "rmsnorm_rows: w must be [d] and out [n, d]");
  for (int64_t i = 0; i < n; ++i) active_kernels().ops.rmsnorm(x.data() + i * d, w.data(), d, eps, o.data() + i * d);
}
void act_mul_row(nb::handle hg, nb::handle hu, int act) {
  auto g = out<float, 1>(hg, "act_mul_row: g");
  auto u = in<float, 1>(hu, "act_mul_row: u");
  require(u.shape(0) == g.shape(0), "act_mul_row: g and u must have one length");
  require(act >= 0 && act <= 2, "act_mul_row: act must be 0, 1 or 2");
  active_kernels().ops.act_mul(g.data(), u.data(), (int64_t)g.shape(0), act);
}

}  // namespace

namespace lowbit {
void bind_attention(nb::module_& m) {
  m.def("attention_prefill", &attention_prefill, nb::arg("q"), nb::arg("kc"), nb::arg("vc"), nb::arg("pos"), nb::arg("out"));
  m.def("attention", &attention_rows, nb::arg("q"), nb::arg("kc"), nb::arg("vc"), nb::arg("pos"), nb::arg("slot"),
        nb::arg("out"), nb::arg("window") = 0, nb::arg("softcap") = 0.f, nb::arg("split_min") = kAttnSplitMin,
        "causal attention of rows over a multi-slot KV cache, as the decoder runs it (tests)");
  m.def("kv_quantize_rows", &kv_quantize_rows, nb::arg("x"), nb::arg("out"),
        "int8 KV cache rows (values, then the float32 scale) as the decoder writes them (tests)");
  m.def("rope_rows", &rope_rows, nb::arg("x"), nb::arg("c"), nb::arg("s"), nb::arg("scale") = 1.f,
        "RoPE (rotate_half, S signed) on the rows of x in place, then * scale, as the decoder runs it (tests)");
  m.def("rmsnorm_rows", &rmsnorm_rows, nb::arg("x"), nb::arg("w"), nb::arg("eps"), nb::arg("out"),
        "rmsnorm of the rows of x into out (may be x), as the decoder runs it (tests)");
  m.def("act_mul_row", &act_mul_row, nb::arg("g"), nb::arg("u"), nb::arg("act"),
        "g = act(g) * u in place (0 SiLU, 1 squared ReLU, 2 GELU), as the decoder runs it (tests)");
}
}  // namespace lowbit
