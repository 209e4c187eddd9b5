"""The generation loop, in layers (as mlx-lm): generate_step yields token ids -> stream yields text
pieces (and keeps stats) -> generate returns the text.

    for tok in generate_step(model, prompt_ids, Sampler(params), max_tokens=64): ...
    s = stream(model, tokenizer, "Once upon a time", max_tokens=64, temperature=0.7, seed=1)
    for piece in s: print(piece, end="")
    print(s.stats)          # prompt and generation tokens/s, peak memory
    text = generate(model, tokenizer, "Once upon a time", max_tokens=64)

The model keeps one static KV cache; a prompt that extends what the cache holds (the next turn of a
chat) only prefills the new tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

from lowbit.generate.detok import StopMatcher, StreamDecoder
from lowbit.generate.sampling import Sampler, SamplingParams
from lowbit.memory import peak_rss_gb, rss_gb
from lowbit.model.kv_cache import ContextOverflowError
from lowbit.model.layers import token_ids


def peak_memory_gb() -> float:
    """This process's peak resident memory, GB (since the last lowbit.memory.reset_peak_rss)."""
    return peak_rss_gb()


@dataclass
class GenerationStats:
    prompt_tokens: int = 0  # prompt length
    cached_tokens: int = 0  # prompt tokens whose K/V were already in the cache (not recomputed)
    prompt_time: float = 0.0  # s, prefill + first sampling
    generation_tokens: int = 0  # tokens generated (including an EOS that ended generation)
    generation_time: float = 0.0  # s, from the first generated token to the last
    peak_memory_gb: float = 0.0  # peak RSS of the process (since load, when load reset it)
    rss_end_gb: float = 0.0  # RSS when generation ended
    finish_reason: str = ""  # "stop" (EOS or stop string), "length" (max_tokens or context full)
    context_full: bool = False  # generation ended because the KV cache was full, before max_tokens

    @property
    def prompt_tps(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prompt_time if self.prompt_time > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        n = self.generation_tokens - 1  # the first token's time is the prompt's
        return n / self.generation_time if n > 0 and self.generation_time > 0 else 0.0

    def __str__(self) -> str:
        cached = f" ({self.cached_tokens} cached)" if self.cached_tokens else ""
        return (f"prompt: {self.prompt_tokens} tokens{cached}, {self.prompt_tps:.1f} tokens/s | "
                f"generation: {self.generation_tokens} tokens, {self.generation_tps:.1f} tokens/s | "
                f"peak memory: {self.peak_memory_gb:.2f} GB")


def prepare_prompt(model, prompt_ids) -> int:
    """Fits the prompt to the cache: keeps the cached common prefix; returns how many ids are cached.

    Raises ContextOverflowError when the prompt alone does not fit in the context.
    """
    ids = list(prompt_ids)
    cache = model.cache
    if not ids:
        raise ValueError("the prompt is empty (no tokens)")
    if len(ids) > cache.max_ctx:
        a = model.args
        raise ContextOverflowError(
            f"the prompt has {len(ids)} tokens but the context holds {cache.max_ctx} "
            f"(max_position_embeddings {a.max_position_embeddings}; set max_context to change the cache size)")
    common = min(cache.common_prefix(ids), len(ids) - 1)  # the last prompt token must run to give logits
    cache.truncate(common)
    return common


def generate_step(model, prompt_ids, sampler: Sampler | None = None, max_tokens: int = 256) -> Iterator[int]:
    """Yields up to max_tokens sampled ids (fewer if the context fills). Stopping early is the caller's.

    The cache holds the prompt and every yielded id except the last (it runs when the next is asked for).
    """
    sampler = sampler or Sampler()
    ids = token_ids(prompt_ids, model.args.vocab_size).tolist()
    common = prepare_prompt(model, ids)
    logits = model.prefill(ids[common:])  # [vocab]
    history = ids
    for i in range(max_tokens):
        tok = sampler(logits, history)
        yield tok
        history.append(tok)
        if i + 1 >= max_tokens or model.cache.length >= model.cache.max_ctx:
            return
        logits = model.decode(tok)


class Generation:
    """An iterable of text pieces; after iteration, .text, .tokens and .stats describe the run."""

    def __init__(self, model, tokenizer, prompt, max_tokens: int = 256, stop=None,
                 params: SamplingParams | None = None, eos_ids=None, add_bos: bool | None = None):
        self.model, self.tokenizer = model, tokenizer
        if isinstance(prompt, str):
            self.prompt_ids = list(tokenizer.encode(prompt, add_bos=add_bos))
        else:
            self.prompt_ids = token_ids(prompt, model.args.vocab_size).tolist()  # a bad id fails here, not mid-run
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.params = params or SamplingParams()
        StopMatcher(stop)  # a bad stop fails here rather than at the first iteration
        self.stop = stop
        if eos_ids is None:
            eos_ids = set(getattr(tokenizer, "eos_ids", ()) or ()) | model.args.eos_ids
        self.eos_ids = set(eos_ids)
        self.tokens: list[int] = []
        self.text = ""
        self.stats = GenerationStats(prompt_tokens=len(self.prompt_ids))

    def __iter__(self) -> Iterator[str]:
        st = self.stats
        detok = StreamDecoder(self.tokenizer, context=self.prompt_ids)
        stops = StopMatcher(self.stop)
        st.cached_tokens = max(0, min(self.model.cache.common_prefix(self.prompt_ids), len(self.prompt_ids) - 1))
        st.finish_reason = "length"
        tic = time.perf_counter()
        # max_tokens 0 runs the prompt only (as llama.cpp's -n 0): generate_step prefills, then yields nothing
        steps = generate_step(self.model, self.prompt_ids, Sampler(self.params), self.max_tokens)
        try:
            for tok in steps:
                now = time.perf_counter()
                if not self.tokens:
                    st.prompt_time, tic = now - tic, now
                else:
                    st.generation_time = now - tic
                self.tokens.append(tok)
                st.generation_tokens = len(self.tokens)
                if tok in self.eos_ids:
                    st.finish_reason = "stop"
                    break
                piece = stops.push(detok.push(tok))
                if piece:
                    self.text += piece
                    yield piece
                if stops.stopped:
                    st.finish_reason = "stop"
                    break
            if not self.tokens:  # max_tokens 0: the prompt's time is the whole run
                st.prompt_time = time.perf_counter() - tic
            if st.finish_reason == "length" and len(self.tokens) < self.max_tokens:
                st.context_full = True
            if not stops.stopped:  # emit what the decoder and the stop matcher still hold
                tail = stops.push(detok.flush())
                tail += stops.flush()
                if stops.stopped:
                    st.finish_reason = "stop"
                if tail:
                    self.text += tail
                    yield tail
        finally:
            steps.close()
            st.peak_memory_gb = peak_memory_gb()
            st.rss_end_gb = rss_gb()


def stream(model, tokenizer, prompt, max_tokens: int = 256, stop=None, temperature: float = 0.0,
           top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
           seed: int | None = None, add_bos: bool | None = None) -> Generation:
    """Text pieces of the continuation of `prompt` (str, or token ids); see Generation for the stats.

    Stops at max_tokens, an EOS id (not emitted), a stop string (cut before it), or a full context.
    """
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition_penalty, seed=seed)
    return Generation(model, tokenizer, prompt, max_tokens=max_tokens, stop=stop, params=params, add_bos=add_bos)


def generate(model, tokenizer, prompt, max_tokens: int = 256, **kw) -> str:
    """The whole continuation as one string (arguments as stream)."""
    return "".join(stream(model, tokenizer, prompt, max_tokens=max_tokens, **kw))
