"""Continuous batching: sequences join and leave a running batch at token boundaries.

    engine = BatchEngine(model, tokenizer, max_batch=8)
    seq = engine.submit(prompt_ids, max_tokens=64, params=SamplingParams(temperature=0.7, seed=1), stop=["\\n"])
    while engine.has_work():
        engine.step()
    seq.text, seq.tokens, seq.finish_reason, seq.stats

Each step admits waiting sequences into free slots (a slot whose cache already holds a prefix of the
prompt is preferred and that prefix is not recomputed), then runs one mixed native step
(model/batch.py BatchDecoder.step: one GEMM over all rows) carrying the decode row of every sequence
already generating and up to prefill_chunk prompt tokens of the newcomers (oldest first; a long prompt
takes several steps). Newcomers thus slow the others' next token by at most one chunk's rows per step,
and nobody waits for a separate prefill call. Greedy rows are sampled by one argmax over their logits.
Text comes out as in Generation (generate/loop.py): EOS ends a sequence and is not emitted, stop strings
cut the text, the streaming detokenizer keeps multi-byte characters whole; greedy output is the same.

One thread owns the engine (step() is not re-entrant); submit() and Sequence.cancel() may be called
from any thread. Callbacks (on_piece, on_done) run on the engine's thread.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

import numpy as np

from lowbit.generate.detok import StopMatcher, StreamDecoder
from lowbit.generate.loop import GenerationStats, peak_memory_gb
from lowbit.generate.sampling import Sampler, SamplingParams
from lowbit.model.batch import BatchDecoder
from lowbit.model.kv_cache import ContextOverflowError
from lowbit.model.layers import token_ids

PREFILL_CHUNK = 64  # prompt tokens per engine step: bounds how long newcomers delay the running sequences' next token


class Sequence:
    """One request in the engine. State: waiting -> prefill -> decode -> done."""

    def __init__(self, prompt_ids, max_tokens: int, params: SamplingParams, stop, eos_ids, tokenizer,
                 on_piece: Callable[["Sequence", str], None] | None = None,
                 on_done: Callable[["Sequence"], None] | None = None):
        self.prompt_ids = token_ids(prompt_ids).tolist()  # the range is checked by BatchEngine.submit
        if not self.prompt_ids:
            raise ValueError("the prompt is empty (no tokens)")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = int(max_tokens)
        self.params = params
        self.eos_ids = set(eos_ids)
        self.on_piece, self.on_done = on_piece, on_done
        self.sampler = Sampler(params)
        self.detok = StreamDecoder(tokenizer, context=self.prompt_ids)
        self.stops = StopMatcher(stop)
        self.history = list(self.prompt_ids)  # for the repetition penalty
        self.state = "waiting"
        self.slot: int | None = None
        self.n_cached = 0  # prompt ids whose K/V are in the slot
        self.next_token: int | None = None  # sampled, not yet run through the model
        self.tokens: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None  # "stop", "length", "cancelled", "error"
        self.error: str | None = None
        self.cancelled = False
        self.stats = GenerationStats(prompt_tokens=len(self.prompt_ids))
        self.t_submit = time.perf_counter()
        self.t_start = self.t_first = self.t_done = None
        self.done_event = threading.Event()

    def cancel(self) -> None:
        """Asks the engine to drop this sequence at the next token boundary (thread-safe)."""
        self.cancelled = True

    @property
    def done(self) -> bool:
        return self.state == "done"


class BatchEngine:
    def __init__(self, model, tokenizer, max_batch: int = 8, max_context: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, native: bool | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.model, self.tokenizer = model, tokenizer
        self.runner = BatchDecoder(model, max_batch, max_context=max_context, native=native)
        self.max_context = self.runner.max_ctx
        self.prefill_chunk = prefill_chunk
        self.eos_ids = set(getattr(tokenizer, "eos_ids", ()) or ()) | model.args.eos_ids
        self._incoming: collections.deque[Sequence] = collections.deque()
        self._lock = threading.Condition()
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.active: dict[int, Sequence] = {}  # slot -> sequence
        self.free = list(range(max_batch))
        self.steps = 0
        self.rows = 0  # token rows run, decode and prompt (steps and rows: for the serving profile)
        self.step_seconds = 0.0  # wall time inside step()

    @property
    def max_batch(self) -> int:
        return self.runner.n_slots

    # ---- any thread --------------------------------------------------------------------------
    def submit(self, prompt_ids, max_tokens: int = 256, params: SamplingParams | None = None, stop=None,
               on_piece=None, on_done=None) -> Sequence:
        """Queues a sequence; raises ContextOverflowError if the prompt alone fills the context."""
        prompt_ids = token_ids(prompt_ids, self.runner.vocab)  # a bad id fails here, not the step it shares
        seq = Sequence(prompt_ids, max_tokens, params or SamplingParams(), stop, self.eos_ids, self.tokenizer,
                       on_piece, on_done)
        if len(seq.prompt_ids) >= self.max_context:
            raise ContextOverflowError(f"the prompt has {len(seq.prompt_ids)} tokens but the context holds "
                                       f"{self.max_context} (one more is needed to generate)")
        with self._lock:
            self._incoming.append(seq)
            self._lock.notify()
        return seq

    def queued(self) -> int:
        """Sequences waiting for a slot."""
        return len(self._incoming) + len(self.waiting)

    def wait_for_work(self, timeout: float) -> None:
        """Blocks until something is submitted or `timeout` seconds pass (for an idle engine loop)."""
        with self._lock:
            if not self._incoming:
                self._lock.wait(timeout)

    def wake(self) -> None:
        with self._lock:
            self._lock.notify()

    # ---- the engine's thread -----------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self._incoming or self.waiting or self.active)

    def step(self) -> bool:
        """One round: admit newcomers, then one mixed native step over every running sequence's decode row
        and up to prefill_chunk prompt tokens of the newcomers (oldest first). Returns whether anything ran."""
        t0 = time.perf_counter()
        try:
            return self._step()
        finally:
            self.step_seconds += time.perf_counter() - t0

    def _step(self) -> bool:
        with self._lock:
            while self._incoming:
                self.waiting.append(self._incoming.popleft())
        if any(s.cancelled for s in self.waiting):
            for seq in [s for s in self.waiting if s.cancelled]:
                self.waiting.remove(seq)
                self._finish(seq, "cancelled")
        for seq in [s for s in self.active.values() if s.cancelled]:
            self._finish(seq, "cancelled")
        self._admit()
        items = [(s, [s.next_token], True) for s in self.active.values() if s.state == "decode"]
        budget = self.prefill_chunk  # prompt tokens this step, oldest newcomer first
        for seq in sorted((s for s in self.active.values() if s.state == "prefill"), key=lambda s: s.t_submit):
            if budget <= 0:
                break
            ids = seq.prompt_ids[seq.n_cached:seq.n_cached + budget]
            items.append((seq, ids, seq.n_cached + len(ids) == len(seq.prompt_ids)))
            budget -= len(ids)
        if not items:
            return False
        self.steps += 1
        self.rows += sum(len(ids) for _, ids, _ in items)
        try:
            logits = self.runner.step([(s.slot, ids, w) for s, ids, w in items])  # [wanting, vocab]
        except Exception as e:  # never leave sequences hanging: fail this step's sequences
            for s, _, _ in items:
                self._fail(s, e)
            return True
        for s, ids, _ in items:
            if s.state == "prefill":
                s.n_cached += len(ids)
        wanting = [s for s, _, w in items if w]
        for s, tok in zip(wanting, self._sample(wanting, logits)):
            self._on_token(s, tok)
        return True

    @staticmethod
    def _sample(seqs: list[Sequence], logits) -> list[int]:
        """logits [len(seqs), vocab] -> one token per sequence: the plain greedy rows by one argmax over
        their rows, the others by their own Sampler."""
        plain = [i for i, s in enumerate(seqs) if s.params.temperature == 0.0 and s.params.repetition_penalty == 1.0]
        out = [0] * len(seqs)
        if plain:
            best = np.argmax(logits if len(plain) == len(seqs) else logits[plain], axis=1)
            for i, t in zip(plain, best.tolist()):
                out[i] = t
        if len(plain) < len(seqs):
            done = set(plain)
            for i, s in enumerate(seqs):
                if i not in done:
                    out[i] = s.sampler(logits[i], s.history)
        return out

    def run(self) -> None:
        """Steps until every submitted sequence is done."""
        while self.has_work():
            self.step()

    def fail_all(self, error: Exception | None) -> None:
        """Ends every queued and running sequence: with `error`, or as cancelled when it is None."""
        with self._lock:
            while self._incoming:
                self.waiting.append(self._incoming.popleft())
        for seq in list(self.waiting) + list(self.active.values()):
            if error is None:
                self._finish(seq, "cancelled")
            else:
                self._fail(seq, error)
        self.waiting.clear()

    def _admit(self) -> None:
        while self.free and self.waiting:
            seq = self.waiting.popleft()
            if seq.max_tokens == 0:
                self._finish(seq, "length")
                continue
            # the free slot whose cache shares the longest prefix with the prompt (its K/V are re-used)
            best = max(self.free, key=lambda i: self.runner.slot(i).common_prefix(seq.prompt_ids))
            self.free.remove(best)
            cache = self.runner.slot(best)
            common = min(cache.common_prefix(seq.prompt_ids), len(seq.prompt_ids) - 1)
            cache.truncate(common)
            seq.slot, seq.n_cached, seq.state = best, common, "prefill"
            seq.stats.cached_tokens = common
            seq.t_start = time.perf_counter()
            self.active[best] = seq

    def _on_token(self, seq: Sequence, tok: int) -> None:
        """Takes seq's next token and emits its text; ends the sequence when it is done."""
        now = time.perf_counter()
        if not seq.tokens:
            seq.t_first = now
            seq.stats.prompt_time = now - seq.t_start
        else:
            seq.stats.generation_time = now - seq.t_first
        seq.history.append(tok)
        seq.tokens.append(tok)
        seq.stats.generation_tokens = len(seq.tokens)
        if tok in seq.eos_ids:
            self._finish(seq, "stop")
            return
        self._emit(seq, seq.stops.push(seq.detok.push(tok)))
        if seq.stops.stopped:
            self._finish(seq, "stop")
        elif len(seq.tokens) >= seq.max_tokens or self.runner.slot(seq.slot).length >= self.max_context:
            self._finish(seq, "length")
        else:
            seq.next_token, seq.state = tok, "decode"

    def _emit(self, seq: Sequence, piece: str) -> None:
        if piece:
            seq.text += piece
            if seq.on_piece is not None:
                seq.on_piece(seq, piece)

    def _fail(self, seq: Sequence, e: Exception) -> None:
        seq.error = f"{type(e).__name__}: {e}"
        self._finish(seq, "error")

    def _finish(self, seq: Sequence, reason: str) -> None:
        if reason in ("stop", "length") and not seq.stops.stopped:  # what the detokenizer / stop matcher hold
            tail = seq.stops.push(seq.detok.flush())
            tail += seq.stops.flush()
            if seq.stops.stopped:
                reason = "stop"
            self._emit(seq, tail)
        seq.finish_reason = reason
        seq.state = "done"
        seq.t_done = time.perf_counter()
        seq.stats.finish_reason = reason
        seq.stats.peak_memory_gb = peak_memory_gb()
        if seq.slot is not None and self.active.get(seq.slot) is seq:
            del self.active[seq.slot]
            self.free.append(seq.slot)
        seq.done_event.set()
        if seq.on_done is not None:
            seq.on_done(seq)


def generate_batch(model, tokenizer, prompts, max_tokens: int = 256, max_batch: int | None = None, stop=None,
                   params: SamplingParams | None = None, add_bos: bool | None = None,
                   engine: BatchEngine | None = None) -> list[Sequence]:
    """Runs every prompt (str or token ids) to completion, batched; -> their Sequences in prompt order."""
    # every prompt is checked before any is submitted: a bad one leaves nothing queued in a kept engine
    ids = [list(tokenizer.encode(p, add_bos=add_bos)) if isinstance(p, str) else token_ids(p, model.args.vocab_size)
           for p in prompts]
    if engine is None:
        engine = BatchEngine(model, tokenizer, max_batch=max_batch or max(1, min(len(ids), 16)))
    seqs = [engine.submit(p, max_tokens=max_tokens, params=params, stop=stop) for p in ids]
    engine.run()
    return seqs
