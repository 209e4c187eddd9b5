"""The native forward: the whole decoder stack over N tokens in one C++ call (kernels/decoder.cpp).

    dec = NativeDecoder.build(model)          # a str saying why when the step cannot run this model
    logits = dec.decode(x, pos)               # x: float32 [hidden] embedding -> float32 [vocab]
    logits = dec.forward(x, pos, "last")      # x: float32 [N, hidden] at pos..pos+N-1 -> [1, vocab]
    dec.set_profile(True); ...; dec.profile() # seconds per category (gemv, join, attention, lm_head, rest)

It reads the same packed weights, norms, RoPE tables and static KV cache as the Python model, whose numpy
block is the reference the tests compare it with.
"""
from __future__ import annotations

import numpy as np

from lowbit import _native
from lowbit.formats.codebook import CodebookWeight
from lowbit.formats.floats import BF16Weight, F32Weight
from lowbit.formats.intcodes import IntCodeWeight
from lowbit.formats.rsr import RSRWeight
from lowbit.formats.int6 import Int6Weight
from lowbit.formats.tq1 import TQ1Weight
from lowbit.model.hugepages import codes_to_hugepages
from lowbit.model.kv_cache import kv_kind

LOGITS_OF = {"none": 0, "last": 1, "all": 2}
ACTS = {"silu": 0, "swish": 0, "relu2": 1, "gelu_pytorch_tanh": 2, "gelu_tanh": 2}


def linear_tuple(lin):
    """The tuple the C++ decoder takes for a Linear, or None if its format has no native path."""
    w, b = lin.weight, lin.bias
    if isinstance(w, RSRWeight) and w.dense is not None:
        w = w.dense  # one token: the dense ternary codes rsr keeps for decode (its index serves prefill)
    if isinstance(w, IntCodeWeight):
        return ("int", w.codes, w._scale_u16, w._offset_u16, float(w.zc or 0.0), w.bits, w.shape[0], w.shape[1],
                w.kp, w.group, b)
    if isinstance(w, Int6Weight):
        return ("int6", w.lo.codes, w.lo._scale_u16, w.lo._offset_u16, w.hi.codes, w.shape[0], w.shape[1], w.kp,
                w.group, b)
    if isinstance(w, TQ1Weight):
        return ("tq1", w.codes, w._scale_u16, w.shape[0], w.shape[1], w.kp, w.group, b)
    if isinstance(w, CodebookWeight):
        return ("codebook", w.codes, w._scale_u16, w._cbT, w._cb, w.shape[0], w.shape[1], w.kp, w.group, b, w.codes16)
    if isinstance(w, F32Weight):
        return ("f32", np.ascontiguousarray(w.w, np.float32), b)
    if isinstance(w, BF16Weight):
        return ("bf16", w.w, b)
    return None


def decode_order_packed_weights(model) -> list:
    """The packed-code weights (integer codes, rsr's dense part, tq1, codebook) in the order a decode step reads
    them: the blocks', then an untied lm_head's (int6: its two planes; a head tied to the embedding shares its
    table, which a move would copy). The lm_head was left where it was built: an int6 head's 4-bit plane of
    bitnet-0.7b (24 MB) on 4 KiB pages, its 2-bit plane on huge ones."""
    out = []
    for blk in model.layers:
        for n in ("q", "k", "v", "o", "gate", "up", "down"):
            w = getattr(blk, n).weight
            if isinstance(w, RSRWeight) and w.dense is not None:
                w = w.dense
            if isinstance(w, (IntCodeWeight, TQ1Weight, CodebookWeight)):
                out.append(w)
    head = None if getattr(model, "tied", False) else getattr(model.lm_head, "weight", None)
    if isinstance(head, Int6Weight):
        out += [head.lo, head.hi]
    elif isinstance(head, IntCodeWeight):
        out.append(head)
    return out


