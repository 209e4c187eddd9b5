"""Teacher-forced perplexity over fixed windows (how much a format costs in quality).

    from lowbit.perplexity import perplexity
    r = perplexity(llm.model, llm.tokenizer.encode(text), ctx=512)
    r.ppl, r.tokens

The token stream is cut into consecutive windows of `ctx` tokens; each window starts from an
empty cache (with BOS first when the tokenizer has one) and every token after the window's first is
scored: ppl = exp(mean negative log-likelihood).

perplexity_llamacpp scores as `llama-perplexity -c ctx` does instead (for tables beside llama.cpp): the stream
(with BOS first when the tokenizer adds one) is cut into len // ctx windows of exactly ctx tokens, each window's
first token is replaced by BOS (when the tokenizer adds one), and only the second half is scored: the tokens at
positions ctx/2 + 1 .. ctx - 1, each seen with at least ctx/2 tokens of context, hence a lower figure.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from lowbit.model.layers import token_ids


@dataclass
class PerplexityResult:
    ppl: float
    nll: float  # mean negative log-likelihood, nats per token
    tokens: int  # tokens scored
    windows: int
    seconds: float

    def __str__(self) -> str:
        return (f"perplexity {self.ppl:.4f} (nll {self.nll:.4f} nats/token) over {self.tokens} tokens "
                f"in {self.windows} windows, {self.tokens / max(self.seconds, 1e-9):.0f} tokens/s")


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """logits: float32 [n, vocab], targets: int [n] -> -log p(target), float64 [n]."""
    x = logits.astype(np.float64, copy=False)
    m = x.max(axis=1)
    lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
    return lse - x[np.arange(x.shape[0]), targets]


def perplexity(model, ids, ctx: int = 512, max_tokens: int | None = None, bos_id: int | None = None,
               progress=None) -> PerplexityResult:
    """Perplexity of `model` on token ids, in windows of ctx tokens (see the module docstring).

    bos_id: prepended to each window (not scored) when given. max_tokens: stop after scoring about this
    many. progress: a callable(done_tokens, total_tokens) or None.
    """
    ids = token_ids(ids, model.args.vocab_size).tolist()
    if ctx < 2:
        raise ValueError(f"ctx must be >= 2, got {ctx}")
    if bos_id is not None and ctx < 3:  # BOS + one token scores nothing
        raise ValueError(f"ctx must be >= 3 when each window starts with BOS, got {ctx}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (None: the whole text), got {max_tokens}")
    if ctx > model.cache.max_ctx:
        raise ValueError(f"ctx {ctx} exceeds the model's context of {model.cache.max_ctx} tokens")
    body = ctx - (1 if bos_id is not None else 0)
    total = min(len(ids), max_tokens + 1) if max_tokens else len(ids)
    if total < 2:
        raise ValueError("the text is too short: it needs at least 2 tokens")
    nll_sum, n, windows = 0.0, 0, 0
    tic = time.perf_counter()
    for start in range(0, total - 1, body):
        chunk = ids[start:min(start + body, total)]
        if len(chunk) < 2:
            break
        window = ([bos_id] if bos_id is not None else []) + chunk
        logits = model.logits(window)  # [len(window), vocab]
        first = 1 if bos_id is not None else 0  # position predicting chunk[1]
        nll = token_nll(logits[first:-1], np.asarray(chunk[1:]))
        nll_sum += float(nll.sum())
        n += nll.shape[0]
        windows += 1
        if progress:
            progress(n, total - 1)
    mean = nll_sum / n
    return PerplexityResult(ppl=math.exp(mean), nll=mean, tokens=n, windows=windows,
                            seconds=time.perf_counter() - tic)


def perplexity_llamacpp(model, ids, ctx: int = 512, bos_id: int | None = None, progress=None) -> PerplexityResult:
    """Perplexity as llama.cpp's llama-perplexity computes it (see the module docstring); ids without BOS."""
    ids = ([bos_id] if bos_id is not None else []) + token_ids(ids, model.args.vocab_size).tolist()
    if ctx < 4:
        raise ValueError(f"ctx must be >= 4, got {ctx}")
    if ctx > model.cache.max_ctx:
        raise ValueError(f"ctx {ctx} exceeds the model's context of {model.cache.max_ctx} tokens")
    chunks = len(ids) // ctx
    if chunks < 2:  # llama-perplexity's own condition
        raise ValueError(f"the text is too short: {len(ids)} tokens, llama.cpp's perplexity needs 2 x ctx = {2 * ctx}")
    first = ctx // 2
    nll_sum, n = 0.0, 0
    tic = time.perf_counter()
    for c in range(chunks):
        window = ids[c * ctx:(c + 1) * ctx]
        if bos_id is not None:
            window[0] = bos_id
        logits = model.logits(window)  # [ctx, vocab]
        nll = token_nll(logits[first:-1], np.asarray(window[first + 1:]))
        nll_sum += float(nll.sum())
        n += nll.shape[0]
        if progress:
            progress(n, chunks * (ctx - first - 1))
    mean = nll_sum / n
    return PerplexityResult(ppl=math.exp(mean), nll=mean, tokens=n, windows=chunks, seconds=time.perf_counter() - tic)
