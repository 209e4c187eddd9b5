"""Batched decoding: B sequences, each in its own slot of a multi-slot static KV cache, decoded together.

    bd = BatchDecoder(model, n_slots=8)
    logits = bd.prefill(slot=3, ids=prompt_ids)           # [vocab]; call again with the next chunk
    logits = bd.decode(tokens=[t0, t1], slots=[3, 5])     # [2, vocab]: one step for both sequences

A decode step runs every projection as one GEMM over the B rows (the packed weights are read once for
all of them), RoPE at each sequence's own position and attention per sequence against its own slot:
in one C++ call (NativeDecoder.decode_batch) when every weight format has a native path, else in numpy
(decode_python, also the reference the native step is tested against). Prefill runs the native forward
into the slot (or the model's numpy reference pointed at the slot). The model's single-sequence cache and
decode path are untouched.
"""
from __future__ import annotations

import contextlib

import numpy as np

from lowbit._runtime import single_threaded_blas
from lowbit.model.kv_cache import KVCache, SlotKVCache, kv_read, kv_write
from lowbit.model.layers import rms_norm, token_ids
from lowbit.model.llama import _softmax_, project


class BatchDecoder:
    def __init__(self, model, n_slots: int, max_context: int | None = None, native: bool | None = None):
        a = model.args
        ctx = int(max_context or model.max_context)
        if not 1 <= ctx <= model.max_context:
            raise ValueError(f"max_context must be in [1, {model.max_context}] (the model's context), got {ctx}")
        self.model = model
        self.cache = SlotKVCache(n_slots, a.num_hidden_layers, a.num_key_value_heads, a.head_dim, ctx,
                                 model.cache.k.dtype)
        self.max_ctx = ctx
        self._native = None
        self._logits = None  # step()'s output buffer [n_slots, vocab], allocated once
        if native if native is not None else model.native_decode:
            from lowbit.model.native import NativeDecoder

            built = NativeDecoder.build(model, slots=self.cache)
            if isinstance(built, str):
                import warnings

                warnings.warn(f"{built}: batched decoding in numpy (slower)", stacklevel=2)
            else:
                self._native = built

    @property
    def n_slots(self) -> int:
        return len(self.cache)

    @property
    def native(self) -> bool:
        return self._native is not None

    def slot(self, i: int) -> KVCache:
        return self.cache.slot(i)

    @contextlib.contextmanager
    def _on_slot(self, i: int):
        """Points the model's cache and its layers' K/V views at slot i for the duration."""
        m = self.model
        c = self.cache.slot(i)
        saved = m.cache, [(blk.kc, blk.vc) for blk in m.layers]
        m.cache = c
        for li, blk in enumerate(m.layers):
            blk.kc, blk.vc = c.k[li], c.v[li]  # [kv_heads, max_ctx, hd], contiguous
        try:
            yield c
        finally:
            m.cache = saved[0]
            for blk, (kc, vc) in zip(m.layers, saved[1]):
                blk.kc, blk.vc = kc, vc

    def prefill(self, slot: int, ids) -> np.ndarray:
        """Appends ids to slot `slot` (after what it holds) -> float32 logits [vocab] of the last id."""
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} is outside the cache's {self.n_slots} slots")
        m = self.model
        if self._native is not None:
            return m.prefill_native(self._native, self.cache.slot(slot), slot, m._prompt_ids(ids))
        with self._on_slot(slot):
            return m.prefill_python(ids)

    def _check_slots(self, slots: list[int], counts: list[int]) -> None:
        """One step's slots: each at most once, inside the cache, with room for its count of new tokens."""
        if len(set(slots)) != len(slots):
            raise ValueError(f"a slot appears twice in one step: {slots}")
        for s, n in zip(slots, counts):
            if not 0 <= s < self.n_slots:
                raise ValueError(f"slot {s} is outside the cache's {self.n_slots} slots")
            self.cache.slot(s).check_room(n)

    def _positions(self, tokens, slots) -> tuple[list[int], list[int], np.ndarray]:
        tokens = token_ids(tokens, self.vocab).tolist()
        slots = [int(s) for s in slots]
        if len(tokens) != len(slots) or not tokens:
            raise ValueError(f"decode takes one token per slot (got {len(tokens)} tokens, {len(slots)} slots)")
        self._check_slots(slots, [1] * len(slots))
        pos = np.array([self.cache.slot(s).length for s in slots], np.int64)
        return tokens, slots, pos

    def _advance(self, tokens, slots) -> None:
        for t, s in zip(tokens, slots):
            c = self.cache.slot(s)
            c.length += 1
            c.tokens.append(t)

    def decode(self, tokens, slots) -> np.ndarray:
        """One token per sequence: tokens[b] goes at the next position of slot slots[b].

        -> float32 logits [B, vocab]."""
        if self._native is None:
            return self.decode_python(tokens, slots)
        tokens, slots, pos = self._positions(tokens, slots)
        x = self.model.embed_ids(tokens)  # [B, hidden]
        logits = self.model.cap_logits(self._native.decode_batch(x, pos, np.array(slots, np.int64)))
        self._advance(tokens, slots)
        return logits

    def step(self, items) -> np.ndarray:
        """One mixed step (continuous batching with chunked prefill): items are (slot, ids, wants_logits);
        each appends its ids at the next positions of its slot — a running sequence's decode token (one id)
        or a newcomer's prompt chunk (several) — all in one native step, the projections one GEMM over
        every row. -> float32 logits [items that want them, vocab], each of its item's last id, in item
        order; a view of a buffer the next step overwrites.

        Without the native step: the numpy reference, the decode rows batched (decode_python) and each
        prompt chunk alone (prefill_python)."""
        items = [(int(s), token_ids(ids, self.vocab).tolist(), bool(w)) for s, ids, w in items]
        if not items:
            raise ValueError("a step needs at least one item")
        for s, ids, _ in items:
            if not ids:
                raise ValueError(f"slot {s}: a step item needs at least one token")
        self._check_slots([s for s, _, _ in items], [len(ids) for _, ids, _ in items])
        n_logits = sum(w for _, _, w in items)
        if self._native is None:  # the numpy reference: decode rows batched, prompt chunks one by one
            dec = [i for i, (_, ids, w) in enumerate(items) if w and len(ids) == 1]
            out: dict[int, np.ndarray] = {}
            if dec:
                rows = self.decode_python([items[i][1][0] for i in dec], [items[i][0] for i in dec])
                out.update(zip(dec, rows))
            for i, (s, ids, _) in enumerate(items):
                if i not in out:
                    out[i] = self.prefill(s, ids)
            want = [out[i] for i, (_, _, w) in enumerate(items) if w]
            return np.stack(want) if want else np.empty((0, self.vocab), np.float32)
        # rows: every id, except that the last id of each item wanting logits goes to the end (in item order):
        # the step computes logits for its last rows only; attention does not care about row order
        tokens, pos, slot_of = [], [], []
        last_tok, last_pos, last_slot = [], [], []
        for s, ids, w in items:
            at = self.cache.slot(s).length
            n = len(ids) - 1 if w else len(ids)
            tokens += ids[:n]
            pos += range(at, at + n)
            slot_of += [s] * n
            if w:
                last_tok.append(ids[-1])
                last_pos.append(at + n)
                last_slot.append(s)
        first = len(tokens)
        if self._logits is None:
            self._logits = np.empty((self.n_slots, self._native.vocab), np.float32)
        logits = self._logits[:n_logits]
        rows = tokens + last_tok
        nat = self._native
        pos, slot_of = np.array(pos + last_pos, np.int64), np.array(slot_of + last_slot, np.int64)
        if nat.has_embedding:  # the embedding rows gathered natively
            nat.step_rows(None, pos, slot_of, first, logits, tokens=rows)
        else:
            nat.step_rows(self.model.embed_ids(rows), pos, slot_of, first, logits)  # x: [R, hidden]
        for s, ids, _ in items:
            c = self.cache.slot(s)
            c.length += len(ids)
            c.tokens.extend(ids)
        return self.model.cap_logits(logits)

    @property
    def vocab(self) -> int:
        return self.model.args.vocab_size

    def decode_python(self, tokens, slots) -> np.ndarray:
        """decode() in numpy around the matmul kernels (projections as one GEMM over B rows)."""
        tokens, slots, pos = self._positions(tokens, slots)
        m = self.model
        B = len(tokens)
        x = m.embed_ids(tokens)  # [B, hidden]
        C, S = m.rope.C[pos][:, None, :], m.rope.S[pos][:, None, :]  # [B, 1, hd]
        with single_threaded_blas():
            for li, blk in enumerate(m.layers):
                q, k, v = project(blk.qkv, rms_norm(x, blk.ln1, blk.eps))
                q = q.reshape(B, blk.n_heads, blk.hd)
                k = k.reshape(B, blk.n_kv, blk.hd)
                v = v.reshape(B, blk.n_kv, blk.hd)
                if blk.q_norm is not None:  # Qwen 3
                    q = rms_norm(q.reshape(-1, blk.hd), blk.q_norm, blk.eps).reshape(B, blk.n_heads, blk.hd)
                    k = rms_norm(k.reshape(-1, blk.hd), blk.k_norm, blk.eps).reshape(B, blk.n_kv, blk.hd)
                qk = m.rope.apply(np.concatenate((q, k), axis=1), C, S)  # [B, heads+kv, hd]
                q = qk[:, :blk.n_heads] * blk.scale
                k = qk[:, blk.n_heads:]
                o = np.empty((B, blk.n_heads * blk.hd), np.float32)
                for b, (s, p) in enumerate(zip(slots, pos)):
                    kc, vc = self.cache.k[li, s], self.cache.v[li, s]  # [kv, max_ctx, row]
                    kv_write(kc, p, k[b][:, None])
                    kv_write(vc, p, v[b][:, None])
                    t0 = p + 1 - blk.window if blk.window is not None and p + 1 > blk.window else 0  # sliding window
                    kt, vt = kv_read(kc, t0, p + 1), kv_read(vc, t0, p + 1)
                    sc = blk._cap_(np.matmul(q[b].reshape(blk.n_kv, blk.group, blk.hd), kt.transpose(0, 2, 1)))  # [kv, g, t]
                    o[b] = np.matmul(_softmax_(sc), vt).reshape(-1)  # [kv, g, hd]
                x = blk._out(x, o)
                x = blk._mlp(x)
        self._advance(tokens, slots)
        return m.cap_logits(m.lm_head(rms_norm(x, m.norm, m.args.rms_norm_eps)))