class NativeDecoder:
    def __init__(self, dec, vocab: int, keep: list):
        self._dec = dec
        self._keep = keep  # the arrays the C++ side points into
        self.has_embedding = False  # set_embedding took the model's table: decode_token works
        self.vocab = vocab

    @classmethod
    def build(cls, model, slots=None, hugepages: bool = True) -> "NativeDecoder | str":
        """The native step over model.cache, or over a SlotKVCache `slots` (for decode_batch); or, when the
        step cannot run this model, the reason (the model then decodes in numpy). hugepages: first move the
        blocks' packed codes, in decode order, onto 2 MiB pages (lowbit.model.hugepages)."""
        a = model.args
        act = ACTS.get(a.hidden_act)
        if act is None:
            return f"hidden_act {a.hidden_act!r} has no native decode step"
        if hugepages:
            codes_to_hugepages(decode_order_packed_weights(model))
        layers = []
        for blk in model.layers:
            lins = [linear_tuple(getattr(blk, n)) for n in ("q", "k", "v", "o", "gate", "up", "down")]
            if any(t is None for t in lins):
                return "a weight format has no native decode step"
            layers.append((tuple(lins), blk))
        head = linear_tuple(model.lm_head)
        if head is None:
            return "the lm_head's format has no native decode step"
        rope = model.rope
        C = np.ascontiguousarray(rope.C, np.float32)
        S = np.ascontiguousarray(rope.S, np.float32)
        cache = slots if slots is not None else model.cache
        kv_f16 = cache.k.dtype == np.float16  # passed as uint16 views
        # the rows a (layer, kv head) run holds: a model cache's capacity (it grows), the slots' max_ctx
        try:  # a shape or constant outside what the step takes (e.g. head_dim > 512) -> the reason
            dec = _native.Decoder(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim,
                                  a.intermediate_size, cache.k.shape[-2], float(a.rms_norm_eps), act, C, S, kv_kind(cache.k.dtype))
        except ValueError as e:
            return str(e)
        keep = [C, S, head]
        dec.set_attention(float(model.attn_scale), float(model.attn_softcap or 0.0))
        for i, (lins, blk) in enumerate(layers):
            kc, vc = (blk.kc, blk.vc) if slots is None else (slots.k[i, 0], slots.v[i, 0])  # slot 0
            if kv_f16:
                kc, vc = kc.view(np.uint16), vc.view(np.uint16)
            dec.add_layer(lins, blk.ln1, blk.ln2, blk.attn_sub, blk.ffn_sub, kc, vc)
            dec.set_layer_extras(i, blk.q_norm, blk.k_norm, blk.post_attn, blk.post_ffn, int(blk.window or 0))
            keep.append(lins)
        if slots is not None:
            k_all, v_all = (slots.k.view(np.uint16), slots.v.view(np.uint16)) if kv_f16 else (slots.k, slots.v)
            dec.set_slots(len(slots), slots.slot_stride, k_all, v_all)  # checks every slot lies inside
            keep.append(slots)
        dec.set_output(model.norm, head)
        nat = cls(dec, model.lm_head.shape[0], keep)
        try:  # the embedding row gathered natively (decode_token); a table it cannot take keeps the numpy gather
            scale = 1.0 if model.embed_scale is None else float(model.embed_scale)
            dec.set_embedding(model.embed.rows_source, scale)
            nat.has_embedding = True
        except (ValueError, TypeError, AttributeError):
            pass
        return nat

    def decode(self, x: np.ndarray, pos: int) -> np.ndarray:
        """x: float32 [hidden] (the token's embedding, overwritten) at position pos -> logits float32 [vocab]."""
        logits = np.empty(self.vocab, np.float32)
        self._dec.decode(x, pos, logits)
        return logits

    def decode_token(self, token: int, pos: int) -> np.ndarray:
        """decode() of a token id, its embedding row gathered natively (needs has_embedding) -> logits [vocab]."""
        logits = np.empty(self.vocab, np.float32)
        self._dec.decode_token(int(token), pos, logits)
        return logits

    def forward(self, x: np.ndarray, pos: int, logits_of: str = "last", slot: int = 0) -> np.ndarray | None:
        """x: float32 [N, hidden] embeddings (overwritten) of N tokens at positions pos..pos+N-1 of `slot`
        -> logits float32 [1, vocab] of the last token ("last"), [N, vocab] ("all"), or None ("none")."""
        which = LOGITS_OF.get(logits_of)
        if which is None:
            raise ValueError(f"logits_of must be one of {', '.join(LOGITS_OF)}, got {logits_of!r}")
        logits = None if which == 0 else np.empty((x.shape[0] if which == 2 else 1, self.vocab), np.float32)
        self._dec.forward(x, int(pos), int(slot), logits, which)
        return logits

    def set_profile(self, on: bool) -> None:
        """Native timers on (counters reset) or off (then nothing is timed)."""
        self._dec.set_profile(bool(on))

    def profile(self) -> dict:
        """{"decode" | "prefill" | "batch": {"gemv", "join", "attention", "lm_head", "rest": seconds, "join_gemv",
        "join_attention", "join_lm_head", "join_rest": the join seconds by the stretch they ended (summing to
        "join"), "seconds": wall seconds, "steps", "tokens"}} since set_profile(True)."""
        return self._dec.profile()

    def decode_batch(self, x: np.ndarray, pos, slot) -> np.ndarray:
        """x: float32 [B, hidden] embeddings (overwritten), pos, slot: int [B] -> logits float32 [B, vocab]
        (built with slots=)."""
        logits = np.empty((x.shape[0], self.vocab), np.float32)
        self._dec.decode_batch(x, np.ascontiguousarray(pos, np.int64), np.ascontiguousarray(slot, np.int64), logits)
        return logits

    def step_rows(self, x: np.ndarray | None, pos, slot, first_logit: int, logits: np.ndarray | None = None,
                  tokens=None) -> np.ndarray | None:
        """Rows of several sequences in one step (decode rows and prompt chunks; built with slots=).

        x: float32 [R, hidden] embeddings (overwritten), or None and tokens: int [R] ids whose rows are
        gathered natively (needs has_embedding); pos, slot: int [R] -> logits float32
        [R - first_logit, vocab] of the last rows (into `logits` when given), None when first_logit == R."""
        R = x.shape[0] if x is not None else len(tokens) if tokens is not None else 0
        if first_logit < R and logits is None:
            logits = np.empty((R - first_logit, self.vocab), np.float32)
        self._dec.step_rows(x, np.ascontiguousarray(pos, np.int64), np.ascontiguousarray(slot, np.int64),
                            logits if first_logit < R else None, int(first_logit),
                            None if tokens is None else np.ascontiguousarray(tokens, np.int64))
        return logits if first_logit < R else None
