"""Next-token sampling: greedy at temperature 0, else temperature / top-k / top-p / min-p, with an
optional repetition penalty. Randomness comes from one numpy Generator (seeded => reproducible).

Order as in Hugging Face: repetition penalty -> temperature -> top-k -> top-p -> min-p.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PARTIAL_SORT = (256, 4096)  # top-p tries the best 256, then 4096 tokens: sorting a 128k vocabulary costs ms


@dataclass
class SamplingParams:
    """How the next token is chosen.

    temperature: 0 means greedy (argmax); top_k: 0 = off; top_p: 1.0 = off, 0 = only the most likely token
    (as llama.cpp and HF: the prefix always keeps one); min_p: 0.0 = off
    (drop tokens below min_p x the best token's probability); repetition_penalty: 1.0 = off
    (HF's rule over the last repetition_window ids of prompt + output; 0 or -1, llama.cpp's spelling: the whole
    history); seed: None = fresh entropy.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_window: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):  # NaN passes every comparison below
            v = getattr(self, name)
            if not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None (fresh entropy), got {self.seed!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1] (1: off, 0: only the most likely token), got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if (isinstance(self.repetition_window, bool) or not isinstance(self.repetition_window, (int, np.integer))
                or self.repetition_window < -1):
            raise ValueError(f"repetition_window must be an integer >= -1 (the last n ids; 0 or -1: the whole history), "
                             f"got {self.repetition_window!r}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


def apply_repetition_penalty(logits: np.ndarray, history, penalty: float, window: int) -> np.ndarray:
    """HF rule on the ids of the last `window` history entries: positive logits / penalty, others * penalty.

    logits: float32 [vocab] (a penalized copy is returned).
    """
    if penalty == 1.0 or not history:
        return logits
    ids = np.unique(np.asarray(history[-window:] if window > 0 else history, np.int64))
    ids = ids[(ids >= 0) & (ids < logits.shape[0])]
    out = logits.copy()
    v = out[ids]
    out[ids] = np.where(v > 0, v / penalty, v * penalty)
    return out


def _cut(probs: np.ndarray, top_p: float, min_p: float) -> int:
    """probs: sorted descending, normalized over the distribution they came from -> how many to keep.

    top-p keeps the shortest prefix whose mass reaches top_p (top_p 0: the first alone); min-p keeps
    probs >= min_p * probs[0].
    """
    n = probs.shape[0]
    if top_p < 1.0:
        n = min(int(np.searchsorted(np.cumsum(probs), top_p)) + 1, n)
    if min_p > 0.0:
        n = min(n, int(np.count_nonzero(probs >= min_p * probs[0])))
    return max(n, 1)


class Sampler:
    """Chooses token ids from logits [vocab]. One Sampler per generation (it owns the rng)."""

    def __init__(self, params: SamplingParams | None = None, rng: np.random.Generator | None = None):
        self.p = params or SamplingParams()
        self.rng = rng if rng is not None else np.random.default_rng(self.p.seed)

    def __call__(self, logits: np.ndarray, history=()) -> int:
        """logits: float32 [vocab]; history: the ids so far (for the repetition penalty) -> token id."""
        p = self.p
        logits = apply_repetition_penalty(logits, history, p.repetition_penalty, p.repetition_window)
        if p.temperature == 0.0:
            return int(np.argmax(logits))
        x = logits.astype(np.float64) / p.temperature  # [vocab]
        v = x.shape[0]
        if 0 < p.top_k < v:
            cand = np.argpartition(-x, p.top_k - 1)[:p.top_k]
            cand = cand[np.argsort(-x[cand], kind="stable")]  # [k], best first
            e = np.exp(x[cand] - x[cand[0]])
            probs = e / e.sum()  # renormalized over the top-k, as HF does
        else:
            e = np.exp(x - x.max())  # [vocab]
            total = e.sum()
            if p.top_p >= 1.0 and p.min_p <= 0.0:  # plain temperature: no sort needed
                return self._draw(np.arange(v), e)
            cand = self._sorted_pool(x, e, total)
            probs = e[cand] / total
        n = _cut(probs, p.top_p, p.min_p)
        return self._draw(cand[:n], probs[:n])

    def _sorted_pool(self, x: np.ndarray, e: np.ndarray, total: float) -> np.ndarray:
        """Token ids that top-p / min-p may keep, sorted by logit (descending), without sorting the vocab."""
        p = self.p
        pool = np.flatnonzero(e >= p.min_p) if p.min_p > 0.0 else None  # e[best] == 1
        for size in PARTIAL_SORT:
            if p.top_p >= 1.0 or (pool is not None and pool.shape[0] <= size) or x.shape[0] <= size:
                break
            top = np.argpartition(-x, size - 1)[:size]
            if e[top].sum() >= p.top_p * total:  # the top-p prefix lies inside the best `size`
                pool = top if pool is None else top[e[top] >= p.min_p]
                break
        if pool is None:
            pool = np.arange(x.shape[0])
        return pool[np.argsort(-x[pool], kind="stable")]

    def _draw(self, ids: np.ndarray, weights: np.ndarray) -> int:
        cum = np.cumsum(weights)
        i = int(np.searchsorted(cum, self.rng.random() * cum[-1], side="right"))
        return int(ids[min(i, ids.shape[0] - 1)])
